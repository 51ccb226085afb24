"""What is held on every node during one scheduling call, and the indexes read from it.

:class:`NodeHoldings` is the one place that changes a node's free devices: every take and give
back of a gang placement goes through it, and it brings its indexes up to date in the same step
(nodes by free whole GPUs, free milli-GPU per node, the free GPU of each topology domain, and the
rows of the placement engine's GPU array). Nothing outside it keeps a copy of a node's free devices
in step.

:class:`GpuRows` is the placement engine's view of the nodes with exclusive GPUs: a vectorised
:class:`~gpuplane.core.placement.gpu_arrays.GpuArrays` with one row per such node. It is derived
from the device inventory: a change marks the node's row out of date, and the row is read again
from the node only when the engine reads it.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np

from gpuplane.core.placement.devices import DeviceConfig, DeviceGrant, NodeState, PodNeeds, node_state
from gpuplane.core.placement.gpu_arrays import GpuArrays, IntArray, NodeSpec
from gpuplane.core.placement.topology_domains import TopologyDomains
from gpuplane.model.objects import Node

_MIB = 1024 * 1024

# What an owner holds: (node, needs of the pod, its devices), one entry per pod.
Held = tuple[str, PodNeeds, tuple[DeviceGrant, ...]]


class GpuRows:
    """The engine's GPU array of the nodes with exclusive GPUs, derived from their device states.

    Owns the :class:`GpuArrays` (row per node, column j the node's j-th exclusive GPU), which rows
    are out of date, and each node's *look*: what the engine's score plugins read of a node, as a
    small integer shared by nodes that look alike (its shape, what its pods use, the free milli-GPU
    of each exclusive GPU). Only :class:`NodeHoldings` marks rows out of date."""

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.row: dict[str, int] = {}
        self._columns: list[list[int]] = []
        specs: list[NodeSpec] = []
        for state in nodes:
            exclusive = [d.index for d in state.devices if d.sharing == "exclusive"]
            if not exclusive:
                continue
            self.row[state.name] = len(specs)
            self._columns.append(exclusive)
            alloc = state.allocatable
            specs.append(
                NodeSpec(
                    state.name,
                    cpu=alloc.get("cpu", 0),
                    memory=alloc.get("memory", 0) // _MIB,
                    gpus=len(exclusive),
                    model=state.devices[exclusive[0]].model,
                    max_pods=alloc.get("pods", 110),
                )
            )
        # A new array is all free, as the inventory is before anything is held.
        self.array = GpuArrays(specs) if specs else None
        spec_ids: dict[tuple[object, ...], int] = {}
        self._spec: list[int] = [
            spec_ids.setdefault((s.cpu, s.memory, s.gpus, s.model, s.max_pods), len(spec_ids)) for s in specs
        ]
        self._stale: set[str] = set()  # rows changed since the engine last read them
        self._stale_look: set[str] = set()
        self._looks: dict[str, int] = {}
        self._look_ids: dict[tuple[object, ...], int] = {}

    def changed(self, name: str) -> None:
        """The node ``name`` (one with a row) changed: its row and look are read again when next read."""
        self._stale.add(name)
        self._stale_look.add(name)

    @property
    def look_count(self) -> int:
        return len(self._look_ids)

    def forget_looks(self) -> None:
        """Start the looks afresh (scores kept by look must be dropped with them)."""
        self._look_ids.clear()
        self._looks.clear()

    def look(self, state: NodeState) -> int:
        name = state.name
        look = self._looks.get(name)
        if look is None or name in self._stale_look:
            row = self.row[name]
            key = (
                self._spec[row],
                tuple(sorted(state.used.items())),
                tuple([state.devices[i].milli_free for i in self._columns[row]]),
            )
            look = self._look_ids.setdefault(key, len(self._look_ids))
            self._looks[name] = look
            self._stale_look.discard(name)
        return look

    def looks_of(self, names: Sequence[str], nodes: dict[str, NodeState]) -> list[int]:
        """The looks of ``names`` (each a node with a row)."""
        known, stale = self._looks, self._stale_look
        return [
            look if (look := known.get(n)) is not None and n not in stale else self.look(nodes[n])
            for n in names
        ]

    def rows_of(self, states: Sequence[NodeState]) -> IntArray:
        """The rows of ``states`` (each a node with a row), read again from the nodes where out of date."""
        stale = self._stale
        for state in states:
            if state.name in stale:
                self._sync(state)
                stale.discard(state.name)
        return np.array([self.row[s.name] for s in states], dtype=np.int64)

    def _sync(self, state: NodeState) -> None:
        assert self.array is not None
        row = self.row[state.name]
        alloc, used = state.allocatable, state.used
        self.array.set_free(
            row,
            cpu=max(0, alloc.get("cpu", 0) - used.get("cpu", 0)),
            memory=max(0, alloc.get("memory", 0) - used.get("memory", 0)) // _MIB,
            pods=max(0, used.get("pods", 0)),
            gpu_free=[state.devices[i].milli_free for i in self._columns[row]],
        )


class NodeHoldings:
    """Every node's device state (in name order) and what each owner (a workload, a probe) holds.

    Owns the node states, the owners' holdings, and the indexes kept with them: free whole GPUs per
    node and the nodes bucketed by it, free milli-GPU per node, the nodes with time-sliced or MPS
    GPUs, the engine's :class:`GpuRows` and the free GPU per :class:`TopologyDomains` domain.
    :meth:`_changed` is the one place they follow a node's devices."""

    def __init__(self, nodes: Iterable[Node], config: DeviceConfig) -> None:
        self.config = config
        self.nodes: dict[str, NodeState] = {}
        for node in sorted(nodes, key=lambda n: n.name):
            self.nodes[node.name] = node_state(node, config)
        self.position = {name: i for i, name in enumerate(self.nodes)}  # the inventory's order
        self.owners: dict[str, list[Held]] = {}
        self.free_whole: dict[str, int] = {}
        self.free_milli: dict[str, int] = {}
        self.buckets: dict[int, list[str]] = {}  # free whole GPUs -> node names, sorted
        for name, state in self.nodes.items():
            whole = state.free_whole()
            self.free_whole[name] = whole
            self.free_milli[name] = state.free_gpu_milli()
            self.buckets.setdefault(whole, []).append(name)
        # Nodes with time-sliced or MPS GPUs: a free slot there may count as 0 free milli-GPU.
        self.sliced = {
            name
            for name, state in self.nodes.items()
            if any(d.sharing in ("time-slicing", "mps") for d in state.devices)
        }
        self.rows = GpuRows(self.nodes.values())
        self._with_row = self.rows.row  # (read only) the nodes that have a row
        self.domains = TopologyDomains(self.nodes, self.free_milli)

    def take(self, owner: str, state: NodeState, needs: PodNeeds, grants: Sequence[DeviceGrant]) -> None:
        state.take(owner, needs, grants)
        self._changed(state)

    def give_back(self, owner: str, state: NodeState, needs: PodNeeds, grants: Sequence[DeviceGrant]) -> None:
        state.give_back(owner, needs, grants)
        self._changed(state)

    def record(self, owner: str, held: Iterable[Held]) -> None:
        """``owner`` holds ``held`` too (taken already)."""
        self.owners.setdefault(owner, []).extend(held)

    def release(self, owner: str) -> None:
        """Give back everything ``owner`` holds (idempotent)."""
        for name, needs, grants in self.owners.pop(owner, []):
            self.give_back(owner, self.nodes[name], needs, grants)

    @contextmanager
    def without(self, owners: Iterable[str]) -> Iterator[None]:
        """Simulate that ``owners`` are gone; every device comes back on exit."""
        held = {o: self.owners.pop(o) for o in owners if o in self.owners}
        for owner, items in held.items():
            for name, needs, grants in items:
                self.give_back(owner, self.nodes[name], needs, grants)
        try:
            yield
        finally:
            for owner, items in held.items():
                for name, needs, grants in items:
                    self.take(owner, self.nodes[name], needs, grants)
                self.owners[owner] = items

    def node_changed(self, node: Node) -> None:
        """``node`` (same name, same allocatable) has new labels, taints or schedulability."""
        self.nodes[node.name].node = node
        self.domains.rebuild()

    def _changed(self, state: NodeState) -> None:
        name = state.name
        if name in self._with_row:
            self.rows.changed(name)
        old_whole, new_whole = self.free_whole[name], state.free_whole()
        if old_whole != new_whole:
            bucket = self.buckets[old_whole]
            del bucket[bisect.bisect_left(bucket, name)]
            bisect.insort(self.buckets.setdefault(new_whole, []), name)
            self.free_whole[name] = new_whole
        old_milli, new_milli = self.free_milli[name], state.free_gpu_milli()
        if old_milli != new_milli:
            self.free_milli[name] = new_milli
            self.domains.free_changed(state, new_milli - old_milli)
