"""Queues: one per ClusterQueue, ordered by priority and queue time; their heads, parked
workloads (BestEffortFIFO), and the events a driver feeds in between cycles (submit, finish, evict,
withdraw, capacity changes, the clock)."""

from __future__ import annotations

from gpuplane.core.flavors import (
    could_take_flavor,
    quota_requests_per_pod_set,
)
from gpuplane.core.gang import GangPodSet
from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import (
    PendingDecision,
)
from gpuplane.core.quota import (
    CohortNode,
    FlavorResource,
)
from gpuplane.core.scheduling.state import (
    CycleResult,
    Kind,
    SchedulerState,
    Status,
)
from gpuplane.core.workloads import PendingWorkload, queue_position
from gpuplane.model.objects import Workload

PLAIN_REMEMBERED = 4096  # workloads x flavors whose plain gang is remembered (see Queues._plain_gang)


class Queues(SchedulerState):
    """The ClusterQueues' queues and what changes them outside a cycle."""

    def advance(self, now: float) -> None:
        """Move the scheduler's clock (time is always passed in, never read)."""
        if now != self.now and self.config.min_runtime_seconds > 0:
            # Only the minimum-runtime protection makes a nomination's outcome depend on the
            # clock (who may be preempted); otherwise a new instant alone changes nothing.
            self.state_version += 1
        self.now = now
        self.preemptor.now = now

    def capacity_changed(self, freed: bool) -> None:
        """A driver changed the nodes outside a cycle (a node failed, or came back: ``freed``).

        Nothing remembered about the old capacity is reused; when capacity was freed, every
        parked workload gets another look, as after a finish.
        """
        self.state_version += 1
        if freed:
            self.parked.clear()
            for name in self.cursor:
                self.cursor[name] = 0

    def submit(self, wl: Workload) -> None:
        """A new pending workload arrives and is queued by its LocalQueue."""
        self.workloads[wl.key] = wl
        self._enqueue(wl, wl.queue_order_timestamp, keep_sorted=True)

    def finish(self, key: str) -> bool:
        """An admitted workload completed: free its quota and devices (idempotent)."""
        held = self.tree.admitted.get(key)
        if held is None:
            return False
        self.tree.remove_workload(held)
        self._bump_generation(held.cluster_queue)
        self.state_version += 1
        if self.cluster is not None:
            self.cluster.release(key)
        self.admitted.pop(key, None)
        self.preemptor.clear_cache()
        self._unpark_cohort(held.cluster_queue, held.flavors, settled=True)
        return True

    def evict(self, key: str, why: str) -> bool:
        """Evict an admitted workload outside preemption (reaper, node failure) and requeue it."""
        held = self.tree.admitted.get(key)
        if held is None or not self.finish(key):
            return False
        wl = self.workloads.get(key)
        if wl is not None and wl.queue_name:
            self._sequence += 1
            self._enqueue(wl, self.now, keep_sorted=True)
            self.status[key] = Status(Reason.QUEUED, f"evicted: {why}; requeued")
        return True

    def withdraw(self, key: str) -> bool:
        """A pending workload was deleted before admission."""
        for queue in self.queues.values():
            for i, pending in enumerate(queue):
                if pending.key == key:
                    del queue[i]
                    name = pending.cluster_queue
                    if i < self.cursor[name]:
                        self.cursor[name] -= 1
                    self.parked.discard(key)
                    self.status.pop(key, None)
                    self.scan.pop(key, None)
                    self._shapes.pop(key, None)
                    self._eligible.pop(key, None)
                    return True
        return self.unqueued.pop(key, None) is not None

    def pending_count(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def _enqueue(self, wl: Workload, timestamp: float, keep_sorted: bool = False) -> None:
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
        self._sequence += 1
        pending = PendingWorkload(wl, lq.cluster_queue, lq_key, wl.priority, timestamp, self._sequence)
        if keep_sorted:
            self._insert(pending)
        else:
            self.queues[lq.cluster_queue].append(pending)
        self.status[wl.key] = Status(Reason.QUEUED, "")

    def _insert(self, pending: PendingWorkload) -> None:
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

    def heads(self) -> list[PendingWorkload]:
        out = []
        preemptor_of, parked, cursor = self.preemptor_of, self.parked, self.cursor
        tree_queues = self.tree.queues
        for name, queue in self.queues.items():
            if not queue:
                continue
            waiting = preemptor_of.get(name) if preemptor_of else None
            if waiting is not None:
                # A workload that evicted victims last cycle heads its queue now, so the
                # capacity it freed is not taken by others first (no preemption ping-pong).
                found = next((p for p in queue if p.key == waiting), None)
                if found is not None:
                    out.append(found)
                    continue
            if tree_queues[name].spec.queueing_strategy == "StrictFIFO":
                out.append(queue[0])
                continue
            i = cursor[name]
            size = len(queue)
            while i < size and queue[i].key in parked:
                i += 1
            cursor[name] = i
            if i < size:
                out.append(queue[i])
        return out

    def _park(self, pending: PendingWorkload, result: CycleResult) -> None:
        if self.tree.queues[pending.cluster_queue].spec.queueing_strategy == "StrictFIFO":
            return
        if pending.key not in self.parked:
            self.parked.park(pending, self._kind(pending))
            result.parked += 1

    def _kind(self, pending: PendingWorkload) -> Kind | None:
        """What a settled wake reads of a workload being parked (see :class:`Parked`): its shape,
        whether its reason is room on the nodes, and the flavors it could be assigned; None
        where the wake must look at the workload itself (no shape, or another reason)."""
        for_room = self._parked_for_room(pending)
        if for_room is None:
            return None
        shape = self._shape(pending)
        if shape is None:
            return None
        return (shape, for_room, self._eligible_flavors(pending))

    def _parked_for_room(self, pending: PendingWorkload) -> bool | None:
        """Whether ``pending`` waits for room on the nodes (True) or for quota (False), by its last
        reason; None for any other reason, or none: the wake's bounds say nothing then."""
        status = self.status.get(pending.key)
        if status is None:
            return None
        if status.reason in (Reason.FRAGMENTED, Reason.WAITING_FOR_GANG_CAPACITY):
            return True
        return False if status.reason == Reason.WAITING_FOR_QUOTA else None

    def _unpark_cohort(
        self, cq_name: str, freed: frozenset[FlavorResource] | None = None, *, settled: bool = False
    ) -> None:
        """Capacity was freed in ``cq_name``'s cohort: parked workloads get another look.

        With ``freed`` (the flavors the leaving workload held), only the parked workloads that
        could use one of those flavors are woken. Quota is kept per flavor and resource, and a
        flavor's nodes host only that flavor's pods, so room freed in one flavor cannot admit
        a workload no other flavor's room could: waking the others would only park them again
        with the same reason, at a nomination each. Fair sharing orders by a share across every
        flavor, so there every parked workload is woken, as Kueue does for the whole cohort.

        With ``settled`` (a finish between cycles: the quota tree and the nodes hold admitted
        work only), a workload parked for quota or for room on the nodes is woken only if the
        bounds leave it a chance on one of the freed flavors (:meth:`_still_short`): the quota
        could take it (:func:`could_take_flavor`, every possible victim gone), and, where its
        quota fits there without preempting, the free whole GPUs of the flavor's nodes could hold
        its pods (:meth:`Cluster.surely_no_room`). A release that leaves it short cannot let it
        in: waking it would park it again after a nomination (it keeps the reason and message
        of its last one, as a workload Kueue left inadmissible does). This is the index by size:
        a release wakes the parked work it could let in.
        """
        node = self.tree.queues.get(cq_name)
        if node is None:
            return
        root = node.root()
        names = {q.name for q in root.subtree_queues()} if isinstance(root, CohortNode) else {cq_name}
        names_freed = None if freed is None or self.config.fair_sharing else frozenset(f for f, _ in freed)
        parked = self.parked
        # What the bounds said per kind of parked workload: the tree and nodes stay as they are
        # while this loop runs, and a long backlog holds few kinds.
        verdicts: dict[tuple[int, bool, str], bool] = {}
        cursor = self.cursor
        for name in names:
            # The earliest entry woken in the queue: the heads are looked for from there (the
            # entries before it stay parked).
            first: int | None = None
            if parked and settled and names_freed is not None:
                woken = self._wake_by_kind(name, names_freed, verdicts)
                if woken:  # the queue is sorted by the key: the one of lowest key comes first
                    earliest = min(woken, key=PendingWorkload.sort_key)
                    first = queue_position(self.queues[name], earliest)
            elif parked:
                first = self._wake_each(name, names_freed, settled, verdicts)
            if first is not None and name in cursor:
                cursor[name] = min(cursor[name], first)

    def _wake_each(
        self,
        name: str,
        freed: frozenset[str] | None,
        settled: bool,
        verdicts: dict[tuple[int, bool, str], bool],
    ) -> int | None:
        """The wake of ClusterQueue ``name``'s parked workloads one by one, in queue order (see
        :meth:`_unpark_cohort`): with ``freed``, those that could use a freed flavor (and, when
        ``settled``, that the bounds leave a chance); without, all. Returns the position of the
        first woken, if any."""
        parked, eligible = self.parked, self._eligible
        first = None
        for i, pending in enumerate(self.queues.get(name, ())):
            key = pending.key
            if key not in parked:
                continue
            if freed is not None:
                # _eligible_flavors, its cache read inline (this loop visits the backlog).
                known = eligible.get(key)
                if known is not None and known[0] is pending.workload and known[1] == name:
                    flavors = known[2]
                else:
                    flavors = self._eligible_flavors(pending)
                if freed.isdisjoint(flavors):
                    continue
                if settled and self._still_short(pending, freed & flavors, verdicts):
                    continue
            parked.discard(key)
            if first is None:
                first = i
        return first

    def _wake_by_kind(
        self, name: str, freed: frozenset[str], verdicts: dict[tuple[int, bool, str], bool]
    ) -> list[PendingWorkload]:
        """The settled wake of ClusterQueue ``name``'s parked workloads (see
        :meth:`_unpark_cohort`), a kind at a time: every workload of a kind that could use a
        freed flavor and that the bounds leave a chance is woken, the others of the kind stay;
        those filed loose are looked at one by one, as :meth:`_still_short` does. Returns the
        woken."""
        parked = self.parked
        woken: list[PendingWorkload] = []
        for (shape, for_room, flavors), members in parked.kinds.get(name, {}).items():
            usable = freed & flavors
            if not usable:
                continue
            for flavor in usable:
                known = verdicts.get((shape, for_room, flavor))
                if known is None:
                    anyone = next(iter(members.values()))
                    known = self._could_admit_on(anyone, flavor, for_room)
                    verdicts[(shape, for_room, flavor)] = known
                if known:
                    woken += members.values()
                    break
        for pending in parked.loose.get(name, {}).values():
            flavors = self._eligible_flavors(pending)
            if not freed.isdisjoint(flavors) and not self._still_short(pending, freed & flavors, verdicts):
                woken.append(pending)
        for pending in woken:
            parked.discard(pending.key)
        return woken

    def _still_short(
        self, pending: PendingWorkload, freed: frozenset[str], verdicts: dict[tuple[int, bool, str], bool]
    ) -> bool:
        """Whether ``pending``, parked for quota or for room on the nodes, still cannot be admitted
        on any of the ``freed`` flavors (see :meth:`_unpark_cohort`). ``verdicts`` keeps, for one
        state of the quota tree and the nodes, the answer per shape (what a nomination reads of
        a workload, :meth:`_shape`, and so all the bounds read), last reason and flavor."""
        for_room = self._parked_for_room(pending)
        if for_room is None:
            return False
        shape = self._shape(pending)
        for flavor in freed:
            if shape is None:
                if self._could_admit_on(pending, flavor, for_room):
                    return False
                continue
            known = verdicts.get((shape, for_room, flavor))
            if known is None:
                known = verdicts[(shape, for_room, flavor)] = self._could_admit_on(pending, flavor, for_room)
            if known:
                return False
        return True

    def _could_admit_on(self, pending: PendingWorkload, flavor: str, for_room: bool) -> bool:
        """Whether the bounds leave ``pending`` a chance on ``flavor`` (see :meth:`_still_short`)."""
        if self._no_room_without_preemption(pending, flavor):
            return False
        cq = self.tree.queues[pending.cluster_queue]
        return for_room or could_take_flavor(pending, cq, flavor, self.preemptor, self.config)

    def _no_room_without_preemption(self, pending: PendingWorkload, flavor_name: str) -> bool:
        """Whether ``pending`` would get ``flavor_name`` without preempting (every resource it
        asks is in the flavor's resource group and fits the free quota) and yet the flavor's
        nodes surely have no place for its pods (:meth:`Cluster.surely_no_room`). False wherever
        that cannot be told cheaply (see :meth:`_plain_gang`)."""
        gang = self._plain_gang(pending, flavor_name)
        return gang is not None and self.cluster is not None and self.cluster.surely_no_room(gang)

    def _plain_gang(self, pending: PendingWorkload, flavor_name: str) -> GangPodSet | None:
        """``pending``'s one pod set on ``flavor_name``, where its quota there fits without
        preempting; None for several pod sets, partial admission, admission checks on the flavor
        (they may bring the place), or quota that would need a preemption search (its victims'
        devices would count). What does not depend on usage is remembered per workload and
        flavor, for the same workload, queue spec and flavor objects (a wake asks again at every
        completion while the workload stays parked)."""
        cq = self.tree.queues[pending.cluster_queue]
        flavor = self.flavors.get(flavor_name)
        memo = (pending.key, flavor_name)
        known = self._plain.get(memo)
        wl = pending.workload
        if known is None or known[0] is not wl or known[1] is not cq.spec or known[2] is not flavor:
            if len(self._plain) >= PLAIN_REMEMBERED:
                self._plain.clear()
            known = self._plain[memo] = (wl, cq.spec, flavor, *self._plain_parts(pending, flavor_name))
        gang, asked = known[3], known[4]
        if gang is None or any(value > cq.available(fr) for fr, value in asked):
            return None
        return gang

    def _plain_parts(
        self, pending: PendingWorkload, flavor_name: str
    ) -> tuple[GangPodSet | None, tuple[tuple[FlavorResource, int], ...]]:
        """:meth:`_plain_gang` less the free-quota test: the pod set on the flavor (None where it
        cannot be told cheaply) and what it asks of each of the flavor's resources in quota."""
        flavor = self.flavors.get(flavor_name)
        pod_sets = pending.workload.pod_sets
        if flavor is None or len(pod_sets) != 1 or pod_sets[0].min_count is not None:
            return None, ()
        (ps,) = pod_sets
        cq = self.tree.queues[pending.cluster_queue]
        if self.gate.required(cq.spec, (flavor_name,)):
            return None, ()
        (requests,) = quota_requests_per_pod_set(pending, cq, [ps.count])
        asked: list[tuple[FlavorResource, int]] = []
        for res, value in requests.items():
            group = cq.group_for(res)
            if group is None:
                continue
            if not any(fq.name == flavor_name for fq in group.flavors):
                return None, ()
            asked.append(((flavor_name, res), value))
        gang = GangPodSet(
            name=ps.name,
            count=ps.count,
            needs=self._needs.of(ps.template),
            template=ps.template,
            flavor=flavor,
            required_level=ps.required_topology,
            preferred_level=ps.preferred_topology,
        )
        return gang, tuple(asked)

    def _eligible_flavors(self, pending: PendingWorkload) -> frozenset[str]:
        """Every flavor the workload could be assigned in its ClusterQueue: in the resource group of
        a resource it requests, tolerated, and matching its node selector and affinity."""
        cached = self._eligible.get(pending.key)
        if cached is not None and cached[0] is pending.workload and cached[1] == pending.cluster_queue:
            return cached[2]
        cq = self.tree.queues[pending.cluster_queue]
        names: set[str] = set()
        for ps in pending.workload.pod_sets:
            template = ps.template
            for res in template.quota_requests:
                group = cq.group_for(res)
                if group is None:
                    continue
                for fq in group.flavors:
                    flavor = self.flavors.get(fq.name)
                    if flavor is not None and self._eligibility.why_not(fq.name, flavor, template) is None:
                        names.add(fq.name)
        out = frozenset(names)
        self._eligible[pending.key] = (pending.workload, pending.cluster_queue, out)
        return out

    def pending_decisions(self) -> list[PendingDecision]:
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
