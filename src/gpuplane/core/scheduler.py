"""Scheduling cycles with Kueue's semantics.

``schedule(state, config, now)`` is the pure entry point: a frozen ClusterState in,
a :class:`~gpuplane.core.plan.Plan` out. Internally a :class:`Scheduler` keeps a
working copy (quota tree and queues) that lives only for that call.

One cycle::

    heads (one per ClusterQueue) -> nominate (flavors, preemption targets)
        -> order (classical or fair sharing) -> for each entry:
           NoFit: skip | Preempt without targets: reserve | overlap/no longer fits: skip
           Preempt: evict victims (they are gone in the next cycle) | Fit: admit

With ``cycles=None`` the scheduler repeats cycles until nothing changes (a fixed
point): victims are requeued, and inadmissible workloads of BestEffortFIFO queues
wait aside until capacity is freed in their cohort.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import AdmissionDecision, Plan
from gpuplane.core.scheduling.admit import Admission
from gpuplane.core.scheduling.order import Ordering
from gpuplane.core.scheduling.state import (
    WORKLOAD_LABEL,
    CycleResult,
    CycleWork,
    Entry,
    ScanProgress,
    Status,
    classical_key,
)
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import ClusterState

__all__ = [
    "WORKLOAD_LABEL",
    "CycleResult",
    "Entry",
    "PendingWorkload",
    "ScanProgress",
    "Scheduler",
    "Status",
    "drain",
    "drain_bound",
    "plan_after",
    "schedule",
]


class Scheduler(Admission, Ordering):
    """Working state and the cycle, for one ``schedule`` call or one session's whole life.

    The phases are layers (:mod:`gpuplane.core.scheduling`): queues, nominate, order, preempt,
    nodes and admit. This class loads the cluster state into them and runs the cycle.
    """

    def __init__(self, state: ClusterState, config: SchedulerConfig, now: float) -> None:
        super().__init__(state, config, now)
        self._all_best_effort: bool | None = None  # see _best_effort_only
        for node in self.tree.queues.values():
            node.active = self._inactive_reason(node) is None
        if self.cluster is not None:
            self._hold_running_pods()
        for bad in state.invalid_workloads:
            lq = state.local_queues.get(f"{bad.namespace}/{bad.queue_name}") if bad.queue_name else None
            self.unqueued[bad.key] = (
                lq.cluster_queue if lq is not None else None,
                f"{bad.namespace}/{bad.queue_name}" if bad.queue_name else None,
                Status(Reason.MISCONFIGURED, bad.problem),
            )
        for wl in state.workloads:
            self.workloads[wl.key] = wl
            if wl.finished:
                continue
            if wl.admission is not None:
                self._hold_admitted(wl, now)
                continue
            self._enqueue(wl, wl.queue_order_timestamp)
        for queue in self.queues.values():
            queue.sort(key=PendingWorkload.sort_key)

    def cycle(self, budget: int = 1) -> CycleResult:
        """Run one scheduling cycle and apply its outcome to the working state.

        With ``budget`` > 1, the cycles that follow one in which every head was parked without
        a nomination run in this call too, up to ``budget`` cycles (``result.cycles``). Such a
        cycle changes nothing but which heads are parked (and their reasons), so the next one
        starts from the same state: running it here gives what a separate call would, without
        the call's cost (a long backlog parks one head per queue per cycle). Only where every
        queue is BestEffortFIFO, so that each such cycle parks every head it visits, and never
        the first cycle (which settles admission checks); a cycle that would find no head is
        left to the next call (it is the quiet one that ends a drain).
        """
        self.cycle_number += 1
        result = CycleResult()
        if self.cycle_number == 1:
            self._settle_checked(result)
        while True:
            # Each head's cohort generation as the cycle starts (nothing before the admissions
            # moves it).
            generations: dict[str, int] = {}
            self.preemptor.clear_cache()
            parked = result.parked
            entries, shapes = self._nominate_heads(result, generations)
            if (
                entries
                or result.cycles >= budget
                or self.cycle_number == 1
                or result.parked == parked
                or not self._best_effort_only()
            ):
                break
            self.preemptor_of = {}  # what _record_outcomes leaves after a cycle without entries
            if not self.heads():
                break
            self.cycle_number += 1
            result.cycles += 1
        if entries:  # nothing to decide otherwise (and nothing searched the preemptor's cache)
            self._decide(entries, result)
        self._record_outcomes(entries, shapes, generations, result)
        if self.cycle_number == 1:
            self._release_leaving(result)
        return result

    def _best_effort_only(self) -> bool:
        """Whether every ClusterQueue is BestEffortFIFO (a StrictFIFO head is never parked)."""
        if self._all_best_effort is None:
            self._all_best_effort = all(
                node.spec.queueing_strategy != "StrictFIFO" for node in self.tree.queues.values()
            )
        return self._all_best_effort

    def _nominate_heads(
        self, result: CycleResult, generations: dict[str, int]
    ) -> tuple[list[Entry], dict[str, int]]:
        """Nominate each queue's head; those that cannot be nominated are parked. Returns the
        entries and, for the heads nominated afresh, their shapes; ``generations`` gets each
        visited head's cohort generation."""
        entries: list[Entry] = []
        if self._failed_version != self.state_version:
            self._failed.clear()
            self._failed_version = self.state_version
        shapes: dict[str, int] = {}
        for pending in self.heads():
            if pending.cluster_queue not in generations:
                generations[pending.cluster_queue] = self._generation(pending.cluster_queue)
            # A workload whose flavor scan is under way resumes where it stopped, which its
            # shape does not capture: only scans that start at the first flavor are remembered.
            progress = self.scan.get(pending.key)
            fresh = progress is None or not progress.pending_flavors
            shape = self._shape(pending) if fresh else None
            if shape is not None:
                known = self._failed.get(shape)
                if known is not None:
                    self.status[pending.key] = Status(known.reason, known.message)
                    self._park(pending, result)
                    continue
                shapes[pending.key] = shape
            nominated = self.nominate(pending)
            if isinstance(nominated, Status):
                self.status[pending.key] = nominated
                if shape is not None:
                    self._failed[shape] = nominated
                self._park(pending, result)
                continue
            entries.append(nominated)
        return entries, shapes

    def _decide(self, entries: list[Entry], result: CycleResult) -> None:
        """Try the entries in order, then admit the winners and evict their victims."""
        work = CycleWork()
        self.preemptor.forget_no_room()  # the entries' reservations change the tree from here
        if self.config.fair_sharing:
            for e in self._fair_order(entries):
                self._process(e, work)
        else:
            # A heap, not a sorted list: an entry that moves on to a later flavor may be put
            # back by that flavor's key (Admission._put_back).
            sorting = self.config.priority_sorting_within_cohort
            later = work.later = [(classical_key(e, sorting), e) for e in entries]
            heapq.heapify(later)
            while later:
                self._process(heapq.heappop(later)[1], work)
        for cq, usage in reversed(work.reservations):
            cq.remove_usage_map(usage)
        self.preemptor.clear_cache()
        for e in work.admitted:
            self._admit(e, result)
        for key, target in work.victims.items():
            self._evict(target, work.victim_preemptor[key], result)

    def _record_outcomes(
        self,
        entries: list[Entry],
        shapes: dict[str, int],
        generations: dict[str, int],
        result: CycleResult,
    ) -> None:
        """Each entry not admitted keeps its reason; it is requeued at once or parked."""
        self.preemptor_of = {}
        for e in entries:
            if e.pending.key in self.admitted and self.admitted[e.pending.key].cycle == self.cycle_number:
                continue
            self.status[e.pending.key] = Status(e.reason, e.message)
            if e.reason == Reason.WAITING_FOR_PREEMPTED:
                self.preemptor_of[e.pending.cluster_queue] = e.pending.key
            # A workload with flavors left to scan is requeued at once (PendingFlavors).
            rescan = self._remember_scan(e, generations[e.pending.cluster_queue], result)
            if not e.requeue_now and not rescan:
                self._park(e.pending, result)
                shape = shapes.get(e.pending.key)
                if shape is not None and e.decided_alone:
                    # Parked on the cycle's starting state alone, with no effect on the
                    # others: a workload of the same shape meets the same outcome until
                    # the state changes.
                    self._failed[shape] = Status(e.reason, e.message)


def drain_bound(config: SchedulerConfig, workloads: int) -> int:
    """How many cycles a drain to a fixed point may run: one that still changes something after
    ten cycles per workload is cut short (and never more than ``config.max_cycles``)."""
    return min(config.max_cycles, 10 * (workloads + 10))


def drain(
    scheduler: Scheduler,
    limit: int,
    *,
    until_quiet: bool,
    after_cycle: Callable[[CycleResult], bool] | None = None,
    merge: bool = True,
) -> tuple[list[AdmissionDecision], int]:
    """The one drain loop: cycles until ``limit`` have run, a cycle changes nothing
    (``until_quiet``), or ``after_cycle(result)`` returns True. Returns every admission made and
    the number of cycles run; :func:`plan_after` turns them into a plan. With ``merge``, cycles
    that only park heads run within one call (:meth:`Scheduler.cycle`): ``after_cycle`` sees
    them as one result (nothing admitted or preempted), and the count is the same; a driver that
    records every cycle's reasons passes False."""
    admitted: list[AdmissionDecision] = []
    ran = 0
    while ran < limit:
        result = scheduler.cycle(limit - ran if merge else 1)
        ran += result.cycles
        admitted += result.admitted
        if after_cycle is not None and after_cycle(result):
            break
        if until_quiet and not result.changed:
            break
    return admitted, ran


def plan_after(
    scheduler: Scheduler,
    admitted: list[AdmissionDecision],
    cycles: int,
    *,
    since: tuple[int, int, int] = (0, 0, 0),
    with_pending: bool = True,
) -> Plan:
    """The plan of a drain: its admissions that still stand, by workload; the preemptions, notes
    and check evictions recorded after ``since`` (their counts when the drain began); the
    reservations held and, with ``with_pending``, the pending workloads now."""
    preempted_from, notes_from, evictions_from = since
    still = [d for d in admitted if scheduler.admitted.get(d.workload) is d]
    return Plan(
        admitted=tuple(sorted(still, key=lambda d: d.workload)),
        preempted=tuple(scheduler.preempted[preempted_from:]),
        pending=tuple(scheduler.pending_decisions()) if with_pending else (),
        cycles=cycles,
        notes=tuple(scheduler.notes[notes_from:]),
        reserved=tuple(scheduler.gate.reserved.values()),
        check_evictions=tuple(scheduler.gate.evictions[evictions_from:]),
    )


def schedule(state: ClusterState, config: SchedulerConfig, now: float, cycles: int | None = 1) -> Plan:
    """Decide on a frozen cluster state.

    ``cycles=N`` runs exactly N Kueue cycles (``1``: one cycle); ``None`` runs until a cycle
    changes nothing (bounded by :func:`drain_bound`). The same input always gives the same plan.
    A driver that lives longer keeps a :class:`gpuplane.core.session.Session`, which drains the
    same way.
    """
    scheduler = Scheduler(state, config, now)
    limit = drain_bound(config, len(state.workloads)) if cycles is None else cycles
    admitted, ran = drain(scheduler, limit, until_quiet=cycles is None)
    return plan_after(scheduler, admitted, ran)
