"""The one placement engine: filter, score, reserve, chosen by a profile.

Every path that puts pods on nodes runs here: gang placement in admission
(:mod:`gpuplane.core.placement.gang_placement`), the stock Kubernetes model of the simulator and
the FGD protocol replay. The shape is the Kubernetes scheduling framework's, cut to what placement needs::

    request --> Filter plugins --> feasible nodes --> Score plugins x weights --> pick
                (masks, ANDed)                        (0..100 each, summed)     (ties: rank)
                                                                                   |
                                                    Reserve plugin: the devices <--+

* a **Filter** narrows a boolean mask of nodes; the engine always starts from the inventory's
  own fit (free CPU, memory, pods, GPUs: :meth:`GpuArrays.feasible`);
* a **Score** rates feasible nodes 0..100, higher is better; a profile weights and sums them;
* the **Reserve** plugin chooses the devices inside the winning node (which GPUs, or which GPU
  a fraction shares); the engine then commits the pod to the inventory.

A :class:`Profile` names its plugins and weights; ``PROFILES`` in
:mod:`gpuplane.core.placement.profiles` maps names to factories, and ``DEFAULT_PROFILE`` there is
gpuplane's own policy, the one that beats FGD on the published lists (see docs/placement.md).
A profile whose only score plugin has weight 1 scores exactly as that plugin does, so the FGD
replay keeps the published numbers bit for bit.

Nothing here reads a clock or draws randomness of its own; ties break on a rank passed in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gpuplane.core.placement.gpu_arrays import BoolArray, GpuArrays, GpuRequest, IntArray

Scores = npt.NDArray[Any]  # int64 for the framework's plugins; float64 where a plugin keeps fractions


class FilterPlugin(Protocol):
    """Narrows the nodes that may host a request."""

    @property
    def name(self) -> str: ...

    def filter(self, cluster: GpuArrays, request: GpuRequest, mask: BoolArray) -> BoolArray:
        """``mask`` (nodes still feasible) with the nodes this plugin rejects turned off."""
        ...


class ScorePlugin(Protocol):
    """Rates feasible nodes for a request: 0..100, higher is better, aligned with ``nodes``."""

    @property
    def name(self) -> str: ...

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> Scores: ...


class ReservePlugin(Protocol):
    """Chooses the devices a request takes on the chosen node (``request.gpus`` GPU indices)."""

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]: ...


@dataclass(frozen=True, slots=True)
class Profile:
    """Which plugins run, with which weights.

    ``nodes_to_score`` bounds how many feasible nodes are scored per pod, as the Kubernetes
    scheduler's ``percentageOfNodesToScore`` does in large clusters; ``None`` scores them all
    (the FGD protocol does).
    """

    name: str
    scores: tuple[tuple[ScorePlugin, int], ...]
    reserve: ReservePlugin
    filters: tuple[FilterPlugin, ...] = ()
    nodes_to_score: int | None = None

    def __post_init__(self) -> None:
        if not self.scores:
            raise ValueError(f"profile {self.name!r} has no score plugin")
        if any(weight <= 0 for _, weight in self.scores):
            raise ValueError(f"profile {self.name!r}: score weights must be positive")


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one pod went: a node index and the GPUs it took there."""

    node: int
    gpus: tuple[int, ...]


def feasible(
    profile: Profile, cluster: GpuArrays, request: GpuRequest, among: BoolArray | None = None
) -> IntArray:
    """Indices of the nodes that pass the inventory's fit, ``among`` (if given) and every filter."""
    mask = cluster.feasible(request)
    if among is not None:
        mask = mask & among
    for plugin in profile.filters:
        mask = plugin.filter(cluster, request, mask)
    return np.flatnonzero(mask).astype(np.int64, copy=False)


def score(profile: Profile, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> Scores:
    """The weighted sum of the profile's scores of ``nodes`` (one weight-1 plugin: its own scores)."""
    (first, weight), *rest = profile.scores
    total: Scores = first.score(cluster, request, nodes)
    if weight != 1:
        total = total * weight
    for plugin, w in rest:
        total = total + w * plugin.score(cluster, request, nodes)
    return total


def pick_node(scores: Scores, nodes: IntArray, rank: IntArray | None) -> int:
    """The node with the highest score; ties to the smallest ``rank[node]`` (``None``: to the
    first of ``nodes``, the lowest index when they are ascending, as :func:`feasible` returns them)."""
    if rank is None:
        return int(nodes[int(np.argmax(scores))])
    tied = nodes[scores == scores.max()]
    return int(tied[np.argmin(rank[tied])])


def schedule_one(
    profile: Profile, cluster: GpuArrays, request: GpuRequest, rank: IntArray, among: BoolArray | None = None
) -> Placement | None:
    """Place one pod: filter, score, pick (ties by ``rank``), reserve devices, commit to ``cluster``.

    Returns ``None`` (and changes nothing) when no node fits. With a single feasible node that
    node is taken without scoring, as the Kubernetes scheduler does.
    """
    nodes = feasible(profile, cluster, request, among)
    if nodes.size == 0:
        return None
    if nodes.size == 1:
        node = int(nodes[0])
    else:
        if profile.nodes_to_score is not None and nodes.size > profile.nodes_to_score:
            nodes = nodes[np.argsort(rank[nodes], kind="stable")[: profile.nodes_to_score]]
        node = pick_node(score(profile, cluster, request, nodes), nodes, rank)
    gpus = profile.reserve.choose_gpus(cluster, request, node)
    cluster.commit(node, request, gpus)  # feasible, and the reserve plugin chose GPUs that fit
    return Placement(node, gpus)


# --- the Kubernetes scheduler's resource scoring ------------------------------------------------


class _AllocationScore:
    """``NodeResourcesFit`` scoring: the share of a node left free (or used) after placement.

    Over CPU and memory (weights 1:1) when the pod asks for them, else over GPUs (when no CPU
    figures are modelled, GPU requests stand in for them). Scores are ``100 x`` the share, kept
    as fractions so that nearly equal nodes are not tied by rounding.
    """

    name = ""
    most = False

    def score(self, cluster: GpuArrays, request: GpuRequest, nodes: IntArray) -> Scores:
        cpu_capacity, memory_capacity, gpu_capacity = cluster.capacities
        if request.cpu or request.memory:
            cpu = (cluster.cpu_free[nodes] - request.cpu) / cpu_capacity[nodes]
            memory = (cluster.memory_free[nodes] - request.memory) / memory_capacity[nodes]
            cpu += memory
            if self.most:  # 100 x (1 - mean share free)
                share: Scores = 100.0 - cpu * 50.0
            else:  # 100 x the mean share free (x 50 is exactly / 2 x 100: halving is exact)
                share = cpu * 50.0
            return share
        free = (cluster.gpu_free_total[nodes] - request.total_milli) / gpu_capacity[nodes]
        if self.most:
            free = 1.0 - free
        free *= 100.0
        return free


class LeastAllocated(_AllocationScore):
    """Prefers the emptiest node (the Kubernetes default)."""

    name = "least-allocated"


class MostAllocated(_AllocationScore):
    """Prefers the fullest node (bin packing)."""

    name = "most-allocated"
    most = True


class LowestFreeGpus:
    """Reserve plugin: the lowest-index GPUs that fit (whole GPUs: the lowest-index free ones)."""

    def choose_gpus(self, cluster: GpuArrays, request: GpuRequest, node: int) -> tuple[int, ...]:
        if request.gpus == 0:
            return ()
        row = cluster.gpu_free[node].tolist()
        return tuple([i for i, free in enumerate(row) if free >= request.gpu_milli][: request.gpus])
