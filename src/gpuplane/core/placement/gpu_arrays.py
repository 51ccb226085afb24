"""The state of a cluster of GPU nodes, as numpy arrays, for whole and fractional GPU sharing.

A pod asks for ``gpus`` GPUs of ``gpu_milli`` milli-GPU each (1000 = a whole GPU), optionally
restricted to some GPU models, plus CPU (milli) and memory (MiB). A fractional request
(``gpus == 1``, ``gpu_milli < 1000``) shares one GPU with others; a whole-GPU request needs that
many GPUs with at least ``gpu_milli`` free each, i.e. entirely free GPUs when ``gpu_milli == 1000``.

Layout (N nodes, at most ``max_gpus`` GPUs per node)::

    cpu_free[N], memory_free[N], pods[N]          what is left on each node
    gpu_free[N, max_gpus]                        free milli-GPU per GPU; a node's GPUs are
                                                 columns 0..gpu_count-1, the padding columns
                                                 are 0 (never usable: every GPU request is > 0)
    gpu_free_total[N], full_gpus[N], max_gpu_free[N]   derived per node, kept in step
    version[N]                                   changes whenever the node changes

Invariant: the cluster changes only through :meth:`GpuArrays.place` and
:meth:`GpuArrays.release`, and each of them gives the node a new, never reused ``version``, so a
cache keyed on ``(node, version)`` never serves a stale value. Arrays returned by properties are
the live state: read them, do not write them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MILLI_PER_GPU = 1000
# Kubernetes' default pod limit per node (kubelet --max-pods).
DEFAULT_MAX_PODS = 110

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class GpuRequest:
    """What one pod asks of one node.

    ``cpu`` milli-CPU, ``memory`` MiB, ``gpus`` GPUs of ``gpu_milli`` milli-GPU each, on a GPU
    whose model is one of ``models`` (empty: any model). A request with no GPU has
    ``gpus == gpu_milli == 0`` and no model constraint.
    """

    cpu: int = 0
    memory: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.cpu < 0 or self.memory < 0:
            raise ValueError(f"negative CPU or memory request: {self}")
        if not 0 <= self.gpu_milli <= MILLI_PER_GPU:
            raise ValueError(f"gpu_milli must be within 0..{MILLI_PER_GPU}: {self}")
        if (self.gpus == 0) != (self.gpu_milli == 0) or self.gpus < 0:
            raise ValueError(f"gpus and gpu_milli must be both zero or both positive: {self}")
        if self.gpus == 0 and self.models:
            raise ValueError(f"a request without GPUs has no GPU model constraint: {self}")

    @property
    def total_milli(self) -> int:
        """GPU demand in milli-GPU (``gpus * gpu_milli``)."""
        return self.gpus * self.gpu_milli

    @property
    def fractional(self) -> bool:
        """Whether the request shares one GPU with others."""
        return self.gpus == 1 and self.gpu_milli < MILLI_PER_GPU

    @property
    def shape(self) -> tuple[int, int, int, tuple[str, ...]]:
        """``(cpu, gpu_milli, gpus, models)``: what scores and fragmentation depend on (memory is not)."""
        return (self.cpu, self.gpu_milli, self.gpus, self.models)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """Allocatable resources of one GPU node. All its GPUs are of one ``model``."""

    name: str
    cpu: int
    memory: int
    gpus: int
    model: str = ""
    max_pods: int = DEFAULT_MAX_PODS

    def __post_init__(self) -> None:
        if self.cpu < 0 or self.memory < 0 or self.gpus < 0 or self.max_pods < 0:
            raise ValueError(f"negative capacity on node {self.name!r}")


class GpuArrays:
    """Mutable, vectorised free capacity of a fixed set of nodes (see the module docstring)."""

    def __init__(self, nodes: Sequence[NodeSpec]) -> None:
        if not nodes:
            raise ValueError("a cluster needs at least one node")
        self.names: tuple[str, ...] = tuple(n.name for n in nodes)
        self.model_names: tuple[str, ...] = tuple(sorted({n.model for n in nodes}))
        model_id = {name: i for i, name in enumerate(self.model_names)}
        self._model_id = model_id
        self.model: IntArray = np.array([model_id[n.model] for n in nodes], dtype=np.int64)
        self.gpu_count: IntArray = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.cpu_capacity: IntArray = np.array([n.cpu for n in nodes], dtype=np.int64)
        self.memory_capacity: IntArray = np.array([n.memory for n in nodes], dtype=np.int64)
        self.max_pods: IntArray = np.array([n.max_pods for n in nodes], dtype=np.int64)
        self.max_gpus = max(1, int(self.gpu_count.max()))
        # Real GPU columns per node (padding columns stay 0 and are never usable).
        self.gpu_exists: BoolArray = np.arange(self.max_gpus)[None, :] < self.gpu_count[:, None]
        self.cpu_free: IntArray = self.cpu_capacity.copy()
        self.memory_free: IntArray = self.memory_capacity.copy()
        self.pods: IntArray = np.zeros(len(nodes), dtype=np.int64)
        self.gpu_free: IntArray = np.where(self.gpu_exists, MILLI_PER_GPU, 0).astype(np.int64)
        self.gpu_free_total: IntArray = self.gpu_free.sum(axis=1)
        self.full_gpus: IntArray = self.gpu_count.copy()
        self.max_gpu_free: IntArray = self.gpu_free.max(axis=1)
        self.version: IntArray = np.zeros(len(nodes), dtype=np.int64)
        self._next_version = 1
        self._model_masks: dict[tuple[str, ...], BoolArray] = {}
        # CPU, memory and milli-GPU capacity per node, at least 1 (what allocation shares divide by).
        self.capacities: tuple[IntArray, IntArray, IntArray] = (
            np.maximum(self.cpu_capacity, 1),
            np.maximum(self.memory_capacity, 1),
            np.maximum(self.gpu_count * MILLI_PER_GPU, 1),
        )

    def __len__(self) -> int:
        return len(self.names)

    @property
    def gpu_capacity_milli(self) -> int:
        """Milli-GPU of all GPUs of all nodes."""
        return int(self.gpu_count.sum()) * MILLI_PER_GPU

    @property
    def gpu_used_milli(self) -> int:
        """Milli-GPU allocated to pods (fractions count what they asked, not a whole GPU)."""
        return self.gpu_capacity_milli - int(self.gpu_free_total.sum())

    def model_mask(self, models: Iterable[str]) -> BoolArray:
        """Nodes whose GPU model is one of ``models`` (all nodes for an empty constraint)."""
        key = tuple(models)
        mask = self._model_masks.get(key)
        if mask is None:
            if key:
                ids = [self._model_id[m] for m in key if m in self._model_id]
                mask = np.isin(self.model, np.array(ids, dtype=np.int64))
            else:
                mask = np.ones(len(self), dtype=np.bool_)
            mask.setflags(write=False)
            self._model_masks[key] = mask
        return mask

    def fitting_gpu_counts(self, gpu_milli: int) -> IntArray:
        """Per node, how many GPUs have at least ``gpu_milli`` free (``gpu_milli`` > 0)."""
        if gpu_milli == MILLI_PER_GPU:
            return self.full_gpus
        counts: IntArray = np.count_nonzero(self.gpu_free >= gpu_milli, axis=1).astype(np.int64)
        return counts

    def feasible(self, request: GpuRequest) -> BoolArray:
        """Nodes that can host ``request`` now: CPU, memory, pod count, GPU model and GPU fit."""
        ok: BoolArray = self.pods < self.max_pods
        # Free CPU and memory are never negative: a request without them fits any node's.
        if request.cpu:
            ok &= self.cpu_free >= request.cpu
        if request.memory:
            ok &= self.memory_free >= request.memory
        if request.gpus == 0:
            return ok
        if request.models:
            ok &= self.model_mask(request.models)
        if request.gpus == 1:
            ok &= self.max_gpu_free >= request.gpu_milli
        else:
            ok &= self.fitting_gpu_counts(request.gpu_milli) >= request.gpus
        return ok

    def feasible_among(self, request: GpuRequest, nodes: IntArray) -> BoolArray:
        """:meth:`feasible` for ``nodes`` only, aligned with them (cheap for a few nodes)."""
        ok: BoolArray = (
            (self.cpu_free[nodes] >= request.cpu)
            & (self.memory_free[nodes] >= request.memory)
            & (self.pods[nodes] < self.max_pods[nodes])
        )
        if request.gpus == 0:
            return ok
        if request.models:
            ok &= self.model_mask(request.models)[nodes]
        if request.gpus == 1:
            ok &= self.max_gpu_free[nodes] >= request.gpu_milli
        else:
            ok &= self.fitting_gpu_counts(request.gpu_milli)[nodes] >= request.gpus
        return ok

    def fits(self, node: int, request: GpuRequest) -> bool:
        """Whether one node can host ``request`` now (the scalar form of :meth:`feasible`)."""
        if (
            self.cpu_free[node] < request.cpu
            or self.memory_free[node] < request.memory
            or self.pods[node] >= self.max_pods[node]
        ):
            return False
        if request.gpus == 0:
            return True
        if request.models and not self.model_mask(request.models)[node]:
            return False
        return int(np.count_nonzero(self.gpu_free[node] >= request.gpu_milli)) >= request.gpus

    # -- GPU choice inside one node -------------------------------------------------------------

    def fitting_gpus(self, node: int, gpu_milli: int) -> IntArray:
        """Indices of the node's GPUs with at least ``gpu_milli`` free, ascending."""
        return np.flatnonzero(self.gpu_free[node] >= gpu_milli).astype(np.int64)

    def lowest_free_gpus(self, node: int, count: int) -> tuple[int, ...]:
        """The ``count`` lowest-index entirely free GPUs of ``node``."""
        free = np.flatnonzero(self.gpu_free[node] == MILLI_PER_GPU)
        if len(free) < count:
            raise ValueError(f"node {self.names[node]!r} has {len(free)} free GPUs, not {count}")
        return tuple(int(i) for i in free[:count])

    def best_gpus(self, node: int, request: GpuRequest) -> tuple[int, ...]:
        """Best fit: the GPUs with the least free milli-GPU that still fit, ties to the lowest index.

        For a whole-GPU request this is the lowest-index entirely free GPUs.
        """
        if request.gpus == 0:
            return ()
        row = self.gpu_free[node]
        fitting = np.flatnonzero(row >= request.gpu_milli)
        if len(fitting) < request.gpus:
            raise ValueError(f"node {self.names[node]!r} cannot fit {request}")
        order = np.argsort(row[fitting], kind="stable")
        return tuple(int(i) for i in fitting[order[: request.gpus]])

    # -- changes ---------------------------------------------------------------------------------

    def place(self, node: int, request: GpuRequest, gpus: Sequence[int]) -> None:
        """Put one pod with ``request`` on ``node``, taking ``gpu_milli`` from each GPU in ``gpus``.

        Raises ``ValueError`` (and changes nothing) when the pod does not fit there.
        """
        if not self.fits(node, request):
            raise ValueError(f"{request} does not fit on node {self.names[node]!r}")
        chosen = self._check_gpus(node, request, gpus)
        row = self.gpu_free[node].tolist()
        if any(row[i] < request.gpu_milli for i in chosen):
            raise ValueError(f"GPUs {list(chosen)} of node {self.names[node]!r} cannot fit {request}")
        self._apply(node, request, chosen, sign=-1)

    def commit(self, node: int, request: GpuRequest, gpus: tuple[int, ...]) -> None:
        """:meth:`place` without its checks, for the placement engine: ``node`` passed the
        engine's filter for ``request`` and a reserve plugin chose ``gpus`` among its GPUs that fit
        (distinct ``int`` indices). Anything else corrupts the inventory."""
        self._apply(node, request, gpus, sign=-1)

    def uncommit(self, node: int, request: GpuRequest, gpus: tuple[int, ...]) -> None:
        """:meth:`release` without its checks: undo a :meth:`commit` of the same pod."""
        self._apply(node, request, gpus, sign=+1)

    def release(self, node: int, request: GpuRequest, gpus: Sequence[int]) -> None:
        """Undo :meth:`place` of the same pod. Raises ``ValueError`` if it was not placed there."""
        chosen = self._check_gpus(node, request, gpus)
        row = self.gpu_free[node].tolist()
        if (
            self.cpu_free[node] + request.cpu > self.cpu_capacity[node]
            or self.memory_free[node] + request.memory > self.memory_capacity[node]
            or self.pods[node] == 0
            or any(row[i] + request.gpu_milli > MILLI_PER_GPU for i in chosen)
        ):
            raise ValueError(f"{request} is not placed on node {self.names[node]!r}")
        self._apply(node, request, chosen, sign=+1)

    def _check_gpus(self, node: int, request: GpuRequest, gpus: Sequence[int]) -> tuple[int, ...]:
        chosen = tuple(int(i) for i in gpus)
        if len(chosen) != request.gpus or len(set(chosen)) != len(chosen):
            raise ValueError(f"{request} needs {request.gpus} distinct GPUs, got {list(chosen)}")
        count = int(self.gpu_count[node])
        if any(not 0 <= i < count for i in chosen):
            raise ValueError(f"GPU index out of range on node {self.names[node]!r}: {list(chosen)}")
        return chosen

    def set_free(self, node: int, cpu: int, memory: int, pods: int, gpu_free: Sequence[int]) -> None:
        """Mirror a node whose state another inventory keeps (gang placement's device model).

        Sets what is free and how many pods run, and gives the node a new ``version``.
        """
        count = int(self.gpu_count[node])
        if len(gpu_free) != count or not all(0 <= g <= MILLI_PER_GPU for g in gpu_free):
            raise ValueError(f"node {self.names[node]!r} has {count} GPUs: {list(gpu_free)}")
        self.cpu_free[node] = cpu
        self.memory_free[node] = memory
        self.pods[node] = pods
        self.gpu_free[node, :count] = gpu_free
        self.gpu_free_total[node] = sum(gpu_free)
        self.full_gpus[node] = (
            gpu_free.count(MILLI_PER_GPU)
            if isinstance(gpu_free, list)
            else sum(1 for g in gpu_free if g == MILLI_PER_GPU)
        )
        self.max_gpu_free[node] = max(gpu_free, default=0)
        self.version[node] = self._next_version
        self._next_version += 1

    def _apply(self, node: int, request: GpuRequest, gpus: tuple[int, ...], sign: int) -> None:
        self.cpu_free[node] += sign * request.cpu
        self.memory_free[node] += sign * request.memory
        self.pods[node] -= sign
        if gpus:
            # A node has a few GPUs: plain integers are cheaper than numpy reductions here.
            free = self.gpu_free
            row = free[node].tolist()
            for i in gpus:
                row[i] += sign * request.gpu_milli
                free[node, i] = row[i]
            self.gpu_free_total[node] = sum(row)
            self.full_gpus[node] = row.count(MILLI_PER_GPU)
            self.max_gpu_free[node] = max(row)
        self.version[node] = self._next_version
        self._next_version += 1
