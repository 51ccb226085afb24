"""The elastic-capacity scenario of ``gpuplane simulate-capacity``: node pools, queues, prices, arrivals.

Three node pools of different sizes, each a Karpenter NodePool with its own limit::

    pool   GPUs/node  on-demand $/GPU-h  limit (nodes)   who runs there
    h100   8          6.90               12              training gangs (8-GPU pods), research (4-GPU pods)
    l40s   4          2.60               8               research (2- and 4-GPU pods), apps (1-GPU pods)
    l4     1          0.80               24              apps and CI (1-GPU pods)

Pods smaller than a node share it (two 4-GPU pods on an h100 node, four 1-GPU pods on an l40s).
Four queues, one per team, each with a quota per pool (their quotas add up to the limits):

    queue     pools        quota (GPUs)    work
    training  h100         64              gangs of 1, 2 or 4 pods x 8 GPUs, checkpointed every 30 min
    research  h100, l40s   32, 16          single pods of 2 or 4 GPUs, checkpointed every 20 min
    apps      l4, l40s     16, 16          single 1-GPU pods (inference, notebooks), stateless
    ci        l4           8               short 1-GPU jobs (tests, evaluations; median 5 min), stateless

**Prices are assumptions**, not quotes: the on-demand prices per GPU-hour are of the order of public
cloud list prices for H100, L40S and L4 GPUs (2024-25), and spot costs on-demand divided by
``price_ratio`` (default 3.0: spot GPU capacity is commonly offered 60-70 % below on-demand; an
assumption, settable with ``--price-ratio``). Every comparison is between configurations on the same
prices, so the ratio between pools matters more than the level.

Cold start (``../shared/domain-facts.md`` §6.3): node ready in 3-6 min (VM boot plus driver; 4.5
min here) plus the image pull (15 GB at ~150 MB/s, 100 s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HOUR = 3600.0


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """One NodePool: its node size, its on-demand price per GPU-hour and its limit in nodes."""

    name: str
    gpus_per_node: int
    on_demand_price: float
    limit_nodes: int


@dataclass(frozen=True, slots=True)
class QueueSpec:
    """One team's queue: its quota per pool (GPUs), in the pools' order of preference."""

    name: str
    quota: tuple[tuple[str, int], ...]

    @property
    def pools(self) -> tuple[str, ...]:
        return tuple(p for p, _ in self.quota)


@dataclass(frozen=True, slots=True)
class ClassSpec:
    """A kind of work: its queue, arrivals, shape, duration and checkpoints."""

    name: str
    queue: str
    mean_interarrival_seconds: float
    pods: tuple[int, ...]  # pods per job, drawn uniformly
    gpus_per_pod: tuple[int, ...]  # GPUs per pod, drawn uniformly
    median_hours: float
    checkpoint_every_seconds: float | None  # None: stateless (loses nothing when stopped)


@dataclass(frozen=True, slots=True)
class CapacityScenario:
    """Everything one ``simulate-capacity`` run depends on (all of it a parameter)."""

    hours: float = 72.0
    seed: int = 7
    nodepool_limit_nodes: int = 12  # the h100 NodePool's limit, in nodes (the gang pool)
    node_ready_seconds: float = 270.0  # VM boot plus GPU driver (domain facts 6.3: 3-6 min)
    image_pull_seconds: float = 100.0  # 15 GB image at ~150 MB/s (domain facts 6.3)
    spot_interruptions_per_node_hour: float = 0.03
    interruption_notice_seconds: float = 120.0  # the cloud's notice before the node goes
    idle_scale_down_seconds: float = 600.0  # Karpenter consolidateAfter / CA scale-down delay
    warm_nodes: int = 2  # the static buffer (gpuplane-static-buffer), h100 nodes
    price_ratio: float = 3.0  # on-demand / spot price (an assumption; see the module docstring)
    arrival_window_seconds: float = 3600.0  # the warm buffer predicts from the last hour's arrivals
    duration_sigma: float = 0.8
    load: float = 1.0  # multiplies every class's arrival rate

    @property
    def cold_start(self) -> float:
        return self.node_ready_seconds + self.image_pull_seconds

    def pools(self) -> tuple[PoolSpec, ...]:
        return (
            PoolSpec("h100", 8, 6.90, self.nodepool_limit_nodes),
            PoolSpec("l40s", 4, 2.60, 8),
            PoolSpec("l4", 1, 0.80, 24),
        )

    def queues(self) -> tuple[QueueSpec, ...]:
        h100 = self.nodepool_limit_nodes * 8
        return (
            QueueSpec("training", (("h100", h100 * 2 // 3),)),
            QueueSpec("research", (("h100", h100 - h100 * 2 // 3), ("l40s", 16))),
            QueueSpec("apps", (("l4", 16), ("l40s", 16))),
            QueueSpec("ci", (("l4", 8),)),
        )

    def classes(self) -> tuple[ClassSpec, ...]:
        return (
            ClassSpec("training", "training", 2400.0, (1, 1, 2, 4), (8,), 1.5, 1800.0),
            ClassSpec("research", "research", 1200.0, (1,), (2, 4, 4), 1.0, 1200.0),
            ClassSpec("apps", "apps", 300.0, (1,), (1,), 0.75, None),
            ClassSpec("ci", "ci", 240.0, (1,), (1,), 5 / 60, None),
        )

    def spot_price(self, pool: PoolSpec) -> float:
        return pool.on_demand_price / self.price_ratio

    def check(self) -> None:
        """Refuse values no run can use, naming the field."""
        positive = {"hours": self.hours, "price_ratio": self.price_ratio, "load": self.load}
        for name, value in positive.items():
            if not value > 0 or math.isinf(value):
                raise ValueError(f"{name} must be positive, got {value}")
        if self.nodepool_limit_nodes < 1:
            raise ValueError(f"nodepool_limit_nodes must be at least 1, got {self.nodepool_limit_nodes}")
        for name in ("node_ready_seconds", "image_pull_seconds", "spot_interruptions_per_node_hour"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)}")
        if self.warm_nodes < 0:
            raise ValueError(f"warm_nodes must not be negative, got {self.warm_nodes}")


@dataclass(frozen=True, slots=True)
class Arrival:
    """One job: when it arrives, its class and queue, its pods and the running it needs."""

    job: int
    at: float
    klass: str
    queue: str
    pods: int
    gpus_per_pod: int
    work: float  # seconds of running needed
    checkpoint: float | None  # seconds between checkpoints; None: stateless

    @property
    def gpus(self) -> int:
        return self.pods * self.gpus_per_pod


def arrivals(scenario: CapacityScenario) -> tuple[list[Arrival], list[float]]:
    """The jobs (every class's Poisson arrivals, merged in time) and the interruption draws (one
    exponential per spot node launch, in order). Arrivals stop at 80 % of the horizon: the last
    fifth drains."""
    rng = np.random.default_rng(scenario.seed)
    end = scenario.hours * HOUR * 0.8
    drawn: list[tuple[float, ClassSpec, int, int, float]] = []
    for spec in scenario.classes():
        t = 0.0
        while True:
            t += float(rng.exponential(spec.mean_interarrival_seconds / scenario.load))
            if t >= end:
                break
            pods = int(rng.choice(spec.pods))
            gpus = int(rng.choice(spec.gpus_per_pod))
            work = float(rng.lognormal(math.log(spec.median_hours * HOUR), scenario.duration_sigma))
            drawn.append((t, spec, pods, gpus, min(work, 12 * HOUR)))
    drawn.sort(key=lambda d: d[0])
    out = [
        Arrival(i, t, spec.name, spec.queue, pods, gpus, work, spec.checkpoint_every_seconds)
        for i, (t, spec, pods, gpus, work) in enumerate(drawn)
    ]
    lifetimes = [float(x) for x in rng.exponential(1.0, size=8192)]
    return out, lifetimes
