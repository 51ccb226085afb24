"""The runtimes of the live ETA (:mod:`gpuplane.insight.queue_eta`): what a workload will run.

:func:`runtime_model` learns a :class:`~gpuplane.insight.runtime_predictor.RuntimePredictor`
from the finished Workloads of a cluster state (admission to ``Finished``) and from a history
recorded elsewhere (the controller's, kept across restarts). :class:`RuntimeModel` asks it for
each workload: the history of its job name, else the runtime it declares with the
``gpuplane.dev/expected-runtime`` annotation (seconds, or a number with ``s``/``m``/``h``), else
the history of its team at its size, of its ClusterQueue, of the cluster, else about an hour
(a lognormal, and the basis says so); a running workload's remaining time is conditioned on the
time it has run, with a tail estimate, never 0, once it ran past its expected end; the pod
template's ``activeDeadlineSeconds`` caps it. :meth:`RuntimeModel.basis` says which, in words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample, features_of
from gpuplane.insight.runtime_predictor import DEFAULT_RUNTIME_SECONDS, Prediction, RuntimePredictor
from gpuplane.model import labels as keys
from gpuplane.model.conditions import ConditionType
from gpuplane.model.objects import ClusterState, Workload

EXPECTED_RUNTIME_ANNOTATION = keys.EXPECTED_RUNTIME_ANNOTATION
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


def declared_runtime(wl: Workload) -> float | None:
    """The workload's own expected runtime annotation, in seconds, if valid."""
    text = wl.annotations.get(EXPECTED_RUNTIME_ANNOTATION)
    if text is None:
        return None
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT[match.group(2)]


def _started(wl: Workload) -> float | None:
    for ctype in (ConditionType.ADMITTED, ConditionType.QUOTA_RESERVED):
        cond = wl.condition(ctype)
        if cond is not None and cond.status:
            return cond.last_transition
    return None


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted ``samples`` (not empty)."""
    if len(samples) == 1:
        return samples[0]
    pos = q * (len(samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(samples) - 1)
    return samples[lo] + (samples[hi] - samples[lo]) * (pos - lo)


MIN_RUNS = 3  # finished runs of a feature key the live ETA learns from (a cluster's history is thin)


def finished_samples(state: ClusterState) -> list[RuntimeSample]:
    """What the finished Workloads of ``state`` teach: their runtime (admission to ``Finished``)
    and features."""
    out = []
    for wl in state.workloads:
        finished = wl.condition(ConditionType.FINISHED)
        start = _started(wl)
        if wl.admission is None or finished is None or not finished.status or start is None:
            continue
        if finished.last_transition < start:
            continue
        features = features_of(wl, wl.admission.cluster_queue)
        out.append(RuntimeSample(features, finished.last_transition - start, finished.last_transition))
    return out


def runtime_model(
    state: ClusterState, now: float | None = None, history: Iterable[RuntimeSample] = ()
) -> RuntimeModel:
    """The runtimes learned from ``history`` (finished runs recorded elsewhere, such as the
    controller's) and from the finished Workloads of ``state`` that ``history`` does not hold
    already. ``now`` is not read: learning needs no clock."""
    del now
    known = list(history)
    seen = set(known)
    samples = known + [s for s in finished_samples(state) if s not in seen]
    return RuntimeModel(RuntimePredictor(samples, min_samples=MIN_RUNS))


def active_deadline(wl: Workload) -> float | None:
    """The shortest ``activeDeadlineSeconds`` of the workload's pod templates, if any."""
    limits = [ps.template.active_deadline for ps in wl.pod_sets if ps.template.active_deadline]
    return float(min(limits)) if limits else None


@dataclass(frozen=True, slots=True)
class RuntimeBasis:
    """What an estimate took one workload's runtime from: the basis of its prediction
    (``name``, ``team``, ``queue``, ``all``: a history; ``declared``; ``assumed``), the finished
    runs behind it, whether it ran past its expected end (a tail estimate), and the median of its
    remaining seconds."""

    workload: str  # namespace/name ("" for a pod outside any queue)
    basis: str
    samples: int
    overdue: bool
    remaining_seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "basis": self.basis,
            "samples": self.samples,
            "overdue": self.overdue,
            "remainingSeconds": self.remaining_seconds,
        }


class RuntimeModel:
    """Runtimes for the ETA: the predictor learned from finished runs, how many finished per
    ClusterQueue, and the predictions made (by workload, queue and time run)."""

    def __init__(self, predictor: RuntimePredictor | None = None) -> None:
        self.predictor = predictor or RuntimePredictor(min_samples=MIN_RUNS)
        self._made: dict[tuple[str, str, float], Prediction] = {}

    def prediction(self, wl: Workload | None, queue: str, elapsed: float = 0.0) -> Prediction:
        """The remaining runtime of ``wl`` (in ClusterQueue ``queue``) after ``elapsed`` seconds:
        from the history of its job name, else its declared runtime, else the history of its team
        at its size, its queue, the cluster, else about :data:`DEFAULT_RUNTIME_SECONDS`; capped by
        its ``activeDeadlineSeconds``. ``None``: a pod outside any queue."""
        key = (wl.key if wl is not None else "", queue, elapsed)
        made = self._made.get(key)
        if made is None:
            if wl is None:
                made = self.predictor.predict(JobFeatures("", "", queue, "", ""), elapsed)
            else:
                made = self.predictor.predict(
                    features_of(wl, queue),
                    elapsed,
                    declared=declared_runtime(wl),
                    limit=active_deadline(wl),
                    prefer_declared=True,
                )
            self._made[key] = made
        return made

    def total_at(self, wl: Workload | None, queue: str, u: float) -> float:
        """Runtime at quantile ``u`` of a workload not started yet."""
        return self.prediction(wl, queue).at(u)

    def remaining_at(self, wl: Workload | None, queue: str, elapsed: float, u: float) -> float:
        """Remaining runtime at quantile ``u`` of a workload that ran ``elapsed`` seconds: never 0
        for one that ran past its expected end (see :mod:`gpuplane.insight.runtime_predictor`)."""
        return self.prediction(wl, queue, elapsed).at(u)

    def finished_in(self, queue: str) -> int:
        """Finished runs learned in ClusterQueue ``queue``."""
        return self.predictor.count(JobFeatures("", "", queue, "", ""))[1] if queue else 0

    def bases(self, involved: Iterable[tuple[Workload | None, str, float]]) -> tuple[RuntimeBasis, ...]:
        """Where the runtime of each of the ``involved`` workloads (each with its ClusterQueue and
        the time it has run; 0 when queued) comes from, as data (one entry per workload, in the
        order given)."""
        out: dict[str, RuntimeBasis] = {}
        for wl, q, elapsed in involved:
            p = self.prediction(wl, q, elapsed)
            name = wl.key if wl is not None else ""
            if name not in out:
                kind = p.basis.split(",")[0]
                out[name] = RuntimeBasis(name, kind, p.samples, p.overdue, round(p.median, 1))
        return tuple(out.values())

    def basis(self, queue: str, involved: Iterable[tuple[Workload | None, str, float]]) -> str:
        """Where an estimate's runtimes come from, in words, for the ``involved`` workloads
        (each with its ClusterQueue and the time it has run; 0 when queued): the history of its
        job name, its declared runtime, its team's history at its size, its queue's, the
        cluster's, or assumed; and which ones ran past their expected end (a tail estimate)."""
        found = [(wl, self.prediction(wl, q, elapsed)) for wl, q, elapsed in involved]
        learned = [p for _, p in found if p.samples]
        if learned:
            words = f"runtimes from {_bases(found)}"
            finished = self.finished_in(queue)
            if finished:
                words += f"; {finished} finished in {queue}"
        elif all(p.basis.startswith("declared") for _, p in found):
            words = "no finished workloads: runtimes as declared"
        else:
            words = (
                "no finished workloads: runtimes declared where given, else about "
                f"{DEFAULT_RUNTIME_SECONDS:.0f}s"
            )
        overdue = [wl for wl, p in found if p.overdue]
        if overdue:
            who = _names(overdue) if len(overdue) <= NAMED else f"{len(overdue)} workloads"
            words += (
                f"; {who} ran past {'its' if len(overdue) == 1 else 'their'} expected end: "
                "tail estimate from the time run"
            )
        return words


NAMED = 3  # involved workloads named one by one in a basis; more are counted
_BASIS_WORDS = {
    "name": "the history of its job name",
    "team": "its team's history at its size",
    "queue": "its queue's history",
    "all": "the cluster's history",
    "declared": "its declared runtime",
    "assumed": f"assumed about {DEFAULT_RUNTIME_SECONDS:.0f}s",
}


def _names(workloads: Sequence[Workload | None]) -> str:
    return ", ".join(wl.key if wl is not None else "a pod outside any queue" for wl in workloads)


def _bases(found: Sequence[tuple[Workload | None, Prediction]]) -> str:
    """Each involved workload's basis (or, past :data:`NAMED`, how many have each)."""
    if len(found) <= NAMED:
        parts = []
        for wl, p in found:
            kind = p.basis.split(",")[0]
            runs = f" ({p.samples} runs)" if p.samples else ""
            parts.append(f"{_names([wl])}: {_BASIS_WORDS[kind]}{runs}")
        return ", ".join(parts)
    by_kind: dict[str, int] = {}
    for _, p in found:
        kind = p.basis.split(",")[0]
        by_kind[kind] = by_kind.get(kind, 0) + 1
    return ", ".join(f"{n} x {_BASIS_WORDS[kind]}" for kind, n in by_kind.items())
