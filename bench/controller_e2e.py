"""The controller end to end through the API-server double, at cluster scale.

Load: 1,000 nodes x 8 GPUs, 5,000 single-pod jobs (1 GPU) and 200 gangs (jobs of 4 pods x 2 GPUs),
one ClusterQueue with quota for all of them, so every pod ends up bound. Three processes:

* the **double** (``python -m apiserver`` from ``tests/``), serving HTTP on loopback;
* the **controller** (:class:`gpuplane.k8s.controller.Controller` over the official client), started
  once every job has been created suspended; it creates the Workloads, admits, releases the jobs and
  binds their pods;
* this process: it creates the objects, plays kube-controller-manager's Job controller (pods for every
  unsuspended job, through the mutating webhook's ``review()``) and watches the pods.

Reported, measured in the same run:

* **end to end**: pods bound per second, from the controller's start to the last binding; the
  controller process's CPU seconds (all its threads, ``time.process_time`` at exit) per bound pod;
* **baseline**: the same number of raw Binding API calls made by a loop in a child process with the
  same client, on pods that already exist: bindings per second and CPU seconds per binding;
* the ratios of the two (throughput: controller / baseline; CPU: controller / baseline).

* the controller's **passes**: how many it ran, and the mean wall time of one (the passes that
  ran to the end, on the leader with synced caches);
* the **trickle**: once the load is bound and the controller has settled (no new Event for a second:
  the Events of the load, such as one for the first pending condition of each parked Workload, go out
  in the background after the last binding; ``settleSeconds``), ``--trickle`` more single-pod jobs
  (20), each submitted once the one before is bound, so that each pass sees a few changed objects among
  many that stay the same: its passes, their mean wall time, the controller's CPU per pod and the
  seconds per job. The passes while it settles are timed neither for the load nor for the trickle.

``--parked N`` adds N Workloads, created before the controller starts, in a ClusterQueue without
GPU quota: they stay pending the whole run and never change after their first pending condition.
``--idle-nodes N`` adds N nodes without GPUs, that no pod can use. Both are objects that do not
change while the load runs; comparing runs at two values shows whether a pass costs more with more
of them (``--sweep N,N,...`` runs the whole benchmark once per value of ``--parked``, with as many
idle nodes, and prints one row per run).

Usage::

    python3 bench/controller_e2e.py [--nodes 1000] [--jobs 5000] [--gangs 200] [--gang-size 4]
                                    [--parked 0] [--idle-nodes 0] [--trickle 20] [--sweep N,N,...]
                                    [--out DIR] [--profile FILE]

``--profile FILE`` writes a cProfile of the controller process (read it with ``python -m pstats``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from controller_harness import CRD_DIR, CRDS, webhook_admit  # noqa: E402 (after the path set-up)
from gpuplane.k8s import api as k8s  # noqa: E402
from gpuplane.k8s.api import ApiError, KubeApi, load_api_client  # noqa: E402
from gpuplane.k8s.controller import Controller, ControllerConfig  # noqa: E402
from gpuplane.k8s.informer import Cache, Informer  # noqa: E402
from manifests import (  # noqa: E402
    GPU,
    cluster_queue,
    local_queue,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

NAMESPACE = "bench"
BASELINE_NAMESPACE = "baseline"
FLAVOR = "h100"
WORKERS = 8  # client threads that create objects


def log(console: Console, text: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}")


# --- the double ----------------------------------------------------------------------------------


def start_double(directory: Path) -> tuple[subprocess.Popen[str], str]:
    kubeconfig = directory / "kubeconfig"
    process = subprocess.Popen(
        [sys.executable, "-m", "apiserver", "--kubeconfig", str(kubeconfig)],
        cwd=ROOT / "tests",
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{ROOT / 'tests'}"},
    )
    assert process.stdout is not None
    line = process.stdout.readline()  # "serving URL; kubeconfig at PATH" once it listens
    if "serving" not in line:
        process.kill()
        raise SystemExit(f"the double did not start: {line!r}")
    return process, str(kubeconfig)


def in_parallel(work: list[Any], call: Any) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(call, work):
            pass


def setup(api: KubeApi, nodes: int, gpus: int, parked: int = 0, idle_nodes: int = 0) -> None:
    import yaml  # noqa: PLC0415 (set-up only)

    for path in sorted(CRD_DIR.glob("*.yaml")):
        api.create(CRDS, yaml.safe_load(path.read_text()))
    deadline = time.monotonic() + 30
    while True:
        try:
            api.list(k8s.WORKLOADS, limit=1)
            break
        except ApiError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    for ns in (NAMESPACE, BASELINE_NAMESPACE):
        api.create(k8s.NAMESPACES, {"metadata": {"name": ns}})
    api.create(k8s.RESOURCE_FLAVORS, resource_flavor(FLAVOR).to_dict())
    api.create(k8s.CLUSTER_QUEUES, cluster_queue("bench").flavor(FLAVOR, cpu="100000", gpu=gpus).to_dict())
    api.create(k8s.LOCAL_QUEUES, local_queue("queue", NAMESPACE, "bench").to_dict(), NAMESPACE)

    def add_node(i: int) -> None:
        body = (
            node(f"node-{i:05d}")
            .allocatable(cpu="128", memory="2Ti", pods="110", gpu=8)
            .label("kubernetes.io/hostname", f"node-{i:05d}")
            .label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
            .to_dict()
        )
        api.create(k8s.NODES, body)

    in_parallel(list(range(nodes)), add_node)
    in_parallel(
        list(range(idle_nodes)),
        lambda i: api.create(
            k8s.NODES,
            node(f"idle-{i:05d}")
            .allocatable(cpu="16", memory="64Gi", pods="110")
            .label("kubernetes.io/hostname", f"idle-{i:05d}")
            .to_dict(),
        ),
    )
    if parked:
        api.create(k8s.CLUSTER_QUEUES, cluster_queue("parked").flavor(FLAVOR, cpu="1000", gpu=0).to_dict())
        api.create(k8s.LOCAL_QUEUES, local_queue("parked", NAMESPACE, "parked").to_dict(), NAMESPACE)
        in_parallel(
            list(range(parked)),
            lambda i: api.create(
                k8s.WORKLOADS,
                workload(f"parked-{i:05d}", NAMESPACE).queue("parked").podset(cpu="100m", gpu=1).to_dict(),
                NAMESPACE,
            ),
        )


def job_body(name: str, pods: int, gpus: int) -> dict[str, Any]:
    spec = pod_spec().container(limits={GPU: gpus}, cpu="100m", gpu=gpus).to_dict()
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = 0
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"kueue.x-k8s.io/queue-name": "queue"}},
        "spec": {"parallelism": pods, "completions": pods, "suspend": True, "template": {"spec": spec}},
    }


# --- kube-controller-manager's Job controller, watch-driven -------------------------------------------


class JobPods:
    """Creates the pods of every unsuspended job (once), from a watch of Jobs; counts bound pods."""

    def __init__(self, api: KubeApi) -> None:
        self.api = api
        self.cache = Cache()
        self.jobs = Informer(api, k8s.JOBS, self.cache)
        self.pods = Informer(api, k8s.PODS, self.cache)
        self.started: set[str] = set()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def begin(self) -> None:
        self.jobs.start()
        self.pods.start()
        self.thread.start()

    def end(self) -> None:
        self.stop.set()
        self.jobs.stop()
        self.pods.stop()
        self.thread.join(timeout=10)

    def bound(self) -> int:
        with self.cache.lock:
            pods = self.cache.objects.get("Pod", {})
            return sum(
                1 for key, p in pods.items() if key.startswith(f"{NAMESPACE}/") and p["spec"].get("nodeName")
            )

    def _loop(self) -> None:
        with ThreadPoolExecutor(WORKERS) as pool:
            while not self.stop.is_set():
                with self.cache.lock:
                    ready = [
                        j
                        for key, j in self.cache.objects.get("Job", {}).items()
                        if key not in self.started and not j["spec"].get("suspend")
                    ]
                pods = []
                for job in ready:
                    self.started.add(f"{NAMESPACE}/{job['metadata']['name']}")
                    pods += [self._pod(job, i) for i in range(job["spec"]["parallelism"])]
                for _ in pool.map(lambda p: self.api.create(k8s.PODS, p, NAMESPACE), pods):
                    pass
                self.cache.changed.wait(0.05)
                self.cache.changed.clear()

    @staticmethod
    def _pod(job: dict[str, Any], index: int) -> dict[str, Any]:
        meta, template = job["metadata"], job["spec"]["template"]
        return webhook_admit(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"{meta['name']}-{index}",
                    "namespace": NAMESPACE,
                    "labels": {
                        **(template.get("metadata", {}).get("labels") or {}),
                        "job-name": meta["name"],
                    },
                    "ownerReferences": [
                        {
                            "apiVersion": "batch/v1",
                            "kind": "Job",
                            "name": meta["name"],
                            "uid": meta["uid"],
                            "controller": True,
                        }
                    ],
                },
                "spec": template["spec"],
            }
        )


# --- the two measured children ------------------------------------------------------------------------


def controller_process(
    kubeconfig: str, phases: tuple[Any, Any, Any], results: Any, profile: str | None
) -> None:
    """The controller under test, until ``stop`` is set; sends its counters, CPU time and pass times
    (those of the main load, until ``loaded`` is set, and those once ``trickle`` is set; the passes
    between, while it settles, are not timed). ``phases``: the events ``stop``, ``loaded`` and
    ``trickle``."""
    stop, loaded, trickle = phases
    api = KubeApi(load_api_client(kubeconfig))
    api.api_client.user_agent = "gpuplane-controller/bench"
    controller = Controller(api, ControllerConfig(leader_election=False))
    profiler = None
    if profile:
        import cProfile  # noqa: PLC0415 (only when asked)

        profiler = cProfile.Profile()
        profiler.enable()
    controller.start(wait=120)
    passes = 0
    pass_seconds: list[float] = []
    trickle_seconds: list[float] = []
    trickle_cpu = 0.0
    reconcile = controller.reconcile

    def timed() -> Any:
        nonlocal trickle_cpu
        late = trickle.is_set()
        settling = loaded.is_set() and not late
        if late and not trickle_cpu:
            trickle_cpu = time.process_time()
        started = time.perf_counter()
        plan = reconcile()
        if plan is not None and not settling:
            (trickle_seconds if late else pass_seconds).append(time.perf_counter() - started)
        return plan

    controller.reconcile = timed  # type: ignore[method-assign]

    def stopping() -> bool:
        nonlocal passes
        passes += 1
        return bool(stop.is_set())

    controller.run(stopping, interval=0.05)
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    controller.stop()
    results.put(
        {
            "cpuSeconds": trickle_cpu or time.process_time(),
            "trickleCpuSeconds": time.process_time() - trickle_cpu if trickle_cpu else 0.0,
            "tricklePasses": len(trickle_seconds),
            "trickleMeanPassSeconds": sum(trickle_seconds) / max(1, len(trickle_seconds)),
            "passes": passes,
            "fullPasses": len(pass_seconds),
            "meanPassSeconds": sum(pass_seconds) / max(1, len(pass_seconds)),
            "counters": {k: v for k, v in vars(controller.counters).items() if k not in ("extra", "lock")},
            # Why the scheduling session was built from the whole cache, by kind of reason (a
            # controller that keeps none builds one every pass).
            "sessionRebuilds": dict(getattr(getattr(controller, "live", None), "rebuild_reasons", {})),
        }
    )


def baseline_process(kubeconfig: str, pods: list[tuple[str, str]], results: Any) -> None:
    """Raw Binding API calls in a loop: the floor any binder pays per pod."""
    api = KubeApi(load_api_client(kubeconfig))
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for name, node_name in pods:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": BASELINE_NAMESPACE},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
        }
        api.request("POST", k8s.PODS.path(BASELINE_NAMESPACE, name, "binding"), body=body)
    results.put({"cpuSeconds": time.process_time() - cpu0, "wallSeconds": time.perf_counter() - wall0})


# --- the run -------------------------------------------------------------------------------------------


def settle(api: KubeApi, timeout: float, quiet: float = 1.0) -> float:
    """Wait until the number of Events in the cluster has not changed for ``quiet`` seconds; returns
    the seconds waited. Once the load is bound the controller still sends Events of the load in the
    background (one for the first pending condition of each parked Workload, among others): the
    trickle starts after them, so that its numbers are its own."""
    started = time.perf_counter()
    count, since = -1, started
    while time.perf_counter() - started < timeout:
        now_count = len(api.list(k8s.EVENTS).get("items", []))
        now = time.perf_counter()
        if now_count != count:
            count, since = now_count, now
        elif now - since >= quiet:
            break
        time.sleep(0.25)
    return time.perf_counter() - started


def trickle_jobs(api: KubeApi, job_pods: JobPods, bound: int, args: argparse.Namespace, child: Any) -> float:
    """After the main load: ``args.trickle`` single-pod jobs, one at a time, each once the one
    before it is bound. Each pass then sees a few changed objects among all that stay the same.
    Returns the wall seconds."""
    started = time.perf_counter()
    for i in range(args.trickle):
        api.create(k8s.JOBS, job_body(f"trickle-{i:04d}", 1, 1), NAMESPACE)
        bound += 1
        while job_pods.bound() < bound:
            if not child.is_alive():
                raise SystemExit("the controller died")
            if time.perf_counter() - started > args.timeout:
                raise SystemExit(f"timed out in the trickle at job {i}")
            time.sleep(0.01)
    return time.perf_counter() - started


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    total_pods = args.jobs + args.gangs * args.gang_size
    total_gpus = args.jobs + args.gangs * args.gang_size * 2 + args.trickle
    if total_gpus > args.nodes * 8:
        raise SystemExit(f"{total_gpus} GPUs asked of {args.nodes * 8}: every pod must fit")
    context = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        double, kubeconfig = start_double(Path(tmp))
        try:
            api = KubeApi(load_api_client(kubeconfig))
            t = time.perf_counter()
            setup(api, args.nodes, total_gpus, args.parked, args.idle_nodes)
            jobs = [job_body(f"single-{i:05d}", 1, 1) for i in range(args.jobs)]
            jobs += [job_body(f"gang-{i:04d}", args.gang_size, 2) for i in range(args.gangs)]
            in_parallel(jobs, lambda body: api.create(k8s.JOBS, body, NAMESPACE))
            log(
                console,
                f"set up {args.nodes:,} nodes and {len(jobs):,} jobs in {time.perf_counter() - t:.1f}s",
            )

            job_pods = JobPods(KubeApi(load_api_client(kubeconfig)))
            job_pods.begin()
            stop, loaded, trickle = context.Event(), context.Event(), context.Event()
            results = context.Queue()
            start = time.perf_counter()
            child = context.Process(
                target=controller_process, args=(kubeconfig, (stop, loaded, trickle), results, args.profile)
            )
            child.start()
            first = None
            last_report = start
            while (bound := job_pods.bound()) < total_pods:
                if bound and first is None:
                    first = time.perf_counter() - start
                if time.perf_counter() - last_report > 10:
                    log(console, f"{bound:,}/{total_pods:,} pods bound")
                    last_report = time.perf_counter()
                if not child.is_alive():
                    raise SystemExit("the controller died")
                if time.perf_counter() - start > args.timeout:
                    raise SystemExit(f"timed out with {bound:,}/{total_pods:,} pods bound")
                time.sleep(0.05)
            elapsed = time.perf_counter() - start
            loaded.set()
            settled = settle(api, args.timeout)
            trickle.set()
            trickle_wall = trickle_jobs(api, job_pods, total_pods, args, child)
            stop.set()
            controller = results.get(timeout=120)
            child.join(timeout=60)
            job_pods.end()
            log(console, f"controller: {total_pods:,} pods bound in {elapsed:.1f}s")

            nodes = [f"node-{i % args.nodes:05d}" for i in range(total_pods)]
            plain = pod_spec().container(cpu="10m").to_dict()
            names = [f"raw-{i:05d}" for i in range(total_pods)]
            in_parallel(
                names,
                lambda n: api.create(
                    k8s.PODS,
                    {"metadata": {"name": n, "namespace": BASELINE_NAMESPACE}, "spec": plain},
                    BASELINE_NAMESPACE,
                ),
            )
            base = context.Process(
                target=baseline_process, args=(kubeconfig, list(zip(names, nodes, strict=True)), results)
            )
            base.start()
            baseline = results.get(timeout=args.timeout)
            base.join(timeout=60)
            log(console, f"baseline: {total_pods:,} raw bindings in {baseline['wallSeconds']:.1f}s")
        finally:
            double.terminate()
            double.wait(timeout=30)
    e2e_rate = total_pods / elapsed
    base_rate = total_pods / baseline["wallSeconds"]
    cpu_per_pod = controller["cpuSeconds"] / total_pods
    base_cpu = baseline["cpuSeconds"] / total_pods
    return {
        "nodes": args.nodes,
        "jobs": args.jobs,
        "gangs": args.gangs,
        "gangSize": args.gang_size,
        "pods": total_pods,
        "e2eSeconds": round(elapsed, 2),
        "firstBindingSeconds": round(first or elapsed, 2),
        "podsBoundPerSecond": round(e2e_rate, 1),
        "controllerCpuSeconds": round(controller["cpuSeconds"], 2),
        "controllerCpuMsPerPod": round(cpu_per_pod * 1000, 3),
        "parked": args.parked,
        "idleNodes": args.idle_nodes,
        "controllerPasses": controller["fullPasses"],
        "meanPassMs": round(controller["meanPassSeconds"] * 1000, 1),
        "settleSeconds": round(settled, 2),
        "trickleJobs": args.trickle,
        "tricklePasses": controller["tricklePasses"],
        "trickleMeanPassMs": round(controller["trickleMeanPassSeconds"] * 1000, 1),
        "trickleCpuMsPerPod": round(controller["trickleCpuSeconds"] * 1000 / max(1, args.trickle), 2),
        "trickleSecondsPerJob": round(trickle_wall / max(1, args.trickle), 3),
        "controllerCounters": controller["counters"],
        "sessionRebuilds": controller["sessionRebuilds"],
        "baselineSeconds": round(baseline["wallSeconds"], 2),
        "baselineBindingsPerSecond": round(base_rate, 1),
        "baselineCpuMsPerBinding": round(base_cpu * 1000, 3),
        "throughputRatio": round(e2e_rate / base_rate, 3),
        "cpuRatio": round(cpu_per_pod / base_cpu, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=5000, help="single-pod jobs of 1 GPU")
    parser.add_argument("--gangs", type=int, default=200, help="jobs of --gang-size pods x 2 GPUs")
    parser.add_argument("--gang-size", type=int, default=4)
    parser.add_argument("--parked", type=int, default=0, help="Workloads pending all along (no quota)")
    parser.add_argument("--idle-nodes", type=int, default=0, help="nodes without GPUs")
    parser.add_argument("--trickle", type=int, default=20, help="jobs submitted one by one after the load")
    parser.add_argument("--sweep", help="comma-separated values of --parked (and --idle-nodes): one run each")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before giving up")
    parser.add_argument("--out", type=Path, help="write controller-e2e.json here")
    parser.add_argument("--profile", help="write a cProfile of the controller process here")
    args = parser.parse_args(argv)
    console = Console()
    if args.sweep:
        try:
            values = [int(v) for v in args.sweep.split(",")]
        except ValueError:
            parser.error(f"--sweep: not a list of integers: {args.sweep}")
        results = [
            run(argparse.Namespace(**{**vars(args), "parked": n, "idle_nodes": n}), console) for n in values
        ]
        print_sweep(results, console)
    else:
        results = [run(args, console)]
        print_one(args, results[0], console)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        written = results if args.sweep else results[0]
        (args.out / "controller-e2e.json").write_text(json.dumps(written, indent=1))
    return 0


def print_one(args: argparse.Namespace, result: dict[str, Any], console: Console) -> None:
    table = Table(title=f"controller-e2e: {args.nodes:,} nodes, {args.jobs:,} jobs + {args.gangs:,} gangs")
    table.add_column("measure")
    table.add_column("controller, end to end", justify="right")
    table.add_column("baseline: raw bindings", justify="right")
    table.add_column("ratio", justify="right")
    table.add_row("pods", f"{result['pods']:,}", f"{result['pods']:,}", "")
    table.add_row("wall seconds", f"{result['e2eSeconds']:,.1f}", f"{result['baselineSeconds']:,.1f}", "")
    table.add_row(
        "pods bound / s",
        f"{result['podsBoundPerSecond']:,.0f}",
        f"{result['baselineBindingsPerSecond']:,.0f}",
        f"{result['throughputRatio']:.2f}",
    )
    table.add_row(
        "CPU ms / pod",
        f"{result['controllerCpuMsPerPod']:,.2f}",
        f"{result['baselineCpuMsPerBinding']:,.2f}",
        f"{result['cpuRatio']:.1f}x",
    )
    table.add_row("passes", f"{result['controllerPasses']:,}", "", "")
    table.add_row("mean pass ms", f"{result['meanPassMs']:,.1f}", "", "")
    table.add_row(f"trickle ({result['trickleJobs']} jobs): passes", f"{result['tricklePasses']:,}", "", "")
    table.add_row("trickle: mean pass ms", f"{result['trickleMeanPassMs']:,.1f}", "", "")
    table.add_row("trickle: CPU ms / pod", f"{result['trickleCpuMsPerPod']:,.1f}", "", "")
    console.print(table)
    console.print(json.dumps(result))


def print_sweep(results: list[dict[str, Any]], console: Console) -> None:
    first = results[0]
    table = Table(
        title=f"controller-e2e: {first['nodes']:,} nodes, {first['jobs']:,} jobs + {first['gangs']:,} gangs, "
        "with unchanged objects"
    )
    columns = ("parked Workloads + idle nodes", "load: passes", "mean pass ms", "CPU ms / pod")
    columns += ("trickle: passes", "mean pass ms", "CPU ms / pod", "s / job", "trickle pass vs first row")
    for name in columns:
        table.add_column(name, justify="right")
    for result in results:
        table.add_row(
            f"{result['parked']:,} + {result['idleNodes']:,}",
            f"{result['controllerPasses']:,}",
            f"{result['meanPassMs']:,.1f}",
            f"{result['controllerCpuMsPerPod']:,.2f}",
            f"{result['tricklePasses']:,}",
            f"{result['trickleMeanPassMs']:,.1f}",
            f"{result['trickleCpuMsPerPod']:,.1f}",
            f"{result['trickleSecondsPerJob']:,.2f}",
            f"{result['trickleMeanPassMs'] / max(first['trickleMeanPassMs'], 1e-9):.2f}x",
        )
    console.print(table)
    console.print(json.dumps(results))


if __name__ == "__main__":
    sys.exit(main())
