"""DRA at scale: admission with placement when GPUs come from a DRA driver, against the same load as
extended resources, in the same run.

Cluster: 1,000 nodes x 8 GPUs. In the DRA run a driver (``gpu.nvidia.com``) publishes each node's
GPUs as one ResourceSlice, with attributes (type, index, product, architecture, driver version, the
NVLink domain of four GPUs) and memory capacity. One node in ten is partitioned into MIG: its slice
has a counter set per physical GPU (eight memory slices) and, beside each whole GPU (which
consumes all eight), the GPU's 1g and 3g partitions consuming their slices. In the extended-resource
run every node advertises ``nvidia.com/gpu: 8`` instead.

Load, in 100 ClusterQueues of one cohort: 200 gangs of four pods (priority 100), each pod asking
for two GPUs of one NVLink domain (a claim template with a ``matchAttribute`` constraint), then
5,000 one-GPU pods. Quota is the same in both runs: Kueue's ``deviceClassMappings`` charges the DRA
claims as ``nvidia.com/gpu``.

Each run is ``gpuplane schedule -f STATE -o json`` in its own process, ``--repeat`` times (3),
the two taking turns; the fastest of each counts (a shared machine's load only slows a run down).
Reported: pods admitted per second of ``stats.scheduleSeconds`` for each, the ratio (target: DRA
at least 50 % of the extended-resource rate), and each child's peak RSS; every admitted DRA pod is
checked to hold distinct devices, gang pods two of one NVLink domain.

Usage::

    python3 bench/dra_scale.py [--nodes 1000] [--singles 5000] [--gangs 200] [--repeat 3] [--output json]
                               [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
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
DRA = "resource.k8s.io/v1"
DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
GPU = "nvidia.com/gpu"
NAMESPACE = "bench"
QUEUES = 100
GPUS_PER_NODE = 8
NVLINK_GROUP = 4  # GPUs per NVLink domain
GANG_PODS = 4
GANG_POD_GPUS = 2
MIG_EVERY = 10  # one node in ten is partitioned into MIG
# MIG partitions of one GPU: profile -> first memory slices of each (a 1g takes one, a 3g four).
MIG_1G = tuple(range(7))
MIG_3G = (0, 4)
TARGET_RATIO = 0.5
SELECTOR = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].type == "gpu"'


def _timestamp(i: int) -> str:
    return f"2026-01-01T{i // 3600 % 24:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z"


def _queues(nodes: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    gpus = nodes * GPUS_PER_NODE
    for q in range(QUEUES):
        name = f"q{q:03d}"
        resources = [
            {"name": "cpu", "nominalQuota": str(nodes * 128 // QUEUES)},
            {"name": GPU, "nominalQuota": str(gpus // QUEUES)},
        ]
        out.append(
            {
                "apiVersion": KUEUE,
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {
                    "cohortName": "all",
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", GPU],
                            "flavors": [{"name": "h100", "resources": resources}],
                        }
                    ],
                },
            }
        )
        out.append(
            {
                "apiVersion": KUEUE,
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": NAMESPACE},
                "spec": {"clusterQueue": name},
            }
        )
    return out


def _node(n: int, dra: bool) -> dict[str, Any]:
    name = f"node-{n:04d}"
    allocatable = {"cpu": "128", "memory": "2Ti", "pods": "110"}
    if not dra:
        allocatable[GPU] = str(GPUS_PER_NODE)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "topology.gpuplane.dev/rack": f"rack-{n // 40:03d}"},
        },
        "status": {"allocatable": allocatable},
    }


def _gpu_device(node: str, index: int, counters: bool) -> dict[str, Any]:
    device: dict[str, Any] = {
        "name": f"gpu-{index}",
        "attributes": {
            "type": {"string": "gpu"},
            "index": {"int": index},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "architecture": {"string": "Hopper"},
            "driverVersion": {"version": "580.65.6"},
            "nvlinkDomain": {"string": f"{node}-nvl{index // NVLINK_GROUP}"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
    }
    if counters:
        device["consumesCounters"] = [
            {"counterSet": f"gpu-{index}-slices", "counters": {f"mem-{s}": {"value": "1"} for s in range(8)}}
        ]
    return device


def _mig_device(index: int, profile: str, first: int, slices: int, memory: str) -> dict[str, Any]:
    return {
        "name": f"gpu-{index}-mig-{profile}-{first}",
        "attributes": {
            "type": {"string": "mig"},
            "profile": {"string": profile},
            "parentIndex": {"int": index},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
        },
        "capacity": {"memory": {"value": memory}},
        "consumesCounters": [
            {
                "counterSet": f"gpu-{index}-slices",
                "counters": {f"mem-{s}": {"value": "1"} for s in range(first, first + slices)},
            }
        ],
    }


def resource_slice(n: int) -> dict[str, Any]:
    """The slice the driver publishes for node ``n``: 8 GPUs, and on every MIG_EVERY-th node their
    MIG partitions over shared counters."""
    node = f"node-{n:04d}"
    mig = n % MIG_EVERY == 0
    devices: list[dict[str, Any]] = []
    spec: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        "nodeName": node,
    }
    for i in range(GPUS_PER_NODE):
        devices.append(_gpu_device(node, i, mig))
        if mig:
            devices += [_mig_device(i, "1g.10gb", s, 1, "10Gi") for s in MIG_1G]
            devices += [_mig_device(i, "3g.40gb", s, 4, "40Gi") for s in MIG_3G]
    if mig:
        spec["sharedCounters"] = [
            {"name": f"gpu-{i}-slices", "counters": {f"mem-{s}": {"value": "1"} for s in range(8)}}
            for i in range(GPUS_PER_NODE)
        ]
    spec["devices"] = devices
    return {
        "apiVersion": DRA,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}"},
        "spec": spec,
    }


def _dra_objects() -> list[dict[str, Any]]:
    """The DeviceClass, Kueue's mapping of it to nvidia.com/gpu, and the two claim templates."""
    gpu_request = {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}
    return [
        {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "resources": {"deviceClassMappings": [{"name": GPU, "deviceClassNames": [GPU_CLASS]}]},
        },
        {
            "apiVersion": DRA,
            "kind": "DeviceClass",
            "metadata": {"name": GPU_CLASS},
            "spec": {"selectors": [{"cel": {"expression": SELECTOR}}]},
        },
        {
            "apiVersion": DRA,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": NAMESPACE},
            "spec": {"spec": {"devices": {"requests": [gpu_request]}}},
        },
        {
            "apiVersion": DRA,
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "nvlink-pair", "namespace": NAMESPACE},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpus",
                                "exactly": {"deviceClassName": GPU_CLASS, "count": GANG_POD_GPUS},
                            }
                        ],
                        "constraints": [{"requests": ["gpus"], "matchAttribute": f"{DRIVER}/nvlinkDomain"}],
                    }
                }
            },
        },
    ]


def generate(nodes: int, singles: int, gangs: int, dra: bool) -> list[dict[str, Any]]:
    """The state file's objects: the DRA run (``dra``) or the same load as extended resources."""
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": KUEUE, "kind": "ResourceFlavor", "metadata": {"name": "h100"}, "spec": {}},
    ]
    objects += _queues(nodes)
    if dra:
        objects += _dra_objects()
    objects += [_node(n, dra) for n in range(nodes)]
    if dra:
        objects += [resource_slice(n) for n in range(nodes)]
    sequence = 0

    def workload(name: str, count: int, gpus: int, priority: int, template_name: str) -> dict[str, Any]:
        nonlocal sequence
        sequence += 1
        container: dict[str, Any] = {"name": "c", "resources": {"requests": {"cpu": "8"}}}
        spec: dict[str, Any] = {"containers": [container]}
        if dra:
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template_name}]
            container["resources"]["claims"] = [{"name": "gpu"}]
        else:
            container["resources"]["requests"][GPU] = str(gpus)
        return {
            "apiVersion": KUEUE,
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "uid": name,
                "creationTimestamp": _timestamp(sequence),
            },
            "spec": {
                "queueName": f"q{sequence % QUEUES:03d}",
                "priority": priority,
                "podSets": [{"name": "main", "count": count, "template": {"spec": spec}}],
            },
        }

    objects += [workload(f"gang-{g:04d}", GANG_PODS, GANG_POD_GPUS, 100, "nvlink-pair") for g in range(gangs)]
    objects += [workload(f"single-{s:05d}", 1, 1, 0, "one-gpu") for s in range(singles)]
    return objects


def check_claims(doc: dict[str, Any]) -> list[str]:
    """What is wrong with the DRA run's allocations: a device given twice, a pod without its
    devices, a gang pod's GPUs on two NVLink domains (the domain is in the device's name's node and
    index: GPUs 0-3 and 4-7 of a node)."""
    problems: list[str] = []
    held: dict[tuple[str, str], str] = {}
    for admitted in doc["admitted"]:
        name = admitted["workload"]
        want = GANG_POD_GPUS if "/gang-" in name else 1
        for ps in admitted["podSets"]:
            for i, place in enumerate(ps["placement"]):
                devices = place.get("claims", {}).get("gpu", [])
                if len(devices) != want:
                    problems.append(f"{name} pod {i}: {len(devices)} devices, want {want}")
                    continue
                for d in devices:
                    key = (d["pool"], d["device"])
                    if key in held:
                        problems.append(f"{d['pool']}/{d['device']} given to {held[key]} and {name}")
                    held[key] = name
                    if d["pool"] != place["node"]:
                        problems.append(f"{name} pod {i}: device of {d['pool']} on {place['node']}")
                domains = {int(d["device"].split("-")[1]) // NVLINK_GROUP for d in devices}
                if len(domains) != 1:
                    problems.append(f"{name} pod {i}: GPUs on {len(domains)} NVLink domains")
    return problems


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


def measure(
    nodes: int, singles: int, gangs: int, console: Console | None = None, repeat: int = 1
) -> dict[str, Any]:
    """Both runs, each in its own process, ``repeat`` times taking turns (so both see the same load
    on a shared machine); each run's figures are those of its fastest ``scheduleSeconds``, with
    every sample kept. The ratio and the check of the claims come with them."""
    results: dict[str, Any] = {}
    problems: list[str] = []
    runs = (("extendedResources", False), ("dra", True))
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for label, dra in runs:
            paths[label] = Path(tmp) / f"{label}.json"
            objects = generate(nodes, singles, gangs, dra)
            paths[label].write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
            del objects
        for turn in range(repeat):
            for label, dra in runs:
                if console is not None:
                    console.print(f"{label} ({turn + 1}/{repeat}): running gpuplane schedule ...")
                doc, run = _schedule(paths[label])
                if dra and turn == 0:
                    problems = check_claims(doc)
                pods = sum(ps["count"] for a in doc["admitted"] for ps in a["podSets"])
                seconds = doc["stats"]["scheduleSeconds"]
                figures = {
                    "admittedWorkloads": len(doc["admitted"]),
                    "pendingWorkloads": len(doc["pending"]),
                    "pods": pods,
                    "cycles": doc["stats"]["cycles"],
                    "parseSeconds": doc["stats"]["parseSeconds"],
                    "scheduleSeconds": seconds,
                    "podsPerSecond": round(pods / seconds, 1) if seconds else 0.0,
                    "peakRssMiB": round(run.peak_rss_mib, 1),
                    "wallSeconds": round(run.wall_seconds, 2),
                }
                del doc
                best = results.get(label)
                samples = [*best["scheduleSecondsSamples"], seconds] if best else [seconds]
                if best is None or seconds < best["scheduleSeconds"]:
                    best = figures
                best["scheduleSecondsSamples"] = samples
                results[label] = best
    extended = results["extendedResources"]["podsPerSecond"]
    ratio = results["dra"]["podsPerSecond"] / extended if extended else 0.0
    results["ratio"] = round(ratio, 3)
    medians = {label: statistics.median(results[label]["scheduleSecondsSamples"]) for label, _ in runs}
    # The ratio of the median runs' rates (the same pods on both sides), beside the fastest runs'.
    results["ratioOfMedians"] = (
        round(medians["extendedResources"] / medians["dra"], 3) if medians["dra"] else 0.0
    )
    results["target"] = {"ratio": TARGET_RATIO, "pass": ratio >= TARGET_RATIO and not problems}
    results["shape"] = {
        "nodes": nodes,
        "gpusPerNode": GPUS_PER_NODE,
        "migNodes": len(range(0, nodes, MIG_EVERY)),
        "singles": singles,
        "gangs": gangs,
        "podsPerGang": GANG_PODS,
        "gpusPerGangPod": GANG_POD_GPUS,
    }
    results["claimProblems"] = problems[:20]
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1_000)
    parser.add_argument("--singles", type=int, default=5_000)
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of each, taking turns; the fastest counts"
    )
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument("--out", type=Path, help="also write dra-scale.json into this folder")
    args = parser.parse_args(argv)
    if min(args.nodes, args.singles, args.gangs) < 0 or args.nodes == 0 or args.repeat < 1:
        parser.error("--nodes and --repeat must be positive, --singles and --gangs not negative")
    console = Console(stderr=args.output == "json")
    results = measure(args.nodes, args.singles, args.gangs, console, args.repeat)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dra-scale.json").write_text(json.dumps(results, indent=1))
    passed = results["target"]["pass"]
    if args.output == "json":
        print(json.dumps(results, indent=1))
        return 0
    runs = ("extendedResources", "dra")
    shape = f"{args.nodes:,} nodes x 8 GPUs, {args.gangs:,} gangs of 4, {args.singles:,} one-GPU pods"
    table = Table(title=f"dra-scale: {shape}")
    table.add_column("measure")
    for label in runs:
        table.add_column(label, justify="right")
    for key in ("admittedWorkloads", "pendingWorkloads", "pods", "cycles", "parseSeconds", "scheduleSeconds"):
        table.add_row(key, *(f"{results[label][key]:,}" for label in runs))
    table.add_row("pods/s", *(f"{results[label]['podsPerSecond']:,.0f}" for label in runs))
    table.add_row("peak RSS MiB", *(f"{results[label]['peakRssMiB']:,.0f}" for label in runs))
    console.print(table)
    for problem in results["claimProblems"]:
        console.print(f"[red]claim check: {problem}[/red]")
    console.print(
        f"DRA: {results['dra']['podsPerSecond']:,.0f} pods/s, {results['ratio']:.2f}x the extended "
        f"resources' {results['extendedResources']['podsPerSecond']:,.0f} (median runs: "
        f"{results['ratioOfMedians']:.2f}x); target >= {TARGET_RATIO:.0%}: "
        f"{'PASS' if passed else 'FAIL'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
