"""The one entry point drivers use: a long-lived scheduling session fed with events.

A :class:`Session` holds the core's working state (quota tree, queues, device inventory) for as
long as a driver runs: ``gpuplane schedule`` for one decision, the simulator for one run. Drivers
tell it what happened and ask it to decide; they never reach into the state behind it::

    events in                          decisions out                     read-only views
    ---------                          -------------                     ---------------
    submit / update / withdraw         cycle(now) -> Plan (one cycle)    pending(), admitted()
    finish / evict                     drain(now, stop=...) -> Plan      usage(), lifecycle(key)
    node_down / node_up / node_changed   (cycles until nothing changes,  has_pending(), holds(key)
    record_checkpoint                     the stop rule says so, or      waiting_for(reasons)
    reconsider                            the bound is hit)              pending_changes()
                                                                         reasons_written()
                                                                         watch_reasons(), reason_of(key)

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
that way and reads the reasons it needs with :meth:`Session.watch_reasons` and
:meth:`Session.reason_of` instead.

Idempotency: ``finish``, ``evict``, ``withdraw``, ``node_down`` and ``node_up`` return what they
changed, and a repeated call changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuplane.core.check_gate import CheckEviction, Verdict
from gpuplane.core.config import SchedulerConfig, config_from_kueue
from gpuplane.core.lifecycle import CONDITIONS, Lifecycle, Reason, Step, WorkloadState
from gpuplane.core.placement.devices import (
    DeviceConfig,
    DeviceGrant,
    NodeState,
    PodNeeds,
    node_state,
    pod_needs,
    recorded_grants,
)
from gpuplane.core.placement.reserve import (
    NodeUse,
    PodOnNode,
    Refusal,
    RefusalReason,
    Reservation,
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
from gpuplane.core.scheduler import CycleResult, Scheduler, Status, drain, drain_bound, plan_after, schedule
from gpuplane.model.admission_checks import CheckState
from gpuplane.model.conditions import ConditionType
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
    "Reservation",
    "SchedulerConfig",
    "Session",
    "WorkloadState",
    "config_from_kueue",
    "node_state",
    "placement_annotation",
    "pod_needs",
    "recorded_grants",
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


class _Counted(dict[str, Status]):
    """The scheduler's reasons by workload, noting which keys were written (for
    :meth:`Session.pending_changes`); ``everything`` after a write of unknown keys; ``writes``
    counts every write (for :meth:`Session.reasons_written`); each of ``watchers`` gets every
    key written (for :meth:`Session.watch_reasons`). Without ``keep_written`` (a session that
    keeps no history never reads them) the written keys are not collected."""

    __slots__ = ("everything", "keep_written", "watchers", "writes", "written")

    def __init__(self, items: Mapping[str, Status], keep_written: bool = True) -> None:
        super().__init__(items)
        self.written: set[str] = set()
        self.keep_written = keep_written
        self.everything = True
        self.writes = 0
        self.watchers: list[set[str]] = []

    def _wrote(self, key: str) -> None:
        if self.keep_written:
            self.written.add(key)
        self.writes += 1
        for watcher in self.watchers:
            watcher.add(key)

    def _wrote_all(self) -> None:
        self.everything = True
        self.writes += 1
        for watcher in self.watchers:
            watcher.update(self)

    def __setitem__(self, key: str, value: Status) -> None:
        self._wrote(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._wrote(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._wrote(key)
        return super().pop(key, *default)

    def clear(self) -> None:
        self._wrote_all()
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._wrote_all()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._wrote(key)
        return super().setdefault(key, default)


def _reason(text: str, default: Reason = Reason.PENDING) -> Reason:
    """``text`` as a :class:`Reason`. The core reports only these spellings; a reason written by
    someone else (an object read from a cluster) reads as ``default``."""
    try:
        return Reason(text)
    except ValueError:
        return default


class Session:
    """A long-lived scheduling session over one cluster (see the module docstring).

    ``state`` gives the queues, flavors, nodes and the workloads known at the start: admitted ones
    hold their quota and devices, pending ones are queued. The set of nodes is fixed for the
    session's life: a node goes down and comes back, or changes its labels and taints.
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
        self._history = history
        self._track_reasons = track_reasons and history
        self._lifecycles: dict[str, Lifecycle] = {}
        self._evictions_seen = 0
        # For pending_changes(): the (reason, message) last reported, by ClusterQueue ("": the
        # workloads queued in none) and workload; the scheduler's reasons note what was written.
        self._reported: dict[str, dict[str, tuple[str, str]]] = {}
        self._scheduler.status = _Counted(self._scheduler.status, keep_written=history)
        for wl in state.workloads if history else ():
            created = min(wl.creation, now)
            if wl.finished:  # observed finished: its history starts there
                life = Lifecycle(created, [Step(_S.FINISHED, created, Reason.FINISHED)])
            else:
                life = Lifecycle(created)
                if wl.key in self._scheduler.tree.admitted:
                    self._initial_hold(life, wl, now)
            self._lifecycles[wl.key] = life
        if self._track_reasons:
            self._note_pending()

    def _initial_hold(self, life: Lifecycle, wl: Workload, now: float) -> None:
        """The state of a workload that holds quota when the session starts."""
        verdict, _ = self._scheduler.gate.verdict(wl)
        leaving = verdict in (Verdict.RETRY, Verdict.REJECTED)
        if verdict in (Verdict.WAITING, Verdict.READY) or (leaving and not wl.condition_true("Admitted")):
            life.transition(_S.QUOTA_RESERVED, now, Reason.QUOTA_RESERVED)
            return
        life.transition(_S.ADMITTED, now, Reason.ADMITTED)
        evicted = wl.condition(ConditionType.EVICTED)
        if evicted is not None and evicted.status:  # holds its quota until its pods are gone
            life.transition(_S.EVICTING, now, _reason(evicted.reason, Reason.PREEMPTED), evicted.message)

    # --- time and state ----------------------------------------------------------------------

    def _advance(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"time runs backwards: {now} < {self._now}")
        self._now = now
        self._scheduler.advance(now)

    def _move(self, key: str, to: WorkloadState, reason: Reason, message: str = "") -> None:
        if not self._history:
            return
        life = self._lifecycles.get(key)
        if life is None:
            life = self._lifecycles[key] = Lifecycle(created=self._now)
        life.transition(to, self._now, reason, message)

    # --- workloads ---------------------------------------------------------------------------

    def submit(self, wl: Workload, now: float) -> None:
        """A new workload arrives and is queued by its LocalQueue. With ``history``, raises on a
        key still live (without, the caller keeps keys unique)."""
        self._advance(now)
        if self._history:
            known = self._lifecycles.get(wl.key)
            if known is not None and known.state not in (_S.FINISHED, _S.DELETED):
                raise ValueError(f"workload {wl.key} is already known; use update()")
            self._lifecycles[wl.key] = Lifecycle(created=now)
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

        def after_cycle(result: CycleResult) -> bool:
            if self._history:
                self._apply(result.admitted, result.preempted)
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

        watch = self._history or stop is not None
        return drain(
            scheduler,
            max_cycles,
            until_quiet=until_quiet,
            after_cycle=after_cycle if watch else None,
            merge=not self._history,  # lifecycles note the reasons after every cycle
        )

    def _apply(self, admitted: list[AdmissionDecision], preempted: list[PreemptionDecision]) -> None:
        """Move the lifecycles by what one cycle decided."""
        evictions = self._scheduler.gate.evictions
        if len(evictions) > self._evictions_seen:
            for ended in evictions[self._evictions_seen :]:
                self._check_ended(ended)
            self._evictions_seen = len(evictions)
        for decision in admitted:
            if decision.checks:
                self._move(decision.workload, _S.QUOTA_RESERVED, Reason.QUOTA_RESERVED)
            else:
                self._move(decision.workload, _S.ADMITTED, Reason.ADMITTED)
        for victim in preempted:
            # The core requeues a victim at once: its capacity counts as free in the next cycle.
            self._move(victim.workload, _S.PENDING, Reason.PREEMPTED, victim.reason)
        if self._track_reasons:
            self._note_pending()

    def _check_ended(self, ended: CheckEviction) -> None:
        life = self._lifecycles.get(ended.workload)
        if life is None or life.state == _S.PENDING:
            return
        reason = Reason.DEACTIVATED if ended.state == CheckState.REJECTED else Reason.ADMISSION_CHECK
        self._move(ended.workload, _S.PENDING, reason, ended.message)

    def _note_pending(self) -> None:
        for decision in self._scheduler.pending_decisions():
            life = self._lifecycles.get(decision.workload)
            if life is not None and life.state == _S.PENDING:
                life.transition(_S.PENDING, self._now, _reason(decision.reason), decision.message)

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
        scheduler = self._scheduler
        status = scheduler.status
        dirty = self._dirty_queues(status)
        out: list[PendingDecision] = []
        for cq_name, queue in scheduler.queues.items():
            if dirty is not None and cq_name not in dirty:
                continue
            before = self._reported.get(cq_name, {})
            now: dict[str, tuple[str, str]] = {}
            lq_positions: dict[str, int] = {}
            for position, pending in enumerate(queue, start=1):
                lq_name = pending.local_queue
                lq_positions[lq_name] = lq_positions.get(lq_name, 0) + 1
                got = status.get(pending.key)
                reason, message = (got.reason, got.message) if got is not None else (Reason.QUEUED, "")
                if reason == Reason.QUEUED and not message:
                    message = f"queued at position {position} in ClusterQueue {cq_name}; not attempted yet"
                now[pending.key] = (reason, message)
                if before.get(pending.key) != (reason, message):
                    out.append(
                        PendingDecision(
                            pending.key, cq_name, lq_name, position, lq_positions[lq_name], reason, message
                        )
                    )
            self._reported[cq_name] = now
        before = self._reported.get("", {})
        now = {}
        for key in sorted(scheduler.unqueued):  # not queued anywhere: few, looked at every time
            queue_name, lq_key, got = scheduler.unqueued[key]
            now[key] = (got.reason, got.message)
            if before.get(key) != now[key]:
                out.append(PendingDecision(key, queue_name, lq_key, None, None, got.reason, got.message))
        self._reported[""] = now
        return tuple(out)

    def _dirty_queues(self, status: Mapping[str, Status]) -> set[str] | None:
        """The ClusterQueues of the workloads whose reason was written since the last call
        (``None``: every one)."""
        if not isinstance(status, _Counted) or status.everything or not self._history:
            if isinstance(status, _Counted):
                status.everything = False
                status.written.clear()
            return None
        scheduler = self._scheduler
        dirty: set[str] = set()
        for key in status.written:
            wl = scheduler.workloads.get(key)
            lq = scheduler.state.local_queues.get(f"{wl.namespace}/{wl.queue_name}") if wl else None
            if lq is None:
                continue  # not queued in any ClusterQueue: among the unqueued, looked at every time
            dirty.add(lq.cluster_queue)
        status.written.clear()
        return dirty

    def has_pending(self) -> bool:
        """Whether any workload waits in a ClusterQueue."""
        return self._scheduler.pending_count() > 0

    def waiting_for(self, reasons: Collection[str]) -> list[str]:
        """Queued workloads whose last attempt failed for one of ``reasons``, in queue order
        (ClusterQueues by name, then position). Cheaper than :meth:`pending`: no messages; the
        same while :meth:`reasons_written` is."""
        status = self._scheduler.status
        out = []
        for queue in self._scheduler.queues.values():
            for queued in queue:
                got = status.get(queued.key)
                if got is not None and got.reason in reasons:
                    out.append(queued.key)
        return out

    def watch_reasons(self) -> set[str]:
        """A set that, from now on, gets the key of every workload whose pending reason is
        written; it starts with every workload queued now. Every change to the queues writes a
        reason (see :meth:`reasons_written`), so a driver that keeps a figure over the queued
        workloads (the simulator's quota-blocked demand) reads :meth:`reason_of` for the keys in
        it, clears it, and keeps the rest of its figure: work proportional to what changed, not
        to the backlog."""
        status = self._scheduler.status
        assert isinstance(status, _Counted)  # set up so in __init__
        watcher = set(status)
        status.watchers.append(watcher)
        return watcher

    def reason_of(self, key: str) -> str | None:
        """The pending reason of a workload queued in a ClusterQueue; ``None`` for one that is
        not (admitted, finished, withdrawn or never queued)."""
        got = self._scheduler.status.get(key)
        return got.reason if got is not None else None

    def reasons_written(self) -> int:
        """How many times the scheduler's pending reasons were written so far. Every change to
        the queues (a workload queued, requeued, admitted or withdrawn) writes one, so
        :meth:`waiting_for` answers the same while this number stays the same: a driver that asks
        it after every event (the simulator) keeps its answer until then."""
        status = self._scheduler.status
        assert isinstance(status, _Counted)  # set up so in __init__
        return status.writes

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
        """The workload's state and history (a copy: the session keeps the original)."""
        life = self._lifecycles.get(key)
        return None if life is None else replace(life, history=list(life.history))
