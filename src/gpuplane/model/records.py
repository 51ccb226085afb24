"""What gpuplane records on API objects and reads back: an admission's placement, a last checkpoint.

The placement record (:data:`~gpuplane.model.labels.PLACEMENT_ANNOTATION` on a Workload) keeps the
devices planned for every pod, so the devices bound are the devices planned, also across a
controller restart. It is JSON, one ``[node, devices]`` pair per pod, by pod set:
``{"main": [["n1", "0,1"], ...]}``; ``devices`` is the pod's devices annotation (comma-separated
grants), empty for a pod without devices. A pod with ResourceClaims has a third element, the devices
planned for each of its pod claims as ``[request, driver, pool, device]``:
``["n1", "", {"gpu": [["gpus", "gpu.example.com", "n1", "gpu-0"]]}]``, so that the claims are
allocated the devices planned (:func:`recorded_claims`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from gpuplane.model import labels as keys
from gpuplane.model.dra import AllocatedDevice
from gpuplane.model.fields import lenient_timestamp

# Each pod claim's planned devices: (pod claim name, its devices).
ClaimPlan = tuple[tuple[str, tuple[AllocatedDevice, ...]], ...]


def placement_record(pods: Mapping[str, Sequence[tuple[str, str] | tuple[str, str, ClaimPlan]]]) -> str:
    """The placement record of ``(node, devices)`` per pod, by pod set; ``(node, devices, claims)``
    for a pod whose claims have planned devices."""
    value = {name: [_slot(*slot) for slot in slots] for name, slots in pods.items()}
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _slot(node: str, devices: str, claims: ClaimPlan = ()) -> list[object]:
    if not claims:
        return [node, devices]
    planned = {name: [[d.request, d.driver, d.pool, d.device] for d in got] for name, got in claims}
    return [node, devices, planned]


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
            if not (
                isinstance(pod, list) and len(pod) in (2, 3) and all(isinstance(x, str) for x in pod[:2])
            ):
                return None
            slots.append((pod[0], pod[1]))
        out[str(name)] = slots
    return out


def recorded_claims(text: str | None) -> dict[str, list[tuple[str, dict[str, tuple[AllocatedDevice, ...]]]]]:
    """Per pod set, each pod's node and its pod claims' planned devices, for the pods that have
    any, as :func:`placement_record` wrote them; empty for no text or text that is not such a record
    (an entry that is not well-formed is left out)."""
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return {}
    if not isinstance(value, dict):
        return {}
    out: dict[str, list[tuple[str, dict[str, tuple[AllocatedDevice, ...]]]]] = {}
    for name, pods in value.items():
        for pod in pods if isinstance(pods, list) else ():
            if (
                isinstance(pod, list)
                and len(pod) == 3
                and isinstance(pod[0], str)
                and isinstance(pod[2], dict)
            ):
                claims = {str(c): _devices(got) for c, got in pod[2].items()}
                if all(v is not None for v in claims.values()):
                    out.setdefault(str(name), []).append((pod[0], {c: v for c, v in claims.items() if v}))
    return out


def _devices(raw: object) -> tuple[AllocatedDevice, ...] | None:
    if not isinstance(raw, list):
        return None
    got = []
    for item in raw:
        if not (isinstance(item, list) and len(item) == 4 and all(isinstance(x, str) for x in item)):
            return None
        got.append(AllocatedDevice(*item))
    return tuple(got)


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
