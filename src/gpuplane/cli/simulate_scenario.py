"""`gpuplane simulate` without ``--protocol``: the scenario simulator.

Thin edge: read the scenario or trace, run the configurations (:mod:`gpuplane.sim.experiment`),
print a side-by-side table or JSON, write the HTML report. Bad input is one line on stderr and
exit status 2.

With no option at all it runs the built-in scenario under ``stock`` and ``gpuplane``;
``--compare`` adds more configurations (``stock-packed``, ``gpuplane-no-reaper``, ...). ``--seed``
(the command's default is 42) seeds every draw and replaces the scenario file's own ``seed``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuplane.sim.experiment import (
    CONFIGURATIONS,
    DEFAULT_CONFIGURATIONS,
    ExperimentResult,
    SimInput,
    run_experiment,
    scenario_input,
)
from gpuplane.sim.replay import replay_input
from gpuplane.sim.scenario import Scenario, ScenarioError, builtin_scenario, load_scenario
from gpuplane.sim.traces import TraceError


@dataclass(frozen=True, slots=True)
class ScenarioOptions:
    """The options ``gpuplane simulate`` passes to the scenario simulator."""

    scenario: Path | None = None
    trace: Path | None = None
    trace_format: str | None = None
    compare: tuple[str, ...] = ()
    days: float | None = None
    report: Path | None = None


class _BadInputError(Exception):
    """One line for stderr, exit status 2."""


def configurations(compare: Sequence[str]) -> tuple[str, ...]:
    """stock and gpuplane, then the ``--compare`` names (comma-separated lists allowed)."""
    names = list(DEFAULT_CONFIGURATIONS)
    for item in compare:
        names += [n.strip() for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        raise _BadInputError(
            f"--compare: unknown configuration {unknown[0]!r} (known: {', '.join(CONFIGURATIONS)})"
        )
    return tuple(dict.fromkeys(names))


def build_input(options: ScenarioOptions, seed: int | None) -> SimInput:
    if options.days is not None and options.days <= 0:
        raise _BadInputError(f"--days must be positive, got {options.days:g}")
    if options.scenario is not None and not options.scenario.is_file():
        raise _BadInputError(f"--scenario: {options.scenario}: no such file")
    scenario: Scenario = load_scenario(options.scenario) if options.scenario else builtin_scenario()
    if seed is not None:
        scenario = scenario.with_seed(seed)
    if options.trace is not None:
        if not options.trace.is_file():
            raise _BadInputError(f"--trace: {options.trace}: no such file")
        return replay_input(options.trace, options.trace_format, scenario, options.days)
    if options.trace_format is not None:
        raise _BadInputError("--trace-format needs --trace")
    if options.days is not None:
        scenario = scenario.with_days(options.days)
    return scenario_input(scenario)


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


ROWS: tuple[tuple[str, str, Any], ...] = (
    ("GPU allocated share", "gpuAllocatedShare", _pct),
    ("GPU busy share (busy / allocated)", "gpuBusyShare", _pct),
    ("busy GPU-hours / installed", "gpuBusyOfCapacity", _pct),
    ("allocated GPU-hours", "allocatedGpuHours", _num),
    ("busy GPU-hours", "busyGpuHours", _num),
    ("queue wait p50", "waitP50Seconds", duration),
    ("queue wait p95", "waitP95Seconds", duration),
    ("queue wait max", "waitMaxSeconds", duration),
    ("job completion time p50", "jctP50Seconds", duration),
    ("GPU-hours held by partly placed gangs", "deadlockedGpuHours", _num),
    ("... of which in circular deadlock", "circularDeadlockGpuHours", _num),
    ("stranded quota GPU-hours", "strandedQuotaGpuHours", _num),
    ("preemptions", "preemptions", _num),
    ("GPU-hours of work lost", "lostGpuHours", _num),
    ("sessions reaped", "sessionsReaped", _num),
    ("ETA error p50", "etaErrorP50", duration),
    ("ETA error p90", "etaErrorP90", duration),
    ("workloads started / submitted", "", None),
    ("wall time", "wallSeconds", lambda v: f"{v:.1f} s"),
)


def summary_table(document: dict[str, Any]) -> Table:
    configs: dict[str, Any] = document["configurations"]
    title = (
        f"gpuplane simulate: {document['scenario']}, {document['gpus']} GPUs, "
        f"{document['days']:g} days, {document['workloads']:,} workloads"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("measure")
    for name in configs:
        table.add_column(name, justify="right")
    for label, key, fmt in ROWS:
        if fmt is None:
            cells = [f"{c['started']:,} / {c['submitted']:,}" for c in configs.values()]
        else:
            cells = [fmt(c.get(key)) for c in configs.values()]
        table.add_row(label, *cells)
    return table


def class_table(document: dict[str, Any]) -> Table:
    configs: dict[str, Any] = document["configurations"]
    table = Table(title="per workload class: busy share / queue wait p95", title_justify="left")
    table.add_column("class")
    for name in configs:
        table.add_column(name, justify="right")
    classes = sorted({k for c in configs.values() for k in c["classes"]})
    for klass in classes:
        cells = []
        for c in configs.values():
            row = c["classes"].get(klass)
            cells.append(
                "-" if row is None else f"{_pct(row['gpuBusyShare'])} / {duration(row['waitP95Seconds'])}"
            )
        table.add_row(klass, *cells)
    return table


def _run(sim: SimInput, names: tuple[str, ...], show_progress: bool, err: Console) -> ExperimentResult:
    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f} %"),
        TimeElapsedColumn(),
        console=err,
        disable=not show_progress,
        transient=True,
    ) as bar:
        tasks: dict[str, TaskID] = {name: bar.add_task(name, total=1.0) for name in names}

        def advance(name: str, fraction: float) -> None:
            bar.update(tasks[name], completed=fraction)

        return run_experiment(sim, names, progress=advance if show_progress else None)


def run_scenario(options: ScenarioOptions, *, seed: int | None, output: str) -> int:
    """Run the scenario simulator; returns the exit status."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        names = configurations(options.compare)
        sim = build_input(options, seed)
        show_progress = output != "json" and sys.stderr.isatty()
        result = _run(sim, names, show_progress, err)
        if options.report is not None:
            from gpuplane.sim.report import write_report  # noqa: PLC0415 - matplotlib loads only for --report

            write_report(result, options.report)
    except (_BadInputError, ScenarioError, TraceError) as problem:
        err.print(f"error: {problem}", markup=False)
        return 2
    except OSError as problem:
        err.print(f"error: {problem}", markup=False)
        return 2
    if output == "json":
        sys.stdout.write(json.dumps(result.document) + "\n")
    else:
        # Piped output is not cut to 80 columns: many configurations side by side need the room.
        console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
        console.print(summary_table(result.document))
        console.print(class_table(result.document))
        if options.report is not None:
            console.print(f"report: {options.report / 'index.html'}")
    return 0
