"""All-or-nothing placement of a workload's pods onto nodes and devices.

A :class:`Cluster` holds every node's state and a few incremental indexes (nodes by
free whole GPUs, free GPU per topology domain). :meth:`Cluster.place` finds a node
and devices for every pod of a gang, or none: a gang is never placed partly.

Filters: the flavor's node labels, the pod's node selector and required node
affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt), taints against the pod's and the
flavor's tolerations, and the devices the pod needs. With a required topology level
(``kueue.x-k8s.io/podset-required-topology``) the gang lands in one domain of that
level, the smallest that holds it; a preferred level is tried first and dropped if no
domain holds the gang. Inside the chosen nodes, pods are packed: a node that already
holds part of the gang first, then the tightest fit (fewest free GPUs left).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpuplane.core.inventory import DeviceConfig, DeviceGrant, NodeState, PodNeeds, node_state
from gpuplane.core.karpenter import disrupted
from gpuplane.core.lifecycle import Reason
from gpuplane.model.objects import Node, PodTemplate, ResourceFlavor, Toleration

# Why a gang cannot be placed (most specific first).
NO_NODE_ADVERTISES = Reason.NO_NODE_ADVERTISES
NO_NODE_MATCHES_SELECTOR = Reason.NO_NODE_MATCHES_SELECTOR
UNTOLERATED_TAINT = Reason.UNTOLERATED_TAINT
EXCEEDS_CLUSTER = Reason.EXCEEDS_CLUSTER
FRAGMENTED = Reason.FRAGMENTED
WAITING_FOR_GANG_CAPACITY = Reason.WAITING_FOR_GANG_CAPACITY


@dataclass(frozen=True, slots=True)
class GangPodSet:
    """One pod set of a gang, as placement needs it."""

    name: str
    count: int
    needs: PodNeeds
    template: PodTemplate
    flavor: ResourceFlavor | None = None
    required_level: str | None = None
    preferred_level: str | None = None


@dataclass(frozen=True, slots=True)
class PodPlace:
    node: str
    grants: tuple[DeviceGrant, ...]


@dataclass(slots=True)
class GangPlacement:
    """Where every pod of every pod set went (in pod set order)."""

    pods: dict[str, list[PodPlace]] = field(default_factory=dict)
    repartitions: int = 0


@dataclass(frozen=True, slots=True)
class PlacementFailure:
    reason: str
    message: str


def tolerated(node: NodeState, tolerations: Sequence[Toleration]) -> bool:
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


class Cluster:
    """Mutable placement state for one scheduling call."""

    def __init__(self, nodes: Iterable[Node], config: DeviceConfig | None = None) -> None:
        self.config = config or DeviceConfig()
        self.nodes: dict[str, NodeState] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            self.nodes[node.name] = node_state(node, self.config)
        self._free_whole: dict[str, int] = {}
        self._free_milli: dict[str, int] = {}
        self._buckets: dict[int, list[str]] = {}
        self._domain_free: dict[tuple[str, str], int] = {}
        self._levels: set[str] = set()
        for name, state in self.nodes.items():
            whole = state.free_whole()
            self._free_whole[name] = whole
            self._free_milli[name] = state.free_gpu_milli()
            self._buckets.setdefault(whole, []).append(name)
        self._eligible: dict[tuple[object, ...], list[NodeState]] = {}
        self._eligible_names: dict[tuple[object, ...], set[str]] = {}
        self._members: dict[str, dict[str, set[str]]] = {}
        self.owners: dict[str, list[tuple[str, PodNeeds, tuple[DeviceGrant, ...]]]] = {}

    # --- indexes ------------------------------------------------------------

    def _track_level(self, level: str) -> None:
        if level in self._levels:
            return
        self._levels.add(level)
        for name, state in self.nodes.items():
            value = state.labels.get(level)
            if value is not None:
                key = (level, value)
                self._domain_free[key] = self._domain_free.get(key, 0) + self._free_milli[name]

    def _refresh(self, state: NodeState) -> None:
        name = state.name
        old_whole, new_whole = self._free_whole[name], state.free_whole()
        if old_whole != new_whole:
            bucket = self._buckets[old_whole]
            del bucket[bisect.bisect_left(bucket, name)]
            bisect.insort(self._buckets.setdefault(new_whole, []), name)
            self._free_whole[name] = new_whole
        old_milli, new_milli = self._free_milli[name], state.free_gpu_milli()
        if old_milli != new_milli:
            self._free_milli[name] = new_milli
            for level in self._levels:
                value = state.labels.get(level)
                if value is not None:
                    self._domain_free[(level, value)] += new_milli - old_milli

    # --- eligibility ----------------------------------------------------------

    @staticmethod
    def _eligibility_key(ps: GangPodSet) -> tuple[object, ...]:
        """Pod sets with the same constraints share one eligible-node list."""
        needs = ps.needs
        return (
            ps.flavor.name if ps.flavor else "",
            tuple(sorted(ps.template.node_selector.items())),
            ps.template.required_node_terms,
            ps.template.tolerations,
            bool(needs.whole),
            bool(needs.fraction_milli or needs.fraction_memory_mib),
            bool(needs.shared),
            tuple(sorted(needs.resources)),
        )

    def eligible(self, ps: GangPodSet) -> list[NodeState]:
        key = self._eligibility_key(ps)
        cached = self._eligible.get(key)
        if cached is not None:
            return cached
        tolerations = (*ps.template.tolerations, *(ps.flavor.tolerations if ps.flavor else ()))
        flavor_labels = ps.flavor.node_labels if ps.flavor else {}
        out = []
        for state in self.nodes.values():
            if state.node.unschedulable or disrupted(state.node):  # a disrupted node is on its way out
                continue
            labels = state.labels
            if any(labels.get(k) != v for k, v in flavor_labels.items()):
                continue
            if not ps.template.node_matches(labels) or not tolerated(state, tolerations):
                continue
            if not state.advertises(ps.needs):
                continue
            out.append(state)
        self._eligible[key] = out
        self._eligible_names[key] = {s.name for s in out}
        return out

    def node_changed(self, node: Node) -> None:
        """``node`` (same name, same allocatable) has new labels, taints or schedulability: what
        is placed on it stays, and the eligible-node lists and topology indexes are rebuilt."""
        self.nodes[node.name].node = node
        self._eligible.clear()
        self._eligible_names.clear()
        self._members.clear()
        levels, self._levels = self._levels, set()
        self._domain_free.clear()
        for level in sorted(levels):
            self._track_level(level)

    def eligible_names(self, ps: GangPodSet) -> set[str]:
        self.eligible(ps)
        return self._eligible_names[self._eligibility_key(ps)]

    def why_not(self, ps: GangPodSet) -> PlacementFailure:
        """The most specific reason no node can ever hold this pod set."""
        advertising = [s for s in self.nodes.values() if s.advertises(ps.needs) and not s.node.unschedulable]
        if not advertising:
            wanted = sorted(ps.needs.resources) if not ps.needs.uses_devices else ["the requested devices"]
            return PlacementFailure(NO_NODE_ADVERTISES, f"no node advertises {', '.join(wanted)}")
        flavor_labels = ps.flavor.node_labels if ps.flavor else {}
        matching = [
            s
            for s in advertising
            if all(s.labels.get(k) == v for k, v in flavor_labels.items())
            and ps.template.node_matches(s.labels)
        ]
        if not matching:
            return PlacementFailure(
                NO_NODE_MATCHES_SELECTOR,
                f"no node with the devices has the labels of flavor/node selector for pod set {ps.name}",
            )
        tolerations = (*ps.template.tolerations, *(ps.flavor.tolerations if ps.flavor else ()))
        if not any(tolerated(s, tolerations) for s in matching):
            taints = sorted({str(t) for s in matching for t in s.taints})
            return PlacementFailure(UNTOLERATED_TAINT, f"no node tolerates taint(s) {', '.join(taints)}")
        return PlacementFailure(NO_NODE_ADVERTISES, "no node can hold a pod of this pod set")

    # --- placement ------------------------------------------------------------

    def _candidates(
        self, needs: PodNeeds, eligible: list[NodeState], allowed: set[str], used: set[str]
    ) -> Iterable[NodeState]:
        """Nodes to try for one pod, best first."""
        if needs.whole and not (needs.fraction_milli or needs.mig or needs.shared) and len(eligible) > 64:
            first = [self.nodes[n] for n in sorted(used) if n in allowed]
            yield from first
            for free in sorted(k for k in self._buckets if k >= needs.whole):
                for name in self._buckets[free]:
                    if name in allowed and name not in used:
                        yield self.nodes[name]
            return
        gpu = needs.uses_devices

        def key(s: NodeState) -> tuple[int, int, str]:
            local = 0 if s.name in used else 1
            # GPU pods pack onto the tightest node; CPU-only pods keep off GPU nodes.
            return (local, self._free_milli[s.name] if gpu else (1 if s.devices else 0), s.name)

        yield from sorted(eligible, key=key)

    def _place_pods(
        self, owner: str, pod_sets: Sequence[GangPodSet], restrict: set[str] | None, placement: GangPlacement
    ) -> bool:
        taken: list[tuple[NodeState, PodNeeds, tuple[DeviceGrant, ...]]] = []
        used: set[str] = set()
        order = sorted(range(len(pod_sets)), key=lambda i: -pod_sets[i].needs.gpu_milli)
        result: dict[str, list[PodPlace]] = {ps.name: [] for ps in pod_sets}
        repartitions = 0
        for i in order:
            ps = pod_sets[i]
            eligible = self.eligible(ps)
            allowed = self.eligible_names(ps)
            if restrict is not None:
                eligible = [s for s in eligible if s.name in restrict]
                allowed = allowed & restrict
            for _ in range(ps.count):
                for state in self._candidates(ps.needs, eligible, allowed, used):
                    grants = state.fit(ps.needs, self.config.mig_repartition)
                    if grants is None:
                        continue
                    state.take(owner, ps.needs, grants)
                    self._refresh(state)
                    granted = tuple(grants)
                    taken.append((state, ps.needs, granted))
                    used.add(state.name)
                    result[ps.name].append(PodPlace(state.name, granted))
                    repartitions += sum(1 for g in granted if g.repartition is not None)
                    break
                else:
                    for node, needs, held in reversed(taken):
                        node.give_back(owner, needs, held)
                        self._refresh(node)
                    return False
        placement.pods = result
        placement.repartitions = repartitions
        self.owners.setdefault(owner, []).extend((s.name, n, g) for s, n, g in taken)
        return True

    def place(self, owner: str, pod_sets: Sequence[GangPodSet]) -> GangPlacement | PlacementFailure:
        """Place every pod of the gang, or nothing. Takes the devices on success."""
        for ps in pod_sets:
            if ps.count and not self.eligible(ps):
                return self.why_not(ps)
        placement = GangPlacement()
        level = next((ps.required_level for ps in pod_sets if ps.required_level), None)
        preferred = next((ps.preferred_level for ps in pod_sets if ps.preferred_level), None)
        for topo, required in ((level, True), (preferred, False)):
            if topo is None:
                continue
            for domain in self._domains(topo, pod_sets):
                if self._place_pods(owner, pod_sets, domain, placement):
                    return placement
            if required:
                return self._failure(pod_sets, f"no {topo} domain holds the whole gang")
        if self._place_pods(owner, pod_sets, None, placement):
            return placement
        return self._failure(pod_sets, "")

    def _domains(self, level: str, pod_sets: Sequence[GangPodSet]) -> list[set[str]]:
        """Domains of ``level`` that could hold the gang, smallest first."""
        self._track_level(level)
        demand = sum(ps.needs.gpu_milli * ps.count for ps in pod_sets)
        values = sorted(
            (free, value)
            for (lvl, value), free in self._domain_free.items()
            if lvl == level and free >= demand
        )
        members = self._members.get(level)
        if members is None:
            members = {}
            for state in self.nodes.values():
                value = state.labels.get(level)
                if value is not None:
                    members.setdefault(value, set()).add(state.name)
            self._members[level] = members
        return [members[v] for _, v in values]

    def _failure(self, pod_sets: Sequence[GangPodSet], detail: str) -> PlacementFailure:
        demand = sum(ps.needs.gpu_milli * ps.count for ps in pod_sets)
        eligible: dict[str, NodeState] = {}
        for ps in pod_sets:
            eligible.update((s.name, s) for s in self.eligible(ps))
        free = sum(self._free_milli[n] for n in eligible)
        capacity = sum(
            1000 * sum(1 for d in s.devices if d.sharing != "mig")
            + sum(
                1000 * sum(i.instance.profile.compute for i in d.mig) // 7
                for d in s.devices
                if d.sharing == "mig"
            )
            for s in eligible.values()
        )
        pods = sum(ps.count for ps in pod_sets)
        suffix = f" ({detail})" if detail else ""
        if demand > capacity:
            return PlacementFailure(
                EXCEEDS_CLUSTER,
                f"the gang needs {demand / 1000:g} GPUs; eligible nodes have {capacity / 1000:g}{suffix}",
            )
        if demand and free >= demand:
            return PlacementFailure(
                FRAGMENTED,
                f"{free / 1000:g} GPUs are free on eligible nodes "
                f"but no placement holds all {pods} pods{suffix}",
            )
        return PlacementFailure(
            WAITING_FOR_GANG_CAPACITY,
            f"waiting for capacity for all {pods} pods: "
            f"{demand / 1000:g} GPUs needed, {free / 1000:g} free{suffix}",
        )

    @contextmanager
    def without(self, owners: Iterable[str]) -> Iterator[None]:
        """Simulate that ``owners`` are gone; every device comes back on exit."""
        held = {o: self.owners.pop(o) for o in owners if o in self.owners}
        for owner, items in held.items():
            for name, needs, grants in items:
                self.nodes[name].give_back(owner, needs, grants)
                self._refresh(self.nodes[name])
        try:
            yield
        finally:
            for owner, items in held.items():
                for name, needs, grants in items:
                    self.nodes[name].take(owner, needs, grants)
                    self._refresh(self.nodes[name])
                self.owners[owner] = items

    def hold(self, owner: str, node: str, needs: PodNeeds, grants: Sequence[DeviceGrant]) -> None:
        """Record a pod already running on ``node`` (from the input)."""
        state = self.nodes[node]
        state.take(owner, needs, grants)
        self._refresh(state)
        self.owners.setdefault(owner, []).append((node, needs, tuple(grants)))

    def release(self, owner: str) -> None:
        """Give back everything ``owner`` holds (idempotent)."""
        for name, needs, grants in self.owners.pop(owner, []):
            state = self.nodes[name]
            state.give_back(owner, needs, grants)
            self._refresh(state)
