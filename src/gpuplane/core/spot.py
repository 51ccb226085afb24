"""Spot capacity, used safely: which flavors are spot, which workloads serve, and the rule
that keeps serving off spot unless it can fall back.

- A flavor is *spot* when its ``nodeLabels`` name spot capacity in one of the spellings the
  clouds and Karpenter use (``karpenter.sh/capacity-type: spot``, EKS ``SPOT``, GKE
  ``cloud.google.com/gke-spot``, AKS ``scalesetpriority: spot``).
- A workload *serves* when it or its pod templates carry ``gpuplane.dev/workload-class: serving``
  (a label the user sets).
- A serving workload is admitted to a spot flavor only when its ClusterQueue also offers an
  on-demand flavor for the same resources: when spot capacity is taken back, it moves there. With
  spot only, it waits (reason ``Reason.SPOT_WITHOUT_FALLBACK``).

Training workloads use spot freely; the controller's interruption handling
(:mod:`gpuplane.k8s.spot`) gives them a checkpoint grace, evicts them, and requeues them at the
head of their queue with their checkpoint time kept (``Reason.NODE_INTERRUPTED``).
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuplane.model import labels as keys
from gpuplane.model.objects import ClusterQueue, ResourceFlavor, Workload

WORKLOAD_CLASS = keys.WORKLOAD_CLASS_LABEL
SERVING = "serving"

SPOT_LABELS: Mapping[str, tuple[str, ...]] = {
    "karpenter.sh/capacity-type": ("spot",),
    "eks.amazonaws.com/capacityType": ("SPOT",),
    "cloud.google.com/gke-spot": ("true",),
    "cloud.google.com/gke-preemptible": ("true",),
    "kubernetes.azure.com/scalesetpriority": ("spot",),
}


def is_spot(flavor: ResourceFlavor) -> bool:
    return any(flavor.node_labels.get(k) in values for k, values in SPOT_LABELS.items())


def is_serving(wl: Workload) -> bool:
    if wl.labels.get(WORKLOAD_CLASS) == SERVING:
        return True
    return any(ps.template.labels.get(WORKLOAD_CLASS) == SERVING for ps in wl.pod_sets)


def serving_block(
    wl: Workload,
    cq: ClusterQueue,
    flavors: Mapping[str, ResourceFlavor],
) -> str | None:
    """Why a serving workload may not be admitted in ``cq`` (None when it may, or serves not)."""
    if not is_serving(wl):
        return None
    requested = {r for ps in wl.pod_sets for r, q in ps.template.requests.items() if q}
    for group in cq.resource_groups:
        if not requested.intersection(group.covered_resources):
            continue
        names = [f.name for f in group.flavors]
        spot = [n for n in names if n in flavors and is_spot(flavors[n])]
        if spot and len(spot) == len(names):
            return (
                f"serving workloads are not admitted to spot flavor(s) {', '.join(spot)} without an "
                f"on-demand fallback in ClusterQueue {cq.name}"
            )
    return None
