"""MultiKueue dispatch: one manager and two workers on loopback, 1,000 queued jobs.

Three real control planes (``scripts/kube-up.sh``): the manager runs gpuplane's controller with
``--multikueue`` at its defaults (gpuplane's dispatcher, 100 QPS per worker); each worker runs
gpuplane's controller, kube-controller-manager's Job controller and the test's fake kubelet. The jobs
(one GPU each, running 90 s, ``spec.managedBy: kueue.x-k8s.io/multikueue``) are created on the manager;
the workers' nodes hold them all, so what is measured is dispatch:

- ``workloadsPerSecond``: the jobs divided by the time from the last job created to the last
  Workload admitted on a worker (``status.clusterName`` set on the manager);
- ``dispatchToRunningP50Seconds``: per job, from its quota reserved on the manager to its pod
  Running on the worker, the median.

The ceiling, in the same run: the same number of Workload copies created on one worker's API server
from 16 client threads, nothing else (``ceiling.workloadsPerSecond``), and the share of it reached.
What the machine allows (``cpu``): from the last job created to the last dispatch, the CPU each
process of the run spent per dispatched workload (the three control planes' API servers, etcds,
controller managers and schedulers, the three gpuplane controllers, and this process, which runs the
fake kubelets, the test's JobSet controller and the measuring watches), how busy the machine was
(``machineBusyShare``), the rate every core would allow at that cost
(``workloadsPerSecondAtThisCost``), and gpuplane's processes' share of the CPU.
The measuring reads watches, not lists, so it loads no API server.

The baseline, in the same run on the same planes (unless ``--no-baseline``): once the first pass's
jobs have finished, the manager is restarted with Kueue's default dispatcher, AllAtOnce, and as many
jobs again are dispatched and timed (``baseline``, and ``vsBaseline``: gpuplane's rate over it).
Kueue's figure (kueue #8564): 1.3 workloads/s at 5 QPS per worker, about 100/s at 1,000 QPS.
Target (issue: many clusters): at least 50 workloads/s at our defaults.

Usage::

    python3 bench/run.py multicluster                  # 1,000 jobs
    python3 bench/multicluster.py --jobs 200 --output json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from processes import CpuMeter, control_plane_pids  # noqa: E402 (after the path set-up)
from vs_cluster import Watched, control_plane, log  # noqa: E402

from gpuplane.k8s import api as k8s  # noqa: E402
from gpuplane.model.fields import lenient_timestamp  # noqa: E402
from multikueue_fleet import NS, Fleet, build_fleet  # noqa: E402

TARGET = 50.0
THREADS = 16
RUN_SECONDS = 90.0  # how long each job's pod runs: the workers are free again for the next pass
BASELINE = "AllAtOnce"  # Kueue's default dispatcher, the baseline measured in the same run


class Clock:
    """First time each job was seen reserved on the manager, admitted on a worker, running there; kept
    by watches (the manager's Workloads, the workers' pods), so the measuring loads no API server with
    lists."""

    def __init__(self, fleet: Fleet, names: set[str]) -> None:
        self.names = names  # the jobs of this pass; the others are left out
        self.manager = Watched(str(fleet.manager.kubeconfig), NS, k8s.WORKLOADS)
        self.workers = [Watched(str(w.kubeconfig), NS, k8s.PODS) for w in (fleet.small, fleet.big)]
        self.reserved: dict[str, float] = {}
        self.dispatched: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Clock:
        for watched in (self.manager, *self.workers):
            watched.__enter__()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for watched in (self.manager, *self.workers):
            watched.__exit__()

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            now = time.time()
            for key in self.manager.cache.take_changes().get("Workload", ()):
                wl = self.manager.cache.get("Workload", key)
                job = next(
                    (r["name"] for r in (wl or {}).get("metadata", {}).get("ownerReferences") or []), None
                )
                if wl is None or job not in self.names:
                    continue
                for cond in (wl.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "QuotaReserved" and cond.get("status") == "True":
                        at = lenient_timestamp(cond.get("lastTransitionTime")) or now
                        self.reserved.setdefault(job, at)
                if (wl.get("status") or {}).get("clusterName"):
                    self.dispatched.setdefault(job, now)
            for worker in self.workers:
                for key in worker.cache.take_changes().get("Pod", ()):
                    pod = worker.cache.get("Pod", key)
                    if pod is not None and (pod.get("status") or {}).get("phase") == "Running":
                        job = (pod["metadata"].get("labels") or {}).get("job-name")
                        if job in self.names:
                            self.running.setdefault(job, now)


def cpu_meter(fleet: Fleet) -> CpuMeter:
    """The CPU of every process of the run, from now: each control plane's (``scripts/kube-up.sh``'s
    list), each gpuplane controller's, and this process (the fake kubelets, the test's JobSet
    controller and the measuring watches)."""
    meter = CpuMeter({"benchmark": os.getpid()})
    for member in (fleet.manager, fleet.small, fleet.big):
        directory = member.directory or member.kubeconfig.parent
        for name, pid in control_plane_pids(directory).items():
            meter.add(f"{member.name}/{name}", pid)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"controller" not in args or b"gpuplane" not in args or b"--kubeconfig" not in args:
            continue
        kubeconfig = args[args.index(b"--kubeconfig") + 1].decode()
        for member in (fleet.manager, fleet.small, fleet.big):
            if kubeconfig == str(member.kubeconfig):
                meter.add(f"{member.name}/gpuplane", int(proc.name))
    return meter


def cpu_report(spent: dict[str, float], workloads: int, seconds: float) -> dict[str, Any]:
    """CPU milliseconds per workload by process, and the share of the machine's CPU they used."""
    total = sum(spent.values())
    cores = os.cpu_count() or 1
    return {
        "cpuMsPerWorkload": {
            name: round(1000 * s / max(1, workloads), 1) for name, s in sorted(spent.items())
        },
        "cpuMsPerWorkloadTotal": round(1000 * total / max(1, workloads), 1),
        "machineBusyShare": round(total / (cores * seconds), 3) if seconds > 0 else None,
        "cpus": cores,
        # What the machine allows at this cost: every core busy, nothing else running.
        "workloadsPerSecondAtThisCost": round(1000 * cores / (1000 * total / workloads), 1)
        if total > 0 and workloads > 0
        else None,
        "gpuplaneShare": round(sum(v for k, v in spent.items() if k.endswith("/gpuplane")) / total, 3)
        if total > 0
        else None,
    }


def ceiling(fleet: Fleet, count: int) -> float:
    """Workload copies created per second on one worker from THREADS client threads, nothing else."""
    api = fleet.small.api
    ns = "mk-ceiling"
    api.create(k8s.NAMESPACES, {"metadata": {"name": ns}})
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "spec": {
            "queueName": "none",
            "active": False,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                }
            ],
        },
    }

    def create(i: int) -> None:
        api.create(k8s.WORKLOADS, {**body, "metadata": {"name": f"c-{i}", "namespace": ns}}, ns)

    started = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(create, range(count)))
    seconds = time.perf_counter() - started
    api.delete(k8s.NAMESPACES, ns)
    return count / seconds


def dispatch_pass(fleet: Fleet, jobs: int, prefix: str, console: Console) -> dict[str, Any]:
    """Create ``jobs`` one-GPU jobs on the manager and time their dispatch (module docstring)."""
    names = [f"{prefix}-{i}" for i in range(jobs)]
    clock = Clock(fleet, set(names)).start()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda n: fleet.submit(n, pods=1, gpus=1, seconds=RUN_SECONDS), names))
    created = time.time()
    meter = cpu_meter(fleet)
    log(console, f"{jobs} jobs created on the manager")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("dispatched", total=jobs)
        deadline = time.monotonic() + 1800
        while len(clock.dispatched) < jobs and time.monotonic() < deadline:
            progress.update(task, completed=len(clock.dispatched))
            time.sleep(0.5)
        spent = meter.spent()
        while len(clock.running) < jobs and time.monotonic() < deadline:
            time.sleep(0.5)
    clock.stop()
    last = max(clock.dispatched.values(), default=created)
    seen = [j for j in names if j in clock.running and j in clock.reserved]
    waits = [clock.running[j] - clock.reserved[j] for j in seen]
    rate = len(clock.dispatched) / max(1e-9, last - created)
    return {
        "dispatched": len(clock.dispatched),
        "running": len(clock.running),
        "workloadsPerSecond": round(rate, 1),
        "dispatchToRunningP50Seconds": round(statistics.median(waits), 2) if waits else None,
        "dispatchToRunningP95Seconds": round(statistics.quantiles(waits, n=20)[18], 2)
        if len(waits) > 1
        else None,
        "seconds": round(last - created, 1),
        "cpu": cpu_report(spent, len(clock.dispatched), last - created),
    }


def wait_finished(fleet: Fleet, prefix: str, jobs: int, console: Console) -> None:
    """Until the manager's Workloads of the pass ``prefix`` have all finished (their pods ran
    RUN_SECONDS), so the next pass finds the workers' GPUs free."""
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        done = 0
        for wl in fleet.manager.api.list(k8s.WORKLOADS, NS).get("items") or []:
            owners = [r.get("name", "") for r in wl["metadata"].get("ownerReferences") or []]
            finished = any(
                c.get("type") == "Finished" and c.get("status") == "True"
                for c in (wl.get("status") or {}).get("conditions") or []
            )
            done += finished and any(o.startswith(f"{prefix}-") for o in owners)
        if done >= jobs:
            return
        time.sleep(2.0)
    log(console, f"the {prefix} pass had not finished within 15 minutes")


def run(jobs: int, kubeconfig: str | None, console: Console, *, baseline: bool = True) -> dict[str, Any]:
    per_worker = (jobs + 15) // 16  # nodes of 8 GPUs per worker: the two hold every job
    with (
        control_plane(kubeconfig, console) as manager,
        build_fleet(
            Path(tempfile.mkdtemp(prefix="gpuplane-bench-mk-")),
            manager,
            small_nodes=per_worker,
            big_nodes=per_worker,
        ) as fleet,
    ):
        log(console, f"fleet up: manager and two workers of {per_worker} nodes x 8 GPUs")
        ours = dispatch_pass(fleet, jobs, "job", console)
        theirs = None
        if baseline:
            wait_finished(fleet, "job", jobs, console)
            fleet.stop_manager()
            fleet.start_manager(60.0, "--multikueue-dispatcher", BASELINE)
            log(console, f"manager restarted with --multikueue-dispatcher {BASELINE}")
            theirs = dispatch_pass(fleet, jobs, "base", console)
        raw = ceiling(fleet, jobs)
    rate = ours["workloadsPerSecond"]
    return {
        "jobs": jobs,
        **ours,
        "ceiling": {"workloadsPerSecond": round(raw, 1)},
        "shareOfCeiling": round(rate / raw, 3) if raw else None,
        "baseline": None if theirs is None else {"dispatcher": BASELINE, **theirs},
        "vsBaseline": round(rate / theirs["workloadsPerSecond"], 2)
        if theirs and theirs["workloadsPerSecond"]
        else None,
        "target": TARGET,
        "met": rate >= TARGET,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kubeconfig", help="a real control plane for the manager (else one is started)")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help=f"skip the second pass under Kueue's {BASELINE} dispatcher on the same planes",
    )
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    console = Console(stderr=True)
    result = run(args.jobs, args.kubeconfig, console, baseline=not args.no_baseline)
    if args.output == "json":
        print(json.dumps(result))
    else:
        console.print(
            f"{result['workloadsPerSecond']} workloads/s dispatched ({result['shareOfCeiling']} of the "
            f"ceiling {result['ceiling']['workloadsPerSecond']}/s); dispatch to running p50 "
            f"{result['dispatchToRunningP50Seconds']} s; target >= {TARGET}: "
            + ("met" if result["met"] else "not met")
            + (
                f"; {BASELINE} on the same planes: {result['baseline']['workloadsPerSecond']}/s"
                if result["baseline"]
                else ""
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
