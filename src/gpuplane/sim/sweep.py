"""Load sweeps: every configuration at every offered load, and what the cluster can serve.

::

    for each load L (same seed, so the same kinds of work, only more or less of it):
        scenario.with_load(L) -> draw workloads once -> run every configuration
    per configuration: p95 wait(L) and busy GPU-hours per installed GPU(L)
        -> capacity at the wait target: the highest L with p95 wait <= target
    stock's capacity and gpuplane's -> GPUs stock would need to serve gpuplane's capacity

**Capacity at the wait target** walks the sweep points in order of load and stops at the first
whose p95 wait exceeds the target; the capacity is interpolated linearly between that point and
the one before. It is *at least* the highest load when no point exceeds the target, and *below*
the lowest load when the first already does (then no number is given).

**GPUs to match** is estimated by scaling, not simulated: offered load is a fraction of installed
GPUs, so a stock cluster of ``G'`` GPUs at its capacity fraction ``Cs`` serves ``Cs x G'``
GPU-equivalents of demand, and to serve gpuplane's ``Cg x G`` it needs ``G' = G x Cg / Cs``.
This takes stock's capacity *fraction* to be the same on a larger cluster of the same shape; a
larger cluster pools better, so the estimate leans high.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.sim.experiment import (
    ExperimentResult,
    SimInput,
    check_names,
    expected_cost,
    experiment_result,
    run_named,
)
from gpuplane.sim.parallel import ProgressCallback, Task, run_tasks

DEFAULT_WAIT_TARGET = 3600.0  # seconds: one hour, the default

EXACT, AT_LEAST, BELOW = "interpolated", "atLeast", "belowSweep"


@dataclass(frozen=True, slots=True)
class Capacity:
    """The highest offered load at which p95 wait stays within the target."""

    load: float | None  # None when even the lowest load misses the target
    bound: str  # EXACT, AT_LEAST (never exceeded in the sweep) or BELOW (exceeded at the lowest load)


def capacity_at_wait_target(points: Sequence[tuple[float, float | None]], target: float) -> Capacity:
    """``points`` are (offered load, p95 wait in seconds); a missing wait counts as none waited."""
    ordered = sorted((load, 0.0 if wait is None else wait) for load, wait in points)
    if not ordered:
        return Capacity(None, BELOW)
    previous: tuple[float, float] | None = None
    for load, wait in ordered:
        if wait > target:
            if previous is None:
                return Capacity(None, BELOW)
            low_load, low_wait = previous
            share = (target - low_wait) / (wait - low_wait)
            return Capacity(low_load + share * (load - low_load), EXACT)
        previous = (load, wait)
    return Capacity(ordered[-1][0], AT_LEAST)


OVER_SHARE = 0.05  # the share of waits over the target at which the p95 wait crosses it
FLOOR = 0.001  # the least share over the target an aim reads (a log of 0 says nothing)
NEAR = 2.0  # a miss whose share over the target is within this many OVER_SHAREs can aim a search


def aim(  # noqa: PLR0913 - keyword-only: the step, the points taken, the width that needs no run
    met: tuple[float, float | None],
    missed: tuple[float, float | None],
    *,
    step: float,
    taken: Sequence[float],
    close: float,
    recent: Sequence[bool],
) -> list[float] | None:
    """The next point to run between ``met`` and ``missed`` (each ``(x, share of its waits over
    the target)``: a load, or a cluster's node multiplier), aimed where the target is crossed:
    ``[x]``, or ``[]`` when the points aimed at are all taken (nothing more to run until one
    ends), or None: then the caller bisects.

    Between a point that met the target and one that missed it, the share of waits over the target
    (``waitOverTargetShare``) crosses :data:`OVER_SHARE`; taken as exponential in ``x`` there (it
    grows faster than linearly as a queue nears saturation; a share of 0 counts as :data:`FLOOR`),
    it crosses at ``guess``. The points around it are run: ``guess - step/2`` and ``guess + step/2``
    (``step`` at most the width at which a bracket is ``close``, so the two close it if the crossing
    lies between them, in one round where two workers run them side by side); where ``guess`` lies
    within ``step`` of an end, only ``end + step`` (it closes the bracket if it lands on the end's
    other side, as the guess says it will; a spare worker is better used elsewhere than on a hedge
    below it); a bracket within two steps, its middle. The first of those not yet ``taken`` (run or
    running) and inside a gap still wider than ``close`` is the answer.

    No aim (None) where a share is unknown, where the shares disagree with the outcomes, where the
    miss is far past the target (its share over :data:`NEAR` times :data:`OVER_SHARE`: the share
    grows faster still there), or where the last two aimed runs
    (``recent``: met or not, in the order they ended) landed on the same side: then the guess is
    off, and bisecting halves the bracket for sure.
    """
    (x_met, s_met), (x_miss, s_miss) = met, missed
    if s_met is None or s_miss is None or not s_met < s_miss <= NEAR * OVER_SHARE:
        return None
    if len(recent) >= 2 and recent[-1] == recent[-2]:
        return None
    low, high = max(s_met, FLOOR), max(s_miss, FLOOR)
    t = 1.0 if high <= low else min(1.0, max(0.0, math.log(OVER_SHARE / low) / math.log(high / low)))
    guess = x_met + t * (x_miss - x_met)
    lo, hi = sorted((x_met, x_miss))
    if hi - lo <= 2 * step:
        plan = [(lo + hi) / 2]
    elif guess - lo < step:
        plan = [lo + step]
    elif hi - guess < step:
        plan = [hi - step]
    else:
        plan = [guess - step / 2, guess + step / 2]
    marks = sorted({lo, hi, *(x for x in taken if lo < x < hi)})
    for x in plan:
        if any(abs(x - mark) < step / 5 for mark in marks):
            continue
        a = max(mark for mark in marks if mark < x)
        b = min(mark for mark in marks if mark > x)
        if round(b - a, 9) > close:
            return [x]
    return []


@dataclass(frozen=True, slots=True)
class Match:
    """How many GPUs a baseline configuration needs to serve another's capacity."""

    gpus: int | None
    bound: str  # EXACT, AT_LEAST (the other's capacity is a lower bound) or "unknown"


def gpus_to_match(installed: int, baseline: Capacity, other: Capacity) -> Match:
    """The scaling estimate of the module docstring (``None`` when either capacity is unknown)."""
    if baseline.load is None or other.load is None or baseline.bound == AT_LEAST:
        return Match(None, "unknown")
    gpus = math.ceil(installed * other.load / baseline.load - 1e-9)
    return Match(gpus, AT_LEAST if other.bound == AT_LEAST else EXACT)


@dataclass(slots=True)
class SweepResult:
    loads: list[float]
    runs: list[ExperimentResult]
    document: dict[str, Any]


def run_sweep(  # noqa: PLR0913 - keyword-only: wait target, progress, jobs
    sim_at: Callable[[float], SimInput],
    loads: Sequence[float],
    names: tuple[str, ...],
    *,
    wait_target: float = DEFAULT_WAIT_TARGET,
    progress: ProgressCallback | None = None,
    jobs: int = 1,
) -> SweepResult:
    """Run ``names`` at every load; ``sim_at(load)`` draws that load's workloads (same seed).

    Every (load, configuration) run is one task for up to ``jobs`` processes at once (the heaviest
    first: the core's runs at the highest loads); the results do not depend on ``jobs``.
    """
    check_names(names)
    started = time.perf_counter()
    ordered = sorted(dict.fromkeys(loads))
    unique = tuple(dict.fromkeys(names))
    inputs = [sim_at(load) for load in ordered]
    tasks = [
        Task(f"{name} @ {load:g}", name, i, load * expected_cost(name))
        for i, load in enumerate(ordered)
        for name in unique
    ]
    results = run_tasks(run_named, inputs, tasks, jobs, progress)
    per_load = len(unique)
    runs = []
    for i, sim in enumerate(inputs):
        mine = results[i * per_load : (i + 1) * per_load]
        runs.append(experiment_result(sim, unique, mine, sum(doc["wallSeconds"] for _, doc in mine)))
    first = runs[0].document
    points: dict[str, list[tuple[float, float | None]]] = {name: [] for name in names}
    for load, run in zip(ordered, runs, strict=True):
        for name in names:
            points[name].append((load, run.document["configurations"][name]["waitP95Seconds"]))
    capacity = {name: capacity_at_wait_target(points[name], wait_target) for name in names}
    document: dict[str, Any] = {
        "scenario": first["scenario"],
        "seed": first["seed"],
        "days": first["days"],
        "gpus": first["gpus"],
        "waitTargetSeconds": wait_target,
        "sweep": [
            {
                "load": load,
                "workloads": run.document["workloads"],
                "configurations": run.document["configurations"],
            }
            for load, run in zip(ordered, runs, strict=True)
        ],
        "capacityAtWaitTarget": {name: _round(c.load) for name, c in capacity.items()},
        "capacityBound": {name: c.bound for name, c in capacity.items()},
    }
    if "stock" in capacity:
        matches = {
            name: gpus_to_match(first["gpus"], capacity["stock"], c)
            for name, c in capacity.items()
            if name != "stock" and not name.startswith("stock")
        }
        document["gpusToMatch"] = {
            name: {"stockGpus": m.gpus, "bound": m.bound, "method": "scaled from capacity fractions"}
            for name, m in matches.items()
        }
    document["wallSeconds"] = round(time.perf_counter() - started, 3)
    return SweepResult(ordered, runs, document)


def sweep_points(document: dict[str, Any]) -> list[tuple[float, dict[str, dict[str, Any] | None]]]:
    """Every load run, with each configuration's summary there (None where it did not run): the
    grid's loads, or with ``--sweep auto`` every load the search ran."""
    names = list(document["capacityAtWaitTarget"])
    if "autoSweep" not in document:
        return [(p["load"], {n: p["configurations"][n] for n in names}) for p in document["sweep"]]
    runs = {n: {r["load"]: r for r in document["autoSweep"][n]} for n in names}
    loads = sorted({load for per in runs.values() for load in per})
    return [(load, {n: runs[n].get(load) for n in names}) for load in loads]


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
