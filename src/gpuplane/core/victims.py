"""Preemption victims: what a search is asked (:class:`PreemptionContext`) and finds
(:class:`Target`), Kueue's order of candidates, its policy rules, and the quota tests both searches
(:class:`gpuplane.core.preemptor.Preemptor`, :class:`gpuplane.core.fair_victims.FairVictims`)
share, including taking targets out of the tree and putting them back.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

from gpuplane.core.lifecycle import Reason
from gpuplane.core.quota import (
    AdmittedWorkload,
    ClusterQueueNode,
    CohortNode,
    FlavorResource,
    QuotaNode,
    QuotaTree,
    Usage,
)
from gpuplane.core.workloads import PendingWorkload

# Candidate variants (classical preemption).
NEVER, WITHIN_CQ, HIERARCHICAL_RECLAIM, RECLAIM_WITHOUT_BORROWING, RECLAIM_WHILE_BORROWING = range(5)
VARIANT_REASON = {
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
    """What a search is asked: room for ``usage`` of ``frs`` in ``cq`` for ``preemptor``."""

    preemptor: PendingWorkload
    cq: ClusterQueueNode
    frs: frozenset[FlavorResource]
    usage: Usage


CandidateKey = tuple[bool, bool, int, float, float, str]


@dataclass(slots=True)
class Candidate:
    """A workload that a classical search may evict, with its variant and its place in the order."""

    workload: AdmittedWorkload
    lca: CohortNode | None
    variant: int
    key: CandidateKey  # its place in Kueue's order (candidate_key)


CANDIDATE_KEY = operator.attrgetter("key")


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


def take_out(tree: QuotaTree, wl: AdmittedWorkload, frs: frozenset[FlavorResource] | None = None) -> None:
    """Take ``wl`` out of the tree for a search: all of it, or with ``frs`` only its usage of
    those flavor-resources (:meth:`QuotaTree.remove_usage_of`: enough for a search that asks
    about those alone, as the classical one does)."""
    if frs is None:
        tree.remove_workload(wl)
    else:
        tree.remove_usage_of(wl, frs)


def put_back(tree: QuotaTree, wl: AdmittedWorkload, frs: frozenset[FlavorResource] | None = None) -> None:
    """Undo :func:`take_out`."""
    if frs is None:
        tree.add_workload(wl)
    else:
        tree.add_usage_of(wl, frs)


def fill_back(
    tree: QuotaTree,
    ctx: PreemptionContext,
    targets: list[Target],
    allow_borrowing: bool,
    frs: frozenset[FlavorResource] | None = None,
) -> list[Target]:
    """Put the targets (all out of the tree) back, last but one first, while the workload still
    fits without them; returns those that must go. The ones kept out stay out of the tree.
    ``frs``: as the targets were taken out (:func:`take_out`)."""
    targets = list(targets)
    for i in range(len(targets) - 2, -1, -1):
        put_back(tree, targets[i].workload, frs)
        if workload_fits(ctx, allow_borrowing):
            targets[i] = targets[-1]
            targets.pop()
        else:
            take_out(tree, targets[i].workload, frs)
    return targets


def restore(tree: QuotaTree, targets: list[Target], frs: frozenset[FlavorResource] | None = None) -> None:
    """Put targets taken out of the tree back (``frs``: as they were taken out)."""
    for t in targets:
        put_back(tree, t.workload, frs)
