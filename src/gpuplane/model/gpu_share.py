"""Shares of one GPU asked for by annotation, and the quota they are charged.

A pod annotated ``gpuplane.dev/gpu-fraction: "0.5"`` (or KAI's ``gpu-fraction``), or with a GPU
memory annotation only, requests no accelerator resource from the kubelet: it shares one GPU that
gpuplane picks. Kueue charges a workload only what its pods request, so such a pod would take no
quota at all. gpuplane charges it under its own resource, :data:`FRACTION_RESOURCE`, in
thousandths of a GPU (base unit ``1m``, so ``"0.5"``, ``"500m"`` and a quota of ``"4"`` mean what
they say). A ClusterQueue must cover that resource, in the resource group and flavors of its GPUs,
to admit fractional work; a queue that does not cover it leaves the workload pending with Kueue's
reason (``resource gpuplane.dev/gpu-fraction unavailable in ClusterQueue``), as for any other
resource it does not cover. This is the shape of Kueue's own answer to sub-device accounting
(resource transformations into credits or accelerator memory): a separate resource, charged by
what was asked, that the queue states a quota for.

The charge per pod is the placement's share (see ``gpuplane.core.placement.devices.pod_needs``): the
fraction rounded up to a thousandth, never 0; a memory-only request takes the smallest share,
``1m``; a fraction that cannot be read is charged a whole GPU (placement refuses the pod anyway).
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction

from gpuplane.model import labels as keys
from gpuplane.model.quantity import QuantityError, parse_quantity

FRACTION_RESOURCE = keys.GPU_FRACTION_RESOURCE
MILLI = 1000


def fraction_milli(
    annotations: Mapping[str, str], names: tuple[str, ...] = keys.GPU_FRACTION_ANNOTATIONS
) -> int:
    """The share of one GPU the first of ``names`` present asks for, in thousandths rounded up
    (never 0); 0 when none is present. Raises ``ValueError`` for a value outside (0, 1]."""
    for key in names:
        if key in annotations:
            try:
                value = parse_quantity(annotations[key])
            except QuantityError:
                value = Fraction(-1)
            if not 0 < value <= 1:
                raise ValueError(f"annotation {key} must be a fraction in (0, 1], got {annotations[key]!r}")
            return max(1, -(-value.numerator * MILLI // value.denominator))  # ceiling: never 0
    return 0


def charged_milli(annotations: Mapping[str, str]) -> int:
    """Thousandths of a GPU one pod with ``annotations`` is charged under :data:`FRACTION_RESOURCE`
    (0 for a pod that asks for no share)."""
    try:
        milli = fraction_milli(annotations)
    except ValueError:
        return MILLI
    if milli:
        return milli
    return 1 if any(key in annotations for key in keys.GPU_MEMORY_ANNOTATIONS) else 0


def quota_requests(requests: Mapping[str, int], annotations: Mapping[str, str]) -> Mapping[str, int]:
    """What one pod is charged against quota: its requests, plus its GPU share under
    :data:`FRACTION_RESOURCE` (a request the pod states for that resource itself is kept).
    Returns ``requests`` itself when nothing is added."""
    if not annotations or FRACTION_RESOURCE in requests:
        return requests
    milli = charged_milli(annotations)
    if not milli:
        return requests
    return {**requests, FRACTION_RESOURCE: milli}
