"""Benchmark runner: lists the benchmarks and runs them by name.

Usage::

    python3 bench/run.py                         # run every benchmark
    python3 bench/run.py kueue-scale             # run one (or several) by name
    python3 bench/run.py --list                  # list names and descriptions
    python3 bench/run.py kueue-scale -- --keep   # arguments after -- go to each selected benchmark
    python3 bench/run.py kueue-scale --keep      # so do those from the first option run.py does not know

Each benchmark is a script in this folder, run as its own process with this interpreter,
so one benchmark's memory and child processes never show up in another's numbers.
Benchmarks report ratios against a baseline measured in the same run, next to absolute
times. The runner's exit status is the first non-zero status of a benchmark, or 0.

Adding a benchmark means adding an entry to ``BENCHMARKS``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parent


@dataclass(frozen=True, slots=True)
class Benchmark:
    """A benchmark script in this folder and what it measures."""

    script: str
    description: str


# Name -> benchmark, in the order `run.py` with no names runs them.
BENCHMARKS: dict[str, Benchmark] = {
    "kueue-scale": Benchmark(
        script="kueue_scale.py",
        description="gpuplane schedule on 50,000 pending Workloads in 1,000 ClusterQueues (10 cohorts)",
    ),
    "placement-scale": Benchmark(
        script="placement_scale.py",
        description="placement-aware admission on 10,000 nodes x 8 GPUs: 1,000 rack gangs + 20,000 pods",
    ),
    "dra-scale": Benchmark(
        script="dra_scale.py",
        description="admission with placement when a DRA driver publishes the GPUs (1,000 nodes x 8, one "
        "in ten MIG-partitioned; 5,000 one-GPU claims + 200 four-pod NVLink gangs) against the same load as "
        "extended resources: pods/s, target >= 50 %",
    ),
    "controller-vs-kube-scheduler": Benchmark(
        script="controller_vs_kube_scheduler.py",
        description="gpuplane (Jobs and plain pods) vs kube-scheduler (default and tuned) beside the API "
        "server's raw-binding and Job-controller ceilings, phases and CPU per process, on one real API "
        "server: 1,000 nodes, 5,000 pods + 200 gangs (--small: 100 nodes, 400 pods + 20 gangs)",
    ),
    "api-write-costs": Benchmark(
        script="api_write_costs.py",
        description="what each kind of write on gpuplane's path costs a real API server: calls/s and CPU "
        "ms per call of kube-apiserver and etcd (Workload, its patch and status, Event, Job and its "
        "release, pod, its gate lifted, Binding), and the workloads per second each path's writes allow",
    ),
    "chaos": Benchmark(
        script="chaos.py",
        description="crash safety: 1,000 jobs to completion while replicas are killed 50 times and the API "
        "server restarts twice, on a real control plane",
    ),
    "multicluster": Benchmark(
        script="multicluster.py",
        description="MultiKueue: a manager and two workers on loopback, 1,000 queued jobs: workloads "
        "dispatched/s and dispatch-to-running p50, against Kueue's AllAtOnce on the same planes and what "
        "the machine's CPU allows",
    ),
    "deep-queue": Benchmark(
        script="deep_queue.py",
        description="5,000 queued jobs of one ClusterQueue admitted on a real API server: admissions/s",
    ),
    "controller-e2e": Benchmark(
        script="controller_e2e.py",
        description="controller end to end via the API-server double: 1,000 nodes, 5,000 jobs + 200 gangs",
    ),
    "sim-scale": Benchmark(
        script="sim_scale.py",
        description="simulator: 30 virtual days, 1,000 GPUs, ~100,000 workloads (no-op, stock, core)",
    ),
    "eta-accuracy": Benchmark(
        script="eta_accuracy.py",
        description="ETA of gpuplane why against real starts on the core (32 GPUs, 95 % load): p50/p90 error",
    ),
    "eta-live": Benchmark(
        script="eta_live.py",
        description="the live ETA after 50 finished runs of a job name against the class fallback, through "
        "the real controller on a real control plane",
    ),
    "sim-saturated": Benchmark(
        script="sim_saturated.py",
        description="simulator under backlog: the built-in week at offered load 1.5 (no-op, stock, core)",
    ),
    "peer-capacity": Benchmark(
        script="peer_capacity.py",
        description="gpuplane simulate --sweep auto against kueue, kueue-timeslicing and volcano on the "
        "built-in week: each capacity, the strongest peer, the command's wall time (target 15 min)",
    ),
    "eta-floor": Benchmark(
        script="eta_floor.py",
        description="the ETA error no predictor avoids: the load-1.5 week forked into futures at predictions",
    ),
    "sim-vs-real": Benchmark(
        script="sim_vs_real.py",
        description="the built-in scenario's arrivals through a real control plane, controller, webhook and "
        "fake kubelet, beside the simulator on the same jobs: utilization, waits, finished, quota leaks",
    ),
    "gang-fragmentation": Benchmark(
        script="gang_fragmentation.py",
        description="gang placement with churn, 256 nodes x 8 GPUs: allocation, fragmentation by profile",
    ),
    "fgd-placement": Benchmark(
        script="fgd_placement.py",
        description="FGD (ATC'23) openb placement protocol: one run per policy (--sweep: fidelity, 17 lists)",
    ),
    "web-console": Benchmark(
        script="web_console.py",
        description="web console pages with 5,000 pending workloads and 1,000 nodes in headless Chromium",
    ),
}


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv``: benchmark names and runner options first; from ``--``, or from the first option
    the runner does not know (``run.py NAME --nodes 100``), the arguments go to the benchmark."""
    own, passed = list(argv), []
    for i, arg in enumerate(own):
        if arg == "--":
            own, passed = own[:i], own[i + 1 :]
            break
        if arg.startswith("-") and arg not in ("--list", "-h", "--help"):
            own, passed = own[:i], own[i:]
            break
    parser = argparse.ArgumentParser(
        prog="run.py",
        description="Run gpuplane's benchmarks (all of them, or those named).",
        epilog="Arguments after -- are passed to every selected benchmark.",
    )
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"benchmark to run: {', '.join(BENCHMARKS)}")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(own)
    unknown = [name for name in args.names if name not in BENCHMARKS]
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return args, passed


def list_benchmarks(console: Console) -> None:
    table = Table(title="benchmarks")
    table.add_column("name")
    table.add_column("script")
    table.add_column("measures")
    for name, bench in BENCHMARKS.items():
        table.add_row(name, f"bench/{bench.script}", bench.description)
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    args, passed = parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    if args.list:
        list_benchmarks(console)
        return 0
    status = 0
    headings = Console(stderr=True)  # stdout is the benchmarks' own (e.g. their --output json)
    for name in args.names or list(BENCHMARKS):
        bench = BENCHMARKS[name]
        headings.rule(f"{name}: {bench.description}")
        code = subprocess.call([sys.executable, str(BENCH_DIR / bench.script), *passed])
        if code != 0:
            headings.print(f"[red]{name} exited with status {code}[/red]")
            status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
