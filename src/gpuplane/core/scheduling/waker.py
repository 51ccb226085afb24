"""Waking parked workloads: when quota or room on the nodes is freed in a cohort, which of the
workloads parked there (BestEffortFIFO) get another look, by the flavors they could use and by
bounds that tell cheaply when the freed capacity still cannot admit them."""

from __future__ import annotations

from gpuplane.core.check_gate import CheckGate
from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import could_take_flavor, quota_requests_per_pod_set
from gpuplane.core.placement.devices import NeedsMemo
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.placement.gangs import GangPodSet
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.quota import CohortNode, FlavorResource, QuotaTree
from gpuplane.core.scheduling.queue_manager import QueueManager
from gpuplane.core.scheduling.shapes import Shapes
from gpuplane.core.scheduling.state import PlainGang
from gpuplane.core.workloads import PendingWorkload, queue_position
from gpuplane.model.objects import ResourceFlavor

PLAIN_REMEMBERED = 4096  # workloads x flavors whose plain gang is remembered (see Waker.plain_gang)


class Waker:
    """Decides which parked workloads a release wakes, and wakes them in the queues. Owns, per
    workload and flavor, the parts of the room bound that do not depend on usage (``plain_gang``),
    with the workload, queue spec and flavor they were read for."""

    def __init__(  # noqa: PLR0913, PLR0917 - the parts a wake reads, each passed in
        self,
        config: SchedulerConfig,
        tree: QuotaTree,
        queues: QueueManager,
        shapes: Shapes,
        cluster: PlacementState | None,
        flavors: dict[str, ResourceFlavor],
        gate: CheckGate,
        preemptor: Preemptor,
        needs: NeedsMemo,
    ) -> None:
        self.config = config
        self.tree = tree
        self.queues = queues
        self.shapes = shapes
        self.cluster = cluster
        self.flavors = flavors
        self.gate = gate
        self.preemptor = preemptor
        self.needs = needs
        self._plain: dict[tuple[str, str], PlainGang] = {}

    def wake(
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
        bounds leave it a chance on one of the freed flavors (:meth:`still_short`): the quota
        could take it (:func:`could_take_flavor`, every possible victim gone), and, where its
        quota fits there without preempting, the free whole GPUs of the flavor's nodes could hold
        its pods (:meth:`PlacementState.surely_no_room`). A release that leaves it short cannot let it
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
        parked = self.queues.parked
        # What the bounds said per kind of parked workload: the tree and nodes stay as they are
        # while this loop runs, and a long backlog holds few kinds.
        verdicts: dict[tuple[int, bool, str], bool] = {}
        cursor = self.queues.cursor
        for name in names:
            # The earliest entry woken in the queue: the heads are looked for from there (the
            # entries before it stay parked).
            first: int | None = None
            if parked and settled and names_freed is not None:
                woken = self._wake_by_kind(name, names_freed, verdicts)
                if woken:  # the queue is sorted by the key: the one of lowest key comes first
                    earliest = min(woken, key=PendingWorkload.sort_key)
                    first = queue_position(self.queues.queues[name], earliest)
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
        :meth:`wake`): with ``freed``, those that could use a freed flavor (and, when
        ``settled``, that the bounds leave a chance); without, all. Returns the position of the
        first woken, if any."""
        parked, eligible = self.queues.parked, self.shapes.eligible
        first = None
        for i, pending in enumerate(self.queues.queues.get(name, ())):
            key = pending.key
            if key not in parked:
                continue
            if freed is not None:
                # _eligible_flavors, its cache read inline (this loop visits the backlog).
                known = eligible.get(key)
                if known is not None and known[0] is pending.workload and known[1] == name:
                    flavors = known[2]
                else:
                    flavors = self.shapes.eligible_flavors(pending)
                if freed.isdisjoint(flavors):
                    continue
                if settled and self.still_short(pending, freed & flavors, verdicts):
                    continue
            parked.discard(key)
            if first is None:
                first = i
        return first

    def _wake_by_kind(
        self, name: str, freed: frozenset[str], verdicts: dict[tuple[int, bool, str], bool]
    ) -> list[PendingWorkload]:
        """The settled wake of ClusterQueue ``name``'s parked workloads (see
        :meth:`wake`), a kind at a time: every workload of a kind that could use a
        freed flavor and that the bounds leave a chance is woken, the others of the kind stay;
        those filed loose are looked at one by one, as :meth:`still_short` does. Returns the
        woken."""
        parked = self.queues.parked
        woken: list[PendingWorkload] = []
        for (shape, for_room, flavors), members in parked.kinds.get(name, {}).items():
            usable = freed & flavors
            if not usable:
                continue
            for flavor in usable:
                known = verdicts.get((shape, for_room, flavor))
                if known is None:
                    anyone = next(iter(members.values()))
                    known = self.could_admit_on(anyone, flavor, for_room)
                    verdicts[(shape, for_room, flavor)] = known
                if known:
                    woken += members.values()
                    break
        for pending in parked.loose.get(name, {}).values():
            flavors = self.shapes.eligible_flavors(pending)
            if not freed.isdisjoint(flavors) and not self.still_short(pending, freed & flavors, verdicts):
                woken.append(pending)
        for pending in woken:
            parked.discard(pending.key)
        return woken

    def still_short(
        self, pending: PendingWorkload, freed: frozenset[str], verdicts: dict[tuple[int, bool, str], bool]
    ) -> bool:
        """Whether ``pending``, parked for quota or for room on the nodes, still cannot be admitted
        on any of the ``freed`` flavors (see :meth:`wake`). ``verdicts`` keeps, for one
        state of the quota tree and the nodes, the answer per shape (what a nomination reads of
        a workload, :meth:`.shapes.Shapes.of`, and so all the bounds read), last reason and flavor."""
        for_room = self.queues.parked_for_room(pending)
        if for_room is None:
            return False
        shape = self.shapes.of(pending)
        for flavor in freed:
            if shape is None:
                if self.could_admit_on(pending, flavor, for_room):
                    return False
                continue
            known = verdicts.get((shape, for_room, flavor))
            if known is None:
                known = verdicts[(shape, for_room, flavor)] = self.could_admit_on(pending, flavor, for_room)
            if known:
                return False
        return True

    def could_admit_on(self, pending: PendingWorkload, flavor: str, for_room: bool) -> bool:
        """Whether the bounds leave ``pending`` a chance on ``flavor`` (see :meth:`still_short`)."""
        if self.no_room_without_preemption(pending, flavor):
            return False
        cq = self.tree.queues[pending.cluster_queue]
        return for_room or could_take_flavor(pending, cq, flavor, self.preemptor, self.config)

    def no_room_without_preemption(self, pending: PendingWorkload, flavor_name: str) -> bool:
        """Whether ``pending`` would get ``flavor_name`` without preempting (every resource it
        asks is in the flavor's resource group and fits the free quota) and yet the flavor's
        nodes surely have no place for its pods (:meth:`PlacementState.surely_no_room`). False wherever
        that cannot be told cheaply (see :meth:`plain_gang`)."""
        gang = self.plain_gang(pending, flavor_name)
        return gang is not None and self.cluster is not None and self.cluster.surely_no_room(gang)

    def plain_gang(self, pending: PendingWorkload, flavor_name: str) -> GangPodSet | None:
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
        """:meth:`plain_gang` less the free-quota test: the pod set on the flavor (None where it
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
            needs=self.needs.of(ps.template),
            template=ps.template,
            flavor=flavor,
            required_level=ps.required_topology,
            preferred_level=ps.preferred_topology,
        )
        return gang, tuple(asked)
