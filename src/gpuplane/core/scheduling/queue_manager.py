"""The ClusterQueues' queues: one per ClusterQueue, ordered by priority and queue time; their heads,
the parked workloads (BestEffortFIFO), the workloads not queued anywhere, and each pending
workload's last reason."""

from __future__ import annotations

from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import PendingDecision
from gpuplane.core.quota import QuotaTree
from gpuplane.core.scheduling.shapes import Shapes
from gpuplane.core.scheduling.state import CycleResult, Kind, Parked, Status
from gpuplane.core.workloads import PendingWorkload, queue_position
from gpuplane.model.objects import ClusterState, Workload


class QueueManager:
    """Owns the pending queues (sorted by :meth:`PendingWorkload.sort_key`), the parked set and
    each queue's cursor (every workload before it is parked), the workload that issued preemptions
    in the last cycle per queue, each pending workload's status, the workloads not queued anywhere,
    and the queueing sequence."""

    def __init__(self, state: ClusterState, tree: QuotaTree, shapes: Shapes) -> None:
        self.state = state
        self.tree = tree
        self.shapes = shapes
        self.queues: dict[str, list[PendingWorkload]] = {name: [] for name in sorted(state.cluster_queues)}
        # The StrictFIFO queues (a queue's strategy is fixed for the scheduler's life): their head
        # is always their first workload, never parked.
        self.strict = frozenset(
            name for name in self.queues if tree.queues[name].spec.queueing_strategy == "StrictFIFO"
        )
        self.parked = Parked()
        # Per queue, every workload before this index is parked (BestEffortFIFO).
        self.cursor: dict[str, int] = dict.fromkeys(self.queues, 0)
        # Per queue, the workload that issued preemptions in the last cycle (drives the next one).
        self.preemptor_of: dict[str, str] = {}
        self.status: dict[str, Status] = {}
        # Workloads not queued anywhere: their ClusterQueue and LocalQueue (if known) and why.
        self.unqueued: dict[str, tuple[str | None, str | None, Status]] = {}
        self.sequence = 0

    def next_sequence(self) -> int:
        self.sequence += 1
        return self.sequence

    def pending_count(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def enqueue(self, wl: Workload, timestamp: float, keep_sorted: bool = False) -> None:
        """Queue ``wl`` by its LocalQueue, or record why it is not queued anywhere."""
        lq_key = f"{wl.namespace}/{wl.queue_name}" if wl.queue_name else None
        if not wl.active:
            self.unqueued[wl.key] = (None, lq_key, Status(Reason.DEACTIVATED, "The workload is deactivated"))
            return
        # Kueue's getQueueBlocker: each broken reference is the workload's own problem only.
        if lq_key is None:
            status = Status(Reason.MISCONFIGURED, "The workload names no LocalQueue")
            self.unqueued[wl.key] = (None, None, status)
            return
        lq = self.state.local_queues.get(lq_key)
        if lq is None:
            msg = f"LocalQueue {wl.queue_name} doesn't exist"
            self.unqueued[wl.key] = (None, lq_key, Status(Reason.MISCONFIGURED, msg))
            return
        if lq.stop_policy != "None":
            msg = f"LocalQueue {wl.queue_name} is inactive (stopPolicy {lq.stop_policy})"
            self.unqueued[wl.key] = (lq.cluster_queue, lq_key, Status(Reason.SUSPENDED, msg))
            return
        if lq.cluster_queue not in self.queues:
            msg = f"ClusterQueue {lq.cluster_queue} doesn't exist"
            self.unqueued[wl.key] = (lq.cluster_queue, lq_key, Status(Reason.MISCONFIGURED, msg))
            return
        self.sequence += 1
        pending = PendingWorkload(wl, lq.cluster_queue, lq_key, wl.priority, timestamp, self.sequence)
        if keep_sorted:
            self.insert(pending)
        else:
            self.queues[lq.cluster_queue].append(pending)
        self.status[wl.key] = Status(Reason.QUEUED, "")

    def insert(self, pending: PendingWorkload) -> None:
        """Put ``pending`` in its place in its (sorted) queue."""
        name = pending.cluster_queue
        queue = self.queues[name]
        key = pending.sort_key()
        lo, hi = 0, len(queue)
        while lo < hi:
            mid = (lo + hi) // 2
            if queue[mid].sort_key() < key:
                lo = mid + 1
            else:
                hi = mid
        queue.insert(lo, pending)
        self.cursor[name] = min(self.cursor[name], lo)

    def withdraw(self, key: str) -> bool:
        """Take a pending workload out of its queue; False when no queue holds it."""
        for queue in self.queues.values():
            for i, pending in enumerate(queue):
                if pending.key == key:
                    del queue[i]
                    name = pending.cluster_queue
                    if i < self.cursor[name]:
                        self.cursor[name] -= 1
                    self.parked.discard(key)
                    self.status.pop(key, None)
                    return True
        return False

    def remove_admitted(self, pending: PendingWorkload) -> None:
        """``pending`` was admitted: it leaves its queue."""
        name = pending.cluster_queue
        queue = self.queues[name]
        index = queue_position(queue, pending)
        del queue[index]
        if index < self.cursor[name]:
            self.cursor[name] -= 1
        self.parked.discard(pending.key)
        self.status.pop(pending.key, None)

    def wake_all(self) -> None:
        """Every parked workload gets another look."""
        self.parked.clear()
        for name in self.cursor:
            self.cursor[name] = 0

    def heads(self) -> list[PendingWorkload]:
        """Each queue's head (see :meth:`_head_of`)."""
        head_of = self._head_of
        return [head for name, queue in self.queues.items() if (head := head_of(name, queue)) is not None]

    def any_head(self) -> bool:
        """Whether :meth:`heads` would find a head, without listing them: asked after every
        cycle that only parked heads (a backlog parks one head per queue per cycle)."""
        head_of = self._head_of
        return any(head_of(name, queue) is not None for name, queue in self.queues.items())

    def _head_of(self, name: str, queue: list[PendingWorkload]) -> PendingWorkload | None:
        """The queue's head: the workload that preempted last cycle, the first of a StrictFIFO
        queue, or the first one not parked (moving the queue's cursor to it); None if none."""
        if not queue:
            return None
        waiting = self.preemptor_of.get(name) if self.preemptor_of else None
        if waiting is not None:
            # A workload that evicted victims last cycle heads its queue now, so the capacity it
            # freed is not taken by others first (no preemption ping-pong).
            found = next((p for p in queue if p.key == waiting), None)
            if found is not None:
                return found
        if name in self.strict:
            return queue[0]
        parked = self.parked
        i = self.cursor[name]
        size = len(queue)
        while i < size and queue[i].key in parked:
            i += 1
        self.cursor[name] = i
        return queue[i] if i < size else None

    def park(self, pending: PendingWorkload, result: CycleResult) -> None:
        """Park ``pending`` until capacity is freed in its cohort (BestEffortFIFO only)."""
        if pending.cluster_queue in self.strict:
            return
        if pending.key not in self.parked:
            self.parked.park(pending, self._kind(pending))
            result.parked += 1

    def _kind(self, pending: PendingWorkload) -> Kind | None:
        """What a settled wake reads of a workload being parked (see :class:`Parked`): its shape,
        whether its reason is room on the nodes, and the flavors it could be assigned; None
        where the wake must look at the workload itself (no shape, or another reason)."""
        for_room = self.parked_for_room(pending)
        if for_room is None:
            return None
        shape = self.shapes.of(pending)
        if shape is None:
            return None
        return (shape, for_room, self.shapes.eligible_flavors(pending))

    def parked_for_room(self, pending: PendingWorkload) -> bool | None:
        """Whether ``pending`` waits for room on the nodes (True) or for quota (False), by its last
        reason; None for any other reason, or none: the wake's bounds say nothing then."""
        status = self.status.get(pending.key)
        if status is None:
            return None
        if status.reason in (Reason.FRAGMENTED, Reason.WAITING_FOR_GANG_CAPACITY):
            return True
        return False if status.reason == Reason.WAITING_FOR_QUOTA else None

    def pending_decisions(self) -> list[PendingDecision]:
        """Every pending workload's place in its queues and its reason, then those not queued."""
        out: list[PendingDecision] = []
        for cq_name, queue in self.queues.items():
            lq_positions: dict[str, int] = {}
            for position, pending in enumerate(queue, start=1):
                lq_name = pending.local_queue
                lq_positions[lq_name] = lq_positions.get(lq_name, 0) + 1
                status = self.status.get(pending.key) or Status(Reason.QUEUED, "")
                message = status.message
                if status.reason == Reason.QUEUED and not message:
                    message = f"queued at position {position} in ClusterQueue {cq_name}; not attempted yet"
                out.append(
                    PendingDecision(
                        workload=pending.key,
                        cluster_queue=cq_name,
                        local_queue=pending.local_queue,
                        position=position,
                        local_position=lq_positions[lq_name],
                        reason=status.reason,
                        message=message,
                    )
                )
        for key in sorted(self.unqueued):
            queue_name, lq_key, status = self.unqueued[key]
            out.append(PendingDecision(key, queue_name, lq_key, None, None, status.reason, status.message))
        return out
