"""Quota accounting over the cohort tree.

A :class:`QuotaTree` is the core's working copy of quota and usage, built from a
frozen :class:`~gpuplane.model.objects.ClusterState` once per scheduling call. It is
the only mutable structure in a cycle, and every change to it is an add/remove pair:
preemption search and what-if analysis use :meth:`QuotaTree.without` and
:meth:`ClusterQueueNode.with_usage`, which restore the tree on exit.

Semantics follow Kueue's resource nodes:

* A node's ``subtree_quota`` is its own nominal quota plus what its children lend
  (their subtree quota minus the part their ``lendingLimit`` keeps local).
* Usage past a node's local (non-lendable) quota is stored in its parent.
* ``available`` is local headroom plus what the parent can give, capped by the
  node's ``borrowingLimit``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuplane.model.objects import ClusterQueue, ClusterState, ResourceGroup, ResourceQuota

FlavorResource = tuple[str, str]  # (flavor, resource)
Usage = Mapping[FlavorResource, int]


class QuotaNode:
    """Shared behaviour of ClusterQueues and Cohorts in the tree."""

    __slots__ = (
        "_potential",
        "fair_weight",
        "lends_partly",
        "name",
        "parent",
        "quotas",
        "subtree_quota",
        "usage",
    )

    def __init__(self, name: str, quotas: dict[FlavorResource, ResourceQuota], fair_weight: float) -> None:
        self.name = name
        self.parent: CohortNode | None = None
        self.quotas = quotas
        # Whether any quota has a lending limit: without one, nothing is kept local (the quotas
        # never change after the tree is built).
        self.lends_partly = any(q.lending_limit is not None for q in quotas.values())
        self.subtree_quota: dict[FlavorResource, int] = {}
        self.usage: dict[FlavorResource, int] = {}
        self.fair_weight = fair_weight
        self._potential: dict[FlavorResource, int] = {}  # see potential_available

    # --- capacity ---------------------------------------------------------

    def local_quota(self, fr: FlavorResource) -> int:
        """Capacity only this subtree sees: what the lending limit keeps back."""
        if not self.lends_partly:
            return 0
        quota = self.quotas.get(fr)
        if quota is None or quota.lending_limit is None:
            return 0
        return max(0, self.subtree_quota.get(fr, 0) - quota.lending_limit)

    def local_available(self, fr: FlavorResource) -> int:
        # max(0, ...) written out: asked for every node on every quota question.
        free = (self.local_quota(fr) if self.lends_partly else 0) - self.usage.get(fr, 0)
        return free if free > 0 else 0

    def raw_available(self, fr: FlavorResource) -> int:
        """Headroom for ``fr``; negative when the subtree is over-admitted."""
        parent = self.parent
        used = self.usage.get(fr, 0)
        if parent is None:
            return self.subtree_quota.get(fr, 0) - used
        parent_available = parent.raw_available(fr)
        quota = self.quotas.get(fr)
        if quota is not None and quota.borrowing_limit is not None:
            lq = self.local_quota(fr)
            stored_in_parent = self.subtree_quota.get(fr, 0) - lq
            used_in_parent = max(0, used - lq)
            parent_available = min(
                stored_in_parent - used_in_parent + quota.borrowing_limit, parent_available
            )
        return self.local_available(fr) + parent_available

    def potential_available(self, fr: FlavorResource) -> int:
        """The most this node could ever use of ``fr``, ignoring current usage. It reads quotas
        alone, fixed once the tree is built (:meth:`QuotaTree._accumulate`): remembered."""
        known = self._potential.get(fr)
        if known is not None:
            return known
        parent = self.parent
        if parent is None:
            avail = self.subtree_quota.get(fr, 0)
        else:
            avail = self.local_quota(fr) + parent.potential_available(fr)
            quota = self.quotas.get(fr)
            if quota is not None and quota.borrowing_limit is not None:
                avail = min(self.subtree_quota.get(fr, 0) + quota.borrowing_limit, avail)
        self._potential[fr] = avail
        return avail

    def borrowing_with(self, fr: FlavorResource, extra: int) -> bool:
        return self.subtree_quota.get(fr, 0) < self.usage.get(fr, 0) + extra

    def within_nominal(self, frs: frozenset[FlavorResource] | set[FlavorResource]) -> bool:
        quota, usage = self.subtree_quota, self.usage
        for fr in frs:  # noqa: SIM110 - a loop, not all() over a generator: asked in every preemption search
            if quota.get(fr, 0) < usage.get(fr, 0):
                return False
        return True

    # --- usage ------------------------------------------------------------

    def add_usage(self, fr: FlavorResource, value: int) -> None:
        """Account ``value`` to this node; what its local quota cannot hold goes on up the tree
        (a loop up the ancestors: every admission and every preemption search asks it)."""
        node: QuotaNode = self
        while True:
            local_available = node.local_available(fr)
            node.usage[fr] = node.usage.get(fr, 0) + value
            parent = node.parent
            if parent is None or value <= local_available:
                return
            value -= local_available
            node = parent

    def remove_usage(self, fr: FlavorResource, value: int) -> None:
        """Take back ``value``, and from each ancestor what the node below had stored there."""
        node: QuotaNode = self
        while True:
            used = node.usage.get(fr, 0)
            stored_in_parent = used - node.local_quota(fr)
            node.usage[fr] = used - value
            parent = node.parent
            if stored_in_parent <= 0 or parent is None:
                return
            value = min(value, stored_in_parent)
            node = parent

    # --- tree -------------------------------------------------------------

    def ancestors(self) -> Iterator[CohortNode]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def root(self) -> QuotaNode:
        node: QuotaNode = self
        while node.parent is not None:
            node = node.parent
        return node

    # --- fair sharing -----------------------------------------------------

    def dominant_resource_share(self) -> DRS:
        """Kueue's DRS: the largest borrowed share of what the parent can lend."""
        if self.parent is None:
            return DRS(self.fair_weight, 0.0, "", False, ())
        borrowed: dict[str, int] = {}
        borrowed_frs: list[FlavorResource] = []
        for fr, quota in self.subtree_quota.items():
            amount = self.usage.get(fr, 0) - quota
            if amount > 0:
                borrowed[fr[1]] = borrowed.get(fr[1], 0) + amount
                borrowed_frs.append(fr)
        if not borrowed:
            return DRS(self.fair_weight, 0.0, "", False, ())
        lendable = self.parent.lendable()
        ratio, dominant = 0.0, ""
        for resource, amount in borrowed.items():
            lend = lendable.get(resource, 0)
            if lend > 0:
                share = amount * 1000.0 / lend
                if share > ratio or (share == ratio and resource < dominant):
                    ratio, dominant = share, resource
        return DRS(self.fair_weight, ratio, dominant, True, tuple(borrowed_frs))

    def lendable(self) -> dict[str, int]:
        root = self.root()
        out: dict[str, int] = {}
        for fr in root.subtree_quota:
            out[fr[1]] = out.get(fr[1], 0) + self.potential_available(fr)
        return out


@dataclass(frozen=True, slots=True)
class DRS:
    """A dominant resource share with Kueue's comparison rules."""

    fair_weight: float
    unweighted_ratio: float
    dominant_resource: str
    borrowing: bool
    borrowed_frs: tuple[FlavorResource, ...] = ()

    @property
    def is_zero(self) -> bool:
        return self.unweighted_ratio == 0

    @property
    def zero_weight_borrows(self) -> bool:
        # Kueue's zeroWeightBorrows: a zero weight with a non-zero share (borrowing on a resource
        # nobody can lend has a zero share and stays comparable).
        return self.fair_weight == 0 and not self.is_zero

    def weighted(self) -> float:
        if self.zero_weight_borrows:
            return float("inf")
        if self.is_zero:
            return 0.0
        return self.unweighted_ratio / self.fair_weight

    def borrowing_on(self, requested: Usage) -> bool:
        return any(requested.get(fr, 0) > 0 for fr in self.borrowed_frs)


NEGATIVE_DRS = DRS(1.0, -1.0, "", False, ())


def compare_drs(a: DRS, b: DRS) -> int:
    """-1, 0 or 1: lower shares are scheduled first and preempted last."""
    if a.zero_weight_borrows and b.zero_weight_borrows:
        return (a.unweighted_ratio > b.unweighted_ratio) - (a.unweighted_ratio < b.unweighted_ratio)
    if a.zero_weight_borrows:
        return 1
    if b.zero_weight_borrows:
        return -1
    wa, wb = a.weighted(), b.weighted()
    return (wa > wb) - (wa < wb)


class CohortNode(QuotaNode):
    __slots__ = ("child_cohorts", "child_queues", "resource_group_of")

    def __init__(
        self,
        name: str,
        quotas: dict[FlavorResource, ResourceQuota],
        fair_weight: float,
        groups: tuple[ResourceGroup, ...] = (),
    ) -> None:
        super().__init__(name, quotas, fair_weight)
        self.child_cohorts: list[CohortNode] = []
        self.child_queues: list[ClusterQueueNode] = []
        self.resource_group_of = {res: group for group in groups for res in group.covered_resources}

    def subtree_queues(self) -> Iterator[ClusterQueueNode]:
        yield from self.child_queues
        for child in self.child_cohorts:
            yield from child.subtree_queues()


@dataclass(slots=True)
class AdmittedWorkload:
    """A workload that holds quota in the tree, with its usage per flavor-resource."""

    key: str
    cluster_queue: str
    usage: dict[FlavorResource, int]
    flavors: frozenset[FlavorResource] = field(default_factory=frozenset)
    priority: int = 0
    uid: str = ""
    evicted: bool = False
    reserved_at: float = 0.0  # when quota was reserved (QuotaReserved condition)
    queue_timestamp: float = 0.0  # Kueue's queue-order time, for LowerOrNewerEqualPriority
    last_checkpoint: float | None = None  # from the gpuplane.dev/last-checkpoint annotation

    def work_at_risk(self, now: float) -> float:
        """Seconds of work a preemption would throw away."""
        since = (
            self.reserved_at if self.last_checkpoint is None else max(self.reserved_at, self.last_checkpoint)
        )
        return max(0.0, now - since)


class ClusterQueueNode(QuotaNode):
    __slots__ = (
        "_groups",
        "active",
        "flavor_resources",
        "open_group",
        "priority_usage",
        "resource_group_of",
        "spec",
        "workloads",
    )

    def __init__(self, spec: ClusterQueue) -> None:
        super().__init__(spec.name, quotas_of(spec.resource_groups), spec.fair_weight)
        self.spec = spec
        # An inactive queue (stopped, or naming a missing flavor) still counts in its cohort's
        # quota and usage, as in Kueue's cache, but is left out of the scheduling snapshot:
        # it admits nothing and its workloads are never preemption candidates.
        self.active = True
        self.workloads: dict[str, AdmittedWorkload] = {}
        # Usage of the admitted workloads by priority: lets a preemption search bound what it
        # could free without visiting every workload (kept by QuotaTree.add/remove_workload).
        self.priority_usage: dict[int, dict[FlavorResource, int]] = {}
        self.resource_group_of: dict[str, ResourceGroup] = {}
        # A group that covers no resource (refused by a real API server, but used by
        # Kueue's own tests) gives its flavors to every other resource with a nominal
        # quota of zero: the queue can only borrow them from its cohort.
        self.open_group: ResourceGroup | None = None
        for group in spec.resource_groups:
            if not group.covered_resources and self.open_group is None:
                self.open_group = group
            for res in group.covered_resources:
                self.resource_group_of[res] = group
        self.flavor_resources = frozenset(self.quotas)
        self._groups: dict[str, ResourceGroup | None] = {}  # see group_for

    def group_for(self, resource: str) -> ResourceGroup | None:
        """The resource group that provides ``resource``, if any.

        A queue with no resource groups at all is a pure borrower: it takes the
        group of the nearest ancestor cohort that covers the resource, with a
        nominal quota of zero in each of its flavors.

        Asked for every resource of every flavor assignment, and remembered: the groups of the
        queue and of its cohorts are fixed once the tree is built (the tree is built whole
        before anything asks).
        """
        groups = self._groups
        if resource in groups:
            return groups[resource]
        group = self._group_for(resource)
        groups[resource] = group
        return group

    def _group_for(self, resource: str) -> ResourceGroup | None:
        group = self.resource_group_of.get(resource, self.open_group)
        if group is None and not self.spec.resource_groups:
            for cohort in self.ancestors():
                inherited = cohort.resource_group_of.get(resource)
                if inherited is not None:
                    return inherited
        return group

    def available(self, fr: FlavorResource) -> int:
        raw = self.raw_available(fr)
        return raw if raw > 0 else 0

    def quota_for(self, fr: FlavorResource) -> ResourceQuota:
        return self.quotas.get(fr) or ResourceQuota(nominal=0)

    def fits(self, usage: Usage) -> bool:
        for fr, q in usage.items():  # noqa: SIM110 - a loop, not all() over a generator: asked per entry
            if self.available(fr) < q:
                return False
        return True

    def add_usage_map(self, usage: Usage) -> None:
        for fr, q in usage.items():
            self.add_usage(fr, q)

    def remove_usage_map(self, usage: Usage) -> None:
        for fr, q in usage.items():
            self.remove_usage(fr, q)

    @contextmanager
    def with_usage(self, usage: Usage) -> Iterator[None]:
        """Temporarily account ``usage`` to this queue (and its ancestors)."""
        self.add_usage_map(usage)
        try:
            yield
        finally:
            self.remove_usage_map(usage)

    @contextmanager
    def without_usage(self, usage: Usage) -> Iterator[None]:
        self.remove_usage_map(usage)
        try:
            yield
        finally:
            self.add_usage_map(usage)


def quotas_of(groups: tuple[ResourceGroup, ...]) -> dict[FlavorResource, ResourceQuota]:
    out: dict[FlavorResource, ResourceQuota] = {}
    for group in groups:
        for flavor in group.flavors:
            for res, quota in flavor.resources.items():
                out[(flavor.name, res)] = quota
    return out


class QuotaTree:
    """All ClusterQueues and Cohorts, with the usage of admitted workloads."""

    def __init__(self, state: ClusterState) -> None:
        self.queues: dict[str, ClusterQueueNode] = {}
        self.cohorts: dict[str, CohortNode] = {}
        for name, cohort in state.cohorts.items():
            self.cohorts[name] = CohortNode(
                name, quotas_of(cohort.resource_groups), cohort.fair_weight, cohort.resource_groups
            )
        for name, cohort_spec in state.cohorts.items():
            if cohort_spec.parent:
                parent = self._cohort(cohort_spec.parent)
                self.cohorts[name].parent = parent
                parent.child_cohorts.append(self.cohorts[name])
        for name in sorted(state.cluster_queues):
            spec = state.cluster_queues[name]
            node = ClusterQueueNode(spec)
            self.queues[name] = node
            if spec.cohort:
                parent = self._cohort(spec.cohort)
                node.parent = parent
                parent.child_queues.append(node)
        for cohort_node in self.cohorts.values():
            cohort_node.child_cohorts.sort(key=lambda c: c.name)
            cohort_node.child_queues.sort(key=lambda q: q.name)
        for root in self.roots():
            self._accumulate(root)
        self.admitted: dict[str, AdmittedWorkload] = {}

    def _cohort(self, name: str) -> CohortNode:
        node = self.cohorts.get(name)
        if node is None:  # implicit cohort: named by a queue or a child, with no object
            node = CohortNode(name, {}, 1.0)
            self.cohorts[name] = node
        return node

    def roots(self) -> list[QuotaNode]:
        out: list[QuotaNode] = [c for c in self.cohorts.values() if c.parent is None]
        out += [q for q in self.queues.values() if q.parent is None]
        return sorted(out, key=lambda n: n.name)

    def _accumulate(self, node: QuotaNode) -> None:
        node.subtree_quota = {fr: q.nominal for fr, q in node.quotas.items()}
        node._potential.clear()
        if isinstance(node, CohortNode):
            for child in [*node.child_cohorts, *node.child_queues]:
                self._accumulate(child)
                for fr, quota in child.subtree_quota.items():
                    node.subtree_quota[fr] = node.subtree_quota.get(fr, 0) + quota - child.local_quota(fr)

    # --- workloads ----------------------------------------------------------

    def add_workload(self, wl: AdmittedWorkload) -> None:
        cq = self.queues.get(wl.cluster_queue)
        if cq is None:
            return
        cq.add_usage_map(wl.usage)
        cq.workloads[wl.key] = wl
        self.admitted[wl.key] = wl
        by_priority = cq.priority_usage.setdefault(wl.priority, {})
        for fr, value in wl.usage.items():
            by_priority[fr] = by_priority.get(fr, 0) + value

    def remove_workload(self, wl: AdmittedWorkload) -> None:
        cq = self.queues.get(wl.cluster_queue)
        if cq is None or wl.key not in cq.workloads:
            return
        cq.remove_usage_map(wl.usage)
        del cq.workloads[wl.key]
        del self.admitted[wl.key]
        by_priority = cq.priority_usage[wl.priority]
        for fr, value in wl.usage.items():
            by_priority[fr] -= value
        if not any(by_priority.values()):
            del cq.priority_usage[wl.priority]

    @contextmanager
    def without(self, workloads: list[AdmittedWorkload]) -> Iterator[None]:
        """Simulate the removal of ``workloads``; restores them on exit."""
        removed = [w for w in workloads if w.key in self.admitted]
        for w in removed:
            self.remove_workload(w)
        try:
            yield
        finally:
            for w in removed:
                self.add_workload(w)

    def remove_usage_of(self, wl: AdmittedWorkload, frs: Collection[FlavorResource]) -> bool:
        """Take only ``wl``'s usage of ``frs`` out of the tree; False, and nothing taken, when
        ``wl`` is not admitted here. Undone by :meth:`add_usage_of`.

        A node's usage of a flavor-resource depends only on the totals below it, and each
        flavor-resource's usage moves up the tree on its own, so whatever a question about
        ``frs`` alone reads is then as if ``wl`` had left. It skips the workload's other
        resources and the books of who is admitted: what a search that asks only about some
        flavor-resources need not pay for at each workload it tries.
        """
        cq = self.queues.get(wl.cluster_queue)
        if cq is None or wl.key not in cq.workloads:
            return False
        for fr, value in wl.usage.items():
            if value and fr in frs:
                cq.remove_usage(fr, value)
        return True

    def add_usage_of(self, wl: AdmittedWorkload, frs: Collection[FlavorResource]) -> None:
        """Put back what :meth:`remove_usage_of` took out."""
        cq = self.queues[wl.cluster_queue]
        for fr, value in wl.usage.items():
            if value and fr in frs:
                cq.add_usage(fr, value)

    @contextmanager
    def without_usage_of(
        self, workloads: Iterable[AdmittedWorkload], frs: Collection[FlavorResource]
    ) -> Iterator[None]:
        """:meth:`without` as seen by ``frs`` alone (see :meth:`remove_usage_of`)."""
        removed = [w for w in workloads if self.remove_usage_of(w, frs)]
        try:
            yield
        finally:
            for w in removed:
                self.add_usage_of(w, frs)
