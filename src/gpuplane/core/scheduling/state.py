"""The scheduler's working state, and what a cycle passes between its phases.

:class:`SchedulerState` holds the one mutable copy of a scheduling call (or a session): the quota
tree, the queues and what is remembered about them, the admissions and preemptions so far, and the
node inventory. Each phase of a cycle is a layer on top of it, in its own module:

- :mod:`.queues`: the ClusterQueues' queues, their heads, parking, and the events a driver feeds in;
- :mod:`.nominate`: flavor assignment and preemption targets for one head, and what is remembered
  about a nomination (flavor scan progress, the outcome per workload shape);
- :mod:`.order`: the order in which a cycle's entries are tried (classical, or fair sharing);
- :mod:`.preempt`: evicting victims, overlapping targets, quota held for a preemption to come;
- :mod:`.nodes`: the gang on the nodes (pods already bound, plans already admitted, a probe);
- :mod:`.admit`: one entry's outcome in the cycle, the admission itself, and admission checks.

:class:`gpuplane.core.scheduler.Scheduler` stacks them and runs the cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuplane.core.admission_checks import CheckGate, Verdict
from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import Assignment, EligibilityMemo
from gpuplane.core.gang import Cluster, GangPlacement, GangPodSet
from gpuplane.core.inventory import NeedsMemo
from gpuplane.core.plan import AdmissionDecision, PreemptionDecision
from gpuplane.core.preemption import Preemptor, Target
from gpuplane.core.quota import ClusterQueueNode, FlavorResource, QuotaTree
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model import labels as keys
from gpuplane.model.admission_checks import CheckStatus
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
    reason: str
    message: str


@dataclass(slots=True)
class CycleResult:
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
# What ``Queues._plain_gang`` remembers: workload, queue spec and flavor read, the pod set on the
# flavor, and what it asks of each of the flavor's resources in quota.
PlainGang = tuple[
    Workload, ClusterQueue, ResourceFlavor | None, GangPodSet | None, tuple[tuple[FlavorResource, int], ...]
]


class Parked(set[str]):
    """The keys of the parked workloads (BestEffortFIFO), and those a completion's wake may tell
    apart by kind: a workload parked for quota or for room on the nodes, with a shape (see
    :meth:`SchedulerState._shape`), is filed per ClusterQueue under its shape, its reason (room
    or quota) and the flavors it could be assigned; the others per ClusterQueue as they are.
    The wake's bounds read of a workload only its kind (:meth:`Queues._still_short`), so a
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


class SchedulerState:
    """The working state of one ``schedule`` call, or of a session for its whole life.

    It is built from a frozen :class:`ClusterState`; the layers above fill the queues and hold
    what is already running (see :class:`gpuplane.core.scheduler.Scheduler`).
    """

    def __init__(self, state: ClusterState, config: SchedulerConfig, now: float) -> None:
        self.state = state
        self.config = config
        self.now = now
        self.tree = QuotaTree(state)
        self.preemptor = Preemptor(self.tree, config, now)
        self.queues: dict[str, list[PendingWorkload]] = {name: [] for name in sorted(state.cluster_queues)}
        self.parked = Parked()
        # Per queue, every workload before this index is parked (BestEffortFIFO).
        self.cursor: dict[str, int] = dict.fromkeys(self.queues, 0)
        # Per queue, the workload that issued preemptions in the last cycle (drives the next one).
        self.preemptor_of: dict[str, str] = {}
        self.status: dict[str, Status] = {}
        # Workloads not queued anywhere: their ClusterQueue and LocalQueue (if known) and why.
        self.unqueued: dict[str, tuple[str | None, str | None, Status]] = {}
        self.admitted: dict[str, AdmissionDecision] = {}
        self.preempted: list[PreemptionDecision] = []
        self.workloads: dict[str, Workload] = {}
        self.cycle_number = 0
        # Nomination outcomes that park a workload, by workload shape, valid while nothing
        # changes the quota tree, the nodes or the clock (see ``_remembered``).
        self.state_version = 0
        self._failed: dict[int, Status] = {}
        self._failed_version = -1
        # Each workload's shape (see ``Nomination._shape``) as the number of its shape in
        # ``_shape_ids``, with the workload object, queue and priority it was read for.
        self._shapes: dict[str, tuple[Workload, str, int, int]] = {}
        self._shape_ids: dict[tuple[object, ...], int] = {}
        self._eligible: dict[str, tuple[Workload, str, frozenset[str]]] = {}
        # Per workload and flavor, the wake's room bound's parts that do not depend on usage
        # (see ``Queues._plain_gang``), with the workload, queue spec and flavor they were read for.
        self._plain: dict[tuple[str, str], PlainGang] = {}
        self._inactive: dict[str, str | None] = {}  # by ClusterQueue, see Nomination._inactive_reason
        self._needs = NeedsMemo(config.devices)  # each pod template's needs, read once
        self._eligibility = EligibilityMemo()  # which flavors each pod template may take
        self._sequence = 0
        self.scan: dict[str, ScanProgress] = {}
        # Per root of the cohort tree, admissions and evictions so far (Kueue's
        # AllocatableResourceGeneration): a change makes an older flavor scan outdated.
        self.generation: dict[str, int] = {}
        self.flavors = dict(state.resource_flavors)
        if not self.flavors:
            # A state with no ResourceFlavor objects at all (a quick what-if file)
            # takes every flavor it names as an empty one: no labels, no taints.
            named = {
                f.name for q in state.cluster_queues.values() for g in q.resource_groups for f in g.flavors
            }
            named |= {f.name for c in state.cohorts.values() for g in c.resource_groups for f in g.flavors}
            self.flavors = {name: ResourceFlavor(name=name) for name in named}
        self.gate = CheckGate(state)
        self._checked: list[tuple[Workload, Verdict]] = []  # reserved, waiting for or past checks
        self._leaving: list[tuple[Workload, CheckStatus]] = []  # reservations a check ends
        self.cluster = Cluster(state.nodes, config.devices) if state.nodes else None
        self.notes: list[str] = []

    # --- flavor scan generations (Kueue's AllocatableResourceGeneration) -----

    def _generation(self, cq_name: str) -> int:
        return self.generation.get(self.tree.queues[cq_name].root().name, 0)

    def _bump_generation(self, cq_name: str) -> None:
        if cq_name in self.tree.queues:
            root = self.tree.queues[cq_name].root().name
            self.generation[root] = self.generation.get(root, 0) + 1
        self.state_version += 1  # whatever moves a cohort's generation may change an outcome

    def _shape(self, pending: PendingWorkload) -> int | None:
        """What a nomination reads of a workload, as a small number (equal for equal shapes), or
        ``None`` where the outcome may depend on more (fair sharing orders by usage;
        ``LowerOrNewerEqualPriority`` by queue time)."""
        wl = pending.workload
        cached = self._shapes.get(pending.key)
        # Read again when requeued elsewhere or at another priority.
        if cached is not None and cached[0] is wl:
            _, queue, priority, number = cached
            if queue == pending.cluster_queue and priority == pending.priority:
                return number
        if self.config.fair_sharing:
            return None
        policy = self.tree.queues[pending.cluster_queue].spec.preemption
        if "LowerOrNewerEqualPriority" in (policy.within_cluster_queue, policy.reclaim_within_cohort):
            return None
        pod_sets = tuple(
            (
                ps.name,
                ps.count,
                ps.min_count,
                ps.required_topology,
                ps.preferred_topology,
                tuple(sorted(ps.template.requests.items())),
                ps.template.limits_below_requests,
                tuple(sorted(ps.template.node_selector.items())),
                ps.template.required_node_terms,
                ps.template.tolerations,
                tuple(sorted(ps.template.labels.items())),
                tuple(sorted(ps.template.annotations.items())),
            )
            for ps in wl.pod_sets
        )
        shape = (pending.cluster_queue, pending.priority, wl.namespace, pod_sets)
        number = self._shape_ids.setdefault(shape, len(self._shape_ids))
        self._shapes[pending.key] = (wl, pending.cluster_queue, pending.priority, number)
        return number
