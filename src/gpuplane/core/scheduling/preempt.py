"""Preemption in the cycle: evicting the victims an entry chose (they are requeued), recomputing an
assignment whose targets overlap another entry's, and the quota held for a preemption to come."""

from __future__ import annotations

from collections.abc import Mapping

from gpuplane.core.flavors import (
    FIT,
)
from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import (
    PreemptionDecision,
)
from gpuplane.core.preemption import Target
from gpuplane.core.quota import (
    AdmittedWorkload,
)
from gpuplane.core.scheduling.nominate import Nomination
from gpuplane.core.scheduling.queues import Queues
from gpuplane.core.scheduling.state import (
    CycleResult,
    CycleWork,
    Entry,
    Status,
)
from gpuplane.core.workloads import PendingWorkload


class Preemption(Queues, Nomination):
    """Carrying out and holding room for preemptions."""

    def _evict(self, target: Target, preemptor: str, result: CycleResult) -> None:
        victim: AdmittedWorkload = target.workload
        decision = PreemptionDecision(
            workload=victim.key,
            cluster_queue=victim.cluster_queue,
            preemptor=preemptor,
            reason=target.reason,
            cycle=self.cycle_number,
        )
        if not victim.evicted:
            # An already evicted target is still on its way out: no new preemption.
            result.preempted.append(decision)
            self.preempted.append(decision)
        self.tree.remove_workload(victim)
        self._bump_generation(victim.cluster_queue)
        self.state_version += 1
        if self.cluster is not None:
            self.cluster.release(victim.key)
        self.admitted.pop(victim.key, None)
        self._unpark_cohort(victim.cluster_queue, victim.flavors)
        wl = self.workloads.get(victim.key)
        if wl is not None and wl.queue_name:
            evicted_at = self.now + self.cycle_number * 1e-3
            self._sequence += 1
            lq = self.state.local_queues.get(f"{wl.namespace}/{wl.queue_name}")
            if lq is not None and lq.cluster_queue in self.queues and lq.stop_policy == "None":
                self._insert(
                    PendingWorkload(wl, lq.cluster_queue, lq.key, victim.priority, evicted_at, self._sequence)
                )
                self.status[wl.key] = Status(
                    Reason.QUEUED, f"Preempted by {preemptor} ({target.reason}); requeued"
                )

    def _recompute_after_overlap(self, e: Entry, victims: Mapping[str, Target]) -> bool:
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
            e.assignment, e.targets = self._assignments(e.pending, e.cq, nominated)
        self.preemptor.clear_cache()
        e.message = e.assignment.message()
        e.reason = e.assignment.no_fit_reason or Reason.WAITING_FOR_QUOTA
        return e.assignment.mode() == FIT

    def _wait_after_overlap(self, e: Entry, work: CycleWork) -> None:
        """Fits once the other entries' victims are gone: wait for them, holding the quota."""
        e.reason, e.message, e.requeue_now = (
            Reason.WAITING_FOR_PREEMPTED,
            "Workload has overlapping preemption targets with another workload, "
            "but will fit after these preemptions complete",
            True,
        )
        work.reserve(e.cq, dict(e.assignment.usage))
        e.keep_scan = False

    def _resources_to_reserve(self, e: Entry) -> dict[tuple[str, str], int]:
        cq = e.cq
        out: dict[tuple[str, str], int] = {}
        for fr, usage in e.assignment.usage.items():
            quota = cq.quota_for(fr)
            used = cq.usage.get(fr, 0)
            if e.assignment.borrowing > 0:
                if quota.borrowing_limit is None:
                    reserved = usage
                else:
                    reserved = min(usage, quota.nominal + quota.borrowing_limit - used)
            else:
                reserved = min(usage, quota.nominal - used)
            out[fr] = max(0, reserved)
        return out
