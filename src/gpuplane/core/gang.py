"""Former home of gang placement, now :mod:`gpuplane.core.placement.gang_placement` (the
:class:`Cluster`) and :mod:`gpuplane.core.placement.gangs` (a gang's pod sets and outcomes).

Re-exports them for the modules not yet moved to the new imports; it goes once none is left.
"""

from gpuplane.core.placement.eligibility import tolerated
from gpuplane.core.placement.gang_placement import Cluster
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet, PlacementFailure, PodPlace
from gpuplane.core.placement.node_order import NODES_TO_SCORE

__all__ = [
    "NODES_TO_SCORE",
    "Cluster",
    "GangPlacement",
    "GangPodSet",
    "PlacementFailure",
    "PodPlace",
    "tolerated",
]
