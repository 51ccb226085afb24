"""Placement building blocks on tiny hand-made clusters: the GPU cluster state, typical pods,
fragmentation, gpuplane's waste measure, and every score rule of the FGD protocol."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from gpuplane.core.placement import engine
from gpuplane.core.placement.engine import Placement, Profile
from gpuplane.core.placement.fragmentation import (
    FragmentationMeasure,
    TypicalPod,
    WasteMeasure,
    cpu_pressure,
    gap_waste,
    node_fragment,
    typical_pods,
)
from gpuplane.core.placement.gpu_arrays import GpuArrays, GpuRequest, IntArray, NodeSpec
from gpuplane.core.placement.scoring import (
    POLICIES,
    GpuClusteringScore,
    PolicyContext,
    ScorePolicy,
    get_policy,
    pick_node,
)

# -- builders ---------------------------------------------------------------------------------------


def schedule_one(
    policy: ScorePolicy, cluster: GpuArrays, request: GpuRequest, rank: IntArray
) -> Placement | None:
    """Place one pod with ``policy`` alone: a profile of that one plugin."""
    return engine.schedule_one(Profile(policy.name, ((policy, 1),), policy), cluster, request, rank)


@dataclass
class NodeBuilder:
    """A node and the state it starts in: ``node("a").gpus(2, "T4").free(1000, 300).cpu_used(4000)``."""

    name: str
    cpu_milli: int = 32_000
    memory_mib: int = 131_072
    gpu_count: int = 0
    model: str = ""
    gpu_free: tuple[int, ...] = ()
    used_cpu: int = 0
    max_pods: int = 110
    hosted: list[GpuRequest] = field(default_factory=list)

    def cpu(self, milli: int) -> NodeBuilder:
        self.cpu_milli = milli
        return self

    def memory(self, mib: int) -> NodeBuilder:
        self.memory_mib = mib
        return self

    def gpus(self, count: int, model: str = "T4") -> NodeBuilder:
        self.gpu_count, self.model = count, model
        return self

    def free(self, *milli: int) -> NodeBuilder:
        """Free milli-GPU per GPU (the rest is taken by one fractional pod per GPU)."""
        self.gpu_free = milli
        return self

    def cpu_used(self, milli: int) -> NodeBuilder:
        self.used_cpu = milli
        return self

    def pods(self, limit: int) -> NodeBuilder:
        self.max_pods = limit
        return self

    def spec(self) -> NodeSpec:
        return NodeSpec(self.name, self.cpu_milli, self.memory_mib, self.gpu_count, self.model, self.max_pods)


def node(name: str) -> NodeBuilder:
    return NodeBuilder(name)


def cluster(*builders: NodeBuilder) -> GpuArrays:
    """A cluster whose nodes start in the builders' states (set up through ``place``)."""
    built = GpuArrays([b.spec() for b in builders])
    for index, b in enumerate(builders):
        if b.used_cpu:
            built.place(index, GpuRequest(cpu=b.used_cpu), ())
        for gpu, free in enumerate(b.gpu_free):
            if free < 1000:
                built.place(index, GpuRequest(gpus=1, gpu_milli=1000 - free), (gpu,))
    return built


def pod(
    cpu: int = 1000, gpus: int = 0, milli: int = 0, memory: int = 0, models: tuple[str, ...] = ()
) -> GpuRequest:
    return GpuRequest(cpu=cpu, memory=memory, gpus=gpus, gpu_milli=milli, models=models)


def typical(*shapes: tuple[int, int, int, float], models: tuple[str, ...] = ()) -> tuple[TypicalPod, ...]:
    """Typical pods from ``(cpu, gpu_milli, gpus, probability)``."""
    return tuple(TypicalPod(c, m, n, models if m else (), 1, p) for c, m, n, p in shapes)


def scores(
    policy_name: str, c: GpuArrays, request: GpuRequest, context: PolicyContext | None = None
) -> list[int]:
    policy = get_policy(policy_name, context)
    nodes = np.flatnonzero(c.feasible(request))
    return [int(s) for s in policy.score(c, request, nodes)]


# -- the cluster state ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builders", "request_", "want_feasible"),
    [
        pytest.param([node("a").cpu(4000)], pod(cpu=4000), [True], id="cpu exactly fits"),
        pytest.param([node("a").cpu(4000)], pod(cpu=4001), [False], id="cpu short by one milli"),
        pytest.param([node("a").memory(1024)], pod(memory=2048), [False], id="memory is enforced"),
        pytest.param([node("a").pods(0)], pod(), [False], id="pod limit"),
        pytest.param([node("a")], pod(gpus=1, milli=500), [False], id="no GPUs"),
        pytest.param(
            [node("a").gpus(2).free(400, 300), node("b").gpus(1).free(500)],
            pod(gpus=1, milli=450),
            [False, True],
            id="fraction needs one GPU with enough free",
        ),
        pytest.param(
            [node("a").gpus(4).free(1000, 1000, 999, 1000), node("b").gpus(2)],
            pod(gpus=3, milli=1000),
            [True, False],
            id="multi-GPU needs that many entirely free GPUs",
        ),
        pytest.param(
            [node("a").gpus(2, "T4"), node("b").gpus(2, "V100"), node("c").gpus(2, "P100")],
            pod(gpus=1, milli=1000, models=("V100", "P100")),
            [False, True, True],
            id="model constraint",
        ),
        pytest.param(
            [node("a").gpus(2).free(0, 0)],
            pod(cpu=100),
            [True],
            id="CPU-only pod ignores GPUs",
        ),
    ],
)
def test_feasibility(builders: list[NodeBuilder], request_: GpuRequest, want_feasible: list[bool]) -> None:
    c = cluster(*builders)
    assert c.feasible(request_).tolist() == want_feasible
    assert [c.fits(i, request_) for i in range(len(c))] == want_feasible


@pytest.mark.parametrize(
    ("free", "request_", "want_best", "want_lowest_free"),
    [
        pytest.param((1000, 300, 600, 300), pod(gpus=1, milli=250), (1,), (0,), id="tightest, first index"),
        pytest.param((1000, 300, 600, 1000), pod(gpus=1, milli=500), (2,), (0,), id="skips GPUs too small"),
        pytest.param(
            (999, 1000, 1000, 1000), pod(gpus=2, milli=1000), (1, 2), (1, 2), id="whole GPUs: lowest free"
        ),
    ],
)
def test_gpu_choice_inside_a_node(
    free: tuple[int, ...], request_: GpuRequest, want_best: tuple[int, ...], want_lowest_free: tuple[int, ...]
) -> None:
    c = cluster(node("a").gpus(len(free)).free(*free))
    assert c.best_gpus(0, request_) == want_best
    assert c.lowest_free_gpus(0, len(want_lowest_free)) == want_lowest_free


def test_place_and_release_are_inverse_and_bump_versions() -> None:
    c = cluster(node("a").gpus(2), node("b").gpus(2))
    before = (c.cpu_free.copy(), c.gpu_free.copy(), c.version.copy())
    request = pod(cpu=2000, memory=10, gpus=1, milli=300)
    c.place(0, request, (1,))
    assert c.gpu_free[0].tolist() == [1000, 700]
    assert c.gpu_used_milli == 300
    assert (c.full_gpus[0], c.max_gpu_free[0], c.gpu_free_total[0]) == (1, 1000, 1700)
    placed_version = int(c.version[0])
    assert placed_version != before[2][0]
    assert c.version[1] == before[2][1]
    c.release(0, request, (1,))
    assert np.array_equal(c.cpu_free, before[0])
    assert np.array_equal(c.gpu_free, before[1])
    assert c.version[0] not in (before[2][0], placed_version)


@pytest.mark.parametrize(
    ("request_", "gpus", "want_error"),
    [
        pytest.param(pod(gpus=1, milli=600), (0,), "cannot fit", id="GPU too full"),
        pytest.param(pod(gpus=1, milli=100), (0, 1), "distinct GPUs", id="wrong GPU count"),
        pytest.param(pod(gpus=1, milli=100), (5,), "out of range", id="no such GPU"),
        pytest.param(pod(cpu=64_000), (), "does not fit", id="too much CPU"),
    ],
)
def test_place_refuses_what_does_not_fit(
    request_: GpuRequest, gpus: tuple[int, ...], want_error: str
) -> None:
    c = cluster(node("a").gpus(2).free(500, 1000))
    with pytest.raises(ValueError, match=want_error):
        c.place(0, request_, gpus)
    assert c.gpu_free[0].tolist() == [500, 1000]


def test_release_refuses_what_was_not_placed() -> None:
    c = cluster(node("a").gpus(1))
    with pytest.raises(ValueError, match="not placed"):
        c.release(0, pod(gpus=1, milli=100), (0,))


@pytest.mark.parametrize(
    ("fields", "want_error"),
    [
        pytest.param({"gpus": 1}, "both zero or both positive", id="GPUs without milli"),
        pytest.param({"gpus": 1, "gpu_milli": 1001}, "within 0..1000", id="more than a GPU"),
        pytest.param({"models": ("T4",)}, "no GPU model constraint", id="model without GPU"),
        pytest.param({"cpu": -1}, "negative", id="negative CPU"),
    ],
)
def test_bad_requests_are_refused(fields: dict[str, object], want_error: str) -> None:
    with pytest.raises(ValueError, match=want_error):
        GpuRequest(**fields)  # type: ignore[arg-type]


# -- typical pods and fragmentation ----------------------------------------------------------------


def test_typical_pods_order_cut_and_renormalise() -> None:
    requests = (
        [pod(cpu=4000, gpus=1, milli=500)] * 5
        + [pod(cpu=2000, gpus=1, milli=1000)] * 3
        + [pod(cpu=8000)] * 3
        + [pod(cpu=1000, gpus=2, milli=1000)] * 1
    )
    kept = typical_pods(requests, coverage_pct=75)
    # Equal counts go larger shape first: (8000, 0, 0) before (2000, 1000, 1). 5 + 3 = 8 pods are
    # below 75 % of 12 (9), so a third group is kept, and the probabilities are renormalised over 11.
    assert [(t.cpu, t.gpu_milli, t.gpus, t.count) for t in kept] == [
        (4000, 500, 1, 5),
        (8000, 0, 0, 3),
        (2000, 1000, 1, 3),
    ]
    assert [t.probability for t in kept] == [(5 / 12) / (11 / 12), (3 / 12) / (11 / 12), (3 / 12) / (11 / 12)]
    everything = typical_pods(requests, coverage_pct=100)
    assert [t.probability for t in everything] == [5 / 12, 3 / 12, 3 / 12, 1 / 12]


SHARE = typical((1000, 500, 1, 0.5), (1000, 1000, 1, 0.25), (4000, 0, 0, 0.25))


@pytest.mark.parametrize(
    ("cpu_left", "gpu_free", "model", "pods", "want_fragment"),
    [
        pytest.param(8000, (1000, 1000), "T4", SHARE, 0.25 * 2000, id="empty node: only the CPU-only share"),
        pytest.param(
            8000, (400, 1000), "T4", SHARE, 0.5 * 400 + 0.25 * 400 + 0.25 * 1400, id="sliver too small"
        ),
        pytest.param(
            500, (1000, 1000), "T4", SHARE, 0.5 * 2000 + 0.25 * 2000 + 0.25 * 2000, id="no CPU left"
        ),
        pytest.param(8000, (300, 200), "T4", SHARE, 500.0, id="no GPU fits anything"),
        pytest.param(8000, (0, 0), "T4", SHARE, 0.0, id="nothing free"),
        pytest.param(
            8000,
            (1000, 1000),
            "T4",
            typical((1000, 500, 1, 1.0), models=("V100",)),
            2000.0,
            id="model not allowed: all fragment",
        ),
        pytest.param(
            8000,
            (1000, 700, 1000),
            "T4",
            typical((1000, 1000, 2, 1.0)),
            700.0,
            id="multi-GPU pod fits: the partial GPU is fragment",
        ),
    ],
)
def test_node_fragment(
    cpu_left: int, gpu_free: tuple[int, ...], model: str, pods: tuple[TypicalPod, ...], want_fragment: float
) -> None:
    assert node_fragment(pods, cpu_left, gpu_free, model) == pytest.approx(want_fragment)


def test_vectorised_fragment_is_bit_exact() -> None:
    rng = np.random.default_rng(7)
    models = ("A", "B", "C")
    milli = rng.choice([0, 110, 230, 470, 810, 1000], 30)
    pods = tuple(
        TypicalPod(
            cpu=int(rng.integers(0, 20_000)),
            gpu_milli=int(m),
            gpus=int(rng.integers(1, 4)) if m else 0,
            models=("B",) if m and i % 4 == 0 else (),
            count=1,
            probability=float(p),
        )
        for i, (m, p) in enumerate(zip(milli, rng.dirichlet(np.ones(30)), strict=True))
    )
    cpu_left = rng.integers(0, 40_000, 500)
    gpu_free = rng.choice([0, 50, 190, 530, 1000], (500, 8))
    gpu_free[:, 6:] = np.where(rng.random((500, 2)) < 0.5, 0, gpu_free[:, 6:])  # smaller nodes' padding
    model = rng.integers(0, 3, 500)
    measured = FragmentationMeasure(pods, models).amounts(cpu_left, gpu_free, model)
    for k in range(500):
        want = node_fragment(pods, int(cpu_left[k]), [int(f) for f in gpu_free[k]], models[model[k]])
        assert measured[k] == want  # exact: the FGD score truncates differences of these floats


def test_gap_waste() -> None:
    waste = gap_waste(typical((1000, 400, 1, 0.5), (1000, 1000, 1, 0.5)))
    assert waste[0] == 0.0
    assert waste[399] == 399.0  # nothing fits: all of it is waste
    assert waste[400] < 10.0  # an exact fit for a common pod is almost surely filled
    assert waste[1000] < waste[600] < 600  # a fresh GPU wastes less than a 600 gap


def test_waste_measure_counts_gpus_the_cpu_cannot_feed() -> None:
    pods = typical((10_000, 1000, 1, 1.0))
    c = cluster(node("a").gpus(2).cpu(100_000))
    measure = WasteMeasure(pods, c)
    assert cpu_pressure(pods, c) == pytest.approx(10_000 / 1000 * 2000 / 100_000)
    fed, starved = measure.amounts(
        np.array([20_000, 10_000]), np.array([[1000, 1000], [1000, 1000]]), np.zeros(2, dtype=np.int64)
    )
    assert starved - fed == pytest.approx(1000.0)  # CPU for one GPU only


# -- score rules ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("builders", "request_", "want_scores"),
    [
        # (0.5 * 0.0625 + 0.25 * 0.125) / 2 = 0.03125 -> 96.875; (1 * 0.0625 + 1 * 0.125) / 2 -> 90.625
        pytest.param(
            [node("a").cpu(64_000).gpus(2), node("b").cpu(128_000).gpus(8)],
            pod(cpu=8000, gpus=1, milli=1000),
            [96, 90],
            id="smaller free-demand dot product scores higher",
        ),
        # (0.5 * 0.5 + 0) / 2 = 0.125 -> 87.5
        pytest.param([node("a").cpu(64_000)], pod(cpu=64_000), [87], id="CPU-only pod"),
    ],
)
def test_dotprod(builders: list[NodeBuilder], request_: GpuRequest, want_scores: list[int]) -> None:
    assert scores("dotprod", cluster(*builders), request_) == want_scores


@pytest.mark.parametrize(
    ("hosted", "request_", "want_score"),
    [
        pytest.param([], pod(gpus=1, milli=1000), 0 + 25, id="empty node"),
        pytest.param([pod(gpus=1, milli=1000)], pod(gpus=1, milli=1000), 3 + 75, id="same class only"),
        pytest.param(
            [pod(gpus=1, milli=1000), pod(gpus=1, milli=500)],
            pod(gpus=1, milli=1000),
            4 + 50,
            id="same among others",
        ),
        pytest.param([pod(gpus=1, milli=500)], pod(gpus=1, milli=1000), 1, id="other classes only"),
        pytest.param([pod(gpus=1, milli=500)], pod(cpu=100), 0, id="CPU-only pod"),
    ],
)
def test_gpuclustering(hosted: list[GpuRequest], request_: GpuRequest, want_score: int) -> None:
    c = cluster(node("a").gpus(8))
    policy = GpuClusteringScore(PolicyContext())
    rank = np.zeros(1, dtype=np.int64)
    for h in hosted:
        assert schedule_one(policy, c, h, rank) is not None
    # base = 25 * (8000 - free) // 8000
    assert int(policy.score(c, request_, np.array([0]))[0]) == want_score


@pytest.mark.parametrize(
    ("free", "request_", "want_score"),
    [
        pytest.param((1000,) * 8, pod(gpus=1, milli=500), 25, id="empty 8-GPU node"),
        pytest.param((1000,) * 2, pod(gpus=1, milli=500), 31, id="empty 2-GPU node"),
        pytest.param((1000, 0), pod(gpus=1, milli=1000), 49, id="free GPU on a used node"),
        pytest.param((1000, 1000, 1000, 0), pod(gpus=2, milli=1000), 48, id="two free GPUs on a used node"),
        pytest.param((300, 1000), pod(gpus=1, milli=200), 97, id="tight shared GPU"),
        pytest.param((900, 1000), pod(gpus=1, milli=200), 91, id="loose shared GPU"),
        pytest.param((900, 1000), pod(cpu=100), 0, id="CPU-only pod"),
    ],
)
def test_gpupacking(free: tuple[int, ...], request_: GpuRequest, want_score: int) -> None:
    assert scores("gpupacking", cluster(node("a").gpus(len(free)).free(*free)), request_) == [want_score]


def test_bestfit_normalises_over_the_feasible_nodes() -> None:
    c = cluster(
        node("tight").cpu(16_000).gpus(1),
        node("mid").cpu(64_000).gpus(4),
        node("loose").cpu(128_000).gpus(8),
    )
    request = pod(cpu=8000, gpus=1, milli=1000)
    # raw = trunc(100 * (1 - (cpu_left / 128000 / 2 + gpu_left / 8000 / 2))): 96, 59, 9
    assert scores("bestfit", c, request) == [100, (59 - 9) * 100 // (96 - 9), 0]
    assert scores("bestfit", cluster(node("a").gpus(1), node("b").gpus(1)), request) == [0, 0]


def test_fgd_prefers_the_gpu_and_node_that_fragment_least() -> None:
    pods = typical((1000, 500, 1, 1.0))
    context = PolicyContext(typical=pods)
    c = cluster(node("fresh").gpus(2), node("exact").gpus(2).free(600, 0))
    request = pod(gpus=1, milli=600)
    # fresh: 1000 -> 400 makes 400 unusable for the 500 pod: sigmoid(-0.4) -> 40.
    # exact: 600 -> 0 removes 0 fragment (600 >= 500 was usable): sigmoid(0) -> 50.
    assert scores("fgd", c, request, context) == [40, 50]
    policy = get_policy("fgd", context)
    assert policy.choose_gpus(c, request, 1) == (0,)
    c2 = cluster(node("a").gpus(3).free(1000, 550, 700))
    # For a 550 pod: GPU 1 (550 -> 0) leaves no fragment, GPU 0 (-> 450) and GPU 2 (-> 150) do.
    assert policy.choose_gpus(c2, pod(gpus=1, milli=550), 0) == (1,)


def test_random_scores_one_node() -> None:
    c = cluster(node("a").gpus(1), node("b").gpus(1), node("c").gpus(1))
    got = scores("random", c, pod(gpus=1, milli=100), PolicyContext(rng=np.random.default_rng(3)))
    assert sorted(got) == [0, 0, 100]


def test_gpuplane_prefers_filling_a_gap_the_workload_rarely_fills() -> None:
    pods = typical((1000, 810, 1, 0.5), (1000, 1000, 1, 0.4), (1000, 160, 1, 0.1))
    c = cluster(node("fresh").gpus(1), node("sliver").gpus(1).free(190))
    policy = get_policy("gpuplane", PolicyContext(typical=pods))
    got = policy.score(c, pod(gpus=1, milli=160), np.array([0, 1]))
    assert got[1] > got[0]


def test_tie_break_goes_to_the_smallest_rank() -> None:
    nodes = np.array([3, 5, 8])
    rank = np.array([9, 9, 9, 4, 9, 2, 9, 9, 1])
    assert pick_node(np.array([70, 70, 10]), nodes, rank) == 5
    assert pick_node(np.array([70, 70, 70]), nodes, rank) == 8


def test_unknown_policy_lists_the_valid_ones() -> None:
    with pytest.raises(
        KeyError, match="valid: random, dotprod, gpuclustering, gpupacking, bestfit, fgd, gpuplane"
    ):
        get_policy("tetris")
    assert set(POLICIES) == {"random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "gpuplane"}


@pytest.mark.parametrize("name", ["fgd", "gpuplane"])
def test_fragmentation_policies_need_typical_pods(name: str) -> None:
    with pytest.raises(ValueError, match="typical pods"):
        get_policy(name)


def test_schedule_one_commits_and_reports_no_fit() -> None:
    c = cluster(node("a").gpus(1), node("b").gpus(1))
    rank = np.array([1, 0])
    policy = get_policy("bestfit")
    placed = schedule_one(policy, c, pod(gpus=1, milli=1000), rank)
    assert placed is not None
    assert (placed.node, placed.gpus) == (1, (0,))  # equal scores: the smaller rank
    assert schedule_one(policy, c, pod(gpus=1, milli=1000), rank) is not None
    assert schedule_one(policy, c, pod(gpus=1, milli=1000), rank) is None
    assert c.gpu_used_milli == 2000


def test_python_examples_in_the_placement_doc_run() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "placement.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/placement.md", "exec"), {})
