"""What insight reads of the core: the scheduler's world, for explanations and what-ifs.

Drivers reach the core through :mod:`gpuplane.core.session`. Insight (``why``, the queue ETA, the
aftermath of a preemption, the doctor, usage) goes further: it rebuilds the scheduler's world after
a plan and asks it questions a cycle does not (would this gang fit without these owners, what does
this ClusterQueue lend, what would it take to reclaim). This module is the one place it reads that
world from: the scheduler (built from a state and a plan), the quota tree's nodes, the gang
placement cluster and its gangs, and two device and node-pool facts. An import-linter contract
keeps insight to this module and the session, and keeps drivers out of it.
"""

from __future__ import annotations

from gpuplane.core.karpenter import provides
from gpuplane.core.placement.devices import device_resource
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet
from gpuplane.core.quota import AdmittedWorkload, ClusterQueueNode, CohortNode
from gpuplane.core.scheduler import Scheduler

__all__ = [
    "AdmittedWorkload",
    "ClusterQueueNode",
    "CohortNode",
    "GangPlacement",
    "GangPodSet",
    "PlacementState",
    "Scheduler",
    "device_resource",
    "provides",
]
