"""Which nodes may ever hold a pod of a pod set, remembered, and why none may.

Filters: the flavor's node labels, the pod's node selector and required node affinity (In, NotIn,
Exists, DoesNotExist, Gt, Lt), taints against the pod's and the flavor's tolerations, and the
devices the pod needs. A node that is unschedulable or being disrupted is never eligible.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuplane.core.karpenter import disrupted
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.devices import DeviceConfig, NodeState, PodNeeds
from gpuplane.core.placement.gangs import GangPodSet, PlacementFailure
from gpuplane.model.objects import PodTemplate, ResourceFlavor, Toleration

# Bound of the memos by object identity below (one entry per pod template or needs object seen).
# They keep the objects alive, so that an id is not reused while remembered, and workloads come
# and go for as long as a session lives: without a bound they would keep every template ever
# placed. A cycle looks at one head per ClusterQueue and the admitted workloads' pod sets, far
# fewer than 4096 distinct templates in any cluster the benchmarks model, so a cycle hardly ever
# starts afresh midway; an entry costs a few hundred bytes (4096 of them about a megabyte).
# Starting afresh only reads the templates again: the results are the same.
MAX_REMEMBERED = 4096

EligibilityKey = tuple[object, ...]


def tolerated(node: NodeState, tolerations: Sequence[Toleration]) -> bool:
    for taint in node.taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return False
    return True


class EligibleNodes:
    """The eligible nodes of each pod set's constraints, and the GPUs they have.

    Owns the eligible-node lists (and name sets, sorted names) by eligibility key, the memos from
    a pod set's template, needs and flavor objects to their key and list (bounded by
    :data:`MAX_REMEMBERED`), each node's GPU capacity and the eligible capacity of a gang's pod
    sets. The lists are by constraints, not by workload, so they are as many as the distinct
    (flavor, selector, affinity, tolerations, kinds of device) of the pods placed; they are
    dropped whenever a node's labels, taints or schedulability change (:meth:`clear`)."""

    def __init__(self, nodes: Mapping[str, NodeState], config: DeviceConfig) -> None:
        self._nodes = nodes
        self._config = config
        self._lists: dict[EligibilityKey, list[NodeState]] = {}
        self._names: dict[EligibilityKey, set[str]] = {}
        # Each name set above (by identity; they live as long as this index), sorted.
        self._sorted: dict[int, list[str]] = {}
        # The eligible nodes (list and names) of each pod template seen lately, with the template,
        # needs and flavor objects they were read for (see of); cleared with the lists.
        self._seen: dict[
            int, tuple[PodTemplate, PodNeeds, ResourceFlavor | None, list[NodeState], set[str]]
        ] = {}
        # The key of each pod template seen lately, with the objects it was read from (see key).
        self._keys: dict[int, tuple[PodTemplate, PodNeeds, ResourceFlavor | None, EligibilityKey]] = {}
        self._capacity: dict[str, int] = {}  # see capacity_milli
        # The GPUs (milli) of the eligible nodes of a gang's pod sets, by their eligibility keys.
        self._gang_capacity: dict[tuple[EligibilityKey, ...], int] = {}

    def clear(self) -> None:
        """Drop the lists (a node's labels, taints or schedulability changed)."""
        self._lists.clear()
        self._names.clear()
        self._seen.clear()
        self._gang_capacity.clear()
        self._sorted.clear()

    def key(self, ps: GangPodSet) -> EligibilityKey:
        """Pod sets with the same constraints share one eligible-node list. Remembered per
        template, needs and flavor object (immutable; a placement asks it several times)."""
        known = self._keys.get(id(ps.template))
        if known is not None and known[0] is ps.template and known[1] is ps.needs and known[2] is ps.flavor:
            return known[3]
        key = self._key_of(ps)
        if len(self._keys) >= MAX_REMEMBERED:
            self._keys.clear()
        self._keys[id(ps.template)] = (ps.template, ps.needs, ps.flavor, key)
        return key

    @staticmethod
    def _key_of(ps: GangPodSet) -> EligibilityKey:
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

    def of(self, ps: GangPodSet) -> tuple[list[NodeState], set[str]]:
        """The nodes that may ever hold a pod of ``ps``, and their names. Remembered per template,
        needs and flavor object, which fix the eligibility key (a placement asks several times, and
        hashing the key, nested tuples of tolerations and node terms, costs more than the rest)."""
        template = ps.template
        seen = self._seen.get(id(template))
        if seen is not None and seen[0] is template and seen[1] is ps.needs and seen[2] is ps.flavor:
            return seen[3], seen[4]
        key = self.key(ps)
        cached = self._lists.get(key)
        found = (cached, self._names[key]) if cached is not None else self._read(ps, key)
        if len(self._seen) >= MAX_REMEMBERED:
            self._seen.clear()
        self._seen[id(template)] = (template, ps.needs, ps.flavor, *found)
        return found

    def sorted_names(self, names: set[str]) -> list[str]:
        """``names`` sorted: remembered for a name set :meth:`of` returned."""
        known = self._sorted.get(id(names))
        return sorted(names) if known is None else known

    def _read(self, ps: GangPodSet, key: EligibilityKey) -> tuple[list[NodeState], set[str]]:
        tolerations = (*ps.template.tolerations, *(ps.flavor.tolerations if ps.flavor else ()))
        flavor_labels = ps.flavor.node_labels if ps.flavor else {}
        out = []
        for state in self._nodes.values():
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
        self._lists[key] = out
        names = self._names[key] = {s.name for s in out}
        self._sorted[id(names)] = sorted(names)
        return out, names

    def capacity_milli(self, state: NodeState) -> int:
        """A node's GPUs in milli-GPU (a MIG GPU by its instances' compute slices of 7). Its
        devices never change, nor, unless MIG repartitioning is on, their instances: then it
        is remembered."""
        fixed = not self._config.mig_repartition
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

    def gang_capacity_milli(self, pod_sets: Sequence[GangPodSet], names: set[str]) -> int:
        """The GPUs (milli) of ``names``, the eligible nodes of ``pod_sets``: remembered by the
        pod sets' eligibility keys while the nodes' devices are fixed (see capacity_milli), and
        until the eligible-node lists are dropped."""
        nodes = self._nodes
        if self._config.mig_repartition:
            return sum(self.capacity_milli(nodes[n]) for n in names)
        key = tuple(self.key(ps) for ps in pod_sets)
        known = self._gang_capacity.get(key)
        if known is None:
            known = self._gang_capacity[key] = sum(self.capacity_milli(nodes[n]) for n in names)
        return known

    def why_not(self, ps: GangPodSet) -> PlacementFailure:
        """The most specific reason no node can ever hold this pod set."""
        advertising = [s for s in self._nodes.values() if s.advertises(ps.needs) and not s.node.unschedulable]
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
