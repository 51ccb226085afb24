"""What a simulation measures, per configuration, team and workload class.

Definitions (every GPU-hour is counted inside the measured window ``[0, horizon]`` only):

* **allocated GPU-hours**: GPU-equivalents held by a workload's pods x time. A whole GPU is 1, a
  fraction its share, a MIG instance its compute slices / 7. Stock Kubernetes holds a whole GPU for
  a fraction or MIG request. Pods of a partly placed gang hold their GPUs too.
* **busy GPU-hours**: SM activity x time while a workload computes, capped per pod by what the pod
  holds (a pod cannot compute on more GPU than it has). *Busy share* = busy / allocated; idle =
  allocated - busy, so allocated = busy + idle by construction.
* **allocated share**: allocated GPU-hours / (installed GPUs x window).
* **queue wait**: submission to first start (a gang starts when all its pods run). Work that never
  started by the end counts with its wait so far (a lower bound), so a configuration that starts
  less does not look faster.
* **job completion time**: submission to completion, for work that completed in the window.
* **deadlocked GPU-hours**: GPU-hours held by pods of gangs that are only partly placed (they hold
  GPUs and compute nothing). *Circular* deadlock GPU-hours are the part held while no order of
  completions could ever let the gang finish placing (stock only; see :mod:`gpuplane.sim.stock`).
* **stranded quota GPU-hours**: quota that sits unused in teams with nothing queued while other
  teams have queued work: min(unused quota of idle teams, queued demand of the others).
* **lost GPU-hours**: allocated GPU-hours of work thrown away by preemption or node failure
  (compute since the last checkpoint; everything for work that never checkpoints).
* **ETA error**: |predicted start - real start|, for work submitted in the window that was still
  pending after the scheduling pass at its arrival (the ETA ``gpuplane why`` shows then) and
  started. The *relative* ETA error divides it by the real wait, over work that waited more than
  five minutes (:data:`ETA_RELATIVE_MIN_WAIT`).
* **ETA range coverage**: over the same work, the share whose real start fell inside the range
  given with the ETA (its 10th to 90th percentile, :mod:`gpuplane.sim.ranges`): calibrated, it is
  about 0.8.
* **runtime error**: |median runtime predicted at a job's first start - the runtime it had| / the
  runtime it had, for first runs that ended by themselves in the window.
* **basis**: what a job's runtime was predicted from (:mod:`gpuplane.insight.runtime_predictor`):
  ``name`` (earlier runs of its job name), ``team`` (its team's runs of its size), ``class`` (its
  class, the queue feature in the simulator), ``all``, or ``declared`` (the class mean the scenario
  declares, before any history). The ETA errors by basis use the asked job's own basis.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

FloatArray = np.ndarray[Any, np.dtype[np.float64]]
HOUR = 3600.0
ETA_RELATIVE_MIN_WAIT = 300.0  # seconds: the relative ETA error counts work that waited longer


@dataclass(slots=True)
class GroupStats:
    """Totals of one (team, class) group in one configuration."""

    allocated: float = 0.0  # GPU-seconds
    busy: float = 0.0
    lost: float = 0.0
    deadlocked: float = 0.0
    circular: float = 0.0
    submitted: int = 0
    started: int = 0
    completed: int = 0
    preemptions: int = 0
    interrupted_by_failure: int = 0
    reaped: int = 0
    resumed: int = 0
    deadlock_restarts: int = 0
    waits: list[float] = field(default_factory=list)
    resume_waits: list[float] = field(default_factory=list)
    completion_times: list[float] = field(default_factory=list)
    eta_errors: list[float] = field(default_factory=list)
    eta_relative_errors: list[float] = field(default_factory=list)
    eta_inside: list[bool] = field(default_factory=list)  # by eta_relative_errors: start in range
    eta_bases: list[str] = field(default_factory=list)  # by eta_relative_errors: the job's basis
    runtime_errors: list[float] = field(default_factory=list)
    runtime_bases: list[str] = field(default_factory=list)  # by runtime_errors
    never_predicted: int = 0

    def merge(self, other: GroupStats) -> None:
        for name in (
            "allocated",
            "busy",
            "lost",
            "deadlocked",
            "circular",
            "submitted",
            "started",
            "completed",
            "preemptions",
            "interrupted_by_failure",
            "reaped",
            "resumed",
            "deadlock_restarts",
            "never_predicted",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.waits += other.waits
        self.resume_waits += other.resume_waits
        self.completion_times += other.completion_times
        self.eta_errors += other.eta_errors
        self.eta_relative_errors += other.eta_relative_errors
        self.eta_inside += other.eta_inside
        self.eta_bases += other.eta_bases
        self.runtime_errors += other.runtime_errors
        self.runtime_bases += other.runtime_bases


class Series:
    """GPU-seconds per time bin over ``[0, horizon]``."""

    def __init__(self, horizon: float, width: float) -> None:
        self.width = width
        self.bins = max(1, math.ceil(horizon / width))
        # Added to at every change of what a job holds or does: a list takes one float at a time
        # faster than an array does (the sums are the same floats).
        self.totals: list[float] = [0.0] * self.bins

    @property
    def values(self) -> FloatArray:
        """The GPU-seconds of each bin."""
        return np.array(self.totals, dtype=np.float64)

    def add(self, t0: float, t1: float, rate: float) -> None:
        """Add ``rate`` GPU-equivalents over ``[t0, t1]`` (clipped to the window)."""
        t0 = max(t0, 0.0)
        t1 = min(t1, self.bins * self.width)
        if t1 <= t0 or rate == 0.0:
            return
        w = self.width
        totals = self.totals
        first, last = int(t0 // w), int(t1 // w)
        if first == last:
            totals[first] += rate * (t1 - t0)
            return
        totals[first] += rate * ((first + 1) * w - t0)
        step = rate * w
        for i in range(first + 1, last):
            totals[i] += step
        if last < self.bins:
            totals[last] += rate * (t1 - last * w)


@dataclass(frozen=True, slots=True)
class Cut:
    """A run stopped at ``at`` (seconds into the window) once its p95 wait was sure to miss the
    target (:mod:`gpuplane.sim.wait_cut`); ``wait_p95``: a lower bound for the p95 it would have had."""

    at: float
    wait_p95: float


class Ledger:
    """Accumulates one configuration's measurements while it runs."""

    def __init__(self, horizon: float, gpus: int, bin_width: float = HOUR) -> None:
        self.horizon = horizon
        self.gpus = gpus
        self.groups: dict[tuple[str, str], GroupStats] = {}
        self.allocated_series = Series(horizon, bin_width)
        self.busy_series = Series(horizon, bin_width)
        self.stranded = 0.0
        self.down_gpu_seconds = 0.0
        self.node_failures = 0
        self.events = 0
        self.cycles = 0
        self.cut: Cut | None = None

    def group(self, team: str, klass: str) -> GroupStats:
        key = (team, klass)
        stats = self.groups.get(key)
        if stats is None:
            stats = self.groups[key] = GroupStats()
        return stats

    def clip(self, t0: float, t1: float) -> float:
        """Length of ``[t0, t1]`` inside the window."""
        return max(0.0, min(t1, self.horizon) - max(t0, 0.0))


# ---------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def _round(value: float | None, digits: int = 4) -> float | None:
    if value is None:
        return None
    return round(value, digits)


def _share(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def group_document(stats: GroupStats, capacity: float | None = None) -> dict[str, Any]:
    """The JSON summary of one group (or of the sum of groups)."""
    doc: dict[str, Any] = {}
    if capacity is not None:
        doc["gpuAllocatedShare"] = _round(_share(stats.allocated, capacity))
    doc["gpuBusyShare"] = _round(_share(stats.busy, stats.allocated))
    if capacity is not None:
        doc["gpuBusyOfCapacity"] = _round(_share(stats.busy, capacity))
    doc.update(
        {
            "allocatedGpuHours": _round(stats.allocated / HOUR, 2),
            "busyGpuHours": _round(stats.busy / HOUR, 2),
            "idleGpuHours": _round((stats.allocated - stats.busy) / HOUR, 2),
            "waitP50Seconds": _round(percentile(stats.waits, 50), 1),
            "waitP95Seconds": _round(percentile(stats.waits, 95), 1),
            "waitMaxSeconds": _round(max(stats.waits) if stats.waits else None, 1),
            "jctP50Seconds": _round(percentile(stats.completion_times, 50), 1),
            "jctMeanSeconds": _round(
                float(np.mean(stats.completion_times)) if stats.completion_times else None, 1
            ),
            "deadlockedGpuHours": _round(stats.deadlocked / HOUR, 2),
            "circularDeadlockGpuHours": _round(stats.circular / HOUR, 2),
            "deadlockRestarts": stats.deadlock_restarts,
            "preemptions": stats.preemptions,
            "lostGpuHours": _round(stats.lost / HOUR, 2),
            "interruptedByNodeFailure": stats.interrupted_by_failure,
            "sessionsReaped": stats.reaped,
            "sessionsResumed": stats.resumed,
            "resumeWaitP95Seconds": _round(percentile(stats.resume_waits, 95), 1),
            "etaErrorP50": _round(percentile(stats.eta_errors, 50), 1),
            "etaErrorP90": _round(percentile(stats.eta_errors, 90), 1),
            "etaRelativeErrorP50": _round(percentile(stats.eta_relative_errors, 50)),
            "etaRelativeErrorP90": _round(percentile(stats.eta_relative_errors, 90)),
            "etaWaitedCount": len(stats.eta_relative_errors),
            "etaRangeCoverage": _round(_share(sum(stats.eta_inside), len(stats.eta_inside))),
            "runtimeRelativeErrorP50": _round(percentile(stats.runtime_errors, 50)),
            "submitted": stats.submitted,
            "started": stats.started,
            "completed": stats.completed,
        }
    )
    return doc


BASES = ("name", "team", "class", "all", "declared", "assumed")


def basis_label(basis: str) -> str:
    """A runtime predictor's basis as reported: the simulator's queue feature is the class, and an
    overdue run's tail counts with the basis it came from."""
    head = basis.split(",", 1)[0]
    return "class" if head == "queue" else head


def basis_document(stats: GroupStats) -> dict[str, Any]:
    """The ETA and runtime errors by basis (see the module docstring)."""
    eta: dict[str, list[tuple[float, bool]]] = {}
    eta_rows = zip(stats.eta_relative_errors, stats.eta_inside, stats.eta_bases, strict=True)
    for error, inside, basis in eta_rows:
        eta.setdefault(basis_label(basis), []).append((error, inside))
    runtime: dict[str, list[float]] = {}
    for error, basis in zip(stats.runtime_errors, stats.runtime_bases, strict=True):
        runtime.setdefault(basis_label(basis), []).append(error)
    doc: dict[str, Any] = {}
    order = {basis: i for i, basis in enumerate(BASES)}
    for basis in sorted(set(eta) | set(runtime), key=lambda b: (order.get(b, len(BASES)), b)):
        waited = eta.get(basis, [])
        runs = runtime.get(basis, [])
        doc[basis] = {
            "etaRelativeErrorP50": _round(percentile([e for e, _ in waited], 50)),
            "etaRangeCoverage": _round(_share(sum(inside for _, inside in waited), len(waited))),
            "etaWaitedCount": len(waited),
            "runtimeRelativeErrorP50": _round(percentile(runs, 50)),
            "runtimeCount": len(runs),
        }
    return doc


def total(groups: Iterable[GroupStats]) -> GroupStats:
    out = GroupStats()
    for stats in groups:
        out.merge(stats)
    return out


def configuration_document(ledger: Ledger) -> dict[str, Any]:
    """The JSON summary of one configuration, with per-team and per-class breakdowns."""
    capacity = ledger.gpus * ledger.horizon
    whole = total(ledger.groups.values())
    doc = group_document(whole, capacity)
    doc["byBasis"] = basis_document(whole)
    doc["strandedQuotaGpuHours"] = _round(ledger.stranded / HOUR, 2)
    doc["nodeFailures"] = ledger.node_failures
    doc["downGpuHours"] = _round(ledger.down_gpu_seconds / HOUR, 2)
    teams = sorted({team for team, _ in ledger.groups})
    classes = sorted({klass for _, klass in ledger.groups})
    doc["teams"] = {
        team: group_document(total(s for (t, _), s in ledger.groups.items() if t == team)) for team in teams
    }
    doc["classes"] = {
        klass: group_document(total(s for (_, c), s in ledger.groups.items() if c == klass))
        for klass in classes
    }
    doc["events"] = ledger.events
    doc["schedulingCycles"] = ledger.cycles
    if ledger.cut is not None:
        # Stopped once the p95 wait was sure to miss the target: the other figures cover the
        # window up to the cut, and the p95 wait is a lower bound for the whole window's.
        doc["waitP95Seconds"] = _round(ledger.cut.wait_p95, 1)
        doc["cut"] = {"atSeconds": _round(ledger.cut.at, 1), "waitP95": "atLeast"}
    return doc
