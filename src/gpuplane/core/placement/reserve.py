"""Reserving a pod's planned devices on one node at bind time, or saying what to do instead.

A plan gives every pod of an admitted gang a node and the devices there (``PodPlacement.devices``,
recorded on the Workload). When the pod is bound, the world may have moved on: the node may be
gone, its devices may be held by pods bound since, by someone else, or by other plans not bound
yet. :func:`reserve_devices` rebuilds the node's device inventory as the driver observes it
(:class:`NodeUse`) and answers with the devices to bind (the planned ones while they are free,
else the ones the inventory fits there now) or a :class:`Refusal` saying why there are none.
The driver never picks devices itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from gpuplane.core.placement.devices import (
    DeviceConfig,
    DeviceGrant,
    NodeState,
    PodNeeds,
    node_state,
    pod_needs,
    recorded_grants,
)
from gpuplane.model.errors import InputError
from gpuplane.model.objects import Node, PodTemplate


@dataclass(frozen=True, slots=True)
class PodOnNode:
    """A pod bound to the node, as the driver observes it: its key, its template (``None``: it
    ended and holds no devices), the devices recorded on it, and the key (namespace/name) of
    the Workload it belongs to, if any."""

    key: str
    template: PodTemplate | None
    devices: str | None = None
    workload: str | None = None


@dataclass(frozen=True, slots=True)
class NodeUse:
    """A node and what is in use on it: the pods bound there, and the plans of the admitted
    Workloads there (by Workload key, the devices of each pod planned on this node)."""

    node: Node
    pods: Sequence[PodOnNode] = ()
    plans: Mapping[str, Sequence[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Reservation:
    """The devices to bind the pod with (``devices`` as a devices annotation, ``None``: the pod
    uses none), and whether the planned devices were taken so others were fitted (``replanned``)."""

    devices: str | None
    grants: tuple[DeviceGrant, ...] = ()
    replanned: bool = False


class RefusalReason(StrEnum):
    """Why :func:`reserve_devices` gives a pod no devices on a node."""

    NODE_GONE = "NodeGone"  # the node is not known (any more)
    NO_ROOM = "NoRoom"  # the pod's devices fit nowhere on the node now, the planned ones included
    UNREADABLE = "Unreadable"  # the pod or a pod on the node asks what cannot be read


@dataclass(frozen=True, slots=True)
class Refusal:
    """No devices for the pod on the node, and why; ``replanned``: the planned devices were taken."""

    reason: RefusalReason
    replanned: bool = False


def reserve_devices(  # noqa: PLR0913 - keyword-only: the pod's own Workload and its gang's slots
    pod: PodTemplate,
    planned: str | None,
    on: NodeUse | None,
    config: DeviceConfig,
    *,
    owner: str = "",
    reserved: Iterable[str] = (),
) -> Reservation | Refusal:
    """Reserve the ``planned`` devices (a devices annotation; ``None``: none were recorded) for
    ``pod`` on the node of ``on``, or fit it there again when they are not free.

    Free means held neither by a pod bound on the node, nor by a plan made but not bound yet: the
    plans of the other admitted Workloads (``owner`` is the pod's own), less what their bound pods
    hold, and the ``reserved`` devices (the slots of the pod's own gang still to bind on this
    node). Nothing is kept: the answer is computed from ``on`` alone."""
    if on is None:
        return Refusal(RefusalReason.NODE_GONE)
    replanned = False
    try:
        state = _in_use(on, config, owner, reserved)
        needs = pod_needs(pod, config)
        if not needs.uses_devices:
            return Reservation(None)
        if planned and (kept := recorded_grants(state, planned)) is not None and state.plain_fits(needs):
            return Reservation(planned, tuple(kept))
        replanned = bool(planned)
        grants = state.fit(needs)
    except (InputError, ValueError):
        return Refusal(RefusalReason.UNREADABLE, replanned)
    if grants is None:
        return Refusal(RefusalReason.NO_ROOM, replanned)
    return Reservation(",".join(g.describe() for g in grants), tuple(grants), replanned)


def _in_use(on: NodeUse, config: DeviceConfig, owner: str, reserved: Iterable[str]) -> NodeState:
    """The node's device inventory with what is in use taken: first the devices recorded on the
    pods bound there, then the plans not bound yet (other Workloads' and ``reserved``), last a best
    guess for the pods bound without a record (bound by someone else). A pod that ended holds no
    devices, but it still fills its slot of its Workload's plan."""
    state = node_state(on.node, config)
    unrecorded = []
    bound: dict[str, list[str]] = {}  # Workload key -> devices of its pods bound here
    for pod in on.pods:
        if pod.workload:  # it fills its slot of its Workload's plan, running or ended
            bound.setdefault(pod.workload, []).append(pod.devices or "")
        if pod.template is None:
            continue
        needs = pod_needs(pod.template, config)
        # A pod holds the devices recorded on it, not whichever a fresh fit would pick.
        held = recorded_grants(state, pod.devices) if pod.devices else None
        if held is not None:
            state.take(pod.key, needs, held)
        else:
            unrecorded.append((pod.key, needs))
    plans = {wl: list(slots) for wl, slots in on.plans.items() if wl != owner}
    _hold_unbound_plans(state, plans, bound)
    _hold_unbound_plans(state, {owner: list(reserved)}, {})
    for key, needs in unrecorded:  # bound by someone else: a best guess at their devices
        grants = state.fit(needs)
        if grants is not None:
            state.take(key, needs, grants)
    return state


_NO_NEEDS = PodNeeds({})  # a plan's slot holds its devices only; its pod's other requests are not known


def _hold_unbound_plans(
    state: NodeState, plans: Mapping[str, list[str]], bound: Mapping[str, list[str]]
) -> None:
    """Take on ``state`` the devices of the planned slots (by Workload key, the devices of each of
    its pods planned on this node) that no pod of that Workload fills yet. ``bound``: the devices
    recorded on the Workloads' pods bound there, by Workload key; each fills its own slot, or else
    any one of its Workload's (its devices, chosen again at bind time, are taken already)."""
    for wl, planned in plans.items():
        slots = list(planned)
        for devices in bound.get(wl, []):
            if slots:
                slots.remove(devices if devices in slots else slots[0])
        for devices in slots:
            grants = recorded_grants(state, devices) if devices else None
            if grants is not None:  # None: a planned device is taken already (the world changed)
                state.take(f"plan:{wl}", _NO_NEEDS, grants)
