"""What gpuplane records on API objects and reads back: an admission's placement, a last checkpoint.

The placement record (:data:`~gpuplane.model.labels.PLACEMENT_ANNOTATION` on a Workload) keeps the
devices planned for every pod, so the devices bound are the devices planned, also across a
controller restart. It is JSON, one ``[node, devices]`` pair per pod, by pod set:
``{"main": [["n1", "0,1"], ...]}``; ``devices`` is the pod's devices annotation (comma-separated
grants), empty for a pod without devices.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from gpuplane.model import labels as keys
from gpuplane.model.fields import lenient_timestamp


def placement_record(pods: Mapping[str, Sequence[tuple[str, str]]]) -> str:
    """The placement record of ``(node, devices)`` per pod, by pod set."""
    value = {name: [[node, devices] for node, devices in slots] for name, slots in pods.items()}
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def recorded_placement(text: str | None) -> dict[str, list[tuple[str, str]]] | None:
    """The ``(node, devices)`` of every pod by pod set, as :func:`placement_record` wrote them;
    ``None`` for no text or text that is not such a record."""
    if not text:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    out: dict[str, list[tuple[str, str]]] = {}
    for name, pods in value.items():
        if not isinstance(pods, list):
            return None
        slots = []
        for pod in pods:
            if not (isinstance(pod, list) and len(pod) == 2 and all(isinstance(x, str) for x in pod)):
                return None
            slots.append((pod[0], pod[1]))
        out[str(name)] = slots
    return out


def last_checkpoint(annotations: Mapping[str, str]) -> float | None:
    """When the workload last checkpointed, from its annotations (RFC 3339 or seconds since the
    epoch), if known."""
    text = annotations.get(keys.CHECKPOINT_ANNOTATION)
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return lenient_timestamp(text)
