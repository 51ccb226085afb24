"""Choosing preemption victims, with Kueue's rules.

Two strategies find the workloads to evict so that an incoming workload fits:

* **classical** (no fair sharing, here): candidates within the ClusterQueue under
  ``withinClusterQueue``, and in the cohort under ``reclaimWithinCohort`` (with
  hierarchical advantage and ``borrowWithinCohort``). Candidates are removed in
  order until the workload fits, then added back in reverse while it still fits.
* **fair sharing** (:mod:`gpuplane.core.fair_victims`): ClusterQueues are visited by dominant
  resource share, and a candidate is taken when the fair-sharing strategy allows it.

All searches run on the shared :class:`QuotaTree` and restore it before returning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.fair_victims import FairVictims
from gpuplane.core.quota import (
    ClusterQueueNode,
    CohortNode,
    FlavorResource,
    QuotaTree,
    Usage,
)
from gpuplane.core.victims import (
    CANDIDATE_KEY,
    HIERARCHICAL_RECLAIM,
    NEVER,
    RECLAIM_WHILE_BORROWING,
    RECLAIM_WITHOUT_BORROWING,
    VARIANT_REASON,
    WITHIN_CQ,
    Candidate,
    PreemptionContext,
    Target,
    fill_back,
    quantities_fit_in_quota,
    queue_under_nominal,
    restore,
    satisfies_policy,
    take_out,
    workload_fits,
)


@dataclass
class Preemptor:
    """Finds preemption targets on a QuotaTree: the classical search here, fair sharing's in
    :class:`FairVictims`. Owns the searches remembered until the tree changes (targets per
    request, the requests found to have no room, the ordered candidates) and its clock."""

    tree: QuotaTree
    config: SchedulerConfig
    now: float
    _cache: dict[tuple[object, ...], list[Target]] = field(default_factory=dict)
    # Searches for one flavor-resource that the necessary condition ended (see _found_no_room).
    _no_room: set[tuple[str, str, FlavorResource, int]] = field(default_factory=set)
    # Ordered candidates of classical searches (see _candidates).
    _ordered: dict[tuple[object, ...], tuple[list[Candidate], tuple[bool, ...]]] = field(default_factory=dict)
    _fair: FairVictims = field(init=False)

    def __post_init__(self) -> None:
        self._fair = FairVictims(self.tree, self.config)

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
        targets = (
            self._fair.targets(ctx, self.now) if self.config.fair_sharing else self._classical_targets(ctx)
        )
        self._cache[key] = targets
        return targets

    # --- classical ----------------------------------------------------------

    def _from_cq(
        self, ctx: PreemptionContext, cq: ClusterQueueNode, lca: CohortNode | None, advantage: bool
    ) -> list[Candidate]:
        """The candidates among ``cq``'s workloads, each with its variant and sort key.

        Every workload of ``cq`` has ``cq`` as its ClusterQueue, so whether it is the
        preemptor's queue, which policy rule applies and the variant of a workload within
        the queue or reclaimed with advantage are the queue's, worked out once here
        rather than per workload; the sort key is :func:`candidate_key`'s. A request
        for one flavor-resource (the flavor assignment's) asks whether the workload holds it,
        which is what ``isdisjoint`` answers, without the call.
        """
        out: list[Candidate] = []
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
                continue  # too young to preempt under the minimum-runtime policy
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
            out.append(Candidate(wl, lca, variant, key))
        return out

    def _collect_subtree(  # noqa: PLR0913, PLR0917 - mirrors the recursive walk's state, kept explicit
        self,
        ctx: PreemptionContext,
        current: CohortNode,
        subtree_root: CohortNode,
        skip: CohortNode | None,
        advantage: bool,
        result: list[Candidate],
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
    ) -> tuple[list[Candidate], list[Candidate]]:
        hierarchy: list[Candidate] = []
        priority: list[Candidate] = []
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

    def _valid(self, ctx: PreemptionContext, cand: Candidate, borrow: bool) -> bool:
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

    def _candidates(self, ctx: PreemptionContext) -> tuple[list[Candidate], tuple[bool, ...]]:
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
        same_queue: list[Candidate] = []
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
        ordered: list[Candidate] = []
        groups = [sorted(g, key=CANDIDATE_KEY) for g in (hierarchy, priority, same_queue)]
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
        # The search reads the usage of the requested flavor-resources alone: only that moves.
        frs = frozenset(ctx.usage).union(ctx.frs)
        tree = self.tree
        for borrow in attempts:
            targets: list[Target] = []
            for cand in ordered:
                if not self._valid(ctx, cand, borrow):
                    continue
                take_out(tree, cand.workload, frs)
                targets.append(Target(cand.workload, VARIANT_REASON[cand.variant]))
                if workload_fits(ctx, borrow):
                    targets = fill_back(tree, ctx, targets, borrow, frs)
                    restore(tree, targets, frs)
                    return targets
            restore(tree, targets, frs)
        return []
