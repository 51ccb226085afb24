"""One entry's outcome in a cycle, against what the entries before it hold: no fit, quota held for
a preemption to come, waiting for overlapping victims, no longer fits, no place on the nodes (the
next flavor is tried at once), or fit."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from gpuplane.core.check_gate import CheckGate
from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import FIT, NO_FIT, PREEMPT
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.gangs import PlacementFailure
from gpuplane.core.quota import QuotaTree
from gpuplane.core.scheduling.nominator import Nominator
from gpuplane.core.scheduling.placer import NodePlacer
from gpuplane.core.scheduling.state import CycleWork, Entry, classical_key
from gpuplane.core.victims import Target


class Decider:
    """Decides each entry of a cycle in turn, recording what it holds in the cycle's
    :class:`CycleWork`. Owns no state between entries: the work is the cycle's."""

    def __init__(
        self,
        config: SchedulerConfig,
        tree: QuotaTree,
        nominator: Nominator,
        placer: NodePlacer,
        gate: CheckGate,
    ) -> None:
        self.config = config
        self.tree = tree
        self.nominator = nominator
        self.placer = placer
        self.gate = gate

    def process(self, e: Entry, work: CycleWork) -> None:
        """Decide one entry against what the entries before it in the cycle hold (``work``)."""
        cq = e.cq
        e.decided_alone = not work.reservations and not work.victims
        deferred = False
        if self.config.recompute_on_overlap and any(t.workload.key in work.victims for t in e.targets):
            deferred = self.nominator.recompute_after_overlap(e, work.victims)
        mode = e.assignment.mode()
        if mode == NO_FIT:
            return
        if mode == PREEMPT and not e.targets:
            if cq.spec.preemption.reclaim_within_cohort != "Any":
                e.decided_alone = False
                work.reserve(cq, resources_to_reserve(e))
            return
        if deferred:
            self._wait_after_overlap(e, work)
            return
        blocked = self._blocked(e, work.victims)
        if blocked is not None:
            e.reason, e.message, e.requeue_now = Reason.WAITING_FOR_QUOTA, blocked, True
            e.keep_scan = self.config.preserve_scan_progress
            return
        if (
            self.placer.cluster is not None
            and not self.gate.dispatched_elsewhere(self.checks_for(e))
            and not self._placed(e, mode, work)
        ):
            return
        usage = e.assignment.usage
        for t in e.targets:
            work.victims[t.workload.key] = t
            work.victim_preemptor[t.workload.key] = e.pending.key
        work.reserve(cq, dict(usage))
        if mode == PREEMPT:
            e.keep_scan = False  # markPreemptionOutcome: every flavor again once victims are gone
            e.reason = Reason.WAITING_FOR_PREEMPTED
            e.message = (
                e.message + ". " if e.message else ""
            ) + f"Pending the preemption of {len(e.targets)} workload(s)"
            e.requeue_now = True
            return
        work.admitted.append(e)

    def _blocked(self, e: Entry, victims: Mapping[str, Target]) -> str | None:
        """Why quota an earlier entry took keeps this one out of the cycle, or None when it fits."""
        if any(t.workload.key in victims for t in e.targets):
            return "Workload has overlapping preemption targets with another workload"
        if not victims and not e.targets:  # nothing to take out of the tree (most entries)
            fits = e.cq.fits(e.assignment.usage)
        else:
            removed = [t.workload for t in victims.values()] + [t.workload for t in e.targets]
            usage = e.assignment.usage
            with self.tree.without_usage_of(removed, usage):  # the fit reads these alone
                fits = e.cq.fits(usage)
        return None if fits else "Workload no longer fits after processing another workload"

    def _placed(self, e: Entry, mode: int, work: CycleWork) -> bool:
        """Place the entry's gang (a probe when it preempts). False when the entry has no place and
        is done with in this cycle: it waits, or went on to a later flavor (processed again)."""
        # An entry decided alone with a known assignment finds the nodes as the cycle found them.
        recall = mode == FIT and e.decided_alone and e.shape is not None
        placed = self.placer.placement_for(e, probe=mode == PREEMPT, recall=recall)
        if isinstance(placed, PlacementFailure):
            if not self.checks_for(e):
                e.reason, e.message = placed.reason, placed.message + self.placer.to_come(e)
                if self.nominator.next_flavors(e) and not self._put_back(e, work):
                    self.process(e, work)
                return False
            # Quota without a place: the admission checks (provisioning) bring the place.
        elif mode == FIT:
            e.placement = placed
        return True

    def _put_back(self, e: Entry, work: CycleWork) -> bool:
        """Put ``e``, which moved on to a later flavor, back among the entries yet to process
        when one of them now comes before it (classical order only); True when it was.

        Kueue orders a cycle's entries by the assignments they were nominated with, and checks
        topology-aware placement while it assigns flavors, before that order is made. Here quota
        alone picks the nominated flavor and the nodes are asked when the entry's turn comes, so
        an entry that passes over a flavor takes the place the later flavor's assignment gives it
        (its borrowing may differ), as if it had been nominated there. Without this, an entry
        that borrows nothing on its first flavor but borrows on the next went first, took room
        there that it could only borrow, and was reclaimed at once by the preemptor it overtook;
        requeued, it overtook it again, at every cycle of the instant.
        """
        later = work.later
        if not later:
            return False
        key = classical_key(e, self.config.priority_sorting_within_cohort)
        if key < later[0][0]:
            return False
        heapq.heappush(later, (key, e))
        return True

    def checks_for(self, e: Entry) -> tuple[str, ...]:
        if not e.cq.spec.admission_checks:  # none apply whatever the flavors (most queues)
            return ()
        flavors = {c.flavor for ps in e.assignment.pod_sets for c in ps.flavors.values()}
        return self.gate.required(e.cq.spec, flavors)

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


def resources_to_reserve(e: Entry) -> dict[tuple[str, str], int]:
    """What an entry that must preempt but has no targets holds for the preemption to come: its
    usage, up to what its queue may still use (nominal quota, plus the borrowing limit when it
    borrows)."""
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
