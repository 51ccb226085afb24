"""The devices drivers publish through ResourceSlices, where each is reachable, and what is held.

:class:`DraInventory` indexes the devices of each pool's newest generation (one integer per
device), the nodes each device is reachable from (a node-local slice, or a node selector, or all
nodes), the pools' shared counters, and what is held during one scheduling call: devices given
whole to one owner, capacity consumed on devices that allow multiple allocations, and counters
consumed by partitions (a MIG profile consumes the memory slices of its physical GPU, so two
overlapping partitions never both fit). Every take and give back goes through it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction

from gpuplane.model.dra import AllocatedDevice, Device, DraObjects, ResourceSlice
from gpuplane.model.objects import Node, NodeSelectorTerm

ZERO = Fraction(0)


@dataclass(frozen=True, slots=True)
class DeviceEntry:
    """One published device: its driver, pool and slice, and the device itself."""

    index: int
    driver: str
    pool: str
    device: Device

    def qualify(self, name: str) -> str:
        return name if "/" in name else f"{self.driver}/{name}"


# One thing an owner holds: a device index, and the capacity it consumes (None: the whole device).
Take = tuple[int, Mapping[str, Fraction] | None]
Released = tuple[list[Take], dict[str, tuple[str, tuple[AllocatedDevice, ...]]]]


def _reaches(terms: tuple[NodeSelectorTerm, ...] | None, node: Node) -> bool:
    return terms is not None and any(t.matches(node.labels) for t in terms)


class DraInventory:
    """Published devices and what is held of them during one scheduling call.

    Owns the device entries, the nodes each reaches, the free counters per (driver, pool,
    counter set), the devices taken whole (by owner), the capacity consumed on shared devices,
    what each owner holds, and the shared claims allocated in this call (claim key -> owner and
    results)."""

    def __init__(self, objects: DraObjects, nodes: Iterable[Node]) -> None:
        self.entries: list[DeviceEntry] = []
        self.by_name: dict[tuple[str, str, str], int] = {}
        self.node_devices: dict[str, list[int]] = {}
        self.reach: list[set[str]] = []
        self.counters: dict[tuple[str, str, str], dict[str, Fraction]] = {}
        self.incomplete: set[tuple[str, str]] = set()
        self.taken: dict[int, str] = {}
        self.shares: dict[int, int] = {}  # allocations of a device that allows several
        self.consumed: dict[int, dict[str, Fraction]] = {}
        self.owners: dict[str, list[Take]] = {}
        self.shared_claims: dict[str, tuple[str, tuple[AllocatedDevice, ...]]] = {}
        self.free_on: dict[str, int] = {}  # devices not taken whole, per node
        self.buckets: dict[int, dict[str, None]] = {}  # nodes by free_on (insertion-ordered)
        node_list = list(nodes)
        current = objects.current_slices()
        seen: dict[tuple[str, str], int] = {}
        for s in current:
            seen[(s.driver, s.pool)] = seen.get((s.driver, s.pool), 0) + 1
            for set_name, counters in s.shared_counters.items():
                self.counters[(s.driver, s.pool, set_name)] = dict(counters)
            for device in s.devices:
                self._add(s, device, node_list)
        self.incomplete = {
            pool
            for pool, n in seen.items()
            if any(s.slice_count > n for s in current if (s.driver, s.pool) == pool)
        }
        for name, devices in self.node_devices.items():
            self.free_on[name] = len(devices)
            self.buckets.setdefault(len(devices), {})[name] = None

    def _add(self, s: ResourceSlice, device: Device, nodes: list[Node]) -> None:
        index = len(self.entries)
        self.entries.append(DeviceEntry(index, s.driver, s.pool, device))
        self.by_name[(s.driver, s.pool, device.name)] = index
        if s.per_device_nodes:
            node_name, terms, everywhere = device.node_name, device.node_terms, device.all_nodes
        else:
            node_name, terms, everywhere = s.node_name, s.node_terms, s.all_nodes
        if node_name is not None:
            reach = {node_name}
        else:
            reach = {n.name for n in nodes if everywhere or _reaches(terms, n)}
        self.reach.append(reach)
        for name in reach:
            self.node_devices.setdefault(name, []).append(index)

    # --- reading -----------------------------------------------------------------------------

    def counters_free(self, entry: DeviceEntry) -> bool:
        """Whether the counters ``entry`` consumes are all still free."""
        for set_name, amounts in entry.device.consumes.items():
            free = self.counters.get((entry.driver, entry.pool, set_name))
            if free is None:
                return False
            for counter, amount in amounts.items():
                if free.get(counter, ZERO) < amount:
                    return False
        return True

    def capacity_left(self, index: int, name: str) -> Fraction:
        device = self.entries[index].device
        return device.capacity.get(name, ZERO) - self.consumed.get(index, {}).get(name, ZERO)

    # --- holding -----------------------------------------------------------------------------

    def take(self, owner: str, index: int, consumed: Mapping[str, Fraction] | None) -> None:
        """``owner`` takes device ``index``: whole (``consumed`` None) or that much of its capacity."""
        entry = self.entries[index]
        first = True
        if consumed is None:
            self.taken[index] = owner
            for node in self.reach[index]:
                self._free_changed(node, -1)
        else:
            first = self.shares.get(index, 0) == 0
            self.shares[index] = self.shares.get(index, 0) + 1
            used = self.consumed.setdefault(index, {})
            for name, amount in consumed.items():
                used[name] = used.get(name, ZERO) + amount
        if first:
            self._count(entry, -1)
        self.owners.setdefault(owner, []).append((index, consumed))

    def give_back(self, owner: str, index: int, consumed: Mapping[str, Fraction] | None) -> None:
        """Undo one :meth:`take` of ``owner``."""
        entry = self.entries[index]
        held = self.owners.get(owner, [])
        for i in range(len(held) - 1, -1, -1):
            if held[i][0] == index and held[i][1] is consumed:
                del held[i]
                break
        if not held:
            self.owners.pop(owner, None)
        last = True
        if consumed is None:
            self.taken.pop(index, None)
            for node in self.reach[index]:
                self._free_changed(node, 1)
        else:
            self.shares[index] -= 1
            last = self.shares[index] == 0
            used = self.consumed[index]
            for name, amount in consumed.items():
                used[name] -= amount
        if last:
            self._count(entry, 1)

    def _free_changed(self, node: str, delta: int) -> None:
        free = self.free_on[node]
        bucket = self.buckets[free]
        del bucket[node]
        if not bucket:
            del self.buckets[free]
        self.free_on[node] = free + delta
        self.buckets.setdefault(free + delta, {})[node] = None

    def _count(self, entry: DeviceEntry, sign: int) -> None:
        for set_name, amounts in entry.device.consumes.items():
            free = self.counters.get((entry.driver, entry.pool, set_name))
            if free is None:
                continue
            for counter, amount in amounts.items():
                free[counter] = free.get(counter, ZERO) + sign * amount

    def release(self, owner: str) -> Released:
        """Give back everything ``owner`` holds and its shared claims; what it held, for :meth:`restore`."""
        held = list(self.owners.get(owner, []))
        for index, consumed in reversed(held):
            self.give_back(owner, index, consumed)
        claims = {k: v for k, v in self.shared_claims.items() if v[0] == owner}
        for key in claims:
            del self.shared_claims[key]
        return held, claims

    def restore(self, owner: str, released: Released) -> None:
        """Take back what :meth:`release` gave back."""
        held, claims = released
        for index, consumed in held:
            self.take(owner, index, consumed)
        self.shared_claims.update(claims)

    def hold_allocation(self, owner: str, results: Iterable[AllocatedDevice]) -> list[str]:
        """Hold a claim's recorded allocation; the devices no longer published (by name)."""
        gone = []
        for r in results:
            index = self.by_name.get((r.driver, r.pool, r.device))
            if index is None:
                gone.append(f"{r.driver}/{r.pool}/{r.device}")
                continue
            entry = self.entries[index]
            if entry.device.allow_multiple:
                self.take(owner, index, dict(r.consumed))
            elif index not in self.taken:
                self.take(owner, index, None)
        return gone
