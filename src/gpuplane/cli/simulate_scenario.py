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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuplane.sim.auto_sweep import run_auto_sweep
from gpuplane.sim.experiment import (
    CONFIGURATIONS,
    DEFAULT_CONFIGURATIONS,
    ExperimentResult,
    ScenarioDraw,
    SimInput,
    run_experiment,
    scenario_input,
)
from gpuplane.sim.gpus_match import at_demand
from gpuplane.sim.headline import duration, headline, sweep_headline
from gpuplane.sim.parallel import default_jobs
from gpuplane.sim.replay import replay_input
from gpuplane.sim.scenario import Scenario, ScenarioError, builtin_scenario, load_scenario
from gpuplane.sim.sweep import DEFAULT_WAIT_TARGET, SweepResult, run_sweep, sweep_points
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
    load: float | None = None
    sweep: str | None = None
    wait_target: str | None = None
    jobs: int | None = None  # processes at once; default: one per CPU


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


def _base_scenario(options: ScenarioOptions, seed: int | None) -> Scenario:
    if options.days is not None and options.days <= 0:
        raise _BadInputError(f"--days must be positive, got {options.days:g}")
    if options.scenario is not None and not options.scenario.is_file():
        raise _BadInputError(f"--scenario: {options.scenario}: no such file")
    scenario: Scenario = load_scenario(options.scenario) if options.scenario else builtin_scenario()
    if seed is not None:
        scenario = scenario.with_seed(seed)
    return scenario


def build_input(options: ScenarioOptions, seed: int | None) -> SimInput:
    scenario = _base_scenario(options, seed)
    if options.trace is not None:
        if not options.trace.is_file():
            raise _BadInputError(f"--trace: {options.trace}: no such file")
        return replay_input(options.trace, options.trace_format, scenario, options.days)
    if options.trace_format is not None:
        raise _BadInputError("--trace-format needs --trace")
    if options.days is not None:
        scenario = scenario.with_days(options.days)
    if options.load is not None:
        scenario = scenario.with_load(options.load)
    return scenario_input(scenario)


def sweep_loads(text: str) -> list[float]:
    """``0.6,0.8,1.0`` -> the loads, each a positive number."""
    loads = []
    for item in text.split(","):
        try:
            value = float(item)
        except ValueError:
            message = f"--sweep: {item.strip()!r} is not a number (example: 0.6,0.8,1.0)"
            raise _BadInputError(message) from None
        if not value > 0 or value == float("inf"):
            raise _BadInputError(f"--sweep: loads must be positive, got {item.strip()}")
        loads.append(value)
    return loads


UNITS = {"s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def wait_target_seconds(text: str | None) -> float:
    """``90``, ``90s``, ``30min``, ``1h``, ``2d`` -> seconds (default one hour)."""
    if text is None:
        return DEFAULT_WAIT_TARGET
    stripped = text.strip()
    number, unit = stripped, "s"
    for suffix in sorted(UNITS, key=len, reverse=True):
        if stripped.endswith(suffix):
            number, unit = stripped[: -len(suffix)], suffix
            break
    try:
        value = float(number) * UNITS[unit]
    except ValueError:
        message = f"--wait-target: {text!r} is not a duration (examples: 3600, 30min, 1h)"
        raise _BadInputError(message) from None
    if not value > 0 or value == float("inf"):
        raise _BadInputError(f"--wait-target must be positive, got {text}")
    return value


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


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


# What only some configurations count (the peers' own figures): a row appears when any
# configuration has its key (a dotted path into the configuration's JSON), "-" for the others.
PEER_ROWS: tuple[tuple[str, str], ...] = (
    ("admitted, not all pods bound (Kueue)", "admittedUnplaceableWorkloads"),
    ("... of which gangs", "admittedUnplaceableGangs"),
    ("pods bound short of GPU memory (time-slicing)", "timeSlicing.memoryOvercommits"),
    ("jobs reclaimed (Volcano)", "reclaimedJobs"),
)


def _at(config: dict[str, Any], path: str) -> Any:
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


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
        if key == "wallSeconds":  # the peers' own rows go before the wall time, the last row
            for peer_label, path in PEER_ROWS:
                values = [_at(c, path) for c in configs.values()]
                if any(v is not None for v in values):
                    table.add_row(peer_label, *(_num(v) for v in values))
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


class _Bars:
    """One progress bar per label, created on first use (a sweep labels runs by load)."""

    def __init__(self, bar: Progress) -> None:
        self.bar = bar
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, label: str, fraction: float) -> None:
        task = self.tasks.get(label)
        if task is None:
            task = self.tasks[label] = self.bar.add_task(label, total=1.0)
        self.bar.update(task, completed=fraction)


def _progress(err: Console, show: bool) -> Progress:
    return Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f} %"),
        TimeElapsedColumn(),
        console=err,
        disable=not show,
        transient=True,
    )


def jobs_of(options: ScenarioOptions) -> int:
    if options.jobs is None:
        return default_jobs()
    if options.jobs < 1:
        raise _BadInputError(f"--jobs must be at least 1, got {options.jobs}")
    return options.jobs


def _run(
    sim: SimInput, names: tuple[str, ...], jobs: int, show_progress: bool, err: Console
) -> ExperimentResult:
    with _progress(err, show_progress) as bar:
        return run_experiment(sim, names, progress=_Bars(bar) if show_progress else None, jobs=jobs)


def _run_sweep(
    options: ScenarioOptions, seed: int | None, names: tuple[str, ...], show_progress: bool, err: Console
) -> SweepResult:
    if options.trace is not None:
        raise _BadInputError("--sweep needs a scenario: a trace replays its own arrival times")
    if options.load is not None:
        raise _BadInputError("--sweep and --load exclude each other")
    assert options.sweep is not None
    auto = options.sweep.strip().lower() == "auto"
    loads = [] if auto else sweep_loads(options.sweep)
    target = wait_target_seconds(options.wait_target)
    build_input(options, seed)  # checks the scenario and options before anything runs

    def sim_at(load: float) -> SimInput:
        return build_input(replace(options, load=load), seed)

    # The auto sweep's inputs are drawn by the worker that runs them (ScenarioDraw), as
    # build_input would draw them.
    base = _base_scenario(options, seed)
    if options.days is not None:
        base = base.with_days(options.days)

    def draw_at(load: float) -> ScenarioDraw:
        return ScenarioDraw(base.with_load(load))

    def grown_at(load: float, multiplier: float) -> ScenarioDraw:
        return ScenarioDraw(at_demand(base, load, multiplier))

    with _progress(err, show_progress) as bar:
        callback = _Bars(bar) if show_progress else None
        if auto:
            return run_auto_sweep(
                draw_at, names, wait_target=target, progress=callback, jobs=jobs_of(options), grown=grown_at
            )
        return run_sweep(sim_at, loads, names, wait_target=target, progress=callback, jobs=jobs_of(options))


def sweep_table(document: dict[str, Any]) -> Table:
    title = (
        f"gpuplane simulate --sweep: {document['scenario']}, {document['gpus']} GPUs, "
        f"{document['days']:g} days; p95 wait / busy GPU-hours per installed GPU"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("offered load")
    names = list(document["capacityAtWaitTarget"])
    for name in names:
        table.add_column(name, justify="right")
    for load, configs in sweep_points(document):
        cells = ["-" if c is None else _run_cell(c) for c in (configs[n] for n in names)]
        table.add_row(f"{load:g}", *cells)
    cells = []
    for name in names:
        value = document["capacityAtWaitTarget"][name]
        bound = document["capacityBound"][name]
        cells.append("below sweep" if value is None else f"{'≥ ' if bound == 'atLeast' else ''}{value:.2f}")
    table.add_row(f"capacity at p95 ≤ {duration(document['waitTargetSeconds'])}", *cells)
    matches = document.get("gpusToMatch", {})
    auto = "autoSweep" in document
    cells = []
    for name in names:
        match = matches.get(name)
        gpus = None if match is None else match.get("gpus" if auto else "stockGpus")
        if match is None or gpus is None:
            cells.append("-")
        else:
            exact = "" if auto else "~"
            cells.append(f"{('> ' if auto else '≥ ') if match['bound'] == 'atLeast' else exact}{gpus:,}")
    label = "GPUs to match gpuplane (simulated)" if auto else "stock GPUs to match (scaled)"
    table.add_row(label, *cells)
    return table


def _run_cell(run: dict[str, Any]) -> str:
    """One sweep run: its p95 wait (``≥``: a lower bound, the run was cut) and busy share."""
    bound = "≥ " if run.get("cut") else ""
    return f"{bound}{duration(run['waitP95Seconds'])} / {_pct(run['gpuBusyOfCapacity'])}"


def run_scenario(options: ScenarioOptions, *, seed: int | None, output: str) -> int:
    """Run the scenario simulator; returns the exit status."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        names = configurations(options.compare)
        jobs = jobs_of(options)
        show_progress = output != "json" and sys.stderr.isatty()
        if options.sweep is not None:
            swept = _run_sweep(options, seed, names, show_progress, err)
            swept.document["headline"] = sweep_headline(swept.document)
            if options.report is not None:
                from gpuplane.sim.report import write_sweep_report  # noqa: PLC0415 - matplotlib only for --report

                write_sweep_report(swept, options.report)
            return _print_sweep(swept.document, options, output)
        if options.wait_target is not None:
            raise _BadInputError("--wait-target needs --sweep")
        if options.load is not None and not options.load > 0:
            raise _BadInputError(f"--load must be positive, got {options.load:g}")
        if options.load is not None and options.trace is not None:
            raise _BadInputError("--load needs a scenario: a trace replays its own arrival times")
        sim = build_input(options, seed)
        result = _run(sim, names, jobs, show_progress, err)
        result.document["headline"] = headline(result.document)
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
        console = _console()
        if result.document["headline"]:
            console.print(result.document["headline"], markup=False)
        console.print(summary_table(result.document))
        console.print(class_table(result.document))
        if options.report is not None:
            console.print(f"report: {options.report / 'index.html'}")
    return 0


def _console() -> Console:
    # Piped output is not cut to 80 columns: many configurations side by side need the room.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def _print_sweep(document: dict[str, Any], options: ScenarioOptions, output: str) -> int:
    if output == "json":
        sys.stdout.write(json.dumps(document) + "\n")
        return 0
    console = _console()
    if document["headline"]:
        console.print(document["headline"], markup=False)
    console.print(sweep_table(document))
    if options.report is not None:
        console.print(f"report: {options.report / 'index.html'}")
    return 0
