"""Topology domains (the nodes that share a value of a topology label) and their free GPU."""

from __future__ import annotations

from collections.abc import Mapping

from gpuplane.core.placement.devices import NodeState


class TopologyDomains:
    """The domains of every topology level a gang asked for, and the free milli-GPU of each.

    Owns the levels tracked (a level is tracked from the first gang that names it), the free GPU
    per (level, value), and the member nodes of each domain. Reads the node states and their free
    milli-GPU from :class:`~gpuplane.core.placement.node_holdings.NodeHoldings`, which reports each
    change of a node's free GPU (:meth:`free_changed`)."""

    def __init__(self, nodes: Mapping[str, NodeState], free_milli: Mapping[str, int]) -> None:
        self._nodes = nodes
        self._free_milli = free_milli
        self._levels: set[str] = set()
        self._free: dict[tuple[str, str], int] = {}
        self._members: dict[str, dict[str, set[str]]] = {}

    def free_changed(self, state: NodeState, delta: int) -> None:
        for level in self._levels:
            value = state.labels.get(level)
            if value is not None:
                self._free[(level, value)] += delta

    def rebuild(self) -> None:
        """Read the domains again (a node's labels changed); the same levels stay tracked."""
        self._members.clear()
        levels, self._levels = self._levels, set()
        self._free.clear()
        for level in sorted(levels):
            self._track(level)

    def _track(self, level: str) -> None:
        if level in self._levels:
            return
        self._levels.add(level)
        free_milli = self._free_milli
        for name, state in self._nodes.items():
            value = state.labels.get(level)
            if value is not None:
                key = (level, value)
                self._free[key] = self._free.get(key, 0) + free_milli[name]

    def holding(self, level: str, demand: int) -> list[set[str]]:
        """The member names of the domains of ``level`` with at least ``demand`` milli-GPU free,
        smallest first."""
        self._track(level)
        values = sorted(
            (free, value) for (lvl, value), free in self._free.items() if lvl == level and free >= demand
        )
        members = self._members.get(level)
        if members is None:
            members = {}
            for state in self._nodes.values():
                value = state.labels.get(level)
                if value is not None:
                    members.setdefault(value, set()).add(state.name)
            self._members[level] = members
        return [members[v] for _, v in values]
