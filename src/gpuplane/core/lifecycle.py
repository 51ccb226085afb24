"""The life of a workload: its states, the moves allowed between them, and why each move happened.

Every state change of a workload goes through :func:`transition`, which refuses a move that is not
in :data:`TRANSITIONS` and appends ``(state, time, reason, message)`` to the workload's history. The
drivers (controller, simulator) and insight (``why``, ETA, metrics) read states and reasons from here
instead of spelling strings of their own.

::

                      +--checks pending--> QUOTA_RESERVED --checks Ready--+
                      |                        |                          v
    PENDING ----------+------admit-------------|---------------------> ADMITTED (its pods run)
       ^                                       |                          |
       |                    check Retry/Rejected, preempted, evicted      |
       |                                       v                          v
       +--------requeue (its pods are gone)-- EVICTING <-----------------+
       +--------requeue at once (nothing ran, or the driver stopped the pods itself)

    QUOTA_RESERVED, ADMITTED, EVICTING    --job completed--> FINISHED
    every state but FINISHED and DELETED --object deleted--> DELETED

An admitted workload stays ADMITTED while its pods start and run: the core decides admissions
and does not follow pods, so no state says whether they all run yet.

Time is passed in (seconds, the caller's clock); nothing here reads a clock.

:class:`Reason` holds every reason string gpuplane writes or reports, spelled as Kueue spells it
where Kueue has the same reason (QuotaReserved=False reasons, preemption reasons, Evicted reasons);
the modules that used to define their own string constants keep them as aliases of these members.
:data:`CONDITIONS` says which of the Workload condition types
(:class:`gpuplane.model.conditions.ConditionType`) are True in each state, so a driver writes
conditions from a state rather than by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from gpuplane.model.conditions import ConditionType
from gpuplane.model.objects import INTERRUPTED_REASON


class WorkloadState(StrEnum):
    """Where a workload is in its life (see the diagram in the module docstring)."""

    PENDING = "Pending"  # queued; the reason says why it is not admitted yet
    QUOTA_RESERVED = "QuotaReserved"  # quota and placement held; admission checks not all Ready yet
    ADMITTED = "Admitted"  # quota reserved, every pod placed, every check Ready; its pods start and run
    EVICTING = "Evicting"  # preempted or evicted; its pods are being stopped, its quota still held
    FINISHED = "Finished"  # the job completed (succeeded or failed): terminal
    DELETED = "Deleted"  # the workload object is gone: terminal


class Reason(StrEnum):
    """Why a workload is where it is. Kueue's spellings where Kueue has the reason."""

    # Pending: the queue and its configuration (Kueue's QuotaReserved=False reasons).
    QUEUED = "Queued"
    PENDING = "Pending"
    WAITING_FOR_QUOTA = "WaitingForQuota"
    EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"
    NO_MATCHING_FLAVOR = "NoMatchingFlavor"
    WAITING_FOR_PREEMPTED = "WaitingForPreemptedWorkloads"
    MISCONFIGURED = "Misconfigured"  # no LocalQueue, or no ClusterQueue behind it
    SUSPENDED = "Suspended"  # its queue is stopped or names a missing flavor
    NAMESPACE_MISMATCH = "NamespaceMismatch"
    DEACTIVATED = "Deactivated"  # spec.active is false (also the Evicted reason of a Rejected check)
    # Pending: gang placement (gpuplane's own; Kueue admits on quota alone).
    NO_NODE_ADVERTISES = "NoNodeAdvertisesResource"
    NO_NODE_MATCHES_SELECTOR = "NoNodeMatchesSelector"
    UNTOLERATED_TAINT = "UntoleratedTaint"
    EXCEEDS_CLUSTER = "ExceedsClusterCapacity"
    FRAGMENTED = "Fragmented"
    WAITING_FOR_GANG_CAPACITY = "WaitingForGangCapacity"
    # Pending: a serving workload that would land on spot capacity only (gpuplane's own).
    SPOT_WITHOUT_FALLBACK = "SpotWithoutOnDemandFallback"
    # Admission checks.
    WAITING_FOR_CHECKS = "WaitingForAdmissionChecks"
    ADMISSION_CHECK = "AdmissionCheck"  # Evicted reason: a check asked to retry
    ADMISSION_CHECK_REJECTED = "AdmissionCheckRejected"
    # Admission (Kueue's condition types double as the reasons of their True state).
    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    # Preemption (Kueue's preemption reasons: the Preempted condition's reason).
    IN_CLUSTER_QUEUE = "InClusterQueue"
    IN_COHORT_RECLAMATION = "InCohortReclamation"
    IN_COHORT_FAIR_SHARING = "InCohortFairSharing"
    IN_COHORT_RECLAIM_WHILE_BORROWING = "InCohortReclaimWhileBorrowing"
    # Eviction (the Evicted condition's reasons: Kueue's, then gpuplane's own).
    PREEMPTED = "Preempted"
    PODS_READY_TIMEOUT = "PodsReadyTimeout"
    CLUSTER_QUEUE_STOPPED = "ClusterQueueStopped"
    LOCAL_QUEUE_STOPPED = "LocalQueueStopped"
    INACTIVE_WORKLOAD = "InactiveWorkload"
    NODE_FAILURES = "NodeFailures"
    NODE_INTERRUPTED = INTERRUPTED_REASON  # its spot node is being taken back (model reads it too)
    IDLE_RECLAIMED = "IdleReclaimed"  # the reaper freed an idle interactive session
    # Finished.
    FINISHED = "Finished"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DELETED = "Deleted"
    # Reported by ``why`` for a workload that is neither pending nor admitted in the plan.
    UNKNOWN = "Unknown"


_S = WorkloadState

# The one table of allowed moves. A move not listed here is a bug in the caller.
TRANSITIONS: Mapping[WorkloadState, frozenset[WorkloadState]] = {
    # Admitted by a cycle (straight to ADMITTED, or to QUOTA_RESERVED while admission checks run);
    # the reason may change while it waits (PENDING -> PENDING); withdrawn before admission. A job
    # that never ran cannot complete.
    _S.PENDING: frozenset({_S.PENDING, _S.QUOTA_RESERVED, _S.ADMITTED, _S.DELETED}),
    # Every check Ready; a check asks to retry or rejects (EVICTING while the quota is held, or
    # PENDING at once when nothing was started); the job may finish or be deleted meanwhile.
    _S.QUOTA_RESERVED: frozenset({_S.ADMITTED, _S.EVICTING, _S.PENDING, _S.FINISHED, _S.DELETED}),
    # Preempted, evicted by the reaper, a check or a node failure (EVICTING while its pods are
    # stopped, or straight back to PENDING when there is nothing to wait for: no pods were created
    # yet, or the driver stops the pods itself, as the simulator does); completes.
    _S.ADMITTED: frozenset({_S.EVICTING, _S.PENDING, _S.FINISHED, _S.DELETED}),
    # Once its pods are gone its quota is released and it is requeued; it may also complete or be
    # deleted meanwhile.
    _S.EVICTING: frozenset({_S.PENDING, _S.FINISHED, _S.DELETED}),
    # Terminal.
    _S.FINISHED: frozenset(),
    _S.DELETED: frozenset(),
}

TERMINAL = frozenset(state for state, moves in TRANSITIONS.items() if not moves)

# Which Workload conditions are True in each state; the others a driver writes are False (or absent).
# EVICTING keeps QuotaReserved/Admitted True: Kueue releases the quota only once the pods are gone.
CONDITIONS: Mapping[WorkloadState, frozenset[ConditionType]] = {
    _S.PENDING: frozenset(),
    _S.QUOTA_RESERVED: frozenset({ConditionType.QUOTA_RESERVED}),
    _S.ADMITTED: frozenset({ConditionType.QUOTA_RESERVED, ConditionType.ADMITTED}),
    _S.EVICTING: frozenset({ConditionType.QUOTA_RESERVED, ConditionType.ADMITTED, ConditionType.EVICTED}),
    _S.FINISHED: frozenset({ConditionType.FINISHED}),
    _S.DELETED: frozenset(),
}


class IllegalTransitionError(ValueError):
    """A move that :data:`TRANSITIONS` does not allow: a bug in the caller, not a policy outcome."""


@dataclass(frozen=True, slots=True)
class Step:
    """One entry of a workload's history."""

    state: WorkloadState
    time: float
    reason: Reason
    message: str = ""


@dataclass(slots=True)
class Lifecycle:
    """One workload's current state and the history that led there (oldest first).

    A new lifecycle starts in ``PENDING`` at ``created`` with reason ``Queued``.
    """

    created: float
    history: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.history:
            self.history.append(Step(WorkloadState.PENDING, self.created, Reason.QUEUED))

    @property
    def state(self) -> WorkloadState:
        return self.history[-1].state

    @property
    def reason(self) -> Reason:
        return self.history[-1].reason

    @property
    def since(self) -> float:
        """When the current state was entered (a PENDING -> PENDING reason change keeps it)."""
        since = self.history[-1].time
        for step in reversed(self.history):
            if step.state != self.state:
                break
            since = step.time
        return since

    def transition(self, to: WorkloadState, now: float, reason: Reason, message: str = "") -> Step:
        """Move to ``to`` at ``now`` for ``reason``; see :func:`transition`."""
        return transition(self, to, now, reason, message)


def can_transition(source: WorkloadState, to: WorkloadState) -> bool:
    """Whether the table allows the move ``source -> to``."""
    return to in TRANSITIONS[source]


def transition(
    lifecycle: Lifecycle, to: WorkloadState, now: float, reason: Reason, message: str = ""
) -> Step:
    """Move ``lifecycle`` to ``to`` at ``now`` and record the step.

    Raises :class:`IllegalTransitionError` (and records nothing) when the table forbids the move or
    when ``now`` is earlier than the last recorded step. A move to the current state with the same
    reason and message records nothing and returns the last step, so callers may report the same
    reason every cycle.
    """
    last = lifecycle.history[-1]
    if not can_transition(last.state, to):
        raise IllegalTransitionError(f"a workload cannot move from {last.state} to {to} ({reason})")
    if now < last.time:
        raise IllegalTransitionError(f"time runs backwards: {now} is before the last step at {last.time}")
    if to == last.state and reason == last.reason and message == last.message:
        return last
    step = Step(to, now, reason, message)
    lifecycle.history.append(step)
    return step
