"""Nomination: a head's flavor assignment and preemption targets (with partial admission), and
what is remembered about nominations: where a flavor scan stopped (Kueue's LastAssignment) and the
outcome that parks a workload of a given shape."""

from __future__ import annotations

from gpuplane.core.flavors import (
    FIT,
    PREEMPT,
    Assignment,
    FlavorAssigner,
)
from gpuplane.core.lifecycle import Reason
from gpuplane.core.preemption import PreemptionContext, Target
from gpuplane.core.quota import (
    ClusterQueueNode,
)
from gpuplane.core.scheduling.state import (
    CycleResult,
    Entry,
    ScanProgress,
    SchedulerState,
    Status,
)
from gpuplane.core.spot import serving_block
from gpuplane.core.workloads import PendingWorkload


class Nomination(SchedulerState):
    """Nominating one head workload."""

    def _inactive_reason(self, cq: ClusterQueueNode) -> str | None:
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

    def nominate(self, pending: PendingWorkload) -> Entry | Status:
        cq = self.tree.queues[pending.cluster_queue]
        inactive = self._inactive_reason(cq)
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
        if self.cluster is not None:
            try:
                for ps in pod_sets:
                    self._needs.of(ps.template)
            except ValueError as err:
                return Status(Reason.MISCONFIGURED, str(err))
        spot_only = serving_block(pending.workload, cq.spec, self.flavors)
        if spot_only is not None:
            return Status(Reason.SPOT_WITHOUT_FALLBACK, spot_only)
        assignment, targets = self._assignments(pending, cq)
        entry = Entry(pending, cq, assignment, targets)
        entry.message = assignment.message()
        entry.reason = assignment.no_fit_reason or Reason.WAITING_FOR_QUOTA
        return entry

    def _targets(
        self, pending: PendingWorkload, cq: ClusterQueueNode, assignment: Assignment
    ) -> list[Target]:
        ctx = PreemptionContext(
            pending, cq, assignment.flavors_needing_preemption(), assignment.quota_requests(pending)
        )
        return self.preemptor.get_targets(ctx)

    def _assignments(
        self, pending: PendingWorkload, cq: ClusterQueueNode, nominated: list[dict[str, str]] | None = None
    ) -> tuple[Assignment, list[Target]]:
        start = None if nominated is not None else self._scan_start(pending.key, cq)
        assigner = FlavorAssigner(
            pending,
            cq,
            self.flavors,
            self.preemptor,
            self.config,
            nominated=nominated,
            start=start,
            eligibility=self._eligibility,
        )
        full = assigner.assign()
        mode = full.mode()
        if mode == FIT:
            return full, []
        if mode == PREEMPT:
            targets = self._targets(pending, cq, full)
            if targets:
                return full, targets
        pod_sets = pending.workload.pod_sets
        deltas = [ps.count - (ps.count if ps.min_count is None else ps.min_count) for ps in pod_sets]
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
                targets = self._targets(pending, cq, partial)
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

    def _scan_start(self, key: str, cq: ClusterQueueNode) -> dict[tuple[int, str], int] | None:
        """Where the flavor scan resumes, or None to start over (lastAssignmentOutdated)."""
        progress = self.scan.get(key)
        if progress is None:
            return None
        recent = self.config.preserve_scan_progress and self.cycle_number - progress.cycle <= 1
        if not recent and self._generation(cq.name) > progress.generation:
            del self.scan[key]
            return None
        return progress.tried

    def _remember_scan(self, e: Entry, generation: int, result: CycleResult) -> bool:
        """Record where the entry's scan stopped; True when flavors are left to try next cycle."""
        if not e.keep_scan:
            self.scan.pop(e.pending.key, None)
            return False
        progress = ScanProgress(self.cycle_number, generation, e.assignment.scan_progress())
        self.scan[e.pending.key] = progress
        if progress.pending_flavors:
            result.rescans += 1
            return True
        return False
