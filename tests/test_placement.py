"""Placement of gangs onto nodes and devices: through ``PlacementState.place`` and ``gpuplane schedule``.

Every case states the cluster (nodes, and workloads placed before it), the gang, and either where its
pods land or why it cannot be placed. A gang is all or nothing: when it fails, the cluster's free
capacity per node and per device is exactly what it was before.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.devices import DeviceConfig, DeviceGrant, pod_needs
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet, PlacementFailure
from gpuplane.core.scheduler import schedule
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState, Node, PodTemplate
from manifests import (
    Manifest,
    NodeManifest,
    PodSpec,
    WorkloadManifest,
    cluster_queue,
    documents,
    expression,
    local_queue,
    namespace,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

RACK = "topology.example.com/rack"
HOST = "kubernetes.io/hostname"
MEMORY = "nvidia.com/gpu.memory"
REPLICAS = "nvidia.com/gpu.replicas"
SHARING = "nvidia.com/gpu.sharing-strategy"
LAYOUT = "gpuplane.dev/mig-layout"
FRACTION = "gpuplane.dev/gpu-fraction"
GPU_MEMORY = "gpuplane.dev/gpu-memory"
SHARED = "nvidia.com/gpu.shared"
MIG_3G = "nvidia.com/mig-3g.40gb"
MIG_4G = "nvidia.com/mig-4g.40gb"
MIG_7G = "nvidia.com/mig-7g.80gb"
T0 = "2026-01-01T00:00:00Z"


# --- builders and helpers ----------------------------------------------------------------------------


def gpu_node(name: str, gpus: int = 8, labels: Mapping[str, str] | None = None) -> NodeManifest:
    built = node(name).allocatable(cpu="64", memory="512Gi", gpu=gpus).label(HOST, name)
    for key, value in (labels or {}).items():
        built.label(key, value)
    return built


def mig_node(name: str, layout: str, counts: Mapping[str, int]) -> NodeManifest:
    """An 80 GB MIG node (mixed strategy) with ``layout`` and the device plugin's ``counts``."""
    return (
        node(name)
        .allocatable(cpu="64", **counts)
        .label(HOST, name)
        .label(MEMORY, "81920")
        .annotate(LAYOUT, layout)
    )


def eight_gpus() -> PodSpec:
    return pod_spec().container(cpu="1", gpu=8)


def loaded(*objects: Manifest) -> ClusterState:
    return load_state([("state.yaml", documents(*objects))])


def gang_for(
    state: ClusterState, name: str, config: DeviceConfig | None = None, flavor: str | None = None
) -> list[GangPodSet]:
    """The gang of workload ``name`` as the scheduler builds it (all pods of every pod set)."""
    config = config or DeviceConfig()
    wl = next(w for w in state.workloads if w.name == name)
    return [
        GangPodSet(
            name=ps.name,
            count=ps.count,
            needs=pod_needs(ps.template, config),
            template=ps.template,
            flavor=state.resource_flavors[flavor] if flavor else None,
            required_level=ps.required_topology,
            preferred_level=ps.preferred_topology,
        )
        for ps in wl.pod_sets
    ]


def snapshot(cluster: PlacementState) -> dict[str, Any]:
    """Free and used capacity per node and per device, for before/after comparisons."""
    out: dict[str, Any] = {}
    for name, state in cluster.nodes.items():
        out[name] = (
            state.free_whole(),
            state.free_gpu_milli(),
            sorted((k, v) for k, v in state.used.items() if v),
            [
                (
                    d.whole_by,
                    d.milli_used,
                    d.memory_used,
                    d.slots_used,
                    sorted((str(s.instance), s.used_by or "") for s in d.mig),
                )
                for d in state.devices
            ],
        )
    return out


def pods_per_node(placement: GangPlacement) -> dict[str, int]:
    return dict(Counter(p.node for places in placement.pods.values() for p in places))


# --- PlacementState.place: where a gang lands, or why not ----------------------------------------------


@dataclass
class PlaceCase:
    name: str
    nodes: list[Manifest]
    gang: WorkloadManifest
    before: list[WorkloadManifest] = field(default_factory=list)
    flavor: Manifest | None = None
    want_pods: dict[str, int] | None = None
    want_reason: str | None = None
    want_message: str = ""


def racks() -> list[Manifest]:
    """Rack r1 holds three 8-GPU nodes, rack r2 two; n6 is in no rack."""
    return [
        *(gpu_node(n, labels={RACK: "r1"}) for n in ("n1", "n2", "n3")),
        *(gpu_node(n, labels={RACK: "r2"}) for n in ("n4", "n5")),
        gpu_node("n6"),
    ]


def pinned(name: str, host: str, gpus: int) -> WorkloadManifest:
    """A one-pod workload pinned to ``host``, placed before the gang."""
    return workload(name).podset(spec=pod_spec().container(gpu=gpus).node_selector(HOST, host))


PLACE_CASES = [
    PlaceCase(
        name="whole-gpus-packed-onto-one-node",
        nodes=[gpu_node("a"), gpu_node("b"), gpu_node("c")],
        gang=workload("gang").podset(count=4, gpu=2),
        want_pods={"a": 4},
    ),
    PlaceCase(
        name="tightest-node-first",
        nodes=[gpu_node("a", 8), gpu_node("b", 4)],
        gang=workload("gang").podset(count=1, gpu=4),
        want_pods={"b": 1},
    ),
    PlaceCase(
        name="fewest-nodes-for-a-gang-larger-than-a-node",
        nodes=[gpu_node("a", 8), gpu_node("b", 8), gpu_node("c", 4)],
        gang=workload("gang").podset(count=3, gpu=4),
        want_pods={"a": 2, "c": 1},
    ),
    PlaceCase(
        name="partly-used-node-is-filled-first",
        nodes=[gpu_node("a"), gpu_node("b")],
        before=[pinned("before", "b", 4)],
        gang=workload("gang").podset(count=1, gpu=4),
        want_pods={"b": 1},
    ),
    PlaceCase(
        name="many-nodes-take-the-tightest-too",
        nodes=[*(gpu_node(f"n{i:02}") for i in range(70)), gpu_node("z", 4)],
        gang=workload("gang").podset(count=1, gpu=4),
        want_pods={"z": 1},
    ),
    PlaceCase(
        name="two-pod-sets-share-the-node",
        nodes=[gpu_node("a"), gpu_node("b")],
        gang=workload("gang").podset("driver", count=1, gpu=2).podset("workers", count=3, gpu=2),
        want_pods={"a": 4},
    ),
    PlaceCase(
        name="cpu-pods-keep-off-gpu-nodes",
        nodes=[gpu_node("a"), node("cpu").allocatable(cpu="64", memory="256Gi")],
        gang=workload("gang").podset(count=2, cpu="4"),
        want_pods={"cpu": 2},
    ),
    # All or nothing.
    PlaceCase(
        name="gang-fits-partly-is-fragmented",
        nodes=[gpu_node("a", 8), gpu_node("b", 5)],
        gang=workload("gang").podset(count=2, gpu=6),
        want_reason=Reason.FRAGMENTED,
        want_message="no placement holds all 2 pods",
    ),
    PlaceCase(
        name="gang-fits-partly-waits-for-capacity",
        nodes=[gpu_node("a"), gpu_node("b")],
        before=[pinned("before", "a", 6)],
        gang=workload("gang").podset(count=3, gpu=4),
        want_reason=Reason.WAITING_FOR_GANG_CAPACITY,
        want_message="12 GPUs needed, 10 free",
    ),
    PlaceCase(
        name="gang-larger-than-the-cluster",
        nodes=[gpu_node("a"), gpu_node("b")],
        gang=workload("gang").podset(count=5, gpu=4),
        want_reason=Reason.EXCEEDS_CLUSTER,
        want_message="needs 20 GPUs; eligible nodes have 16",
    ),
    PlaceCase(
        name="second-pod-set-does-not-fit",
        nodes=[gpu_node("a")],
        gang=workload("gang").podset("driver", count=1, gpu=4).podset("workers", count=2, gpu=4),
        want_reason=Reason.EXCEEDS_CLUSTER,
    ),
    # Topology.
    PlaceCase(
        name="required-rack-smallest-that-holds-the-gang",
        nodes=racks(),
        gang=workload("gang").podset(count=2, spec=eight_gpus()).topology(required=RACK),
        want_pods={"n4": 1, "n5": 1},
    ),
    PlaceCase(
        name="required-rack-larger-gang-takes-the-larger-rack",
        nodes=racks(),
        gang=workload("gang").podset(count=3, spec=eight_gpus()).topology(required=RACK),
        want_pods={"n1": 1, "n2": 1, "n3": 1},
    ),
    PlaceCase(
        name="required-rack-skips-a-domain-with-free-gpus-but-no-room",
        nodes=racks(),
        before=[pinned("p4", "n4", 4), pinned("p5", "n5", 4)],
        gang=workload("gang").podset(count=1, spec=eight_gpus()).topology(required=RACK),
        want_pods={"n1": 1},
    ),
    PlaceCase(
        name="required-rack-no-domain-holds-the-gang",
        nodes=racks(),
        gang=workload("gang").podset(count=4, spec=eight_gpus()).topology(required=RACK),
        want_reason=Reason.FRAGMENTED,
        want_message=f"no {RACK} domain holds the whole gang",
    ),
    PlaceCase(
        name="required-level-no-node-has",
        nodes=[gpu_node("a"), gpu_node("b")],
        gang=workload("gang").podset(count=1, gpu=1).topology(required="example.com/block"),
        want_reason=Reason.FRAGMENTED,
        want_message="domain holds the whole gang",
    ),
    PlaceCase(
        name="preferred-rack-when-one-holds-the-gang",
        nodes=racks(),
        gang=workload("gang").podset(count=2, spec=eight_gpus()).topology(preferred=RACK),
        want_pods={"n4": 1, "n5": 1},
    ),
    PlaceCase(
        name="preferred-rack-falls-back-across-racks",
        nodes=racks(),
        gang=workload("gang").podset(count=4, spec=eight_gpus()).topology(preferred=RACK),
        want_pods={"n1": 1, "n2": 1, "n3": 1, "n4": 1},
    ),
    # Nothing can ever hold it.
    PlaceCase(
        name="no-node-advertises-gpus",
        nodes=[node("cpu").allocatable(cpu="64")],
        gang=workload("gang").podset(count=1, gpu=1),
        want_reason=Reason.NO_NODE_ADVERTISES,
    ),
    PlaceCase(
        name="no-node-advertises-the-extended-resource",
        nodes=[gpu_node("a")],
        gang=workload("gang").podset(count=1, **{"example.com/fpga": 1}),
        want_reason=Reason.NO_NODE_ADVERTISES,
        want_message="example.com/fpga",
    ),
    PlaceCase(
        name="cordoned-node-advertises-nothing",
        nodes=[gpu_node("a").set("spec.unschedulable", True)],
        gang=workload("gang").podset(count=1, gpu=1),
        want_reason=Reason.NO_NODE_ADVERTISES,
    ),
    PlaceCase(
        name="no-node-matches-the-selector",
        nodes=[gpu_node("a", labels={"family": "hopper"})],
        gang=workload("gang").podset(spec=pod_spec().container(gpu=1).node_selector("family", "ampere")),
        want_reason=Reason.NO_NODE_MATCHES_SELECTOR,
    ),
    PlaceCase(
        name="no-node-has-the-flavor-labels",
        nodes=[gpu_node("a", labels={"pool": "a"})],
        flavor=resource_flavor("f").set("spec.nodeLabels", {"pool": "b"}),
        gang=workload("gang").podset(count=1, gpu=1),
        want_reason=Reason.NO_NODE_MATCHES_SELECTOR,
    ),
    PlaceCase(
        name="untolerated-taint",
        nodes=[gpu_node("a").taint("nvidia.com/gpu", "present", "NoSchedule")],
        gang=workload("gang").podset(count=1, gpu=1),
        want_reason=Reason.UNTOLERATED_TAINT,
        want_message="nvidia.com/gpu=present:NoSchedule",
    ),
]


@pytest.mark.parametrize("case", PLACE_CASES, ids=lambda c: c.name)
def test_place(case: PlaceCase) -> None:
    flavors = [case.flavor] if case.flavor else []
    state = loaded(*case.nodes, *flavors, *case.before, case.gang)
    cluster = PlacementState(state.nodes, DeviceConfig())
    for wl in case.before:
        name = wl.body["metadata"]["name"]
        assert isinstance(cluster.place(f"default/{name}", gang_for(state, name)), GangPlacement)
    before = snapshot(cluster)
    flavor = case.flavor.body["metadata"]["name"] if case.flavor else None
    result = cluster.place("default/gang", gang_for(state, "gang", flavor=flavor))
    if case.want_reason is not None:
        assert isinstance(result, PlacementFailure), result
        assert result.reason == case.want_reason, result.message
        assert case.want_message in result.message
        assert snapshot(cluster) == before  # nothing of the gang stays placed
        return
    assert isinstance(result, GangPlacement), result
    assert pods_per_node(result) == case.want_pods
    cluster.release("default/gang")
    assert snapshot(cluster) == before


# --- node selector, required affinity and taints ---------------------------------------------------------


@dataclass
class FilterCase:
    name: str
    spec: PodSpec
    want_nodes: set[str]
    flavor: Manifest | None = None


def labelled_nodes() -> list[Manifest]:
    return [
        gpu_node("a", labels={"family": "hopper", "tier": "3"}),
        gpu_node("b", labels={"family": "ampere", "tier": "1"}),
        gpu_node("c", labels={"zone": "z1", "tier": "high"}),
    ]


def tainted_nodes() -> list[Manifest]:
    return [
        gpu_node("reserved").taint("dedicated", "training", "NoSchedule"),
        gpu_node("spot").taint("spot", None, "NoExecute"),
        gpu_node("soft").taint("busy", "yes", "PreferNoSchedule"),
    ]


SELECTOR_CASES = [
    FilterCase("no-constraint", eight_gpus(), {"a", "b", "c"}),
    FilterCase("node-selector", eight_gpus().node_selector("family", "ampere"), {"b"}),
    FilterCase("in", eight_gpus().affinity_term(expression("family", "In", "ampere")), {"b"}),
    FilterCase(
        "in-two-values",
        eight_gpus().affinity_term(expression("family", "In", "hopper", "ampere")),
        {"a", "b"},
    ),
    FilterCase(
        "not-in-matches-absent-key",
        eight_gpus().affinity_term(expression("family", "NotIn", "hopper")),
        {"b", "c"},
    ),
    FilterCase("exists", eight_gpus().affinity_term(expression("zone", "Exists")), {"c"}),
    FilterCase("does-not-exist", eight_gpus().affinity_term(expression("family", "DoesNotExist")), {"c"}),
    FilterCase("gt", eight_gpus().affinity_term(expression("tier", "Gt", "2")), {"a"}),
    FilterCase("lt", eight_gpus().affinity_term(expression("tier", "Lt", "2")), {"b"}),
    FilterCase(
        "gt-skips-non-integer-labels", eight_gpus().affinity_term(expression("tier", "Gt", "0")), {"a", "b"}
    ),
    FilterCase(
        "expressions-of-a-term-are-anded",
        eight_gpus().affinity_term(expression("family", "Exists"), expression("tier", "Lt", "2")),
        {"b"},
    ),
    FilterCase(
        "terms-are-ored",
        eight_gpus()
        .affinity_term(expression("family", "In", "hopper"))
        .affinity_term(expression("zone", "Exists")),
        {"a", "c"},
    ),
    FilterCase(
        "selector-and-affinity-both-apply",
        eight_gpus().node_selector("tier", "3").affinity_term(expression("family", "Exists")),
        {"a"},
    ),
    FilterCase(
        "flavor-node-labels",
        eight_gpus(),
        {"a"},
        flavor=resource_flavor("hopper").set("spec.nodeLabels", {"family": "hopper"}),
    ),
]

TAINT_CASES = [
    FilterCase("prefer-no-schedule-is-not-a-filter", eight_gpus(), {"soft"}),
    FilterCase(
        "equal-toleration",
        eight_gpus().toleration(key="dedicated", operator="Equal", value="training"),
        {"reserved", "soft"},
    ),
    FilterCase(
        "wrong-value-does-not-tolerate",
        eight_gpus().toleration(key="dedicated", operator="Equal", value="serving"),
        {"soft"},
    ),
    FilterCase(
        "exists-toleration-for-a-key",
        eight_gpus().toleration(key="spot", operator="Exists"),
        {"spot", "soft"},
    ),
    FilterCase(
        "wrong-effect-does-not-tolerate",
        eight_gpus().toleration(key="spot", operator="Exists", effect="NoSchedule"),
        {"soft"},
    ),
    FilterCase(
        "empty-key-exists-tolerates-everything",
        eight_gpus().toleration(operator="Exists"),
        {"reserved", "spot", "soft"},
    ),
    FilterCase(
        "flavor-tolerations-count",
        eight_gpus(),
        {"reserved", "soft"},
        flavor=resource_flavor("training").set(
            "spec.tolerations",
            [{"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}],
        ),
    ),
    FilterCase(
        "pod-and-flavor-tolerations-add-up",
        eight_gpus().toleration(key="spot", operator="Exists"),
        {"reserved", "spot", "soft"},
        flavor=resource_flavor("training").set(
            "spec.tolerations", [{"key": "dedicated", "operator": "Exists"}]
        ),
    ),
]


def check_filter(nodes: list[Manifest], case: FilterCase) -> None:
    flavors = [case.flavor] if case.flavor else []
    gang = workload("gang").podset(count=len(case.want_nodes), spec=case.spec)
    state = loaded(*nodes, *flavors, gang)
    cluster = PlacementState(state.nodes, DeviceConfig())
    flavor = case.flavor.body["metadata"]["name"] if case.flavor else None
    pod_sets = gang_for(state, "gang", flavor=flavor)
    assert cluster.eligible_names(pod_sets[0]) == case.want_nodes
    # One 8-GPU pod per eligible node: the gang fills exactly the nodes that pass the filters.
    result = cluster.place("default/gang", pod_sets)
    assert isinstance(result, GangPlacement), result
    assert pods_per_node(result) == dict.fromkeys(case.want_nodes, 1)


@pytest.mark.parametrize("case", SELECTOR_CASES, ids=lambda c: c.name)
def test_node_selector_and_affinity_filter_nodes(case: FilterCase) -> None:
    check_filter(labelled_nodes(), case)


@pytest.mark.parametrize("case", TAINT_CASES, ids=lambda c: c.name)
def test_taints_filter_nodes(case: FilterCase) -> None:
    check_filter(tainted_nodes(), case)


# --- MIG ------------------------------------------------------------------------------------------------


def test_mig_static_layout_hands_out_instances_then_waits() -> None:
    state = loaded(
        mig_node("m", "0=4g.40gb@0,3g.40gb@4", {MIG_3G: 1, MIG_4G: 1}),
        workload("three").podset(**{MIG_3G: 1}),
        workload("four").podset(**{MIG_4G: 1}),
    )
    cluster = PlacementState(state.nodes, DeviceConfig())
    for name, want in (("three", "0:3g.40gb@4"), ("four", "0:4g.40gb@0")):
        placed = cluster.place(f"default/{name}", gang_for(state, name))
        assert isinstance(placed, GangPlacement), placed
        assert [g.describe() for g in placed.pods["main"][0].grants] == [want]
        assert placed.repartitions == 0
    before = snapshot(cluster)
    again = cluster.place("default/again", gang_for(state, "three"))
    assert isinstance(again, PlacementFailure)
    assert again.reason == Reason.WAITING_FOR_GANG_CAPACITY
    assert snapshot(cluster) == before
    cluster.release("default/three")
    assert isinstance(cluster.place("default/again", gang_for(state, "three")), GangPlacement)


def test_mig_repartition_gives_a_free_gpu_a_new_layout() -> None:
    config = DeviceConfig(mig_repartition=True)
    state = loaded(
        mig_node("m", "0=7g.80gb@0", {MIG_7G: 1}).label("nvidia.com/gpu.count", "2"),
        workload("whole").podset(**{MIG_7G: 1}),
        workload("gang").podset(count=2, **{MIG_3G: 1}),
    )
    cluster = PlacementState(state.nodes, config)
    assert isinstance(cluster.place("default/whole", gang_for(state, "whole", config)), GangPlacement)
    static = PlacementState(state.nodes, DeviceConfig())
    static.place("default/whole", gang_for(state, "whole"))
    assert isinstance(static.place("default/gang", gang_for(state, "gang")), PlacementFailure)
    result = cluster.place("default/gang", gang_for(state, "gang", config))
    assert isinstance(result, GangPlacement), result
    grants = [g for p in result.pods["main"] for g in p.grants]
    assert sorted(g.describe() for g in grants) == ["1:3g.40gb@0", "1:3g.40gb@4"]
    assert result.repartitions == 2
    assert all(g.repartition is not None and g.instance in g.repartition for g in grants)


def test_failed_gang_with_repartitioning_leaves_the_mig_layout_as_it_was() -> None:
    config = DeviceConfig(mig_repartition=True)
    state = loaded(
        mig_node("m", "0=" + ",".join(f"1g.10gb@{s}" for s in range(7)), {"nvidia.com/mig-1g.10gb": 7}).label(
            "nvidia.com/gpu.count", "1"
        ),
        workload("gang").podset(count=3, **{MIG_3G: 1}),
    )
    cluster = PlacementState(state.nodes, config)
    before = snapshot(cluster)
    result = cluster.place("default/gang", gang_for(state, "gang", config))
    assert isinstance(result, PlacementFailure)
    assert snapshot(cluster) == before


@pytest.mark.parametrize(
    ("nodes", "want_reason"),
    [
        pytest.param([gpu_node("a")], Reason.NO_NODE_ADVERTISES, id="no-mig-node-at-all"),
        pytest.param(
            [gpu_node("a"), mig_node("m", "0=3g.40gb@4", {MIG_3G: 1})],
            Reason.WAITING_FOR_GANG_CAPACITY,
            id="only-instance-in-use-beside-whole-gpu-node",
        ),
    ],
)
def test_mig_request_reason_ignores_nodes_without_mig(nodes: list[Manifest], want_reason: str) -> None:
    state = loaded(*nodes, workload("gang").podset(**{MIG_3G: 1}))
    cluster = PlacementState(state.nodes, DeviceConfig())
    if "m" in cluster.nodes:
        assert isinstance(cluster.place("default/first", gang_for(state, "gang")), GangPlacement)
    result = cluster.place("default/gang", gang_for(state, "gang"))
    assert isinstance(result, PlacementFailure)
    assert result.reason == want_reason, result.message


# --- time-slicing and MPS -------------------------------------------------------------------------------


def shared_node(name: str, resource: str, strategy: str, gpus: int = 8, replicas: int = 4) -> NodeManifest:
    return (
        node(name)
        .allocatable(cpu="64", **{resource: gpus * replicas})
        .label(HOST, name)
        .label(REPLICAS, str(replicas))
        .label(SHARING, strategy)
    )


@pytest.mark.parametrize("strategy", ["time-slicing", "mps"])
def test_eight_gpus_with_four_replicas_hold_32_pods(strategy: str) -> None:
    state = loaded(
        shared_node("ts", SHARED, strategy),
        workload("gang").podset(count=32, **{SHARED: 1}),
        workload("one-more").podset(count=1, **{SHARED: 1}),
    )
    cluster = PlacementState(state.nodes, DeviceConfig())
    assert [(d.sharing, d.replicas) for d in cluster.nodes["ts"].devices] == [(strategy, 4)] * 8
    result = cluster.place("default/gang", gang_for(state, "gang"))
    assert isinstance(result, GangPlacement), result
    per_device = Counter(g.device for p in result.pods["main"] for g in p.grants for _ in range(g.amount))
    assert per_device == dict.fromkeys(range(8), 4)
    extra = cluster.place("default/one-more", gang_for(state, "one-more"))
    assert isinstance(extra, PlacementFailure)
    assert extra.reason == Reason.WAITING_FOR_GANG_CAPACITY


def test_time_slicing_without_rename_serves_nvidia_com_gpu_requests() -> None:
    state = loaded(
        shared_node("ts", "nvidia.com/gpu", "time-slicing"),
        workload("gang").podset(count=32, gpu=1),
    )
    cluster = PlacementState(state.nodes, DeviceConfig())
    result = cluster.place("default/gang", gang_for(state, "gang"))
    assert isinstance(result, GangPlacement), result


# --- fractions ------------------------------------------------------------------------------------------


def fractional(
    name: str, count: int, fraction: str | None = None, memory: str | None = None
) -> WorkloadManifest:
    built = workload(name).podset(count=count, cpu="1")
    if fraction is not None:
        built.pod_annotation(FRACTION, fraction)
    if memory is not None:
        built.pod_annotation(GPU_MEMORY, memory)
    return built


@dataclass
class FractionCase:
    name: str
    gang: WorkloadManifest
    want_devices: list[str] | None
    before: list[WorkloadManifest] = field(default_factory=list)


FRACTION_CASES = [
    FractionCase("four-quarters-share-one-gpu", fractional("gang", 4, "0.25"), ["0:250m"] * 4),
    FractionCase("milli-quantity", fractional("gang", 2, "500m"), ["0:500m"] * 2),
    FractionCase(
        "kai-annotation",
        workload("gang").podset(count=1, cpu="1").pod_annotation("gpu-fraction", "0.5"),
        ["0:500m"],
    ),
    FractionCase("memory-and-fraction", fractional("gang", 1, "0.5", "40Gi"), ["0:500m/40960Mi"]),
    FractionCase("memory-only-takes-a-share", fractional("gang", 2, memory="40Gi"), ["0:1m/40960Mi"] * 2),
    FractionCase("memory-beyond-the-gpu", fractional("gang", 1, memory="81Gi"), None),
    FractionCase(
        "fractions-beyond-one-gpu-use-the-next", fractional("gang", 3, "0.5"), ["0:500m", "0:500m", "1:500m"]
    ),
    FractionCase(
        "best-fit-the-most-used-gpu",
        fractional("gang", 1, "0.25"),
        ["1:250m"],
        before=[fractional("first", 1, "0.5"), fractional("second", 1, "0.75")],
    ),
    FractionCase(
        "whole-gpu-skips-a-partly-used-gpu",
        workload("gang").podset(count=1, gpu=1),
        ["1"],
        before=[fractional("first", 1, "0.1")],
    ),
    FractionCase(
        "whole-gpu-waits-when-every-gpu-is-partly-used",
        workload("gang").podset(count=1, gpu=1),
        None,
        before=[fractional("first", 2, "0.75")],
    ),
    FractionCase(
        "fraction-never-shares-a-whole-gpu",
        fractional("gang", 1, "0.1"),
        None,
        before=[workload("first").podset(count=2, gpu=1)],
    ),
]


@pytest.mark.parametrize("case", FRACTION_CASES, ids=lambda c: c.name)
def test_fractions(case: FractionCase) -> None:
    two_gpus = gpu_node("f", 2).label(MEMORY, "81920")
    state = loaded(two_gpus, *case.before, case.gang)
    cluster = PlacementState(state.nodes, DeviceConfig())
    for wl in case.before:
        name = wl.body["metadata"]["name"]
        assert isinstance(cluster.place(f"default/{name}", gang_for(state, name)), GangPlacement)
    result = cluster.place("default/gang", gang_for(state, "gang"))
    if case.want_devices is None:
        assert isinstance(result, PlacementFailure), result
        return
    assert isinstance(result, GangPlacement), result
    assert [g.describe() for p in result.pods["main"] for g in p.grants] == case.want_devices


def test_tiny_fraction_still_needs_a_gpu() -> None:
    state = loaded(
        gpu_node("gpu", 1),
        node("cpu").allocatable(cpu="64"),
        fractional("gang", 1, "0.0004"),
    )
    result = PlacementState(state.nodes, DeviceConfig()).place("default/gang", gang_for(state, "gang"))
    assert isinstance(result, GangPlacement), result
    assert pods_per_node(result) == {"gpu": 1}


# --- properties -----------------------------------------------------------------------------------------

CONFIG = DeviceConfig()


@dataclass(frozen=True)
class PodAsk:
    """One pod shape: ``whole`` GPUs, or a fraction (milli) and/or memory (GiB) of one GPU."""

    whole: int = 0
    milli: int = 0
    memory_gib: int = 0
    kai: bool = False
    with_gpu_request: bool = False

    def template(self) -> PodTemplate:
        requests = {"cpu": 100}
        annotations = {}
        if self.whole:
            requests["nvidia.com/gpu"] = self.whole
        if self.with_gpu_request:
            requests["nvidia.com/gpu"] = 1  # a fractional pod may also ask for the resource
        if self.milli:
            annotations["gpu-fraction" if self.kai else FRACTION] = f"{self.milli}m"
        if self.memory_gib:
            annotations[GPU_MEMORY] = f"{self.memory_gib}Gi"
        return PodTemplate(requests=requests, annotations=annotations)


asks = st.one_of(
    st.builds(PodAsk, whole=st.integers(1, 3)),
    st.builds(
        PodAsk,
        milli=st.integers(1, 1000),
        memory_gib=st.sampled_from([0, 0, 1, 10, 20, 40, 80]),
        kai=st.booleans(),
        with_gpu_request=st.booleans(),
    ),
    st.builds(PodAsk, memory_gib=st.integers(1, 90)),
)


@st.composite
def gpu_clusters(draw: st.DrawFn) -> list[Node]:
    count = draw(st.integers(1, 3))
    nodes = []
    for i in range(count):
        memory = draw(st.sampled_from([None, "16384", "81920"]))
        nodes.append(
            Node(
                name=f"n{i}",
                allocatable={"cpu": 64_000, "nvidia.com/gpu": draw(st.integers(1, 4))},
                labels={MEMORY: memory} if memory else {},
            )
        )
    return nodes


fraction_ops = st.lists(
    st.one_of(
        st.tuples(st.just("place"), asks, st.integers(1, 3)),
        st.tuples(st.just("release"), st.integers(0, 20), st.just(0)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(nodes=gpu_clusters(), ops=fraction_ops)
def test_fractions_never_overcommit_a_gpu(nodes: list[Node], ops: list[tuple[str, Any, int]]) -> None:
    cluster = PlacementState(nodes, CONFIG)
    memory = {(s.name, d.index): d.memory_mib for s in cluster.nodes.values() for d in s.devices}
    # The test's own ledger of what every live owner holds, per (node, device).
    ledger: dict[str, list[tuple[str, DeviceGrant]]] = {}
    for step, (op, arg, count) in enumerate(ops):
        if op == "place":
            ask: PodAsk = arg
            template = ask.template()
            owner = f"w{step}"
            held_before = {key for grants in ledger.values() for key in ((n, g.device) for n, g in grants)}
            result = cluster.place(owner, [GangPodSet("main", count, pod_needs(template, CONFIG), template)])
            if isinstance(result, PlacementFailure):
                continue
            grants = [(p.node, g) for p in result.pods["main"] for g in p.grants]
            ledger[owner] = grants
            for node_name, g in grants:
                if ask.whole:
                    assert g.kind == "whole"
                    assert (node_name, g.device) not in held_before  # never a partly used GPU
                else:
                    assert g.kind == "fraction"
                    assert (g.amount, g.memory_mib) == (max(ask.milli, 1), ask.memory_gib * 1024)
        elif ledger:
            owner = sorted(ledger)[arg % len(ledger)]
            cluster.release(owner)
            del ledger[owner]
        milli: Counter[tuple[str, int]] = Counter()
        mem: Counter[tuple[str, int]] = Counter()
        whole: Counter[tuple[str, int]] = Counter()
        for grants in ledger.values():
            for node_name, g in grants:
                key = (node_name, g.device)
                if g.kind == "whole":
                    whole[key] += 1
                else:
                    milli[key] += g.amount
                    mem[key] += g.memory_mib
        for key, capacity in memory.items():
            assert whole[key] <= 1
            assert not (whole[key] and milli[key])
            assert milli[key] <= 1000
            assert not capacity or mem[key] <= capacity
            device = cluster.nodes[key[0]].devices[key[1]]
            assert (device.milli_used, device.memory_used) == (milli[key], mem[key])


# Gangs of mixed pod sets on a mixed cluster: placed whole or not at all.

LAYOUTS = [
    "3g.40gb@0,3g.40gb@4",
    "4g.40gb@0,2g.20gb@4,1g.10gb@6",
    "7g.80gb@0",
    ",".join(f"1g.10gb@{s}" for s in range(7)),
]
MIG_ASKS = [
    "nvidia.com/mig-3g.40gb",
    "nvidia.com/mig-2g.20gb",
    "nvidia.com/mig-1g.10gb",
    "nvidia.com/mig-7g.80gb",
]


@st.composite
def mixed_nodes(draw: st.DrawFn) -> list[Node]:
    nodes = []
    for i in range(draw(st.integers(1, 4))):
        labels = {RACK: draw(st.sampled_from(["r1", "r2"]))}
        kind = draw(st.sampled_from(["whole", "whole", "mig", "shared"]))
        allocatable: dict[str, int] = {"cpu": 64_000}
        annotations = {}
        if kind == "whole":
            allocatable["nvidia.com/gpu"] = draw(st.integers(1, 8))
            labels[MEMORY] = "81920"
        elif kind == "mig":
            layouts = draw(st.lists(st.sampled_from(LAYOUTS), min_size=1, max_size=2))
            annotations[LAYOUT] = ";".join(f"{g}={text}" for g, text in enumerate(layouts))
            counts = Counter(part.partition("@")[0] for text in layouts for part in text.split(","))
            allocatable.update({f"nvidia.com/mig-{p}": n for p, n in counts.items()})
            labels[MEMORY] = "81920"
        else:
            allocatable[SHARED] = draw(st.integers(1, 2)) * 4
            labels.update({REPLICAS: "4", SHARING: draw(st.sampled_from(["time-slicing", "mps"]))})
        nodes.append(Node(f"n{i}", allocatable, labels, annotations=annotations))
    return nodes


pod_templates = st.one_of(
    st.builds(lambda n: {"nvidia.com/gpu": n}, st.integers(1, 4)),
    st.builds(lambda p: {p: 1}, st.sampled_from(MIG_ASKS)),
    st.builds(lambda n: {SHARED: n}, st.integers(1, 2)),
    st.just({}),
).map(lambda requests: PodTemplate(requests={"cpu": 500, **requests}))
fraction_templates = st.builds(
    lambda milli: PodTemplate(requests={"cpu": 500}, annotations={FRACTION: f"{milli}m"}),
    st.integers(1, 1000),
)


@st.composite
def gangs(draw: st.DrawFn) -> list[GangPodSet]:
    level = draw(st.sampled_from([None, "required", "preferred"]))
    pod_sets = []
    for i in range(draw(st.integers(1, 3))):
        template = draw(st.one_of(pod_templates, fraction_templates))
        pod_sets.append(
            GangPodSet(
                name=f"ps{i}",
                count=draw(st.integers(1, 6)),
                needs=pod_needs(template, CONFIG),
                template=template,
                required_level=RACK if level == "required" else None,
                preferred_level=RACK if level == "preferred" else None,
            )
        )
    return pod_sets


@settings(max_examples=200, deadline=None)
@given(nodes=mixed_nodes(), earlier=st.lists(gangs(), max_size=3), gang=gangs())
def test_a_gang_is_placed_whole_or_not_at_all(
    nodes: list[Node], earlier: list[list[GangPodSet]], gang: list[GangPodSet]
) -> None:
    cluster = PlacementState(nodes, CONFIG)
    for i, pod_sets in enumerate(earlier):
        cluster.place(f"earlier-{i}", pod_sets)
    before = snapshot(cluster)
    result = cluster.place("gang", gang)
    if isinstance(result, PlacementFailure):
        assert snapshot(cluster) == before
        return
    assert {ps.name: len(result.pods[ps.name]) for ps in gang} == {ps.name: ps.count for ps in gang}
    if any(ps.required_level for ps in gang):
        assert (
            len({cluster.nodes[p.node].labels[RACK] for places in result.pods.values() for p in places}) == 1
        )
    cluster.release("gang")
    assert snapshot(cluster) == before
    cluster.release("gang")  # releasing twice changes nothing
    assert snapshot(cluster) == before


whole_gpu_gangs = st.builds(
    lambda gpus, count: [
        GangPodSet(
            name="main",
            count=count,
            needs=pod_needs(PodTemplate(requests={"cpu": 500, "nvidia.com/gpu": gpus}), CONFIG),
            template=PodTemplate(requests={"cpu": 500, "nvidia.com/gpu": gpus}),
        )
    ],
    st.integers(1, 8),
    st.integers(1, 6),
)


@settings(max_examples=200, deadline=None)
@given(nodes=mixed_nodes(), earlier=st.lists(gangs(), max_size=4), gang=whole_gpu_gangs)
def test_a_gang_too_big_for_the_free_whole_gpus_fails_as_the_search_would(
    nodes: list[Node], earlier: list[list[GangPodSet]], gang: list[GangPodSet]
) -> None:
    """A gang of whole-GPU pods that the free whole GPUs cannot hold is refused without the search:
    the same outcome as the search, the same failure, and the cluster as it was."""
    outcomes = []
    for skip in (True, False):
        cluster = PlacementState(nodes, CONFIG)
        if not skip:
            cluster._too_few_free = lambda _pod_sets: False  # type: ignore[method-assign]
        for i, pod_sets in enumerate(earlier):
            cluster.place(f"earlier-{i}", pod_sets)
        result = cluster.place("gang", gang)
        placed = None if isinstance(result, PlacementFailure) else pods_per_node(result)
        outcomes.append((result if placed is None else placed, snapshot(cluster)))
    assert outcomes[0] == outcomes[1]


def test_the_free_whole_gpu_count_refuses_a_gang_without_searching() -> None:
    nodes = [Node(f"n{i}", {"cpu": 64_000, "nvidia.com/gpu": 8}, {RACK: "r0"}) for i in range(3)]
    cluster = PlacementState(nodes, CONFIG)
    template = PodTemplate(requests={"cpu": 500, "nvidia.com/gpu": 8})
    needs = pod_needs(template, CONFIG)
    assert not isinstance(cluster.place("first", [GangPodSet("main", 1, needs, template)]), PlacementFailure)
    gang = [GangPodSet("main", 3, needs, template)]
    assert cluster._too_few_free(gang)  # two whole nodes free, three pods of eight GPUs
    result = cluster.place("gang", gang)
    assert isinstance(result, PlacementFailure)
    assert (result.reason, result.message) == (
        Reason.WAITING_FOR_GANG_CAPACITY,
        "waiting for capacity for all 3 pods: 24 GPUs needed, 16 free",
    )
    assert not cluster._too_few_free([GangPodSet("main", 2, needs, template)])


# --- end to end: gpuplane schedule ------------------------------------------------------------------------


def queue_objects(**nominal: object) -> list[Manifest]:
    return [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("q").flavor("default", cpu="1000", **nominal),
        local_queue("q", "default", "q"),
    ]


def queued(name: str, second: int) -> WorkloadManifest:
    return workload(name).queue("q").created(f"2026-01-01T00:00:{second:02}Z")


def decide(objects: Sequence[Manifest], config_devices: DeviceConfig | None = None) -> dict[str, Any]:
    state = load_state([("state.yaml", documents(*objects))])
    config = config_from_kueue(state.configuration)
    if config_devices is not None:
        config = dataclasses.replace(config, devices=config_devices)
    return plan_document(schedule(state, config, default_now(state), cycles=None), 0.0, 0.0)


def placements(doc: dict[str, Any]) -> dict[str, list[tuple[str, list[str]]]]:
    return {
        a["workload"].removeprefix("default/"): [
            (p["node"], p["devices"]) for ps in a["podSets"] for p in ps.get("placement", [])
        ]
        for a in doc["admitted"]
    }


def pending_reasons(doc: dict[str, Any]) -> dict[str, str]:
    return {p["workload"].removeprefix("default/"): p["reason"] for p in doc["pending"]}


@dataclass
class EndToEndCase:
    name: str
    objects: list[Manifest]
    want_placements: dict[str, list[tuple[str, list[str]]]]
    want_pending: dict[str, str] = field(default_factory=dict)
    devices: DeviceConfig | None = None


ALL = [str(i) for i in range(8)]

END_TO_END_CASES = [
    EndToEndCase(
        name="whole-gpus-on-the-fewest-nodes",
        objects=[
            *queue_objects(gpu=64),
            gpu_node("a"),
            gpu_node("b"),
            queued("w", 0).podset(count=2, gpu=4),
        ],
        want_placements={"w": [("a", ALL[:4]), ("a", ALL[4:])]},
    ),
    EndToEndCase(
        name="quota-fits-gang-does-not",
        objects=[
            *queue_objects(gpu=64),
            gpu_node("a"),
            gpu_node("b"),
            queued("first", 0).podset(count=1, spec=pod_spec().container(gpu=6).node_selector(HOST, "a")),
            queued("gang", 1).podset(count=3, gpu=4),
            queued("fragmented", 2).podset(count=2, gpu=5),
        ],
        want_placements={"first": [("a", ALL[:6])]},
        want_pending={"gang": Reason.WAITING_FOR_GANG_CAPACITY, "fragmented": Reason.FRAGMENTED},
    ),
    EndToEndCase(
        name="gang-larger-than-the-nodes",
        objects=[*queue_objects(gpu=64), gpu_node("a"), queued("big", 0).podset(count=3, gpu=4)],
        want_placements={},
        want_pending={"big": Reason.EXCEEDS_CLUSTER},
    ),
    EndToEndCase(
        name="required-rack",
        objects=[
            *queue_objects(gpu=64),
            *racks(),
            queued("gang", 0).podset(count=2, spec=eight_gpus()).topology(required=RACK),
        ],
        want_placements={"gang": [("n4", ALL), ("n5", ALL)]},
    ),
    EndToEndCase(
        name="untolerated-taint",
        objects=[
            *queue_objects(gpu=64),
            gpu_node("a").taint("dedicated", "x", "NoSchedule"),
            queued("w", 0).podset(count=1, gpu=1),
        ],
        want_placements={},
        want_pending={"w": Reason.UNTOLERATED_TAINT},
    ),
    EndToEndCase(
        name="mig-static-layout",
        objects=[
            *queue_objects(**{MIG_3G: 4, MIG_4G: 4}),
            mig_node("m", "0=4g.40gb@0,3g.40gb@4", {MIG_3G: 1, MIG_4G: 1}),
            queued("four", 0).podset(**{MIG_4G: 1}),
            queued("three", 1).podset(**{MIG_3G: 1}),
            queued("another-three", 2).podset(**{MIG_3G: 1}),
        ],
        want_placements={"three": [("m", ["0:3g.40gb@4"])], "four": [("m", ["0:4g.40gb@0"])]},
        want_pending={"another-three": Reason.WAITING_FOR_GANG_CAPACITY},
    ),
    EndToEndCase(
        name="mig-repartition-cuts-a-free-gpu",
        objects=[
            *queue_objects(**{MIG_3G: 4, MIG_7G: 4}),
            mig_node("m", "0=7g.80gb@0", {MIG_7G: 1}).label("nvidia.com/gpu.count", "2"),
            queued("whole", 0).podset(**{MIG_7G: 1}),
            queued("three", 1).podset(**{MIG_3G: 1}),
        ],
        want_placements={"whole": [("m", ["0:7g.80gb@0"])], "three": [("m", ["1:3g.40gb@4"])]},
        devices=DeviceConfig(mig_repartition=True),
    ),
    EndToEndCase(
        name="time-slicing-32-slots",
        objects=[
            *queue_objects(**{SHARED: 64}),
            shared_node("ts", SHARED, "time-slicing"),
            queued("slots", 0).podset(count=32, **{SHARED: 1}),
            queued("one-more", 1).podset(count=1, **{SHARED: 1}),
        ],
        want_placements={"slots": [("ts", [f"{d}:1x"]) for d in range(8) for _ in range(4)]},
        want_pending={"one-more": Reason.WAITING_FOR_GANG_CAPACITY},
    ),
    EndToEndCase(
        name="fractions-share-and-whole-gpu-waits",
        objects=[
            *queue_objects(gpu=8, gpu_fraction=8),
            gpu_node("f", 1).label(MEMORY, "81920"),
            fractional("quarters", 4, "0.25").queue("q").created("2026-01-01T00:00:00Z"),
            queued("whole", 1).podset(count=1, gpu=1),
            fractional("fifth", 1, "0.25").queue("q").created("2026-01-01T00:00:02Z"),
        ],
        want_placements={"quarters": [("f", ["0:250m"])] * 4},
        want_pending={"whole": Reason.WAITING_FOR_GANG_CAPACITY, "fifth": Reason.WAITING_FOR_GANG_CAPACITY},
    ),
    EndToEndCase(
        # Room on the GPU, none in quota: the shares are charged under gpuplane.dev/gpu-fraction.
        name="fractions-over-their-quota-wait",
        objects=[
            *queue_objects(gpu=8, gpu_fraction="500m"),
            gpu_node("f", 1).label(MEMORY, "81920"),
            fractional("half", 2, "0.25").queue("q").created("2026-01-01T00:00:00Z"),
            fractional("more", 1, "0.25").queue("q").created("2026-01-01T00:00:01Z"),
        ],
        want_placements={"half": [("f", ["0:250m"])] * 2},
        want_pending={"more": Reason.WAITING_FOR_QUOTA},
    ),
    EndToEndCase(
        name="fractions-need-a-queue-that-covers-them",
        objects=[
            *queue_objects(gpu=8),
            gpu_node("f", 1).label(MEMORY, "81920"),
            fractional("quarters", 4, "0.25").queue("q").created("2026-01-01T00:00:00Z"),
        ],
        want_placements={},
        want_pending={"quarters": Reason.NO_MATCHING_FLAVOR},
    ),
]


@pytest.mark.parametrize("case", END_TO_END_CASES, ids=lambda c: c.name)
def test_schedule_places_admitted_workloads(case: EndToEndCase) -> None:
    doc = decide(case.objects, case.devices)
    # Pods of one pod set are interchangeable: compare each workload's placements as a sorted list.
    got = {k: sorted(v) for k, v in placements(doc).items()}
    assert got == {k: sorted(v) for k, v in case.want_placements.items()}
    assert pending_reasons(doc) == case.want_pending


def gpuplane(path: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", "schedule", "-f", str(path), "--output", "json"],
        capture_output=True,
        timeout=120,
        check=False,
    )


def test_cli_prints_placements_and_placement_reasons(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(
        documents(
            *queue_objects(gpu=64, **{MIG_3G: 4}),
            gpu_node("a"),
            gpu_node("b", 4),
            mig_node("m", "0=3g.40gb@0,3g.40gb@4", {MIG_3G: 2}),
            queued("train", 0).podset(count=3, gpu=4),
            queued("infer", 1).podset(count=2, **{MIG_3G: 1}),
            queued("too-big", 2).podset(count=2, gpu=4),
        )
    )
    run = gpuplane(path)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert placements(doc) == {
        "train": [("b", ALL[:4]), ("a", ALL[:4]), ("a", ALL[4:])],
        "infer": [("m", ["0:3g.40gb@0"]), ("m", ["0:3g.40gb@4"])],
    }
    (waiting,) = doc["pending"]
    assert (waiting["workload"], waiting["reason"]) == ("default/too-big", Reason.WAITING_FOR_GANG_CAPACITY)
    assert "8 GPUs needed, 0 free" in waiting["message"]


def test_cli_refuses_an_invalid_mig_layout_annotation_as_bad_input(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(
        documents(
            *queue_objects(**{MIG_3G: 4}),
            mig_node("m", "0=3g.40gb@0,4g.40gb@4", {MIG_3G: 1, MIG_4G: 1}),
            queued("w", 0).podset(**{MIG_3G: 1}),
        )
    )
    run = gpuplane(path)
    assert run.returncode == 2, run.stderr
    assert run.stderr.decode().startswith("error:")
    assert "mig-layout" in run.stderr.decode()


def _learned(cluster: PlacementState) -> tuple[Any, ...]:
    """What placements taught the node scores: profile reads, owners seen, pods per shape."""
    scores = cluster._scores
    return (scores.profile_reads, sorted(scores._seen_owners), dict(scores._shapes))


@pytest.mark.parametrize("full", [True, False], ids=["surely-no-room", "searched"])
def test_a_replayed_failure_leaves_what_the_failed_search_left(full: bool) -> None:
    """A one-pod gang that finds no place takes nothing; what it leaves behind is the workload
    learned and the profile read. ``relearn`` (the scheduler's replay of a failure it already
    knows, on the same nodes) leaves the same, so later scores cannot tell the two apart."""
    nodes = [gpu_node("a", 8), gpu_node("b", 8)]
    # Either every GPU is held (the cheap bound ends the search) or half of each node's (a 5-GPU
    # pod is searched for and fits nowhere).
    held = 8 if full else 4
    before = [pinned("one", "a", held), pinned("two", "b", held)]
    state = loaded(*nodes, *before, workload("gang").podset(count=1, gpu=5))
    searched, replayed = (
        PlacementState(state.nodes, DeviceConfig()),
        PlacementState(state.nodes, DeviceConfig()),
    )
    for cluster in (searched, replayed):
        for name in ("one", "two"):
            assert isinstance(cluster.place(f"default/{name}", gang_for(state, name)), GangPlacement)
    gang = gang_for(state, "gang")
    reads = searched.profile_reads
    assert isinstance(searched.place("default/gang", gang), PlacementFailure)
    assert _learned(searched) != _learned(replayed)  # the search left something behind
    replayed.relearn("default/gang", gang, read_profile=searched.profile_reads != reads)
    assert _learned(searched) == _learned(replayed)
    assert snapshot(searched) == snapshot(replayed)
