"""The FGD (USENIX ATC'23) placement benchmark on the openb trace, as a protocol driver.

One run::

    nodes CSV ──> GpuArrays            pods CSV ──> typical pods (whole list, before tuning)
                      │                       │
    arrivals (file or seeded) ──> one pod at a time: filter -> score -> pick (ties: node rank)
                      │                        -> GPUs -> place, or drop for good if nothing fits
                      v
    after every arrival: arrived milli-GPU, allocated milli-GPU, cluster fragment amount
                      v
    columns 0..130: mean allocation (and fragmentation) over the arrivals whose arrived demand
                    rounds to k % of GPU capacity

No departures, no retries, no preemption; trace times are never used. Arrival order and node
ranks come either from the published data files (exactly the reference simulator's, so the
deterministic policies reproduce the published numbers), or from a ``numpy`` generator seeded
with the run's seed, drawn the same way (shuffle, then tune up or down to 1.3 x capacity).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpuplane.core.pod_engine import (
    FloatArray,
    GpuArrays,
    GpuRequest,
    IntArray,
    NodeSpec,
    PolicyContext,
    get_profile,
    node_fragmentation,
    policy_factory,
    schedule_one,
    typical_pods,
)
from gpuplane.sim.traces import TraceError, TracePod, read_arrivals, read_node_names, read_nodes, read_pods

TUNE_RATIO = 1.3
# Entropy prefix that separates the policy's random stream from the arrival order's (seed alone).
POLICY_STREAM = 1
COLUMNS = range(131)

ProgressCallback = Callable[[int, int], None]


@dataclass(frozen=True, slots=True)
class Arrivals:
    """An arrival sequence and the node ranks (smaller wins ties) of one seeded run."""

    requests: tuple[GpuRequest, ...]
    rank: IntArray


@dataclass(frozen=True, slots=True)
class EventLog:
    """Per arrival: cumulative arrived milli-GPU, allocated milli-GPU, cluster fragment amount."""

    arrived_milli: IntArray
    used_milli: IntArray
    fragment_milli: FloatArray
    failed: int


@dataclass(frozen=True, slots=True)
class FgdRun:
    """The outcome of one protocol run, in the shape of the published results."""

    policy: str
    seed: int
    gpus_total: int
    arrived: int
    failed: int
    allocation_pct: dict[str, float | None]
    fragmentation_pct: dict[str, float | None]
    final_allocation_pct: float
    wall_seconds: float

    def document(self) -> dict[str, object]:
        """The JSON document of ``gpuplane simulate --protocol fgd``."""
        return {
            "protocol": "fgd",
            "policy": self.policy,
            "seed": self.seed,
            "gpusTotal": self.gpus_total,
            "arrived": self.arrived,
            "failed": self.failed,
            "finalAllocationPct": self.final_allocation_pct,
            "allocationPct": self.allocation_pct,
            "fragmentationPct": self.fragmentation_pct,
            "wallSeconds": round(self.wall_seconds, 3),
        }


def seeded_arrivals(pods: Sequence[TracePod], nodes: Sequence[NodeSpec], seed: int) -> Arrivals:
    """Shuffle the trace, tune it to 1.3 x GPU capacity, and rank nodes, from one ``numpy`` seed.

    Tune up (demand below the target): append pods drawn with replacement from the name-sorted
    trace until the next draw's per-GPU milli would pass the target. Tune down (above it): remove
    uniformly drawn pods until the demand is within the target. Node ranks are a permutation
    assigned in ``sn`` order. Same steps as the reference simulator, not the same random numbers.
    """
    rng = np.random.default_rng(seed)
    workload = sorted(pods, key=lambda p: p.name)
    sequence = [workload[int(i)].request for i in rng.permutation(len(workload))]
    demand = sum(r.total_milli for r in sequence)
    target = TUNE_RATIO * sum(n.gpus for n in nodes) * 1000
    if demand < target and any(p.request.gpus for p in workload):  # CPU-only draws never stop it
        while True:
            drawn = workload[int(rng.integers(len(workload)))].request
            if demand + drawn.gpu_milli > target:
                break
            sequence.append(drawn)
            demand += drawn.total_milli
    else:
        while demand > target:
            removed = sequence.pop(int(rng.integers(len(sequence))))
            demand -= removed.total_milli
    order = sorted(range(len(nodes)), key=lambda i: nodes[i].name)
    rank = np.empty(len(nodes), dtype=np.int64)
    rank[order] = rng.permutation(len(nodes))
    return Arrivals(tuple(sequence), rank)


def file_arrivals(
    pods: Sequence[TracePod], nodes: Sequence[NodeSpec], seed: int, arrivals: Path, node_rank: Path | None
) -> Arrivals:
    """Arrivals of one seed from an arrivals file; node ranks from a node-rank file or seeded."""
    by_name = {p.name: p.request for p in pods}
    sources = read_arrivals(arrivals, seed)
    unknown = [s for s in sources if s not in by_name]
    if unknown:
        raise TraceError(f"{arrivals}: seed {seed}: source_pod {unknown[0]!r} is not in the pod list")
    requests = tuple(by_name[s] for s in sources)
    if node_rank is None:
        return Arrivals(requests, seeded_arrivals(pods, nodes, seed).rank)
    return Arrivals(requests, node_ranks(nodes, seed, node_rank))


def node_ranks(nodes: Sequence[NodeSpec], seed: int, path: Path) -> IntArray:
    """Rank of each node (0 wins ties) from a node-rank file: the order of the simulator names."""
    names = read_node_names(path, seed)
    missing = [n.name for n in nodes if n.name not in names]
    if missing:
        raise TraceError(f"{path}: seed {seed}: node {missing[0]!r} has no sim_node_name")
    order = sorted(range(len(nodes)), key=lambda i: names[nodes[i].name])
    rank = np.empty(len(nodes), dtype=np.int64)
    rank[order] = np.arange(len(nodes))
    return rank


def replay(
    nodes: Sequence[NodeSpec],
    *,
    arrivals: Arrivals,
    policy_name: str,
    context: PolicyContext,
    progress: ProgressCallback | None = None,
) -> EventLog:
    """Place ``arrivals`` one at a time with one policy's profile on the placement engine; log the
    cluster after every arrival. ``context`` holds the typical pods (fragmentation is measured
    against them) and the policy's own random stream."""
    cluster = GpuArrays(nodes)
    profile = get_profile(policy_name, context)
    fragmentation = node_fragmentation(context.typical, cluster)
    count = len(arrivals.requests)
    arrived = np.empty(count, dtype=np.int64)
    used = np.empty(count, dtype=np.int64)
    fragment = np.empty(count, dtype=np.float64)
    arrived_milli = used_milli = failed = 0
    step = max(1, count // 200)
    for i, request in enumerate(arrivals.requests):
        arrived_milli += request.total_milli
        if schedule_one(profile, cluster, request, arrivals.rank) is None:
            failed += 1
        else:
            used_milli += request.total_milli
        arrived[i] = arrived_milli
        used[i] = used_milli
        fragment[i] = fragmentation.values().sum()
        if progress is not None and (i % step == 0 or i == count - 1):
            progress(i + 1, count)
    return EventLog(arrived, used, fragment, failed)


def round2(value: float) -> float:
    """Round to 2 decimals as the published analysis does on a pandas mean (a numpy float64).

    That is numpy's rounding (scale by 100, round half to even, scale back), which differs from
    Python's correctly rounded ``round(float, 2)`` on a few values such as 2.675.
    """
    return float(np.round(np.float64(value), 2))


def column_means(arrived_milli: IntArray, values: FloatArray, total_gpus: int) -> dict[int, float | None]:
    """Per column k = 0..130: the mean of ``values`` over the arrivals whose demand rounds to k %.

    Arrived % = Python's ``round(arrived / total_gpus / 10)`` (half to even). Column k averages
    the events at exactly k or, when there are none, those within k-1..k+1; ``None`` when there
    are none either. The mean is numpy's (pairwise) sum over the count, as pandas takes it.
    """
    arrive_pct = np.array([round(a / total_gpus / 10) for a in arrived_milli.tolist()], dtype=np.int64)
    out: dict[int, float | None] = {}
    for k in COLUMNS:
        chosen = values[arrive_pct == k]
        if chosen.size == 0:
            chosen = values[(arrive_pct >= k - 1) & (arrive_pct <= k + 1)]
        out[k] = None if chosen.size == 0 else float(chosen.sum() / chosen.size)
    return out


def allocation_columns(log: EventLog, total_gpus: int) -> dict[str, float | None]:
    """``analysis_allo_discrete``: allocated milli-GPU as % of capacity, per arrived-demand column.

    Each event's allocation % is rounded to 2 decimals first (Python's ``round``), as published.
    """
    alloc = np.array([round(u / total_gpus / 10, 2) for u in log.used_milli.tolist()], dtype=np.float64)
    means = column_means(log.arrived_milli, alloc, total_gpus)
    return {str(k): None if m is None else round2(m) for k, m in means.items()}


def fragmentation_columns(log: EventLog, total_gpus: int) -> dict[str, float | None]:
    """``analysis_frag_discrete``: fragmented GPUs as % of capacity, per arrived-demand column.

    Each event's fragment amount is rounded to 2 decimals (the reference simulator logs it with
    ``%.2f``); the column is ``round(100 * mean / 1000 / total_gpus, 2)``.
    """
    logged = np.array([round(f, 2) for f in log.fragment_milli.tolist()], dtype=np.float64)
    means = column_means(log.arrived_milli, logged, total_gpus)
    return {str(k): None if m is None else round2(100 * m / 1000 / total_gpus) for k, m in means.items()}


@dataclass(frozen=True, slots=True)
class FgdTraces:
    """The protocol's input files: the node and pod lists and, optionally, a recorded arrival
    order and node ranks (the published runs'); without them both are drawn from the seed."""

    nodes: Path
    pods: Path
    arrivals: Path | None = None
    node_rank: Path | None = None


def run_fgd_protocol(
    traces: FgdTraces, policy: str, seed: int, *, progress: ProgressCallback | None = None
) -> FgdRun:
    """One run of the protocol. Raises :class:`TraceError` for unreadable input, ``KeyError`` for
    an unknown policy (before reading any file)."""
    nodes_path, pods_path = traces.nodes, traces.pods
    arrivals_path, node_rank_path = traces.arrivals, traces.node_rank
    started = time.perf_counter()
    policy_factory(policy)  # an unknown name fails before any file is read
    # The policy's own draws (Random) use a stream independent of the arrival order's.
    rng = np.random.default_rng([POLICY_STREAM, seed])
    nodes = read_nodes(nodes_path)
    if not any(n.gpus for n in nodes):
        raise TraceError(f"{nodes_path}: no node has a GPU")
    pods = read_pods(pods_path)
    if arrivals_path is not None:
        arrivals = file_arrivals(pods, nodes, seed, arrivals_path, node_rank_path)
    else:
        arrivals = seeded_arrivals(pods, nodes, seed)
        if node_rank_path is not None:
            arrivals = Arrivals(arrivals.requests, node_ranks(nodes, seed, node_rank_path))
    context = PolicyContext(typical=typical_pods([p.request for p in pods]), rng=rng)
    log = replay(nodes, arrivals=arrivals, policy_name=policy, context=context, progress=progress)
    total_gpus = sum(n.gpus for n in nodes)
    return FgdRun(
        policy=policy.lower(),
        seed=seed,
        gpus_total=total_gpus,
        arrived=len(arrivals.requests),
        failed=log.failed,
        allocation_pct=allocation_columns(log, total_gpus),
        fragmentation_pct=fragmentation_columns(log, total_gpus),
        final_allocation_pct=round(100 * int(log.used_milli[-1]) / (total_gpus * 1000), 2),
        wall_seconds=time.perf_counter() - started,
    )
