"""The placement engine one pod at a time: the simulator's second door into the core.

Drivers reach the core through :mod:`gpuplane.core.session`. The simulator's stock Kubernetes
model and the FGD replay also run the placement engine with no queues in front of it, a pod at a
time and a hundred thousand times a run, so they use its entry points directly: the scheduling
profiles (Filter/Score plugins), the GPU cluster model with its numpy arrays, the placement
policies and the fragmentation measure. Gang admission runs on the same engine.
"""

from __future__ import annotations

from gpuplane.core.placement.engine import feasible as feasible_nodes
from gpuplane.core.placement.engine import pick_node, schedule_one
from gpuplane.core.placement.engine import score as score_nodes
from gpuplane.core.placement.fragmentation import node_fragmentation, typical_pods
from gpuplane.core.placement.gpu_arrays import (
    MILLI_PER_GPU,
    FloatArray,
    GpuArrays,
    GpuRequest,
    IntArray,
    NodeSpec,
)
from gpuplane.core.placement.profiles import get_profile
from gpuplane.core.placement.scoring import PolicyContext, policy_factory

__all__ = [
    "MILLI_PER_GPU",
    "FloatArray",
    "GpuArrays",
    "GpuRequest",
    "IntArray",
    "NodeSpec",
    "PolicyContext",
    "feasible_nodes",
    "get_profile",
    "node_fragmentation",
    "pick_node",
    "policy_factory",
    "schedule_one",
    "score_nodes",
    "typical_pods",
]
