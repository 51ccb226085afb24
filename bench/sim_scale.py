"""Simulator at scale: 30 virtual days of a 1,000-GPU cluster with about 100,000 workloads.

The workload classes are the built-in scenario's; its pools are scaled to 1,000 GPUs and its
offered load is set so that about ``--workloads`` arrive over the run (a performance benchmark
sizes its load by count, not by a published figure). The same workloads run under three models,
one after the other, each timed on its own in a fresh process (``--same-process`` runs them in
this one: a model then runs on the heap the one before it left, which made gpuplane's 8-day run
about 10 % slower after stock's than alone):

* **baseline**: the event loop with a no-op scheduler (every workload starts the moment it
  arrives, on unlimited GPUs): the cost of events, work accounting and metrics alone;
* **stock**: the stock Kubernetes model;
* **gpuplane**: the real scheduling core.

Reported: wall and CPU seconds per model (target for gpuplane <= 60 s), events per second, and the ratio
of each to the baseline measured in the same run.

Usage::

    python3 bench/sim_scale.py [--days 30] [--gpus 1000] [--workloads 100000 | --load 1.2] [--out DIR]
                               [--same-process]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuplane.insight.eta import Capacity
from gpuplane.sim.engine import HOLD, START, Change, Engine
from gpuplane.sim.experiment import build_model, scenario_input
from gpuplane.sim.metrics import configuration_document
from gpuplane.sim.scenario import Param, Scenario, builtin_scenario
from gpuplane.sim.workloads import Job, class_rate

TARGET_SECONDS = 60.0
TARGET_SATURATED_SECONDS = 120.0  # with --load (the target at load 1.2)


class NoOpModel:
    """Starts everything at once on unlimited GPUs: measures the engine without a scheduler."""

    name = "baseline"
    reaper = False

    def __init__(self) -> None:
        self.changes: list[Change] = []
        self.waiting: list[Job] = []

    def submit(self, job: Job, now: float) -> None:
        del now
        self.waiting.append(job)

    def release(self, job: Job, now: float) -> None:
        del now
        self.changes.append(Change(HOLD, job.id, 0.0))

    def node_down(self, node: str, now: float) -> None:
        del node, now

    def node_up(self, node: str, now: float) -> None:
        del node, now

    def schedule(self, now: float, checkpoints: Callable[[], Iterable[tuple[Job, float]]]) -> int:
        del now, checkpoints
        for job in self.waiting:
            self.changes.append(Change(HOLD, job.id, job.request.share * job.pods))
            self.changes.append(Change(START, job.id, text=job.pools[0]))
        self.waiting = []
        return 1

    def take_changes(self) -> list[Change]:
        out, self.changes = self.changes, []
        return out

    def allocation(self, job: Job) -> tuple[float, float]:
        return job.request.share, job.activity

    def priority(self, job: Job) -> int:
        del job
        return 0

    def pools_of(self, job: Job) -> tuple[str, ...]:
        return job.pools

    def eta_capacity(self) -> Capacity | None:
        return None

    def whole_nodes(self, job: Job) -> None:
        del job

    def quota_blocked(self) -> float:
        return 0.0

    def node_gpus(self, node: str) -> int:
        del node
        return 0

    def wake_ups(self) -> list[float]:
        return []


def scaled_scenario(days: float, gpus: int, workloads: int, load: float | None = None) -> Scenario:
    """The built-in scenario's classes on ``gpus`` GPUs, loaded to about ``workloads`` arrivals
    (or at offered load ``load`` when given)."""
    base = builtin_scenario()
    factor = gpus / base.gpus
    pools = tuple(replace(p, nodes=max(1, round(p.nodes * factor))) for p in base.pools)
    scenario = replace(base, pools=pools, days=days, warmup=86400.0)
    if load is not None:
        return scenario.with_load(load)
    span = scenario.horizon + scenario.warmup
    expected = sum(class_rate(scenario, c) for c in scenario.classes) * span
    assert scenario.offered_load is not None
    load = scenario.offered_load.mean * workloads / expected
    return replace(
        scenario, offered_load=Param.constant(load, "assumed: sized to the benchmark's workload count")
    )


LABELS = ("baseline", "stock", "gpuplane")


def run_model(label: str, scenario: Scenario, *, outcome: bool = False) -> dict[str, Any]:
    """Draw the scenario's workloads and run them under model ``label``, timing the run alone.
    With ``outcome``, the p95 wait, the ETA errors, the ETA range's coverage and the runtime error
    (over all and by basis) of the run come with the timings."""
    sim = scenario_input(scenario)
    model = NoOpModel() if label == "baseline" else build_model(label, sim)
    t0, cpu0 = time.perf_counter(), time.process_time()
    ledger = Engine(model, sim.workloads, sim.cluster.gpus, sim.reaper_idle).run()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    row: dict[str, Any] = {
        "wallSeconds": round(wall, 2),
        # CPU seconds of the process: what to compare on a machine that others share.
        "cpuSeconds": round(cpu, 2),
        "events": ledger.events,
        "eventsPerSecond": round(ledger.events / wall, 1) if wall else 0.0,
        "cycles": ledger.cycles,
    }
    if outcome:
        doc = configuration_document(ledger)
        keys = (
            "waitP95Seconds",
            "etaErrorP50",
            "etaRelativeErrorP50",
            "etaRangeCoverage",
            "runtimeRelativeErrorP50",
        )
        row |= {key: doc[key] for key in keys} | {"byBasis": doc["byBasis"]}
    return row


def run_alone(label: str, scenario: Scenario, *, outcome: bool = False, fresh: bool = True) -> dict[str, Any]:
    """:func:`run_model` in a fresh process of its own (the scenario's draw is seeded, so every
    process runs the same workloads); with ``fresh=False``, in this process."""
    if not fresh:
        return run_model(label, scenario, outcome=outcome)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(run_model, label, scenario, outcome=outcome).result()


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every simulator benchmark takes: where to write its results, and whether the
    models run in this process (one after the other) or each alone in a fresh one."""
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--same-process", action="store_true", help="run the models in this process, one after the other"
    )


def run_each(
    scenario: Scenario, console: Console, *, outcome: bool = False, fresh: bool = True
) -> dict[str, dict[str, Any]]:
    """:func:`run_alone` for each model of :data:`LABELS`, by label."""
    results: dict[str, dict[str, Any]] = {}
    for label in LABELS:
        console.print(f"{label}: running ...")
        results[label] = run_alone(label, scenario, outcome=outcome, fresh=fresh)
    return results


def timing_table(
    title: str,
    results: dict[str, dict[str, Any]],
    extra: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (),
) -> Table:
    """One row a model: wall and CPU time, events, cycles and the ratio to the baseline's wall time
    (stored in each row as ``ratioToBaseline``), then the ``extra`` columns (a header and how to
    show a row)."""
    base = results["baseline"]["wallSeconds"]
    table = Table(title=title)
    table.add_column("model")
    columns = ("wall s", "CPU s", "events", "events/s", "scheduling passes/cycles", "x baseline wall")
    for key in (*columns, *(header for header, _ in extra)):
        table.add_column(key, justify="right")
    for label, row in results.items():
        ratio = row["wallSeconds"] / base if base else 0.0
        row["ratioToBaseline"] = round(ratio, 2)
        table.add_row(
            label,
            f"{row['wallSeconds']:.1f}",
            f"{row['cpuSeconds']:.1f}",
            f"{row['events']:,}",
            f"{row['eventsPerSecond']:,.0f}",
            f"{row['cycles']:,}",
            f"{ratio:.1f}",
            *(show(row) for _, show in extra),
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--gpus", type=int, default=1000)
    parser.add_argument("--workloads", type=int, default=100_000)
    parser.add_argument("--load", type=float, help="offered load instead of sizing by --workloads (e.g. 1.2)")
    add_run_options(parser)
    args = parser.parse_args(argv)
    console = Console()
    scenario = scaled_scenario(args.days, args.gpus, args.workloads, args.load)
    started = time.perf_counter()
    sim = scenario_input(scenario)
    generate_seconds = time.perf_counter() - started
    assert scenario.offered_load is not None
    gpus, jobs = sim.cluster.gpus, len(sim.workloads.jobs)
    del sim  # each run draws the same workloads again, in its own process unless told otherwise
    console.print(
        f"sim-scale: {gpus:,} GPUs, {args.days:g} days (+1 day warm-up), {jobs:,} workloads, "
        f"offered load {scenario.offered_load.mean:.2f}; drawn in {generate_seconds:.1f} s; "
        + ("the models one after the other in this process" if args.same_process else "each model alone")
    )
    results = run_each(scenario, console, fresh=not args.same_process)
    table = timing_table(f"sim-scale: {jobs:,} workloads, {gpus:,} GPUs", results)
    console.print(table)
    gp = results["gpuplane"]["wallSeconds"]
    target = TARGET_SECONDS if args.load is None else TARGET_SATURATED_SECONDS
    verdict = "PASS" if gp <= target else "FAIL"
    console.print(f"gpuplane: {gp:.1f} s for {args.days:g} virtual days; target <= {target:.0f} s: {verdict}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim-scale.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
