"""All-or-nothing placement of a workload's pods onto nodes and devices.

:meth:`PlacementState.place` finds a node and devices for every pod of a gang, or none: a gang is never
placed partly. The nodes a pod may use are its pod set's eligible nodes
(:mod:`~gpuplane.core.placement.eligibility`). With a required topology level
(``kueue.x-k8s.io/podset-required-topology``) the gang lands in one domain of that level, the
smallest that holds it (:mod:`~gpuplane.core.placement.topology_domains`); a preferred level is
tried first and dropped if no domain holds the gang.

Nodes for each pod are tried in the order of :mod:`~gpuplane.core.placement.node_order`: ranked
by the placement engine (:mod:`gpuplane.core.placement.engine`) with a profile, gpuplane's own
policy by default (the one that beats FGD, :data:`~gpuplane.core.placement.profiles.DEFAULT_PROFILE`),
over the engine's GPU array of the exclusive GPUs (:class:`~gpuplane.core.placement.node_holdings.GpuRows`).
Inside the node the device inventory chooses the devices (a fraction shares the fullest GPU that
still holds it, whole GPUs are the lowest-index free ones): the learned workload of a small cluster
is too narrow for the policy's own GPU choice, which would spread fractions over GPUs that
whole-GPU pods need.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import replace

from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement import engine
from gpuplane.core.placement.devices import DeviceConfig, DeviceGrant, NodeState, PodNeeds, recorded_grants
from gpuplane.core.placement.dra_alloc import ClaimResult, DraAllocator, DraError
from gpuplane.core.placement.dra_inventory import DraInventory, Released
from gpuplane.core.placement.eligibility import EligibleNodes
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet, PlacementFailure, PodPlace
from gpuplane.core.placement.gpu_arrays import GpuRequest
from gpuplane.core.placement.node_holdings import Held, NodeHoldings
from gpuplane.core.placement.node_order import NodeOrder
from gpuplane.core.placement.node_scores import NodeScores
from gpuplane.core.placement.profiles import DEFAULT_PROFILE
from gpuplane.model.dra import AllocatedDevice, DraObjects
from gpuplane.model.objects import Node

ClaimDevices = tuple[AllocatedDevice, ...]  # the devices of one claim


class PlacementState:
    """Mutable placement state for one scheduling call: a composition of its parts.

    Owns no state of its own beyond the parts: :class:`NodeHoldings` (node states, what each owner
    holds, the free-device indexes, the engine's GPU array, the topology domains),
    :class:`EligibleNodes` (eligible-node lists and capacity), :class:`NodeScores` (the learned
    profile and the scores) and :class:`NodeOrder` (the order candidates are tried in)."""

    def __init__(
        self,
        nodes: Iterable[Node],
        config: DeviceConfig | None = None,
        profile: str | None = DEFAULT_PROFILE,
        dra: DraObjects | None = None,
    ) -> None:
        """``profile`` names the engine's profile; ``None`` keeps the inventory's tightest-first
        order alone (no scoring). An unknown name raises ``KeyError``. ``dra``: the published
        devices and claims of Dynamic Resource Allocation, allocated beside the node's devices."""
        self.config = config or DeviceConfig()
        NodeScores.check(profile)
        nodes = list(nodes)
        self.dra = DraAllocator(dra, DraInventory(dra, nodes)) if dra else None
        self._holdings = holdings = NodeHoldings(nodes, self.config)
        self._eligibility = EligibleNodes(holdings.nodes, self.config)
        self._scores = NodeScores(holdings.rows, profile)
        self._order = NodeOrder(holdings, self._eligibility, self._scores)

    @property
    def nodes(self) -> dict[str, NodeState]:
        """Every node's device state, by name (in name order)."""
        return self._holdings.nodes

    @property
    def owners(self) -> dict[str, list[Held]]:
        """What each owner holds: (node, needs, devices) per pod."""
        return self._holdings.owners

    @property
    def profile_name(self) -> str | None:
        return self._scores.profile_name

    def profile(self) -> engine.Profile | None:
        """The profile for the workload seen so far (rebuilt on a new shape or twice the pods)."""
        return self._scores.profile()

    @property
    def profile_reads(self) -> int:
        """How often a placement asked for the profile so far (:meth:`relearn`)."""
        return self._scores.profile_reads

    def relearn(self, owner: str, pod_sets: Sequence[GangPodSet], read_profile: bool) -> None:
        """What a :meth:`place` of ``pod_sets`` for ``owner`` that failed without taking anything
        leaves behind: the workload learned, and the profile read where that search read it (a
        rebuild happens at the read). A caller that knows the failure already replays it so."""
        self._scores.record(owner, pod_sets)
        if read_profile:
            self._scores.profile()

    def eligible(self, ps: GangPodSet) -> list[NodeState]:
        return self._eligibility.of(ps)[0]

    def eligible_names(self, ps: GangPodSet) -> set[str]:
        return self._eligibility.of(ps)[1]

    def why_not(self, ps: GangPodSet) -> PlacementFailure:
        """The most specific reason no node can ever hold this pod set."""
        return self._eligibility.why_not(ps)

    def node_changed(self, node: Node) -> None:
        """``node`` (same name, same allocatable) has new labels, taints or schedulability: what
        is placed on it stays, and the eligible-node lists and topology indexes are rebuilt."""
        self._holdings.node_changed(node)
        self._eligibility.clear()

    # --- placement ------------------------------------------------------------

    def place(self, owner: str, pod_sets: Sequence[GangPodSet]) -> GangPlacement | PlacementFailure:
        """Place every pod of the gang, or nothing. Takes the devices on success."""
        try:
            return self._place(owner, pod_sets)
        except DraError as problem:
            return PlacementFailure(Reason.MISCONFIGURED, f"cannot allocate devices: {problem}")

    def _place(self, owner: str, pod_sets: Sequence[GangPodSet]) -> GangPlacement | PlacementFailure:
        for ps in pod_sets:
            if ps.claim_problem is not None:
                raise DraError(ps.claim_problem)
            if ps.claims and self.dra is None:
                raise DraError("the cluster publishes no devices (no ResourceSlice, no DeviceClass)")
        self._scores.record(owner, pod_sets)
        eligibility = self._eligibility
        for ps in pod_sets:
            if ps.count and not eligibility.of(ps)[0]:
                return eligibility.why_not(ps)
        placement = GangPlacement()
        level = next((ps.required_level for ps in pod_sets if ps.required_level), None)
        preferred = next((ps.preferred_level for ps in pod_sets if ps.preferred_level), None)
        if level is None and preferred is None and self._too_few_free(pod_sets):
            return self._failure(pod_sets, "")
        for topo, required in ((level, True), (preferred, False)):
            if topo is None:
                continue
            demand = sum(ps.needs.gpu_milli * ps.count for ps in pod_sets)
            for domain in self._holdings.domains.holding(topo, demand):
                if self._place_pods(owner, pod_sets, domain, placement):
                    return placement
            if required:
                return self._failure(pod_sets, f"no {topo} domain holds the whole gang")
        if self._place_pods(owner, pod_sets, None, placement):
            return placement
        return self._failure(pod_sets, "")

    def _place_pods(
        self, owner: str, pod_sets: Sequence[GangPodSet], restrict: set[str] | None, placement: GangPlacement
    ) -> bool:
        holdings = self._holdings
        taken: list[tuple[NodeState, PodNeeds, tuple[DeviceGrant, ...]]] = []
        claimed: list[tuple[int, tuple[ClaimResult, ...]]] = []
        used: set[str] = set()
        order = [0]  # one pod set (the common case): nothing to sort
        if len(pod_sets) > 1:
            order = sorted(range(len(pod_sets)), key=lambda i: -pod_sets[i].needs.gpu_milli)
        result: dict[str, list[PodPlace]] = {ps.name: [] for ps in pod_sets}
        repartitions = 0
        repartition = self.config.mig_repartition
        for i in order:
            ps = pod_sets[i]
            eligible, allowed = self._eligibility.of(ps)
            if restrict is not None:
                # A topology domain is small: walk its members, not every eligible node.
                allowed = allowed & restrict
                eligible = [holdings.nodes[n] for n in sorted(allowed, key=holdings.position.__getitem__)]
            request = self._scores.request(ps.needs)
            for _ in range(ps.count):
                for state in self._tried(ps, request, eligible, allowed, used):
                    grants = state.fit(ps.needs, repartition)
                    if grants is None:
                        continue
                    claims = self._claims_on(owner, ps, state.name)
                    if claims is None:
                        continue
                    if claims:
                        claimed.append((i, claims))
                    holdings.take(owner, state, ps.needs, grants)
                    granted = tuple(grants)
                    taken.append((state, ps.needs, granted))
                    used.add(state.name)
                    result[ps.name].append(PodPlace(state.name, granted, claims))
                    repartitions += sum(1 for g in granted if g.repartition is not None)
                    break
                else:
                    for node, needs, held in reversed(taken):
                        holdings.give_back(owner, node, needs, held)
                    for j, held_claims in reversed(claimed):
                        assert self.dra is not None
                        self.dra.give_back(owner, held_claims, pod_sets[j].claims)
                    return False
        placement.pods = result
        placement.repartitions = repartitions
        holdings.record(owner, ((s.name, n, g) for s, n, g in taken))
        return True

    def _tried(
        self,
        ps: GangPodSet,
        request: GpuRequest | None,
        eligible: list[NodeState],
        allowed: set[str],
        used: set[str],
    ) -> Iterable[NodeState]:
        """The nodes to try for one pod of ``ps``: the node order's candidates; for a pod with
        claims in the allocator's order (:meth:`DraAllocator.order`), read from its buckets of
        nodes by free devices where claims are all the pod's devices."""
        if not ps.claims or self.dra is None:
            return self._order.candidates(ps.needs, request, eligible, allowed, used)
        if not ps.needs.uses_devices:
            return self._dra_candidates(ps, allowed, used)
        by_name = {s.name: s for s in self._order.candidates(ps.needs, request, eligible, allowed, used)}
        return [by_name[n] for n in self.dra.order(by_name, used)]

    def _dra_candidates(self, ps: GangPodSet, allowed: set[str], used: set[str]) -> Iterator[NodeState]:
        """The nodes for a pod whose devices all come from claims, in the allocator's order, read
        lazily from its buckets of nodes by free devices (:meth:`DraAllocator.ordered`)."""
        assert self.dra is not None
        nodes = self._holdings.nodes
        for name in self.dra.ordered(ps.claims, allowed, used):
            yield nodes[name]

    def _claims_on(
        self,
        owner: str,
        ps: GangPodSet,
        node: str,
        planned: Mapping[str, Sequence[ClaimDevices]] | None = None,
    ) -> tuple[ClaimResult, ...] | None:
        """The devices of a pod's claims on ``node``, taken (``()`` without claims), or None; each
        claim's ``planned`` devices first, while one of those options still fits."""
        if not ps.claims:
            return ()
        assert self.dra is not None  # _place refuses claims without a DRA inventory
        needs = ps.claims
        if planned:
            needs = tuple(replace(n, planned=tuple(planned.get(n.pod_claim, ()))) for n in needs)
        return self.dra.allocate(owner, needs, node)

    def _too_few_free(self, pod_sets: Sequence[GangPodSet]) -> bool:
        """Whether a gang of one pod set surely has no place (:meth:`surely_no_room`). Then the
        search is not run, and its outcome (a failure, and nothing taken) is the same; the one
        thing it reads that it may change, the profile learned so far, is read as it would have
        been."""
        if len(pod_sets) != 1 or not self.surely_no_room(pod_sets[0]):
            return False
        if self._scores.request(pod_sets[0].needs) is not None:
            self._scores.profile()  # the search reads it before its first node
        return True

    def surely_no_room(self, ps: GangPodSet) -> bool:
        """Whether the pods of ``ps``, asking whole GPUs, surely have no place now: its eligible
        nodes hold fewer such pods, counting free whole GPUs alone, than it has (a pod takes whole
        GPUs of one node only where all of them are free, see :meth:`NodeState.fit`). False where
        that cannot be told so: other device needs, or time-sliced nodes among the eligible."""
        needs = ps.needs
        whole = needs.whole
        if (
            not whole
            or ps.count <= 0
            or needs.fraction_milli
            or needs.fraction_memory_mib
            or needs.mig
            or needs.shared
        ):
            return False
        allowed = self.eligible_names(ps)
        holdings = self._holdings
        if holdings.sliced and not holdings.sliced.isdisjoint(allowed):
            return False  # a time-sliced node gives whole GPUs as slots
        room, wanted = 0, ps.count
        # Only a node with at least ``whole`` free whole GPUs adds room: under load those are few,
        # and the buckets by free whole GPUs name them, so walk the buckets where they are fewer
        # than the eligible nodes (the same sum, in another order).
        with_room = sum(len(names) for free, names in holdings.buckets.items() if free >= whole)
        free_whole = holdings.free_whole
        walk = self._order.by_free_whole(whole, allowed, set()) if with_room < len(allowed) else allowed
        for name in walk:
            room += free_whole[name] // whole
            if room >= wanted:
                return False
        return True

    def _failure(self, pod_sets: Sequence[GangPodSet], detail: str) -> PlacementFailure:
        demand = sum(ps.needs.gpu_milli * ps.count for ps in pod_sets)
        if self.dra is not None and any(ps.claims for ps in pod_sets) and not demand:
            pods = sum(ps.count for ps in pod_sets)
            why = self.dra.last_miss or "no node has the devices its claims ask for"
            suffix = f" ({detail})" if detail else ""
            return PlacementFailure(
                Reason.WAITING_FOR_GANG_CAPACITY,
                f"no placement holds all {pods} pods with their claims: {why}{suffix}",
            )
        if len(pod_sets) == 1:
            names = self.eligible_names(pod_sets[0])
        else:
            names = set()
            for ps in pod_sets:
                names |= self.eligible_names(ps)
        free_milli = self._holdings.free_milli
        free = sum([free_milli[n] for n in names])
        capacity = self._eligibility.gang_capacity_milli(pod_sets, names)
        pods = sum(ps.count for ps in pod_sets)
        suffix = f" ({detail})" if detail else ""
        if demand > capacity:
            return PlacementFailure(
                Reason.EXCEEDS_CLUSTER,
                f"the gang needs {demand / 1000:g} GPUs; eligible nodes have {capacity / 1000:g}{suffix}",
            )
        if demand and free >= demand:
            return PlacementFailure(
                Reason.FRAGMENTED,
                f"{free / 1000:g} GPUs are free on eligible nodes "
                f"but no placement holds all {pods} pods{suffix}",
            )
        return PlacementFailure(
            Reason.WAITING_FOR_GANG_CAPACITY,
            f"waiting for capacity for all {pods} pods: "
            f"{demand / 1000:g} GPUs needed, {free / 1000:g} free{suffix}",
        )

    # --- holding and releasing --------------------------------------------------

    def without(self, owners: Iterable[str]) -> AbstractContextManager[None]:
        """Simulate that ``owners`` are gone; every device comes back on exit."""
        if self.dra is None:
            return self._holdings.without(owners)
        return self._without_all(list(owners))

    @contextmanager
    def _without_all(self, owners: list[str]) -> Iterator[None]:
        assert self.dra is not None
        inventory = self.dra.inventory
        with ExitStack() as stack:
            stack.enter_context(self._holdings.without(owners))
            released: list[tuple[str, Released]] = [(o, inventory.release(o)) for o in owners]
            try:
                yield
            finally:
                for owner, held in reversed(released):
                    inventory.restore(owner, held)

    def hold(self, owner: str, node: str, needs: PodNeeds, grants: Sequence[DeviceGrant]) -> None:
        """Record a pod already running on ``node`` (from the input)."""
        holdings = self._holdings
        holdings.take(owner, holdings.nodes[node], needs, grants)
        holdings.record(owner, [(node, needs, tuple(grants))])
        request = self._scores.request(needs)
        if request is not None:
            self._scores.learn(request, 1)

    def hold_planned(
        self,
        owner: str,
        pod_sets: Sequence[GangPodSet],
        planned: Mapping[str, Sequence[tuple[str, str]]],
        ended: Mapping[str, int] | None = None,
        planned_claims: Mapping[str, Sequence[tuple[str, Mapping[str, ClaimDevices]]]] | None = None,
    ) -> bool:
        """Hold exactly the ``(node, devices)`` a recorded plan gave each pod of an admitted gang
        (:func:`gpuplane.core.plan.recorded_placement`), less what ``owner``'s bound pods hold
        already, and less ``ended[pod set]`` of the slots no bound pod holds (pods that ended and
        will not run again: their devices are free); all or nothing. A pod's claims get the devices
        the record planned for its pod set on that node (``planned_claims``), else others on the
        node. ``False`` (and nothing taken) when the plan does not match the gang's pod sets or a
        planned device is no longer free: the world changed."""
        self._scores.record(owner, pod_sets)
        holdings = self._holdings
        held = Counter(
            (name, ",".join(g.describe() for g in grants))
            for name, _, grants in holdings.owners.get(owner, [])
        )
        taken: list[tuple[NodeState, PodNeeds, list[DeviceGrant]]] = []
        claimed: list[tuple[GangPodSet, tuple[ClaimResult, ...]]] = []

        def undo() -> bool:
            for claim_ps, claims in reversed(claimed):
                assert self.dra is not None
                self.dra.give_back(owner, claims, claim_ps.claims)
            for back_state, needs, back in reversed(taken):
                holdings.give_back(owner, back_state, needs, back)
            return False

        for ps in pod_sets:
            slots = planned.get(ps.name, ())
            if len(slots) != ps.count:
                return undo()
            spare = (ended or {}).get(ps.name, 0)
            for node, devices in slots:
                if held[(node, devices)] > 0:
                    held[(node, devices)] -= 1
                    continue
                if spare > 0:
                    spare -= 1
                    continue
                state = holdings.nodes.get(node)
                if state is None:
                    return undo()
                grants = recorded_grants(state, devices) if devices else []
                if grants is None or not state.plain_fits(ps.needs):
                    return undo()
                options: dict[str, list[ClaimDevices]] = {}
                for on, plan in (planned_claims or {}).get(ps.name, ()):
                    for name, devices_of in plan.items() if on == node else ():
                        options.setdefault(name, []).append(devices_of)
                got = (
                    self._claims_on(owner, ps, node, options)
                    if self.dra is not None or not ps.claims
                    else None
                )
                if got is None:
                    return undo()
                if got:
                    claimed.append((ps, got))
                holdings.take(owner, state, ps.needs, grants)
                taken.append((state, ps.needs, grants))
        holdings.record(owner, ((s.name, n, tuple(g)) for s, n, g in taken))
        return True

    def release(self, owner: str) -> None:
        """Give back everything ``owner`` holds (idempotent)."""
        self._holdings.release(owner)
        if self.dra is not None:
            self.dra.inventory.release(owner)
