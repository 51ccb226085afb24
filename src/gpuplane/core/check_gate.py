"""Admission checks with Kueue's semantics: quota first, then every check, then admission.

A workload in a ClusterQueue with admission checks goes through two steps::

    pending --quota (and a place, if there is one)--> QuotaReserved, checks Pending
        all checks Ready ----------------------------> Admitted (placed on nodes, when given)
        a check Retry  ------------------------------> quota released, requeued (Evicted: AdmissionCheck)
        a check Rejected ----------------------------> quota released, deactivated

- Which checks apply: every name in ``spec.admissionChecks``; in ``admissionChecksStrategy``
  a rule with ``onFlavors`` applies only when the workload is assigned one of those flavors.
- A ClusterQueue naming a check that does not exist, or whose controller has not marked it
  Active, is inactive (Kueue's ``AdmissionCheckNotFound`` / ``AdmissionCheckInactive``).
- While its checks are pending a workload holds its quota but has no place: a gang that waits
  for capacity to be provisioned must not block nodes it cannot use yet. When all checks are
  Ready it is placed; if the place does not exist yet (nodes still registering), it keeps the
  quota and waits.
- An admitted workload whose check turns Retry (capacity revoked) is evicted the same way.

:class:`CheckGate` is built once per scheduling call from the frozen state; it answers
questions and records outcomes, it never changes the quota tree itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuplane.model.admission_checks import MULTIKUEUE_CONTROLLER, CheckState, CheckStatus
from gpuplane.model.objects import ClusterQueue, ClusterState, Workload


class Verdict(StrEnum):
    """Where a workload that holds quota stands with its checks."""

    NONE = "None"  # no check applies, or already admitted: an ordinary admitted workload
    WAITING = "Waiting"  # quota reserved, some check not Ready yet
    READY = "Ready"  # every check Ready, not admitted yet: place and admit it
    RETRY = "Retry"  # release the quota and requeue
    REJECTED = "Rejected"  # release the quota and deactivate


@dataclass(frozen=True, slots=True)
class CheckEviction:
    """A workload whose reservation a check ended (Retry or Rejected)."""

    workload: str
    cluster_queue: str
    check: str
    state: CheckState
    message: str


@dataclass(frozen=True, slots=True)
class ReservedDecision:
    """A workload that holds quota while its admission checks are not all Ready.

    ``placeable`` says whether the gang has a place on the existing nodes right now (always
    False without nodes); a provisioning check needs no new capacity for a placeable gang.
    """

    workload: str
    cluster_queue: str
    checks: Mapping[str, CheckState]
    placeable: bool
    message: str = ""


@dataclass(slots=True)
class CheckGate:
    """Kueue's admission-check rules over one frozen state."""

    state: ClusterState
    evictions: list[CheckEviction] = field(default_factory=list)
    reserved: dict[str, ReservedDecision] = field(default_factory=dict)

    def required(self, cq: ClusterQueue, flavors: Iterable[str]) -> tuple[str, ...]:
        """Names of the checks that apply to a workload assigned ``flavors`` in ``cq``."""
        chosen = frozenset(flavors)
        return tuple(ref.name for ref in cq.admission_checks if ref.applies_to(chosen))

    def dispatched_elsewhere(self, checks: Iterable[str]) -> bool:
        """Whether one of ``checks`` is a MultiKueue check: the workload runs on a worker cluster,
        so it is admitted here on quota alone and never placed on this cluster's nodes."""
        found = self.state.admission_checks
        return any(
            (c := found.get(name)) is not None and c.controller_name == MULTIKUEUE_CONTROLLER
            for name in checks
        )

    def inactive_reason(self, cq: ClusterQueue) -> str | None:
        for ref in cq.admission_checks:
            check = self.state.admission_checks.get(ref.name)
            if check is None:
                return f"ClusterQueue {cq.name} is inactive: AdmissionCheckNotFound ({ref.name})"
            if not check.usable:
                return f"ClusterQueue {cq.name} is inactive: AdmissionCheckInactive ({ref.name})"
        return None

    def verdict(self, wl: Workload) -> tuple[Verdict, CheckStatus | None]:
        """Where a workload with ``status.admission`` stands; the deciding check with it."""
        admission = wl.admission
        if admission is None:
            return Verdict.NONE, None
        cq = self.state.cluster_queues.get(admission.cluster_queue)
        if cq is None or not cq.admission_checks or wl.evicted:
            # An evicted workload holds its quota until its job has stopped, as any victim does.
            return Verdict.NONE, None
        flavors = {name for psa in admission.pod_set_assignments for name in psa.flavors.values()}
        required = self.required(cq, flavors)
        states = {c.name: c for c in wl.check_states}
        found = [states.get(name) or CheckStatus(name, CheckState.PENDING) for name in required]
        for wanted, verdict in ((CheckState.REJECTED, Verdict.REJECTED), (CheckState.RETRY, Verdict.RETRY)):
            hit = next((c for c in found if c.state == wanted), None)
            if hit is not None:
                return verdict, hit
        if wl.condition_true("Admitted"):
            return Verdict.NONE, None  # a check added after admission does not evict (Kueue)
        waiting = next((c for c in found if c.state != CheckState.READY), None)
        if waiting is not None:
            return Verdict.WAITING, waiting
        return Verdict.READY, None

    def states_of(self, wl: Workload) -> dict[str, CheckState]:
        """The state of each check that applies to a reserved workload (missing: Pending)."""
        assert wl.admission is not None
        cq = self.state.cluster_queues[wl.admission.cluster_queue]
        flavors = {name for psa in wl.admission.pod_set_assignments for name in psa.flavors.values()}
        states = {c.name: c.state for c in wl.check_states}
        return {name: states.get(name, CheckState.PENDING) for name in self.required(cq, flavors)}

    def record_eviction(self, wl: Workload, check: CheckStatus) -> str:
        """Note that ``check`` ended the reservation of ``wl``; returns the status message."""
        assert wl.admission is not None
        self.evictions.append(
            CheckEviction(wl.key, wl.admission.cluster_queue, check.name, check.state, check.message)
        )
        detail = f": {check.message}" if check.message else ""
        if check.state == CheckState.REJECTED:
            return f"admission check {check.name} rejected the workload{detail}; deactivated"
        return f"admission check {check.name} asked to retry{detail}; quota released and requeued"

    def record_reserved(self, wl: Workload, placeable: bool, message: str) -> None:
        assert wl.admission is not None
        self.reserved[wl.key] = ReservedDecision(
            wl.key, wl.admission.cluster_queue, self.states_of(wl), placeable, message
        )
