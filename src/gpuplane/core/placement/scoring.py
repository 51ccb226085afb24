"""Node score policies for one pod at a time, and the rule that turns scores into one node.

A policy scores every feasible node for one request at once (integers 0..100, higher is better)
and chooses the GPUs inside the node that wins. The winner is the highest score; ties go to the
node with the smallest ``rank`` (a seeded random permutation in the FGD protocol, so that ties do
not always favour the same nodes).

The six published policies follow the FGD benchmark protocol, section 7, exactly (including
float operation order and integer truncation), so that their results equal the published ones
(Random in distribution only: its draws are not the reference simulator's):

=============== =================================================================== ==========
name            score of a feasible node                                            GPU choice
=============== =================================================================== ==========
random          one feasible node drawn uniformly scores 100, the others 0          random
dotprod         100 * (1 - <free, demand> / 2), both normalised by 128 CPUs, 8 GPUs best fit
gpuclustering   prefers nodes already hosting only pods of the same GPU class       best fit
gpupacking      shared GPU (tighter first) > free GPU on a used node > empty node   best fit
bestfit         least CPU + GPU left after placement, min-max normalised            best fit
fgd             sigmoid of the drop in expected fragmentation (see fragmentation)   FGD's own
gpuplane        drop in expected never-allocated GPU, see :class:`GpuplaneScore`     its own
=============== =================================================================== ==========

Policies built by :func:`get_policy` may keep caches keyed by node ``version``; one policy
instance serves one cluster at a time (a different cluster resets its caches).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from gpuplane.core.placement.engine import Placement, pick_node
from gpuplane.core.placement.fragmentation import (
    FragmentationMeasure,
    NodeMeasure,
    NodeMeasureCache,
    TypicalPod,
    WasteMeasure,
)
from gpuplane.core.placement.gpu_arrays import (
    MILLI_PER_GPU,
    FloatArray,
    GpuArrays,
    GpuRequest,
    IntArray,
)

MAX_NODE_SCORE = 100
# Normalisers of DotProd and BestFit: the largest node of the openb trace (128 CPUs, 8 GPUs).
MAX_SPEC_CPU = 128_000.0
MAX_SPEC_GPU = 8_000.0
# Larger than any free milli-GPU: marks GPUs that do not fit when sorting by free milli-GPU.
_NO_FIT = np.int64(1 << 40)


class ScorePolicy(Protocol):
    """Scores the feasible nodes of one request and places it on GPUs of the chosen node."""

    @property
    def name(self) -> str:
        """The registry name."""
        ...

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        """Integer scores 0..100 of ``nodes`` (indices of feasible nodes), aligned with them."""
        ...

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        """The GPUs of the feasible ``node`` that ``request`` takes (``gpus`` of them)."""
        ...


__all__ = ["Placement", "pick_node"]  # re-exported from the engine for earlier callers


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may know besides the cluster: the target workload, and its randomness."""

    typical: tuple[TypicalPod, ...] = ()
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(0))


def _trunc_score(values: FloatArray) -> IntArray:
    """Go's float64 -> int64 conversion (truncation toward zero), clipped to 0..100."""
    result: IntArray = np.clip(np.trunc(values), 0, MAX_NODE_SCORE).astype(np.int64)
    return result


def _best_fit_gpus(cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
    return cluster.best_gpus(node, request)


def _taken_free(cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
    """Free milli-GPU of the GPUs best fit would take on each node, ascending (``nodes`` x gpus)."""
    rows = cluster.gpu_free[nodes]
    keyed = np.where(rows >= request.gpu_milli, rows, _NO_FIT)
    if request.gpus == 1:
        taken: IntArray = keyed.min(axis=1, keepdims=True)
        return taken
    sorted_rows: IntArray = np.sort(keyed, axis=1)[:, : request.gpus]
    return sorted_rows


class RandomScore:
    """One feasible node, drawn uniformly, scores 100; GPUs drawn uniformly among those that fit."""

    name = "random"

    def __init__(self, context: PolicyContext) -> None:
        self._rng = context.rng

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        del cluster, request
        scores = np.zeros(len(nodes), dtype=np.int64)
        scores[int(self._rng.integers(len(nodes)))] = MAX_NODE_SCORE
        return scores

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        if request.gpus == 0:
            return ()
        if request.gpu_milli == MILLI_PER_GPU:
            return cluster.lowest_free_gpus(node, request.gpus)
        fitting = cluster.fitting_gpus(node, request.gpu_milli)
        chosen = self._rng.choice(fitting, size=request.gpus, replace=False)
        return tuple(sorted(int(i) for i in chosen))


class DotProdScore:
    """Tetris-style alignment: a smaller dot product of free resources and demand scores higher."""

    name = "dotprod"

    def __init__(self, context: PolicyContext) -> None:
        del context

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        cpu = (cluster.cpu_free[nodes] / MAX_SPEC_CPU) * (request.cpu / MAX_SPEC_CPU)
        gpu = (cluster.gpu_free_total[nodes] / MAX_SPEC_GPU) * (request.total_milli / MAX_SPEC_GPU)
        return _trunc_score(MAX_NODE_SCORE * (1.0 - (cpu + gpu) / 2.0))

    choose_gpus = staticmethod(_best_fit_gpus)


def gpu_class(request: GpuRequest) -> int:
    """GpuClustering's class of a GPU request: 0 for a shared GPU, else the number of GPUs."""
    return 0 if request.fractional else request.gpus


class GpuClusteringScore:
    """Keeps pods of one GPU class together (whole 1-GPU, 2-GPU, ..., and shared-GPU pods).

    It reads the classes of the pods on each node from the placements it is told about, so the
    policy must see every placement: :func:`gpuplane.core.placement.engine.schedule_one` goes
    through :meth:`choose_gpus`, and
    anything else that places pods must call :meth:`observe`.
    """

    name = "gpuclustering"

    def __init__(self, context: PolicyContext) -> None:
        del context
        self._cluster: GpuArrays | None = None
        self._classes: IntArray = np.zeros((0, 0), dtype=np.int64)

    def _bind(self, cluster: GpuArrays) -> IntArray:
        if self._cluster is not cluster:
            self._cluster = cluster
            self._classes = np.zeros((len(cluster), cluster.max_gpus + 1), dtype=np.int64)
        return self._classes

    def observe(self, cluster: GpuArrays, request: GpuRequest, node: int, sign: int = 1) -> None:
        """Record that a pod with ``request`` was placed on (``sign`` -1: removed from) ``node``."""
        if request.gpus:
            self._bind(cluster)[node, gpu_class(request)] += sign

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        if request.gpus == 0:
            return np.zeros(len(nodes), dtype=np.int64)
        hosted = self._bind(cluster)[nodes] > 0
        same = hosted[:, gpu_class(request)]
        others = hosted.sum(axis=1) - same
        x = 25 * (8000 - cluster.gpu_free_total[nodes])
        base = np.sign(x) * (np.abs(x) // 8000)  # Go's integer division truncates toward zero
        bonus = np.where(same, np.where(others > 0, 50, 75), np.where(others > 0, 0, 25))
        result: IntArray = np.clip(base + bonus, 0, MAX_NODE_SCORE).astype(np.int64)
        return result

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        gpus = cluster.best_gpus(node, request)
        # choose_gpus is called exactly once per placement, right before it is committed.
        self.observe(cluster, request, node)
        return gpus


class GpuPackingScore:
    """Shared GPU first (tighter is better), then a free GPU on a used node, then an empty node."""

    name = "gpupacking"

    def __init__(self, context: PolicyContext) -> None:
        del context

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        if request.gpus == 0:
            return np.zeros(len(nodes), dtype=np.int64)
        count = cluster.gpu_count[nodes]
        empty = cluster.full_gpus[nodes] == count
        taken = _taken_free(cluster, request, nodes)
        fresh = np.count_nonzero(taken == MILLI_PER_GPU, axis=1)
        used = (taken * 100 // MILLI_PER_GPU).sum(axis=1)
        result: IntArray = np.where(
            empty,
            np.maximum(33 - count, count),
            np.where(fresh > 0, np.maximum(50 - fresh, 33), np.maximum(100 - used // 10, 50)),
        ).astype(np.int64)
        return result

    choose_gpus = staticmethod(_best_fit_gpus)


class BestFitScore:
    """Least CPU + GPU left over after placement (weights 1/2, 1/2), min-max normalised."""

    name = "bestfit"

    def __init__(self, context: PolicyContext) -> None:
        del context

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        raw = _trunc_score(best_fit_raw(cluster, request, nodes) * MAX_NODE_SCORE)
        low, high = raw.min(), raw.max()
        if high == low:
            return np.zeros(len(nodes), dtype=np.int64)
        result: IntArray = (raw - low) * MAX_NODE_SCORE // (high - low)
        return result

    choose_gpus = staticmethod(_best_fit_gpus)


def best_fit_raw(cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> FloatArray:
    """``1 - leftover``, leftover = half the CPU and half the GPU left after placement (0..1)."""
    cpu_left = (cluster.cpu_free[nodes] - request.cpu).astype(np.float64)
    gpu_left = (cluster.gpu_free_total[nodes] - request.total_milli).astype(np.float64)
    leftover = (cpu_left / MAX_SPEC_CPU) * 0.5 + (gpu_left / MAX_SPEC_GPU) * 0.5
    result: FloatArray = 1.0 - leftover
    return result


@dataclass(slots=True)
class _ShapeCache:
    """Per node: the last utility for one request shape, its GPU, and the node version it is for."""

    utility: FloatArray
    gpu: IntArray
    seen: IntArray


MeasureFactory = Callable[[GpuArrays], NodeMeasure]
Rate = Callable[[FloatArray, FloatArray], FloatArray]


class PlacementDeltas:
    """How much a node measure changes when a request is placed on each node, cached per shape.

    For a fractional request every GPU that fits is tried; otherwise the request takes the best-fit
    GPUs (for whole GPUs, the lowest-index free ones). ``rate(before, after)`` turns measure values
    into a utility (higher is better); a node's utility is that of its best GPU, the first (lowest
    index) among equals. Results depend only on the node's state and the request's shape, so they
    are kept per ``(shape, node)`` and recomputed only for nodes whose version changed.
    """

    def __init__(self, measure_for: MeasureFactory, rate: Rate) -> None:
        self._measure_for = measure_for
        self._rate = rate
        self._cluster: GpuArrays | None = None
        self._nodes: NodeMeasureCache | None = None
        self._caches: dict[tuple[int, int, int, tuple[str, ...]], _ShapeCache] = {}

    def node_values(self, cluster: GpuArrays) -> NodeMeasureCache:
        """The measure of every node of ``cluster`` (state is reset when the cluster changes)."""
        if self._cluster is not cluster or self._nodes is None:
            self._cluster = cluster
            self._nodes = NodeMeasureCache(self._measure_for(cluster), cluster)
            self._caches = {}
        return self._nodes

    def utilities(
        self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray
    ) -> tuple[FloatArray, IntArray]:
        """Utility and chosen GPU (the first of the choice) of ``nodes`` for ``request``."""
        tracker = self.node_values(cluster)
        cache = self._caches.get(request.shape)
        if cache is None:
            n = len(cluster)
            cache = _ShapeCache(
                np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64), np.full(n, -1, dtype=np.int64)
            )
            self._caches[request.shape] = cache
        stale = nodes[cache.seen[nodes] != cluster.version[nodes]]
        if stale.size:
            if request.fractional:
                utility, gpu = self._fractional(cluster, tracker, request, stale)
            else:
                utility, gpu = self._whole(cluster, tracker, request, stale)
            cache.utility[stale] = utility
            cache.gpu[stale] = gpu
            cache.seen[stale] = cluster.version[stale]
        return cache.utility[nodes], cache.gpu[nodes]

    def _fractional(
        self, cluster: GpuArrays, tracker: NodeMeasureCache, request: GpuRequest, nodes: IntArray
    ) -> tuple[FloatArray, IntArray]:
        rows = cluster.gpu_free[nodes]
        which, gpu = np.nonzero(rows >= request.gpu_milli)
        after = rows[which]
        after[np.arange(len(which)), gpu] -= request.gpu_milli
        before = tracker.values()[nodes][which]
        value = tracker.measure.amounts(
            cluster.cpu_free[nodes][which] - request.cpu, after, cluster.model[nodes][which]
        )
        per_gpu = np.full(rows.shape, -np.inf, dtype=np.float64)
        per_gpu[which, gpu] = self._rate(before, value)
        best = np.argmax(per_gpu, axis=1)
        return per_gpu[np.arange(len(nodes)), best], best.astype(np.int64)

    def _whole(
        self, cluster: GpuArrays, tracker: NodeMeasureCache, request: GpuRequest, nodes: IntArray
    ) -> tuple[FloatArray, IntArray]:
        after = cluster.gpu_free[nodes].copy()
        if request.gpus:
            keyed = np.where(after >= request.gpu_milli, after, _NO_FIT)
            take = np.argsort(keyed, axis=1, kind="stable")[:, : request.gpus]
            after[np.arange(len(nodes))[:, None], take] -= request.gpu_milli
        value = tracker.measure.amounts(cluster.cpu_free[nodes] - request.cpu, after, cluster.model[nodes])
        before = tracker.values()[nodes]
        return self._rate(before, value), np.zeros(len(nodes), dtype=np.int64)

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        """The GPUs these utilities assume: the best GPU for a fractional request, else best fit."""
        if request.fractional:
            gpu = self.utilities(cluster, request, np.array([node], dtype=np.int64))[1]
            return (int(gpu[0]),)
        return cluster.best_gpus(node, request)


def sigmoid_score(utility: FloatArray) -> FloatArray:
    """FGD's scale: ``trunc(100 * sigmoid(utility / 1000))`` (50 = no change), as floats."""
    sigmoid = 1.0 / (1.0 + np.exp(-(utility / 1000.0)))
    return _trunc_score(sigmoid * MAX_NODE_SCORE).astype(np.float64)


def fgd_rate(before: FloatArray, after: FloatArray) -> FloatArray:
    """FGD's score of a placement: the drop of fragment on :func:`sigmoid_score`'s scale."""
    return sigmoid_score(before - after)


def waste_drop(before: FloatArray, after: FloatArray) -> FloatArray:
    """The raw drop of a measure (positive: the placement lowers it)."""
    result: FloatArray = before - after
    return result


class FgdScore:
    """Fragmentation Gradient Descent: the node (and GPU) whose expected fragmentation grows least.

    GPUs inside a node are compared on the truncated integer score, first index among equals,
    as the reference implementation does.
    """

    name = "fgd"

    def __init__(self, context: PolicyContext) -> None:
        typical = _require_typical(context, self.name)
        self._deltas = PlacementDeltas(lambda c: FragmentationMeasure(typical, c.model_names), fgd_rate)

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        return self._deltas.utilities(cluster, request, nodes)[0].astype(np.int64)

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        return self._deltas.choose_gpus(cluster, request, node)


class GpuplaneScore:
    """gpuplane's default: place where the expected never-allocated GPU grows least.

    Same protocol and information as FGD (the typical pods and the current cluster state), three
    differences, each measured on the published openb lists (see docs/placement.md):

    * the measure is :class:`~gpuplane.core.placement.fragmentation.WasteMeasure`: a free gap
      counts as waste by how likely the workload is to fill it, not by whether one random pod
      fits now, and GPUs the node's CPU cannot feed count as waste too;
    * the GPU inside the node is the one with the largest raw drop (FGD compares truncated scores);
    * nodes are still compared on FGD's truncated sigmoid scale, so placements within ~40
      milli-GPU of the best tie and the seeded node rank spreads them (exact comparison measured
      worse, especially when CPU is scarce).
    """

    name = "gpuplane"

    def __init__(self, context: PolicyContext) -> None:
        typical = _require_typical(context, self.name)
        self._deltas = PlacementDeltas(lambda c: WasteMeasure(typical, c), waste_drop)

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> IntArray:
        return sigmoid_score(self._deltas.utilities(cluster, request, nodes)[0]).astype(np.int64)

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        return self._deltas.choose_gpus(cluster, request, node)


def _require_typical(context: PolicyContext, policy: str) -> tuple[TypicalPod, ...]:
    if not context.typical:
        raise ValueError(f"policy {policy!r} needs the typical pods of the workload")
    return context.typical


PolicyFactory = Callable[[PolicyContext], ScorePolicy]

POLICIES: dict[str, PolicyFactory] = {
    "random": RandomScore,
    "dotprod": DotProdScore,
    "gpuclustering": GpuClusteringScore,
    "gpupacking": GpuPackingScore,
    "bestfit": BestFitScore,
    "fgd": FgdScore,
    "gpuplane": GpuplaneScore,
}


def policy_factory(name: str) -> PolicyFactory:
    """The factory registered as ``name`` (case-insensitive). Raises ``KeyError`` naming the valid ones."""
    factory = POLICIES.get(name.lower())
    if factory is None:
        raise KeyError(f"unknown placement policy {name!r}; valid: {', '.join(POLICIES)}")
    return factory


def get_policy(name: str, context: PolicyContext | None = None) -> ScorePolicy:
    """A fresh policy by registry name (case-insensitive). Raises ``KeyError`` naming the valid ones."""
    return policy_factory(name)(context if context is not None else PolicyContext())
