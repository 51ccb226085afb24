"""Gang placement and fragmentation: all-or-nothing gangs on 8-GPU nodes, one profile at a time.

Protocol: a seeded stream of ``--arrivals-per-node`` x nodes workloads arrives one per time unit;
each is placed whole or not at all through the core's gang placement
(``core.placement.gang_placement.PlacementState``), or dropped (no retries, no preemption), and leaves
after an exponential lifetime whose mean makes the offered load 130 % of the GPUs. Churn is what
fragments a cluster. Every profile sees the same stream. The mix (share of workloads):

=====================  =====  =========================================
workload               share  pods
=====================  =====  =========================================
shared GPU, 0.3        20 %   1 pod, ``gpuplane.dev/gpu-fraction: 0.3``
shared GPU, 0.6        15 %   1 pod, ``gpuplane.dev/gpu-fraction: 0.6``
one GPU                25 %   1 pod x 1 GPU
two GPUs               15 %   1 pod x 2 GPUs
gang 2 x 4 GPUs        15 %   2 pods x 4 GPUs
gang 4 x 8 GPUs        10 %   4 pods x 8 GPUs
=====================  =====  =========================================

(an assumed mix of interactive, single-GPU and distributed training work; not from a trace).

Reported per profile: the GPU allocated on average over the second half of the run (% of
capacity), the workloads dropped, how many of them were dropped while enough GPUs were free in total
(*fragmented* failures), wall seconds, and the ratio of the allocation and of the time to the
baseline, ``tightest-first``: the inventory's own order with no
scoring (gang placement before it ran on the placement engine).

Usage::

    python3 bench/gang_fragmentation.py [--nodes 256] [--seed 42] [--profiles gpuplane,fgd,...]
"""

from __future__ import annotations

import argparse
import heapq
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from gpuplane.core.placement.devices import DeviceConfig, pod_needs
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet
from gpuplane.model.objects import Node, PodTemplate

GPU = "nvidia.com/gpu"
FRACTION = "gpuplane.dev/gpu-fraction"
BASELINE = "tightest-first"
PROFILES = (BASELINE, "gpuplane", "fgd", "bestfit", "most-allocated", "least-allocated")
# (share, pods, GPUs per pod, fraction or None)
MIX = ((0.20, 1, 1, "0.3"), (0.15, 1, 1, "0.6"), (0.25, 1, 1, None), (0.15, 1, 2, None), (0.15, 2, 4, None),
       (0.10, 4, 8, None))  # fmt: skip
LOAD = 1.3


@dataclass(frozen=True, slots=True)
class Arrival:
    pods: int
    gpus: int
    fraction: str | None
    lifetime: float = 0.0

    @property
    def milli(self) -> int:
        per_pod = int(float(self.fraction) * 1000) if self.fraction else 1000 * self.gpus
        return per_pod * self.pods


def arrivals(nodes: int, per_node: int, seed: int) -> list[Arrival]:
    rng = np.random.default_rng(seed)
    shares = np.array([m[0] for m in MIX])
    shares = shares / shares.sum()
    mean_milli = sum(share * Arrival(p, g, f).milli for share, (_, p, g, f) in zip(shares, MIX, strict=True))
    mean_life = LOAD * nodes * 8 * 1000 / mean_milli  # one arrival per time unit
    out = []
    for _ in range(nodes * per_node):
        _, pods, gpus, fraction = MIX[int(rng.choice(len(MIX), p=shares))]
        out.append(Arrival(pods, gpus, fraction, float(rng.exponential(mean_life))))
    return out


def gpu_nodes(count: int) -> list[Node]:
    return [
        Node(
            f"n{i:05d}",
            {"cpu": 64_000, "memory": 512 << 30, "pods": 110, GPU: 8},
            {"nvidia.com/gpu.product": "H100"},
        )
        for i in range(count)
    ]


def gang(arrival: Arrival, config: DeviceConfig) -> list[GangPodSet]:
    annotations = {FRACTION: arrival.fraction} if arrival.fraction else {}
    template = PodTemplate(requests={"cpu": 1000, GPU: arrival.gpus}, annotations=annotations)
    return [GangPodSet("main", arrival.pods, pod_needs(template, config), template)]


def run(profile: str, nodes: int, stream: Sequence[Arrival]) -> dict[str, float | int | str]:
    config = DeviceConfig()
    started = time.perf_counter()
    cluster = PlacementState(gpu_nodes(nodes), config, profile=None if profile == BASELINE else profile)
    capacity = nodes * 8 * 1000
    placed_milli = failed = fragmented = 0
    leaving: list[tuple[float, int]] = []  # (time, arrival index), a heap
    allocated: list[int] = []
    for now, arrival in enumerate(stream):
        while leaving and leaving[0][0] <= now:
            _, gone = heapq.heappop(leaving)
            cluster.release(f"w{gone}")
            placed_milli -= stream[gone].milli
        result = cluster.place(f"w{now}", gang(arrival, config))
        if isinstance(result, GangPlacement):
            placed_milli += arrival.milli
            heapq.heappush(leaving, (now + arrival.lifetime, now))
        else:
            failed += 1
            fragmented += capacity - placed_milli >= arrival.milli
        allocated.append(placed_milli)
    steady = allocated[len(allocated) // 2 :]
    return {
        "profile": profile,
        "allocatedPct": round(100 * sum(steady) / len(steady) / capacity, 2),
        "failed": failed,
        "fragmentedFailures": int(fragmented),
        "wallSeconds": round(time.perf_counter() - started, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gang_fragmentation.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--arrivals-per-node", type=int, default=20)
    parser.add_argument(
        "--profiles", default=",".join(PROFILES), help="comma-separated; the baseline runs first"
    )
    parser.add_argument("--out", type=Path, help="write the results as JSON here")
    args = parser.parse_args(argv)
    names = [p for p in args.profiles.split(",") if p]
    if BASELINE not in names:
        names.insert(0, BASELINE)
    stream = arrivals(args.nodes, args.arrivals_per_node, args.seed)
    results = [run(name, args.nodes, stream) for name in [BASELINE, *(n for n in names if n != BASELINE)]]
    base = results[0]
    for r in results:
        r["allocationOverBaseline"] = round(float(r["allocatedPct"]) / float(base["allocatedPct"]), 4)
        r["timeOverBaseline"] = round(float(r["wallSeconds"]) / max(float(base["wallSeconds"]), 1e-9), 2)
    table = Table(
        title=f"gang placement: {args.nodes} nodes x 8 GPUs, {len(stream)} workloads, seed {args.seed}"
    )
    for column in (
        "profile",
        "allocated %",
        "failed",
        "fragmented failures",
        "seconds",
        "alloc / base",
        "time / base",
    ):
        table.add_column(column, justify="left" if column == "profile" else "right")
    keys = ("profile", "allocatedPct", "failed", "fragmentedFailures", "wallSeconds")
    for r in results:
        table.add_row(*(str(r[k]) for k in (*keys, "allocationOverBaseline", "timeOverBaseline")))
    Console().print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gang-fragmentation.json").write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
