"""One scheduling cycle, driving the scheduler's parts::

heads (one per ClusterQueue) -> nominate (flavors, preemption targets)
    -> order (classical or fair sharing) -> decide each entry
    -> admit the winners, evict their victims -> record the others' outcomes
"""

from __future__ import annotations

import heapq

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import AdmissionDecision, PodPlacement, PodSetDecision
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.scheduling.decider import Decider
from gpuplane.core.scheduling.evictor import Evictor
from gpuplane.core.scheduling.fair_order import FairOrder
from gpuplane.core.scheduling.nominator import Nominator
from gpuplane.core.scheduling.queue_manager import QueueManager
from gpuplane.core.scheduling.reservations import CheckedReservations
from gpuplane.core.scheduling.shapes import Shapes
from gpuplane.core.scheduling.state import (
    CycleResult,
    CycleWork,
    Entry,
    Ledger,
    StateMemo,
    Status,
    classical_key,
)
from gpuplane.core.workloads import usage_from_assignment


class Cycle:
    """Runs cycles over the parts it is given. Owns the nomination outcomes that parked a workload,
    by shape, valid while the ledger's ``state_version`` stays the same (``failed``, a
    :class:`StateMemo` that ignores the clock), and whether every ClusterQueue is BestEffortFIFO."""

    def __init__(  # noqa: PLR0913, PLR0917 - the parts a cycle drives, each passed in
        self,
        config: SchedulerConfig,
        ledger: Ledger,
        queues: QueueManager,
        shapes: Shapes,
        nominator: Nominator,
        decider: Decider,
        evictor: Evictor,
        reservations: CheckedReservations,
        preemptor: Preemptor,
    ) -> None:
        self.config = config
        self.ledger = ledger
        self.tree = ledger.tree
        self.queues = queues
        self.shapes = shapes
        self.nominator = nominator
        self.decider = decider
        self.evictor = evictor
        self.reservations = reservations
        self.preemptor = preemptor
        self.fair_order = FairOrder(config)
        self.failed: StateMemo[int, Status] = StateMemo(ledger, clock=False)
        self._all_best_effort: bool | None = None  # see best_effort_only

    def run(self, budget: int = 1) -> CycleResult:
        """Run one scheduling cycle and apply its outcome (see :meth:`Scheduler.cycle`)."""
        ledger, queues = self.ledger, self.queues
        ledger.cycle_number += 1
        result = CycleResult()
        if ledger.cycle_number == 1:
            self.reservations.settle(result)
        while True:
            # Each head's cohort generation as the cycle starts (nothing before the admissions
            # moves it).
            generations: dict[str, int] = {}
            self.preemptor.clear_cache()
            parked = result.parked
            entries, shapes = self.nominate_heads(result, generations)
            if (
                entries
                or result.cycles >= budget
                or ledger.cycle_number == 1
                or result.parked == parked
                or not self.best_effort_only()
            ):
                break
            queues.preemptor_of = {}  # what record_outcomes leaves after a cycle without entries
            if not queues.any_head():
                break
            ledger.cycle_number += 1
            result.cycles += 1
        if entries:  # nothing to decide otherwise (and nothing searched the preemptor's cache)
            self.decide(entries, result)
        self.record_outcomes(entries, shapes, generations, result)
        if ledger.cycle_number == 1:
            self.reservations.release_leaving(result)
        return result

    def best_effort_only(self) -> bool:
        """Whether every ClusterQueue is BestEffortFIFO (a StrictFIFO head is never parked)."""
        if self._all_best_effort is None:
            self._all_best_effort = all(
                node.spec.queueing_strategy != "StrictFIFO" for node in self.tree.queues.values()
            )
        return self._all_best_effort

    def nominate_heads(
        self, result: CycleResult, generations: dict[str, int]
    ) -> tuple[list[Entry], dict[str, int]]:
        """Nominate each queue's head; those that cannot be nominated are parked. Returns the
        entries and, for the heads nominated afresh, their shapes; ``generations`` gets each
        visited head's cohort generation."""
        entries: list[Entry] = []
        ledger, queues, failed = self.ledger, self.queues, self.failed.entries()
        shapes: dict[str, int] = {}
        status, scan, park = queues.status, self.nominator.scan, queues.park
        shape_of, nominate = self.shapes.of, self.nominator.nominate
        for pending in queues.heads():
            if pending.cluster_queue not in generations:
                generations[pending.cluster_queue] = ledger.generation_of(pending.cluster_queue)
            # A workload whose flavor scan is under way resumes where it stopped, which its
            # shape does not capture: only scans that start at the first flavor are remembered.
            progress = scan.get(pending.key)
            fresh = progress is None or not progress.pending_flavors
            shape = shape_of(pending)
            if shape is not None and fresh:
                known = failed.get(shape)
                if known is not None:
                    status[pending.key] = Status(known.reason, known.message)
                    park(pending, result)
                    continue
                shapes[pending.key] = shape
            # The shape, with where the scan resumes, also finds an assignment another workload
            # of the shape got on this state (Nominator.known).
            nominated = nominate(pending, shape)
            if isinstance(nominated, Status):
                status[pending.key] = nominated
                if shape is not None and fresh:
                    failed[shape] = nominated
                park(pending, result)
                continue
            entries.append(nominated)
        return entries, shapes

    def decide(self, entries: list[Entry], result: CycleResult) -> None:
        """Try the entries in order, then admit the winners and evict their victims."""
        work = CycleWork()
        process = self.decider.process
        self.preemptor.forget_no_room()  # the entries' reservations change the tree from here
        if self.config.fair_sharing:
            for e in self.fair_order.order(entries):
                process(e, work)
        else:
            # A heap, not a sorted list: an entry that moves on to a later flavor may be put
            # back by that flavor's key (Decider._put_back).
            sorting = self.config.priority_sorting_within_cohort
            later = work.later = [(classical_key(e, sorting), e) for e in entries]
            heapq.heapify(later)
            while later:
                process(heapq.heappop(later)[1], work)
        for cq, usage in reversed(work.reservations):
            cq.remove_usage_map(usage)
        self.preemptor.clear_cache()
        for e in work.admitted:
            self.admit(e, result)
        for key, target in work.victims.items():
            self.evictor.evict_victim(target, work.victim_preemptor[key], result)

    def record_outcomes(
        self,
        entries: list[Entry],
        shapes: dict[str, int],
        generations: dict[str, int],
        result: CycleResult,
    ) -> None:
        """Each entry not admitted keeps its reason; it is requeued at once or parked."""
        queues, admitted, cycle_number = self.queues, self.ledger.admitted, self.ledger.cycle_number
        preemptor_of: dict[str, str] = {}
        queues.preemptor_of = preemptor_of
        status = queues.status
        for e in entries:
            if e.pending.key in admitted and admitted[e.pending.key].cycle == cycle_number:
                continue
            outcome = Status(Reason(e.reason), e.message)
            status[e.pending.key] = outcome
            if e.reason == Reason.WAITING_FOR_PREEMPTED:
                preemptor_of[e.pending.cluster_queue] = e.pending.key
            # A workload with flavors left to scan is requeued at once (PendingFlavors).
            rescan = self.nominator.remember_scan(e, generations[e.pending.cluster_queue], result)
            if not e.requeue_now and not rescan:
                queues.park(e.pending, result)
                shape = shapes.get(e.pending.key)
                if shape is not None and e.decided_alone:
                    # Parked on the cycle's starting state alone, with no effect on the
                    # others: a workload of the same shape meets the same outcome until
                    # the state changes (the cycle's starting state: gone already if the
                    # cycle admitted or preempted).
                    self.failed.as_checked()[shape] = Status(outcome.reason, e.message)

    def admit(self, e: Entry, result: CycleResult) -> None:
        """Admit an entry: it holds its quota, leaves its queue and is recorded."""
        pending, ledger = e.pending, self.ledger
        flavors = frozenset(
            (choice.flavor, res) for ps in e.assignment.pod_sets for res, choice in ps.flavors.items()
        )
        held = usage_from_assignment(pending, e.assignment.usage, flavors, ledger.now)
        self.tree.add_workload(held)
        ledger.bump_generation(pending.cluster_queue)
        self.nominator.scan.pop(pending.key, None)
        ledger.state_version += 1
        self.shapes.forget(pending.key)
        self.queues.remove_admitted(pending)
        decision = AdmissionDecision(
            workload=pending.key,
            cluster_queue=pending.cluster_queue,
            pod_sets=tuple(
                PodSetDecision(
                    name=ps.name,
                    count=ps.count,
                    flavors={r: c.flavor for r, c in sorted(ps.flavors.items())},
                    placement=_placements(e, ps.name),
                )
                for ps in e.assignment.pod_sets
            ),
            cycle=ledger.cycle_number,
            checks=self.decider.checks_for(e),
        )
        ledger.admitted[pending.key] = decision
        result.admitted.append(decision)


def _placements(e: Entry, pod_set: str) -> tuple[PodPlacement, ...] | None:
    if e.placement is None:
        return None
    return tuple(
        PodPlacement(p.node, tuple(g.describe() for g in p.grants), claims=p.claims)
        for p in e.placement.pods.get(pod_set, [])
    )
