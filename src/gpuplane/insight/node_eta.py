"""The live ETA of work that waits for room on nodes, not only for quota: a one-pod workload
(the first single node with room, :func:`with_one_node`) and a gang of pods that each take part of
a node (the core's own placement asked as the workloads on its eligible nodes end,
:func:`with_room`). Both push the quota estimate of :mod:`gpuplane.insight.queue_eta` later, in its
scenarios and quantiles.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuplane.core.analysis import GangPlacement, GangPodSet, PlacementState, Scheduler
from gpuplane.core.session import SchedulerConfig
from gpuplane.insight.eta import predict_start
from gpuplane.insight.live_runtimes import NAMED, RuntimeModel, quantile
from gpuplane.insight.queue_eta import (
    QUANTILES,
    SCENARIOS,
    Estimate,
    main_resource,
    scenario_level,
    scenario_salt,
)
from gpuplane.model.objects import Workload


def with_one_node(  # noqa: PLR0913 - keyword-only: runtimes, config and time
    world: Scheduler,
    wl: Workload,
    quota: Estimate,
    *,
    runtimes: RuntimeModel,
    config: SchedulerConfig,
    now: float,
) -> Estimate:
    """``quota``, pushed later by the first node with room, for a one-pod whole-GPU workload.

    For a workload waiting on placement (fragmentation, no free GPU): a pod cannot span nodes, so it
    starts no earlier than the first single node has its GPUs free as that node's holders end.
    """
    pods = [ps for ps in wl.pod_sets if ps.count]
    resource = main_resource(wl, config)
    if (
        world.cluster is None
        or quota.seconds is None
        or len(pods) != 1
        or pods[0].count != 1
        or resource not in config.devices.whole_resources
    ):
        return quota
    need = float(pods[0].template.requests.get(resource, 0))
    values = []
    for q, mine in zip(QUANTILES, (quota.low, quota.seconds, quota.high), strict=True):
        node = _one_node(world, need, runtimes, now, q)
        values.append(None if node is None else round(max(mine or 0.0, node - now), 1))
    if values[1] is None:
        return Estimate(None, None, None, quota.basis + "; no single node ever has room")
    return Estimate(
        values[1], values[0], values[2], quota.basis + "; the pod needs one node with room", quota.runtimes
    )


@dataclass(frozen=True, slots=True)
class Room:
    """When the nodes have room for one gang shape: per scenario that finds room, the start and
    the workloads it waited for; and every workload on the eligible nodes (its workload, its
    ClusterQueue and the time it has run)."""

    starts: tuple[tuple[float, tuple[str, ...]], ...]
    owners: Mapping[str, tuple[Workload | None, str, float]]


def room_key(gangs: Sequence[Sequence[GangPodSet]]) -> str:
    """What decides :func:`with_room`'s answer for ``gangs``, apart from the cluster: the pods'
    counts and needs, flavors, topology and the template fields that decide their eligible nodes.
    Gangs of one key share one answer."""
    return repr(
        [
            (
                ps.count,
                repr(ps.needs),
                ps.flavor.name if ps.flavor is not None else None,
                ps.required_level,
                ps.preferred_level,
                sorted(ps.template.node_selector.items()),
                ps.template.tolerations,
                ps.template.required_node_terms,
                ps.claims,
            )
            for gang in gangs
            for ps in gang
        ]
    )


def with_room(  # noqa: PLR0913 - keyword-only: runtimes, time, the probe's name and the cache
    world: Scheduler,
    gangs: Sequence[Sequence[GangPodSet]],
    quota: Estimate,
    *,
    runtimes: RuntimeModel,
    now: float,
    probe: str,
    cache: dict[str, Room] | None = None,
) -> Estimate:
    """``quota``, pushed later to when the nodes have room for the whole gang, for a gang waiting
    on placement (its quota may be free, its nodes are not).

    ``gangs`` is the gang once per flavor it may use; the start is the earliest over them. In each
    of the :data:`SCENARIOS` the workloads on the gang's eligible nodes end at the scenario's
    quantile of their remaining runtime, and the core's own placement (topology included) is
    asked, under its undo, after which of those ends the gang fits (a bisection over the ends in
    order: one more end never takes room away). Each of low, median and high is the later of the
    quota's and the nodes' quantile. ``cache`` keeps the nodes' answer per :func:`room_key` for
    the other pending gangs of the same shape in the same cluster. Other pending gangs that wait
    for the same nodes are not played: for the second of two such gangs the start is early.
    """
    cluster = world.cluster
    if cluster is None or quota.seconds is None or not gangs:
        return quota
    key = room_key(gangs) if cache is not None else ""
    room = cache.get(key) if cache is not None else None
    if room is None:
        room = _room(world, gangs, runtimes=runtimes, now=now, probe=probe)
        if cache is not None:
            cache[key] = room
    owners = room.owners
    starts = list(room.starts)
    if len(starts) * 2 < SCENARIOS:
        return Estimate(None, None, None, quota.basis + "; the nodes never have room for the whole gang")
    starts.sort()
    values = [
        round(max(mine or 0.0, quantile([t for t, _ in starts], q) - now), 1)
        for q, mine in zip(QUANTILES, (quota.low, quota.seconds, quota.high), strict=True)
    ]
    waited = starts[len(starts) // 2][1]
    if not waited:
        return quota
    involved = [owners[o] for o in waited]
    who = ", ".join(o.removeprefix("pod:") for o in waited[:NAMED])
    if len(waited) > NAMED:
        who += f" and {len(waited) - NAMED} more"
    queue = next((q for _, q, _ in involved if q), "")
    end = "ends" if len(waited) == 1 else "end"
    words = f"the nodes have room for the whole gang when {who} {end} ({runtimes.basis(queue, involved)})"
    taken = {b.workload: b for b in (*quota.runtimes, *runtimes.bases(involved))}
    return Estimate(values[1], values[0], values[2], f"{quota.basis}; {words}", tuple(taken.values()))


def _room(
    world: Scheduler, gangs: Sequence[Sequence[GangPodSet]], *, runtimes: RuntimeModel, now: float, probe: str
) -> Room:
    """:class:`Room` of ``gangs``, found by the core's placement in every scenario."""
    cluster = world.cluster
    assert cluster is not None
    owners: dict[str, tuple[Workload | None, str, float]] = {}  # on any eligible node
    eligible: set[str] = set()
    for gang in gangs:
        for ps in gang:
            eligible |= cluster.eligible_names(ps)
    for owner, items in cluster.owners.items():
        if any(name in eligible for name, _, _ in items):
            aw = world.tree.admitted.get(owner)
            queue = aw.cluster_queue if aw is not None else ""
            elapsed = max(0.0, now - aw.reserved_at) if aw is not None else 0.0
            owners[owner] = (world.workloads.get(owner), queue, elapsed)
    salts = {o: scenario_salt(o) for o in owners}
    starts: list[tuple[float, tuple[str, ...]]] = []
    for k in range(SCENARIOS):
        ends = sorted(
            (now + runtimes.remaining_at(wl, queue, elapsed, scenario_level(k, salts[o])), o)
            for o, (wl, queue, elapsed) in owners.items()
        )
        found = [f for gang in gangs if (f := _room_after(cluster, gang, ends, now, probe)) is not None]
        if found:
            starts.append(min(found))
    return Room(tuple(starts), owners)


def _room_after(
    cluster: PlacementState,
    gang: Sequence[GangPodSet],
    ends: Sequence[tuple[float, str]],
    now: float,
    probe: str,
) -> tuple[float, tuple[str, ...]] | None:
    """When ``gang`` first fits as the owners of ``ends`` (in order) end, and the ones it waited
    for; ``None`` when it does not fit with them all gone."""

    def fits(k: int) -> bool:
        with cluster.without([o for _, o in ends[:k]]):
            placed = cluster.place(probe, list(gang))
            if not isinstance(placed, GangPlacement):
                return False
            cluster.release(probe)
            return True

    if fits(0):
        return now, ()
    if not ends or not fits(len(ends)):
        return None
    lo, hi = 0, len(ends)  # it fits after hi ends, not after lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid
    return ends[hi - 1][0], tuple(o for _, o in ends[:hi])


def _one_node(world: Scheduler, need: float, runtimes: RuntimeModel, now: float, q: float) -> float | None:
    """When the first node has ``need`` free whole GPUs, as its holders end (a pod fits on one node)."""
    cluster = world.cluster
    assert cluster is not None
    best: float | None = None
    for state in cluster.nodes.values():
        devices = [d for d in state.devices if d.sharing == "exclusive"]
        if len(devices) < need or state.node.unschedulable:
            continue
        releases: list[tuple[float, float]] = []
        for owner, items in cluster.owners.items():
            amount = sum(n.whole for name, n, _ in items if name == state.name)
            if not amount:
                continue
            held = world.tree.admitted.get(owner)
            wl = world.workloads.get(owner)
            if held is not None:
                elapsed = max(0.0, now - held.reserved_at)
                end = now + runtimes.remaining_at(wl, held.cluster_queue, elapsed, q)
            else:  # a pod outside any queue: no history of its own
                end = now + runtimes.total_at(None, "", q)
            releases.append((end, float(amount)))
        capacity = float(len(devices))
        free = float(sum(1 for d in devices if d.free_whole))
        start = predict_start(now, need, capacity=capacity, held=capacity - free, releases=sorted(releases))
        if start is not None and (best is None or start < best):
            best = start
    return best
