"""The gang on the nodes: pods already bound and workloads already admitted hold their devices,
and an entry's gang is placed (or probed, with its victims gone) on the node inventory (the gang
placement's :class:`~gpuplane.core.placement.gang_placement.PlacementState`)."""

from __future__ import annotations

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import Assignment
from gpuplane.core.karpenter import capacity_to_come
from gpuplane.core.placement.devices import NeedsMemo, pod_needs, recorded_grants
from gpuplane.core.placement.dra_alloc import ClaimNeed, DraError, resolve_claims
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet, PlacementFailure
from gpuplane.core.scheduling.state import (
    WORKLOAD_LABEL,
    Entry,
    Ledger,
    StateMemo,
)
from gpuplane.model.labels import DEVICES_ANNOTATION, PLACEMENT_ANNOTATION
from gpuplane.model.objects import WARM_BUFFER_LABEL, ClusterState, ResourceFlavor, Workload
from gpuplane.model.records import recorded_claims, recorded_placement

# A one-pod gang that found no place: its assignment (kept alive, so that its id stays its own),
# its gang, the failure and whether the search read the node scores' profile.
NoPlace = tuple[Assignment, list[GangPodSet], PlacementFailure, bool]


class NodePlacer:
    """Places gangs on the scheduler's node inventory. Owns that inventory (``cluster``: None when
    the state has no nodes, and then nothing is placed), adds to the notes what did not fit, and
    keeps the one-pod gangs that found no place on one state, by assignment (``_no_place``)."""

    def __init__(
        self,
        state: ClusterState,
        config: SchedulerConfig,
        flavors: dict[str, ResourceFlavor],
        needs: NeedsMemo,
        ledger: Ledger,
    ) -> None:
        self.state = state
        self.config = config
        self.flavors = flavors
        self.needs = needs
        self.notes = ledger.notes
        self.cluster = PlacementState(state.nodes, config.devices, dra=state.dra) if state.nodes else None
        self._no_place: StateMemo[int, NoPlace] = StateMemo(ledger, clock=True)
        if self.cluster is not None:
            self._hold_allocated_claims()

    def _hold_allocated_claims(self) -> None:
        """Claims allocated in the input hold their devices: for the workload of a pod they are
        reserved for (released with it when it is preempted), else for the claim itself."""
        assert self.cluster is not None
        dra = self.cluster.dra
        if dra is None:
            return
        pods = {p.key: p for p in self.state.pods}
        for claim in self.state.dra.claims.values():
            if claim.allocation is None:
                continue
            owner = f"claim:{claim.key}"
            for name in claim.reserved_for:
                pod = pods.get(f"{claim.namespace}/{name}")
                workload = pod.template.labels.get(WORKLOAD_LABEL) if pod is not None else None
                if workload:
                    owner = f"{claim.namespace}/{workload}"
                    break
            gone = dra.inventory.hold_allocation(owner, claim.allocation)
            if gone:
                self.notes.append(
                    f"ResourceClaim {claim.key} is allocated devices no longer published: {', '.join(gone)}"
                )

    def hold_running_pods(self) -> None:
        """Pods bound to nodes hold their resources and devices: the devices recorded on them
        (``DEVICES_ANNOTATION``) first, then, for pods without a record, a fit beside them."""
        assert self.cluster is not None
        pods = sorted(self.state.pods, key=lambda p: DEVICES_ANNOTATION not in p.template.annotations)
        for pod in pods:
            if pod.node_name is None or pod.phase not in ("Pending", "Running"):
                continue
            if pod.node_name not in self.cluster.nodes:
                continue
            if WARM_BUFFER_LABEL in pod.template.labels:
                continue  # a warm-buffer placeholder: any real workload takes its place at once
            owner = pod.template.labels.get(WORKLOAD_LABEL)
            owner = f"{pod.namespace}/{owner}" if owner else f"pod:{pod.key}"
            try:
                needs = pod_needs(pod.template, self.config.devices)
            except ValueError as err:
                self.notes.append(f"pod {pod.key}: {err}")
                continue
            node = self.cluster.nodes[pod.node_name]
            recorded = pod.template.annotations.get(DEVICES_ANNOTATION)
            grants = recorded_grants(node, recorded) if recorded else None
            if grants is None:
                grants = node.fit(needs)
            if grants is None:
                self.notes.append(
                    f"pod {pod.key} does not fit node {pod.node_name}; counted as overcommitted"
                )
                grants = []
            self.cluster.hold(owner, pod.node_name, needs, grants)

    def gang(self, wl: Workload, counts: list[int], flavors: list[dict[str, str]]) -> list[GangPodSet]:
        out = []
        for ps, count, chosen in zip(wl.pod_sets, counts, flavors, strict=True):
            flavor_name = chosen.get(self.needs.device_resource(ps.template)) or next(
                (chosen[r] for r in sorted(chosen)), None
            )
            claims: tuple[ClaimNeed, ...] = ()
            problem = None
            if ps.template.claims:
                try:
                    claims = resolve_claims(self.state.dra, wl.namespace, ps.template.claims)
                except DraError as err:
                    problem = str(err)
            out.append(
                GangPodSet(
                    name=ps.name,
                    count=count,
                    needs=self.needs.of(ps.template),
                    template=ps.template,
                    flavor=self.flavors.get(flavor_name) if flavor_name else None,
                    required_level=ps.required_topology,
                    preferred_level=ps.preferred_topology,
                    claims=claims,
                    claim_problem=problem,
                )
            )
        return out

    def admission_gang(self, wl: Workload, *, less_ended: bool = False) -> list[GangPodSet]:
        """The gang as ``status.admission`` assigned it: counts and flavors per pod set (with
        ``less_ended``, less the pods that ended and will not run again)."""
        assert wl.admission is not None
        by_name = {a.name: a for a in wl.admission.pod_set_assignments}
        counts = [by_name[ps.name].count if ps.name in by_name else 0 for ps in wl.pod_sets]
        if less_ended:
            counts = [
                max(0, c - wl.reclaimable.get(ps.name, 0)) for c, ps in zip(counts, wl.pod_sets, strict=True)
            ]
        flavors = [dict(by_name[ps.name].flavors) if ps.name in by_name else {} for ps in wl.pod_sets]
        return self.gang(wl, counts, flavors)

    def place_admitted(self, wl: Workload) -> None:
        """Workloads admitted in the input without (all their) pods hold the devices their
        recorded plan names (``PLACEMENT_ANNOTATION``) while those are free; without such a plan,
        a workload with no pod bound is placed as if running."""
        assert wl.admission is not None
        if self.cluster is None:
            return
        planned = recorded_placement(wl.annotations.get(PLACEMENT_ANNOTATION))
        if planned is not None:
            try:
                claims = recorded_claims(wl.annotations.get(PLACEMENT_ANNOTATION))
                gang = self.admission_gang(wl)
                if self.cluster.hold_planned(wl.key, gang, planned, wl.reclaimable, claims):
                    return
            except ValueError as err:
                self.notes.append(f"admitted workload {wl.key}: {err}")
                return
        if wl.key in self.cluster.owners:
            return
        try:
            result = self.cluster.place(wl.key, self.admission_gang(wl, less_ended=True))
        except ValueError as err:
            self.notes.append(f"admitted workload {wl.key}: {err}")
            return
        if isinstance(result, PlacementFailure):
            self.notes.append(f"admitted workload {wl.key} has no room on the nodes: {result.message}")

    def placement_for(self, e: Entry, probe: bool, recall: bool = False) -> GangPlacement | PlacementFailure:
        """The entry's gang placed (or, with ``probe``, placed with its targets gone and given
        back). ``recall`` says the nodes are as the cycle found them; then a one-pod gang without
        claims that found no place is kept by its assignment while the state stays the same, and
        an entry with that same assignment object (a known one, :meth:`Nominator.known`: same
        shape and flavors) gets the same failure without a search, leaving behind what the search
        did (:meth:`PlacementState.relearn`): such a search takes nothing."""
        assert self.cluster is not None
        no_place = self._no_place.entries() if recall and not probe else None
        if no_place is not None:
            known = no_place.get(id(e.assignment))
            if known is not None and known[0] is e.assignment:
                _, gang, failure, read_profile = known
                self.cluster.relearn(e.pending.key, gang, read_profile)
                return failure
        counts = [ps.count for ps in e.assignment.pod_sets]
        flavors = [{r: c.flavor for r, c in ps.flavors.items()} for ps in e.assignment.pod_sets]
        gang = self.gang(e.pending.workload, counts, flavors)
        if not probe:
            reads = self.cluster.profile_reads
            placed = self.cluster.place(e.pending.key, gang)
            if (
                no_place is not None
                and isinstance(placed, PlacementFailure)
                and len(gang) == 1
                and gang[0].count == 1
                and not gang[0].claims
            ):
                read_profile = self.cluster.profile_reads != reads
                no_place[id(e.assignment)] = (e.assignment, gang, placed, read_profile)
            return placed
        owner = f"probe:{e.pending.key}"
        with self.cluster.without(t.workload.key for t in e.targets):
            result = self.cluster.place(owner, gang)
            self.cluster.release(owner)
        return result

    def to_come(self, e: Entry) -> str:
        """What may still bring a place: the flavor's warm buffer, and what Karpenter NodePools
        can still launch for it."""
        ps = e.assignment.pod_sets[0]
        resource = self.needs.device_resource(e.pending.workload.pod_sets[0].template)
        choice = ps.flavors.get(resource)
        flavor = self.flavors.get(choice.flavor) if choice is not None else None
        warm = (
            f"; warm buffer of flavor {flavor.name}: {flavor.warm_nodes} node(s)"
            if flavor and flavor.warm_nodes
            else ""
        )
        if not self.state.node_pools:
            return warm
        pools = capacity_to_come(self.state.node_pools, flavor, self.state.nodes, resource)
        if not pools:
            return warm + "; no NodePool can provide this flavor"
        said = [f"{name} ({'no limit' if left is None else f'{left} {resource}'})" for name, left in pools]
        return warm + "; NodePools can still bring: " + ", ".join(said)
