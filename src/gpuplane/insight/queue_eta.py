"""ETA for the pending workloads of a real cluster state (after a plan), as ranges with their basis.

:mod:`gpuplane.insight.eta` plays a queue forward for the simulator; this module plays the
ClusterQueues of a cluster state, from what the control plane knows at a moment in time:

* **capacity**: what the ClusterQueue could ever use of a workload's main resource (its nominal
  quota plus what it may borrow from its cohort), and, for a one-pod workload waiting on
  placement, the first single node with room (:func:`gpuplane.insight.node_eta.with_one_node`);
* **held and releases**: admitted workloads of the queue (and the part of the cohort's
  workloads that borrows) release what they hold when they end;
* **runtimes**: :mod:`gpuplane.insight.live_runtimes`: learned from finished runs by job name,
  team and size, queue and cluster (:mod:`gpuplane.insight.runtime_predictor`), or declared with
  the ``gpuplane.dev/expected-runtime`` annotation, or assumed; a running workload's remaining time
  is conditioned on the time it ran (one that ran past its expected end gets a tail estimate, never
  0), and ``activeDeadlineSeconds`` caps it;
* **reclaim**: a queue below its nominal quota whose ClusterQueue may reclaim within the cohort
  gets the borrowed part back now, not when the borrowers end;
* **queue order**: BestEffortFIFO lets a workload that fits start past one that does not;
  StrictFIFO does not;
* **work still to come**: once a ClusterQueue has seen :data:`MIN_ARRIVALS` workloads, work keeps
  arriving at its recent rate, each like one of its recent workloads, and under BestEffortFIFO
  starts ahead of a waiting workload where it fits (:class:`_Arrivals`);
* **gangs waiting for room on their nodes**: a gang whose quota is free but whose nodes are
  not starts when the core's placement finds room for it as the workloads on its eligible nodes
  end, the earliest over its flavors (:func:`gpuplane.insight.node_eta.with_room`);
* **whole-node gangs**: a workload whose every pod takes a whole node (:func:`node_gang`) is also
  replayed on the nodes, with the pending whole-node gangs of every ClusterQueue that share them,
  by :func:`gpuplane.insight.eta.gang_start`, the simulator's method (:func:`estimate_gangs`).

The queue is played in :data:`SCENARIOS` scenarios of the runtimes (:func:`estimate_queue`); the
range is the 10th to 90th percentile of the starts (:data:`QUANTILES`), the estimate their
median.
``bench/eta_accuracy.py`` measures it against the core's real starts.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import random
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from gpuplane.core.analysis import (
    AdmittedWorkload,
    ClusterQueueNode,
    CohortNode,
    GangPodSet,
    Scheduler,
)
from gpuplane.core.session import PendingDecision, SchedulerConfig, pod_needs
from gpuplane.insight.eta import EPSILON, Gang, NodeFree, NodeReplay, gang_starts
from gpuplane.insight.live_runtimes import RuntimeBasis, RuntimeModel, quantile
from gpuplane.model.gpu_share import FRACTION_RESOURCE
from gpuplane.model.objects import Workload

QUANTILES = (0.1, 0.5, 0.9)  # the range: 10th to 90th percentile of the start, and the median
SCENARIOS = 32  # plays of the queue per estimate
PLAYED = 300  # workloads of a queue played one by one; later ones are estimated from their work


@dataclass(frozen=True, slots=True)
class Estimate:
    """A predicted start as seconds from now; ``None`` everywhere when it never starts by itself."""

    seconds: float | None
    low: float | None
    high: float | None
    basis: str
    runtimes: tuple[RuntimeBasis, ...] = ()  # the runtimes it took, by workload, and their bases


def main_resource(wl: Workload, config: SchedulerConfig) -> str:
    """The resource a workload's wait is measured in: its accelerator (or the charge of its GPU
    shares), else its largest quota request."""
    totals: dict[str, int] = {}
    for ps in wl.pod_sets:
        for res, q in ps.template.quota_requests.items():
            totals[res] = totals.get(res, 0) + q * ps.count
    devices = sorted(
        r for r in totals if (r == FRACTION_RESOURCE or config.devices.is_device_resource(r)) and totals[r]
    )
    if devices:
        return devices[0]
    return max(sorted(totals), key=lambda r: totals[r], default="")


def _need(wl: Workload, resource: str) -> float:
    return float(sum(ps.template.quota_requests.get(resource, 0) * ps.count for ps in wl.pod_sets))


def _cohort_queues(cq: ClusterQueueNode) -> list[ClusterQueueNode]:
    root = cq.root()
    return list(root.subtree_queues()) if isinstance(root, CohortNode) else [cq]


def scenario_salt(key: str) -> tuple[float, ...]:
    """The quantiles of one workload's runtime in the :data:`SCENARIOS` scenarios: one in each of as
    many equal strata, so its scenarios cover its distribution evenly, in an order of its own drawn
    from its key, so that the workloads' quantiles are independent of each other (a Latin hypercube)
    and the same on every run. (Strata rotated by one offset per workload were not independent: the
    sum of many runtimes then came out nearly the same in every scenario, and the range too narrow.)"""
    rng = random.Random(hashlib.sha256(key.encode()).digest())
    order = list(range(SCENARIOS))
    rng.shuffle(order)
    return tuple((stratum + rng.random()) / SCENARIOS for stratum in order)


def scenario_level(k: int, salt: tuple[float, ...]) -> float:
    """The quantile scenario ``k`` of :data:`SCENARIOS` uses for one workload."""
    return salt[k]


@dataclass(frozen=True, slots=True)
class _Item:
    key: str
    amount: float
    workload: Workload | None


_Waiting = tuple[str | None, float, float]  # (key, or None for work still to come; amount; duration)


@dataclass(slots=True)
class _Pools:
    """A play's pools: the room left in each (in the order the queue tries them), the largest
    capacity, and the ends of what runs (a heap of ``(end, pool, amount)``)."""

    room: dict[str, float]
    largest: float
    total: float
    ends: list[tuple[float, str, float]]
    order: list[str] = field(init=False)

    def __post_init__(self) -> None:
        self.order = list(self.room)

    def start(self, amount: float, duration: float, at: float) -> bool:
        """Start ``amount`` for ``duration`` at ``at`` in the first pool with room (across the pools
        when larger than each); ``False`` when it does not fit."""
        taken = _take(self.room, self.order, amount, split=amount > self.largest + EPSILON)
        if taken is None:
            return False
        for pool, part in taken:
            heapq.heappush(self.ends, (at + duration, pool, part))
        return True


def play(  # noqa: PLR0913 - keyword-only: strict and the arrivals
    now: float,
    capacity: Mapping[str, float],
    free: Mapping[str, float],
    releases: Iterable[tuple[float, str, float]],
    queue: Sequence[tuple[str, float, float]],
    *,
    strict: bool,
    arrivals: Iterator[tuple[float, float, float]] | None = None,
) -> dict[str, float]:
    """Start times of queued ``(key, amount, duration)`` items; an item missing never starts.

    ``capacity`` and ``free`` are per pool (flavor), in the order the queue tries them;
    ``releases`` are ``(end, pool, amount)``. At ``now`` and at every release, items start in queue
    order while they fit, each in the first pool with room (an item larger than every pool takes
    what is free across them); under BestEffortFIFO an item that does not fit lets the ones behind
    it try (Kueue sets it aside), under StrictFIFO it blocks them. ``arrivals``: work still to come,
    ``(time, amount, duration)`` in time order, queued behind everything at its time (under
    BestEffortFIFO it starts ahead of waiting items that do not fit).
    """
    pools = _Pools(dict(free), max(capacity.values(), default=0.0), sum(capacity.values()), list(releases))
    heapq.heapify(pools.ends)
    t = now
    starts: dict[str, float] = {}
    waiting: list[_Waiting] = [item for item in queue if item[1] <= pools.total + EPSILON]
    upcoming = next(arrivals, None) if arrivals is not None else None
    while True:
        waiting = _round(waiting, pools, t, strict, starts)
        if all(key is None for key, _, _ in waiting) or not pools.ends:
            break
        # Work that arrives before the next end can only take room: it starts then or waits.
        while upcoming is not None and upcoming[0] < pools.ends[0][0]:
            at, amount, duration = upcoming
            upcoming = next(arrivals, None) if arrivals is not None else None
            fits = not (strict and waiting) and pools.start(amount, duration, max(t, at))
            if not fits and amount <= pools.total + EPSILON:
                waiting.append((None, amount, duration))
        end, pool, amount = heapq.heappop(pools.ends)
        t = max(t, end)
        pools.room[pool] += amount
        while pools.ends and pools.ends[0][0] <= t:
            _, pool, amount = heapq.heappop(pools.ends)
            pools.room[pool] += amount
    return starts


def _round(
    waiting: list[_Waiting], pools: _Pools, t: float, strict: bool, starts: dict[str, float]
) -> list[_Waiting]:
    """One round of :func:`play` at ``t``: start, in order, what fits (recorded in ``starts``);
    returns what still waits."""
    still: list[_Waiting] = []
    blocked = False
    left = sum(pools.room.values())
    least = min((amount for _, amount, _ in waiting), default=0.0)
    for i, (key, amount, duration) in enumerate(waiting):
        if left + EPSILON < least:  # nothing left fits: the rest waits
            still += waiting[i:]
            break
        if blocked or amount > left + EPSILON or not pools.start(amount, duration, t):
            still.append((key, amount, duration))
            blocked = blocked or strict
            continue
        left -= amount
        if key is not None:
            starts[key] = t
    return still


def _take(
    room: dict[str, float], pools: Sequence[str], amount: float, *, split: bool
) -> list[tuple[str, float]] | None:
    """Take ``amount`` from the first pool with room (or, with ``split``, from each in order);
    ``None`` (nothing taken) when it does not fit."""
    if not split:
        for pool in pools:
            if amount <= room[pool] + EPSILON:
                room[pool] -= amount
                return [(pool, amount)]
        return None
    if amount > sum(room.values()) + EPSILON:
        return None
    taken = []
    left = amount
    for pool in pools:
        part = min(left, max(0.0, room[pool]))
        if part > 0.0:
            room[pool] -= part
            taken.append((pool, part))
            left -= part
    return taken


def estimate_queue(
    world: Scheduler,
    pending: Sequence[PendingDecision],
    *,
    runtimes: RuntimeModel,
    config: SchedulerConfig,
    now: float,
) -> dict[str, Estimate]:
    """ETAs of a ClusterQueue's pending workloads (in queue order, all of one queue).

    The queue is played :data:`SCENARIOS` times; in each, every running workload ends at a quantile
    of its runtime distribution (conditioned on what it has run) and every queued one runs for a
    quantile of its own; quantiles are stratified and rotated per workload, so the scenarios cover
    each distribution evenly and are the same on every call. ``low``/``seconds``/``high`` are the
    10th/50th/90th percentiles of the scenario starts. Only the first :data:`PLAYED` workloads are
    played one by one; the later ones start when the played ones have, plus their work over the
    capacity.
    """
    if not pending:
        return {}
    cq = world.tree.queues.get(pending[0].cluster_queue or "")
    if cq is None:
        return {p.workload: Estimate(None, None, None, "not queued in a ClusterQueue") for p in pending}
    workloads = world.workloads
    by_resource: dict[str, list[_Item]] = {}
    for p in pending:
        wl = workloads.get(p.workload)
        resource = main_resource(wl, config) if wl is not None else ""
        by_resource.setdefault(resource, []).append(_Item(p.workload, _need(wl, resource) if wl else 0.0, wl))
    out: dict[str, Estimate] = {}
    for resource, items in by_resource.items():
        out.update(_estimate_pool(world, cq, resource, items, runtimes=runtimes, now=now))
    return out


@dataclass(frozen=True, slots=True)
class _Holder:
    """An admitted workload that gives quota back to the estimated queue when it ends: its
    ClusterQueue, what per flavor, and whether reclaim takes it back now."""

    admitted: AdmittedWorkload
    queue: str
    amounts: Mapping[str, float]
    reclaimed_now: bool


def _pool_holders(cq: ClusterQueueNode, frs: Sequence[tuple[str, str]], reclaim: bool) -> list[_Holder]:
    """The workloads of ``cq`` and the part that its cohort's other queues borrow, per flavor."""
    holders = []
    for other in _cohort_queues(cq):
        borrowed = {fr[0]: float(max(0, other.usage.get(fr, 0) - other.quota_for(fr).nominal)) for fr in frs}
        for aw in sorted(other.workloads.values(), key=lambda a: a.key):
            amounts = {}
            for fr in frs:
                amount = float(aw.usage.get(fr, 0))
                if other is not cq:  # only what another queue borrows comes back to this one
                    amount = min(amount, borrowed[fr[0]])
                    borrowed[fr[0]] -= amount
                if amount:
                    amounts[fr[0]] = amount
            if amounts:
                holders.append(_Holder(aw, other.name, amounts, other is not cq and reclaim))
    return holders


def _releases(  # noqa: PLR0913 - one scenario's ends
    world: Scheduler,
    holders: Sequence[_Holder],
    runtimes: RuntimeModel,
    *,
    now: float,
    k: int,
    salts: Mapping[str, tuple[float, ...]],
) -> list[tuple[float, str, float]]:
    """``(end, flavor, amount)`` of every holder in scenario ``k``."""
    out = []
    for h in holders:
        end = now
        if not h.reclaimed_now:
            aw = h.admitted
            elapsed = max(0.0, now - aw.reserved_at)
            end += runtimes.remaining_at(
                world.workloads.get(aw.key), h.queue, elapsed, scenario_level(k, salts[aw.key])
            )
        out += [(end, pool, amount) for pool, amount in h.amounts.items()]
    return out


ARRIVALS_SEEN = 200  # recent arrivals of a ClusterQueue its arrival rate and sizes come from
MIN_ARRIVALS = 20  # fewer seen: work still to come is not played
ARRIVALS_PLAYED = PLAYED  # arrivals played per scenario at most (work that never stops coming
# would hold a large workload back forever under BestEffortFIFO; the estimate then ends)


@dataclass(frozen=True, slots=True)
class _Arrivals:
    """Work still to come to a ClusterQueue: its recent rate and the recent workloads (their size
    in the estimated resource) that later ones are drawn from."""

    per_second: float
    recent: tuple[tuple[Workload, float], ...]

    def arrivals(
        self, k: int, runtimes: RuntimeModel, queue: str, now: float
    ) -> Iterator[tuple[float, float, float]]:
        """Scenario ``k``'s arrivals after ``now``: Poisson at the rate, each like a recent workload,
        running for a quantile of that one's runtime (the same on every call)."""
        rng = random.Random(f"{queue}/{k}")
        t = now
        while True:
            t += rng.expovariate(self.per_second)
            wl, amount = self.recent[rng.randrange(len(self.recent))]
            yield t, amount, runtimes.total_at(wl, queue, rng.random())


def _arrival_rate(
    world: Scheduler, cq: ClusterQueueNode, resource: str, items: Sequence[_Item], now: float
) -> _Arrivals | None:
    """The rate work arrived at ``cq`` recently (its last :data:`ARRIVALS_SEEN` workloads, pending,
    admitted or finished, over the time from the first of them to ``now``), or ``None`` with fewer
    than :data:`MIN_ARRIVALS` or under StrictFIFO (where work to come never starts ahead)."""
    if cq.spec.queueing_strategy == "StrictFIFO":
        return None
    pending = {i.key for i in items}
    seen = [
        wl
        for wl in world.workloads.values()
        if wl.creation <= now
        and (wl.key in pending or (wl.admission is not None and wl.admission.cluster_queue == cq.name))
    ]
    if len(seen) < MIN_ARRIVALS:
        return None
    seen.sort(key=lambda wl: wl.creation)
    recent = seen[-ARRIVALS_SEEN:]
    span = now - recent[0].creation
    if span <= 0.0:
        return None
    sized = tuple((wl, _need(wl, resource)) for wl in recent)
    return _Arrivals(len(recent) / span, sized)


def _estimate_pool(  # noqa: PLR0913 - one pool's estimate, the quota walk step by step
    world: Scheduler,
    cq: ClusterQueueNode,
    resource: str,
    items: Sequence[_Item],
    *,
    runtimes: RuntimeModel,
    now: float,
) -> dict[str, Estimate]:
    group = cq.group_for(resource)
    frs = [(f.name, resource) for f in group.flavors] if group is not None else []
    pool_capacity = {fr[0]: float(cq.potential_available(fr)) for fr in frs}
    pool_free = {fr[0]: float(cq.available(fr)) for fr in frs}
    capacity = sum(pool_capacity.values())
    free = sum(pool_free.values())
    nominal = sum(cq.quota_for(fr).nominal for fr in frs)
    reclaim = (
        sum(cq.usage.get(fr, 0) for fr in frs) < nominal
        and cq.spec.preemption.reclaim_within_cohort != "Never"
    )
    strict = cq.spec.queueing_strategy == "StrictFIFO"
    holders = _pool_holders(cq, frs, reclaim)
    rate = _arrival_rate(world, cq, resource, items, now)
    played = items[:PLAYED]
    salts = {i.key: scenario_salt(i.key) for i in played} | {
        h.admitted.key: scenario_salt(h.admitted.key) for h in holders
    }
    scenario_starts: dict[str, list[float]] = {i.key: [] for i in played}
    for k in range(SCENARIOS):
        releases = _releases(world, holders, runtimes, now=now, k=k, salts=salts)
        queue_items = [
            (i.key, i.amount, runtimes.total_at(i.workload, cq.name, scenario_level(k, salts[i.key])))
            for i in played
        ]
        coming = None
        if rate is not None:
            coming = itertools.islice(rate.arrivals(k, runtimes, cq.name, now), ARRIVALS_PLAYED)
        found = play(now, pool_capacity, pool_free, releases, queue_items, strict=strict, arrivals=coming)
        for key, start in found.items():
            scenario_starts[key].append(start)
    involved = [
        (world.workloads.get(h.admitted.key), h.queue, max(0.0, now - h.admitted.reserved_at))
        for h in holders
        if not h.reclaimed_now
    ] + [(i.workload, cq.name, 0.0) for i in played]
    in_use = f"{capacity - free:g}/{capacity:g} {resource} in use"
    if len(frs) > 1:
        in_use += f" over {len(frs)} flavors (each workload in the first with room)"
    basis_tail = [in_use, runtimes.basis(cq.name, involved)]
    taken = runtimes.bases(involved)
    if rate is not None:
        basis_tail.append(
            f"work still to come at the recent rate ({rate.per_second * 3600:.1f}/h) starts ahead where "
            "it fits"
        )
    if reclaim:
        basis_tail.append("borrowed quota reclaimed now")
    basis_tail.append(f"{SCENARIOS} scenarios")
    out: dict[str, Estimate] = {}
    last_mid: float | None = None
    for position, item in enumerate(items):
        head = f"{position} ahead in ClusterQueue {cq.name}"
        if item.amount > capacity + EPSILON:
            out[item.key] = Estimate(
                None, None, None, f"never: needs {item.amount:g} {resource}; the queue can use {capacity:g}"
            )
            continue
        seen = sorted(scenario_starts.get(item.key, []))
        if position < PLAYED:
            if len(seen) * 2 < SCENARIOS:  # in most scenarios it never starts
                out[item.key] = Estimate(None, None, None, f"never: {head}; " + "; ".join(basis_tail))
                continue
            low, mid, high = (round(max(0.0, quantile(seen, q) - now), 1) for q in QUANTILES)
            last_mid = mid
        else:  # beyond the played ones: their work over the capacity, after the last played start
            backlog = sum(
                i.amount * runtimes.total_at(i.workload, cq.name, 0.5) for i in items[PLAYED : position + 1]
            )
            mid = round((last_mid or 0.0) + backlog / max(capacity, EPSILON), 1)
            low, high = round(mid * 0.5, 1), round(mid * 2.0, 1)
        out[item.key] = Estimate(mid, low, high, "; ".join([head, *basis_tail]), taken)
    return out


# --- whole-node gangs: the node replay of :func:`gpuplane.insight.eta.gang_start` ---------------


@dataclass(frozen=True, slots=True)
class NodeGang:
    """A pending workload whose every pod takes a whole node: ``nodes`` pods of ``size`` GPUs of
    ``resource``, and per pool (flavor of its ClusterQueue, in the order it tries them) the names
    of the nodes it may use, each with exactly ``size`` exclusive GPUs."""

    workload: Workload
    queue: str
    resource: str
    size: int
    nodes: int
    pools: Mapping[str, tuple[str, ...]]


def node_gang(world: Scheduler, wl: Workload, queue: str, config: SchedulerConfig) -> NodeGang | None:
    """``wl`` as a whole-node gang of ClusterQueue ``queue``, or ``None`` when some pod of it could
    share a node (or land on a node with more GPUs than it asks), or nothing says where it runs."""
    cluster = world.cluster
    cq = world.tree.queues.get(queue)
    resource = main_resource(wl, config)
    sets = [ps for ps in wl.pod_sets if ps.count]
    if cluster is None or cq is None or not sets or resource not in config.devices.whole_resources:
        return None
    sizes = {ps.template.requests.get(resource, 0) for ps in sets}
    group = cq.group_for(resource)
    if len(sizes) != 1 or group is None:
        return None
    size = sizes.pop()
    pools: dict[str, tuple[str, ...]] = {}
    for flavor in group.flavors:
        rf = world.flavors.get(flavor.name)
        if rf is None:
            continue
        names: set[str] = set()
        for ps in sets:
            gps = GangPodSet(ps.name, ps.count, pod_needs(ps.template, config.devices), ps.template, rf)
            for state in cluster.eligible(gps):
                if sum(1 for d in state.devices if d.sharing == "exclusive") != size:
                    return None  # a pod there would leave GPUs of its node to others
                names.add(state.name)
        if names:
            pools[flavor.name] = tuple(sorted(names))
    if size <= 0 or not pools:
        return None
    return NodeGang(wl, queue, resource, size, sum(ps.count for ps in sets), pools)


@dataclass(frozen=True, slots=True)
class _NodeHolder:
    """What holds a node: its owners, the queue whose quota it gives back, and how much."""

    owners: tuple[str, ...]
    queue: str
    amount: float


def _gang_nodes(
    world: Scheduler, pools: Mapping[str, tuple[str, ...]], size: int
) -> tuple[dict[str, int], list[tuple[str, _NodeHolder]], int]:
    """The free nodes of ``pools``, the held ones (pool and holder) and how many in all; a node of
    two pools counts for the first."""
    cluster = world.cluster
    assert cluster is not None
    owned: dict[str, list[tuple[str, int]]] = {}
    for owner, items in cluster.owners.items():
        for name, needs, _ in items:
            owned.setdefault(name, []).append((owner, needs.whole))
    free: dict[str, int] = {}
    held: list[tuple[str, _NodeHolder]] = []
    seen: set[str] = set()
    for pool, names in pools.items():
        for name in names:
            if name in seen:
                continue
            seen.add(name)
            on = owned.get(name, [])
            if not on:
                free[pool] = free.get(pool, 0) + 1
                continue
            admitted = world.tree.admitted.get(on[0][0])
            whole = len(on) == 1 and on[0][1] >= size and admitted is not None
            queue = admitted.cluster_queue if whole and admitted is not None else ""
            amount = float(size) if queue else 0.0
            held.append((pool, _NodeHolder(tuple(o for o, _ in on), queue, amount)))
    return free, held, len(seen)


def _gang_quotas(
    world: Scheduler, pools: Iterable[str], resource: str
) -> tuple[dict[tuple[str, str], float], dict[tuple[str, str], float], dict[str, float]]:
    """Quota used and nominal quota per (ClusterQueue, pool) of every ClusterQueue in ``pools``,
    and each pool's nominal quota in all."""
    usage: dict[tuple[str, str], float] = {}
    nominal: dict[tuple[str, str], float] = {}
    total: dict[str, float] = {}
    for name, cq in world.tree.queues.items():
        for pool in pools:
            fr = (pool, resource)
            usage[(name, pool)] = float(cq.usage.get(fr, 0))
            nominal[(name, pool)] = float(cq.quota_for(fr).nominal)
            total[pool] = total.get(pool, 0.0) + nominal[(name, pool)]
    return usage, nominal, total


def estimate_gangs(
    world: Scheduler,
    gangs: Sequence[NodeGang],
    quotas: Mapping[str, Estimate],
    *,
    runtimes: RuntimeModel,
    now: float,
) -> dict[str, Estimate]:
    """The starts of pending whole-node gangs of one node size (of every ClusterQueue) by the
    node replay (:func:`gpuplane.insight.eta.gang_start`), the method the simulator's ETA uses,
    run in the same :data:`SCENARIOS` as the queue estimate, one replay per scenario for them all.

    The nodes of the gangs' pools are free, or free when the last workload on them ends (at the
    scenario's quantile of its runtime given what it has run; a node held whole by one workload
    gives its ClusterQueue's quota back then). The replay takes the gangs as the scheduler's cycles
    do, one head per queue per cycle, within nominal first, then priority, then creation; each runs
    for the scenario's quantile of its queue's runtimes. A gang of a ClusterQueue that may reclaim
    within its cohort, within its nominal quota, takes nodes of borrowing queues. ``quotas`` (each
    gang's queue estimate, :func:`estimate_queue`) still bounds each: each of low, median and high
    is the later of the two.
    """
    if not gangs:
        return {}
    resource, size = gangs[0].resource, gangs[0].size
    pools: dict[str, tuple[str, ...]] = {}
    for g in gangs:
        for pool, names in g.pools.items():
            pools[pool] = tuple(sorted({*pools.get(pool, ()), *names}))
    free, held, count = _gang_nodes(world, pools, size)
    usage, nominal, total = _gang_quotas(world, pools, resource)
    reclaim = {
        g.queue: world.tree.queues[g.queue].spec.preemption.reclaim_within_cohort != "Never" for g in gangs
    }
    holders = [o for _, h in held for o in h.owners]
    node_holders = [
        (world.workloads.get(o), aw.cluster_queue, max(0.0, now - aw.reserved_at))
        for o in holders
        if (aw := world.tree.admitted.get(o)) is not None
    ]
    salts = {key: scenario_salt(key) for key in [*(g.workload.key for g in gangs), *holders]}
    seen: dict[str, list[float]] = {g.workload.key: [] for g in gangs}
    for k in range(SCENARIOS):

        def end_of(owner: str, k: int = k) -> float:
            aw = world.tree.admitted.get(owner)
            wl = world.workloads.get(owner)
            if aw is None:  # a pod outside any queue: no history of its own
                return now + runtimes.total_at(None, "", scenario_level(k, salts[owner]))
            elapsed = max(0.0, now - aw.reserved_at)
            return now + runtimes.remaining_at(wl, aw.cluster_queue, elapsed, scenario_level(k, salts[owner]))

        releases = [NodeFree(max(end_of(o) for o in h.owners), pool, h.queue, h.amount) for pool, h in held]
        played = [
            Gang(
                g.queue,
                tuple(p for p in pools if p in g.pools),
                g.nodes,
                g.workload.priority,
                g.workload.creation,
                runtimes.total_at(g.workload, g.queue, scenario_level(k, salts[g.workload.key])),
                reclaim=reclaim[g.queue],
            )
            for g in gangs
        ]
        replay = NodeReplay(
            free=free,
            releases=sorted(releases, key=lambda r: r.end),
            queued=played,
            usage=usage,
            nominal=nominal,
            node_size=float(size),
            capacity=total,
        )
        starts = gang_starts(now, replay)
        for g, gang in zip(gangs, played, strict=True):
            start = starts.get(id(gang))
            if start is not None:
                seen[g.workload.key].append(start)
    out: dict[str, Estimate] = {}
    for g in gangs:
        involved = [*node_holders, (g.workload, g.queue, 0.0)]
        runtimes_basis = runtimes.basis(g.queue, involved)
        quota = quotas[g.workload.key]
        basis = (
            f"whole-node gang: replayed on the nodes of {', '.join(g.pools)}"
            f" ({sum(free.values())} of {count} free, {size} {resource} each) with {len(gangs) - 1} other"
            f" pending whole-node gangs, as the scheduler's cycles take them; {runtimes_basis}"
            + ("; borrowed nodes reclaimed" if reclaim[g.queue] else "")
            + f"; {SCENARIOS} scenarios; not before its quota allows ({quota.basis})"
        )
        starts_of = sorted(seen[g.workload.key])
        if len(starts_of) * 2 < SCENARIOS or quota.seconds is None:
            out[g.workload.key] = Estimate(None, None, None, "never: " + basis)
            continue
        values = [
            round(max(mine or 0.0, quantile(starts_of, q) - now), 1)
            for q, mine in zip(QUANTILES, (quota.low, quota.seconds, quota.high), strict=True)
        ]
        out[g.workload.key] = Estimate(values[1], values[0], values[2], basis, runtimes.bases(involved))
    return out
