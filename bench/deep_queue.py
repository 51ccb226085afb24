"""Deep queue: how fast gpuplane admits 5,000 queued jobs of one ClusterQueue on a real API server.

Kueue admits one head per ClusterQueue per scheduling cycle, so a deep queue drains one workload a
cycle; a production report (kueue #14477, about 1,300 nodes) drains one at about 10 admissions per
minute. Here every job of the queue fits at once (one GPU each; the nodes and the quota hold them
all), so what is measured is the admission path alone: the jobs are created queued (suspended, with
the queue-name label) before the controller starts, and the time runs from its start to the last
Workload admitted, as a watch on the Workloads sees it. The Job controller and the bindings run
meanwhile, as they would in a cluster.

Usage::

    python3 bench/run.py deep-queue                    # 5,000 jobs, 625 nodes x 8 GPUs
    python3 bench/deep_queue.py --jobs 1000 --output json [--kubeconfig K] [--profile FILE]

With ``--output json`` it prints ``{"admissionsPerSecond", "seconds", "firstAdmissionSeconds",
"jobs", "ceilingAdmissionsPerSecond", "shareOfCeiling", ...}``: the ceiling is the same API server, in the
same run, taking only the two writes an admission makes (the Workload's create, carrying its
placement, and its status write) from 16 client threads. ``--profile`` writes a cProfile of the
controller's process. The run stops with an error if the controller's process ends before the last
admission. Target (issue: deep queues): at least 100 admissions per second.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_cluster import (  # a sibling module, found through the path above
    PREFIX,
    Watched,
    control_plane,
    controller_process,
    in_parallel,
    log,
    pod_template,
    setup,
    teardown,
)

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.model.labels import SCHEDULER_NAME

TARGET = 100.0  # admissions per second


class AdmittedWorkloads(Watched):
    """Watches one namespace's Workloads and notes when each was first seen admitted."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        super().__init__(kubeconfig, namespace, k8s.WORKLOADS)
        self.first_seen: dict[str, float] = {}

    def note(self) -> int:
        now = time.perf_counter()
        with self.cache.lock:
            for key, wl in self.cache.objects.get("Workload", {}).items():
                if key not in self.first_seen and (wl.get("status") or {}).get("admission"):
                    self.first_seen[key] = now
        return len(self.first_seen)

    def wait_all(self, count: int, timeout: float, console: Console, started: float, process: Any) -> None:
        self.wait_for(
            self.note,
            count,
            timeout=timeout,
            console=console,
            started=started,
            what="admitted",
            process=process,
        )


def write_ceiling(api: KubeApi, namespace: str, keys: list[str]) -> float:
    """Writes per second the API server takes for as many admissions as ``keys``: the two writes
    that admit a Workload the controller's pass made (its create, carrying the placement annotation,
    then its status write), of copies of the first admitted Workload, from the benchmark's client
    threads, nothing else."""
    sample = api.get(k8s.WORKLOADS, keys[0].split("/", 1)[1], namespace)
    meta = sample["metadata"]
    template = {
        "apiVersion": sample["apiVersion"],
        "kind": "Workload",
        "metadata": {k: meta[k] for k in ("labels", "annotations") if meta.get(k)},
        "spec": sample["spec"],
    }
    status = sample.get("status") or {}

    def write(i: int) -> None:
        named = {**template["metadata"], "name": f"ceiling-{i:05d}", "namespace": namespace}
        body = {**template, "metadata": named}
        created = api.create(k8s.WORKLOADS, body, namespace)
        api.replace(k8s.WORKLOADS, {**created, "status": status}, sub="status")

    t = time.perf_counter()
    in_parallel(list(range(len(keys))), write)
    return 2 * len(keys) / (time.perf_counter() - t)


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    nodes = -(-args.jobs // 8)
    with control_plane(args.kubeconfig, console) as kubeconfig:
        api = KubeApi(load_api_client(kubeconfig), timeout=600.0, qps=None)
        t = time.perf_counter()
        setup(api, nodes, args.jobs)
        log(console, f"set up {nodes:,} nodes in {time.perf_counter() - t:.1f}s")
        namespace = f"{PREFIX}-gpuplane"
        try:

            def create(i: int) -> None:
                body = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": f"deep-{i:05d}",
                        "namespace": namespace,
                        "labels": {"kueue.x-k8s.io/queue-name": "queue"},
                    },
                    "spec": {
                        "parallelism": 1,
                        "completions": 1,
                        "suspend": True,
                        # gpuplane's scheduler name, as its webhook sets it
                        "template": {"spec": pod_template(1, SCHEDULER_NAME)},
                    },
                }
                api.create(k8s.JOBS, body, namespace)

            t = time.perf_counter()
            in_parallel(list(range(args.jobs)), create)
            log(console, f"{args.jobs:,} queued jobs created in {time.perf_counter() - t:.1f}s")
            context = mp.get_context("spawn")
            with AdmittedWorkloads(kubeconfig, namespace) as watch:
                stop, results = context.Event(), context.Queue()
                started = time.perf_counter()
                child = context.Process(
                    target=controller_process, args=(kubeconfig, stop, results, args.profile)
                )
                child.start()
                watch.wait_all(args.jobs, args.timeout, console, started, child)
                stop.set()
                measured = results.get(timeout=120)
                child.join(timeout=60)
            ceiling = write_ceiling(api, namespace, sorted(watch.first_seen))
        finally:
            teardown(api, nodes)
            api.api_client.close()
    times = sorted(watch.first_seen.values())
    first, last = times[0] - started, times[-1] - started
    return {
        "jobs": args.jobs,
        "clusterQueues": 1,
        "seconds": round(last, 2),
        "firstAdmissionSeconds": round(first, 2),
        "admissionsPerSecond": round(args.jobs / last, 1),
        "admissionsPerSecondAfterFirst": round((args.jobs - 1) / max(last - first, 1e-9), 1),
        # The same API server, in the same run, doing nothing but the two writes an admission
        # makes (the create with the placement and the status write), from 16 client threads.
        "ceilingAdmissionsPerSecond": round(ceiling / 2, 1),
        "shareOfCeiling": round(args.jobs / last / (ceiling / 2), 2),
        "controllerCpuSeconds": round(measured["cpuSeconds"], 1),
        "apiCalls": measured["apiCalls"],
        "target": TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--kubeconfig", help="a running cluster (default: start the project's own)")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--profile", help="write a cProfile of the controller's process to this file")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    console = Console(stderr=args.output == "json")
    result = run(args, console)
    if args.output == "json":
        print(json.dumps(result))
    else:
        verdict = "PASS" if result["admissionsPerSecond"] >= TARGET else "FAIL"
        console.print(result)
        console.print(
            f"admissions per second: {result['admissionsPerSecond']} (target >= {TARGET:g}): {verdict}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
