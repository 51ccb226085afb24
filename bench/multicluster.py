"""MultiKueue dispatch: one manager and two workers on loopback, 1,000 queued jobs.

Three real control planes (``scripts/kube-up.sh``): the manager runs gpuplane's controller with
``--multikueue`` at its defaults (gpuplane's dispatcher, 100 QPS per worker); each worker runs
gpuplane's controller, kube-controller-manager's Job controller and the test's fake kubelet. The jobs
(one GPU each, long-running, ``spec.managedBy: kueue.x-k8s.io/multikueue``) are created on the manager;
the workers' nodes hold them all, so what is measured is dispatch:

- ``workloadsPerSecond``: the jobs divided by the time from the last job created to the last
  Workload admitted on a worker (``status.clusterName`` set on the manager);
- ``dispatchToRunningP50Seconds``: per job, from its quota reserved on the manager to its pod
  Running on the worker, the median.

The ceiling, in the same run: the same number of Workload copies created on one worker's API server
from 16 client threads, nothing else (``ceiling.workloadsPerSecond``), and the share of it reached.
Kueue's figure (kueue #8564): 1.3 workloads/s at 5 QPS per worker, about 100/s at 1,000 QPS.
Target (issue: many clusters): at least 50 workloads/s at our defaults.

Usage::

    python3 bench/run.py multicluster                  # 1,000 jobs
    python3 bench/multicluster.py --jobs 200 --output json
"""

from __future__ import annotations

import argparse
import json
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

from vs_cluster import control_plane, log  # noqa: E402 (after the path set-up)

from gpuplane.k8s import api as k8s  # noqa: E402
from gpuplane.model.fields import lenient_timestamp  # noqa: E402
from multikueue_fleet import NS, Fleet, build_fleet  # noqa: E402

TARGET = 50.0
THREADS = 16


class Clock:
    """First time each job was seen reserved on the manager, admitted on a worker, running there."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.reserved: dict[str, float] = {}
        self.dispatched: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> Clock:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            now = time.time()
            for wl in self.fleet.manager.api.list(k8s.WORKLOADS, NS).get("items") or []:
                job = next((r["name"] for r in wl["metadata"].get("ownerReferences") or []), None)
                if job is None:
                    continue
                for cond in (wl.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "QuotaReserved" and cond.get("status") == "True":
                        at = lenient_timestamp(cond.get("lastTransitionTime")) or now
                        self.reserved.setdefault(job, at)
                if (wl.get("status") or {}).get("clusterName"):
                    self.dispatched.setdefault(job, now)
            for worker in (self.fleet.small, self.fleet.big):
                for pod in worker.api.list(k8s.PODS, NS).get("items") or []:
                    if (pod.get("status") or {}).get("phase") == "Running":
                        job = (pod["metadata"].get("labels") or {}).get("job-name")
                        if job:
                            self.running.setdefault(job, now)


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


def run(jobs: int, kubeconfig: str | None, console: Console) -> dict[str, Any]:
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
        clock = Clock(fleet).start()
        names = [f"job-{i}" for i in range(jobs)]
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda n: fleet.submit(n, pods=1, gpus=1, seconds=3600.0), names))
        created = time.time()
        log(console, f"{jobs} jobs created on the manager")
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("dispatched", total=jobs)
            deadline = time.monotonic() + 1800
            while len(clock.dispatched) < jobs and time.monotonic() < deadline:
                progress.update(task, completed=len(clock.dispatched))
                time.sleep(0.5)
            while len(clock.running) < jobs and time.monotonic() < deadline:
                time.sleep(0.5)
        clock.stop()
        last = max(clock.dispatched.values(), default=created)
        waits = [
            clock.running[j] - clock.reserved[j] for j in names if j in clock.running and j in clock.reserved
        ]
        rate = len(clock.dispatched) / max(1e-9, last - created)
        raw = ceiling(fleet, jobs)
    return {
        "jobs": jobs,
        "dispatched": len(clock.dispatched),
        "running": len(clock.running),
        "workloadsPerSecond": round(rate, 1),
        "dispatchToRunningP50Seconds": round(statistics.median(waits), 2) if waits else None,
        "dispatchToRunningP95Seconds": round(statistics.quantiles(waits, n=20)[18], 2)
        if len(waits) > 1
        else None,
        "seconds": round(last - created, 1),
        "ceiling": {"workloadsPerSecond": round(raw, 1)},
        "shareOfCeiling": round(rate / raw, 3) if raw else None,
        "target": TARGET,
        "met": rate >= TARGET,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kubeconfig", help="a real control plane for the manager (else one is started)")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    console = Console(stderr=True)
    result = run(args.jobs, args.kubeconfig, console)
    if args.output == "json":
        print(json.dumps(result))
    else:
        console.print(
            f"{result['workloadsPerSecond']} workloads/s dispatched ({result['shareOfCeiling']} of the "
            f"ceiling {result['ceiling']['workloadsPerSecond']}/s); dispatch to running p50 "
            f"{result['dispatchToRunningP50Seconds']} s; target >= {TARGET}: "
            + ("met" if result["met"] else "not met")
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
