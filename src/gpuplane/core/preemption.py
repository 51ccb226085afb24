"""Choosing preemption victims, with Kueue's rules.

Two strategies find the workloads to evict so that an incoming workload fits:

* **classical** (no fair sharing): candidates within the ClusterQueue under
  ``withinClusterQueue``, and in the cohort under ``reclaimWithinCohort`` (with
  hierarchical advantage and ``borrowWithinCohort``). Candidates are removed in
  order until the workload fits, then added back in reverse while it still fits.
* **fair sharing**: ClusterQueues are visited by dominant resource share, and a
  candidate is taken when the fair-sharing strategy (S2-a, then S2-b) allows it.

All searches run on the shared :class:`QuotaTree` and restore it before returning.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.lifecycle import Reason
from gpuplane.core.quota import (
    DRS,
    NEGATIVE_DRS,
    AdmittedWorkload,
    ClusterQueueNode,
    CohortNode,
    FlavorResource,
    QuotaNode,
    QuotaTree,
    Usage,
    compare_drs,
)
from gpuplane.core.workloads import PendingWorkload

# Candidate variants (classical preemption).
NEVER, WITHIN_CQ, HIERARCHICAL_RECLAIM, RECLAIM_WITHOUT_BORROWING, RECLAIM_WHILE_BORROWING = range(5)
_VARIANT_REASON = {
    WITHIN_CQ: Reason.IN_CLUSTER_QUEUE,
    HIERARCHICAL_RECLAIM: Reason.IN_COHORT_RECLAMATION,
    RECLAIM_WITHOUT_BORROWING: Reason.IN_COHORT_RECLAMATION,
    RECLAIM_WHILE_BORROWING: Reason.IN_COHORT_RECLAIM_WHILE_BORROWING,
}


@dataclass(frozen=True, slots=True)
class Target:
    """A workload to evict and why."""

    workload: AdmittedWorkload
    reason: str


@dataclass(slots=True)
class PreemptionContext:
    preemptor: PendingWorkload
    cq: ClusterQueueNode
    frs: frozenset[FlavorResource]
    usage: Usage


CandidateKey = tuple[bool, bool, int, float, float, str]


@dataclass(slots=True)
class _Candidate:
    workload: AdmittedWorkload
    lca: CohortNode | None
    variant: int
    key: CandidateKey  # its place in Kueue's order (candidate_key)


_CANDIDATE_KEY = operator.attrgetter("key")


def candidate_order(
    preemptor_cq: str, now: float, checkpoint_aware: bool = False
) -> Callable[[AdmittedWorkload, AdmittedWorkload], int]:
    """Kueue's candidate ordering: evicted first, other queues first, lower priority
    first, most recently admitted first, then by UID. With ``checkpoint_aware``, among
    equal priorities the one losing the least work since its last checkpoint goes first."""

    def compare(a: AdmittedWorkload, b: AdmittedWorkload) -> int:
        if a.evicted != b.evicted:
            return -1 if a.evicted else 1
        a_in, b_in = a.cluster_queue == preemptor_cq, b.cluster_queue == preemptor_cq
        if a_in != b_in:
            return 1 if a_in else -1
        if a.priority != b.priority:
            return -1 if a.priority < b.priority else 1
        if checkpoint_aware:
            la, lb = a.work_at_risk(now), b.work_at_risk(now)
            if la != lb:
                return -1 if la < lb else 1
        ta, tb = a.reserved_at, b.reserved_at
        if ta != tb:
            return -1 if ta > tb else 1
        return (a.uid > b.uid) - (a.uid < b.uid)

    return compare


def candidate_key(
    preemptor_cq: str, now: float, checkpoint_aware: bool = False
) -> Callable[[AdmittedWorkload], CandidateKey]:
    """The order of :func:`candidate_order` as a sort key: one key per candidate instead of a
    comparison per pair, which matters when a preemption search sorts thousands of them."""

    def key(wl: AdmittedWorkload) -> CandidateKey:
        risk = wl.work_at_risk(now) if checkpoint_aware else 0.0
        return (not wl.evicted, wl.cluster_queue == preemptor_cq, wl.priority, risk, -wl.reserved_at, wl.uid)

    return key


def satisfies_policy(policy: str, preemptor: PendingWorkload, candidate: AdmittedWorkload) -> bool:
    if policy == "LowerPriority":
        return preemptor.priority > candidate.priority
    if policy == "LowerOrNewerEqualPriority":
        if preemptor.priority > candidate.priority:
            return True
        return preemptor.priority == candidate.priority and preemptor.timestamp < candidate.queue_timestamp
    return policy == "Any"


def uses_resources(wl: AdmittedWorkload, frs: frozenset[FlavorResource]) -> bool:
    return not frs.isdisjoint(wl.flavors)


def cq_is_borrowing(cq: ClusterQueueNode, frs: frozenset[FlavorResource]) -> bool:
    return cq.parent is not None and any(cq.borrowing_with(fr, 0) for fr in frs)


def workload_fits(ctx: PreemptionContext, allow_borrowing: bool) -> bool:
    cq = ctx.cq
    for fr, v in ctx.usage.items():
        if not allow_borrowing and cq.borrowing_with(fr, v):
            return False
        if v > cq.available(fr):
            return False
    return True


def queue_under_nominal(ctx: PreemptionContext) -> bool:
    usage = ctx.cq.usage
    for fr in ctx.frs:
        quota = ctx.cq.quotas.get(fr)
        if (quota.nominal if quota is not None else 0) <= usage.get(fr, 0):
            return False
    return True


def node_height(node: CohortNode) -> int:
    height = min(len(node.child_cohorts) + len(node.child_queues), 1)
    for child in node.child_cohorts:
        height = max(height, node_height(child) + 1)
    return height


def lowest_subtree_that_fits(cq: ClusterQueueNode, fr: FlavorResource, value: int) -> tuple[int, bool]:
    """Height of the smallest cohort subtree that can hold ``value`` more of ``fr``,
    and whether that subtree is smaller than the whole tree."""
    if cq.parent is None:
        return 0, False
    if cq.subtree_quota.get(fr, 0) >= cq.usage.get(fr, 0) + value:  # not borrowing: asked by every fit
        return 0, True
    remaining = value - cq.local_available(fr)
    tracking: CohortNode | None = None
    for node in cq.ancestors():
        tracking = node
        if not node.borrowing_with(fr, remaining):
            return node_height(node), node.parent is not None
        remaining -= node.local_available(fr)
    assert tracking is not None
    return node_height(tracking), tracking.parent is not None


def quantities_fit_in_quota(node: QuotaNode, requests: Usage) -> tuple[bool, dict[FlavorResource, int]]:
    fits = True
    remaining: dict[FlavorResource, int] = {}
    for fr, v in requests.items():
        if node.subtree_quota.get(fr, 0) < node.usage.get(fr, 0) + v:
            fits = False
        remaining[fr] = max(0, v - node.local_available(fr))
    return fits, remaining


@dataclass
class Preemptor:
    """Finds preemption targets on a QuotaTree."""

    tree: QuotaTree
    config: SchedulerConfig
    now: float
    _cache: dict[tuple[object, ...], list[Target]] = field(default_factory=dict)
    # Searches for one flavor-resource that the necessary condition ended (see _found_no_room).
    _no_room: set[tuple[str, str, FlavorResource, int]] = field(default_factory=set)
    # Ordered candidates of classical searches (see _candidates).
    _ordered: dict[tuple[object, ...], tuple[list[_Candidate], tuple[bool, ...]]] = field(
        default_factory=dict
    )

    def clear_cache(self) -> None:
        """Forget memoised searches; call whenever the tree changes for real."""
        self._cache.clear()
        self._no_room.clear()
        self._ordered.clear()

    def forget_no_room(self) -> None:
        """Forget which searches found no room, and their candidates; call before the tree holds
        a cycle's reservations."""
        self._no_room.clear()
        self._ordered.clear()

    def get_targets(self, ctx: PreemptionContext) -> list[Target]:
        key = (ctx.preemptor.key, ctx.cq.name, ctx.frs, tuple(sorted(ctx.usage.items())))
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        targets = self._fair_targets(ctx) if self.config.fair_sharing else self._classical_targets(ctx)
        self._cache[key] = targets
        return targets

    # --- shared -------------------------------------------------------------

    def _fill_back(
        self, ctx: PreemptionContext, targets: list[Target], allow_borrowing: bool
    ) -> list[Target]:
        targets = list(targets)
        for i in range(len(targets) - 2, -1, -1):
            self.tree.add_workload(targets[i].workload)
            if workload_fits(ctx, allow_borrowing):
                targets[i] = targets[-1]
                targets.pop()
            else:
                self.tree.remove_workload(targets[i].workload)
        return targets

    def _restore(self, targets: list[Target]) -> None:
        for t in targets:
            self.tree.add_workload(t.workload)

    def _sorted(self, ctx: PreemptionContext, workloads: list[AdmittedWorkload]) -> list[AdmittedWorkload]:
        return sorted(workloads, key=candidate_key(ctx.cq.name, self.now, self.config.checkpoint_aware))

    def _order(self, ctx: PreemptionContext) -> Callable[[AdmittedWorkload, AdmittedWorkload], int]:
        return candidate_order(ctx.cq.name, self.now, self.config.checkpoint_aware)

    def _protected(self, wl: AdmittedWorkload) -> bool:
        """Too young to preempt under the minimum-runtime policy."""
        limit = self.config.min_runtime_seconds
        return limit > 0 and self.now - wl.reserved_at < limit

    # --- classical ----------------------------------------------------------

    def _from_cq(
        self, ctx: PreemptionContext, cq: ClusterQueueNode, lca: CohortNode | None, advantage: bool
    ) -> list[_Candidate]:
        """The candidates among ``cq``'s workloads, each with its variant and sort key.

        Every workload of ``cq`` has ``cq`` as its ClusterQueue, so whether it is the
        preemptor's queue, which policy rule applies and the variant of a workload within
        the queue or reclaimed with advantage are the queue's, worked out once here
        rather than per workload; the sort key is :func:`candidate_key`'s. A request
        for one flavor-resource (the flavor assignment's) asks whether the workload holds it,
        which is what ``isdisjoint`` answers, without the call.
        """
        out: list[_Candidate] = []
        if not cq.active:
            return out
        frs, preemptor, now = ctx.frs, ctx.preemptor, self.now
        policy = ctx.cq.spec.preemption
        same_cq = cq.name == ctx.cq.name
        rule = policy.within_cluster_queue if same_cq else policy.reclaim_within_cohort
        fixed = WITHIN_CQ if same_cq else HIERARCHICAL_RECLAIM if advantage else NEVER
        threshold = policy.max_priority_threshold
        bwc_never = policy.borrow_within_cohort == "Never"
        limit = self.config.min_runtime_seconds
        checkpoint_aware = self.config.checkpoint_aware
        # Those using any of the resources: the others are never candidates.
        if len(frs) == 1:
            (only,) = frs
            users = [wl for wl in cq.workloads.values() if only in wl.flavors]
        else:
            users = [wl for wl in cq.workloads.values() if not frs.isdisjoint(wl.flavors)]
        preemptor_priority = preemptor.priority
        for wl in users:
            if limit > 0 and now - wl.reserved_at < limit:
                continue  # too young to preempt (_protected)
            if not satisfies_policy(rule, preemptor, wl):
                continue
            variant = fixed
            if variant == NEVER:
                if (
                    bwc_never
                    or wl.priority >= preemptor_priority
                    or (threshold is not None and wl.priority > threshold)
                ):
                    variant = RECLAIM_WITHOUT_BORROWING
                else:
                    variant = RECLAIM_WHILE_BORROWING
            risk = wl.work_at_risk(now) if checkpoint_aware else 0.0
            key = (not wl.evicted, same_cq, wl.priority, risk, -wl.reserved_at, wl.uid)
            out.append(_Candidate(wl, lca, variant, key))
        return out

    def _collect_subtree(  # noqa: PLR0913, PLR0917 - mirrors the recursive walk's state, kept explicit
        self,
        ctx: PreemptionContext,
        current: CohortNode,
        subtree_root: CohortNode,
        skip: CohortNode | None,
        advantage: bool,
        result: list[_Candidate],
    ) -> None:
        for child in current.child_cohorts:
            if child is skip or child.within_nominal(ctx.frs):
                continue
            self._collect_subtree(ctx, child, subtree_root, skip, advantage, result)
        for child_cq in current.child_queues:
            if child_cq is ctx.cq:
                continue
            if not child_cq.within_nominal(ctx.frs):
                result.extend(self._from_cq(ctx, child_cq, subtree_root, advantage))

    @staticmethod
    def _advantage_level(ctx: PreemptionContext) -> int:
        """How many of the queue's ancestors, from its parent up, the hierarchical walk visits
        before it has the advantage of fitting within a subtree's quota (all of them: never)."""
        advantage, remaining = quantities_fit_in_quota(ctx.cq, ctx.usage)
        level = 0
        for current in ctx.cq.ancestors():
            if advantage:
                break
            advantage, remaining = quantities_fit_in_quota(current, remaining)
            level += 1
        return level

    def _hierarchical_candidates(
        self, ctx: PreemptionContext, want_priority: bool, level: int
    ) -> tuple[list[_Candidate], list[_Candidate]]:
        hierarchy: list[_Candidate] = []
        priority: list[_Candidate] = []
        cq = ctx.cq
        if cq.parent is None or cq.spec.preemption.reclaim_within_cohort == "Never":
            return hierarchy, priority
        previous: CohortNode | None = None
        for depth, current in enumerate(cq.ancestors()):
            if depth >= level:
                self._collect_subtree(ctx, current, current, previous, True, hierarchy)
            elif want_priority:
                self._collect_subtree(ctx, current, current, previous, False, priority)
            previous = current
        return hierarchy, priority

    def _valid(self, ctx: PreemptionContext, cand: _Candidate, borrow: bool) -> bool:
        if cand.workload.cluster_queue == ctx.cq.name:
            return True
        if borrow and cand.variant == RECLAIM_WITHOUT_BORROWING:
            return False
        cq = self.tree.queues[cand.workload.cluster_queue]
        if cq.within_nominal(ctx.frs):
            return False
        for node in cq.ancestors():
            if node is cand.lca:
                break
            if node.within_nominal(ctx.frs):
                return False
        return True

    def could_fit(self, ctx: PreemptionContext) -> bool:
        """Could any attempt of the classical search succeed? A cheap necessary condition.

        It removes, per ClusterQueue and in one step, the usage of every priority whose
        workloads could be candidates (``ClusterQueueNode.priority_usage``), and asks whether
        the workload then fits. That is a superset of what the search may evict: a candidate of
        another queue is only valid while its queue is above nominal, and becomes invalid, never
        valid, as others are removed; fitting only gets easier as usage goes. So when even this
        makes no room, the search finds nothing, and it is skipped without visiting, let alone
        sorting, the admitted workloads. Cost: queues x priorities, not workloads.
        """
        cq = ctx.cq
        policy = cq.spec.preemption
        preemptor_priority = ctx.preemptor.priority
        wanted = frozenset(ctx.usage)

        def allowed(rule: str, priority: int) -> bool:
            if rule == "LowerPriority":
                return priority < preemptor_priority
            if rule == "LowerOrNewerEqualPriority":
                return priority <= preemptor_priority
            return rule == "Any"

        def add(into: dict[FlavorResource, int], usage: Usage) -> None:
            for fr, value in usage.items():
                if fr in wanted:
                    into[fr] = into.get(fr, 0) + value

        own: dict[FlavorResource, int] = {}
        if policy.within_cluster_queue != "Never":
            for priority, usage in cq.priority_usage.items():
                if allowed(policy.within_cluster_queue, priority):
                    add(own, usage)
        any_variant: dict[str, dict[FlavorResource, int]] = {cq.name: own}
        while_borrowing: dict[str, dict[FlavorResource, int]] = {cq.name: own}
        root = cq.root()
        if isinstance(root, CohortNode) and policy.reclaim_within_cohort != "Never":
            advantage, remaining = quantities_fit_in_quota(cq, ctx.usage)
            for node in cq.ancestors():
                if advantage:
                    break
                advantage, remaining = quantities_fit_in_quota(node, remaining)
            threshold = policy.max_priority_threshold
            for other in root.subtree_queues():
                if other is cq or other.within_nominal(ctx.frs):
                    continue
                for priority, usage in other.priority_usage.items():
                    if not allowed(policy.reclaim_within_cohort, priority):
                        continue
                    add(any_variant.setdefault(other.name, {}), usage)
                    if advantage or (
                        policy.borrow_within_cohort != "Never"
                        and priority < preemptor_priority
                        and (threshold is None or priority <= threshold)
                    ):
                        add(while_borrowing.setdefault(other.name, {}), usage)
        return self._fits_without(ctx, while_borrowing, True) or self._fits_without(ctx, any_variant, False)

    def _fits_without(
        self, ctx: PreemptionContext, removed: dict[str, dict[FlavorResource, int]], borrow: bool
    ) -> bool:
        # Removing x of a flavor-resource, from any queue, raises any queue's headroom for it by x
        # at most (each node's usage falls by x at most, and headroom follows usage one for
        # one, or less under a lending or borrowing limit). So when the headroom now plus all
        # that is removed is still short, the workload cannot fit: no need to change the tree.
        # Without borrowing, the workload must also fit the queue's own quota once its own part
        # of ``removed`` is gone (a queue's usage falls by exactly what is removed from it).
        cq = ctx.cq
        own = removed.get(cq.name, {})
        for fr, value in ctx.usage.items():
            if not borrow and cq.borrowing_with(fr, value - own.get(fr, 0)):
                return False
            if value > cq.available(fr) + sum(usage.get(fr, 0) for usage in removed.values()):
                return False
        queues = [(self.tree.queues[name], usage) for name, usage in removed.items() if usage]
        for queue, usage in queues:
            queue.remove_usage_map(usage)
        try:
            return workload_fits(ctx, borrow)
        finally:
            for queue, usage in reversed(queues):
                queue.add_usage_map(usage)

    def _found_no_room(self, ctx: PreemptionContext) -> bool | None:
        """Whether a search for one flavor-resource alone already found no room for this one
        (True), or this search finds none now (False: noted when it asks for that
        flavor-resource alone), or it may find some (None).

        The flavor assignment searches for each flavor-resource alone ({fr: v}); the search for
        the whole assignment then asks again, with the same flavor-resource needing preemption
        and the same amount of it, plus resources that fit. Its necessary condition removes the
        same usage of that flavor-resource or less (more resources can only take away the
        advantage of fitting within nominal quota) and asks more of the fit: where the first
        found no room, the second finds none either.
        """
        key: tuple[str, str, FlavorResource, int] | None = None
        if len(ctx.frs) == 1:
            (fr,) = ctx.frs
            value = ctx.usage.get(fr)
            if value is not None:
                key = (ctx.preemptor.key, ctx.cq.name, fr, value)
                if key in self._no_room:
                    return True
        if self.could_fit(ctx):
            return None
        if key is not None and len(ctx.usage) == 1:
            self._no_room.add(key)
        return False

    def _candidates(self, ctx: PreemptionContext) -> tuple[list[_Candidate], tuple[bool, ...]]:
        """The ordered candidates and the attempts (with borrowing or not) of a classical search.

        They depend on the request only through its flavor-resources and the level at which
        the hierarchical walk gains its advantage (the rest reads the tree, the preemptor and
        the time), so they are memoised on those until the tree changes: the search for the
        whole assignment then reuses the candidates of the flavor assignment's search for its
        flavor-resource alone, as do the searches of partial admission. The order is total
        (it ends with the UID), so it does not depend on the order in which the queues hold
        their workloads, which searches change as they remove and restore them.
        """
        level = self._advantage_level(ctx)
        key = (ctx.preemptor.key, ctx.cq.name, ctx.frs, level)
        known = self._ordered.get(key)
        if known is not None:
            return known
        policy = ctx.cq.spec.preemption
        bwc_forbidden = policy.borrow_within_cohort == "Never"
        under_nominal = queue_under_nominal(ctx)
        # When only the borrowing attempt can run, candidates that may only be
        # preempted without borrowing are never valid: skip collecting them.
        want_priority = not (bwc_forbidden and not under_nominal)
        same_queue: list[_Candidate] = []
        if policy.within_cluster_queue != "Never":
            same_queue = self._from_cq(ctx, ctx.cq, None, False)
        hierarchy, priority = self._hierarchical_candidates(ctx, want_priority, level)
        no_other_queues = not hierarchy and not priority
        attempts: tuple[bool, ...]
        if no_other_queues or (bwc_forbidden and not under_nominal):
            attempts = (True,)
        elif bwc_forbidden and not hierarchy:
            attempts = (False, True)
        else:
            attempts = (True, False)
        ordered: list[_Candidate] = []
        groups = [sorted(g, key=_CANDIDATE_KEY) for g in (hierarchy, priority, same_queue)]
        ordered += [c for g in groups for c in g if c.workload.evicted]
        ordered += [c for g in groups for c in g if not c.workload.evicted]
        self._ordered[key] = ordered, attempts
        return ordered, attempts

    def _alone(self, ctx: PreemptionContext) -> PreemptionContext | None:
        """The search for the request's one flavor-resource needing preemption alone, where it
        must find the same targets as the whole request's search, or None.

        The search for a whole assignment asks for that flavor-resource, at the amount the
        flavor assignment's own search asked, plus resources that need no preemption. When
        each of those fits now without borrowing, it still does at every step of the search
        (the search only takes workloads away from the tree, or puts back what it took, and
        headroom only grows, borrowing only shrinks, as usage falls), so both searches ask the
        same of every fit. When the walk gains its advantage at the same level for both, they
        have the same candidates in the same order (see :meth:`_candidates`), and so the same
        targets: the flavor assignment's search, memoised, answers.
        """
        if len(ctx.frs) != 1 or len(ctx.usage) == 1:
            return None
        (fr,) = ctx.frs
        value = ctx.usage.get(fr)
        if value is None:
            return None
        cq = ctx.cq
        for other, amount in ctx.usage.items():
            if other != fr and (amount > cq.available(other) or cq.borrowing_with(other, amount)):
                return None
        alone = PreemptionContext(ctx.preemptor, cq, ctx.frs, {fr: value})
        if self._advantage_level(alone) != self._advantage_level(ctx):
            return None
        return alone

    def _classical_targets(self, ctx: PreemptionContext) -> list[Target]:
        alone = self._alone(ctx)
        if alone is not None:
            return self.get_targets(alone)
        if self._found_no_room(ctx) is not None:
            return []
        ordered, attempts = self._candidates(ctx)
        for borrow in attempts:
            targets: list[Target] = []
            for cand in ordered:
                if not self._valid(ctx, cand, borrow):
                    continue
                self.tree.remove_workload(cand.workload)
                targets.append(Target(cand.workload, _VARIANT_REASON[cand.variant]))
                if workload_fits(ctx, borrow):
                    targets = self._fill_back(ctx, targets, borrow)
                    self._restore(targets)
                    return targets
            self._restore(targets)
        return []

    # --- fair sharing -------------------------------------------------------

    def _fair_candidates(self, ctx: PreemptionContext) -> list[AdmittedWorkload]:
        cq = ctx.cq
        policy = cq.spec.preemption
        out: list[AdmittedWorkload] = []
        if policy.within_cluster_queue != "Never":
            rule = policy.within_cluster_queue
            out.extend(
                wl
                for wl in cq.workloads.values()
                if satisfies_policy(rule, ctx.preemptor, wl) and uses_resources(wl, ctx.frs)
            )
        if cq.parent is not None and policy.reclaim_within_cohort != "Never":
            root = cq.root()
            assert isinstance(root, CohortNode)
            for other in root.subtree_queues():
                if other is cq or not other.active or not cq_is_borrowing(other, ctx.frs):
                    continue
                out.extend(
                    wl
                    for wl in other.workloads.values()
                    if satisfies_policy(policy.reclaim_within_cohort, ctx.preemptor, wl)
                    and uses_resources(wl, ctx.frs)
                )
        return self._sorted(ctx, [wl for wl in out if not self._protected(wl)])

    def _fair_targets(self, ctx: PreemptionContext) -> list[Target]:
        candidates = self._fair_candidates(ctx)
        if not candidates:
            return []
        found: list[Target] = []
        taken: list[Target] = []
        cq = ctx.cq

        def take(wl: AdmittedWorkload, reason: str) -> bool:
            """Remove ``wl``; True when the incoming workload now fits (stop)."""
            self.tree.remove_workload(wl)
            taken.append(Target(wl, reason))
            with cq.without_usage(ctx.usage):
                if workload_fits(ctx, True):
                    kept = self._fill_back(ctx, taken, True)
                    self._restore(kept)
                    taken.clear()
                    found.extend(kept)
                    return True
            return False

        with cq.with_usage(ctx.usage):
            strategies = self.config.fs_strategies or ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
            done, retry, own = self._first_strategy(ctx, candidates, strategies[0], take)
            if not done and self.config.reevaluate_fair_candidates and own:
                done, retry, _ = self._first_strategy(ctx, retry, strategies[0], take)
            if not done and len(strategies) > 1:
                done = self._second_strategy(ctx, retry, take)
        if not done:
            self._restore(taken)
            return []
        return found

    def _first_strategy(
        self,
        ctx: PreemptionContext,
        candidates: list[AdmittedWorkload],
        strategy: str,
        take: Callable[[AdmittedWorkload, str], bool],
    ) -> tuple[bool, list[AdmittedWorkload], bool]:
        ordering = _TargetOrdering(self, ctx, candidates)
        retry: list[AdmittedWorkload] = []
        own_targets = False
        within_nominal = self.config.fair_preempt_within_nominal and not any(
            ctx.cq.borrowing_with(fr, 0) for fr in ctx.frs
        )
        for target in ordering:
            if target is ctx.cq:
                wl = ordering.pop(target)
                own_targets = True
                if take(wl, Reason.IN_CLUSTER_QUEUE):
                    return True, retry, own_targets
                continue
            if within_nominal:
                if take(ordering.pop(target), Reason.IN_COHORT_RECLAMATION):
                    return True, retry, own_targets
                continue
            preemptor_new, target_old = ordering.shares(target)
            if preemptor_new.zero_weight_borrows and not target_old.zero_weight_borrows:
                while ordering.has_workload(target):
                    retry.append(ordering.pop(target))
                continue
            while ordering.has_workload(target):
                wl = ordering.pop(target)
                with target.without_usage(wl.usage):
                    target_new = ordering.almost_lca(target, ordering.lca(target)).dominant_resource_share()
                if strategy == "LessThanOrEqualToFinalShare":
                    passed = compare_drs(preemptor_new, target_new) <= 0
                else:
                    passed = compare_drs(preemptor_new, target_old) < 0
                if passed:
                    if take(wl, Reason.IN_COHORT_FAIR_SHARING):
                        return True, retry, own_targets
                    break
                retry.append(wl)
        return False, retry, own_targets

    def _second_strategy(
        self,
        ctx: PreemptionContext,
        retry: list[AdmittedWorkload],
        take: Callable[[AdmittedWorkload, str], bool],
    ) -> bool:
        ordering = _TargetOrdering(self, ctx, retry)
        for target in ordering:
            preemptor_new, target_old = ordering.shares(target)
            passed = compare_drs(preemptor_new, target_old) < 0
            wl = ordering.pop(target)
            if passed and take(wl, Reason.IN_COHORT_FAIR_SHARING):
                return True
            ordering.drop(target)
        return False


class _TargetOrdering:
    """Visits ClusterQueues from the root by highest dominant resource share.

    The same queue may be yielded repeatedly; the caller must pop a workload from it
    or drop it between yields.
    """

    def __init__(
        self, preemptor: Preemptor, ctx: PreemptionContext, candidates: list[AdmittedWorkload]
    ) -> None:
        self.preemptor = preemptor
        self.ctx = ctx
        self.ancestors = set(map(id, ctx.cq.ancestors()))
        self.by_cq: dict[str, list[AdmittedWorkload]] = {}
        for wl in candidates:
            self.by_cq.setdefault(wl.cluster_queue, []).append(wl)
        self.pruned_queues: set[str] = set()
        self.pruned_cohorts: set[int] = set()
        self.order = functools.cmp_to_key(preemptor._order(ctx))

    def has_workload(self, cq: ClusterQueueNode) -> bool:
        return bool(self.by_cq.get(cq.name))

    def pop(self, cq: ClusterQueueNode) -> AdmittedWorkload:
        return self.by_cq[cq.name].pop(0)

    def drop(self, cq: ClusterQueueNode) -> None:
        self.pruned_queues.add(cq.name)

    def lca(self, target: ClusterQueueNode) -> CohortNode:
        for node in target.ancestors():
            if id(node) in self.ancestors:
                return node
        raise AssertionError("no common ancestor between preemptor and target queues")

    @staticmethod
    def almost_lca(cq: ClusterQueueNode, lca: CohortNode) -> QuotaNode:
        node: QuotaNode = cq
        for ancestor in cq.ancestors():
            if ancestor is lca:
                return node
            node = ancestor
        raise AssertionError("lca is not an ancestor")

    def shares(self, target: ClusterQueueNode) -> tuple[DRS, DRS]:
        lca = self.lca(target)
        return (
            self.almost_lca(self.ctx.cq, lca).dominant_resource_share(),
            self.almost_lca(target, lca).dominant_resource_share(),
        )

    def __iter__(self) -> Iterator[ClusterQueueNode]:
        cq = self.ctx.cq
        if cq.parent is None:
            while self.has_workload(cq):
                yield cq
            return
        root = cq.root()
        assert isinstance(root, CohortNode)
        while id(root) not in self.pruned_cohorts:
            target = self._next(root)
            if target is not None:
                yield target

    def _next(self, cohort: CohortNode) -> ClusterQueueNode | None:
        best_cq: ClusterQueueNode | None = None
        best_cq_drs = NEGATIVE_DRS
        for cq in cohort.child_queues:
            if cq.name in self.pruned_queues:
                continue
            drs = cq.dominant_resource_share()
            if (drs.is_zero and cq is not self.ctx.cq) or not self.has_workload(cq):
                self.pruned_queues.add(cq.name)
                continue
            cmp = compare_drs(drs, best_cq_drs)
            if cmp == 0 and best_cq is not None:
                if self.order(self.by_cq[cq.name][0]) < self.order(self.by_cq[best_cq.name][0]):
                    best_cq = cq
            elif cmp == 1:
                best_cq_drs, best_cq = drs, cq
        best_cohort: CohortNode | None = None
        best_cohort_drs = NEGATIVE_DRS
        for child in cohort.child_cohorts:
            if id(child) in self.pruned_cohorts:
                continue
            drs = child.dominant_resource_share()
            if drs.is_zero and id(child) not in self.ancestors:
                self.pruned_cohorts.add(id(child))
            elif compare_drs(drs, best_cohort_drs) >= 0:
                best_cohort_drs, best_cohort = drs, child
        if best_cohort is None and best_cq is None:
            self.pruned_cohorts.add(id(cohort))
            return None
        if best_cohort is not None and compare_drs(best_cohort_drs, best_cq_drs) >= 0:
            return self._next(best_cohort)
        return best_cq
