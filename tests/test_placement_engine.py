"""The placement engine: Filter / Score / Reserve plugins chosen by a profile, and gang placement on it.

Engine cases run on a small :class:`GpuArrays`; gang cases run through
``core.placement.gang_placement.PlacementState`` with the default profile, and check that scoring one node per
look gives the order that scoring every sampled node gives, and that a recorded plan is held exactly
(or not at all when the world changed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gpuplane.core.placement import engine
from gpuplane.core.placement.devices import DeviceConfig, DeviceGrant
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.placement.gangs import GangPodSet
from gpuplane.core.placement.gpu_arrays import BoolArray, GpuArrays, GpuRequest, IntArray, NodeSpec
from gpuplane.core.placement.profiles import DEFAULT_PROFILE, PROFILES, get_profile
from gpuplane.core.plan import AdmissionDecision, PodPlacement, PodSetDecision, placement_annotation
from gpuplane.model.records import recorded_placement as read_plan
from manifests import Manifest, workload
from test_placement import fractional, gang_for, gpu_node, loaded, snapshot

ONE_GPU = GpuRequest(cpu=1000, memory=1024, gpus=1, gpu_milli=1000)


def small_cluster() -> GpuArrays:
    """Three 4-GPU nodes: ``empty``, ``half`` (2 GPUs used) and ``busy`` (3 used)."""
    cluster = GpuArrays(
        [NodeSpec(n, cpu=32_000, memory=256 * 1024, gpus=4) for n in ("empty", "half", "busy")]
    )
    cluster.place(1, GpuRequest(cpu=2000, memory=2048, gpus=2, gpu_milli=1000), (0, 1))
    cluster.place(2, GpuRequest(cpu=3000, memory=3072, gpus=3, gpu_milli=1000), (0, 1, 2))
    return cluster


RANK = np.arange(3, dtype=np.int64)


class OnlyNode:
    """A filter plugin that keeps one node."""

    name = "only-node"

    def __init__(self, node: int) -> None:
        self.node = node

    def filter(self, cluster: GpuArrays, request: GpuRequest, mask: BoolArray) -> BoolArray:
        del cluster, request
        keep = np.zeros_like(mask)
        keep[self.node] = True
        out: BoolArray = mask & keep
        return out


class Constant:
    """A score plugin that gives every node one score, or one node another."""

    name = "constant"

    def __init__(self, value: int, node: int | None = None, other: int = 0) -> None:
        self.value, self.node, self.other = value, node, other

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> engine.Scores:
        del cluster, request
        out = np.full(len(nodes), self.value, dtype=np.int64)
        if self.node is not None:
            out[nodes == self.node] = self.other
        return out


@dataclass(frozen=True)
class EngineCase:
    name: str
    profile: str
    want_node: str


ENGINE_CASES = [
    EngineCase("least-allocated takes the emptiest node", "least-allocated", "empty"),
    EngineCase("most-allocated packs onto the fullest node", "most-allocated", "busy"),
    EngineCase("bestfit packs too", "bestfit", "busy"),
]


@pytest.mark.parametrize("case", ENGINE_CASES, ids=lambda c: c.name)
def test_a_profile_chooses_the_node(case: EngineCase) -> None:
    cluster = small_cluster()
    placed = engine.schedule_one(get_profile(case.profile), cluster, ONE_GPU, RANK)
    assert placed is not None
    assert cluster.names[placed.node] == case.want_node
    assert len(placed.gpus) == 1
    assert cluster.gpu_free[placed.node, placed.gpus[0]] == 0, "the reserved GPU is taken"


def test_filters_narrow_and_weights_add_up() -> None:
    cluster = small_cluster()
    reserve = engine.LowestFreeGpus()
    only_half = engine.Profile(
        "f", scores=((engine.LeastAllocated(), 1),), reserve=reserve, filters=(OnlyNode(1),)
    )
    assert list(engine.feasible(only_half, cluster, ONE_GPU)) == [1]
    weighted = engine.Profile(
        "w", scores=((Constant(10), 1), (Constant(0, node=2, other=50), 3)), reserve=reserve
    )
    assert list(engine.score(weighted, cluster, ONE_GPU, np.arange(3, dtype=np.int64))) == [10, 10, 160]
    placed = engine.schedule_one(weighted, cluster, ONE_GPU, RANK)
    assert placed == engine.Placement(2, (3,)), "the weighted score wins; the lowest free GPU is reserved"


def test_ties_go_to_the_lowest_rank_and_nothing_changes_when_nothing_fits() -> None:
    cluster = small_cluster()
    flat = engine.Profile("flat", scores=((Constant(7), 1),), reserve=engine.LowestFreeGpus())
    placed = engine.schedule_one(flat, cluster, ONE_GPU, np.array([2, 0, 1], dtype=np.int64))
    assert placed is not None
    assert placed.node == 1
    before = cluster.gpu_free.copy()
    assert engine.schedule_one(flat, cluster, GpuRequest(gpus=5, gpu_milli=1000), RANK) is None
    assert (cluster.gpu_free == before).all()


def test_profiles_are_checked_and_named() -> None:
    with pytest.raises(ValueError, match="no score plugin"):
        engine.Profile("empty", scores=(), reserve=engine.LowestFreeGpus())
    with pytest.raises(ValueError, match="positive"):
        engine.Profile("zero", scores=((Constant(1), 0),), reserve=engine.LowestFreeGpus())
    with pytest.raises(KeyError, match="valid: "):
        get_profile("no-such-profile")
    assert DEFAULT_PROFILE == "gpuplane"
    assert {"fgd", "gpuplane", "least-allocated", "most-allocated"} <= set(PROFILES)


# --- gang placement on the engine ---------------------------------------------------------------------


FRACTIONS = (250, 500, 750)


def varied_cluster(nodes: int = 48) -> tuple[PlacementState, GangPodSet]:
    """``nodes`` 8-GPU nodes: node ``i`` runs a pod of ``i % 4`` whole GPUs (the lowest ones) and, when
    ``i`` is odd, a fraction of GPU 7; and the gang to place: one pod of half a GPU."""
    objects: list[Manifest] = [gpu_node(f"n{i:03d}") for i in range(nodes)]
    objects += [fractional(f"f{m}", 1, f"{m}m") for m in FRACTIONS]
    objects += [workload(f"k{k}").podset(count=1, gpu=k) for k in range(1, 4)]
    state = loaded(*objects, fractional("g", 1, "500m"))
    cluster = PlacementState(state.nodes, DeviceConfig())
    for i in range(nodes):
        node, whole, milli = f"n{i:03d}", i % 4, FRACTIONS[i % 3]
        if whole:
            grants = [DeviceGrant(j, "whole") for j in range(whole)]
            cluster.hold(f"default/p{i}", node, gang_for(state, f"k{whole}")[0].needs, grants)
        if i % 2:
            grant = DeviceGrant(7, "fraction", milli)
            cluster.hold(f"default/q{i}", node, gang_for(state, f"f{milli}")[0].needs, [grant])
    (ps,) = gang_for(state, "g")
    return cluster, ps


def test_nodes_that_look_alike_are_scored_once_and_rank_as_scoring_each_would() -> None:
    cluster, ps = varied_cluster()
    cluster.place("probe:default/g", [ps])  # the profile learns the pod's shape
    cluster.release("probe:default/g")
    request = cluster._scores.request(ps.needs)
    profile = cluster.profile()
    gpu_rows = cluster._holdings.rows
    assert request is not None
    assert profile is not None
    assert gpu_rows.array is not None
    sample = cluster.eligible(ps)
    looks = [gpu_rows.look(s) for s in sample]
    assert len(set(looks)) < len(sample), "the case has nodes that look alike"
    ranked = cluster._scores.ranked(profile, request, sample, looks, set())
    # Every node scored on its own, with the GPU array fully in step.
    rows = gpu_rows.rows_of(sample)
    scores = engine.score(profile, gpu_rows.array, request, rows)
    assert len(set(scores.tolist())) > 1, "the case has nodes that score differently"
    want = [sample[i] for i in np.lexsort((np.arange(len(sample)), -scores))]
    assert [s.name for s in ranked] == [s.name for s in want]


def test_a_recorded_plan_is_held_exactly_or_not_at_all() -> None:
    state = loaded(gpu_node("a", gpus=4), gpu_node("b", gpus=4), workload("w").podset(count=2, gpu=2))
    gang = gang_for(state, "w")
    decision = AdmissionDecision(
        "default/w",
        "cq",
        (PodSetDecision("main", 2, {}, (PodPlacement("a", ("2", "3")), PodPlacement("b", ("0", "1")))),),
    )
    plan = read_plan(placement_annotation(decision))
    assert plan == {"main": [("a", "2,3"), ("b", "0,1")]}

    cluster = PlacementState(state.nodes, DeviceConfig())
    assert cluster.hold_planned("default/w", gang, plan)
    held = sorted((n, ",".join(g.describe() for g in grants)) for n, _, grants in cluster.owners["default/w"])
    assert held == [("a", "2,3"), ("b", "0,1")]
    assert cluster.hold_planned("default/w", gang, plan), "held again: nothing more is taken"
    assert len(cluster.owners["default/w"]) == 2

    changed = PlacementState(state.nodes, DeviceConfig())
    other = loaded(gpu_node("a", gpus=4), workload("x").podset(count=1, gpu=1))
    changed.hold("default/x", "a", gang_for(other, "x")[0].needs, [DeviceGrant(3, "whole")])
    before = snapshot(changed)
    assert not changed.hold_planned("default/w", gang, plan), "GPU 3 of a is taken: the world changed"
    assert snapshot(changed) == before
    assert read_plan("not json") is None
    assert read_plan('{"main": [["a"]]}') is None


def test_a_recorded_plan_that_fails_part_way_gives_back_what_it_took() -> None:
    # Two pod sets: the first one's planned devices are free and taken; the second one's plan names a
    # node that is gone, or has one slot too few. Nothing stays held either way.
    state = loaded(
        gpu_node("a", gpus=4),
        workload("w").podset(name="lead", count=1, gpu=2).podset(name="workers", count=2, gpu=1),
    )
    gang = gang_for(state, "w")
    for broken in ([("a", "2"), ("gone", "0")], [("a", "2")]):
        cluster = PlacementState(state.nodes, DeviceConfig())
        before = snapshot(cluster)
        plan = {"lead": [("a", "0,1")], "workers": broken}
        assert not cluster.hold_planned("default/w", gang, plan)
        assert snapshot(cluster) == before, broken
        assert "default/w" not in cluster.owners
