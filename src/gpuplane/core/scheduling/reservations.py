"""Kueue's admission checks in the cycle: quota reserved while a workload's checks are pending,
admitted once they are all Ready and the gang has a place; Retry and Rejected end a reservation
(the workload is requeued, or deactivated)."""

from __future__ import annotations

from gpuplane.core.check_gate import CheckGate, Verdict
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.gangs import GangPlacement, PlacementFailure
from gpuplane.core.plan import AdmissionDecision, PodPlacement, PodSetDecision
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.scheduling.placer import NodePlacer
from gpuplane.core.scheduling.queue_manager import QueueManager
from gpuplane.core.scheduling.state import CycleResult, Ledger, Status
from gpuplane.core.scheduling.waker import Waker
from gpuplane.core.workloads import admitted_usage
from gpuplane.model.admission_checks import CheckState, CheckStatus
from gpuplane.model.objects import Workload


class CheckedReservations:
    """Owns the workloads that hold a reservation from the input while their checks are pending or
    past (``checked``, with their verdict) and those whose reservation a check ends (``leaving``)."""

    def __init__(  # noqa: PLR0913, PLR0917 - the parts a reservation touches, each passed in
        self,
        ledger: Ledger,
        gate: CheckGate,
        placer: NodePlacer,
        queues: QueueManager,
        waker: Waker,
        preemptor: Preemptor,
    ) -> None:
        self.ledger = ledger
        self.tree = ledger.tree
        self.gate = gate
        self.placer = placer
        self.queues = queues
        self.waker = waker
        self.preemptor = preemptor
        self._checked: list[tuple[Workload, Verdict]] = []  # reserved, waiting for or past checks
        self._leaving: list[tuple[Workload, CheckStatus]] = []  # reservations a check ends

    def hold_admitted(self, wl: Workload, now: float) -> None:
        """A workload with an admission in the input holds its quota and, when admitted, its
        nodes; by its checks' verdict it stays, waits for its checks, or is on its way out."""
        verdict, check = self.gate.verdict(wl)
        held = admitted_usage(wl, wl.priority, now)
        if held is None:
            return
        self.tree.add_workload(held)
        if check is not None and verdict in (Verdict.RETRY, Verdict.REJECTED):
            # Like a preemption victim: it holds its quota this cycle, gone the next
            # (and its nodes, if it was admitted and has pods).
            if wl.condition_true("Admitted"):
                self.placer.place_admitted(wl)
            self._leaving.append((wl, check))
        elif verdict == Verdict.NONE:
            self.placer.place_admitted(wl)
        else:
            self._checked.append((wl, verdict))

    def settle(self, result: CycleResult) -> None:
        """Reserved workloads: admit those whose checks are all Ready and that have a place;
        the rest keep their quota, with a note of whether a place exists now."""
        cluster = self.placer.cluster
        for wl, verdict in self._checked:
            placed: GangPlacement | PlacementFailure | None = None
            if cluster is not None and not self.gate.dispatched_elsewhere(self.gate.states_of(wl)):
                owner = wl.key if verdict == Verdict.READY else f"probe:{wl.key}"
                placed = cluster.place(owner, self.placer.admission_gang(wl))
                if verdict != Verdict.READY:
                    cluster.release(owner)
            if verdict == Verdict.READY and not isinstance(placed, PlacementFailure):
                assert wl.admission is not None
                decision = AdmissionDecision(
                    workload=wl.key,
                    cluster_queue=wl.admission.cluster_queue,
                    pod_sets=tuple(
                        PodSetDecision(
                            name=psa.name,
                            count=psa.count,
                            flavors=dict(sorted(psa.flavors.items())),
                            placement=None
                            if placed is None
                            else tuple(
                                PodPlacement(p.node, tuple(g.describe() for g in p.grants), claims=p.claims)
                                for p in placed.pods.get(psa.name, [])
                            ),
                        )
                        for psa in wl.admission.pod_set_assignments
                    ),
                    cycle=self.ledger.cycle_number,
                )
                self.ledger.admitted[wl.key] = decision
                result.admitted.append(decision)
                continue
            if isinstance(placed, PlacementFailure):
                message = f"no place on the nodes yet: {placed.message}"
            elif placed is None:
                message = "waiting for admission checks"
            else:
                message = "waiting for admission checks; the gang has a place on existing nodes"
            self.gate.record_reserved(
                wl, placeable=placed is not None and not isinstance(placed, PlacementFailure), message=message
            )

    def release_leaving(self, result: CycleResult) -> None:
        """After the first cycle, the reservations that a check ended give their quota back."""
        cluster = self.placer.cluster
        for wl, check in self._leaving:
            held = self.tree.admitted.get(wl.key)
            if held is not None:
                self.tree.remove_workload(held)
                # Quota and nodes freed outside an admission or a finish: what this cycle
                # remembered of the workloads it parked no longer holds.
                self.ledger.state_version += 1
                if cluster is not None:
                    cluster.release(wl.key)
                self.waker.wake(held.cluster_queue, held.flavors)
            self._release_by_check(wl, check)
            result.released += 1
        self._leaving = []
        self.preemptor.clear_cache()

    def _release_by_check(self, wl: Workload, check: CheckStatus) -> None:
        """A Retry check requeues the workload, a Rejected one deactivates it; no quota held."""
        message = self.gate.record_eviction(wl, check)
        if check.state == CheckState.REJECTED:
            lq_key = f"{wl.namespace}/{wl.queue_name}" if wl.queue_name else None
            queue = wl.admission.cluster_queue if wl.admission is not None else None
            self.queues.unqueued[wl.key] = (queue, lq_key, Status(Reason.DEACTIVATED, message))
            return
        self.queues.enqueue(wl, self.ledger.now, keep_sorted=True)
        status = self.queues.status
        if wl.key in status:
            status[wl.key] = Status(Reason.QUEUED, message)
