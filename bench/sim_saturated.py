"""Simulator under a long backlog: the built-in week at offered load 1.5, both configurations.

The built-in scenario (448 GPUs, one measured week after two days of warm-up) with its offered
load set to 1.5 of installed GPUs, so queues grow: the regime where a pass over the queue must
not cost more as the backlog grows. The same workloads run under three models, one after the
other, each timed alone in a fresh process (``--same-process``: in this one, on the heap the model
before left):

* **baseline**: the event loop with a no-op scheduler (every workload starts at once on
  unlimited GPUs), the cost of events and accounting alone (``sim_scale.NoOpModel``);
* **stock** and **gpuplane** (the real core).

Reported: wall and CPU seconds, events per second, and the ratio of each to the baseline of the same run
(the machine may be shared, so the ratio is the number to compare); then, for stock and gpuplane,
the ETA's median relative error and its range's coverage (the share of real starts inside the
10th to 90th percentile given) over waits past 5 minutes, and the median relative error of the
runtime predicted at a job's start, over all and by basis (name history, team, class, declared).
Then both configurations side by side, one worker process each (what ``gpuplane simulate --load
1.5`` does with two or more CPUs; ``--jobs``), timed as a whole. Target: both configurations
<= 60 s; the verdict is on the side-by-side run, and the sum of the two timed alone is printed next
to it.

Usage::

    python3 bench/sim_saturated.py [--load 1.5] [--days 7] [--out DIR] [--same-process]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_scale import (  # a sibling script, found through the path above
    add_run_options,
    run_each,
    timing_table,
)

from gpuplane.sim.experiment import run_experiment, scenario_input
from gpuplane.sim.parallel import default_jobs
from gpuplane.sim.scenario import builtin_scenario

TARGET_SECONDS = 60.0


def _share(value: float | None) -> str:
    return "" if value is None else f"{value:.0%}"


def basis_table(results: dict[str, dict[str, Any]]) -> Table:
    """The ETA's median relative error and its range's coverage over waits past 5 minutes, and the
    median relative error of the runtime predicted at a job's start, over all and by basis (what
    the runtime was predicted from: name history, team, class, declared), per configuration."""
    table = Table(title="ETA and runtime by basis (waits > 5 min; coverage: real start in p10-p90)")
    for column in ("model", "basis", "ETA err p50", "coverage", "waited", "runtime err p50", "runs"):
        table.add_column(column, justify="left" if column in ("model", "basis") else "right")
    for label in ("stock", "gpuplane"):
        row = results[label]
        table.add_row(
            label,
            "all",
            _share(row["etaRelativeErrorP50"]),
            _share(row["etaRangeCoverage"]),
            "",
            _share(row["runtimeRelativeErrorP50"]),
            "",
        )
        for basis, doc in row["byBasis"].items():
            table.add_row(
                "",
                basis,
                _share(doc["etaRelativeErrorP50"]),
                _share(doc["etaRangeCoverage"]),
                f"{doc['etaWaitedCount']:,}",
                _share(doc["runtimeRelativeErrorP50"]),
                f"{doc['runtimeCount']:,}",
            )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=1.5)
    parser.add_argument("--days", type=float, default=None, help="measured days (default: the scenario's)")
    parser.add_argument("--jobs", type=int, default=default_jobs(), help="processes side by side")
    add_run_options(parser)
    args = parser.parse_args(argv)
    console = Console()
    scenario = builtin_scenario().with_load(args.load)
    if args.days is not None:
        scenario = scenario.with_days(args.days)
    sim = scenario_input(scenario)
    console.print(
        f"sim-saturated: {sim.cluster.gpus:,} GPUs, {scenario.days:g} days (+ warm-up), "
        f"{len(sim.workloads.jobs):,} workloads, offered load {args.load:g}"
    )
    results = run_each(scenario, console, outcome=True, fresh=not args.same_process)
    table = timing_table(
        f"sim-saturated: load {args.load:g}, {len(sim.workloads.jobs):,} workloads",
        results,
        (
            ("p95 wait s", lambda row: f"{row['waitP95Seconds'] or 0:,.0f}"),
            (
                "ETA err p50",
                lambda row: "" if row["etaRelativeErrorP50"] is None else f"{row['etaRelativeErrorP50']:.0%}",
            ),
        ),
    )
    console.print(table)
    console.print(basis_table(results))
    both = results["stock"]["wallSeconds"] + results["gpuplane"]["wallSeconds"]
    console.print(f"stock + gpuplane, each timed alone: {both:.1f} s")
    console.print(f"stock and gpuplane side by side ({args.jobs} processes): running ...")
    started = time.perf_counter()
    side = run_experiment(sim, ("stock", "gpuplane"), jobs=args.jobs)
    wall = time.perf_counter() - started
    same = all(
        side.document["configurations"][label]["waitP95Seconds"] == results[label]["waitP95Seconds"]
        for label in ("stock", "gpuplane")
    )
    verdict = "PASS" if wall <= TARGET_SECONDS else "FAIL"
    console.print(
        f"stock and gpuplane side by side: {wall:.1f} s (same results: {same}); "
        f"target <= {TARGET_SECONDS:.0f} s: {verdict}"
    )
    summary = {"sumAloneSeconds": round(both, 2), "sideBySideSeconds": round(wall, 2), "jobs": args.jobs}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "sim-saturated.json").write_text(json.dumps(results | {"both": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
