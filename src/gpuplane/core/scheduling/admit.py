"""Admission: one entry's outcome in a cycle (no fit, reserve, wait for victims, no longer fits,
no place on the nodes, fit), the admission itself, and Kueue's admission checks (quota reserved while
checks are pending; Retry and Rejected end a reservation)."""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from gpuplane.core.admission_checks import Verdict
from gpuplane.core.flavors import (
    FIT,
    NO_FIT,
    PREEMPT,
    FlavorAssigner,
)
from gpuplane.core.gang import GangPlacement, PlacementFailure
from gpuplane.core.karpenter import capacity_to_come
from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import (
    AdmissionDecision,
    PodPlacement,
    PodSetDecision,
)
from gpuplane.core.preemption import Target
from gpuplane.core.scheduling.nodes import NodePlacement
from gpuplane.core.scheduling.preempt import Preemption
from gpuplane.core.scheduling.state import (
    CycleResult,
    CycleWork,
    Entry,
    Status,
    classical_key,
)
from gpuplane.core.workloads import admitted_usage, queue_position, usage_from_assignment
from gpuplane.model.admission_checks import CheckState, CheckStatus
from gpuplane.model.objects import Workload


class Admission(Preemption, NodePlacement):
    """Deciding and committing each entry of a cycle."""

    def _process(self, e: Entry, work: CycleWork) -> None:
        """Decide one entry against what the entries before it in the cycle hold (``work``)."""
        cq = e.cq
        e.decided_alone = not work.reservations and not work.victims
        deferred = False
        if self.config.recompute_on_overlap and any(t.workload.key in work.victims for t in e.targets):
            deferred = self._recompute_after_overlap(e, work.victims)
        mode = e.assignment.mode()
        if mode == NO_FIT:
            return
        if mode == PREEMPT and not e.targets:
            if cq.spec.preemption.reclaim_within_cohort != "Any":
                e.decided_alone = False
                work.reserve(cq, self._resources_to_reserve(e))
            return
        if deferred:
            self._wait_after_overlap(e, work)
            return
        blocked = self._blocked(e, work.victims)
        if blocked is not None:
            e.reason, e.message, e.requeue_now = Reason.WAITING_FOR_QUOTA, blocked, True
            e.keep_scan = self.config.preserve_scan_progress
            return
        if self.cluster is not None and not self._placed(e, mode, work):
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
            with self.tree.without(removed):
                fits = e.cq.fits(e.assignment.usage)
        return None if fits else "Workload no longer fits after processing another workload"

    def _placed(self, e: Entry, mode: int, work: CycleWork) -> bool:
        """Place the entry's gang (a probe when it preempts). False when the entry has no place and
        is done with in this cycle: it waits, or went on to a later flavor (processed again)."""
        placed = self._placement_for(e, probe=mode == PREEMPT)
        if isinstance(placed, PlacementFailure):
            if not self._checks_for(e):
                e.reason, e.message = placed.reason, placed.message + self._to_come(e)
                if self._next_flavors_now(e) and not self._put_back(e, work):
                    self._process(e, work)
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

    def _next_flavors_now(self, e: Entry) -> bool:
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
        assigner = FlavorAssigner(
            e.pending,
            e.cq,
            self.flavors,
            self.preemptor,
            self.config,
            start=progress,
            eligibility=self._eligibility,
        )
        assignment = assigner.assign()
        mode = assignment.mode()
        if mode == NO_FIT:
            return False
        targets = self._targets(e.pending, e.cq, assignment) if mode == PREEMPT else []
        if mode == PREEMPT and not targets:
            return False
        e.assignment, e.targets = assignment, targets
        e.message = assignment.message()
        e.reason = assignment.no_fit_reason or Reason.WAITING_FOR_QUOTA
        return True

    def _admit(self, e: Entry, result: CycleResult) -> None:
        pending = e.pending
        flavors = frozenset(
            (choice.flavor, res) for ps in e.assignment.pod_sets for res, choice in ps.flavors.items()
        )
        held = usage_from_assignment(pending, e.assignment.usage, flavors, self.now)
        self.tree.add_workload(held)
        self._bump_generation(pending.cluster_queue)
        self.scan.pop(pending.key, None)
        self.state_version += 1
        self._shapes.pop(pending.key, None)
        self._eligible.pop(pending.key, None)
        queue = self.queues[pending.cluster_queue]
        index = queue_position(queue, pending)
        del queue[index]
        if index < self.cursor[pending.cluster_queue]:
            self.cursor[pending.cluster_queue] -= 1
        self.parked.discard(pending.key)
        self.status.pop(pending.key, None)
        decision = AdmissionDecision(
            workload=pending.key,
            cluster_queue=pending.cluster_queue,
            pod_sets=tuple(
                PodSetDecision(
                    name=ps.name,
                    count=ps.count,
                    flavors={r: c.flavor for r, c in sorted(ps.flavors.items())},
                    placement=self._placements(e, ps.name),
                )
                for ps in e.assignment.pod_sets
            ),
            cycle=self.cycle_number,
            checks=self._checks_for(e),
        )
        self.admitted[pending.key] = decision
        result.admitted.append(decision)

    def _placements(self, e: Entry, pod_set: str) -> tuple[PodPlacement, ...] | None:
        if e.placement is None:
            return None
        return tuple(
            PodPlacement(p.node, tuple(g.describe() for g in p.grants))
            for p in e.placement.pods.get(pod_set, [])
        )

    def _checks_for(self, e: Entry) -> tuple[str, ...]:
        if not e.cq.spec.admission_checks:  # none apply whatever the flavors (most queues)
            return ()
        flavors = {c.flavor for ps in e.assignment.pod_sets for c in ps.flavors.values()}
        return self.gate.required(e.cq.spec, flavors)

    def _to_come(self, e: Entry) -> str:
        """What may still bring a place: the flavor's warm buffer, and what Karpenter NodePools
        can still launch for it."""
        ps = e.assignment.pod_sets[0]
        resource = self._needs.device_resource(e.pending.workload.pod_sets[0].template)
        choice = ps.flavors.get(resource)
        flavor = self.flavors.get(choice.flavor) if choice is not None else None
        warm = (
            f"; warm buffer of flavor {flavor.name}: {flavor.warm_nodes} node(s)"
            if flavor and flavor.warm_nodes
            else ""
        )
        if not self.state.node_pools:
            return warm
        pools = capacity_to_come(self.state.node_pools, flavor, self.state.nodes, resource)
        if not pools:
            return warm + "; no NodePool can provide this flavor"
        said = [f"{name} ({'no limit' if left is None else f'{left} {resource}'})" for name, left in pools]
        return warm + "; NodePools can still bring: " + ", ".join(said)

    def _hold_admitted(self, wl: Workload, now: float) -> None:
        """A workload with an admission in the input holds its quota and, when admitted, its
        nodes; by its checks' verdict it stays, waits for its checks, or is on its way out."""
        verdict, check = self.gate.verdict(wl)
        held = admitted_usage(wl, wl.priority, now)
        if held is None:
            return
        self.tree.add_workload(held)
        if check is not None and verdict in (Verdict.RETRY, Verdict.REJECTED):
            # Like a preemption victim: it holds its quota this cycle, gone the next
            # (and its nodes, if it was admitted and has pods).
            if wl.condition_true("Admitted"):
                self._place_admitted(wl)
            self._leaving.append((wl, check))
        elif verdict == Verdict.NONE:
            self._place_admitted(wl)
        else:
            self._checked.append((wl, verdict))

    def _settle_checked(self, result: CycleResult) -> None:
        """Reserved workloads: admit those whose checks are all Ready and that have a place;
        the rest keep their quota, with a note of whether a place exists now."""
        for wl, verdict in self._checked:
            placed: GangPlacement | PlacementFailure | None = None
            if self.cluster is not None:
                owner = wl.key if verdict == Verdict.READY else f"probe:{wl.key}"
                placed = self.cluster.place(owner, self._admission_gang(wl))
                if verdict != Verdict.READY:
                    self.cluster.release(owner)
            if verdict == Verdict.READY and not isinstance(placed, PlacementFailure):
                assert wl.admission is not None
                decision = AdmissionDecision(
                    workload=wl.key,
                    cluster_queue=wl.admission.cluster_queue,
                    pod_sets=tuple(
                        PodSetDecision(
                            name=psa.name,
                            count=psa.count,
                            flavors=dict(sorted(psa.flavors.items())),
                            placement=None
                            if placed is None
                            else tuple(
                                PodPlacement(p.node, tuple(g.describe() for g in p.grants))
                                for p in placed.pods.get(psa.name, [])
                            ),
                        )
                        for psa in wl.admission.pod_set_assignments
                    ),
                    cycle=self.cycle_number,
                )
                self.admitted[wl.key] = decision
                result.admitted.append(decision)
                continue
            if isinstance(placed, PlacementFailure):
                message = f"no place on the nodes yet: {placed.message}"
            elif placed is None:
                message = "waiting for admission checks"
            else:
                message = "waiting for admission checks; the gang has a place on existing nodes"
            self.gate.record_reserved(
                wl, placeable=placed is not None and not isinstance(placed, PlacementFailure), message=message
            )

    def _release_leaving(self, result: CycleResult) -> None:
        """After the first cycle, the reservations that a check ended give their quota back."""
        for wl, check in self._leaving:
            held = self.tree.admitted.get(wl.key)
            if held is not None:
                self.tree.remove_workload(held)
                # Quota and nodes freed outside an admission or a finish: what this cycle
                # remembered of the workloads it parked no longer holds.
                self.state_version += 1
                if self.cluster is not None:
                    self.cluster.release(wl.key)
                self._unpark_cohort(held.cluster_queue, held.flavors)
            self._release_by_check(wl, check)
            result.released += 1
        self._leaving = []
        self.preemptor.clear_cache()

    def _release_by_check(self, wl: Workload, check: CheckStatus) -> None:
        """A Retry check requeues the workload, a Rejected one deactivates it; no quota held."""
        message = self.gate.record_eviction(wl, check)
        if check.state == CheckState.REJECTED:
            lq_key = f"{wl.namespace}/{wl.queue_name}" if wl.queue_name else None
            queue = wl.admission.cluster_queue if wl.admission is not None else None
            self.unqueued[wl.key] = (queue, lq_key, Status(Reason.DEACTIVATED, message))
            return
        self._enqueue(wl, self.now, keep_sorted=True)
        if wl.key in self.status:
            self.status[wl.key] = Status(Reason.QUEUED, message)
