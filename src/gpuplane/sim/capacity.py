"""Elastic capacity in the simulator: nodes that come (after a cold start) and go (spot
interruptions, idle scale-down), under a NodePool limit.

Three configurations see the same arrivals and the same interruption draws:

- ``stock``: the default scheduler places pods one by one, and a cluster autoscaler scales for
  each pending pod it cannot place. A gang can land in part: its placed pods hold their GPUs
  until the rest arrive (or for ever, once the NodePool limit is reached). A spot interruption
  kills the pods without warning; the job restarts from its last periodic checkpoint.
- ``gpuplane``: the real core admits a gang only when every pod has a place. A gang with quota
  but no place asks for its whole capacity at once (one ProvisioningRequest, atomic: all of it
  within the NodePool limit, or none). A warm buffer keeps ``warm_nodes`` idle on-demand nodes
  ready. A spot interruption gives the job its checkpoint grace, then requeues it at the head.
- ``gpuplane-no-warm-buffer``: the same without the buffer.

Each pod takes a whole node (``gpus_per_node`` GPUs), so "a place" means "a free ready node"; the
core still makes every admission decision (one ``schedule`` call per instant with changes).

Measures: GPU-hours paid for (every node from launch to its end, cold start included, split
spot / on-demand), the p95 wait from arrival to start, and the GPU-hours held by partly placed
gangs (pods bound while the rest of their gang waits).

Defaults come from ``../shared/domain-facts.md`` §6.3: node ready in 3-6 min (VM boot plus driver;
4.5 min here) plus the image pull (15 GB at ~150 MB/s, 100 s). Everything is a parameter.
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from gpuplane.core.session import Reason, SchedulerConfig, schedule
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

GPU = "nvidia.com/gpu"
CONFIGURATIONS = ("stock", "gpuplane", "gpuplane-no-warm-buffer")


@dataclass(frozen=True, slots=True)
class CapacityScenario:
    hours: float = 72.0
    seed: int = 7
    gpus_per_node: int = 8
    nodepool_limit_nodes: int = 24  # Karpenter NodePool spec.limits, in nodes
    node_ready_seconds: float = 270.0  # VM boot plus GPU driver (domain facts 6.3: 3-6 min)
    image_pull_seconds: float = 100.0  # 15 GB image at ~150 MB/s (domain facts 6.3)
    spot_interruptions_per_node_hour: float = 0.03
    interruption_notice_seconds: float = 120.0  # the cloud's notice before the node goes
    idle_scale_down_seconds: float = 600.0  # Karpenter consolidateAfter / CA scale-down delay
    warm_nodes: int = 2
    mean_interarrival_seconds: float = 1500.0
    gang_sizes: tuple[int, ...] = (1, 1, 2, 2, 4, 8)  # pods per job, one node each, drawn uniformly
    median_hours: float = 1.5
    duration_sigma: float = 0.8
    checkpoint_every_seconds: float = 1800.0  # periodic checkpoints of training jobs

    @property
    def cold_start(self) -> float:
        return self.node_ready_seconds + self.image_pull_seconds


@dataclass(frozen=True, slots=True)
class Arrival:
    job: int
    at: float
    pods: int
    work: float  # seconds of running needed


@dataclass(frozen=True, slots=True)
class CapacityResult:
    configuration: str
    gpu_hours_paid: float
    spot_gpu_hours: float
    on_demand_gpu_hours: float
    wait_p95_minutes: float
    wait_mean_minutes: float
    partial_gang_gpu_hours: float
    finished: int
    started: int
    interruptions: int
    lost_work_hours: float


def arrivals(scenario: CapacityScenario) -> tuple[list[Arrival], list[float]]:
    """The jobs and the interruption draws (one exponential per spot node launch, in order)."""
    rng = np.random.default_rng(scenario.seed)
    horizon = scenario.hours * 3600.0
    out: list[Arrival] = []
    t = 0.0
    while True:
        t += float(rng.exponential(scenario.mean_interarrival_seconds))
        if t >= horizon * 0.8:  # the last fifth drains
            break
        pods = int(rng.choice(scenario.gang_sizes))
        work = float(rng.lognormal(math.log(scenario.median_hours * 3600.0), scenario.duration_sigma))
        out.append(Arrival(len(out), t, pods, min(work, 12 * 3600.0)))
    lifetimes = [float(x) for x in rng.exponential(1.0, size=4096)]
    return out, lifetimes


@dataclass(slots=True)
class _Node:
    name: str
    spot: bool
    launched: float
    ready_at: float
    job: int | None = None
    idle_since: float = 0.0
    booked: int | None = None  # provisioned for this job (consume-provisioning-request)
    buffer: bool = False
    ends: float | None = None
    noticed: bool = False  # its interruption notice came: it goes soon


@dataclass(slots=True)
class _Job:
    arrival: Arrival
    remaining: float
    bound: list[str] = field(default_factory=list)
    started_at: float | None = None
    first_start: float | None = None
    last_checkpoint: float = 0.0
    requested: bool = False
    interrupted: bool = False
    done: bool = False
    generation: int = 0


ARRIVE, READY, FINISH, NOTICE, GONE, IDLE = range(6)


class CapacitySim:
    """One configuration over one scenario (a fresh object per run)."""

    def __init__(self, scenario: CapacityScenario, configuration: str) -> None:
        if configuration not in CONFIGURATIONS:
            raise ValueError(f"unknown configuration {configuration!r}; one of {', '.join(CONFIGURATIONS)}")
        self.s = scenario
        self.configuration = configuration
        self.warm = scenario.warm_nodes if configuration == "gpuplane" else 0
        self.arrivals, self.lifetimes = arrivals(scenario)
        self.events: list[tuple[float, int, int, int, str]] = []
        self.seq = itertools.count()
        self.nodes: dict[str, _Node] = {}
        self.jobs: dict[int, _Job] = {}
        self.queue: list[int] = []  # pending jobs, in admission order
        self.names = itertools.count()
        self.draws = iter(self.lifetimes)
        self.paid = {True: 0.0, False: 0.0}
        self.partial = 0.0
        self.interruptions = 0
        self.lost = 0.0
        self.config = SchedulerConfig()
        self._last = 0.0
        self._partial_pods = 0

    # --- events -----------------------------------------------------------------------------

    def push(self, at: float, kind: int, ref: int = 0, gen: int = 0, name: str = "") -> None:
        heapq.heappush(self.events, (at, next(self.seq), kind, ref * 1_000_000 + gen, name))

    def run(self) -> CapacityResult:
        horizon = self.s.hours * 3600.0
        for a in self.arrivals:
            self.push(a.at, ARRIVE, a.job)
        now = 0.0
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
                self._free(job, now)
        elif kind == NOTICE:
            self._notice(name, now)
        elif kind == GONE:
            self._gone(name, now)
        elif kind == IDLE:
            node = self.nodes.get(name)
            idle = (
                node is not None
                and node.job is None
                and node.ends is None
                and now - node.idle_since >= self.s.idle_scale_down_seconds - 1e-6
            )
            if node is not None and idle and not (node.buffer and self._idle_buffer() <= self.warm):
                self._end(node, now)

    # --- nodes ------------------------------------------------------------------------------

    def _launch(self, now: float, spot: bool, booked: int | None = None, buffer: bool = False) -> _Node:
        node = _Node(f"n{next(self.names)}", spot, now, now + self.s.cold_start, booked=booked, buffer=buffer)
        node.idle_since = node.ready_at
        self.nodes[node.name] = node
        self.push(node.ready_at, READY)
        self.push(node.ready_at + self.s.idle_scale_down_seconds, IDLE, name=node.name)
        if spot and self.s.spot_interruptions_per_node_hour > 0:
            life = next(self.draws, 1.0) * 3600.0 / self.s.spot_interruptions_per_node_hour
            self.push(node.launched + life, NOTICE, name=node.name)
        return node

    def _end(self, node: _Node, now: float) -> None:
        if node.ends is not None:
            return
        node.ends = now
        self.paid[node.spot] += (now - node.launched) * self.s.gpus_per_node / 3600.0

    def _alive(self) -> list[_Node]:
        return [n for n in self.nodes.values() if n.ends is None]

    def _idle_buffer(self) -> int:
        return sum(1 for n in self._alive() if n.buffer and n.job is None and n.booked is None)

    def _notice(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is None or node.ends is not None:
            return
        self.interruptions += 1
        node.noticed = True
        self.push(now + self.s.interruption_notice_seconds, GONE, name=name)
        if node.job is None:
            return
        job = self.jobs[node.job]
        if self.configuration == "stock":
            return  # no signal reaches the job: it dies with the node
        # gpuplane: checkpoint within the grace, then evicted and requeued at the head.
        if job.started_at is not None:
            ran = now - job.started_at
            job.remaining = max(0.0, job.remaining - ran)
            job.started_at = None
            job.last_checkpoint = now
        job.generation += 1
        job.interrupted = True
        self._unbind(job, now)
        self.queue.insert(0, job.arrival.job)

    def _gone(self, name: str, now: float) -> None:
        node = self.nodes.get(name)
        if node is None or node.ends is not None:
            return
        if node.job is not None:  # stock: the pod dies; the job restarts from its last checkpoint
            job = self.jobs[node.job]
            if job.started_at is not None:
                ran = now - job.started_at
                kept = math.floor(ran / self.s.checkpoint_every_seconds) * self.s.checkpoint_every_seconds
                self.lost += (ran - kept) / 3600.0
                job.remaining = max(60.0, job.remaining - kept)
                job.started_at = None
            job.generation += 1
            self._unbind(job, now)
            if job.arrival.job not in self.queue:
                self.queue.append(job.arrival.job)
        self._end(node, now)

    # --- jobs -------------------------------------------------------------------------------

    def _bind(self, job: _Job, node: _Node) -> None:
        node.job = job.arrival.job
        node.booked = None
        node.buffer = False
        job.bound.append(node.name)

    def _unbind(self, job: _Job, now: float) -> None:
        for name in job.bound:
            node = self.nodes[name]
            node.job = None
            node.idle_since = now
            self.push(now + self.s.idle_scale_down_seconds, IDLE, name=name)
        job.bound = []

    def _start(self, job: _Job, now: float) -> None:
        job.started_at = now
        if job.first_start is None:
            job.first_start = now
        job.requested = False
        self.queue.remove(job.arrival.job)
        self.push(now + job.remaining, FINISH, job.arrival.job, job.generation)

    def _free(self, job: _Job, now: float) -> None:
        self._unbind(job, now)

    # --- one decision -----------------------------------------------------------------------

    def _decide(self, now: float) -> None:
        self._account_partial(now)
        if self.configuration == "stock":
            self._stock(now)
        else:
            self._gpuplane(now)
        self._account_partial(now)

    def _account_partial(self, now: float) -> None:
        """GPU-hours of pods bound while the rest of their gang waits, up to ``now``."""
        self.partial += self._partial_pods * self.s.gpus_per_node * (now - self._last) / 3600.0
        self._last = now
        self._partial_pods = sum(
            len(self.jobs[j].bound)
            for j in self.queue
            if self.jobs[j].started_at is None and self.jobs[j].bound
        )

    def _ready_free(self, now: float) -> list[_Node]:
        return [n for n in self._alive() if n.ready_at <= now and n.job is None and not n.noticed]

    def _stock(self, now: float) -> None:
        free = sorted(self._ready_free(now), key=lambda n: n.name)
        wanting = 0
        for j in list(self.queue):
            job = self.jobs[j]
            while len(job.bound) < job.arrival.pods and free:
                self._bind(job, free.pop(0))
            if len(job.bound) == job.arrival.pods and job.started_at is None:
                self._start(job, now)
            else:
                wanting += job.arrival.pods - len(job.bound)
        coming = sum(1 for n in self._alive() if n.ready_at > now)
        room = self.s.nodepool_limit_nodes - len(self._alive())
        for _ in range(max(0, min(wanting - coming, room))):
            self._launch(now, spot=True)

    def _gpuplane(self, now: float) -> None:
        free = self._ready_free(now)
        if self.queue and free:
            plan = schedule(self._state(now, free), self.config, now, cycles=None)
            for decision in plan.admitted:
                job = self.jobs[int(decision.workload.split("/j", 1)[1])]
                for ps in decision.pod_sets:
                    for place in ps.placement or ():
                        self._bind(job, self.nodes[place.node])
                self._start(job, now)
        # Gangs with quota but no place: one atomic request each, within the NodePool limit. A
        # request whose nodes others took (or that scaled down unused) is made again.
        booked = {n.booked for n in self._alive() if n.booked is not None}
        alive = len(self._alive())
        for j in self.queue:
            job = self.jobs[j]
            if job.requested and j in booked:
                continue
            if alive + job.arrival.pods > self.s.nodepool_limit_nodes:
                break  # all or nothing; later jobs do not jump the queue
            for _ in range(job.arrival.pods):
                self._launch(now, spot=True, booked=j)
            job.requested = True
            alive += job.arrival.pods
        # The warm buffer: idle on-demand nodes ready for the next arrival.
        coming_buffer = sum(1 for n in self._alive() if n.buffer and n.ready_at > now)
        for _ in range(max(0, self.warm - self._idle_buffer() - coming_buffer)):
            if len(self._alive()) >= self.s.nodepool_limit_nodes:
                break
            self._launch(now, spot=False, buffer=True)

    def _state(self, now: float, free: list[_Node]) -> ClusterState:
        """What the core sees: the free ready nodes, and the queue as pending Workloads (nodes that
        run something are left out: each pod takes a whole node)."""
        template = PodTemplate(requests=frozen_map({GPU: self.s.gpus_per_node}))
        nodes = tuple(
            Node(
                name=n.name,
                allocatable=frozen_map({GPU: self.s.gpus_per_node, "pods": 110}),
                labels=frozen_map({HOSTNAME_LABEL: n.name}),
            )
            for n in sorted(free, key=lambda n: (n.booked is None, n.name))
        )
        workloads = []
        for order, j in enumerate(self.queue):
            job = self.jobs[j]
            conditions: tuple[Condition, ...] = ()
            if job.interrupted:
                conditions = (Condition(ConditionType.EVICTED, True, Reason.NODE_INTERRUPTED, "", now),)
            workloads.append(
                Workload(
                    namespace="sim",
                    name=f"j{j}",
                    uid=f"j{j}",
                    creation=float(order + 1),
                    priority=0,
                    pod_sets=(PodSet("main", job.arrival.pods, template),),
                    queue_name="q",
                    conditions=conditions,
                )
            )
        quota = ResourceQuota(nominal=10**9)
        cq = ClusterQueue(
            name="cq",
            resource_groups=(ResourceGroup((GPU,), (FlavorQuotas("default", frozen_map({GPU: quota})),)),),
            namespace_selector=LabelSelector(),
        )
        return ClusterState(
            namespaces=frozen_map({"sim": Namespace("sim")}),
            resource_flavors=frozen_map({"default": ResourceFlavor("default")}),
            cluster_queues=frozen_map({"cq": cq}),
            local_queues=frozen_map({"sim/q": LocalQueue("sim", "q", "cq")}),
            workloads=tuple(workloads),
            nodes=nodes,
            pods=(),
        )

    # --- result -----------------------------------------------------------------------------

    def _result(self, horizon: float) -> CapacityResult:
        self._account_partial(horizon)
        for node in self._alive():
            self._end(node, horizon)
        waits = [
            ((j.first_start if j.first_start is not None else horizon) - j.arrival.at) / 60.0
            for j in self.jobs.values()
        ]
        return CapacityResult(
            configuration=self.configuration,
            gpu_hours_paid=round(self.paid[True] + self.paid[False], 1),
            spot_gpu_hours=round(self.paid[True], 1),
            on_demand_gpu_hours=round(self.paid[False], 1),
            wait_p95_minutes=round(float(np.percentile(waits, 95)) if waits else 0.0, 1),
            wait_mean_minutes=round(float(np.mean(waits)) if waits else 0.0, 1),
            partial_gang_gpu_hours=round(self.partial, 1),
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
