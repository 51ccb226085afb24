"""gpuplane against kube-scheduler, on the same real API server in the same run, beside that server's
own ceilings.

Load (defaults): 1,000 Nodes x 8 GPUs, 5,000 one-GPU pods and 200 gangs of 4 pods x 2 GPUs. Six
passes over the same pods, one after another, each in its own namespace on empty nodes:

* **raw ceiling** (``rawCeiling``): the pods made beforehand for a scheduler that does not exist,
  then bound from 16 client threads, one Binding each carrying a device annotation (gpuplane's
  floor of one call per pod), nothing else. Also reported: how fast the pods were created.
* **the Job controller's ceiling** (``jobControllerCeiling``): unsuspended Jobs whose pods no
  scheduler takes, from the first Job created to the last pod made.
* **gpuplane, Jobs** (``gpuplane``): the pods are batch Jobs, queued and suspended. The controller
  runs in its own process (the official client, its default QPS and burst), creates their
  Workloads, admits them, releases the Jobs, and binds their pods once kube-controller-manager's
  Job controller has made them. Timed from the controller's start to the last pod bound. Reported:
  pods per second, the controller process's CPU seconds and API requests per pod, whether every
  gang was bound whole, and (``phases``) when the Workloads were created, admitted, the Jobs
  released, the pods made and bound, as watches saw them (first, median, last; seconds since the
  controller's start).
* **gpuplane, pods** (``gpuplanePods``): plain pods with the queue label (Kueue's pod integration;
  a gang is a pod group: the ``kueue.x-k8s.io/pod-group-name`` label and the
  ``kueue.x-k8s.io/pod-group-total-count`` annotation), behind gpuplane's admission gate and with
  its scheduler name as its webhook would make them, created by the benchmark exactly as for
  kube-scheduler once the controller has synced. Timed from the first pod created to the last bound.
* **kube-scheduler** (``kubeScheduler``): the cluster's own ``default-scheduler`` at its default
  settings (client QPS 50, burst 100), on the same pods created directly (gangs are plain pods).
  Timed from the first pod created to the last pod bound.
* **kube-scheduler, tuned** (``kubeSchedulerTuned``): a second kube-scheduler from the project's
  build (``GPUPLANE_KUBE_BIN`` or the unpacked cache of ``scripts/kube-up.sh``) with client QPS
  1,000 / burst 2,000 and its own scheduler name. ``null`` when that binary is not available.

Every pass reports ``cpuMsPerPod``: the CPU milliseconds per pod that each process spent during it
(kube-apiserver, etcd, kube-controller-manager, kube-scheduler and gpuplane, read from
``/proc/PID/stat``; the control plane's processes are those that ``scripts/kube-up.sh`` listed in
the kubeconfig's folder, none for another cluster). ``shares`` sets the paths against the
ceilings and kube-scheduler, and ``targets`` says which of the issue's targets were met.

``floors`` (between the ceilings and gpuplane's passes): what each kind of write on gpuplane's
paths costs the API server and etcd, timed as ``api-write-costs`` does (``--floor-writes`` of each),
and from it, for this run's pods, each path's floor: the server CPU per pod of the writes it cannot
do without (the pods path: the pod's create, its gate lifted and its Binding, and its workload's
create and status write; the Jobs path: the Binding, the workload's create, status write and Job
release, and the Job controller's own work, its ceiling's server CPU per pod less the Jobs'
creates), and the pods per second that allows on this machine's cores if nothing else used any.
``shares`` adds ``podsOfFloor`` and ``jobsOfFloor``.

Without ``--kubeconfig`` it starts the project's control plane (``scripts/kube-up.sh``), with the Job
controller's client raised to 1,000 QPS so that pod creation does not set gpuplane's pace, and stops it
at the end. With ``--kubeconfig`` the cluster must have no kubelets (the pods never run), and the
benchmark deletes what it created.

Usage::

    python3 bench/run.py controller-vs-kube-scheduler [--kubeconfig K] [--nodes 1000] [--pods 5000]
                                                      [--gangs 200] [--output json]
    python3 bench/run.py controller-vs-kube-scheduler --small     # 100 nodes, 400 pods + 20 gangs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from api_write_costs import (  # sibling modules of this folder, found through the path above
    SERVER,
    measure,
    server_ms,
)
from processes import running
from vs_cluster import (
    PREFIX,
    VERSION,
    BoundPods,
    clear_namespace,
    control_plane,
    in_parallel,
    log,
    pod_template,
    setup,
    teardown,
    workload_shapes,
)
from vs_passes import job_controller_ceiling, meter, raw_ceiling, run_gpuplane_jobs, run_gpuplane_pods

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, load_api_client

__all__ = ["control_plane"]  # the chaos benchmark's, from here

TUNED_QPS, TUNED_BURST = 1000, 2000
TUNED_NAME = "bench-tuned-scheduler"
# The targets: (share, the least it should be).
TARGETS = {
    "podsOfRawCeiling": 0.5,
    "podsVsKubeScheduler": 3.0,
    "podsVsKubeSchedulerTuned": 1.3,
    "jobsOfJobControllerCeiling": 0.75,
    "jobsVsKubeScheduler": 1.5,
}
SMALL = {"nodes": 100, "pods": 400, "gangs": 20}


def kube_scheduler_binary() -> Path | None:
    """The project's kube-scheduler build: ``GPUPLANE_KUBE_BIN``, or the cache kube-up.sh unpacks."""
    given = os.environ.get("GPUPLANE_KUBE_BIN")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuplane" / "kube" / VERSION
    for folder in (Path(given) if given else None, cache):
        if folder is not None and os.access(folder / "kube-scheduler", os.X_OK):
            return folder / "kube-scheduler"
    found = shutil.which("kube-scheduler")
    return Path(found) if found else None


@contextmanager
def tuned_scheduler(binary: Path, kubeconfig: str, directory: Path) -> Iterator[None]:
    """A second kube-scheduler with a raised client QPS and its own scheduler name."""
    config = directory / "tuned-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection: {{kubeconfig: {kubeconfig}, qps: {TUNED_QPS}, burst: {TUNED_BURST}}}\n"
        "leaderElection: {leaderElect: false}\n"
        f"profiles: [{{schedulerName: {TUNED_NAME}}}]\n"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(binary),
        "--config",
        str(config),
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
    ]
    command += ["--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig]
    with running(command, directory / "tuned-scheduler.log"):
        yield


# --- kube-scheduler ---------------------------------------------------------------------------------


def run_kube_scheduler(
    kubeconfig: str,
    api: KubeApi,
    shapes: list[tuple[str, int, int]],
    *,
    namespace: str,
    scheduler: str | None,
    args: Any,
    console: Console,
    label: str,
) -> dict[str, Any]:
    pods = [(f"{name}-{i}", gpus) for name, count, gpus in shapes for i in range(count)]

    def create(item: tuple[str, int]) -> None:
        name, gpus = item
        body = {"metadata": {"name": name, "namespace": namespace}, "spec": pod_template(gpus, scheduler)}
        api.create(k8s.PODS, body, namespace)

    with BoundPods(kubeconfig, namespace) as watch:
        cpu = meter(kubeconfig)
        started = time.perf_counter()
        in_parallel(pods, create)
        seconds = watch.wait_all(len(pods), args.timeout, console, started)
        cpu_per_pod = cpu.per_pod(len(pods))
    log(console, f"{label}: {len(pods):,} pods bound in {seconds:.1f}s")
    return {
        "podsPerSecond": round(len(pods) / seconds, 1),
        "seconds": round(seconds, 2),
        "cpuMsPerPod": cpu_per_pod,
    }


# --- the run -----------------------------------------------------------------------------------------------


def _share(a: dict[str, Any] | None, b: dict[str, Any] | None) -> float | None:
    if a is None or b is None or not b.get("podsPerSecond"):
        return None
    return round(a["podsPerSecond"] / b["podsPerSecond"], 2)


def shares(result: dict[str, Any]) -> dict[str, float | None]:
    """The two gpuplane paths set against the ceilings, their floors and kube-scheduler (``None``: a
    pass that did not run)."""
    pods, jobs = result.get("gpuplanePods"), result.get("gpuplane")
    floor = result.get("floors") or {}

    def of_floor(path: dict[str, Any] | None, key: str) -> float | None:
        at_most = (floor.get(key) or {}).get("podsPerSecondAtMost")
        return _share(path, {"podsPerSecond": at_most} if at_most else None)

    return {
        "podsOfFloor": of_floor(pods, "pods"),
        "jobsOfFloor": of_floor(jobs, "jobs"),
        "podsOfRawCeiling": _share(pods, result.get("rawCeiling")),
        "podsVsKubeScheduler": _share(pods, result.get("kubeScheduler")),
        "podsVsKubeSchedulerTuned": _share(pods, result.get("kubeSchedulerTuned")),
        "jobsOfRawCeiling": _share(jobs, result.get("rawCeiling")),
        "jobsOfJobControllerCeiling": _share(jobs, result.get("jobControllerCeiling")),
        "jobsVsKubeScheduler": _share(jobs, result.get("kubeScheduler")),
        "jobsVsKubeSchedulerTuned": _share(jobs, result.get("kubeSchedulerTuned")),
    }


POD_WRITES = {"pods": ("POST pods", "PUT pods", "POST pods/binding"), "jobs": ("POST pods/binding",)}
WORKLOAD_WRITES = {
    "pods": ("POST workloads", "PUT workloads/status"),
    "jobs": ("POST workloads", "PUT workloads/status", "PUT jobs"),
}


def floors(
    costs: dict[str, dict[str, Any]],
    job_controller: dict[str, Any],
    shapes: list[tuple[str, int, int]],
    cpus: int,
) -> dict[str, Any]:
    """Each path's floor for this run's pods (see the module docstring): server CPU ms per pod
    and the pods per second that allows on ``cpus`` cores."""

    def ms(kind: str) -> float:
        return server_ms(costs, kind)

    pods = sum(count for _, count, _ in shapes)
    workloads = len(shapes)
    per_pod = {
        path: sum(ms(k) for k in POD_WRITES[path])
        + workloads / pods * sum(ms(k) for k in WORKLOAD_WRITES[path])
        for path in POD_WRITES
    }
    own = sum(float(job_controller["cpuMsPerPod"].get(proc, 0.0)) for proc in SERVER)
    per_pod["jobs"] += max(0.0, own - workloads / pods * ms("POST jobs"))
    out: dict[str, Any] = {
        path: {"serverCpuMsPerPod": round(value, 2), "podsPerSecondAtMost": round(cpus * 1000 / value, 1)}
        for path, value in per_pod.items()
    }
    out["costs"] = costs
    return out


def passes(
    args: argparse.Namespace, kubeconfig: str, api: KubeApi, tmp: Path, console: Console
) -> dict[str, Any]:
    """Every pass, one after another, each namespace emptied after its pass."""
    shapes = workload_shapes(args.pods, args.gangs, args.gang_size)
    out: dict[str, Any] = {}
    if not args.only_gpuplane:
        out["rawCeiling"] = raw_ceiling(kubeconfig, api, shapes, args.nodes, console)
        clear_namespace(api, f"{PREFIX}-raw")
        out["jobControllerCeiling"] = job_controller_ceiling(kubeconfig, api, shapes, args, console)
        clear_namespace(api, f"{PREFIX}-jobs-only")
        costs = measure(kubeconfig, api, f"{PREFIX}-raw", args.floor_writes)
        clear_namespace(api, f"{PREFIX}-raw")
        out["floors"] = floors(costs, out["jobControllerCeiling"], shapes, os.cpu_count() or 1)
        log(
            console,
            "floors: "
            + ", ".join(
                f"{k} {v['podsPerSecondAtMost']}/s" for k, v in out["floors"].items() if k != "costs"
            ),
        )
    out["gpuplane"], out["phases"] = run_gpuplane_jobs(kubeconfig, api, shapes, args, console)
    clear_namespace(api, f"{PREFIX}-gpuplane")
    out["gpuplanePods"] = run_gpuplane_pods(kubeconfig, api, shapes, args, console)
    clear_namespace(api, f"{PREFIX}-pods")
    if args.only_gpuplane:
        return out
    common = {"args": args, "console": console}
    out["kubeScheduler"] = run_kube_scheduler(
        kubeconfig,
        api,
        shapes,
        namespace=f"{PREFIX}-default",
        scheduler=None,
        label="kube-scheduler",
        **common,
    )
    clear_namespace(api, f"{PREFIX}-default")
    binary = kube_scheduler_binary()
    out["kubeSchedulerTuned"] = None
    if binary is None:
        log(console, "no kube-scheduler binary of the project's build: kubeSchedulerTuned is null")
        return out
    with tuned_scheduler(binary, kubeconfig, tmp):
        out["kubeSchedulerTuned"] = run_kube_scheduler(
            kubeconfig,
            api,
            shapes,
            namespace=f"{PREFIX}-tuned",
            scheduler=TUNED_NAME,
            label="kube-scheduler tuned",
            **common,
        )
    return out


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    shapes = workload_shapes(args.pods, args.gangs, args.gang_size)
    total_pods = sum(count for _, count, _ in shapes)
    total_gpus = sum(count * gpus for _, count, gpus in shapes)
    if total_gpus > args.nodes * 8:
        raise SystemExit(f"{total_gpus} GPUs asked of {args.nodes * 8}: every pod must fit")
    with control_plane(args.kubeconfig, console) as kubeconfig, tempfile.TemporaryDirectory() as tmp:
        # Deleting thousands of objects in one request takes longer than a client's usual timeout.
        api = KubeApi(load_api_client(kubeconfig), timeout=600.0, qps=None)
        t = time.perf_counter()
        setup(api, args.nodes, total_gpus)
        log(console, f"set up {args.nodes:,} nodes in {time.perf_counter() - t:.1f}s")
        try:
            result = passes(args, kubeconfig, api, Path(tmp), console)
        finally:
            teardown(api, args.nodes)
            api.api_client.close()
    result["ratio"] = _share(result["gpuplane"], result.get("kubeScheduler"))
    result["ratioTuned"] = _share(result["gpuplane"], result.get("kubeSchedulerTuned"))
    result["shares"] = shares(result)
    result["targets"] = {
        name: {
            "atLeast": least,
            "met": None if result["shares"][name] is None else result["shares"][name] >= least,
        }
        for name, least in TARGETS.items()
    }
    result["load"] = {
        "nodes": args.nodes,
        "gpusPerNode": 8,
        "pods": args.pods,
        "gangs": args.gangs,
        "gangSize": args.gang_size,
        "totalPods": total_pods,
        "cpus": os.cpu_count(),
    }
    result["settings"] = {
        "gpuplaneQps": "client default",
        "kubeScheduler": "default-scheduler, client QPS 50 / burst 100",
        "kubeSchedulerTuned": f"client QPS {TUNED_QPS} / burst {TUNED_BURST}",
        "rawCeiling": "16 client threads, one Binding per pod",
    }
    return result


ROWS = (
    ("raw ceiling (Bindings only)", "rawCeiling"),
    ("Job controller ceiling", "jobControllerCeiling"),
    ("gpuplane, Jobs", "gpuplane"),
    ("gpuplane, pods", "gpuplanePods"),
    ("kube-scheduler (default)", "kubeScheduler"),
    ("kube-scheduler (tuned)", "kubeSchedulerTuned"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kubeconfig", help="a kubelet-less cluster; default: start the project's control plane"
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000, help="one-GPU pods")
    parser.add_argument("--gangs", type=int, default=200, help="gangs of --gang-size pods x 2 GPUs")
    parser.add_argument("--gang-size", type=int, default=4)
    parser.add_argument(
        "--small", action="store_true", help="a run of a few minutes: 100 nodes, 400 pods + 20 gangs"
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one pass may take")
    parser.add_argument(
        "--floor-writes", type=int, default=400, help="writes of each kind timed for the floors"
    )
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--profile", help="write a cProfile of the controller process (Jobs path) here")
    parser.add_argument(
        "--only-gpuplane",
        action="store_true",
        help="only gpuplane's two paths (no ceilings, no kube-scheduler)",
    )
    args = parser.parse_args(argv)
    if args.small:
        vars(args).update(SMALL)
    for name in ("nodes", "pods", "gangs", "gang_size"):
        if getattr(args, name) < (1 if name != "gangs" else 0):
            parser.error(f"--{name.replace('_', '-')} must be positive, not {getattr(args, name)}")
    console = Console(stderr=args.output == "json")
    result = run(args, console)
    if args.output == "json":
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
        return 0
    table = Table(
        title=f"{args.nodes:,} nodes, {args.pods:,} pods + {args.gangs:,} gangs of {args.gang_size}"
    )
    table.add_column("path")
    table.add_column("pods / s", justify="right")
    table.add_column("seconds", justify="right")
    for label, key in ROWS:
        figures = result.get(key)
        if figures is not None:
            table.add_row(label, f"{figures['podsPerSecond']:,.1f}", f"{figures['seconds']:,.1f}")
    console.print(table)
    console.print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
