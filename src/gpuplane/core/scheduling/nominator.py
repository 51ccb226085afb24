"""Nomination: a head's flavor assignment and preemption targets (with partial admission), where a
flavor scan stopped (Kueue's LastAssignment), the scan's next flavors after a placement failure, and
the assignment recomputed when an entry's targets overlap another's."""

from __future__ import annotations

from collections.abc import Mapping

from gpuplane.core.check_gate import CheckGate
from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import (
    FIT,
    NO_FIT,
    PREEMPT,
    Assignment,
    EligibilityMemo,
    FlavorAssigner,
)
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.devices import NeedsMemo
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.quota import ClusterQueueNode, QuotaTree
from gpuplane.core.scheduling.state import (
    CycleResult,
    Entry,
    Ledger,
    ScanProgress,
    StateMemo,
    Status,
)
from gpuplane.core.spot import serving_block
from gpuplane.core.victims import PreemptionContext, Target
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import ClusterState, ResourceFlavor

ScanKey = tuple[tuple[tuple[int, str], int], ...]


class Nominator:
    """Nominates one head workload at a time. Owns each workload's flavor scan progress (``scan``),
    per ClusterQueue why it is inactive (read once: the state and flavors are fixed), and the
    assignments found without preemption targets by shape and scan start (``known``), valid while
    the ledger's ``state_version`` and clock stay the same."""

    def __init__(  # noqa: PLR0913, PLR0917 - the parts a nomination reads, each passed in
        self,
        state: ClusterState,
        config: SchedulerConfig,
        ledger: Ledger,
        flavors: dict[str, ResourceFlavor],
        preemptor: Preemptor,
        gate: CheckGate,
        needs: NeedsMemo,
        eligibility: EligibilityMemo,
        *,
        has_nodes: bool,
    ) -> None:
        self.state = state
        self.config = config
        self.ledger = ledger
        self.tree: QuotaTree = ledger.tree
        self.flavors = flavors
        self.preemptor = preemptor
        self.gate = gate
        self.needs = needs
        self.eligibility = eligibility
        self.has_nodes = has_nodes
        self.scan: dict[str, ScanProgress] = {}
        self._inactive: dict[str, str | None] = {}
        self._known: StateMemo[tuple[int, ScanKey], Assignment] = StateMemo(ledger, clock=True)

    def known(self) -> dict[tuple[int, ScanKey], Assignment]:
        """The assignments found on the present state, by the workload's shape and where its scan
        started. An assignment reads the quota tree, the nodes' flavors and (through the
        preemption it simulates) the clock, never who asks beyond its shape: two workloads of one
        shape whose scans start alike get the same one until the state changes. Only those with
        no preemption targets are kept (targets are the workload's own victims)."""
        return self._known.entries()

    def inactive_reason(self, cq: ClusterQueueNode) -> str | None:
        """Why Kueue's cache keeps the queue inactive (``Stopped``, ``FlavorNotFound``), if it does
        (read once per queue: the state and the flavors are fixed for the scheduler's life)."""
        if cq.name in self._inactive:
            return self._inactive[cq.name]
        reason = self._inactive_of(cq)
        self._inactive[cq.name] = reason
        return reason

    def _inactive_of(self, cq: ClusterQueueNode) -> str | None:
        if cq.spec.stop_policy != "None":
            return f"ClusterQueue {cq.name} is inactive: Stopped ({cq.spec.stop_policy})"
        missing = sorted({f.name for g in cq.spec.resource_groups for f in g.flavors} - set(self.flavors))
        if missing:
            return f"ClusterQueue {cq.name} is inactive: FlavorNotFound ({', '.join(missing)})"
        return self.gate.inactive_reason(cq.spec)

    def nominate(self, pending: PendingWorkload, shape: int | None = None) -> Entry | Status:
        """The head's entry, or why it cannot be nominated. ``shape`` (:meth:`.shapes.Shapes.of`),
        where given, lets a nomination on the cycle's starting state reuse the assignment another
        workload of that shape got on the same state (:meth:`known`)."""
        cq = self.tree.queues[pending.cluster_queue]
        inactive = self.inactive_reason(cq)
        if inactive is not None:
            return Status(Reason.SUSPENDED, inactive)
        ns = self.state.namespaces.get(pending.workload.namespace)
        labels = ns.labels if ns is not None else {}
        selector = cq.spec.namespace_selector
        if selector is not None and not selector.matches(labels):
            return Status(Reason.NAMESPACE_MISMATCH, "Workload namespace doesn't match ClusterQueue selector")
        pod_sets = pending.workload.pod_sets
        if any(ps.template.limits_below_requests for ps in pod_sets):
            bad = sorted({r for ps in pod_sets for r in ps.template.limits_below_requests})
            msg = f"resources validation failed: requests exceed limits for {', '.join(bad)}"
            return Status(Reason.MISCONFIGURED, msg)
        if self.has_nodes:
            try:
                for ps in pod_sets:
                    self.needs.of(ps.template)
            except ValueError as err:
                return Status(Reason.MISCONFIGURED, str(err))
        spot_only = serving_block(pending.workload, cq.spec, self.flavors)
        if spot_only is not None:
            return Status(Reason.SPOT_WITHOUT_FALLBACK, spot_only)
        assignment, targets = self.assignments(pending, cq, shape=shape)
        entry = Entry(pending, cq, assignment, targets, shape=shape)
        entry.message = assignment.message()
        entry.reason = assignment.no_fit_reason or Reason.WAITING_FOR_QUOTA
        return entry

    def targets(self, pending: PendingWorkload, cq: ClusterQueueNode, assignment: Assignment) -> list[Target]:
        ctx = PreemptionContext(
            pending, cq, assignment.flavors_needing_preemption(), assignment.quota_requests(pending)
        )
        return self.preemptor.get_targets(ctx)

    def assignments(
        self,
        pending: PendingWorkload,
        cq: ClusterQueueNode,
        nominated: list[dict[str, str]] | None = None,
        *,
        shape: int | None = None,
    ) -> tuple[Assignment, list[Target]]:
        start = None if nominated is not None else self.scan_start(pending.key, cq)
        if shape is None or nominated is not None:
            return self._assignments(pending, cq, nominated, start)
        known = self.known()
        memo = (shape, _scan_key(start))
        assignment = known.get(memo)
        if assignment is not None:
            return assignment, []
        assignment, targets = self._assignments(pending, cq, nominated, start)
        if not targets:
            known[memo] = assignment
        return assignment, targets

    def _assignments(
        self,
        pending: PendingWorkload,
        cq: ClusterQueueNode,
        nominated: list[dict[str, str]] | None,
        start: Mapping[tuple[int, str], int] | None,
    ) -> tuple[Assignment, list[Target]]:
        assigner = FlavorAssigner(
            pending,
            cq,
            self.flavors,
            self.preemptor,
            self.config,
            nominated=nominated,
            start=start,
            eligibility=self.eligibility,
        )
        full = assigner.assign()
        mode = full.mode()
        if mode == FIT:
            return full, []
        if mode == PREEMPT:
            targets = self.targets(pending, cq, full)
            if targets:
                return full, targets
        pod_sets = pending.workload.pod_sets
        deltas = _partial_deltas(pending)
        total = sum(deltas)
        if not self.config.partial_admission or total == 0:
            return full, []
        found: dict[int, tuple[Assignment, list[Target]]] = {}

        def fits(step: int) -> bool:
            counts = [ps.count - d * step // total for ps, d in zip(pod_sets, deltas, strict=True)]
            partial = assigner.assign(counts)
            pmode = partial.mode()
            if pmode == FIT:
                found[step] = (partial, [])
                return True
            if pmode == PREEMPT:
                targets = self.targets(pending, cq, partial)
                if targets:
                    found[step] = (partial, targets)
                    return True
            return False

        lo, hi = 0, total + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        if lo <= total and lo in found:
            return found[lo]
        return full, []

    def scan_start(self, key: str, cq: ClusterQueueNode) -> dict[tuple[int, str], int] | None:
        """Where the flavor scan resumes, or None to start over (lastAssignmentOutdated)."""
        progress = self.scan.get(key)
        if progress is None:
            return None
        recent = self.config.preserve_scan_progress and self.ledger.cycle_number - progress.cycle <= 1
        if not recent and self.ledger.generation_of(cq.name) > progress.generation:
            del self.scan[key]
            return None
        return progress.tried

    def remember_scan(self, e: Entry, generation: int, result: CycleResult) -> bool:
        """Record where the entry's scan stopped; True when flavors are left to try next cycle."""
        if not e.keep_scan:
            self.scan.pop(e.pending.key, None)
            return False
        progress = ScanProgress(self.ledger.cycle_number, generation, e.assignment.scan_progress())
        self.scan[e.pending.key] = progress
        if progress.pending_flavors:
            result.rescans += 1
            return True
        return False

    def next_flavors(self, e: Entry) -> bool:
        """After a placement failure, go on with the flavor scan in the same cycle.

        Quota alone chose the flavor; the nodes of that flavor cannot hold the gang. As with
        Kueue's topology-aware flavor assignment, a flavor whose nodes do not fit is passed over
        and the next one tried at once. Waiting a cycle instead lets others take what the next
        flavor has free, a preemptor's freed room included: its victim, requeued, takes it back,
        and is preempted again at the same instant. Returns True when ``e`` now holds the
        assignment (and targets) of a later flavor that fits or can preempt.
        """
        progress = e.assignment.scan_progress()
        if not e.keep_scan or not self.config.flavor_fungibility:
            return False
        if not any(index != -1 for index in progress.values()):
            return False
        # On the cycle's starting state (nothing before the entry in the cycle changed the tree),
        # the scan from ``progress`` is what a nomination resuming there gets, when it would try
        # no partial admission after it: one :meth:`known` assignment serves both.
        memo = None
        if e.shape is not None and e.decided_alone and not self._partial(e.pending):
            memo = (e.shape, _scan_key(progress))
        assignment = None if memo is None else self.known().get(memo)
        if assignment is None:
            assigner = FlavorAssigner(
                e.pending,
                e.cq,
                self.flavors,
                self.preemptor,
                self.config,
                start=progress,
                eligibility=self.eligibility,
            )
            assignment = assigner.assign()
            targets = self.targets(e.pending, e.cq, assignment) if assignment.mode() == PREEMPT else []
            if memo is not None and not targets:
                self.known()[memo] = assignment
        else:
            targets = []  # known assignments have none
        mode = assignment.mode()
        if mode == NO_FIT or (mode == PREEMPT and not targets):
            return False  # requeued: the scan resumes from ``progress`` next cycle
        e.assignment, e.targets = assignment, targets
        e.message = assignment.message()
        e.reason = assignment.no_fit_reason or Reason.WAITING_FOR_QUOTA
        return True

    def _partial(self, pending: PendingWorkload) -> bool:
        """Whether a nomination of ``pending`` would try a partial admission after a full one."""
        return self.config.partial_admission and sum(_partial_deltas(pending)) > 0

    def recompute_after_overlap(self, e: Entry, victims: Mapping[str, Target]) -> bool:
        """Kueue's updateAssignmentIfNeeded for overlapping targets.

        The assignment is computed again on the flavors it was nominated with, as if the victims
        of earlier entries were already gone. Returns True for a deferred fit: the workload fits
        once those preemptions complete, and must not be admitted in this cycle.
        """
        nominated = [{r: c.flavor for r, c in ps.flavors.items()} for ps in e.assignment.pod_sets]
        if len(nominated) != len(e.pending.workload.pod_sets):
            return False
        self.preemptor.clear_cache()
        with self.tree.without([t.workload for t in victims.values()]):
            e.assignment, e.targets = self.assignments(e.pending, e.cq, nominated)
        self.preemptor.clear_cache()
        e.message = e.assignment.message()
        e.reason = e.assignment.no_fit_reason or Reason.WAITING_FOR_QUOTA
        return e.assignment.mode() == FIT


def _partial_deltas(pending: PendingWorkload) -> list[int]:
    """Per pod set, how many pods a partial admission may leave out (its count less its minimum)."""
    pod_sets = pending.workload.pod_sets
    return [ps.count - (ps.count if ps.min_count is None else ps.min_count) for ps in pod_sets]


def _scan_key(start: Mapping[tuple[int, str], int] | None) -> ScanKey:
    """Where a flavor scan starts, as a key: a resource whose scan went past its last flavor (-1)
    starts at the first, as one with no start does."""
    return tuple(sorted(item for item in start.items() if item[1] != -1)) if start else ()
