"""Scheduling cycles with Kueue's semantics.

``schedule(state, config, now)`` is the pure entry point: a frozen ClusterState in,
a :class:`~gpuplane.core.plan.Plan` out. Internally a :class:`Scheduler` keeps a
working copy (quota tree and queues) that lives only for that call.

One cycle::

    heads (one per ClusterQueue) -> nominate (flavors, preemption targets)
        -> order (classical or fair sharing) -> for each entry:
           NoFit: skip | Preempt without targets: reserve | overlap/no longer fits: skip
           Preempt: evict victims (they are gone in the next cycle) | Fit: admit

With ``cycles=None`` the scheduler repeats cycles until nothing changes (a fixed
point): victims are requeued, and inadmissible workloads of BestEffortFIFO queues
wait aside until capacity is freed in their cohort.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from gpuplane.core.admission_checks import CheckGate, Verdict
from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import (
    FIT,
    NO_FIT,
    PREEMPT,
    Assignment,
    FlavorAssigner,
    flavor_matches_affinity,
    untolerated_taint,
)
from gpuplane.core.gang import Cluster, GangPlacement, GangPodSet, PlacementFailure
from gpuplane.core.inventory import DEVICES_ANNOTATION, NeedsMemo, pod_needs, recorded_grants
from gpuplane.core.karpenter import capacity_to_come
from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import (
    PLACEMENT_ANNOTATION,
    AdmissionDecision,
    PendingDecision,
    Plan,
    PodPlacement,
    PodSetDecision,
    PreemptionDecision,
    recorded_placement,
)
from gpuplane.core.preemption import PreemptionContext, Preemptor, Target
from gpuplane.core.quota import (
    DRS,
    AdmittedWorkload,
    ClusterQueueNode,
    CohortNode,
    FlavorResource,
    QuotaTree,
    compare_drs,
)
from gpuplane.core.spot import SPOT_WITHOUT_FALLBACK, serving_block
from gpuplane.core.workloads import PendingWorkload, admitted_usage, usage_from_assignment
from gpuplane.model import labels as keys
from gpuplane.model.admission_checks import CheckState, CheckStatus
from gpuplane.model.objects import WARM_BUFFER_LABEL, ClusterState, ResourceFlavor, Workload

# Pending reasons (Kueue's QuotaReserved=False reasons where Kueue has one).
QUEUED = Reason.QUEUED
WAITING_FOR_PREEMPTED = Reason.WAITING_FOR_PREEMPTED
# A reference that does not resolve: no LocalQueue, no ClusterQueue (getQueueBlocker).
MISCONFIGURED = Reason.MISCONFIGURED
# A queue that exists but is inactive: stopped, or naming a missing flavor.
SUSPENDED = Reason.SUSPENDED
NAMESPACE_MISMATCH = Reason.NAMESPACE_MISMATCH
WORKLOAD_LABEL = keys.KUEUE_WORKLOAD_LABEL  # alias; the key lives in model.labels
DEACTIVATED = Reason.DEACTIVATED
WAITING_FOR_QUOTA = Reason.WAITING_FOR_QUOTA


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

    @property
    def changed(self) -> bool:
        return bool(self.admitted or self.preempted or self.parked or self.rescans or self.released)


class Scheduler:
    """Working state for one ``schedule`` call. Not shared, not reused."""

    def __init__(self, state: ClusterState, config: SchedulerConfig, now: float) -> None:
        self.state = state
        self.config = config
        self.now = now
        self.tree = QuotaTree(state)
        self.preemptor = Preemptor(self.tree, config, now)
        self.queues: dict[str, list[PendingWorkload]] = {name: [] for name in sorted(state.cluster_queues)}
        self.parked: set[str] = set()
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
        self._failed: dict[tuple[object, ...], Status] = {}
        self._failed_version = -1
        self._shapes: dict[str, tuple[Workload, tuple[object, ...]]] = {}
        self._eligible: dict[str, tuple[Workload, str, frozenset[str]]] = {}
        self._needs = NeedsMemo(config.devices)  # each pod template's needs, read once
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
        for node in self.tree.queues.values():
            node.active = self._inactive_reason(node) is None
        self.cluster = Cluster(state.nodes, config.devices) if state.nodes else None
        self.notes: list[str] = []
        if self.cluster is not None:
            self._hold_running_pods()
        for bad in state.invalid_workloads:
            lq = state.local_queues.get(f"{bad.namespace}/{bad.queue_name}") if bad.queue_name else None
            self.unqueued[bad.key] = (
                lq.cluster_queue if lq is not None else None,
                f"{bad.namespace}/{bad.queue_name}" if bad.queue_name else None,
                Status(MISCONFIGURED, bad.problem),
            )
        for wl in state.workloads:
            self.workloads[wl.key] = wl
            if wl.finished:
                continue
            if wl.admission is not None:
                verdict, check = self.gate.verdict(wl)
                held = admitted_usage(wl, wl.priority, now)
                if held is not None:
                    self.tree.add_workload(held)
                    if check is not None and verdict in (Verdict.RETRY, Verdict.REJECTED):
                        # Like a preemption victim: it holds its quota this cycle, gone the next
                        # (and its nodes, if it was admitted and has pods).
                        if wl.condition_true("Admitted"):
                            self._place_admitted(wl)
                        self._leaving.append((wl, check))
                    elif verdict == Verdict.NONE:
                        self._place_admitted(wl)
                    else:
                        self._checked.append((wl, verdict))
                continue
            self._enqueue(wl, wl.queue_order_timestamp)
        for queue in self.queues.values():
            queue.sort(key=PendingWorkload.sort_key)

    # --- placement ----------------------------------------------------------

    def _hold_running_pods(self) -> None:
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

    def _gang(self, wl: Workload, counts: list[int], flavors: list[dict[str, str]]) -> list[GangPodSet]:
        out = []
        for ps, count, chosen in zip(wl.pod_sets, counts, flavors, strict=True):
            flavor_name = chosen.get(self._device_resource(ps.template.requests)) or next(
                (chosen[r] for r in sorted(chosen)), None
            )
            out.append(
                GangPodSet(
                    name=ps.name,
                    count=count,
                    needs=self._needs.of(ps.template),
                    template=ps.template,
                    flavor=self.flavors.get(flavor_name) if flavor_name else None,
                    required_level=ps.required_topology,
                    preferred_level=ps.preferred_topology,
                )
            )
        return out

    def _device_resource(self, requests: Mapping[str, int]) -> str:
        """The accelerator resource a pod requests, whose flavor places it."""
        return next((name for name in sorted(requests) if self.config.devices.is_device_resource(name)), "")

    def _admission_gang(self, wl: Workload) -> list[GangPodSet]:
        """The gang as ``status.admission`` assigned it: counts and flavors per pod set."""
        assert wl.admission is not None
        by_name = {a.name: a for a in wl.admission.pod_set_assignments}
        counts = [by_name[ps.name].count if ps.name in by_name else 0 for ps in wl.pod_sets]
        flavors = [dict(by_name[ps.name].flavors) if ps.name in by_name else {} for ps in wl.pod_sets]
        return self._gang(wl, counts, flavors)

    def _place_admitted(self, wl: Workload) -> None:
        """Workloads admitted in the input without (all their) pods hold the devices their
        recorded plan names (``PLACEMENT_ANNOTATION``) while those are free; without such a plan,
        a workload with no pod bound is placed as if running."""
        assert wl.admission is not None
        if self.cluster is None:
            return
        planned = recorded_placement(wl.annotations.get(PLACEMENT_ANNOTATION))
        if planned is not None:
            try:
                if self.cluster.hold_planned(wl.key, self._admission_gang(wl), planned):
                    return
            except ValueError as err:
                self.notes.append(f"admitted workload {wl.key}: {err}")
                return
        if wl.key in self.cluster.owners:
            return
        try:
            result = self.cluster.place(wl.key, self._admission_gang(wl))
        except ValueError as err:
            self.notes.append(f"admitted workload {wl.key}: {err}")
            return
        if isinstance(result, PlacementFailure):
            self.notes.append(f"admitted workload {wl.key} has no room on the nodes: {result.message}")

    def _placement_for(self, e: Entry, probe: bool) -> GangPlacement | PlacementFailure:
        assert self.cluster is not None
        counts = [ps.count for ps in e.assignment.pod_sets]
        flavors = [{r: c.flavor for r, c in ps.flavors.items()} for ps in e.assignment.pod_sets]
        gang = self._gang(e.pending.workload, counts, flavors)
        if not probe:
            return self.cluster.place(e.pending.key, gang)
        owner = f"probe:{e.pending.key}"
        with self.cluster.without(t.workload.key for t in e.targets):
            result = self.cluster.place(owner, gang)
            self.cluster.release(owner)
        return result

    # --- queues -------------------------------------------------------------

    # --- driving over time (simulator, controller) ---------------------------

    def advance(self, now: float) -> None:
        """Move the scheduler's clock (time is always passed in, never read)."""
        if now != self.now and self.config.min_runtime_seconds > 0:
            # Only the minimum-runtime protection makes a nomination's outcome depend on the
            # clock (who may be preempted); otherwise a new instant alone changes nothing.
            self.state_version += 1
        self.now = now
        self.preemptor.now = now

    def capacity_changed(self, freed: bool) -> None:
        """A driver changed the nodes outside a cycle (a node failed, or came back: ``freed``).

        Nothing remembered about the old capacity is reused; when capacity was freed, every
        parked workload gets another look, as after a finish.
        """
        self.state_version += 1
        if freed:
            self.parked.clear()
            for name in self.cursor:
                self.cursor[name] = 0

    def submit(self, wl: Workload) -> None:
        """A new pending workload arrives and is queued by its LocalQueue."""
        self.workloads[wl.key] = wl
        self._enqueue(wl, wl.queue_order_timestamp, keep_sorted=True)

    def finish(self, key: str) -> bool:
        """An admitted workload completed: free its quota and devices (idempotent)."""
        held = self.tree.admitted.get(key)
        if held is None:
            return False
        self.tree.remove_workload(held)
        self._bump_generation(held.cluster_queue)
        self.state_version += 1
        if self.cluster is not None:
            self.cluster.release(key)
        self.admitted.pop(key, None)
        self._unpark_cohort(held.cluster_queue, held.flavors)
        self.preemptor.clear_cache()
        return True

    def evict(self, key: str, why: str) -> bool:
        """Evict an admitted workload outside preemption (reaper, node failure) and requeue it."""
        held = self.tree.admitted.get(key)
        if held is None or not self.finish(key):
            return False
        wl = self.workloads.get(key)
        if wl is not None and wl.queue_name:
            self._sequence += 1
            self._enqueue(wl, self.now, keep_sorted=True)
            self.status[key] = Status(QUEUED, f"evicted: {why}; requeued")
        return True

    def withdraw(self, key: str) -> bool:
        """A pending workload was deleted before admission."""
        for queue in self.queues.values():
            for i, pending in enumerate(queue):
                if pending.key == key:
                    del queue[i]
                    name = pending.cluster_queue
                    if i < self.cursor[name]:
                        self.cursor[name] -= 1
                    self.parked.discard(key)
                    self.status.pop(key, None)
                    self.scan.pop(key, None)
                    self._shapes.pop(key, None)
                    return True
        return self.unqueued.pop(key, None) is not None

    def pending_count(self) -> int:
        return sum(len(q) for q in self.queues.values())

    def _enqueue(self, wl: Workload, timestamp: float, keep_sorted: bool = False) -> None:
        lq_key = f"{wl.namespace}/{wl.queue_name}" if wl.queue_name else None
        if not wl.active:
            self.unqueued[wl.key] = (None, lq_key, Status(DEACTIVATED, "The workload is deactivated"))
            return
        # Kueue's getQueueBlocker: each broken reference is the workload's own problem only.
        if lq_key is None:
            status = Status(MISCONFIGURED, "The workload names no LocalQueue")
            self.unqueued[wl.key] = (None, None, status)
            return
        lq = self.state.local_queues.get(lq_key)
        if lq is None:
            msg = f"LocalQueue {wl.queue_name} doesn't exist"
            self.unqueued[wl.key] = (None, lq_key, Status(MISCONFIGURED, msg))
            return
        if lq.stop_policy != "None":
            msg = f"LocalQueue {wl.queue_name} is inactive (stopPolicy {lq.stop_policy})"
            self.unqueued[wl.key] = (lq.cluster_queue, lq_key, Status(SUSPENDED, msg))
            return
        if lq.cluster_queue not in self.queues:
            msg = f"ClusterQueue {lq.cluster_queue} doesn't exist"
            self.unqueued[wl.key] = (lq.cluster_queue, lq_key, Status(MISCONFIGURED, msg))
            return
        self._sequence += 1
        pending = PendingWorkload(wl, lq.cluster_queue, lq_key, wl.priority, timestamp, self._sequence)
        if keep_sorted:
            self._insert(pending)
        else:
            self.queues[lq.cluster_queue].append(pending)
        self.status[wl.key] = Status(QUEUED, "")

    def _insert(self, pending: PendingWorkload) -> None:
        name = pending.cluster_queue
        queue = self.queues[name]
        key = pending.sort_key()
        lo, hi = 0, len(queue)
        while lo < hi:
            mid = (lo + hi) // 2
            if queue[mid].sort_key() < key:
                lo = mid + 1
            else:
                hi = mid
        queue.insert(lo, pending)
        self.cursor[name] = min(self.cursor[name], lo)

    def heads(self) -> list[PendingWorkload]:
        out = []
        for name, queue in self.queues.items():
            if not queue:
                continue
            waiting = self.preemptor_of.get(name)
            if waiting is not None:
                # A workload that evicted victims last cycle heads its queue now, so the
                # capacity it freed is not taken by others first (no preemption ping-pong).
                found = next((p for p in queue if p.key == waiting), None)
                if found is not None:
                    out.append(found)
                    continue
            if self.tree.queues[name].spec.queueing_strategy == "StrictFIFO":
                out.append(queue[0])
                continue
            i = self.cursor[name]
            while i < len(queue) and queue[i].key in self.parked:
                i += 1
            self.cursor[name] = i
            if i < len(queue):
                out.append(queue[i])
        return out

    # --- nomination ---------------------------------------------------------

    def _inactive_reason(self, cq: ClusterQueueNode) -> str | None:
        """Why Kueue's cache keeps the queue inactive (``Stopped``, ``FlavorNotFound``), if it does."""
        if cq.spec.stop_policy != "None":
            return f"ClusterQueue {cq.name} is inactive: Stopped ({cq.spec.stop_policy})"
        missing = sorted({f.name for g in cq.spec.resource_groups for f in g.flavors} - set(self.flavors))
        if missing:
            return f"ClusterQueue {cq.name} is inactive: FlavorNotFound ({', '.join(missing)})"
        return self.gate.inactive_reason(cq.spec)

    def nominate(self, pending: PendingWorkload) -> Entry | Status:
        cq = self.tree.queues[pending.cluster_queue]
        inactive = self._inactive_reason(cq)
        if inactive is not None:
            return Status(SUSPENDED, inactive)
        ns = self.state.namespaces.get(pending.workload.namespace)
        labels = ns.labels if ns is not None else {}
        selector = cq.spec.namespace_selector
        if selector is not None and not selector.matches(labels):
            return Status(NAMESPACE_MISMATCH, "Workload namespace doesn't match ClusterQueue selector")
        bad = sorted({r for ps in pending.workload.pod_sets for r in ps.template.limits_below_requests})
        if bad:
            msg = f"resources validation failed: requests exceed limits for {', '.join(bad)}"
            return Status(MISCONFIGURED, msg)
        if self.cluster is not None:
            try:
                for ps in pending.workload.pod_sets:
                    self._needs.of(ps.template)
            except ValueError as err:
                return Status(MISCONFIGURED, str(err))
        spot_only = serving_block(pending.workload, cq.spec, self.flavors)
        if spot_only is not None:
            return Status(SPOT_WITHOUT_FALLBACK, spot_only)
        assignment, targets = self._assignments(pending, cq)
        entry = Entry(pending, cq, assignment, targets)
        entry.message = assignment.message()
        entry.reason = assignment.no_fit_reason or WAITING_FOR_QUOTA
        return entry

    def _targets(
        self, pending: PendingWorkload, cq: ClusterQueueNode, assignment: Assignment
    ) -> list[Target]:
        ctx = PreemptionContext(
            pending, cq, assignment.flavors_needing_preemption(), assignment.quota_requests(pending)
        )
        return self.preemptor.get_targets(ctx)

    def _assignments(
        self, pending: PendingWorkload, cq: ClusterQueueNode, nominated: list[dict[str, str]] | None = None
    ) -> tuple[Assignment, list[Target]]:
        start = None if nominated is not None else self._scan_start(pending.key, cq)
        assigner = FlavorAssigner(
            pending, cq, self.flavors, self.preemptor, self.config, nominated=nominated, start=start
        )
        full = assigner.assign()
        mode = full.mode()
        if mode == FIT:
            return full, []
        if mode == PREEMPT:
            targets = self._targets(pending, cq, full)
            if targets:
                return full, targets
        pod_sets = pending.workload.pod_sets
        deltas = [ps.count - (ps.count if ps.min_count is None else ps.min_count) for ps in pod_sets]
        total = sum(deltas)
        if not self.config.partial_admission or total == 0:
            return full, []
        found: dict[int, tuple[Assignment, list[Target]]] = {}

        def fits(step: int) -> bool:
            counts = [ps.count - d * step // total for ps, d in zip(pod_sets, deltas, strict=True)]
            partial = assigner.assign(counts)
            pmode = partial.mode()
            if pmode == FIT:
                found[step] = (partial, [])
                return True
            if pmode == PREEMPT:
                targets = self._targets(pending, cq, partial)
                if targets:
                    found[step] = (partial, targets)
                    return True
            return False

        lo, hi = 0, total + 1
        while lo < hi:
            mid = (lo + hi) // 2
            if fits(mid):
                hi = mid
            else:
                lo = mid + 1
        if lo <= total and lo in found:
            return found[lo]
        return full, []

    # --- flavor scan progress (Kueue's LastAssignment) ------------------------

    def _generation(self, cq_name: str) -> int:
        return self.generation.get(self.tree.queues[cq_name].root().name, 0)

    def _bump_generation(self, cq_name: str) -> None:
        if cq_name in self.tree.queues:
            root = self.tree.queues[cq_name].root().name
            self.generation[root] = self.generation.get(root, 0) + 1
        self.state_version += 1  # whatever moves a cohort's generation may change an outcome

    def _scan_start(self, key: str, cq: ClusterQueueNode) -> dict[tuple[int, str], int] | None:
        """Where the flavor scan resumes, or None to start over (lastAssignmentOutdated)."""
        progress = self.scan.get(key)
        if progress is None:
            return None
        recent = self.config.preserve_scan_progress and self.cycle_number - progress.cycle <= 1
        if not recent and self._generation(cq.name) > progress.generation:
            del self.scan[key]
            return None
        return progress.tried

    def _remember_scan(self, e: Entry, generation: int, result: CycleResult) -> bool:
        """Record where the entry's scan stopped; True when flavors are left to try next cycle."""
        if not e.keep_scan:
            self.scan.pop(e.pending.key, None)
            return False
        progress = ScanProgress(self.cycle_number, generation, e.assignment.scan_progress())
        self.scan[e.pending.key] = progress
        if progress.pending_flavors:
            result.rescans += 1
            return True
        return False

    # --- ordering -----------------------------------------------------------

    def _classical_order(self, entries: list[Entry]) -> list[Entry]:
        def key(e: Entry) -> tuple[int, int, float, int]:
            priority = -e.pending.priority if self.config.priority_sorting_within_cohort else 0
            return (e.assignment.borrowing, priority, e.pending.timestamp, e.pending.sequence)

        return sorted(entries, key=key)

    def _fair_order(self, entries: list[Entry]) -> Iterator[Entry]:
        by_cq: dict[str, Entry] = {e.cq.name: e for e in entries}
        remaining = dict(by_cq)
        roots: dict[str, list[Entry]] = {}
        for e in entries:
            roots.setdefault(e.cq.root().name, []).append(e)
        for root_name in sorted(roots):
            group = roots[root_name]
            root = group[0].cq.root()
            if not isinstance(root, CohortNode):
                for e in group:
                    remaining.pop(e.cq.name, None)
                    yield e
                continue
            while any(e.cq.name in remaining for e in group):
                winner = self._tournament(root, remaining)
                assert winner is not None
                del remaining[winner.cq.name]
                yield winner

    def _tournament(self, root: CohortNode, remaining: dict[str, Entry]) -> Entry | None:
        drs: dict[tuple[str, str], DRS] = {}
        for cq in root.subtree_queues():
            entry = remaining.get(cq.name)
            if entry is None:
                continue
            with cq.with_usage(entry.assignment.usage):
                share = cq.dominant_resource_share()
                for ancestor in cq.ancestors():
                    drs[(ancestor.name, entry.pending.key)] = share
                    share = ancestor.dominant_resource_share()
        return self._run_tournament(root, remaining, drs)

    def _run_tournament(
        self, cohort: CohortNode, remaining: dict[str, Entry], drs: dict[tuple[str, str], DRS]
    ) -> Entry | None:
        candidates: list[Entry] = []
        for child in cohort.child_cohorts:
            winner = self._run_tournament(child, remaining, drs)
            if winner is not None:
                candidates.append(winner)
        candidates += [remaining[cq.name] for cq in cohort.child_queues if cq.name in remaining]
        if not candidates:
            return None
        best = candidates[0]
        for current in candidates[1:]:
            if self._fair_less(current, best, cohort.name, drs):
                best = current
        return best

    def _fair_less(self, a: Entry, b: Entry, parent: str, drs: dict[tuple[str, str], DRS]) -> bool:
        a_drs = drs[(parent, a.pending.key)]
        b_drs = drs[(parent, b.pending.key)]
        if self.config.prioritize_non_borrowing:
            a_b = a_drs.borrowing_on(a.assignment.usage)
            b_b = b_drs.borrowing_on(b.assignment.usage)
            if a_b != b_b:
                return not a_b
        cmp = compare_drs(a_drs, b_drs)
        if cmp != 0:
            return cmp == -1
        if self.config.priority_sorting_within_cohort and a.pending.priority != b.pending.priority:
            return a.pending.priority > b.pending.priority
        return a.pending.timestamp < b.pending.timestamp

    # --- the cycle ----------------------------------------------------------

    def cycle(self) -> CycleResult:
        """Run one scheduling cycle and apply its outcome to the working state."""
        self.cycle_number += 1
        result = CycleResult()
        if self.cycle_number == 1:
            self._settle_checked(result)
        # Each head's cohort generation as the cycle starts (nothing before the admissions moves it).
        generations: dict[str, int] = {}
        self.preemptor.clear_cache()
        entries: list[Entry] = []
        if self._failed_version != self.state_version:
            self._failed.clear()
            self._failed_version = self.state_version
        shapes: dict[str, tuple[object, ...]] = {}
        for pending in self.heads():
            if pending.cluster_queue not in generations:
                generations[pending.cluster_queue] = self._generation(pending.cluster_queue)
            # A workload whose flavor scan is under way resumes where it stopped, which its
            # shape does not capture: only scans that start at the first flavor are remembered.
            progress = self.scan.get(pending.key)
            fresh = progress is None or not progress.pending_flavors
            shape = self._shape(pending) if fresh else None
            if shape is not None:
                known = self._failed.get(shape)
                if known is not None:
                    self.status[pending.key] = Status(known.reason, known.message)
                    self._park(pending, result)
                    continue
                shapes[pending.key] = shape
            nominated = self.nominate(pending)
            if isinstance(nominated, Status):
                self.status[pending.key] = nominated
                if shape is not None:
                    self._failed[shape] = nominated
                self._park(pending, result)
                continue
            entries.append(nominated)
        order = (
            self._fair_order(entries) if self.config.fair_sharing else iter(self._classical_order(entries))
        )
        reservations: list[tuple[ClusterQueueNode, dict[tuple[str, str], int]]] = []
        victims: dict[str, Target] = {}
        victim_preemptor: dict[str, str] = {}
        admitted: list[Entry] = []
        for e in order:
            self._process(e, reservations, victims, victim_preemptor, admitted)
        for cq, usage in reversed(reservations):
            cq.remove_usage_map(usage)
        self.preemptor.clear_cache()
        for e in admitted:
            self._admit(e, result)
        for key, target in victims.items():
            self._evict(target, victim_preemptor[key], result)
        self.preemptor_of = {}
        for e in entries:
            if e.pending.key in self.admitted and self.admitted[e.pending.key].cycle == self.cycle_number:
                continue
            self.status[e.pending.key] = Status(e.reason, e.message)
            if e.reason == WAITING_FOR_PREEMPTED:
                self.preemptor_of[e.pending.cluster_queue] = e.pending.key
            # A workload with flavors left to scan is requeued at once (PendingFlavors).
            rescan = self._remember_scan(e, generations[e.pending.cluster_queue], result)
            if not e.requeue_now and not rescan:
                self._park(e.pending, result)
                shape = shapes.get(e.pending.key)
                if shape is not None and e.decided_alone:
                    # Parked on the cycle's starting state alone, with no effect on the
                    # others: a workload of the same shape meets the same outcome until
                    # the state changes.
                    self._failed[shape] = Status(e.reason, e.message)
        if self.cycle_number == 1:
            self._release_leaving(result)
        return result

    def _shape(self, pending: PendingWorkload) -> tuple[object, ...] | None:
        """What a nomination reads of a workload, or ``None`` where the outcome may depend on
        more (fair sharing orders by usage; ``LowerOrNewerEqualPriority`` by queue time)."""
        if self.config.fair_sharing:
            return None
        policy = self.tree.queues[pending.cluster_queue].spec.preemption
        if "LowerOrNewerEqualPriority" in (policy.within_cluster_queue, policy.reclaim_within_cohort):
            return None
        wl = pending.workload
        cached = self._shapes.get(pending.key)
        if cached is not None and cached[0] is wl:
            shape = cached[1]
            if shape[:2] == (pending.cluster_queue, pending.priority):  # requeued elsewhere: recompute
                return shape
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
        self._shapes[pending.key] = (wl, shape)
        return shape

    def _park(self, pending: PendingWorkload, result: CycleResult) -> None:
        if self.tree.queues[pending.cluster_queue].spec.queueing_strategy == "StrictFIFO":
            return
        if pending.key not in self.parked:
            self.parked.add(pending.key)
            result.parked += 1

    def _process(
        self,
        e: Entry,
        reservations: list[tuple[ClusterQueueNode, dict[tuple[str, str], int]]],
        victims: dict[str, Target],
        victim_preemptor: dict[str, str],
        admitted: list[Entry],
    ) -> None:
        cq = e.cq
        e.decided_alone = not reservations and not victims
        deferred = False
        if self.config.recompute_on_overlap and any(t.workload.key in victims for t in e.targets):
            deferred = self._recompute_after_overlap(e, victims)
        mode = e.assignment.mode()
        if mode == NO_FIT:
            return
        if mode == PREEMPT and not e.targets:
            if cq.spec.preemption.reclaim_within_cohort != "Any":
                e.decided_alone = False
                reserve = self._resources_to_reserve(e)
                cq.add_usage_map(reserve)
                reservations.append((cq, reserve))
            return
        if deferred:
            # Fits once the other entries' victims are gone: wait for them, holding the quota.
            e.reason, e.message, e.requeue_now = (
                WAITING_FOR_PREEMPTED,
                "Workload has overlapping preemption targets with another workload, "
                "but will fit after these preemptions complete",
                True,
            )
            usage = dict(e.assignment.usage)
            cq.add_usage_map(usage)
            reservations.append((cq, usage))
            e.keep_scan = False
            return
        if any(t.workload.key in victims for t in e.targets):
            e.reason, e.message, e.requeue_now = (
                WAITING_FOR_QUOTA,
                "Workload has overlapping preemption targets with another workload",
                True,
            )
            e.keep_scan = self.config.preserve_scan_progress
            return
        usage = e.assignment.usage
        removed = [t.workload for t in victims.values()] + [t.workload for t in e.targets]
        with self.tree.without(removed):
            fits = cq.fits(usage)
        if not fits:
            e.reason, e.message, e.requeue_now = (
                WAITING_FOR_QUOTA,
                "Workload no longer fits after processing another workload",
                True,
            )
            e.keep_scan = self.config.preserve_scan_progress
            return
        if self.cluster is not None:
            placed = self._placement_for(e, probe=mode == PREEMPT)
            if isinstance(placed, PlacementFailure):
                if not self._checks_for(e):
                    e.reason, e.message = placed.reason, placed.message + self._to_come(e)
                    if self._next_flavors_now(e):
                        self._process(e, reservations, victims, victim_preemptor, admitted)
                    return
                # Quota without a place: the admission checks (provisioning) bring the place.
            elif mode == FIT:
                e.placement = placed
        for t in e.targets:
            victims[t.workload.key] = t
            victim_preemptor[t.workload.key] = e.pending.key
        cq.add_usage_map(usage)
        reservations.append((cq, dict(usage)))
        if mode == PREEMPT:
            e.keep_scan = False  # markPreemptionOutcome: every flavor again once victims are gone
            e.reason = WAITING_FOR_PREEMPTED
            e.message = (
                e.message + ". " if e.message else ""
            ) + f"Pending the preemption of {len(e.targets)} workload(s)"
            e.requeue_now = True
            return
        admitted.append(e)

    def _next_flavors_now(self, e: Entry) -> bool:
        """After a placement failure, go on with the flavor scan in the same cycle.

        Quota alone chose the flavor; the nodes of that flavor cannot hold the gang. As with
        Kueue's topology-aware flavor assignment, a flavor whose nodes do not fit is passed over
        and the next one tried at once. Waiting a cycle instead lets others take what the next
        flavor has free, a preemptor's freed room included: its victim, requeued, takes it back,
        and is preempted again at the same instant. Returns True when ``e`` now holds the
        assignment (and targets) of a later flavor that fits or can preempt.
        """
        progress = e.assignment.scan_progress()
        if not e.keep_scan or not self.config.flavor_fungibility:
            return False
        if not any(index != -1 for index in progress.values()):
            return False
        assigner = FlavorAssigner(e.pending, e.cq, self.flavors, self.preemptor, self.config, start=progress)
        assignment = assigner.assign()
        mode = assignment.mode()
        if mode == NO_FIT:
            return False
        targets = self._targets(e.pending, e.cq, assignment) if mode == PREEMPT else []
        if mode == PREEMPT and not targets:
            return False
        e.assignment, e.targets = assignment, targets
        e.message = assignment.message()
        e.reason = assignment.no_fit_reason or WAITING_FOR_QUOTA
        return True

    def _recompute_after_overlap(self, e: Entry, victims: Mapping[str, Target]) -> bool:
        """Kueue's updateAssignmentIfNeeded for overlapping targets.

        The assignment is computed again on the flavors it was nominated with, as if the victims
        of earlier entries were already gone. Returns True for a deferred fit: the workload fits
        once those preemptions complete, and must not be admitted in this cycle.
        """
        nominated = [{r: c.flavor for r, c in ps.flavors.items()} for ps in e.assignment.pod_sets]
        if len(nominated) != len(e.pending.workload.pod_sets):
            return False
        self.preemptor.clear_cache()
        with self.tree.without([t.workload for t in victims.values()]):
            e.assignment, e.targets = self._assignments(e.pending, e.cq, nominated)
        self.preemptor.clear_cache()
        e.message = e.assignment.message()
        e.reason = e.assignment.no_fit_reason or WAITING_FOR_QUOTA
        return e.assignment.mode() == FIT

    def _resources_to_reserve(self, e: Entry) -> dict[tuple[str, str], int]:
        cq = e.cq
        out: dict[tuple[str, str], int] = {}
        for fr, usage in e.assignment.usage.items():
            quota = cq.quota_for(fr)
            used = cq.usage.get(fr, 0)
            if e.assignment.borrowing > 0:
                if quota.borrowing_limit is None:
                    reserved = usage
                else:
                    reserved = min(usage, quota.nominal + quota.borrowing_limit - used)
            else:
                reserved = min(usage, quota.nominal - used)
            out[fr] = max(0, reserved)
        return out

    def _admit(self, e: Entry, result: CycleResult) -> None:
        pending = e.pending
        flavors = frozenset(
            (choice.flavor, res) for ps in e.assignment.pod_sets for res, choice in ps.flavors.items()
        )
        held = usage_from_assignment(pending, e.assignment.usage, flavors, self.now)
        self.tree.add_workload(held)
        self._bump_generation(pending.cluster_queue)
        self.scan.pop(pending.key, None)
        self.state_version += 1
        self._shapes.pop(pending.key, None)
        queue = self.queues[pending.cluster_queue]
        index = queue.index(pending)
        del queue[index]
        if index < self.cursor[pending.cluster_queue]:
            self.cursor[pending.cluster_queue] -= 1
        self.parked.discard(pending.key)
        self.status.pop(pending.key, None)
        decision = AdmissionDecision(
            workload=pending.key,
            cluster_queue=pending.cluster_queue,
            pod_sets=tuple(
                PodSetDecision(
                    name=ps.name,
                    count=ps.count,
                    flavors={r: c.flavor for r, c in sorted(ps.flavors.items())},
                    placement=self._placements(e, ps.name),
                )
                for ps in e.assignment.pod_sets
            ),
            cycle=self.cycle_number,
            checks=self._checks_for(e),
        )
        self.admitted[pending.key] = decision
        result.admitted.append(decision)

    def _placements(self, e: Entry, pod_set: str) -> tuple[PodPlacement, ...] | None:
        if e.placement is None:
            return None
        return tuple(
            PodPlacement(p.node, tuple(g.describe() for g in p.grants))
            for p in e.placement.pods.get(pod_set, [])
        )

    def _evict(self, target: Target, preemptor: str, result: CycleResult) -> None:
        victim: AdmittedWorkload = target.workload
        decision = PreemptionDecision(
            workload=victim.key,
            cluster_queue=victim.cluster_queue,
            preemptor=preemptor,
            reason=target.reason,
            cycle=self.cycle_number,
        )
        if not victim.evicted:
            # An already evicted target is still on its way out: no new preemption.
            result.preempted.append(decision)
            self.preempted.append(decision)
        self.tree.remove_workload(victim)
        self._bump_generation(victim.cluster_queue)
        self.state_version += 1
        if self.cluster is not None:
            self.cluster.release(victim.key)
        self.admitted.pop(victim.key, None)
        self._unpark_cohort(victim.cluster_queue, victim.flavors)
        wl = self.workloads.get(victim.key)
        if wl is not None and wl.queue_name:
            evicted_at = self.now + self.cycle_number * 1e-3
            self._sequence += 1
            lq = self.state.local_queues.get(f"{wl.namespace}/{wl.queue_name}")
            if lq is not None and lq.cluster_queue in self.queues and lq.stop_policy == "None":
                self._insert(
                    PendingWorkload(wl, lq.cluster_queue, lq.key, victim.priority, evicted_at, self._sequence)
                )
                self.status[wl.key] = Status(QUEUED, f"Preempted by {preemptor} ({target.reason}); requeued")

    # --- admission checks ---------------------------------------------------

    def _to_come(self, e: Entry) -> str:
        """What may still bring a place: the flavor's warm buffer, and what Karpenter NodePools
        can still launch for it."""
        ps = e.assignment.pod_sets[0]
        resource = self._device_resource(e.pending.workload.pod_sets[0].template.requests)
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

    def _checks_for(self, e: Entry) -> tuple[str, ...]:
        flavors = {c.flavor for ps in e.assignment.pod_sets for c in ps.flavors.values()}
        return self.gate.required(e.cq.spec, flavors)

    def _release_leaving(self, result: CycleResult) -> None:
        """After the first cycle, the reservations that a check ended give their quota back."""
        for wl, check in self._leaving:
            held = self.tree.admitted.get(wl.key)
            if held is not None:
                self.tree.remove_workload(held)
                if self.cluster is not None:
                    self.cluster.release(wl.key)
                self._unpark_cohort(held.cluster_queue, held.flavors)
            self._release_by_check(wl, check)
            result.released += 1
        self._leaving = []
        self.preemptor.clear_cache()

    def _release_by_check(self, wl: Workload, check: CheckStatus) -> None:
        """A Retry check requeues the workload, a Rejected one deactivates it; no quota held."""
        message = self.gate.record_eviction(wl, check)
        if check.state == CheckState.REJECTED:
            lq_key = f"{wl.namespace}/{wl.queue_name}" if wl.queue_name else None
            queue = wl.admission.cluster_queue if wl.admission is not None else None
            self.unqueued[wl.key] = (queue, lq_key, Status(DEACTIVATED, message))
            return
        self._enqueue(wl, self.now, keep_sorted=True)
        if wl.key in self.status:
            self.status[wl.key] = Status(QUEUED, message)

    def _settle_checked(self, result: CycleResult) -> None:
        """Reserved workloads: admit those whose checks are all Ready and that have a place;
        the rest keep their quota, with a note of whether a place exists now."""
        for wl, verdict in self._checked:
            placed: GangPlacement | PlacementFailure | None = None
            if self.cluster is not None:
                owner = wl.key if verdict == Verdict.READY else f"probe:{wl.key}"
                placed = self.cluster.place(owner, self._admission_gang(wl))
                if verdict != Verdict.READY:
                    self.cluster.release(owner)
            if verdict == Verdict.READY and not isinstance(placed, PlacementFailure):
                assert wl.admission is not None
                decision = AdmissionDecision(
                    workload=wl.key,
                    cluster_queue=wl.admission.cluster_queue,
                    pod_sets=tuple(
                        PodSetDecision(
                            name=psa.name,
                            count=psa.count,
                            flavors=dict(sorted(psa.flavors.items())),
                            placement=None
                            if placed is None
                            else tuple(
                                PodPlacement(p.node, tuple(g.describe() for g in p.grants))
                                for p in placed.pods.get(psa.name, [])
                            ),
                        )
                        for psa in wl.admission.pod_set_assignments
                    ),
                    cycle=self.cycle_number,
                )
                self.admitted[wl.key] = decision
                result.admitted.append(decision)
                continue
            if isinstance(placed, PlacementFailure):
                message = f"no place on the nodes yet: {placed.message}"
            elif placed is None:
                message = "waiting for admission checks"
            else:
                message = "waiting for admission checks; the gang has a place on existing nodes"
            self.gate.record_reserved(
                wl, placeable=placed is not None and not isinstance(placed, PlacementFailure), message=message
            )

    def _unpark_cohort(self, cq_name: str, freed: frozenset[FlavorResource] | None = None) -> None:
        """Capacity was freed in ``cq_name``'s cohort: parked workloads get another look.

        With ``freed`` (the flavors the leaving workload held), only the parked workloads that
        could use one of those flavors are woken. Quota is kept per flavor and resource, and a
        flavor's nodes host only that flavor's pods, so room freed in one flavor cannot admit
        a workload no other flavor's room could: waking the others would only park them again
        with the same reason, at a nomination each. Fair sharing orders by a share across every
        flavor, so there every parked workload is woken, as Kueue does for the whole cohort.
        """
        node = self.tree.queues.get(cq_name)
        if node is None:
            return
        root = node.root()
        names = {q.name for q in root.subtree_queues()} if isinstance(root, CohortNode) else {cq_name}
        names_freed = None if freed is None or self.config.fair_sharing else frozenset(f for f, _ in freed)
        for name in names:
            queue = self.queues.get(name, [])
            for pending in queue:
                if pending.key not in self.parked:
                    continue
                if names_freed is None or not names_freed.isdisjoint(self._eligible_flavors(pending)):
                    self.parked.discard(pending.key)
            if name in self.cursor:
                self.cursor[name] = 0

    def _eligible_flavors(self, pending: PendingWorkload) -> frozenset[str]:
        """Every flavor the workload could be assigned in its ClusterQueue: in the resource group of
        a resource it requests, tolerated, and matching its node selector and affinity."""
        cached = self._eligible.get(pending.key)
        if cached is not None and cached[0] is pending.workload and cached[1] == pending.cluster_queue:
            return cached[2]
        cq = self.tree.queues[pending.cluster_queue]
        names: set[str] = set()
        for ps in pending.workload.pod_sets:
            template = ps.template
            for res in template.requests:
                group = cq.group_for(res)
                if group is None:
                    continue
                for fq in group.flavors:
                    flavor = self.flavors.get(fq.name)
                    if flavor is None or untolerated_taint(flavor, template) is not None:
                        continue
                    if flavor_matches_affinity(flavor, template):
                        names.add(fq.name)
        out = frozenset(names)
        self._eligible[pending.key] = (pending.workload, pending.cluster_queue, out)
        return out

    # --- results ------------------------------------------------------------

    def pending_decisions(self) -> list[PendingDecision]:
        out: list[PendingDecision] = []
        for cq_name, queue in self.queues.items():
            lq_positions: dict[str, int] = {}
            for position, pending in enumerate(queue, start=1):
                lq_name = pending.local_queue
                lq_positions[lq_name] = lq_positions.get(lq_name, 0) + 1
                status = self.status.get(pending.key) or Status(QUEUED, "")
                message = status.message
                if status.reason == QUEUED and not message:
                    message = f"queued at position {position} in ClusterQueue {cq_name}; not attempted yet"
                out.append(
                    PendingDecision(
                        workload=pending.key,
                        cluster_queue=cq_name,
                        local_queue=pending.local_queue,
                        position=position,
                        local_position=lq_positions[lq_name],
                        reason=status.reason,
                        message=message,
                    )
                )
        for key in sorted(self.unqueued):
            queue_name, lq_key, status = self.unqueued[key]
            out.append(PendingDecision(key, queue_name, lq_key, None, None, status.reason, status.message))
        return out


def drain_bound(config: SchedulerConfig, workloads: int) -> int:
    """How many cycles a drain to a fixed point may run: one that still changes something after
    ten cycles per workload is cut short (and never more than ``config.max_cycles``)."""
    return min(config.max_cycles, 10 * (workloads + 10))


def drain(
    scheduler: Scheduler,
    limit: int,
    *,
    until_quiet: bool,
    after_cycle: Callable[[CycleResult], bool] | None = None,
) -> tuple[list[AdmissionDecision], int]:
    """The one drain loop: cycles until ``limit`` have run, a cycle changes nothing
    (``until_quiet``), or ``after_cycle(result)`` returns True. Returns every admission made and
    the number of cycles run; :func:`plan_after` turns them into a plan."""
    admitted: list[AdmissionDecision] = []
    ran = 0
    while ran < limit:
        result = scheduler.cycle()
        ran += 1
        admitted += result.admitted
        if after_cycle is not None and after_cycle(result):
            break
        if until_quiet and not result.changed:
            break
    return admitted, ran


def plan_after(
    scheduler: Scheduler,
    admitted: list[AdmissionDecision],
    cycles: int,
    *,
    since: tuple[int, int, int] = (0, 0, 0),
    with_pending: bool = True,
) -> Plan:
    """The plan of a drain: its admissions that still stand, by workload; the preemptions, notes
    and check evictions recorded after ``since`` (their counts when the drain began); the
    reservations held and, with ``with_pending``, the pending workloads now."""
    preempted_from, notes_from, evictions_from = since
    still = [d for d in admitted if scheduler.admitted.get(d.workload) is d]
    return Plan(
        admitted=tuple(sorted(still, key=lambda d: d.workload)),
        preempted=tuple(scheduler.preempted[preempted_from:]),
        pending=tuple(scheduler.pending_decisions()) if with_pending else (),
        cycles=cycles,
        notes=tuple(scheduler.notes[notes_from:]),
        reserved=tuple(scheduler.gate.reserved.values()),
        check_evictions=tuple(scheduler.gate.evictions[evictions_from:]),
    )


def schedule(state: ClusterState, config: SchedulerConfig, now: float, cycles: int | None = 1) -> Plan:
    """Decide on a frozen cluster state.

    ``cycles=N`` runs exactly N Kueue cycles (``1``: one cycle); ``None`` runs until a cycle
    changes nothing (bounded by :func:`drain_bound`). The same input always gives the same plan.
    A driver that lives longer keeps a :class:`gpuplane.core.session.Session`, which drains the
    same way.
    """
    scheduler = Scheduler(state, config, now)
    limit = drain_bound(config, len(state.workloads)) if cycles is None else cycles
    admitted, ran = drain(scheduler, limit, until_quiet=cycles is None)
    return plan_after(scheduler, admitted, ran)
