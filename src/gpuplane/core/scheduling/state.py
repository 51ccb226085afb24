"""The scheduler's working state, and what a cycle passes between its phases.

:class:`Ledger` is the record the parts share (clock, versions, admissions, preemptions). Each part
of the scheduler is one object in its own module, holding references to the parts it uses:

- :mod:`.shapes`: what a nomination reads of a workload (its shape) and the flavors it could take;
- :mod:`.queue_manager`: the ClusterQueues' queues, their heads, parking, the pending reasons;
- :mod:`.fair_order`: the fair-sharing order of a cycle's entries (the classical one is a key);
- :mod:`.nominator`: flavor assignment and preemption targets for one head, the flavor scan;
- :mod:`.placer`: the gang on the nodes (pods already bound, plans already admitted, a probe);
- :mod:`.waker`: which parked workloads a release of quota or nodes wakes;
- :mod:`.evictor`: what frees quota (a preemption's victims, a finish, an eviction);
- :mod:`.reservations`: quota reserved while admission checks are pending;
- :mod:`.cycle`: one cycle, which drives them all.

:class:`gpuplane.core.scheduler.Scheduler` builds them, loads a cluster state and delegates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from gpuplane.core.flavors import Assignment
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.gangs import GangPlacement, GangPodSet
from gpuplane.core.plan import AdmissionDecision, PreemptionDecision
from gpuplane.core.quota import ClusterQueueNode, FlavorResource, QuotaTree
from gpuplane.core.victims import Target
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model import labels as keys
from gpuplane.model.objects import ClusterQueue, ClusterState, ResourceFlavor, Workload

# Pending reasons (Kueue's QuotaReserved=False reasons where Kueue has one).
# A reference that does not resolve: no LocalQueue, no ClusterQueue (getQueueBlocker).
# A queue that exists but is inactive: stopped, or naming a missing flavor.
WORKLOAD_LABEL = keys.KUEUE_WORKLOAD_LABEL  # alias; the key lives in model.labels


@dataclass(slots=True)
class Entry:
    """A head workload nominated in one cycle."""

    pending: PendingWorkload
    cq: ClusterQueueNode
    assignment: Assignment
    targets: list[Target]
    reason: str = ""
    message: str = ""
    requeue_now: bool = False  # skipped or waiting for victims: stays active
    placement: GangPlacement | None = None
    keep_scan: bool = True  # whether the flavor scan resumes where it stopped (LastAssignment)
    # Decided on the cycle's starting state alone: nothing was reserved or evicted before it
    # in the cycle, and it reserved nothing itself.
    decided_alone: bool = False
    # What the nomination read of the workload (:meth:`.shapes.Shapes.of`), where known.
    shape: int | None = None


@dataclass(slots=True)
class ScanProgress:
    """Kueue's LastAssignment: where a workload's flavor scan stopped, and when.

    ``tried`` maps (pod set index, resource) to the last flavor index reached, -1 once the scan
    went past the last flavor. ``generation`` is the cohort's admission/eviction count then.
    """

    cycle: int
    generation: int
    tried: dict[tuple[int, str], int]

    @property
    def pending_flavors(self) -> bool:
        return any(index != -1 for index in self.tried.values())


@dataclass(slots=True)
class Status:
    """A pending workload's last reason (:class:`Reason`) and message."""

    reason: Reason
    message: str


@dataclass(slots=True)
class CycleResult:
    """What one call of the cycle did: admissions, preemptions, and counts of what else changed."""

    admitted: list[AdmissionDecision] = field(default_factory=list)
    preempted: list[PreemptionDecision] = field(default_factory=list)
    parked: int = 0
    rescans: int = 0  # workloads whose next cycle resumes at a later flavor
    released: int = 0  # reservations ended by an admission check (Retry, Rejected)
    cycles: int = 1  # Kueue cycles this result stands for (see Scheduler.cycle)

    @property
    def changed(self) -> bool:
        return bool(self.admitted or self.preempted or self.parked or self.rescans or self.released)


EntryKey = tuple[int, int, float, int]


def classical_key(e: Entry, priority_sorting: bool) -> EntryKey:
    """Kueue's order of a cycle's entries: not borrowing first, then (with priority sorting
    within the cohort) higher priority, then earlier queue time; the sequence breaks ties."""
    priority = -e.pending.priority if priority_sorting else 0
    return (e.assignment.borrowing, priority, e.pending.timestamp, e.pending.sequence)


@dataclass(slots=True)
class CycleWork:
    """What the entries decided so far in one cycle hold: quota reserved (given back at the end of
    the cycle), victims chosen and by whom, and the entries to admit."""

    reservations: list[tuple[ClusterQueueNode, dict[tuple[str, str], int]]] = field(default_factory=list)
    victims: dict[str, Target] = field(default_factory=dict)
    victim_preemptor: dict[str, str] = field(default_factory=dict)
    admitted: list[Entry] = field(default_factory=list)
    # The entries still to process, smallest key first (classical order only; None under fair
    # sharing): an entry that moves on to a later flavor is put back here by its new key.
    later: list[tuple[EntryKey, Entry]] | None = None

    def reserve(self, cq: ClusterQueueNode, usage: dict[tuple[str, str], int]) -> None:
        """Hold ``usage`` in ``cq`` for the rest of the cycle."""
        cq.add_usage_map(usage)
        self.reservations.append((cq, usage))


Kind = tuple[int, bool, frozenset[str]]  # (shape, parked for room, eligible flavors)
# What ``Waker.plain_gang`` remembers: workload, queue spec and flavor read, the pod set on the
# flavor, and what it asks of each of the flavor's resources in quota.
PlainGang = tuple[
    Workload, ClusterQueue, ResourceFlavor | None, GangPodSet | None, tuple[tuple[FlavorResource, int], ...]
]


class Parked(set[str]):
    """The keys of the parked workloads (BestEffortFIFO), and those a completion's wake may tell
    apart by kind: a workload parked for quota or for room on the nodes, with a shape (see
    :meth:`.shapes.Shapes.of`), is filed per ClusterQueue under its shape, its reason (room
    or quota) and the flavors it could be assigned; the others per ClusterQueue as they are.
    The wake's bounds read of a workload only its kind (:meth:`.waker.Waker.still_short`), so a
    completion decides once per kind instead of once per parked workload. Whatever removes a
    key (an admission, a withdrawal, a wake, new capacity) removes it from the files too."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: dict[str, dict[Kind, dict[str, PendingWorkload]]] = {}
        self.loose: dict[str, dict[str, PendingWorkload]] = {}
        self._filed: dict[str, tuple[str, Kind | None]] = {}

    def park(self, pending: PendingWorkload, kind: Kind | None) -> None:
        key, queue = pending.key, pending.cluster_queue
        self.add(key)
        if kind is None:
            self.loose.setdefault(queue, {})[key] = pending
        else:
            self.kinds.setdefault(queue, {}).setdefault(kind, {})[key] = pending
        self._filed[key] = (queue, kind)

    def discard(self, key: object) -> None:
        super().discard(key)
        filed = self._filed.pop(key, None) if isinstance(key, str) else None
        if filed is None:
            return
        queue, kind = filed
        assert isinstance(key, str)
        if kind is None:
            del self.loose[queue][key]
            return
        members = self.kinds[queue][kind]
        del members[key]
        if not members:
            del self.kinds[queue][kind]

    def remove(self, key: object) -> None:
        if key not in self:
            raise KeyError(key)
        self.discard(key)

    def clear(self) -> None:
        super().clear()
        self.kinds.clear()
        self.loose.clear()
        self._filed.clear()


def flavors_of(state: ClusterState) -> dict[str, ResourceFlavor]:
    """The ResourceFlavors by name. A state with no ResourceFlavor objects at all (a quick what-if
    file) takes every flavor it names as an empty one: no labels, no taints."""
    if state.resource_flavors:
        return dict(state.resource_flavors)
    named = {f.name for q in state.cluster_queues.values() for g in q.resource_groups for f in g.flavors}
    named |= {f.name for c in state.cohorts.values() for g in c.resource_groups for f in g.flavors}
    return {name: ResourceFlavor(name=name) for name in named}


K = TypeVar("K")
V = TypeVar("V")


class Ledger:
    """The record that the scheduler's parts share: the clock and the cycle count, the version that
    invalidates what is remembered about outcomes (``state_version``), each cohort tree's generation
    (Kueue's AllocatableResourceGeneration), every workload by key, the admissions that stand, the
    preemptions made so far and the notes."""

    def __init__(self, tree: QuotaTree, now: float) -> None:
        self.tree = tree
        self.now = now
        self.cycle_number = 0
        # Nomination outcomes that park a workload are remembered by shape while nothing changes
        # the quota tree, the nodes or the clock: whatever does moves this.
        self.state_version = 0
        # Per root of the cohort tree, admissions and evictions so far: a change makes an older
        # flavor scan outdated.
        self.generation: dict[str, int] = {}
        self.workloads: dict[str, Workload] = {}
        self.admitted: dict[str, AdmissionDecision] = {}
        self.preempted: list[PreemptionDecision] = []
        self.notes: list[str] = []

    def generation_of(self, cq_name: str) -> int:
        return self.generation.get(self.tree.queues[cq_name].root().name, 0)

    def bump_generation(self, cq_name: str) -> None:
        if cq_name in self.tree.queues:
            root = self.tree.queues[cq_name].root().name
            self.generation[root] = self.generation.get(root, 0) + 1
        self.state_version += 1  # whatever moves a cohort's generation may change an outcome


class StateMemo(Generic[K, V]):
    """What one part of the scheduler remembers about outcomes on the present state (the parked
    outcomes by shape, the known assignments, the one-pod gangs that found no place). Owns the
    check that keeps it true: :meth:`entries` empties it once the ledger's ``state_version`` has
    moved, and, with ``clock``, once the ledger's clock has (for what the clock may change even
    where the version does not, such as the preemption an assignment simulates)."""

    def __init__(self, ledger: Ledger, *, clock: bool) -> None:
        self.ledger = ledger
        self.clock = clock
        self._entries: dict[K, V] = {}
        self._at: tuple[int, float] = (-1, 0.0)

    def entries(self) -> dict[K, V]:
        """The entries kept on the ledger's present state."""
        ledger = self.ledger
        at = (ledger.state_version, ledger.now if self.clock else 0.0)
        if at != self._at:
            self._entries.clear()
            self._at = at
        return self._entries

    def as_checked(self) -> dict[K, V]:
        """The entries as :meth:`entries` last found them, without checking again: what is added
        here belongs to the state of that check and goes with it (an outcome found on a state
        that has moved on since is never taken for one on the new state)."""
        return self._entries
