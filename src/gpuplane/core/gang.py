"""All-or-nothing placement of a workload's pods onto nodes and devices.

A :class:`Cluster` holds every node's state and a few incremental indexes (nodes by
free whole GPUs, free GPU per topology domain). :meth:`Cluster.place` finds a node
and devices for every pod of a gang, or none: a gang is never placed partly.

Filters: the flavor's node labels, the pod's node selector and required node
affinity (In, NotIn, Exists, DoesNotExist, Gt, Lt), taints against the pod's and the
flavor's tolerations, and the devices the pod needs. With a required topology level
(``kueue.x-k8s.io/podset-required-topology``) the gang lands in one domain of that
level, the smallest that holds it; a preferred level is tried first and dropped if no
domain holds the gang.

Nodes for each pod are ranked by the placement engine
(:mod:`gpuplane.core.placement.engine`) with a profile, gpuplane's own policy by default (the
one that beats FGD, :data:`~gpuplane.core.placement.profiles.DEFAULT_PROFILE`): a vectorised
mirror of every node's exclusive GPUs (free CPU, memory, pods and milli-GPU per GPU) is kept in
step with the device inventory, and the profile's score plugins rate the candidates. Candidates
come tightest first (fewest free GPUs left); the first :data:`NODES_TO_SCORE` that fit are
scored, as the Kubernetes scheduler scores a sample of a large cluster, and tried best score
first, a node that already holds part of the gang before any other; the rest follow tightest
first. Inside the node the inventory chooses the devices (a fraction shares the fullest GPU that
still holds it, whole GPUs are the lowest-index free ones): the learned workload of a small
cluster is too narrow for the policy's own GPU choice, which would spread fractions over GPUs
that whole-GPU pods need. MIG instances and time-sliced slots, which the mirror does not model,
keep the tightest-first order.

The profile's policies learn the workload from the pods this cluster has seen (held, and the
pod sets of every gang it was asked to place, each owner once): the typical pods are rebuilt when
a new pod shape appears or the number of pods seen has doubled.
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from gpuplane.core.inventory import (
    MILLI,
    DeviceConfig,
    DeviceGrant,
    NodeState,
    PodNeeds,
    node_state,
    recorded_grants,
)
from gpuplane.core.karpenter import disrupted
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement import engine
from gpuplane.core.placement.fragmentation import typical_pods
from gpuplane.core.placement.gpu_cluster import GpuCluster, GpuRequest, NodeSpec
from gpuplane.core.placement.profiles import DEFAULT_PROFILE, get_profile
from gpuplane.core.placement.scoring import PolicyContext
from gpuplane.model.objects import Node, PodTemplate, ResourceFlavor, Toleration

# Why a gang cannot be placed (most specific first).

# Feasible candidates scored per pod (the rest are tried tightest first if none of these fits).
NODES_TO_SCORE = 16
_MIB = 1024 * 1024
_MAX_LOOKS = 100_000  # distinct node looks remembered (with their scores) before starting afresh
_MAX_REMEMBERED = 4096  # needs objects whose engine request is remembered before starting afresh


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

    def __init__(
        self,
        nodes: Iterable[Node],
        config: DeviceConfig | None = None,
        profile: str | None = DEFAULT_PROFILE,
    ) -> None:
        """``profile`` names the engine's profile; ``None`` keeps the inventory's tightest-first
        order alone (no scoring). An unknown name raises ``KeyError``."""
        self.config = config or DeviceConfig()
        self.profile_name = profile
        if profile is not None:
            get_profile(profile, PolicyContext(typical=typical_pods([GpuRequest(gpus=1, gpu_milli=MILLI)])))
        self.nodes: dict[str, NodeState] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            self.nodes[node.name] = node_state(node, self.config)
        self._position = {name: i for i, name in enumerate(self.nodes)}  # the inventory's order
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
        # Nodes with time-sliced or MPS GPUs: a free slot there may count as 0 free milli-GPU.
        self._sliced = {
            name
            for name, state in self.nodes.items()
            if any(d.sharing in ("time-slicing", "mps") for d in state.devices)
        }
        self._eligible: dict[tuple[object, ...], list[NodeState]] = {}
        self._eligible_names: dict[tuple[object, ...], set[str]] = {}
        # Each eligible-name set above (by identity; they live as long as this index), sorted.
        self._by_name: dict[int, list[str]] = {}
        # The eligible nodes (list and names) of each pod template seen lately, with the template,
        # needs and flavor objects they were read for (see _eligible_of); cleared with the lists.
        self._eligible_seen: dict[
            int, tuple[PodTemplate, PodNeeds, ResourceFlavor | None, list[NodeState], set[str]]
        ] = {}
        self._members: dict[str, dict[str, set[str]]] = {}
        self.owners: dict[str, list[tuple[str, PodNeeds, tuple[DeviceGrant, ...]]]] = {}
        self._build_mirror()
        self._shapes: Counter[GpuRequest] = Counter()
        self._shape_total = 0
        self._new_shape = False
        self._seen_owners: set[str] = set()
        self._profile: engine.Profile | None = None
        self._profile_total = 0
        # Scores by request and node look (None: does not fit): nodes that look alike score alike.
        self._scores: dict[GpuRequest, dict[int, float | None]] = {}
        # The engine's request of each needs object seen lately (see _gpu_request).
        self._requests: dict[int, tuple[PodNeeds, GpuRequest | None]] = {}
        self._capacity: dict[str, int] = {}  # see _capacity_milli
        # The eligibility key of each pod template seen lately, with the objects it was read from
        # (kept, so that an id is not reused while remembered); see _eligibility_key.
        self._keys: dict[int, tuple[PodTemplate, PodNeeds, ResourceFlavor | None, tuple[object, ...]]] = {}
        # The GPUs (milli) of the eligible nodes of a gang's pod sets, by their eligibility keys.
        self._eligible_capacity: dict[tuple[tuple[object, ...], ...], int] = {}

    # --- the engine's view: exclusive GPUs as a vectorised mirror ---------------

    def _build_mirror(self) -> None:
        """Rows for nodes with exclusive GPUs; column j of a row is the node's j-th such GPU."""
        self._row: dict[str, int] = {}
        self._columns: list[list[int]] = []
        specs: list[NodeSpec] = []
        for name, state in self.nodes.items():
            exclusive = [d.index for d in state.devices if d.sharing == "exclusive"]
            if not exclusive:
                continue
            self._row[name] = len(specs)
            self._columns.append(exclusive)
            alloc = state.allocatable
            specs.append(
                NodeSpec(
                    name,
                    cpu=alloc.get("cpu", 0),
                    memory=alloc.get("memory", 0) // _MIB,
                    gpus=len(exclusive),
                    model=state.devices[exclusive[0]].model,
                    max_pods=alloc.get("pods", 110),
                )
            )
        # A new mirror is all free, as the inventory is before anything is held.
        self._mirror = GpuCluster(specs) if specs else None
        spec_ids: dict[tuple[object, ...], int] = {}
        self._spec: list[int] = [
            spec_ids.setdefault((s.cpu, s.memory, s.gpus, s.model, s.max_pods), len(spec_ids)) for s in specs
        ]
        # Rows (and looks) of nodes changed since the engine last read them: synced on demand.
        self._stale: set[str] = set()
        self._stale_look: set[str] = set()
        self._looks: dict[str, int] = {}
        self._look_ids: dict[tuple[object, ...], int] = {}

    def _look(self, state: NodeState) -> int:
        """What the engine's score plugins read of a node (its mirror row) as a small integer, the
        same for nodes that look alike: the node's shape, what its pods use, and every exclusive
        GPU's free milli-GPU."""
        name = state.name
        look = self._looks.get(name)
        if look is None or name in self._stale_look:
            row = self._row[name]
            key = (
                self._spec[row],
                tuple(sorted(state.used.items())),
                tuple([state.devices[i].milli_free for i in self._columns[row]]),
            )
            look = self._look_ids.setdefault(key, len(self._look_ids))
            self._looks[name] = look
            self._stale_look.discard(name)
        return look

    def _sync(self, state: NodeState) -> None:
        row = self._row.get(state.name)
        if row is None or self._mirror is None:
            return
        alloc, used = state.allocatable, state.used
        self._mirror.set_free(
            row,
            cpu=max(0, alloc.get("cpu", 0) - used.get("cpu", 0)),
            memory=max(0, alloc.get("memory", 0) - used.get("memory", 0)) // _MIB,
            pods=max(0, used.get("pods", 0)),
            gpu_free=[state.devices[i].milli_free for i in self._columns[row]],
        )

    def _gpu_request(self, needs: PodNeeds) -> GpuRequest | None:
        """The engine's request for a pod that uses exclusive GPUs only, else ``None``;
        remembered per needs object (immutable, and shared by every pod of a template)."""
        known = self._requests.get(id(needs))
        if known is not None and known[0] is needs:
            return known[1]
        request = self._request_of(needs)
        if len(self._requests) >= _MAX_REMEMBERED:
            self._requests.clear()
        self._requests[id(needs)] = (needs, request)
        return request

    @staticmethod
    def _request_of(needs: PodNeeds) -> GpuRequest | None:
        if (
            needs.mig
            or needs.shared
            or not (needs.whole or needs.fraction_milli or needs.fraction_memory_mib)
        ):
            return None
        if needs.whole and (needs.fraction_milli or needs.fraction_memory_mib):
            return None
        cpu = needs.resources.get("cpu", 0)
        memory = -(-needs.resources.get("memory", 0) // _MIB)
        if needs.whole:
            return GpuRequest(cpu=cpu, memory=memory, gpus=needs.whole, gpu_milli=MILLI)
        return GpuRequest(cpu=cpu, memory=memory, gpus=1, gpu_milli=max(1, min(needs.fraction_milli, MILLI)))

    def _record(self, owner: str, pod_sets: Sequence[GangPodSet]) -> None:
        """Learn the workload: each owner's pods once (a probe counts as its workload)."""
        owner = owner.removeprefix("probe:")
        if owner in self._seen_owners:
            return
        self._seen_owners.add(owner)
        for ps in pod_sets:
            request = self._gpu_request(ps.needs)
            if request is not None and ps.count:
                self._learn(request, ps.count)

    def _learn(self, request: GpuRequest, count: int) -> None:
        if request not in self._shapes:
            self._new_shape = True
        self._shapes[request] += count
        self._shape_total += count

    def profile(self) -> engine.Profile | None:
        """The profile for the workload seen so far (rebuilt on a new shape or twice the pods)."""
        if not self._shapes or self.profile_name is None:
            return None
        if self._profile is None or self._new_shape or self._shape_total >= 2 * self._profile_total:
            seen = itertools.chain.from_iterable(
                itertools.repeat(r, n)
                for r, n in sorted(self._shapes.items(), key=lambda kv: (kv[0].shape, kv[0].memory))
            )
            self._profile = get_profile(self.profile_name, PolicyContext(typical=typical_pods(seen)))
            self._profile_total = self._shape_total
            self._new_shape = False
            self._scores.clear()
        return self._profile

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
        if name in self._row:
            self._stale.add(name)
            self._stale_look.add(name)
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

    def _eligibility_key(self, ps: GangPodSet) -> tuple[object, ...]:
        """Pod sets with the same constraints share one eligible-node list. Remembered per
        template, needs and flavor object (immutable; a placement asks it several times)."""
        known = self._keys.get(id(ps.template))
        if known is not None and known[0] is ps.template and known[1] is ps.needs and known[2] is ps.flavor:
            return known[3]
        key = self._eligibility_key_of(ps)
        if len(self._keys) >= _MAX_REMEMBERED:
            self._keys.clear()
        self._keys[id(ps.template)] = (ps.template, ps.needs, ps.flavor, key)
        return key

    @staticmethod
    def _eligibility_key_of(ps: GangPodSet) -> tuple[object, ...]:
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
        return self._eligible_of(ps)[0]

    def _eligible_of(self, ps: GangPodSet) -> tuple[list[NodeState], set[str]]:
        """The nodes that may ever hold a pod of ``ps``, and their names. Remembered per template,
        needs and flavor object, which fix the eligibility key (a placement asks several times, and
        hashing the key, nested tuples of tolerations and node terms, costs more than the rest)."""
        template = ps.template
        seen = self._eligible_seen.get(id(template))
        if seen is not None and seen[0] is template and seen[1] is ps.needs and seen[2] is ps.flavor:
            return seen[3], seen[4]
        key = self._eligibility_key(ps)
        cached = self._eligible.get(key)
        found = (cached, self._eligible_names[key]) if cached is not None else self._eligible_nodes(ps, key)
        if len(self._eligible_seen) >= _MAX_REMEMBERED:
            self._eligible_seen.clear()
        self._eligible_seen[id(template)] = (template, ps.needs, ps.flavor, *found)
        return found

    def _eligible_nodes(self, ps: GangPodSet, key: tuple[object, ...]) -> tuple[list[NodeState], set[str]]:
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
        names = self._eligible_names[key] = {s.name for s in out}
        self._by_name[id(names)] = sorted(names)
        return out, names

    def node_changed(self, node: Node) -> None:
        """``node`` (same name, same allocatable) has new labels, taints or schedulability: what
        is placed on it stays, and the eligible-node lists and topology indexes are rebuilt."""
        self.nodes[node.name].node = node
        self._eligible.clear()
        self._eligible_names.clear()
        self._eligible_seen.clear()
        self._eligible_capacity.clear()
        self._by_name.clear()
        self._members.clear()
        levels, self._levels = self._levels, set()
        self._domain_free.clear()
        for level in sorted(levels):
            self._track_level(level)

    def eligible_names(self, ps: GangPodSet) -> set[str]:
        return self._eligible_of(ps)[1]

    def why_not(self, ps: GangPodSet) -> PlacementFailure:
        """The most specific reason no node can ever hold this pod set."""
        advertising = [s for s in self.nodes.values() if s.advertises(ps.needs) and not s.node.unschedulable]
        if not advertising:
            wanted = sorted(ps.needs.resources) if not ps.needs.uses_devices else ["the requested devices"]
            return PlacementFailure(Reason.NO_NODE_ADVERTISES, f"no node advertises {', '.join(wanted)}")
        flavor_labels = ps.flavor.node_labels if ps.flavor else {}
        matching = [
            s
            for s in advertising
            if all(s.labels.get(k) == v for k, v in flavor_labels.items())
            and ps.template.node_matches(s.labels)
        ]
        if not matching:
            return PlacementFailure(
                Reason.NO_NODE_MATCHES_SELECTOR,
                f"no node with the devices has the labels of flavor/node selector for pod set {ps.name}",
            )
        tolerations = (*ps.template.tolerations, *(ps.flavor.tolerations if ps.flavor else ()))
        if not any(tolerated(s, tolerations) for s in matching):
            taints = sorted({str(t) for s in matching for t in s.taints})
            return PlacementFailure(
                Reason.UNTOLERATED_TAINT, f"no node tolerates taint(s) {', '.join(taints)}"
            )
        return PlacementFailure(Reason.NO_NODE_ADVERTISES, "no node can hold a pod of this pod set")

    # --- placement ------------------------------------------------------------

    def _tightest_first(
        self, needs: PodNeeds, eligible: list[NodeState], allowed: set[str], used: set[str]
    ) -> Iterable[str]:
        """Names of the nodes in the inventory's order: a node of this gang first, then tightest fit."""
        if needs.whole and not (needs.fraction_milli or needs.mig or needs.shared) and len(eligible) > 64:
            return self._by_free_whole(needs.whole, allowed, used)
        # A node of this gang first; then GPU pods pack onto the tightest node, and CPU-only pods
        # keep off GPU nodes; then by name.
        if needs.uses_devices:
            # ``allowed`` names exactly the ``eligible`` nodes: sorted by name, then (stable) by
            # free milli-GPU, the same order as the key (free, name) without building it.
            by_name = self._by_name.get(id(allowed))
            by_free = sorted(
                sorted(allowed) if by_name is None else by_name, key=self._free_milli.__getitem__
            )
            if used:
                return [n for n in by_free if n in used] + [n for n in by_free if n not in used]
            return by_free
        order = sorted([(0 if (n := s.name) in used else 1, 1 if s.devices else 0, n) for s in eligible])
        return [item[2] for item in order]

    def _by_free_whole(self, whole: int, allowed: set[str], used: set[str]) -> Iterator[str]:
        """:meth:`_tightest_first` for whole GPUs on many nodes: from the buckets by free whole GPUs,
        the nodes without ``whole`` of them left out."""
        yield from sorted(n for n in used if n in allowed)
        for free in sorted(k for k in self._buckets if k >= whole):
            for name in self._buckets[free]:
                if name in allowed and name not in used:
                    yield name

    def _candidates(
        self,
        needs: PodNeeds,
        request: GpuRequest | None,
        eligible: list[NodeState],
        allowed: set[str],
        used: set[str],
    ) -> Iterator[NodeState]:
        """Nodes to try for one pod, best first: the profile's scores over a tightest-first sample.

        ``request`` is the engine's form of ``needs`` (``None``: the mirror cannot model it).
        """
        base = iter(self._tightest_first(needs, eligible, allowed, used))
        profile = self.profile() if request is not None else None
        nodes = self.nodes
        if request is None or profile is None or self._mirror is None:
            yield from map(nodes.__getitem__, self._roomy(needs, base))
            return
        if len(self._look_ids) >= _MAX_LOOKS:  # a long run: forget old looks and their scores
            self._look_ids.clear()
            self._looks.clear()
            self._scores.clear()
        rows = self._row
        picked: list[str] = []
        for name in base:
            if name in rows:
                picked.append(name)
                if len(picked) == NODES_TO_SCORE:
                    break
        roomy = self._roomy(needs, picked)
        # With no room on any node of the sample, neither order below yields one: the mirror finds
        # a node feasible only where its exclusive GPUs hold the request, which ``_roomy`` keeps
        # (a request the mirror models has whole GPUs or a fraction of one, nothing else). Then
        # the looks and scores, kept to be read again only, are not needed.
        if roomy:
            known, stale = self._looks, self._stale_look
            looks = [
                look if (look := known.get(n)) is not None and n not in stale else self._look(nodes[n])
                for n in picked
            ]
            if len(set(looks)) > 1:
                yield from self._by_score(profile, request, [nodes[n] for n in picked], looks, used)
            else:
                # They all look alike: the same score, so the inventory's order.
                yield from map(nodes.__getitem__, roomy)
        yield from map(nodes.__getitem__, self._roomy(needs, base))

    def _roomy(self, needs: PodNeeds, names: Iterable[str]) -> list[str]:
        """The nodes ``names`` less those where :meth:`NodeState.fit` cannot succeed for lack of
        free devices: a pod of whole GPUs needs that many free whole GPUs
        (:meth:`NodeState.free_whole` counts exactly the devices ``fit`` may give it), a fraction
        needs a GPU with that much free (so at least as much free on the node), and any other pod
        that uses devices some free share of one (a MIG instance, a slot). Only the sure cases are
        left out, so the first node that fits is the same: nodes with time-sliced GPUs (a slot may
        count as 0 milli-GPU, and gives whole GPUs as slots), and MIG requests when repartitioning
        may carve a new instance out of unused slices. What is read here does not change while a
        pod's candidates are tried, so the list is built at once."""
        if not needs.uses_devices or (needs.mig and self.config.mig_repartition):
            return list(names)
        if needs.whole:
            free, least = self._free_whole, needs.whole
        else:
            free, least = self._free_milli, max(1, needs.fraction_milli)
        sliced = self._sliced
        return [name for name in names if free[name] >= least or name in sliced]

    def _by_score(
        self,
        profile: engine.Profile,
        request: GpuRequest,
        sample: list[NodeState],
        looks: list[int],
        used: set[str],
    ) -> list[NodeState]:
        """``sample`` that the mirror says fit, best first: this gang's nodes, score, sample order.

        Only one node per look not scored before is scored (a look's score is kept until the
        profile is rebuilt): the score plugins read nothing of a node but its mirror row.
        """
        assert self._mirror is not None
        cache = self._scores.get(request)
        if cache is None:
            cache = self._scores[request] = {}
        todo: dict[int, NodeState] = {}
        for state, look in zip(sample, looks, strict=True):
            if look not in cache and look not in todo:
                todo[look] = state
        if todo:
            for state in todo.values():
                if state.name in self._stale:
                    self._sync(state)
                    self._stale.discard(state.name)
            nodes = np.array([self._row[s.name] for s in todo.values()], dtype=np.int64)
            fit = self._mirror.feasible_among(request, nodes)
            fitting = nodes[fit]
            scores = engine.score(profile, self._mirror, request, fitting) if fitting.size else fitting
            scored = iter(scores.tolist())
            for look, ok in zip(todo, fit.tolist(), strict=True):
                cache[look] = float(next(scored)) if ok else None
        # (not of this gang, -score, sample order): unique, so the states are never compared.
        ranked = [
            (state.name not in used, -value, i, state)
            for i, (state, look) in enumerate(zip(sample, looks, strict=True))
            if (value := cache[look]) is not None
        ]
        ranked.sort()
        return [item[3] for item in ranked]

    def _place_pods(
        self, owner: str, pod_sets: Sequence[GangPodSet], restrict: set[str] | None, placement: GangPlacement
    ) -> bool:
        taken: list[tuple[NodeState, PodNeeds, tuple[DeviceGrant, ...]]] = []
        used: set[str] = set()
        order = [0]  # one pod set (the common case): nothing to sort
        if len(pod_sets) > 1:
            order = sorted(range(len(pod_sets)), key=lambda i: -pod_sets[i].needs.gpu_milli)
        result: dict[str, list[PodPlace]] = {ps.name: [] for ps in pod_sets}
        repartitions = 0
        for i in order:
            ps = pod_sets[i]
            eligible, allowed = self._eligible_of(ps)
            if restrict is not None:
                # A topology domain is small: walk its members, not every eligible node.
                allowed = allowed & restrict
                eligible = [self.nodes[n] for n in sorted(allowed, key=self._position.__getitem__)]
            request = self._gpu_request(ps.needs)
            for _ in range(ps.count):
                for state in self._candidates(ps.needs, request, eligible, allowed, used):
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
        self._record(owner, pod_sets)
        for ps in pod_sets:
            if ps.count and not self.eligible(ps):
                return self.why_not(ps)
        placement = GangPlacement()
        level = next((ps.required_level for ps in pod_sets if ps.required_level), None)
        preferred = next((ps.preferred_level for ps in pod_sets if ps.preferred_level), None)
        if level is None and preferred is None and self._too_few_free(pod_sets):
            return self._failure(pod_sets, "")
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

    def _too_few_free(self, pod_sets: Sequence[GangPodSet]) -> bool:
        """Whether a gang of one pod set surely has no place (:meth:`surely_no_room`). Then the
        search is not run, and its outcome (a failure, and nothing taken) is the same; the one
        thing it reads that it may change, the profile learned so far, is read as it would have
        been."""
        if len(pod_sets) != 1 or not self.surely_no_room(pod_sets[0]):
            return False
        if self._gpu_request(pod_sets[0].needs) is not None:
            self.profile()  # the search reads it before its first node
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
        if self._sliced and not self._sliced.isdisjoint(allowed):
            return False  # a time-sliced node gives whole GPUs as slots
        room, wanted = 0, ps.count
        # Only a node with at least ``whole`` free whole GPUs adds room: under load those are few,
        # and the buckets by free whole GPUs name them, so walk the buckets where they are fewer
        # than the eligible nodes (the same sum, in another order).
        with_room = sum(len(names) for free, names in self._buckets.items() if free >= whole)
        free_whole = self._free_whole
        for name in self._by_free_whole(whole, allowed, set()) if with_room < len(allowed) else allowed:
            room += free_whole[name] // whole
            if room >= wanted:
                return False
        return True

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

    def _capacity_milli(self, state: NodeState) -> int:
        """A node's GPUs in milli-GPU (a MIG GPU by its instances' compute slices of 7). Its
        devices never change, nor, unless MIG repartitioning is on, their instances: then it
        is remembered."""
        fixed = not self.config.mig_repartition
        known = self._capacity.get(state.name) if fixed else None
        if known is not None:
            return known
        value = 1000 * sum(1 for d in state.devices if d.sharing != "mig") + sum(
            1000 * sum(i.instance.profile.compute for i in d.mig) // 7
            for d in state.devices
            if d.sharing == "mig"
        )
        if fixed:
            self._capacity[state.name] = value
        return value

    def _eligible_capacity_milli(self, pod_sets: Sequence[GangPodSet], names: set[str]) -> int:
        """The GPUs (milli) of ``names``, the eligible nodes of ``pod_sets``: remembered by the
        pod sets' eligibility keys while the nodes' devices are fixed (see _capacity_milli), and
        until the eligible-node lists are rebuilt."""
        if self.config.mig_repartition:
            return sum(self._capacity_milli(self.nodes[n]) for n in names)
        key = tuple(self._eligibility_key(ps) for ps in pod_sets)
        known = self._eligible_capacity.get(key)
        if known is None:
            known = self._eligible_capacity[key] = sum(self._capacity_milli(self.nodes[n]) for n in names)
        return known

    def _failure(self, pod_sets: Sequence[GangPodSet], detail: str) -> PlacementFailure:
        demand = sum(ps.needs.gpu_milli * ps.count for ps in pod_sets)
        if len(pod_sets) == 1:
            names = self.eligible_names(pod_sets[0])
        else:
            names = set()
            for ps in pod_sets:
                names |= self.eligible_names(ps)
        free_milli = self._free_milli
        free = sum([free_milli[n] for n in names])
        capacity = self._eligible_capacity_milli(pod_sets, names)
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
        request = self._gpu_request(needs)
        if request is not None:
            self._learn(request, 1)

    def hold_planned(
        self,
        owner: str,
        pod_sets: Sequence[GangPodSet],
        planned: Mapping[str, Sequence[tuple[str, str]]],
        ended: Mapping[str, int] | None = None,
    ) -> bool:
        """Hold exactly the ``(node, devices)`` a recorded plan gave each pod of an admitted gang
        (:func:`gpuplane.core.plan.recorded_placement`), less what ``owner``'s bound pods hold
        already, and less ``ended[pod set]`` of the slots no bound pod holds (pods that ended and
        will not run again: their devices are free); all or nothing. ``False`` (and nothing taken)
        when the plan does not match the gang's pod sets or a planned device is no longer free:
        the world changed."""
        self._record(owner, pod_sets)
        held = Counter(
            (name, ",".join(g.describe() for g in grants)) for name, _, grants in self.owners.get(owner, [])
        )
        taken: list[tuple[NodeState, PodNeeds, list[DeviceGrant]]] = []
        for ps in pod_sets:
            slots = planned.get(ps.name, ())
            if len(slots) != ps.count:
                return False
            spare = (ended or {}).get(ps.name, 0)
            for node, devices in slots:
                if held[(node, devices)] > 0:
                    held[(node, devices)] -= 1
                    continue
                if spare > 0:
                    spare -= 1
                    continue
                state = self.nodes.get(node)
                if state is None:
                    return False
                grants = recorded_grants(state, devices) if devices else []
                if grants is None or not state.plain_fits(ps.needs):
                    for back_state, needs, back in reversed(taken):
                        back_state.give_back(owner, needs, back)
                        self._refresh(back_state)
                    return False
                state.take(owner, ps.needs, grants)
                self._refresh(state)
                taken.append((state, ps.needs, grants))
        self.owners.setdefault(owner, []).extend((s.name, n, tuple(g)) for s, n, g in taken)
        return True

    def release(self, owner: str) -> None:
        """Give back everything ``owner`` holds (idempotent)."""
        for name, needs, grants in self.owners.pop(owner, []):
            state = self.nodes[name]
            state.give_back(owner, needs, grants)
            self._refresh(state)
