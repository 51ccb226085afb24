"""Every workload's life as a session saw it: its state, and the steps that led there.

A :class:`Histories` keeps one :class:`~gpuplane.core.lifecycle.Lifecycle` per workload and moves it
through the transition table of :mod:`gpuplane.core.lifecycle` on the session's events and on each
cycle's admissions, preemptions and check evictions; with ``track_reasons`` it also records each
queued workload's pending reason after every cycle. A session that keeps no history (the
simulator) has none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from gpuplane.core.check_gate import CheckEviction, Verdict
from gpuplane.core.lifecycle import Lifecycle, Reason, Step, WorkloadState
from gpuplane.core.plan import AdmissionDecision, PreemptionDecision
from gpuplane.core.scheduler import Scheduler
from gpuplane.model.admission_checks import CheckState
from gpuplane.model.conditions import ConditionType
from gpuplane.model.objects import Workload

_S = WorkloadState


def as_reason(text: str, default: Reason = Reason.PENDING) -> Reason:
    """``text`` as a :class:`Reason`. The core reports only these spellings; a reason written by
    someone else (an object read from a cluster) reads as ``default``."""
    try:
        return Reason(text)
    except ValueError:
        return default


class Histories:
    """The lifecycles of a session's workloads, by key, and how many of the admission checks'
    evictions they have taken in."""

    def __init__(self, scheduler: Scheduler, now: float, *, track_reasons: bool) -> None:
        self._scheduler = scheduler
        self._track_reasons = track_reasons
        self._lifecycles: dict[str, Lifecycle] = {}
        self._evictions_seen = 0
        for wl in scheduler.state.workloads:
            created = min(wl.creation, now)
            if wl.finished:  # observed finished: its history starts there
                life = Lifecycle(created, [Step(_S.FINISHED, created, Reason.FINISHED)])
            else:
                life = Lifecycle(created)
                if wl.key in scheduler.tree.admitted:
                    self._initial_hold(life, wl, now)
            self._lifecycles[wl.key] = life
        if track_reasons:
            self.note_pending(now)

    def _initial_hold(self, life: Lifecycle, wl: Workload, now: float) -> None:
        """The state of a workload that holds quota when the session starts."""
        verdict, _ = self._scheduler.gate.verdict(wl)
        leaving = verdict in (Verdict.RETRY, Verdict.REJECTED)
        if verdict in (Verdict.WAITING, Verdict.READY) or (leaving and not wl.condition_true("Admitted")):
            life.transition(_S.QUOTA_RESERVED, now, Reason.QUOTA_RESERVED)
            return
        life.transition(_S.ADMITTED, now, Reason.ADMITTED)
        evicted = wl.condition(ConditionType.EVICTED)
        if evicted is not None and evicted.status:  # holds its quota until its pods are gone
            life.transition(_S.EVICTING, now, as_reason(evicted.reason, Reason.PREEMPTED), evicted.message)

    def submitted(self, key: str, now: float) -> None:
        """A new workload arrived; raises on a key still live."""
        known = self._lifecycles.get(key)
        if known is not None and known.state not in (_S.FINISHED, _S.DELETED):
            raise ValueError(f"workload {key} is already known; use update()")
        self._lifecycles[key] = Lifecycle(created=now)

    def move(self, key: str, to: WorkloadState, now: float, reason: Reason, message: str = "") -> None:
        life = self._lifecycles.get(key)
        if life is None:
            life = self._lifecycles[key] = Lifecycle(created=now)
        life.transition(to, now, reason, message)

    def after_cycle(
        self, admitted: Iterable[AdmissionDecision], preempted: Iterable[PreemptionDecision], now: float
    ) -> None:
        """Move the lifecycles by what one cycle decided."""
        evictions = self._scheduler.gate.evictions
        if len(evictions) > self._evictions_seen:
            for ended in evictions[self._evictions_seen :]:
                self._check_ended(ended, now)
            self._evictions_seen = len(evictions)
        for decision in admitted:
            if decision.checks:
                self.move(decision.workload, _S.QUOTA_RESERVED, now, Reason.QUOTA_RESERVED)
            else:
                self.move(decision.workload, _S.ADMITTED, now, Reason.ADMITTED)
        for victim in preempted:
            # The core requeues a victim at once: its capacity counts as free in the next cycle.
            self.move(victim.workload, _S.PENDING, now, Reason.PREEMPTED, victim.reason)
        if self._track_reasons:
            self.note_pending(now)

    def _check_ended(self, ended: CheckEviction, now: float) -> None:
        life = self._lifecycles.get(ended.workload)
        if life is None or life.state == _S.PENDING:
            return
        reason = Reason.DEACTIVATED if ended.state == CheckState.REJECTED else Reason.ADMISSION_CHECK
        self.move(ended.workload, _S.PENDING, now, reason, ended.message)

    def note_pending(self, now: float) -> None:
        """Record each queued workload's pending reason as of ``now``."""
        for decision in self._scheduler.pending_decisions():
            life = self._lifecycles.get(decision.workload)
            if life is not None and life.state == _S.PENDING:
                life.transition(_S.PENDING, now, as_reason(decision.reason), decision.message)

    def get(self, key: str) -> Lifecycle | None:
        """The workload's state and history (a copy: the original stays here)."""
        life = self._lifecycles.get(key)
        return None if life is None else replace(life, history=list(life.history))
