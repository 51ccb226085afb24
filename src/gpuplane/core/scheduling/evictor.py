"""What frees quota and nodes: a preemption's victims (evicted and requeued), a finish, and an
eviction outside preemption (reaper, node failure); each wakes the parked work it may let in."""

from __future__ import annotations

from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.plan import PreemptionDecision
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.quota import AdmittedWorkload
from gpuplane.core.scheduling.queue_manager import QueueManager
from gpuplane.core.scheduling.state import CycleResult, Ledger, Status
from gpuplane.core.scheduling.waker import Waker
from gpuplane.core.victims import Target
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import ClusterState


class Evictor:
    """Takes admitted workloads out of the quota tree and the nodes. Owns no state of its own: it
    records preemptions in the ledger and requeues through the queue manager."""

    def __init__(  # noqa: PLR0913, PLR0917 - the parts an eviction changes, each passed in
        self,
        state: ClusterState,
        ledger: Ledger,
        queues: QueueManager,
        waker: Waker,
        cluster: PlacementState | None,
        preemptor: Preemptor,
    ) -> None:
        self.state = state
        self.ledger = ledger
        self.tree = ledger.tree
        self.queues = queues
        self.waker = waker
        self.cluster = cluster
        self.preemptor = preemptor

    def evict_victim(self, target: Target, preemptor: str, result: CycleResult) -> None:
        """Evict a preemption's victim (chosen by ``preemptor``) and requeue it."""
        ledger = self.ledger
        victim: AdmittedWorkload = target.workload
        decision = PreemptionDecision(
            workload=victim.key,
            cluster_queue=victim.cluster_queue,
            preemptor=preemptor,
            reason=target.reason,
            cycle=ledger.cycle_number,
        )
        if not victim.evicted:
            # An already evicted target is still on its way out: no new preemption.
            result.preempted.append(decision)
            ledger.preempted.append(decision)
        self.tree.remove_workload(victim)
        ledger.bump_generation(victim.cluster_queue)
        ledger.state_version += 1
        if self.cluster is not None:
            self.cluster.release(victim.key)
        ledger.admitted.pop(victim.key, None)
        self.waker.wake(victim.cluster_queue, victim.flavors)
        wl = ledger.workloads.get(victim.key)
        if wl is not None and wl.queue_name:
            evicted_at = ledger.now + ledger.cycle_number * 1e-3
            queues = self.queues
            sequence = queues.next_sequence()
            lq = self.state.local_queues.get(f"{wl.namespace}/{wl.queue_name}")
            if lq is not None and lq.cluster_queue in queues.queues and lq.stop_policy == "None":
                queues.insert(
                    PendingWorkload(wl, lq.cluster_queue, lq.key, victim.priority, evicted_at, sequence)
                )
                queues.status[wl.key] = Status(
                    Reason.QUEUED, f"Preempted by {preemptor} ({target.reason}); requeued"
                )

    def finish(self, key: str) -> bool:
        """An admitted workload completed: free its quota and devices (idempotent)."""
        held = self.tree.admitted.get(key)
        if held is None:
            return False
        self.tree.remove_workload(held)
        self.ledger.bump_generation(held.cluster_queue)
        self.ledger.state_version += 1
        if self.cluster is not None:
            self.cluster.release(key)
        self.ledger.admitted.pop(key, None)
        self.preemptor.clear_cache()
        self.waker.wake(held.cluster_queue, held.flavors, settled=True)
        return True

    def evict(self, key: str, why: str) -> bool:
        """Evict an admitted workload outside preemption (reaper, node failure) and requeue it."""
        held = self.tree.admitted.get(key)
        if held is None or not self.finish(key):
            return False
        wl = self.ledger.workloads.get(key)
        if wl is not None and wl.queue_name:
            self.queues.next_sequence()
            self.queues.enqueue(wl, self.ledger.now, keep_sorted=True)
            self.queues.status[key] = Status(Reason.QUEUED, f"evicted: {why}; requeued")
        return True
