"""The one entry point drivers use: a long-lived scheduling session fed with events.

A :class:`Session` holds the core's working state (quota tree, queues, device inventory) for as
long as a driver runs: ``gpuplane schedule`` for one decision, the simulator for one run. Drivers
tell it what happened and ask it to decide; they never reach into the state behind it::

    events in                          decisions out                     read-only views
    ---------                          -------------                     ---------------
    submit / update / withdraw         cycle(now) -> Plan (one cycle)    pending(), admitted()
    finish / evict                     drain(now, stop=...) -> Plan      usage(), lifecycle(key)
    node_down / node_up / node_changed   (cycles until nothing changes,  has_pending(), holds(key)
    record_checkpoint                     the stop rule says so, or      pending_changes()
    reconsider                            the bound is hit)              device_use(), inventory()
                                       run_cycles(now, stop=...)         reasons (the fast paths:
                                         (the same, without a plan)        watch(), reason_of(key),
                                                                           waiting_for(reasons))

Every call that changes something takes the current time (seconds, the driver's clock); time never
runs backwards, and nothing here reads a clock. Plans are frozen; each admission carries, per pod,
the node and the devices it was given (``PodPlacement.devices``), which are the devices a driver
binds.

Every workload's state follows :mod:`gpuplane.core.lifecycle`: the session moves it through the
transition table on each event and on each cycle's admissions, preemptions and check evictions,
so its history (state, time, reason) is there for insight and metrics to read. With
``track_reasons`` the pending reasons are recorded too, after every cycle (it costs one pass over
the queues per cycle). ``history=False`` keeps no lifecycles at all (:meth:`Session.lifecycle` is
``None``): the simulator, which replays a hundred thousand workloads and reads none of them, runs
that way and reads the reasons it needs through ``Session.reasons``
(:class:`~gpuplane.core.pending_reasons.ReasonReader`) instead.

Idempotency: ``finish``, ``evict``, ``withdraw``, ``node_down`` and ``node_up`` return what they
changed, and a repeated call changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuplane.core.check_gate import CheckEviction
from gpuplane.core.config import SchedulerConfig, config_from_kueue
from gpuplane.core.lifecycle import CONDITIONS, Lifecycle, Reason, WorkloadState
from gpuplane.core.pending_reasons import ReasonReader
from gpuplane.core.placement.devices import (
    DeviceConfig,
    DeviceGrant,
    NodeState,
    PodNeeds,
    pod_needs,
)
from gpuplane.core.placement.dra_bind import ClaimAllocation
from gpuplane.core.placement.reserve import (
    NodeUse,
    PodOnNode,
    Refusal,
    RefusalReason,
    reserve_devices,
)
from gpuplane.core.placement.scoring import POLICIES
from gpuplane.core.plan import (
    AdmissionDecision,
    PendingDecision,
    Plan,
    PreemptionDecision,
    placement_annotation,
)
from gpuplane.core.scheduler import CycleResult, Scheduler, drain, drain_bound, plan_after, schedule
from gpuplane.core.workload_histories import Histories
from gpuplane.model.objects import ClusterState, Node, Workload

# The core's public surface: drivers import these from here and nothing else from the core (an
# import-linter contract checks it), except the simulator's one-pod placement fast paths, which
# have their own door, :mod:`gpuplane.core.pod_engine`. Here: the long-lived session and the pure
# one-shot ``schedule``; the configuration; the plan's types; the workload states and reasons
# (with the conditions each state sets); and the device inventory's read side (``NodeState``,
# ``PodNeeds``, ``pod_needs``): the console's node map shows each node's devices and what pending
# pods need of them; and the one way a driver reserves a pod's planned devices on a node at bind
# time (``reserve_devices``: the devices, or a typed refusal). Kubernetes-facing records
# (conditions, the placement record, checkpoints) are plain object formats and live in
# :mod:`gpuplane.model`.
__all__ = [
    "CONDITIONS",
    "POLICIES",
    "AdmissionDecision",
    "CheckEviction",
    "ClaimAllocation",
    "CycleOutcome",
    "DeviceConfig",
    "NodeState",
    "NodeUse",
    "PendingDecision",
    "Plan",
    "PodNeeds",
    "PodOnNode",
    "PreemptionDecision",
    "Reason",
    "Refusal",
    "RefusalReason",
    "SchedulerConfig",
    "Session",
    "WorkloadState",
    "config_from_kueue",
    "placement_annotation",
    "pod_needs",
    "reserve_devices",
    "schedule",
]

_NODE_DOWN = "node-down/"  # the holder of a failed node's capacity in the device inventory
_S = WorkloadState


@dataclass(frozen=True, slots=True)
class CycleOutcome:
    """What one cycle of a :meth:`Session.drain` decided, for the driver's stop rule. A run of
    cycles that only parked heads comes as one outcome (nothing admitted or preempted; see
    :meth:`gpuplane.core.scheduler.Scheduler.cycle`), except in a session with lifecycles."""

    admitted: tuple[AdmissionDecision, ...]
    preempted: tuple[PreemptionDecision, ...]
    changed: bool
    # A preemptor waits for victims evicted earlier (they still hold their quota).
    waiting_on_victims: bool = False
    # Reservations that admission checks ended so far in this drain.
    check_evictions: int = 0


@dataclass(frozen=True, slots=True)
class Usage:
    """What one ClusterQueue holds now: per (flavor, resource), in the resource's units."""

    cluster_queue: str
    used: Mapping[tuple[str, str], int]
    admitted: int


@dataclass(frozen=True, slots=True)
class DeviceUse:
    """One device of a node, as the session's inventory holds it now."""

    node: str
    index: int
    milli_used: int  # fractions held on it, in thousandths of the device
    whole_by: str | None  # the workload that holds it whole, if one does


StopRule = Callable[[CycleOutcome], bool]


class Session:
    """A long-lived scheduling session over one cluster (see the module docstring).

    ``state`` gives the queues, flavors, nodes and the workloads known at the start: admitted ones
    hold their quota and devices, pending ones are queued. The set of nodes is fixed for the
    session's life: a node goes down and comes back, or changes its labels and taints. It owns the
    clock; the scheduler owns the working state, :class:`~gpuplane.core.workload_histories.Histories`
    the workloads' lives (none without ``history``), and
    :class:`~gpuplane.core.pending_reasons.ReasonReader` the reads of the pending reasons.
    """

    def __init__(
        self,
        state: ClusterState,
        config: SchedulerConfig,
        now: float,
        *,
        track_reasons: bool = True,
        history: bool = True,
    ) -> None:
        self._scheduler = Scheduler(state, config, now)
        self._now = now
        self.reasons = ReasonReader(self._scheduler, keep_written=history)
        """The pending reasons, read cheaply: what changed, who waits for what, a watch on the
        workloads whose reason is written. The simulator's fast paths, which read them after
        every event."""
        self._histories = Histories(self._scheduler, now, track_reasons=track_reasons) if history else None

    # --- time and state ----------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"time runs backwards: {now} < {self._now}")
        self._now = now
        self._scheduler.advance(now)

    def _move(self, key: str, to: WorkloadState, reason: Reason, message: str = "") -> None:
        if self._histories is not None:
            self._histories.move(key, to, self._now, reason, message)

    # --- workloads ---------------------------------------------------------------------------

    def submit(self, wl: Workload, now: float) -> None:
        """A new workload arrives and is queued by its LocalQueue. With ``history``, raises on a
        key still live (without, the caller keeps keys unique)."""
        self._advance(now)
        if self._histories is not None:
            self._histories.submitted(wl.key, now)
        self._scheduler.submit(wl)

    def update(self, wl: Workload, now: float) -> None:
        """A workload object changed. A pending one is queued again with its new spec; an admitted
        one keeps its admission, and only its object (annotations, checkpoint) changes."""
        self._advance(now)
        if wl.key in self._scheduler.tree.admitted:
            self._scheduler.workloads[wl.key] = wl
            return
        if self._scheduler.withdraw(wl.key):
            self._scheduler.submit(wl)
            return
        self.submit(wl, now)

    def withdraw(self, key: str, now: float) -> bool:
        """A pending workload was deleted before admission; False when it was not pending."""
        self._advance(now)
        if not self._scheduler.withdraw(key):
            return False
        self._move(key, _S.DELETED, Reason.DELETED)
        return True

    def finish(self, key: str, now: float, reason: Reason = Reason.SUCCEEDED) -> bool:
        """An admitted workload completed: its quota and devices are free. False if not admitted."""
        self._advance(now)
        if not self._scheduler.finish(key):
            return False
        self._move(key, _S.FINISHED, reason)
        return True

    def evict(self, key: str, now: float, reason: Reason, message: str = "") -> bool:
        """Evict an admitted workload outside preemption (reaper, node failure): its quota and
        devices are free and it is queued again. False if it was not admitted."""
        self._advance(now)
        if not self._scheduler.evict(key, message or reason):
            return False
        self._move(key, _S.PENDING, reason, message)
        return True

    def record_checkpoint(self, key: str, at: float) -> bool:
        """An admitted workload checkpointed at ``at``: preemption counts the work since then.
        False when the workload holds no admission."""
        held = self._scheduler.tree.admitted.get(key)
        if held is None:
            return False
        held.last_checkpoint = at
        return True

    # --- nodes -------------------------------------------------------------------------------

    def node_down(self, name: str, now: float) -> tuple[str, ...]:
        """A node failed: every workload placed on it is evicted and requeued (reason
        ``NodeFailures``), and all its capacity is held until :meth:`node_up`. Returns the
        evicted workloads, by key (empty when the node is unknown or already down)."""
        self._advance(now)
        cluster = self._scheduler.cluster
        if cluster is None or name not in cluster.nodes or _NODE_DOWN + name in cluster.owners:
            return ()
        on_node = sorted(
            owner for owner, items in cluster.owners.items() if any(node == name for node, _, _ in items)
        )
        evicted = tuple(
            key for key in on_node if self.evict(key, now, Reason.NODE_FAILURES, f"node {name} failed")
        )
        state = cluster.nodes[name]
        grants: list[DeviceGrant] = []
        for device in state.devices:
            if device.sharing == "mig":
                grants += [DeviceGrant(device.index, "mig", instance=slot.instance) for slot in device.mig]
            else:
                grants.append(DeviceGrant(device.index, "whole"))
        free = {res: q - state.used.get(res, 0) for res, q in state.allocatable.items()}
        free["pods"] = state.allocatable.get("pods", 110) - state.used.get("pods", 0)
        cluster.hold(_NODE_DOWN + name, name, PodNeeds(free), grants)
        self._scheduler.capacity_changed(freed=False)
        return evicted

    def node_up(self, name: str, now: float) -> bool:
        """A node that was down is back: its capacity is free again, and every parked workload
        gets another look. False when the node was not down."""
        self._advance(now)
        cluster = self._scheduler.cluster
        if cluster is None or _NODE_DOWN + name not in cluster.owners:
            return False
        cluster.release(_NODE_DOWN + name)
        self._scheduler.capacity_changed(freed=True)
        return True

    def node_changed(self, node: Node, now: float) -> None:
        """A node's labels, taints or schedulability changed. Its allocatable resources must stay
        the same (a node with new hardware is a new session). Nothing placed on it moves; the next
        cycle sees the node as it is now."""
        self._advance(now)
        cluster = self._scheduler.cluster
        if cluster is None or node.name not in cluster.nodes:
            raise ValueError(f"node {node.name} is not part of this session")
        if dict(cluster.nodes[node.name].node.allocatable) != dict(node.allocatable):
            raise ValueError(f"node {node.name}: allocatable resources changed; start a new session")
        cluster.node_changed(node)
        self._scheduler.capacity_changed(freed=True)

    def reconsider(self, now: float) -> None:
        """Give every parked workload another look in the next cycle, though no capacity was
        freed: capacity taken since they were tried may have changed why they wait (a driver
        that shows the reasons calls this once the cluster has settled)."""
        self._advance(now)
        self._scheduler.capacity_changed(freed=True)

    # --- deciding ----------------------------------------------------------------------------

    def cycle(self, now: float) -> Plan:
        """Run one scheduling cycle (Kueue's semantics) and return what it decided."""
        return self.drain(now, max_cycles=1)

    def drain(
        self,
        now: float,
        *,
        stop: StopRule | None = None,
        max_cycles: int | None = None,
        until_quiet: bool = True,
        with_pending: bool = True,
    ) -> Plan:
        """Run cycles at ``now`` until one changes nothing (``until_quiet``), ``stop`` says so
        after a cycle, or ``max_cycles`` have run.

        The default bound is the one :func:`gpuplane.core.scheduler.schedule` uses:
        ``config.max_cycles``, at most ten cycles per known workload. ``until_quiet=False`` with
        ``max_cycles=N`` runs exactly N cycles (``gpuplane schedule --cycles N``). Returns the
        admissions made in this drain that still stand, every preemption it issued, the pending
        workloads now (left out with ``with_pending=False``: a pass over every queue, which a
        driver that drains at every event may not need), and the notes and admission-check
        outcomes of its cycles.
        """
        self._advance(now)
        scheduler = self._scheduler
        since = (len(scheduler.preempted), len(scheduler.notes), len(scheduler.gate.evictions))
        admitted, ran = self._cycles(stop, max_cycles, until_quiet)
        return plan_after(scheduler, admitted, ran, since=since, with_pending=with_pending)

    def run_cycles(
        self,
        now: float,
        *,
        stop: StopRule | None = None,
        max_cycles: int | None = None,
        until_quiet: bool = True,
    ) -> int:
        """:meth:`drain` without its plan: the number of cycles run. For a driver that learns
        what each cycle decided from ``stop`` and reads no plan (the simulator, which drains
        after every event)."""
        self._advance(now)
        return self._cycles(stop, max_cycles, until_quiet)[1]

    def _cycles(
        self, stop: StopRule | None, max_cycles: int | None, until_quiet: bool
    ) -> tuple[list[AdmissionDecision], int]:
        """The drain loop of :meth:`drain`, at the session's time: the admissions it made and the
        cycles it ran."""
        scheduler = self._scheduler
        if max_cycles is None:
            max_cycles = drain_bound(scheduler.config, len(scheduler.workloads))
        evictions_since = len(scheduler.gate.evictions)

        histories = self._histories

        def after_cycle(result: CycleResult) -> bool:
            if histories is not None:
                histories.after_cycle(result.admitted, result.preempted, self._now)
            if stop is None:
                return False
            return stop(
                CycleOutcome(
                    tuple(result.admitted),
                    tuple(result.preempted),
                    result.changed,
                    bool(scheduler.preemptor_of),
                    len(scheduler.gate.evictions) - evictions_since,
                )
            )

        watch = histories is not None or stop is not None
        return drain(
            scheduler,
            max_cycles,
            until_quiet=until_quiet,
            after_cycle=after_cycle if watch else None,
            merge=histories is None,  # lifecycles note the reasons after every cycle
        )

    # --- views -------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The session's clock: the latest time a call passed in."""
        return self._now

    def pending(self) -> tuple[PendingDecision, ...]:
        """Every workload not admitted, with its reason and position."""
        return tuple(self._scheduler.pending_decisions())

    def pending_changes(self) -> tuple[PendingDecision, ...]:
        """The pending workloads whose reason or message changed since the last call (all of them
        on the first), as :meth:`pending` gives them. Only the ClusterQueues where a reason was
        written since (or whose queue moved: every move writes one) are looked at: a driver that
        shows the reasons after every drain (the controller) asks this instead of :meth:`pending`,
        whose cost grows with every pending workload."""
        return self.reasons.changes()

    def has_pending(self) -> bool:
        """Whether any workload waits in a ClusterQueue."""
        return self._scheduler.pending_count() > 0

    def holds(self, key: str) -> bool:
        """Whether the workload holds quota now: admitted or reserved in this session, or held
        when it started (an evicted one too, until its pods are gone)."""
        return key in self._scheduler.tree.admitted

    def admitted(self) -> tuple[AdmissionDecision, ...]:
        """Every admission made in this session that still stands, by workload."""
        return tuple(sorted(self._scheduler.admitted.values(), key=lambda d: d.workload))

    def usage(self) -> tuple[Usage, ...]:
        """Per ClusterQueue: what its admitted workloads hold, and how many there are."""
        counts: dict[str, int] = {}
        for held in self._scheduler.tree.admitted.values():
            counts[held.cluster_queue] = counts.get(held.cluster_queue, 0) + 1
        return tuple(
            Usage(name, {fr: q for fr, q in sorted(node.usage.items()) if q}, counts.get(name, 0))
            for name, node in sorted(self._scheduler.tree.queues.items())
        )

    def device_use(self) -> tuple[DeviceUse, ...]:
        """Every device of every node, by node name and index (empty without nodes)."""
        cluster = self._scheduler.cluster
        if cluster is None:
            return ()
        return tuple(
            DeviceUse(name, device.index, device.milli_used, device.whole_by)
            for name, state in cluster.nodes.items()
            for device in state.devices
        )

    def inventory(self) -> Mapping[str, NodeState]:
        """Each node's device inventory as the session holds it now, by node name (empty without
        nodes). A view for display: the caller must not change it."""
        cluster = self._scheduler.cluster
        return {} if cluster is None else dict(cluster.nodes)

    def lifecycle(self, key: str) -> Lifecycle | None:
        """The workload's state and history (a copy: the session keeps the original); ``None``
        in a session without ``history``."""
        return None if self._histories is None else self._histories.get(key)
