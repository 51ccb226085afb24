"""What gpuplane's core sees in ``simulate-capacity``: the queues with their quotas, the free room
on ready nodes, the running jobs (holding quota) and the queue of pending ones as Workloads.

One ClusterQueue per team, all in one cohort (so a queue borrows what others leave unused), one
ResourceFlavor per pool (nodes labelled ``pool``), each queue's flavors in its pools' order. Each
ready node offers only its free GPUs, so the core places new pods in what is left. Running jobs
are not shown as Workloads: the quota they hold is taken off the queues' nominal quotas instead
(:func:`remaining_quota`). With borrowing unlimited within the cohort, what a queue may admit in a
pool is what the whole cohort has left there, so only that sum has to be right: each queue gets
its own unused quota, scaled down so that the lenders' shares add up to what is left.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuplane.core.session import Reason
from gpuplane.model.conditions import ConditionType
from gpuplane.model.labels import HOSTNAME_LABEL
from gpuplane.model.objects import (
    ClusterQueue,
    ClusterState,
    Condition,
    FlavorQuotas,
    LabelSelector,
    LocalQueue,
    Namespace,
    Node,
    PodSet,
    PodTemplate,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Workload,
    frozen_map,
)
from gpuplane.sim.capacity_scenario import Arrival, PoolSpec, QueueSpec

GPU = "nvidia.com/gpu"
POOL_LABEL = "pool"


@dataclass(frozen=True, slots=True)
class FreeNode:
    """A ready node's free room, as the core is shown it."""

    name: str
    pool: str
    free_gpus: int
    booked_first: bool  # provisioned for a job still queued: listed first


def remaining_quota(
    queues: Sequence[QueueSpec], used: Mapping[tuple[str, str], int]
) -> dict[tuple[str, str], int]:
    """Per (queue, pool), the nominal quota to show the core, given the GPUs running jobs hold."""
    out: dict[tuple[str, str], int] = {}
    pools = sorted({p for q in queues for p in q.pools})
    for pool in pools:
        quota = {q.name: dict(q.quota)[pool] for q in queues if pool in q.pools}
        left = max(0, sum(quota.values()) - sum(used.get((q, pool), 0) for q in quota))
        own = {q: max(0, n - used.get((q, pool), 0)) for q, n in quota.items()}
        total = sum(own.values())
        shares = {q: (o * left) // total if total else 0 for q, o in own.items()}
        if total:
            biggest = max(own, key=lambda q: own[q])
            shares[biggest] += left - sum(shares.values())
        for q, n in shares.items():
            out[q, pool] = n
    return out


def core_state(  # noqa: PLR0913 - the world, as separate pieces (keyword-only)
    pools: Sequence[PoolSpec],
    queues: Sequence[QueueSpec],
    *,
    free: Sequence[FreeNode],
    used: Mapping[tuple[str, str], int],
    pending: Sequence[tuple[Arrival, bool]],
    now: float,
) -> ClusterState:
    """``used``: GPUs held by running jobs per (queue, pool); ``pending``: the queue in admission
    order, each with whether it was interrupted."""
    nominal = remaining_quota(queues, used)
    nodes = tuple(
        Node(
            name=n.name,
            allocatable=frozen_map({GPU: n.free_gpus, "pods": 110}),
            labels=frozen_map({HOSTNAME_LABEL: n.name, POOL_LABEL: n.pool}),
        )
        for n in sorted(free, key=lambda n: (not n.booked_first, n.name))
        if n.free_gpus > 0
    )
    workloads = []
    for order, (arrival, interrupted) in enumerate(pending):
        conditions: tuple[Condition, ...] = ()
        if interrupted:
            conditions = (Condition(ConditionType.EVICTED, True, Reason.NODE_INTERRUPTED, "", now),)
        template = PodTemplate(requests=frozen_map({GPU: arrival.gpus_per_pod}))
        workloads.append(
            Workload(
                namespace=arrival.queue,
                name=f"j{arrival.job}",
                uid=f"j{arrival.job}",
                creation=float(order + 1),
                priority=0,
                pod_sets=(PodSet("main", arrival.pods, template),),
                queue_name="q",
                conditions=conditions,
            )
        )
    return ClusterState(
        namespaces=frozen_map({q.name: Namespace(q.name) for q in queues}),
        resource_flavors=frozen_map(
            {p.name: ResourceFlavor(p.name, node_labels=frozen_map({POOL_LABEL: p.name})) for p in pools}
        ),
        cluster_queues=frozen_map({q.name: _cluster_queue(q, nominal) for q in queues}),
        local_queues=frozen_map({f"{q.name}/q": LocalQueue(q.name, "q", q.name) for q in queues}),
        workloads=tuple(workloads),
        nodes=nodes,
        pods=(),
    )


def _cluster_queue(queue: QueueSpec, nominal: Mapping[tuple[str, str], int]) -> ClusterQueue:
    flavors = tuple(
        FlavorQuotas(p, frozen_map({GPU: ResourceQuota(nominal=nominal[queue.name, p])})) for p in queue.pools
    )
    return ClusterQueue(
        name=queue.name,
        resource_groups=(ResourceGroup((GPU,), flavors),),
        cohort="all",
        namespace_selector=LabelSelector(),
    )
