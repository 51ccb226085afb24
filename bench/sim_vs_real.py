"""sim-vs-real: the built-in scenario's arrivals through a real control plane, beside the simulator.

The same arrivals (the built-in scenario, on a smaller cluster, for a few virtual hours) go two ways:

* **real**: a real kube-apiserver, kube-controller-manager (its Job controller) and etcd
  (``scripts/kube-up.sh``, or ``--kubeconfig``); ``gpuplane controller`` and ``gpuplane webhook`` as
  their own processes, the webhook registered with the API server; the fake kubelet of the tests
  runs each bound pod for its job's startup and work, ``--speedup`` times faster than real time.
  Each job is a plain ``batch/v1`` Job created at its arrival with only its queue name and priority
  class (no ``suspend``, no scheduler name): the webhook suspends it, the controller queues,
  admits and binds it, the kubelet runs it, the Job controller completes it, the controller
  finishes its Workload and gives its quota back.
* **simulated**: ``gpuplane simulate``'s engine on the same jobs, with the configuration that
  matches what runs for real (``gpuplane-no-reaper``: no idle reaper runs beside the controller).

Both are measured the same way over the same window (the arrivals, then ``--drain-hours`` more):
GPU busy time over capacity, the p50 and p95 wait (submission to first start; a job never started
counts the window's end as a lower bound, as the simulator does), and the jobs finished. The real
run is also checked for leaks: at the end, every admitted, unfinished Workload's GPUs must be held by
a job that still runs (``quotaLeakGpus``), and every job that had time to finish did
(``stuckJobs``: admitted longer than its run time plus a margin, not finished).

Usage::

    python3 bench/run.py sim-vs-real                      # 6 virtual hours + 18 h drain, 64 GPUs
    python3 bench/run.py sim-vs-real -- --ci --output json
    python3 bench/sim_vs_real.py --hours 3 --drain-hours 6 --speedup 600 --kubeconfig KUBECONFIG

With ``--output json`` it prints ``{"real": {...}, "simulated": {...}, "quotaLeakGpus": N, ...}``;
each side has ``gpuBusyOfCapacity``, ``waitP50Seconds``, ``waitP95Seconds`` and ``finished``.
The exit status is 1 when the real run leaks quota or leaves a job stuck, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from processes import running  # noqa: E402 (a sibling module of this folder)

from controller_harness import E2E_LABEL, RegisteredWebhook, install_crds, wait_until  # noqa: E402
from fake_kubelet import FakeKubelet, Run, run_annotations  # noqa: E402
from gpuplane.k8s import api as k8s  # noqa: E402
from gpuplane.k8s.api import ApiError, KubeApi, load_api_client  # noqa: E402
from gpuplane.model import labels as keys  # noqa: E402
from gpuplane.model.objects import ClusterQueue, ClusterState, Node, PodTemplate  # noqa: E402
from gpuplane.model.quantity import parse_quantity  # noqa: E402
from gpuplane.sim.experiment import GPUPLANE_VARIANTS, SimInput, run_named, scenario_input  # noqa: E402
from gpuplane.sim.gpuplane_model import GPU_MILLI, GpuplaneModel  # noqa: E402
from gpuplane.sim.metrics import percentile  # noqa: E402
from gpuplane.sim.scenario import Failures, Scenario, builtin_scenario  # noqa: E402
from gpuplane.sim.workloads import Job  # noqa: E402

CONFIGURATION = "gpuplane-no-reaper"  # what runs for real: the controller, no idle reaper beside it
HOUR = 3600.0
KUEUE = "kueue.x-k8s.io/v1beta2"
PRIORITY_CLASSES = {"normal": "sim-normal", "backfill": "sim-backfill"}
GRACE_SECONDS = 30  # the scenario's eviction grace: each pod's terminationGracePeriodSeconds
# The cluster: the built-in scenario's pools with fewer nodes (every pool kept, MIG and L4 included).
DEFAULT_NODES = {"l4": 2, "a100": 2, "h100-mig": 1, "h100": 3}  # 8 + 16 + 8 + 24 = 56 GPUs
CI_NODES = {"l4": 1, "a100": 1, "h100-mig": 1, "h100": 1}  # 4 + 8 + 8 + 8 = 28 GPUs


# --- the workload both sides run ------------------------------------------------------------------


def small_scenario(
    nodes: Mapping[str, int], hours: float, drain_hours: float, seed: int, load: float | None
) -> Scenario:
    """The built-in scenario on ``nodes`` per pool, with no node failures and no warm-up (both sides
    start from an empty cluster), measured over the arrivals and the drain."""
    base = builtin_scenario().with_seed(seed)
    pools = tuple(replace(p, nodes=nodes.get(p.name, p.nodes)) for p in base.pools)
    scenario = replace(base, pools=pools, failures=Failures(), warmup=0.0, days=(hours + drain_hours) / 24)
    return scenario.with_load(load) if load is not None else scenario


def arrivals(scenario: Scenario, hours: float) -> SimInput:
    """The scenario's jobs that arrive in the first ``hours``, drawn once for both sides."""
    sim = scenario_input(scenario)
    jobs = tuple(
        j for j in sim.workloads.jobs if 0.0 <= j.submit <= hours * HOUR and j.continuation_of is None
    )
    return replace(sim, workloads=replace(sim.workloads, jobs=jobs, node_events=()))


# --- the simulated side ---------------------------------------------------------------------------


def simulated(sim: SimInput) -> dict[str, Any]:
    _ledger, doc = run_named(CONFIGURATION, sim)
    return {
        "gpuBusyOfCapacity": doc["gpuBusyOfCapacity"],
        "gpuAllocatedOfCapacity": doc["gpuAllocatedShare"],
        "waitP50Seconds": doc["waitP50Seconds"],
        "waitP95Seconds": doc["waitP95Seconds"],
        "finished": doc["completed"],
        "started": doc["started"],
        "submitted": doc["submitted"],
        "preemptions": doc["preemptions"],
        "wallSeconds": doc["wallSeconds"],
    }


# --- the real side: the cluster's objects -----------------------------------------------------------


def node_manifest(node: Node) -> dict[str, Any]:
    resources = {name: str(v) for name, v in node.allocatable.items()}
    resources.setdefault("cpu", "64")
    resources.setdefault("memory", "512Gi")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": {**node.labels, "kubernetes.io/hostname": node.name},
            "annotations": dict(node.annotations),
        },
        "status": {"capacity": resources, "allocatable": resources},
    }


def cluster_queue_manifest(cq: ClusterQueue) -> dict[str, Any]:
    groups = []
    for group in cq.resource_groups:
        flavors = []
        for flavor in group.flavors:
            quotas = []
            for name in group.covered_resources:
                quota = flavor.resources[name]
                entry: dict[str, Any] = {"name": name, "nominalQuota": str(quota.nominal)}
                if quota.borrowing_limit is not None:
                    entry["borrowingLimit"] = str(quota.borrowing_limit)
                quotas.append(entry)
            flavors.append({"name": flavor.name, "resources": quotas})
        groups.append({"coveredResources": list(group.covered_resources), "flavors": flavors})
    policy = cq.preemption
    preemption: dict[str, Any] = {
        "withinClusterQueue": policy.within_cluster_queue,
        "reclaimWithinCohort": policy.reclaim_within_cohort,
        "borrowWithinCohort": {"policy": policy.borrow_within_cohort},
    }
    if policy.max_priority_threshold is not None and policy.borrow_within_cohort != "Never":
        preemption["borrowWithinCohort"]["maxPriorityThreshold"] = policy.max_priority_threshold
    spec: dict[str, Any] = {"namespaceSelector": {}, "resourceGroups": groups, "preemption": preemption}
    if cq.cohort:
        spec["cohortName"] = cq.cohort
    return {"apiVersion": KUEUE, "kind": "ClusterQueue", "metadata": {"name": cq.name}, "spec": spec}


def pod_template(template: PodTemplate, job: Job) -> dict[str, Any]:
    resources = {name: str(v) for name, v in template.requests.items()}
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "containers": [
            {"name": "main", "image": "work", "resources": {"requests": resources, "limits": resources}}
        ],
    }
    if template.required_node_terms:
        terms = [
            {
                "matchExpressions": [
                    {"key": r.key, "operator": r.operator, "values": list(r.values)}
                    for r in term.match_expressions
                ]
            }
            for term in template.required_node_terms
        ]
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    annotations = {
        **template.annotations,
        **run_annotations(job.work, checkpoint=job.checkpoint, startup=job.startup, stateless=job.stateless),
    }
    return {"metadata": {"annotations": annotations}, "spec": spec}


def job_manifest(model: GpuplaneModel, job: Job) -> dict[str, Any]:
    """The plain Job a user would submit for ``job``: its queue name and priority class, nothing else
    of gpuplane's (the webhook suspends it)."""
    workload = model.workload_of(job)
    (pod_set,) = workload.pod_sets
    tier = "backfill" if workload.priority == model.cluster.backfill_priority else "normal"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job.name,
            "namespace": job.team,
            "labels": {
                keys.QUEUE_NAME_LABEL: workload.queue_name or "default",
                "kueue.x-k8s.io/priority-class": PRIORITY_CLASSES[tier],
            },
        },
        "spec": {
            "parallelism": job.pods,
            "completions": job.pods,
            "backoffLimit": 0,
            "template": pod_template(pod_set.template, job),
        },
    }


def cluster_objects(
    state: ClusterState, priorities: Mapping[str, int]
) -> list[tuple[k8s.Resource, dict[str, Any]]]:
    """Everything the real cluster needs before the first job, in creation order."""
    out: list[tuple[k8s.Resource, dict[str, Any]]] = [
        (k8s.NAMESPACES, {"metadata": {"name": ns, "labels": {E2E_LABEL: "true"}}}) for ns in state.namespaces
    ]
    out += [(k8s.NODES, node_manifest(node)) for node in state.nodes]
    for name, flavor in state.resource_flavors.items():
        body = {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": name}}
        body["spec"] = {"nodeLabels": dict(flavor.node_labels)}
        out.append((k8s.RESOURCE_FLAVORS, body))
    out += [(k8s.CLUSTER_QUEUES, cluster_queue_manifest(cq)) for cq in state.cluster_queues.values()]
    for lq in state.local_queues.values():
        body = {
            "apiVersion": KUEUE,
            "kind": "LocalQueue",
            "metadata": {"name": lq.name, "namespace": lq.namespace},
            "spec": {"clusterQueue": lq.cluster_queue},
        }
        out.append((k8s.LOCAL_QUEUES, body))
    for tier, name in PRIORITY_CLASSES.items():
        body = {"apiVersion": KUEUE, "kind": "WorkloadPriorityClass", "metadata": {"name": name}}
        body["value"] = priorities[tier]
        out.append((k8s.PRIORITY_CLASSES, body))
    return out


# --- the real side: running it ----------------------------------------------------------------------


@contextlib.contextmanager
def control_plane(kubeconfig: str | None) -> Iterator[str]:
    """The given cluster, or a fresh control plane (stopped and removed at the end)."""
    if kubeconfig:
        yield kubeconfig
        return
    directory = tempfile.mkdtemp(prefix="sim-vs-real-")
    env = {**os.environ, "GPUPLANE_KCM_QPS": "500", "GPUPLANE_KCM_BURST": "1000"}
    try:
        subprocess.run(
            ["bash", str(ROOT / "scripts/kube-up.sh"), directory],
            check=True,
            env=env,
            stdout=subprocess.DEVNULL,
        )
        yield f"{directory}/kubeconfig"
    finally:
        subprocess.run(
            ["bash", str(ROOT / "scripts/kube-down.sh"), "--purge", directory],
            check=False,
            capture_output=True,
        )


@dataclass
class RealRun:
    """What the real run recorded (wall-clock times)."""

    t0: float = 0.0
    end: float = 0.0
    submitted: dict[str, float] = field(default_factory=dict)  # "team/name" -> wall time created
    submit_errors: int = 0
    late: float = 0.0  # the largest delay of a submission behind its arrival (wall seconds)
    runs: list[Run] = field(default_factory=list)
    workloads: list[dict[str, Any]] = field(default_factory=list)
    jobs: list[dict[str, Any]] = field(default_factory=list)
    ledger: dict[str, Any] = field(default_factory=dict)  # quota against pods, once settled


def submit_all(
    api: KubeApi, model: GpuplaneModel, jobs: tuple[Job, ...], speedup: float, run: RealRun
) -> None:
    for job in sorted(jobs, key=lambda j: j.submit):
        due = run.t0 + job.submit / speedup
        pause = due - time.time()
        if pause > 0:
            time.sleep(pause)
        run.late = max(run.late, time.time() - due)
        try:
            api.create(k8s.JOBS, job_manifest(model, job), job.team)
        except ApiError as err:
            run.submit_errors += 1
            print(f"sim-vs-real: job {job.team}/{job.name} not created: {err}", file=sys.stderr)
            continue
        run.submitted[f"{job.team}/{job.name}"] = time.time()


def real(sim: SimInput, args: argparse.Namespace, workdir: Path, console: Console) -> RealRun:
    model = GpuplaneModel(
        CONFIGURATION,
        sim.cluster,
        GPUPLANE_VARIANTS[CONFIGURATION],
        sim.workloads.start,
        grace=sim.eviction_grace,
    )
    state = model.kueue_state()
    priorities = {"normal": sim.cluster.normal_priority, "backfill": sim.cluster.backfill_priority}
    run = RealRun()
    with control_plane(args.kubeconfig) as kubeconfig:
        api = KubeApi(load_api_client(kubeconfig), qps=None)
        install_crds(api)
        if args.kubeconfig:
            _delete_everything(api, state)  # what an earlier run may have left
        webhook = RegisteredWebhook(kubeconfig, workdir / "webhook-tls", name="gpuplane-sim-vs-real")
        webhook.start()
        namespaces = list(state.namespaces)
        try:
            for res, body in cluster_objects(state, priorities):
                api.create(res, body, body["metadata"].get("namespace"))
            for ns in namespaces:  # pods need the namespace's default ServiceAccount
                wait_until(lambda ns=ns: _has_service_account(api, ns), 60, f"ServiceAccount default in {ns}")
            command = [
                sys.executable, "-m", "gpuplane", "controller", "--kubeconfig", kubeconfig,
                "--no-dry-run", "--no-leader-elect", "--interval", "0.5", "--qps", "500", "--burst", "1000",
            ]  # fmt: skip
            kubelet = FakeKubelet(
                KubeApi(load_api_client(kubeconfig), qps=None), namespaces, speedup=args.speedup, interval=0.1
            )
            with running(command, workdir / "controller.log", timeout=15.0):
                kubelet.start()
                run.t0 = time.time()
                submitter = threading.Thread(
                    target=submit_all, args=(api, model, sim.workloads.jobs, args.speedup, run), daemon=True
                )
                submitter.start()
                window = (args.hours + args.drain_hours) * HOUR / args.speedup
                with console.status("real cluster running") as status:
                    while (left := run.t0 + window - time.time()) > 0:
                        status.update(
                            f"real cluster: {len(run.submitted)}/{len(sim.workloads.jobs)} jobs submitted, "
                            f"{len(kubelet.runs)} pod runs, {left:.0f} s left"
                        )
                        time.sleep(min(1.0, left))
                run.end = time.time()
                submitter.join(timeout=30)
                # The state at the window's end, read before anything else moves.
                run.workloads = _items(api, k8s.WORKLOADS, namespaces)
                run.jobs = _items(api, k8s.JOBS, namespaces)
                kubelet.stop()
                with kubelet.lock:
                    run.runs = list(kubelet.runs)
                run.ledger = settled_ledger(api, namespaces)
            if args.logs:
                args.logs.mkdir(parents=True, exist_ok=True)
                shutil.copy(workdir / "controller.log", args.logs / "controller.log")
        finally:
            webhook.stop()
            if args.kubeconfig:  # a cluster we did not start: leave it as we found it
                _delete_everything(api, state)
    return run


def _has_service_account(api: KubeApi, namespace: str) -> bool:
    try:
        api.get(k8s.Resource("", "v1", "serviceaccounts", "ServiceAccount", True), "default", namespace)
    except ApiError:
        return False
    return True


def _items(api: KubeApi, res: k8s.Resource, namespaces: list[str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for ns in namespaces:
        out += api.list(res, ns).get("items", [])
    return out


def _delete_everything(api: KubeApi, state: ClusterState) -> None:
    """Remove what a run creates (on a cluster the benchmark did not start): jobs, then pods at
    grace period 0 (no kubelet ends them), the namespaces (waiting until they are gone, so the next
    run can create them again), and the cluster-scoped objects."""
    for ns in state.namespaces:
        with contextlib.suppress(ApiError):
            for job in api.list(k8s.JOBS, ns).get("items", []):
                api.delete(k8s.JOBS, job["metadata"]["name"], ns, propagationPolicy="Background")
            for pod in api.list(k8s.PODS, ns).get("items", []):
                api.delete(k8s.PODS, pod["metadata"]["name"], ns, gracePeriodSeconds=0)
        with contextlib.suppress(ApiError):
            api.delete(k8s.NAMESPACES, ns)
    for res, names in (
        (k8s.CLUSTER_QUEUES, list(state.cluster_queues)),
        (k8s.RESOURCE_FLAVORS, list(state.resource_flavors)),
        (k8s.NODES, [n.name for n in state.nodes]),
        (k8s.PRIORITY_CLASSES, list(PRIORITY_CLASSES.values())),
    ):
        for name in names:
            with contextlib.suppress(ApiError):
                api.delete(res, name)

    def gone() -> bool:
        for ns in state.namespaces:
            with contextlib.suppress(ApiError):  # 404: gone
                for pod in api.list(k8s.PODS, ns).get("items", []):
                    with contextlib.suppress(ApiError):
                        api.delete(k8s.PODS, pod["metadata"]["name"], ns, gracePeriodSeconds=0)
                api.get(k8s.NAMESPACES, ns)
                return False
        return True

    wait_until(gone, 120, "the previous run's namespaces gone")


# --- the real side: measuring -----------------------------------------------------------------------


def _condition(obj: Mapping[str, Any], ctype: str) -> Mapping[str, Any] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype and c.get("status") == "True":
            return dict(c)
    return None


def _owner(wl: Mapping[str, Any]) -> str:
    refs = wl["metadata"].get("ownerReferences") or [{"name": wl["metadata"]["name"]}]
    return f"{wl['metadata']['namespace']}/{refs[0]['name']}"


def _usage_milli(wl: Mapping[str, Any]) -> int:
    total = 0
    for ps in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
        total += int(parse_quantity(str((ps.get("resourceUsage") or {}).get(GPU_MILLI, "0"))))
    return total


def _outcomes(
    run: RealRun, jobs: Mapping[str, Job], latest: Mapping[str, Run], speedup: float
) -> tuple[int, int, list[str]]:
    """The Workloads finished as succeeded and as failed at the window's end, and the jobs stuck:
    admitted with no pod running, or running past the end of their latest run's work."""
    finished = 0
    failed = 0
    stuck: list[str] = []
    completed_jobs = {
        f"{j['metadata']['namespace']}/{j['metadata']['name']}"
        for j in run.jobs
        if any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (j.get("status") or {}).get("conditions") or []
        )
    }
    present = {f"{j['metadata']['namespace']}/{j['metadata']['name']}" for j in run.jobs}
    for wl in run.workloads:
        key = _owner(wl)
        done = _condition(wl, "Finished")
        if done is not None:
            finished += done.get("reason") == "Succeeded"
            failed += done.get("reason") != "Succeeded"
            continue
        if not (wl.get("status") or {}).get("admission"):
            continue
        if key in completed_jobs or key not in present:
            continue  # its job ended at the window's end: the ledger checks it was given back
        job = jobs.get(key)
        admitted = _condition(wl, "QuotaReserved")
        if job is None or admitted is None:
            continue
        since = _parse_time(admitted["lastTransitionTime"])
        current = latest.get(key)
        if (current is None or current.ended is not None) and run.end - since > 5.0:
            stuck.append(f"{key}: admitted {run.end - since:.0f} s ago, no pod running")
        elif current is not None and current.ended is None:
            # Its latest run (a preempted job runs again from its checkpoint) is past its own end.
            budget = current.need() / speedup + 5.0
            if run.end - current.started > budget:
                stuck.append(
                    f"{key}: running {run.end - current.started:.0f} s, its work takes {budget:.0f} s"
                )
    return finished, failed, stuck


def measured(sim: SimInput, run: RealRun, speedup: float) -> dict[str, Any]:
    """The real run's figures, measured as the simulator measures its own."""
    jobs = {f"{j.team}/{j.name}": j for j in sim.workloads.jobs}
    horizon = (run.end - run.t0) * speedup  # virtual seconds from the first arrival
    first_start: dict[str, float] = {}
    latest: dict[str, Run] = {}  # each job's latest pod run
    busy = allocated = 0.0
    for r in run.runs:
        ns, owner, _ = r.work_key
        key = f"{ns}/{owner}"
        job = jobs.get(key)
        if job is None:
            continue
        first_start[key] = min(first_start.get(key, r.started), r.started)
        if key not in latest or r.started >= latest[key].started:
            latest[key] = r
        until = min(r.ended if r.ended is not None else run.end, run.end)
        p0 = r.progress
        p1 = p0 + r.computed(until, speedup)
        rate = min(job.request.share, job.activity)
        busy += rate * job.active_between(p0, p1)
        allocated += job.request.share * max(0.0, until - r.started) * speedup
    waits = []
    for key, job in jobs.items():
        started = first_start.get(key)
        waits.append(
            (started - run.t0) * speedup - job.submit if started is not None else horizon - job.submit
        )
    finished, failed, stuck = _outcomes(run, jobs, latest, speedup)
    capacity = sim.cluster.gpus * horizon
    return {
        "gpuBusyOfCapacity": round(busy / capacity, 4) if capacity else None,
        "gpuAllocatedOfCapacity": round(allocated / capacity, 4) if capacity else None,
        "waitP50Seconds": _round(percentile(waits, 50)),
        "waitP95Seconds": _round(percentile(waits, 95)),
        "finished": finished,
        "failed": failed,
        "started": len(first_start),
        "submitted": len(run.submitted),
        "submitErrors": run.submit_errors,
        "submitLateSeconds": round(run.late, 3),
        "podRuns": len(run.runs),
        "killedPodRuns": sum(r.phase == "Killed" for r in run.runs),
        # A gang's pods killed together count once, as the simulator counts a preemption.
        "preemptions": len({(r.work_key, round(r.ended or 0.0)) for r in run.runs if r.phase == "Killed"}),
        "wallSeconds": round(run.end - run.t0, 1),
        "stuck": stuck,
        **run.ledger,
    }


def _pod_milli(pod: Mapping[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers", []):
        res = c.get("resources") or {}
        total += int(
            parse_quantity(str((res.get("requests") or res.get("limits") or {}).get(GPU_MILLI, "0")))
        )
    return total


def quota_ledger(
    workloads: list[dict[str, Any]], jobs: list[dict[str, Any]], pods: list[dict[str, Any]]
) -> dict[str, Any]:
    """Quota held against what holds it: the GPUs (milli) of admitted, unfinished Workloads, the GPUs
    of pods bound and not ended, and the leaks: Workloads that still hold quota although their job
    has ended or is gone."""
    ended = {
        f"{j['metadata']['namespace']}/{j['metadata']['name']}"
        for j in jobs
        if any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (j.get("status") or {}).get("conditions") or []
        )
    }
    present = {f"{j['metadata']['namespace']}/{j['metadata']['name']}" for j in jobs}
    usage = 0
    leak = 0
    leaks = []
    for wl in workloads:
        if _condition(wl, "Finished") or not (wl.get("status") or {}).get("admission"):
            continue
        usage += _usage_milli(wl)
        key = _owner(wl)
        if key in ended or key not in present:
            leak += _usage_milli(wl)
            leaks.append(f"{key}: {'its job ended' if key in present else 'its job is gone'}, still admitted")
    held = sum(
        _pod_milli(p)
        for p in pods
        if p["spec"].get("nodeName") and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    )
    return {"quotaUsageMilliGpu": usage, "podsHoldMilliGpu": held, "quotaLeakMilliGpu": leak, "leaks": leaks}


def settled_ledger(api: KubeApi, namespaces: list[str], timeout: float = 20.0) -> dict[str, Any]:
    """The quota ledger once the controller has caught up with the window's end (nothing runs any
    more: the kubelet has stopped): read again until quota equals what pods hold and nothing leaks,
    or ``timeout`` seconds pass (then what was read last is the answer)."""
    deadline = time.monotonic() + timeout
    while True:
        workloads = _items(api, k8s.WORKLOADS, namespaces)
        jobs = _items(api, k8s.JOBS, namespaces)
        ledger = quota_ledger(workloads, jobs, _items(api, k8s.PODS, namespaces))
        balanced = ledger["quotaUsageMilliGpu"] == ledger["podsHoldMilliGpu"]
        if (balanced and not ledger["leaks"]) or time.monotonic() > deadline:
            ledger["settleSeconds"] = round(timeout - max(0.0, deadline - time.monotonic()), 1)
            return ledger
        time.sleep(0.5)


def _parse_time(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# --- comparing --------------------------------------------------------------------------------------


def comparison(real_doc: Mapping[str, Any], sim_doc: Mapping[str, Any]) -> dict[str, Any]:
    """The issue's targets, each with whether it holds."""

    def within(a: float | None, b: float | None, rel: float, floor: float = 0.0) -> bool:
        if a is None or b is None:
            return a == b
        return abs(a - b) <= max(rel * max(abs(a), abs(b)), floor)

    return {
        "finishedWithin2Percent": within(real_doc["finished"], sim_doc["finished"], 0.02, 1.0),
        "utilizationWithin10Percent": within(
            real_doc["gpuBusyOfCapacity"], sim_doc["gpuBusyOfCapacity"], 0.10
        ),
        "waitP95Within25PercentOr10Minutes": within(
            real_doc["waitP95Seconds"], sim_doc["waitP95Seconds"], 0.25, 600.0
        ),
    }


def table(doc: Mapping[str, Any]) -> Table:
    out = Table(
        title=f"sim-vs-real: {doc['jobs']} jobs over {doc['hours']} h + {doc['drainHours']} h drain, "
        f"{doc['gpus']} GPUs, speedup {doc['speedup']}"
    )
    out.add_column("")
    out.add_column("real", justify="right")
    out.add_column("simulated", justify="right")
    names = ("gpuBusyOfCapacity", "gpuAllocatedOfCapacity", "waitP50Seconds", "waitP95Seconds")
    for name in (*names, "finished", "started", "submitted", "preemptions"):
        out.add_row(name, str(doc["real"].get(name)), str(doc["simulated"].get(name)))
    out.add_row("quotaLeakGpus", str(doc["quotaLeakGpus"]), "")
    out.add_row("stuckJobs", str(len(doc["real"]["stuck"])), "")
    for name, ok in doc["targets"].items():
        out.add_row(name, "met" if ok else "NOT met", "")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hours", type=float, default=6.0, help="virtual hours of arrivals")
    parser.add_argument(
        "--drain-hours", type=float, default=18.0, help="virtual hours measured after the last arrival"
    )
    parser.add_argument("--speedup", type=float, default=300.0, help="virtual seconds per wall second")
    parser.add_argument("--nodes", default=None, help="nodes per pool, e.g. l4=2,a100=2,h100-mig=1,h100=3")
    parser.add_argument("--load", type=float, default=None, help="offered load (default: the scenario's)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--kubeconfig", default=None, help="an existing control plane (default: start one)")
    parser.add_argument(
        "--ci", action="store_true", help="the small size CI runs: 2 h + 4 h drain on 28 GPUs"
    )
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--out", type=Path, default=None, help="also write the JSON document here")
    parser.add_argument("--logs", type=Path, default=None, help="keep the controller's log in this folder")
    args = parser.parse_args(argv)
    nodes = dict(DEFAULT_NODES)
    if args.ci:
        nodes = dict(CI_NODES)
        args.hours, args.drain_hours, args.speedup = 2.0, 4.0, 300.0
    if args.nodes:
        nodes.update({k: int(v) for k, v in (part.split("=") for part in args.nodes.split(","))})
    console = Console(stderr=True)
    scenario = small_scenario(nodes, args.hours, args.drain_hours, args.seed, args.load)
    sim = arrivals(scenario, args.hours)
    console.print(f"sim-vs-real: {len(sim.workloads.jobs)} jobs, {sim.cluster.gpus} GPUs")
    sim_doc = simulated(sim)
    with tempfile.TemporaryDirectory(prefix="sim-vs-real-") as tmp:
        run = real(sim, args, Path(tmp), console)
    real_doc = measured(sim, run, args.speedup)
    doc: dict[str, Any] = {
        "real": real_doc,
        "simulated": sim_doc,
        "quotaLeakGpus": real_doc["quotaLeakMilliGpu"] / 1000,
        "jobs": len(sim.workloads.jobs),
        "gpus": sim.cluster.gpus,
        "hours": args.hours,
        "drainHours": args.drain_hours,
        "speedup": args.speedup,
        "nodes": nodes,
        "configuration": CONFIGURATION,
    }
    doc["targets"] = comparison(real_doc, sim_doc)
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2))
    if args.output == "json":
        print(json.dumps(doc, indent=2))
    else:
        Console().print(table(doc))
        for line in real_doc["stuck"][:20]:
            console.print(f"stuck: {line}")
    return 1 if doc["quotaLeakGpus"] or real_doc["stuck"] else 0


if __name__ == "__main__":
    sys.exit(main())
