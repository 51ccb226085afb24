"""Choosing preemption victims under fair sharing, with Kueue's rules: ClusterQueues are visited by
dominant resource share, and a candidate is taken when the fair-sharing strategy (S2-a, then S2-b)
allows it. The search runs on the shared :class:`QuotaTree` and restores it before returning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.lifecycle import Reason
from gpuplane.core.quota import (
    DRS,
    NEGATIVE_DRS,
    AdmittedWorkload,
    ClusterQueueNode,
    CohortNode,
    QuotaNode,
    QuotaTree,
    compare_drs,
)
from gpuplane.core.victims import (
    PreemptionContext,
    Target,
    candidate_key,
    candidate_order,
    cq_is_borrowing,
    fill_back,
    restore,
    satisfies_policy,
    uses_resources,
    workload_fits,
)

Order = Callable[[AdmittedWorkload, AdmittedWorkload], int]


class FairVictims:
    """The fair-sharing search for preemption targets. Owns no state between searches: it reads and
    (for the search's length) changes the quota tree, and reads the configuration."""

    def __init__(self, tree: QuotaTree, config: SchedulerConfig) -> None:
        self.tree = tree
        self.config = config

    def _candidates(self, ctx: PreemptionContext, now: float) -> list[AdmittedWorkload]:
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
        limit = self.config.min_runtime_seconds
        # Too young to preempt under the minimum-runtime policy: never a candidate.
        kept = [wl for wl in out if not (limit > 0 and now - wl.reserved_at < limit)]
        return sorted(kept, key=candidate_key(ctx.cq.name, now, self.config.checkpoint_aware))

    def targets(self, ctx: PreemptionContext, now: float) -> list[Target]:
        """The targets that make room for ``ctx`` under fair sharing, or none (see module)."""
        candidates = self._candidates(ctx, now)
        order = candidate_order(ctx.cq.name, now, self.config.checkpoint_aware)
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
                    kept = fill_back(self.tree, ctx, taken, True)
                    restore(self.tree, kept)
                    taken.clear()
                    found.extend(kept)
                    return True
            return False

        with cq.with_usage(ctx.usage):
            strategies = self.config.fs_strategies or ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
            done, retry, own = self._first_strategy(ctx, candidates, strategies[0], take, order)
            if not done and self.config.reevaluate_fair_candidates and own:
                done, retry, _ = self._first_strategy(ctx, retry, strategies[0], take, order)
            if not done and len(strategies) > 1:
                done = self._second_strategy(ctx, retry, take, order)
        if not done:
            restore(self.tree, taken)
            return []
        return found

    def _first_strategy(
        self,
        ctx: PreemptionContext,
        candidates: list[AdmittedWorkload],
        strategy: str,
        take: Callable[[AdmittedWorkload, str], bool],
        order: Order,
    ) -> tuple[bool, list[AdmittedWorkload], bool]:
        ordering = _TargetOrdering(order, ctx, candidates)
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
        order: Order,
    ) -> bool:
        ordering = _TargetOrdering(order, ctx, retry)
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

    def __init__(self, order: Order, ctx: PreemptionContext, candidates: list[AdmittedWorkload]) -> None:
        self.ctx = ctx
        self.ancestors = set(map(id, ctx.cq.ancestors()))
        self.by_cq: dict[str, list[AdmittedWorkload]] = {}
        for wl in candidates:
            self.by_cq.setdefault(wl.cluster_queue, []).append(wl)
        self.pruned_queues: set[str] = set()
        self.pruned_cohorts: set[int] = set()
        self.order = functools.cmp_to_key(order)

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
