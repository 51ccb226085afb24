"""What a nomination reads of a workload, as a small number (its shape), and the flavors it could be
assigned: read once per workload and remembered while the workload, its queue and its priority stay
the same."""

from __future__ import annotations

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import EligibilityMemo
from gpuplane.core.quota import QuotaTree
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import ResourceFlavor, Workload


class Shapes:
    """Owns each pending workload's shape number (and the numbering of shapes) and the flavors it
    could be assigned, each with the workload object, queue (and priority) it was read for."""

    def __init__(
        self,
        tree: QuotaTree,
        config: SchedulerConfig,
        flavors: dict[str, ResourceFlavor],
        eligibility: EligibilityMemo,
    ) -> None:
        self.tree = tree
        self.config = config
        self.flavors = flavors
        self.eligibility = eligibility
        self._shapes: dict[str, tuple[Workload, str, int, int]] = {}
        self._shape_ids: dict[tuple[object, ...], int] = {}
        # By workload: the workload object and queue read, and the flavors it could take there.
        self.eligible: dict[str, tuple[Workload, str, frozenset[str]]] = {}

    def forget(self, key: str) -> None:
        """The workload left its queue (admitted or withdrawn)."""
        self._shapes.pop(key, None)
        self.eligible.pop(key, None)

    def of(self, pending: PendingWorkload) -> int | None:
        """What a nomination reads of a workload, as a small number (equal for equal shapes), or
        ``None`` where the outcome may depend on more (fair sharing orders by usage;
        ``LowerOrNewerEqualPriority`` by queue time)."""
        wl = pending.workload
        cached = self._shapes.get(pending.key)
        # Read again when requeued elsewhere or at another priority.
        if cached is not None and cached[0] is wl:
            _, queue, priority, number = cached
            if queue == pending.cluster_queue and priority == pending.priority:
                return number
        if self.config.fair_sharing:
            return None
        policy = self.tree.queues[pending.cluster_queue].spec.preemption
        if "LowerOrNewerEqualPriority" in (policy.within_cluster_queue, policy.reclaim_within_cohort):
            return None
        pod_sets = tuple(
            (
                ps.name,
                ps.count,
                ps.min_count,
                ps.required_topology,
                ps.preferred_topology,
                tuple(sorted(ps.template.requests.items())),
                ps.template.limits_below_requests,
                tuple(sorted(ps.template.node_selector.items())),
                ps.template.required_node_terms,
                ps.template.tolerations,
                tuple(sorted(ps.template.labels.items())),
                tuple(sorted(ps.template.annotations.items())),
                ps.template.claims,  # claims name their own devices (in the namespace, in the shape)
            )
            for ps in wl.pod_sets
        )
        shape = (pending.cluster_queue, pending.priority, wl.namespace, pod_sets)
        number = self._shape_ids.setdefault(shape, len(self._shape_ids))
        self._shapes[pending.key] = (wl, pending.cluster_queue, pending.priority, number)
        return number

    def eligible_flavors(self, pending: PendingWorkload) -> frozenset[str]:
        """Every flavor the workload could be assigned in its ClusterQueue: in the resource group of
        a resource it requests, tolerated, and matching its node selector and affinity."""
        cached = self.eligible.get(pending.key)
        if cached is not None and cached[0] is pending.workload and cached[1] == pending.cluster_queue:
            return cached[2]
        cq = self.tree.queues[pending.cluster_queue]
        names: set[str] = set()
        for ps in pending.workload.pod_sets:
            template = ps.template
            for res in template.quota_requests:
                group = cq.group_for(res)
                if group is None:
                    continue
                for fq in group.flavors:
                    flavor = self.flavors.get(fq.name)
                    if flavor is not None and self.eligibility.why_not(fq.name, flavor, template) is None:
                        names.add(fq.name)
        out = frozenset(names)
        self.eligible[pending.key] = (pending.workload, pending.cluster_queue, out)
        return out
