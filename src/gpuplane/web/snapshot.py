"""What the console shows, computed once per change of the cluster: the one data adapter of ``web/``.

A :class:`ConsoleSnapshot` is built from a frozen ``ClusterState`` by running the same core the
``gpuplane schedule`` command runs (cycles to a fixed point), so every position, reason and count
on a page equals that command's output for the same objects at the same time. The snapshot is
immutable and shared by every request until the next change; per-user filtering (which
namespaces a viewer may see) happens at render time in :mod:`gpuplane.web.pages`.

Data flow::

    ClusterState --Scheduler cycles--> Plan + node inventories --> ConsoleSnapshot (frozen)

The one exception is a MultiKueue manager's fleet (its workers, :mod:`gpuplane.web.fleet`): it
changes every few seconds and takes no planning, so the hub swaps it into the current snapshot
(``ConsoleSnapshot.fleet``) apart from the plan.

GPU amounts are GPU-equivalents: whole GPUs count 1, fractions their share, MIG instances
their compute slices out of 7 (the core's ``PodNeeds.gpu_milli``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from gpuplane.core.session import (
    AdmissionDecision,
    NodeState,
    PendingDecision,
    Plan,
    PodNeeds,
    SchedulerConfig,
    Session,
    pod_needs,
)
from gpuplane.insight.why import Explanation, explain_all
from gpuplane.model import labels as keys
from gpuplane.model.gpu_share import MILLI
from gpuplane.model.objects import ClusterState, Workload
from gpuplane.web.fleet import FleetWorker

# Label keys that group nodes on the node map when no Topology object names its levels.
TOPOLOGY_LABELS = (
    "network.topology.kubernetes.io/block",
    "cloud.google.com/gce-topology-block",
    "block",
    "network.topology.kubernetes.io/rack",
    "rack",
)
HOSTNAME = keys.HOSTNAME_LABEL


@dataclass(frozen=True, slots=True)
class EventRecord:
    """One Kubernetes Event about an object, as the workload page lists it."""

    namespace: str
    involved_kind: str
    involved_name: str
    type: str
    reason: str
    message: str
    time: float
    count: int = 1


@dataclass(frozen=True, slots=True)
class PendingRow(PendingDecision):
    """A pending workload: the plan's decision (its fields) plus what the pages show beside it."""

    namespace: str
    name: str
    gpus: float
    waiting_seconds: float


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds (part of) a device: a workload or pod key, and how much."""

    owner: str  # "ns/workload", or "pod:ns/name" for pods outside any workload
    amount: str  # "whole", "250m", "1g.10gb@0", "2 slots"
    planned: bool = False  # placed by this plan, not yet bound

    @property
    def namespace(self) -> str:
        return self.owner.removeprefix("pod:").split("/", 1)[0]


@dataclass(frozen=True, slots=True)
class DeviceCell:
    """One device on the node map."""

    index: int
    model: str
    sharing: str
    holders: tuple[Holder, ...]
    free: str  # "" when nothing is free
    free_milli: int
    stranded: bool  # free capacity that no pending pod fits
    slices: tuple[tuple[str, int, str | None], ...] = ()  # MIG: (instance, slots of 8, holder)

    @property
    def state(self) -> str:
        if not self.holders:
            return "free"
        return "partial" if self.free_milli else "full"


@dataclass(frozen=True, slots=True)
class NodeCell:
    name: str
    domain: tuple[str, ...]  # topology values, outermost first
    devices: tuple[DeviceCell, ...]
    unschedulable: bool

    @property
    def gpus(self) -> int:
        return len(self.devices)

    @property
    def free_milli(self) -> int:
        return sum(d.free_milli for d in self.devices)

    @property
    def stranded_milli(self) -> int:
        return sum(d.free_milli for d in self.devices if d.stranded)


@dataclass(frozen=True, slots=True)
class ConsoleSnapshot:
    """Everything the pages read, frozen; rebuilt whenever the cluster changes."""

    state: ClusterState
    plan: Plan
    now: float
    version: int  # set by the hub when published: 1, 2, 3, ...
    workload_gpus: Mapping[str, float]
    held_gpus: Mapping[str, float]  # admitted workloads (before or by this plan): GPUs held
    queue_usage: Mapping[str, Mapping[tuple[str, str], int]]  # ClusterQueue -> (flavor, resource) -> used
    pending: tuple[PendingRow, ...]
    pending_by_key: Mapping[str, PendingRow]
    admitted_by_key: Mapping[str, AdmissionDecision]
    nodes: tuple[NodeCell, ...]
    topology_levels: tuple[str, ...]
    events: Mapping[str, tuple[EventRecord, ...]] = field(default_factory=dict)  # by "ns/name"
    source: str = ""
    # `gpuplane why` for every pending workload (blockers, fix, ETA); None until computed, which
    # takes longer than the plan on a large cluster and so may arrive in a later version.
    explanations: Mapping[str, Explanation] | None = None
    config: SchedulerConfig | None = None
    # A MultiKueue manager's workers (its MultiKueueClusters), kept apart from the plan: the hub
    # swaps them in as they change, without planning again.
    fleet: tuple[FleetWorker, ...] = ()

    @property
    def installed_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    @property
    def free_gpus(self) -> float:
        return sum(n.free_milli for n in self.nodes) / MILLI

    @property
    def allocated_gpus(self) -> float:
        return sum(self.held_gpus.values())

    def workload(self, key: str) -> Workload | None:
        for wl in self.state.workloads:
            if wl.key == key:
                return wl
        return None


def workload_gpus(wl: Workload, config: SchedulerConfig) -> float:
    """GPU-equivalents one workload asks for, over all its pods."""
    total = 0
    for ps in wl.pod_sets:
        try:
            needs = pod_needs(ps.template, config.devices)
        except ValueError:
            continue
        total += needs.gpu_milli * ps.count
    return total / MILLI


def drain(state: ClusterState, config: SchedulerConfig, now: float) -> tuple[Plan, Session]:
    """Cycles to a fixed point, as ``core.schedule(..., cycles=None)`` runs them.

    Returns the plan and the session after the last cycle, whose node inventories show
    who holds each device once the plan is carried out.
    """
    session = Session(state, config, now, track_reasons=False)
    return session.drain(now), session


def latest_time(state: ClusterState) -> float:
    """The latest timestamp in the state: "now" for a state file, as ``gpuplane schedule`` takes it."""
    latest = 0.0
    for wl in state.workloads:
        latest = max(latest, wl.creation, *(c.last_transition for c in wl.conditions))
    return latest


def build_snapshot(
    state: ClusterState,
    config: SchedulerConfig,
    now: float,
    *,
    events: Sequence[EventRecord] = (),
    source: str = "",
) -> ConsoleSnapshot:
    """Schedule ``state`` and derive every page's data. Pure: same input, same snapshot."""
    plan, session = drain(state, config, now)
    inventory = session.inventory()
    gpus = {wl.key: workload_gpus(wl, config) for wl in state.workloads}
    evicted = {p.workload for p in plan.preempted}
    held = {
        wl.key: gpus[wl.key]
        for wl in state.workloads
        if wl.admission is not None and not wl.finished and wl.key not in evicted
    }
    for a in plan.admitted:
        held[a.workload] = gpus.get(a.workload, 0.0)
    by_key = {wl.key: wl for wl in state.workloads}
    rows = []
    for p in plan.pending:
        wl = by_key.get(p.workload)
        ns, _, name = p.workload.partition("/")
        since = wl.queue_order_timestamp if wl is not None else now
        rows.append(
            PendingRow(
                workload=p.workload,
                namespace=ns,
                name=name,
                cluster_queue=p.cluster_queue,
                local_queue=p.local_queue,
                position=p.position,
                local_position=p.local_position,
                reason=p.reason,
                message=p.message,
                gpus=gpus.get(p.workload, 0.0),
                waiting_seconds=max(0.0, now - since),
            )
        )
    levels = _topology_levels(state)
    pending_needs = _distinct_needs([by_key[r.workload] for r in rows if r.workload in by_key], config)
    nodes: tuple[NodeCell, ...] = ()
    if inventory:
        fractions = _fraction_holders(plan, state)
        planned = {a.workload for a in plan.admitted}
        nodes = tuple(
            _node_cell(ns_state, levels, pending_needs, fractions.get(name, {}), planned)
            for name, ns_state in sorted(inventory.items())
            if ns_state.devices
        )
    by_object: dict[str, list[EventRecord]] = {}
    for ev in sorted(events, key=lambda e: e.time):
        by_object.setdefault(f"{ev.namespace}/{ev.involved_name}", []).append(ev)
    return ConsoleSnapshot(
        state=state,
        plan=plan,
        now=now,
        version=0,  # the hub numbers what it publishes
        workload_gpus=gpus,
        held_gpus=held,
        queue_usage={u.cluster_queue: dict(u.used) for u in session.usage()},
        pending=tuple(rows),
        pending_by_key={r.workload: r for r in rows},
        admitted_by_key={a.workload: a for a in plan.admitted},
        nodes=nodes,
        topology_levels=levels,
        events={k: tuple(v) for k, v in by_object.items()},
        source=source,
        config=config,
    )


def explained(snap: ConsoleSnapshot) -> ConsoleSnapshot:
    """The snapshot with every pending workload explained, as ``gpuplane why`` explains it."""
    found = explain_all(snap.state, snap.plan, snap.now, snap.config)
    return replace(snap, explanations={e.workload: e for e in found})


def _topology_levels(state: ClusterState) -> tuple[str, ...]:
    levels: list[str] = []
    for topo in state.topologies.values():
        levels += [lv for lv in topo.levels if lv != HOSTNAME and lv not in levels]
    if levels:
        return tuple(levels)
    present = {key for node in state.nodes for key in node.labels}
    return tuple(key for key in TOPOLOGY_LABELS if key in present)


def _distinct_needs(workloads: Sequence[Workload], config: SchedulerConfig) -> list[PodNeeds]:
    seen: dict[tuple[object, ...], PodNeeds] = {}
    for wl in workloads:
        for ps in wl.pod_sets:
            try:
                needs = pod_needs(ps.template, config.devices)
            except ValueError:
                continue
            if not needs.uses_devices:
                continue
            key = (
                tuple(sorted(needs.resources.items())),
                needs.whole,
                needs.fraction_milli,
                needs.fraction_memory_mib,
                tuple(sorted(needs.mig.items())),
                needs.shared,
            )
            seen.setdefault(key, needs)
    return list(seen.values())


def _fraction_holders(plan: Plan, state: ClusterState) -> dict[str, dict[int, list[Holder]]]:
    """Fraction and slot holders per node and device: the plan's grants and bound pods' records."""
    out: dict[str, dict[int, list[Holder]]] = {}
    for a in plan.admitted:
        for ps in a.pod_sets:
            for where in ps.placement or ():
                for grant in where.devices:
                    index, _, detail = grant.partition(":")
                    if detail and index.isdigit() and "@" not in detail:
                        holders = out.setdefault(where.node, {}).setdefault(int(index), [])
                        holders.extend(Holder(a.workload, detail, planned=True) for _ in range(where.count))
    for pod in state.pods:
        record = pod.template.annotations.get("gpuplane.dev/devices", "")
        if pod.node_name is None or not record:
            continue
        owner = pod.template.labels.get("kueue.x-k8s.io/workload-name")
        key = f"{pod.namespace}/{owner}" if owner else f"pod:{pod.key}"
        for grant in record.split(","):
            index, _, detail = grant.partition(":")
            if detail and index.isdigit() and "@" not in detail:
                out.setdefault(pod.node_name, {}).setdefault(int(index), []).append(Holder(key, detail))
    return out


def _node_cell(
    node: NodeState,
    levels: tuple[str, ...],
    pending_needs: list[PodNeeds],
    fractions: Mapping[int, list[Holder]],
    admitted: set[str],
) -> NodeCell:
    # A node's free capacity is stranded when no pending pod's needs fit on it as it is now.
    any_fits = not pending_needs or any(node.fit(needs) is not None for needs in pending_needs)
    cells = []
    for d in node.devices:
        holders: list[Holder] = []
        slices: tuple[tuple[str, int, str | None], ...] = ()
        if d.sharing == "exclusive":
            if d.whole_by is not None:
                holders.append(Holder(d.whole_by, "whole", planned=_planned(d.whole_by, admitted)))
            holders += fractions.get(d.index, [])
            free_milli = d.milli_free
            free = "whole GPU" if d.free_whole else (f"{free_milli}m" if free_milli else "")
        elif d.sharing == "mig":
            free_slots = []
            for s in d.mig:
                if s.used_by is not None:
                    holders.append(Holder(s.used_by, str(s.instance), planned=_planned(s.used_by, admitted)))
                else:
                    free_slots.append(s)
            free_milli = MILLI * sum(s.instance.profile.compute for s in free_slots) // 7
            free = ", ".join(str(s.instance) for s in free_slots)
            slices = tuple(
                (str(s.instance), s.instance.profile.size, s.used_by)
                for s in sorted(d.mig, key=lambda s: s.instance.start)
            )
        else:
            holders += fractions.get(d.index, [])
            left = d.replicas - d.slots_used
            free_milli = MILLI * left // max(d.replicas, 1)
            free = f"{left}/{d.replicas} slots" if left else ""
            if d.slots_used and not holders:
                holders.append(Holder("(unrecorded)", f"{d.slots_used} slots"))
        if d.sharing == "exclusive" and d.milli_used and not fractions.get(d.index):
            holders.append(Holder("(unrecorded)", f"{d.milli_used}m"))
        cells.append(
            DeviceCell(
                index=d.index,
                model=d.model,
                sharing=d.sharing,
                holders=tuple(holders),
                free=free,
                free_milli=free_milli,
                stranded=bool(free_milli) and not any_fits,
                slices=slices,
            )
        )
    return NodeCell(
        name=node.name,
        domain=tuple(node.labels.get(level, "-") for level in levels),
        devices=tuple(cells),
        unschedulable=node.node.unschedulable,
    )


def _planned(owner: str, admitted_by_plan: set[str]) -> bool:
    return owner in admitted_by_plan
