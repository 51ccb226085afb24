"""Elastic capacity in the simulator: nodes that come (after a cold start) and go (spot
interruptions, idle scale-down), in three NodePools of different node sizes, for three queues with
quota (:mod:`gpuplane.sim.capacity_scenario` holds the pools, queues, prices and arrivals).

Configurations (every one sees the same arrivals and the same interruption draws):

- ``stock``: the default scheduler places pods one by one (LeastAllocated: the node with the most
  free GPUs), each namespace has a ResourceQuota (its queue's quota, no borrowing), and a cluster
  autoscaler adds spot nodes for the pods it cannot place. A gang can land in part: its placed pods
  hold their GPUs until the rest arrive. A spot interruption kills the pods without warning; the job
  restarts from its last periodic checkpoint.
- ``stock-placeholders``: the same with the usual over-provisioning: placeholder pods of a low
  PriorityClass hold warm nodes (spot, like everything the autoscaler adds), and a real pod that
  finds no room preempts one; the evicted placeholder goes pending and the autoscaler adds a node
  for it. The placeholders are sized like gpuplane's warm buffer (below).
- ``gpuplane``: the real core admits a job only when every pod has a place, from queues in one
  cohort (a queue borrows what the others leave unused). A job with no place asks for its whole
  capacity at once (one atomic ProvisioningRequest within its pool's limit), in the first of its
  queue's pools with room. A warm buffer of on-demand nodes sized from the predicted arrivals (see
  :func:`buffer_targets`) is kept ready. A spot interruption gives the job its checkpoint grace,
  then requeues it at the head.
- ``gpuplane-no-warm-buffer``: the same without the buffer.
- ``gpuplane-static-buffer``: the same with a fixed buffer of ``warm_nodes`` on-demand h100 nodes
  (what earlier versions ran).

Measures: GPU-hours and GPU-dollars paid (every node from launch to its end, cold start included,
split spot / on-demand), the p95 and mean wait from arrival to start, the GPU-hours held by partly
placed gangs, and the GPU-hours buffer nodes sat ready and idle (``buffer_gpu_hours``).
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from gpuplane.core.session import SchedulerConfig, schedule
from gpuplane.sim.capacity_core import FreeNode, core_state
from gpuplane.sim.capacity_scenario import HOUR, Arrival, CapacityScenario, PoolSpec, arrivals

__all__ = (
    "ALL_CONFIGURATIONS",
    "CONFIGURATIONS",
    "CapacityResult",
    "CapacityScenario",
    "CapacitySim",
    "arrivals",
    "buffer_targets",
    "compare",
)

CONFIGURATIONS = ("stock", "gpuplane", "gpuplane-no-warm-buffer")  # the command's default set
ALL_CONFIGURATIONS = (
    "stock",
    "stock-placeholders",
    "gpuplane",
    "gpuplane-no-warm-buffer",
    "gpuplane-static-buffer",
)
STOCK = ("stock", "stock-placeholders")
# The spot interruption rate is per node-hour of an 8-GPU node; a smaller node is interrupted in
# proportion to its GPUs (an assumption: a rate per GPU-hour, so the same GPUs see the same rate).
REFERENCE_NODE_GPUS = 8


@dataclass(frozen=True, slots=True)
class CapacityResult:
    """One configuration's measures over one run."""

    configuration: str
    gpu_hours_paid: float
    spot_gpu_hours: float
    on_demand_gpu_hours: float
    gpu_dollars: float
    spot_dollars: float
    on_demand_dollars: float
    wait_p95_minutes: float
    wait_mean_minutes: float
    partial_gang_gpu_hours: float
    buffer_gpu_hours: float  # GPU-hours buffer (or placeholder) nodes sat ready and idle
    buffer_dollars: float
    buffer_uses: int  # times a buffer node was taken (a placeholder preempted)
    shared_node_binds: int  # pods bound to a node that already ran another job's pods
    finished: int
    started: int
    interruptions: int
    lost_work_hours: float


def buffer_targets(scenario: CapacityScenario, recent: list[Arrival], now: float) -> dict[str, int]:
    """The warm buffer per pool, from the arrivals of the last ``arrival_window_seconds`` (each job
    counted in the first pool of its queue): the node-fulls of GPUs predicted to arrive within one
    cold start, rounded down, counting only the classes for which a buffer node pays.

    A buffer node pays for a class when both hold:

    * the GPU-hours it sits idle are no more than the GPU-hours of waiting it saves: at the
      predicted rate a ready node waits less than one cold start before a job takes it, and the job
      that takes it would have waited a cold start (hence "rounded down");
    * the on-demand premium of the work that runs on it, ``duration x (1 - spot/on-demand)``, is no
      more than the cold start it saves, both valued at the job's GPUs' on-demand price. The class's
      predicted duration is the mean of its recent jobs' (the runtime history).

    So short jobs that arrive often get a buffer; long ones, or rare ones, do not.
    """
    first = {q.name: q.pools[0] for q in scenario.queues()}
    window = scenario.arrival_window_seconds
    by_class: dict[str, list[Arrival]] = {}
    for a in recent:
        if now - window < a.at <= now:
            by_class.setdefault(a.klass, []).append(a)
    premium = 1.0 - 1.0 / scenario.price_ratio
    gpus: dict[str, int] = {}
    for jobs in by_class.values():
        duration = sum(a.work for a in jobs) / len(jobs)
        if duration * premium <= scenario.cold_start:
            pool = first[jobs[0].queue]
            gpus[pool] = gpus.get(pool, 0) + sum(a.gpus for a in jobs)
    return {
        p.name: math.floor(gpus.get(p.name, 0) / window * scenario.cold_start / p.gpus_per_node)
        for p in scenario.pools()
    }


@dataclass(slots=True)
class _Node:
    name: str
    pool: PoolSpec
    spot: bool
    launched: float
    ready_at: float
    used: dict[int, int] = field(default_factory=dict)  # job -> GPUs of its pods here
    idle_since: float = 0.0
    booked: int | None = None  # provisioned for this job (consume-provisioning-request)
    buffer: bool = False
    ends: float | None = None
    noticed: bool = False  # its interruption notice came: it goes soon

    @property
    def free(self) -> int:
        return self.pool.gpus_per_node - sum(self.used.values())


@dataclass(slots=True)
class _Job:
    arrival: Arrival
    remaining: float
    bound: list[str] = field(default_factory=list)  # one node name per bound pod
    started_at: float | None = None
    first_start: float | None = None
    requested: bool = False
    interrupted: bool = False
    done: bool = False
    generation: int = 0


ARRIVE, READY, FINISH, NOTICE, GONE, IDLE = range(6)


class CapacitySim:
    """One configuration over one scenario (a fresh object per run): the nodes, the jobs, the queue
    of pending jobs, the event heap and what has been paid so far."""

    def __init__(self, scenario: CapacityScenario, configuration: str) -> None:
        if configuration not in ALL_CONFIGURATIONS:
            raise ValueError(
                f"unknown configuration {configuration!r}; one of {', '.join(ALL_CONFIGURATIONS)}"
            )
        scenario.check()
        self.s = scenario
        self.configuration = configuration
        self.pools = {p.name: p for p in scenario.pools()}
        self.queues = scenario.queues()
        self.arrivals, self.lifetimes = arrivals(scenario)
        self.arrival_times = [a.at for a in self.arrivals]
        self.events: list[tuple[float, int, int, int, str]] = []
        self.seq = itertools.count()
        self.nodes: dict[str, _Node] = {}
        self.jobs: dict[int, _Job] = {}
        self.queue: list[int] = []  # pending jobs, in admission order
        self.names = itertools.count()
        # One stream of interruption draws per pool, so that one pool's churn does not move another's.
        count = len(self.pools)
        self.draws = {name: iter(self.lifetimes[i::count]) for i, name in enumerate(self.pools)}
        self.paid: dict[tuple[bool, str], float] = {}
        self.buffer_hours = 0.0
        self.buffer_cost = 0.0
        self.buffer_uses = 0
        self.shared_binds = 0  # pods bound to a node that already ran another job's pods
        self.queue_gpus: dict[str, int] = {}  # GPUs each queue's bound pods hold now
        self.peak_queue_gpus: dict[str, int] = {}
        self.partial = 0.0
        self.interruptions = 0
        self.lost = 0.0
        self.config = SchedulerConfig()
        self._last = 0.0
        self._partial_gpus = 0

    # --- events -----------------------------------------------------------------------------

    def push(self, at: float, kind: int, ref: int = 0, gen: int = 0, name: str = "") -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, ref * 1_000_000 + gen, name))

    def run(self) -> CapacityResult:
        horizon = self.s.hours * HOUR
        for a in self.arrivals:
            self.push(a.at, ARRIVE, a.job)
        self._decide(0.0)
        while self.events and self.events[0][0] <= horizon:
            now = self.events[0][0]
            while self.events and self.events[0][0] == now:
                _, _, kind, packed, name = heapq.heappop(self.events)
                self._handle(kind, packed // 1_000_000, packed % 1_000_000, name, now)
            self._decide(now)
        return self._result(horizon)

    def _handle(self, kind: int, ref: int, gen: int, name: str, now: float) -> None:
        if kind == ARRIVE:
            a = self.arrivals[ref]
            self.jobs[a.job] = _Job(a, a.work)
            self.queue.append(a.job)
        elif kind == FINISH:
            job = self.jobs[ref]
            if job.generation == gen and not job.done and job.started_at is not None:
                job.done = True
                self._unbind(job, now)
        elif kind == NOTICE:
            self._notice(name, now)
        elif kind == GONE:
            self._gone(name, now)
        elif kind == IDLE:
            node = self.nodes.get(name)
            if node is None or node.used or node.ends is not None:
                return
            if now - node.idle_since < self.s.idle_scale_down_seconds - 1e-6:
                return
            if node.buffer and self._buffer_count(node.pool.name) <= self._targets(now).get(
                node.pool.name, 0
            ):
                return  # the buffer keeps it
            self._end(node, now)

    # --- nodes ------------------------------------------------------------------------------

    def _launch(
        self, now: float, pool: PoolSpec, *, spot: bool, booked: int | None = None, buffer: bool = False
    ) -> None:
        ready = now + self.s.cold_start
        node = _Node(
            f"n{next(self.names)}", pool, spot, now, ready, booked=booked, buffer=buffer, idle_since=ready
        )
        self.nodes[node.name] = node
        self.push(ready, READY)
        self.push(ready + self.s.idle_scale_down_seconds, IDLE, name=node.name)
        if spot and self.s.spot_interruptions_per_node_hour > 0:
            rate = self.s.spot_interruptions_per_node_hour * pool.gpus_per_node / REFERENCE_NODE_GPUS
            life = next(self.draws[pool.name], 1.0) * HOUR / rate
            self.push(now + life, NOTICE, name=node.name)

    def _price(self, node: _Node) -> float:
        return self.s.spot_price(node.pool) if node.spot else node.pool.on_demand_price

    def _unbuffer(self, node: _Node, now: float) -> None:
        """A buffer node stops being one (taken, or ended): count the time it sat ready and idle."""
        if node.buffer:
            idle = max(0.0, now - node.ready_at) * node.pool.gpus_per_node / HOUR
            self.buffer_hours += idle
            self.buffer_cost += idle * self._price(node)
            node.buffer = False

    def _end(self, node: _Node, now: float) -> None:
        if node.ends is not None:
            return
        self._unbuffer(node, now)
        node.ends = now
        key = (node.spot, node.pool.name)
        self.paid[key] = self.paid.get(key, 0.0) + (now - node.launched) * node.pool.gpus_per_node / HOUR

    def _alive(self, pool: str | None = None) -> list[_Node]:
        return [n for n in self.nodes.values() if n.ends is None and (pool is None or n.pool.name == pool)]

    def _buffer_count(self, pool: str) -> int:
        return sum(1 for n in self._alive(pool) if n.buffer)

    def _targets(self, now: float) -> dict[str, int]:
        if self.configuration in ("gpuplane", "stock-placeholders"):
            start = bisect.bisect_right(self.arrival_times, now - self.s.arrival_window_seconds)
            end = bisect.bisect_right(self.arrival_times, now)
            return buffer_targets(self.s, self.arrivals[start:end], now)
        if self.configuration == "gpuplane-static-buffer":
            return {"h100": self.s.warm_nodes}
        return {}

    def _notice(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is None or node.ends is not None:
            return
        self.interruptions += 1
        node.noticed = True
        self.push(now + self.s.interruption_notice_seconds, GONE, name=name)
        if self.configuration in STOCK:
            return  # no signal reaches the jobs: they die with the node
        for j in list(node.used):  # checkpoint within the grace, then evicted and requeued at the head
            job = self.jobs[j]
            if job.started_at is not None:
                job.remaining = max(0.0, job.remaining - (now - job.started_at))
                job.started_at = None
            job.generation += 1
            job.interrupted = True
            self._unbind(job, now)
            self.queue.insert(0, j)

    def _gone(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is None or node.ends is not None:
            return
        for j in list(node.used):  # stock: the pods die; the job restarts from its last checkpoint
            job = self.jobs[j]
            if job.started_at is not None:
                ran = now - job.started_at
                every = job.arrival.checkpoint
                kept = ran if every is None else math.floor(ran / every) * every
                self.lost += (ran - kept) / HOUR
                job.remaining = max(60.0, job.remaining - kept)
                job.started_at = None
            job.generation += 1
            self._unbind(job, now)
            if j not in self.queue:
                self.queue.append(j)
        self._end(node, now)

    # --- jobs -------------------------------------------------------------------------------

    def _bind(self, job: _Job, node: _Node, now: float) -> None:
        if node.buffer:
            self.buffer_uses += 1
            self._unbuffer(node, now)
        if any(j != job.arrival.job for j in node.used):
            self.shared_binds += 1
        node.used[job.arrival.job] = node.used.get(job.arrival.job, 0) + job.arrival.gpus_per_pod
        node.booked = None
        job.bound.append(node.name)
        queue = job.arrival.queue
        self.queue_gpus[queue] = self.queue_gpus.get(queue, 0) + job.arrival.gpus_per_pod
        self.peak_queue_gpus[queue] = max(self.peak_queue_gpus.get(queue, 0), self.queue_gpus[queue])

    def _unbind(self, job: _Job, now: float) -> None:
        for name in set(job.bound):
            node = self.nodes[name]
            node.used.pop(job.arrival.job, None)
            if not node.used:
                node.idle_since = now
                self.push(now + self.s.idle_scale_down_seconds, IDLE, name=name)
        self.queue_gpus[job.arrival.queue] -= len(job.bound) * job.arrival.gpus_per_pod
        job.bound = []

    def _start(self, job: _Job, now: float) -> None:
        job.started_at = now
        if job.first_start is None:
            job.first_start = now
        job.requested = False
        self.queue.remove(job.arrival.job)
        self.push(now + job.remaining, FINISH, job.arrival.job, job.generation)

    # --- one decision -----------------------------------------------------------------------

    def _decide(self, now: float) -> None:
        self._account_partial(now)
        if self.configuration in STOCK:
            self._stock(now)
        else:
            self._gpuplane(now)
        self._top_up(now)
        self._account_partial(now)

    def _account_partial(self, now: float) -> None:
        """GPU-hours of pods bound while the rest of their gang waits, up to ``now``."""
        self.partial += self._partial_gpus * (now - self._last) / HOUR
        self._last = now
        self._partial_gpus = sum(
            len(self.jobs[j].bound) * self.jobs[j].arrival.gpus_per_pod
            for j in self.queue
            if self.jobs[j].started_at is None and self.jobs[j].bound
        )

    def _ready(self, now: float) -> list[_Node]:
        return [n for n in self._alive() if n.ready_at <= now and not n.noticed]

    def _room(self, pool: PoolSpec) -> int:
        return pool.limit_nodes - len(self._alive(pool.name))

    def _stock(self, now: float) -> None:
        quota = {q.name: sum(n for _, n in q.quota) for q in self.queues}  # a namespace's ResourceQuota
        used = dict(self.queue_gpus)
        ready = self._ready(now)
        wanting: dict[str, int] = {}
        for j in list(self.queue):
            job = self.jobs[j]
            a = job.arrival
            pools = dict(next(q for q in self.queues if q.name == a.queue).quota)
            while len(job.bound) < a.pods and used.get(a.queue, 0) + a.gpus_per_pod <= quota[a.queue]:
                fits = [
                    n for n in ready if n.pool.name in pools and not n.buffer and n.free >= a.gpus_per_pod
                ]
                if not fits:  # a placeholder's node: the pod preempts it (lowest priority)
                    fits = [n for n in ready if n.pool.name in pools and n.buffer and not n.used]
                if not fits:
                    break
                self._bind(job, max(fits, key=lambda n: (n.free, n.name)), now)
                used[a.queue] = used.get(a.queue, 0) + a.gpus_per_pod
            if len(job.bound) == a.pods:
                self._start(job, now)
                continue
            allowed = (quota[a.queue] - used.get(a.queue, 0)) // a.gpus_per_pod
            for name in pools:  # the autoscaler adds nodes in the first pool with room
                if len(self._alive(name)) < self.pools[name].limit_nodes:
                    wanting[name] = (
                        wanting.get(name, 0) + min(a.pods - len(job.bound), allowed) * a.gpus_per_pod
                    )
                    break
        for name, gpus in wanting.items():
            pool = self.pools[name]
            coming = sum(n.free for n in self._alive(name) if n.ready_at > now and not n.buffer)
            need = math.ceil(max(0, gpus - coming) / pool.gpus_per_node)
            for _ in range(max(0, min(need, self._room(pool)))):
                self._launch(now, pool, spot=True)

    def _gpuplane(self, now: float) -> None:
        ready = [n for n in self._ready(now) if n.free > 0]
        if self.queue and ready:
            used: dict[tuple[str, str], int] = {}
            for job in self.jobs.values():
                for name in job.bound:
                    key = (job.arrival.queue, self.nodes[name].pool.name)
                    used[key] = used.get(key, 0) + job.arrival.gpus_per_pod
            free = [FreeNode(n.name, n.pool.name, n.free, n.booked is not None) for n in ready]
            pending = [(self.jobs[j].arrival, self.jobs[j].interrupted) for j in self.queue]
            state = core_state(
                tuple(self.pools.values()), self.queues, free=free, used=used, pending=pending, now=now
            )
            plan = schedule(state, self.config, now, cycles=None)
            for decision in plan.admitted:
                job = self.jobs[int(decision.workload.split("/j", 1)[1])]
                for ps in decision.pod_sets:
                    for place in ps.placement or ():
                        self._bind(job, self.nodes[place.node], now)
                self._start(job, now)
        self._provision(now)

    def _provision(self, now: float) -> None:
        """Each queued job with no place asks for its whole capacity at once, within a pool's limit,
        in the first of its queue's pools with room; a later job does not jump an earlier one that
        is waiting for room in the same pool. A request whose nodes others took is made again."""
        booked = {n.booked for n in self._alive() if n.booked is not None}
        blocked: set[str] = set()
        for j in self.queue:
            job = self.jobs[j]
            if job.requested and j in booked:
                continue
            a = job.arrival
            for name in next(q for q in self.queues if q.name == a.queue).pools:
                pool = self.pools[name]
                if name in blocked or a.gpus_per_pod > pool.gpus_per_node:
                    continue
                nodes = math.ceil(a.pods / (pool.gpus_per_node // a.gpus_per_pod))
                if self._room(pool) < nodes:
                    blocked.add(name)
                    continue
                for _ in range(nodes):
                    self._launch(now, pool, spot=True, booked=j)
                job.requested = True
                break

    def _top_up(self, now: float) -> None:
        """The warm buffer (gpuplane, on-demand) or the placeholders (stock, spot), per pool."""
        for name, target in self._targets(now).items():
            pool = self.pools[name]
            missing = target - self._buffer_count(name)
            for _ in range(max(0, min(missing, self._room(pool)))):
                self._launch(now, pool, spot=self.configuration in STOCK, buffer=True)

    # --- result -----------------------------------------------------------------------------

    def _result(self, horizon: float) -> CapacityResult:
        self._account_partial(horizon)
        for node in self._alive():
            self._end(node, horizon)
        waits = [
            ((j.first_start if j.first_start is not None else horizon) - j.arrival.at) / 60.0
            for j in self.jobs.values()
        ]
        spot = sum(h for (is_spot, _), h in self.paid.items() if is_spot)
        on_demand = sum(h for (is_spot, _), h in self.paid.items() if not is_spot)
        spot_dollars = sum(h * self.s.spot_price(self.pools[p]) for (s, p), h in self.paid.items() if s)
        on_demand_dollars = sum(h * self.pools[p].on_demand_price for (s, p), h in self.paid.items() if not s)
        return CapacityResult(
            configuration=self.configuration,
            gpu_hours_paid=round(spot + on_demand, 1),
            spot_gpu_hours=round(spot, 1),
            on_demand_gpu_hours=round(on_demand, 1),
            gpu_dollars=round(spot_dollars + on_demand_dollars, 1),
            spot_dollars=round(spot_dollars, 1),
            on_demand_dollars=round(on_demand_dollars, 1),
            wait_p95_minutes=round(float(np.percentile(waits, 95)) if waits else 0.0, 1),
            wait_mean_minutes=round(float(np.mean(waits)) if waits else 0.0, 1),
            partial_gang_gpu_hours=round(self.partial, 1),
            buffer_gpu_hours=round(self.buffer_hours, 1),
            buffer_dollars=round(self.buffer_cost, 1),
            buffer_uses=self.buffer_uses,
            shared_node_binds=self.shared_binds,
            finished=sum(1 for j in self.jobs.values() if j.done),
            started=sum(1 for j in self.jobs.values() if j.first_start is not None),
            interruptions=self.interruptions,
            lost_work_hours=round(self.lost, 2),
        )


def compare(
    scenario: CapacityScenario, configurations: tuple[str, ...] = CONFIGURATIONS
) -> list[CapacityResult]:
    """Every configuration on the same scenario (same arrivals, same interruption draws)."""
    return [CapacitySim(scenario, c).run() for c in configurations]
