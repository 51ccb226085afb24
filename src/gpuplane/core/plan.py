"""The plan: what one scheduling run decided.

A plan is plain frozen data. Drivers carry it out (the controller binds and evicts,
the simulator advances its clock); the command line prints it (a pod's place says how).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.core.check_gate import CheckEviction, ReservedDecision
from gpuplane.model.dra import AllocatedDevice
from gpuplane.model.records import placement_record


@dataclass(frozen=True, slots=True)
class PodPlacement:
    """Where one group of a pod set's pods goes: a node and its devices."""

    node: str
    devices: tuple[str, ...] = ()
    count: int = 1
    # Each pod claim's devices (Dynamic Resource Allocation): (pod claim name, devices).
    claims: tuple[tuple[str, tuple[AllocatedDevice, ...]], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """One pod's place as ``gpuplane schedule --output json`` prints it: its node, its devices,
        and its claims' devices where it has claims."""
        out: dict[str, Any] = {"node": self.node, "devices": list(self.devices)}
        if self.claims:
            out["claims"] = {name: [d.as_dict() for d in devices] for name, devices in self.claims}
        return out


@dataclass(frozen=True, slots=True)
class PodSetDecision:
    name: str
    count: int
    flavors: Mapping[str, str]
    placement: tuple[PodPlacement, ...] | None = None


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    workload: str
    cluster_queue: str
    pod_sets: tuple[PodSetDecision, ...]
    cycle: int = 1
    # Admission checks still to pass: the workload holds quota (QuotaReserved) but is not
    # admitted until all are Ready. Empty: admitted.
    checks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    workload: str
    cluster_queue: str
    preemptor: str
    reason: str
    cycle: int = 1


@dataclass(frozen=True, slots=True)
class PendingDecision:
    """Why a workload waits, and where it stands.

    ``position`` is 1-based within its ClusterQueue (``None`` when it is not queued
    in one), ``local_position`` within its LocalQueue.
    """

    workload: str
    cluster_queue: str | None
    local_queue: str | None
    position: int | None
    local_position: int | None
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    admitted: tuple[AdmissionDecision, ...] = ()
    preempted: tuple[PreemptionDecision, ...] = ()
    pending: tuple[PendingDecision, ...] = ()
    cycles: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    reserved: tuple[ReservedDecision, ...] = ()  # holding quota, waiting for admission checks
    check_evictions: tuple[CheckEviction, ...] = ()  # reservations a Retry or Rejected check ended


def placement_annotation(decision: AdmissionDecision) -> str | None:
    """The decision's placement as the placement record (:mod:`gpuplane.model.records`) writes it,
    ``None`` when it has none (quota only, or admission checks still to pass)."""
    if decision.checks or any(ps.placement is None for ps in decision.pod_sets):
        return None
    return placement_record(
        {
            ps.name: [
                (p.node, ",".join(p.devices), p.claims) for p in ps.placement or () for _ in range(p.count)
            ]
            for ps in decision.pod_sets
        }
    )
