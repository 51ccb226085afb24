"""Placement at scale: 10,000 nodes x 8 GPUs in three topology levels.

Load: 1,000 gangs of 8 pods x 8 GPUs with required rack topology, then 20,000
single-pod workloads of 1, 2 or 4 GPUs, in 100 ClusterQueues of one cohort. The same
workloads are scheduled twice in the same run, each in its own process:

* **baseline**: quota only (no Node objects), so admission does no placement;
* **placement**: with the nodes, so every admission also finds nodes and devices.

Reported: pods placed per second of ``stats.scheduleSeconds`` (target >= 2,000), the
ratio to the baseline's admitted pods per second, and each child's own peak RSS.

Usage::

    python3 bench/placement_scale.py [--nodes 10000] [--singles 20000] [--gangs 1000] [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

BENCH_DIR = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("kueue_scale", BENCH_DIR / "kueue_scale.py")
assert _spec is not None
assert _spec.loader is not None
kueue_scale = importlib.util.module_from_spec(_spec)
sys.modules["kueue_scale"] = kueue_scale  # dataclasses look their module up by name
_spec.loader.exec_module(kueue_scale)

KUEUE = "kueue.x-k8s.io/v1beta2"
NODES_PER_RACK = 40
RACKS_PER_BLOCK = 25
QUEUES = 100
SINGLE_SIZES = (1, 1, 2, 1, 4, 1, 1, 2)


def _timestamp(i: int) -> str:
    return f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"


def generate(nodes: int, singles: int, gangs: int, with_nodes: bool) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}},
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "h100"}, "spec": {}},
    ]
    gpus = nodes * 8
    for q in range(QUEUES):
        objects.append(
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": f"q{q:03d}"},
                "spec": {
                    "cohortName": "all",
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": "h100",
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": str(nodes * 128 // QUEUES)},
                                        {"name": "nvidia.com/gpu", "nominalQuota": str(gpus // QUEUES)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            }
        )
        objects.append(
            {
                "apiVersion": KUEUE,
                "kind": "LocalQueue",
                "metadata": {"name": f"q{q:03d}", "namespace": "bench"},
                "spec": {"clusterQueue": f"q{q:03d}"},
            }
        )
    if with_nodes:
        for n in range(nodes):
            rack = n // NODES_PER_RACK
            objects.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": f"node-{n:05d}",
                        "labels": {
                            "topology.gpuplane.dev/block": f"block-{rack // RACKS_PER_BLOCK:02d}",
                            "topology.gpuplane.dev/rack": f"rack-{rack:03d}",
                            "kubernetes.io/hostname": f"node-{n:05d}",
                            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                        },
                    },
                    "status": {
                        "allocatable": {"cpu": "128", "memory": "2Ti", "nvidia.com/gpu": "8", "pods": "110"}
                    },
                }
            )
    sequence = 0

    def workload(name: str, count: int, gpu: int, priority: int, topology: bool) -> dict[str, Any]:
        nonlocal sequence
        sequence += 1
        template: dict[str, Any] = {
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": "8", "nvidia.com/gpu": str(gpu)}}}
                ]
            }
        }
        if topology:
            template["metadata"] = {
                "annotations": {"kueue.x-k8s.io/podset-required-topology": "topology.gpuplane.dev/rack"}
            }
        return {
            "apiVersion": KUEUE,
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": "bench",
                "uid": name,
                "creationTimestamp": _timestamp(sequence),
            },
            "spec": {
                "queueName": f"q{sequence % QUEUES:03d}",
                "priority": priority,
                "podSets": [{"name": "main", "count": count, "template": template}],
            },
        }

    objects += [workload(f"gang-{g:05d}", 8, 8, 100, True) for g in range(gangs)]
    objects += [
        workload(f"single-{s:05d}", 1, SINGLE_SIZES[s % len(SINGLE_SIZES)], 0, False) for s in range(singles)
    ]
    return objects


def _schedule(path: Path) -> tuple[dict[str, Any], Any]:
    run = kueue_scale.run_child(
        [
            sys.executable,
            "-c",
            "from gpuplane.cli.app import main; main()",
            "schedule",
            "-f",
            str(path),
            "-o",
            "json",
        ]
    )
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        raise SystemExit(1)
    return json.loads(run.stdout), run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--singles", type=int, default=20_000)
    parser.add_argument("--gangs", type=int, default=1_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    console = Console()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, with_nodes in (("baseline", False), ("placement", True)):
            path = Path(tmp) / f"{label}.json"
            objects = generate(args.nodes, args.singles, args.gangs, with_nodes)
            path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
            console.print(f"{label}: running gpuplane schedule on {len(objects):,} objects ...")
            doc, run = _schedule(path)
            pods = sum(ps["count"] for a in doc["admitted"] for ps in a["podSets"])
            seconds = doc["stats"]["scheduleSeconds"]
            results[label] = {
                "admittedWorkloads": len(doc["admitted"]),
                "pendingWorkloads": len(doc["pending"]),
                "pods": pods,
                "cycles": doc["stats"]["cycles"],
                "parseSeconds": doc["stats"]["parseSeconds"],
                "scheduleSeconds": seconds,
                "podsPerSecond": pods / seconds if seconds else 0.0,
                "peakRssMiB": round(run.peak_rss_mib, 1),
                "wallSeconds": round(run.wall_seconds, 2),
            }
    base, placed = results["baseline"], results["placement"]
    ratio = placed["podsPerSecond"] / base["podsPerSecond"] if base["podsPerSecond"] else 0.0
    shape = f"{args.nodes:,} nodes x 8 GPUs, {args.gangs:,} gangs, {args.singles:,} singles"
    table = Table(title=f"placement-scale: {shape}")
    table.add_column("measure")
    for label in results:
        table.add_column(label, justify="right")
    for key in ("admittedWorkloads", "pendingWorkloads", "pods", "cycles", "parseSeconds", "scheduleSeconds"):
        table.add_row(key, *(f"{results[label][key]:,}" for label in results))
    table.add_row("pods/s", *(f"{results[label]['podsPerSecond']:,.0f}" for label in results))
    table.add_row("peak RSS MiB", *(f"{results[label]['peakRssMiB']:,.0f}" for label in results))
    console.print(table)
    verdict = "PASS" if placed["podsPerSecond"] >= 2000 else "FAIL"
    console.print(
        f"placement: {placed['podsPerSecond']:,.0f} pods/s ({ratio:.2f}x the quota-only baseline's "
        f"{base['podsPerSecond']:,.0f}); target >= 2,000 pods/s: {verdict}"
    )
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "placement-scale.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
