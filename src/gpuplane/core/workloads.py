"""Per-workload views the scheduler works with.

``PendingWorkload`` wraps a pending :class:`~gpuplane.model.objects.Workload` with the
ClusterQueue it is queued in; ``admitted_usage`` turns an admission into the quota
usage it holds in the tree.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuplane.core.quota import AdmittedWorkload, FlavorResource
from gpuplane.model.objects import Workload
from gpuplane.model.quantity import MAX_BASE_UNITS
from gpuplane.model.records import last_checkpoint


@dataclass(slots=True)
class PendingWorkload:
    """A workload waiting in a ClusterQueue.

    ``timestamp`` is the queue-order time (creation, or the time it was last
    evicted); ``sequence`` breaks remaining ties so every run is reproducible.
    """

    workload: Workload
    cluster_queue: str
    local_queue: str
    priority: int
    timestamp: float
    sequence: int
    key: str = ""
    # What pod_set_requests gives at each list of counts asked: the workload is immutable and stays
    # the same object while it is pending, so its requests never change (see requests_at).
    _requests: dict[tuple[int, ...], list[dict[str, int]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.key = self.workload.key

    def requests_at(self, counts: list[int]) -> list[dict[str, int]]:
        """:func:`pod_set_requests` of the workload at ``counts``, remembered (asked by every
        nomination of the workload). The lists and dicts are shared: callers never change them."""
        key = tuple(counts)
        known = self._requests.get(key)
        if known is None:
            known = self._requests[key] = pod_set_requests(self.workload, counts)
        return known

    def sort_key(self) -> tuple[int, float, int]:
        return (-self.priority, self.timestamp, self.sequence)


def queue_position(queue: list[PendingWorkload], pending: PendingWorkload) -> int:
    """Where ``pending`` is in ``queue`` (kept sorted by :meth:`PendingWorkload.sort_key`): found by
    bisection on the sort key, not by comparing every workload before it."""
    i = bisect_left(queue, pending.sort_key(), key=PendingWorkload.sort_key)
    if i < len(queue) and queue[i] is pending:
        return i
    for j, queued in enumerate(queue):  # the queue was reordered in place: look at every entry
        if queued is pending:
            return j
    raise ValueError(f"{pending.key} is not in its queue")


def pod_set_requests(wl: Workload, counts: list[int] | None = None) -> list[dict[str, int]]:
    """Total quota requests of each pod set: per-pod :attr:`PodTemplate.quota_requests` (requests
    plus a GPU share's charge) times the (reduced) count.

    Totals saturate at the int64 bound, as Kueue's ``SaturatingMul`` does, so a huge request
    stays one huge number (that exceeds every quota) rather than growing without bound.
    """
    out = []
    for i, ps in enumerate(wl.pod_sets):
        count = ps.count if counts is None else counts[i]
        out.append({res: min(q * count, MAX_BASE_UNITS) for res, q in ps.template.quota_requests.items()})
    return out


def admitted_usage(wl: Workload, priority: int, now: float) -> AdmittedWorkload | None:
    """Quota held by an admitted workload, from its ``status.admission``."""
    admission = wl.admission
    if admission is None:
        return None
    usage: dict[FlavorResource, int] = {}
    flavors: set[FlavorResource] = set()
    for psa in admission.pod_set_assignments:
        for res, flavor in psa.flavors.items():
            flavors.add((flavor, res))
        # Pods that ended and will not run again give their share back (Kueue's reclaimablePods).
        ended = min(wl.reclaimable.get(psa.name, 0), psa.count)
        for res, total in psa.resource_usage.items():
            flavor_name = psa.flavors.get(res)
            q = total - total * ended // psa.count if ended and psa.count else total
            if flavor_name is None or q == 0:
                continue
            fr = (flavor_name, res)
            usage[fr] = usage.get(fr, 0) + q
    return AdmittedWorkload(
        key=wl.key,
        cluster_queue=admission.cluster_queue,
        usage=usage,
        flavors=frozenset(flavors),
        priority=priority,
        uid=wl.uid,
        evicted=wl.evicted,
        reserved_at=wl.quota_reservation_time(now),
        queue_timestamp=wl.queue_order_timestamp,
        last_checkpoint=last_checkpoint(wl.annotations),
    )


def usage_from_assignment(
    pending: PendingWorkload,
    usage: Mapping[FlavorResource, int],
    flavors: frozenset[FlavorResource],
    now: float,
) -> AdmittedWorkload:
    """The quota a newly admitted workload holds from now on."""
    return AdmittedWorkload(
        key=pending.key,
        cluster_queue=pending.cluster_queue,
        usage={fr: q for fr, q in usage.items() if q},
        flavors=flavors,
        priority=pending.priority,
        uid=pending.workload.uid,
        evicted=False,
        reserved_at=now,
        queue_timestamp=pending.timestamp,
    )
