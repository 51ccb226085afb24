"""A gang as placement sees it (its pod sets and what they need), and where it went or why not."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuplane.core.placement.devices import DeviceGrant, PodNeeds
from gpuplane.core.placement.dra_alloc import ClaimNeed, ClaimResult
from gpuplane.model.objects import PodTemplate, ResourceFlavor


@dataclass(frozen=True, slots=True)
class GangPodSet:
    """One pod set of a gang, as placement needs it."""

    name: str
    count: int
    needs: PodNeeds
    template: PodTemplate
    flavor: ResourceFlavor | None = None
    required_level: str | None = None
    preferred_level: str | None = None
    claims: tuple[ClaimNeed, ...] = ()  # its pods' ResourceClaims (Dynamic Resource Allocation)
    claim_problem: str | None = None  # why its claims cannot be read (a missing claim or template)


@dataclass(frozen=True, slots=True)
class PodPlace:
    """Where one pod went: its node, its devices there, and its claims' devices."""

    node: str
    grants: tuple[DeviceGrant, ...]
    claims: tuple[ClaimResult, ...] = ()


@dataclass(slots=True)
class GangPlacement:
    """Where every pod of every pod set went (in pod set order)."""

    pods: dict[str, list[PodPlace]] = field(default_factory=dict)
    repartitions: int = 0


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    """Why a gang has no place (a :class:`~gpuplane.core.lifecycle.Reason`) and the message."""

    reason: str
    message: str
