"""Target workload ("typical pods") and the GPU fragmentation of a node under it (FGD, ATC'23).

The definitions follow the FGD benchmark protocol (sections 6.1-6.3) to the last bit, because the
FGD score truncates a difference of these floats to an integer and a one-ulp change can move a
pod to another node.

Typical pods
    Group all pods of the trace by shape ``(cpu, gpu_milli, gpus, gpu model constraint)``, order
    the groups by count (descending; equal counts by shape, descending) and keep groups from the
    top while the kept count is below ``coverage_pct`` % of all pods (the group that crosses the
    line is kept). Probabilities are renormalised over the kept groups.

Fragment of a node for one typical pod ``m`` (``L`` = the node's free milli-GPU)::

    m asks no GPU                                   -> all L       (bucket XL or XR)
    node's model not allowed for m                  -> all L       (NA)
    >= gpus_m GPUs with >= milli_m free, CPU fits   -> free milli of the GPUs too small for m
                                                       (bucket Q2; the rest is "satisfied", Q3)
    >= gpus_m GPUs fit, CPU does not                -> all L       (Q4)
    not enough GPUs fit                             -> all L       (Q2 if CPU fits, else Q1)

Fragment of a node = sum over typical pods of ``p_m * fragment_m``, accumulated per bucket in the
typical-pod order, then the buckets summed in the order Q1, Q2, Q4, XL, XR, NA (Q3 excluded).
Memory plays no part.

:class:`WasteMeasure` is gpuplane's alternative (used by its default policy): the expected milli-GPU
that will never be allocated, per GPU from the size of its free gap, plus the GPUs that the node's
free CPU cannot feed. Both measures share the :class:`NodeMeasure` protocol, so one cache of
per-node values (:class:`NodeMeasureCache`) serves either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gpuplane.core.placement.gpu_arrays import MILLI_PER_GPU, FloatArray, GpuArrays, GpuRequest, IntArray

# Buckets in the order their sums are added (Q3, "satisfied", is never part of the fragment).
Q1_LACK_BOTH, Q2_LACK_GPU, Q4_LACK_CPU, XL_SATISFIED, XR_LACK_CPU, NO_ACCESS = range(6)
BUCKET_NAMES = ("q1_lack_both", "q2_lack_gpu", "q4_lack_cpu", "xl_satisfied", "xr_lack_cpu", "no_access")

DEFAULT_COVERAGE_PCT = 95


@dataclass(frozen=True, slots=True)
class TypicalPod:
    """One pod shape of the target workload and its probability."""

    cpu: int
    gpu_milli: int
    gpus: int
    models: tuple[str, ...]
    count: int
    probability: float

    @property
    def spec(self) -> str:
        """The GPU model constraint as the trace writes it (``"A|B"``, empty for any model)."""
        return "|".join(self.models)


def typical_pods(
    requests: Iterable[GpuRequest], coverage_pct: int = DEFAULT_COVERAGE_PCT
) -> tuple[TypicalPod, ...]:
    """The most popular shapes of ``requests`` covering ``coverage_pct`` % of them (see module doc).

    Deterministic: ties in count are broken by the shape tuple ``(cpu, gpu_milli, gpus, spec)``,
    larger first. Raises ``ValueError`` for an empty workload.
    """
    counts = Counter((r.cpu, r.gpu_milli, r.gpus, "|".join(r.models)) for r in requests)
    if not counts:
        raise ValueError("no pods to derive typical pods from")
    if not 0 < coverage_pct <= 100:
        raise ValueError(f"coverage_pct must be within 1..100, got {coverage_pct}")
    ordered = sorted(counts.items(), key=lambda item: (item[1], item[0]), reverse=True)
    total = float(sum(counts.values()))
    expected = float(coverage_pct) * total / 100.0
    kept = 0
    covered = 0.0
    while covered < expected and kept < len(ordered):
        covered += ordered[kept][1]
        kept += 1
    share = covered / total
    out = []
    for (cpu, milli, gpus, spec), count in ordered[:kept]:
        probability = count / total
        if kept < len(ordered):
            probability /= share
        models = tuple(part for part in spec.split("|") if part)
        out.append(TypicalPod(cpu, milli, gpus, models, count, probability))
    return tuple(out)


def node_fragment(typical: Sequence[TypicalPod], cpu_left: int, gpu_free: Sequence[int], model: str) -> float:
    """Fragment (milli-GPU) of one node: the readable scalar definition of the module docstring.

    ``gpu_free`` lists the free milli-GPU of the node's GPUs. :class:`FragmentationMeasure`
    computes the same float, bit for bit, for many nodes at once.
    """
    buckets = [0.0] * len(BUCKET_NAMES)
    left_total = sum(gpu_free)
    for pod in typical:
        cpu_ok = cpu_left >= pod.cpu
        amount = left_total
        if pod.gpu_milli == 0:
            bucket = XL_SATISFIED if cpu_ok else XR_LACK_CPU
        elif pod.models and model not in pod.models:
            bucket = NO_ACCESS
        elif sum(1 for f in gpu_free if f >= pod.gpu_milli) >= pod.gpus:
            if cpu_ok:
                bucket = Q2_LACK_GPU
                amount = sum(f for f in gpu_free if f < pod.gpu_milli)
            else:
                bucket = Q4_LACK_CPU
        else:
            bucket = Q2_LACK_GPU if cpu_ok else Q1_LACK_BOTH
        buckets[bucket] += pod.probability * float(amount)
    total = 0.0
    for value in buckets:
        total += value
    return total


class NodeMeasure(Protocol):
    """A float per node state (milli-GPU), computed for many states at once."""

    def amounts(self, cpu_left: IntArray, gpu_free: IntArray, model: IntArray) -> FloatArray:
        """``cpu_left[K]`` free milli-CPU, ``gpu_free[K, G]`` free milli-GPU per GPU (padding GPUs 0),
        ``model[K]`` GPU model ids in the cluster's numbering."""
        ...


class FragmentationMeasure:
    """Vectorised fragment of many node states under a fixed list of typical pods.

    ``model_names`` fixes the meaning of model ids: pass the cluster's ``model_names``.
    """

    def __init__(self, typical: Sequence[TypicalPod], model_names: Sequence[str]) -> None:
        if not typical:
            raise ValueError("fragmentation needs at least one typical pod")
        self.typical = tuple(typical)
        self.model_names = tuple(model_names)
        self._probability = np.array([t.probability for t in typical], dtype=np.float64)
        self._cpu = np.array([t.cpu for t in typical], dtype=np.int64)
        self._gpus = np.array([t.gpus for t in typical], dtype=np.int64)
        self._gpu_pod = np.array([t.gpu_milli > 0 for t in typical], dtype=np.bool_)
        milli = np.array([t.gpu_milli for t in typical], dtype=np.int64)
        levels = np.unique(milli[self._gpu_pod])
        self._levels = levels if levels.size else np.array([1], dtype=np.int64)
        self._level_of = np.searchsorted(self._levels, np.where(self._gpu_pod, milli, self._levels[0]))
        # access[model id, m]: may typical pod m use a GPU of that model (always, for CPU-only pods)
        self._access = np.array(
            [[not t.gpu_milli or not t.models or name in t.models for t in typical] for name in model_names],
            dtype=np.bool_,
        ).reshape(len(self.model_names), len(typical))
        self._bucket_ids = np.arange(len(BUCKET_NAMES), dtype=np.int64)[:, None, None]

    def amounts(self, cpu_left: IntArray, gpu_free: IntArray, model: IntArray) -> FloatArray:
        """Fragment (milli-GPU, float64) of K node states.

        ``cpu_left[K]`` free milli-CPU, ``gpu_free[K, G]`` free milli-GPU per GPU (padding GPUs
        0), ``model[K]`` model ids. Equal, bit for bit, to :func:`node_fragment` of each row.
        """
        left_total = gpu_free.sum(axis=1)
        at_least = gpu_free[:, None, :] >= self._levels[None, :, None]  # K, levels, G
        fit_count = np.count_nonzero(at_least, axis=2)[:, self._level_of]  # K, M
        too_small = np.where(at_least, 0, gpu_free[:, None, :]).sum(axis=2)[:, self._level_of]
        cpu_ok = cpu_left[:, None] >= self._cpu[None, :]
        access = self._access[model]
        gpu_ok = fit_count >= self._gpus[None, :]
        satisfied = self._gpu_pod[None, :] & access & gpu_ok & cpu_ok
        amount = np.where(satisfied, too_small, left_total[:, None]).astype(np.float64)
        value = self._probability[None, :] * amount
        bucket = np.where(
            self._gpu_pod[None, :],
            np.where(
                access,
                np.where(cpu_ok, Q2_LACK_GPU, np.where(gpu_ok, Q4_LACK_CPU, Q1_LACK_BOTH)),
                NO_ACCESS,
            ),
            np.where(cpu_ok, XL_SATISFIED, XR_LACK_CPU),
        )
        # Sequential sums (cumsum, not sum: numpy's sum is pairwise) per bucket, in typical order.
        per_bucket = np.cumsum(np.where(bucket[None] == self._bucket_ids, value[None], 0.0), axis=2)[:, :, -1]
        total: FloatArray = per_bucket[0].copy()
        for b in range(1, len(BUCKET_NAMES)):
            total += per_bucket[b]
        return total


class NodeMeasureCache:
    """One measure for every node of one cluster, recomputed only for nodes whose version changed."""

    def __init__(self, measure: NodeMeasure, cluster: GpuArrays) -> None:
        self.measure = measure
        self.cluster = cluster
        self._values = np.zeros(len(cluster), dtype=np.float64)
        self._seen = np.full(len(cluster), -1, dtype=np.int64)

    def values(self) -> FloatArray:
        """The measure per node for the cluster's current state (a live array: do not write)."""
        stale = np.flatnonzero(self._seen != self.cluster.version)
        if stale.size:
            c = self.cluster
            self._values[stale] = self.measure.amounts(c.cpu_free[stale], c.gpu_free[stale], c.model[stale])
            self._seen[stale] = c.version[stale]
        return self._values


def node_fragmentation(typical: Sequence[TypicalPod], cluster: GpuArrays) -> NodeMeasureCache:
    """FGD's fragment of every node of ``cluster``, kept up to date."""
    return NodeMeasureCache(FragmentationMeasure(typical, cluster.model_names), cluster)


# -- gpuplane's measure ---------------------------------------------------------------------------

# Scale of the chance that a free gap is ever filled: a gap that Q (the probability that the next
# GPU pod fits in it) makes fillable is filled with probability Q / (Q + FILL_SCALE).
FILL_SCALE = 0.01
# CPU pressure above which the CPU reserved for free GPUs is discounted, and how steeply.
PRESSURE_KNEE = 0.95
PRESSURE_SLOPE = 5.0
MIN_RESERVE_SCALE = 0.4


def gap_waste(typical: Sequence[TypicalPod], fill_scale: float = FILL_SCALE) -> FloatArray:
    """Expected milli-GPU never allocated of one GPU with ``h`` milli free, for ``h`` = 0..1000.

    Model: GPU pods arrive with the typical pods' sizes (a multi-GPU pod counts as size 1000). A gap
    of ``h`` is eventually filled by one of the sizes that fit, chosen in proportion to their
    probability, with chance ``Q(h) / (Q(h) + fill_scale)`` where ``Q(h)`` is the probability that a
    pod fits; otherwise all of it is wasted. So ``V[h] = (1 - f) * h + f * E[V[h - size]]``.
    A gap only rare pods fit (``Q`` small) is nearly all waste; a gap many pods fit is not.
    """
    chance = np.zeros(MILLI_PER_GPU + 1, dtype=np.float64)
    gpu_pods = [t for t in typical if t.gpu_milli]
    total = sum(t.probability for t in gpu_pods)
    for t in gpu_pods:
        chance[t.gpu_milli] += t.probability / total
    sizes = np.flatnonzero(chance)
    fits = np.cumsum(chance)
    waste = np.zeros(MILLI_PER_GPU + 1, dtype=np.float64)
    for h in range(1, MILLI_PER_GPU + 1):
        if fits[h] <= 0.0:
            waste[h] = h
            continue
        fitting = sizes[sizes <= h]
        expected = float((chance[fitting] * waste[h - fitting]).sum() / fits[h])
        filled = fits[h] / (fits[h] + fill_scale)
        waste[h] = (1.0 - filled) * h + filled * expected
    return waste


def cpu_per_gpu_milli(typical: Sequence[TypicalPod]) -> float:
    """Mean milli-CPU that GPU pods ask per milli-GPU (0 when no typical pod asks a GPU)."""
    gpu = sum(t.probability * t.gpus * t.gpu_milli for t in typical)
    cpu = sum(t.probability * t.cpu for t in typical if t.gpu_milli)
    return cpu / gpu if gpu else 0.0


def cpu_pressure(typical: Sequence[TypicalPod], cluster: GpuArrays) -> float:
    """CPU the workload would ask, all pods included, once every GPU is allocated, over the CPU there is."""
    gpu = sum(t.probability * t.gpus * t.gpu_milli for t in typical)
    cpu = sum(t.probability * t.cpu for t in typical)
    capacity = int(cluster.cpu_capacity.sum())
    if not gpu or not capacity:
        return 0.0
    return (cpu / gpu) * cluster.gpu_capacity_milli / capacity


class WasteMeasure:
    """gpuplane's node measure: expected milli-GPU that will never be allocated on the node.

    ``sum_i gap_waste[free_i] + max(0, L - cpu_left / reserve)`` where ``L`` is the node's free
    milli-GPU and ``reserve`` the milli-CPU a milli-GPU needs (:func:`cpu_per_gpu_milli`): the second
    term counts the GPUs that the node's free CPU cannot feed. When the workload asks more CPU than
    the cluster has (:func:`cpu_pressure` above ``PRESSURE_KNEE``), high-CPU GPU pods are the ones
    that will not fit, so the reserve is discounted (down to ``MIN_RESERVE_SCALE``).
    """

    def __init__(self, typical: Sequence[TypicalPod], cluster: GpuArrays) -> None:
        if not typical:
            raise ValueError("the waste measure needs the typical pods of the workload")
        self.gap_waste = gap_waste(typical)
        pressure = cpu_pressure(typical, cluster)
        scale = min(1.0, max(MIN_RESERVE_SCALE, 1.0 - PRESSURE_SLOPE * (pressure - PRESSURE_KNEE)))
        self.cpu_reserve = cpu_per_gpu_milli(typical) * scale

    def amounts(self, cpu_left: IntArray, gpu_free: IntArray, model: IntArray) -> FloatArray:
        del model  # every GPU model is alike to this measure
        waste: FloatArray = self.gap_waste[gpu_free].sum(axis=1)
        if self.cpu_reserve > 0:
            unfed = gpu_free.sum(axis=1) - cpu_left / self.cpu_reserve
            waste += np.maximum(unfed, 0.0)
        return waste
