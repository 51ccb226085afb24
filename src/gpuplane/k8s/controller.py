"""The gpuplane controller: carries the core's plan out in a cluster.

One reconcile pass (only on the leader, once every informer has synced)::

    informer cache --snapshot--> core cycles (until quiet or one preempts) --plan-->
      1. queued jobs / gated pods get their Workload: assumed in the cache before the core
         cycles, sent after them (one the plan admits is created by its admission write,
         placement included)
      2. admissions: assume in the cache, then write Workload status.admission
         (placement as a hostname topology assignment); on any failure forget
      3. preemptions: dry run (Events "WouldPreempt", counters) or, as Kueue does, the
         victim marked Evicted and Preempted while it keeps its admission and quota
      4. evicted workloads: while the job is active, it is suspended and its pods evicted
         (Eviction API, the pod's grace period); once it is no longer active the
         admission is cleared and the workload is queued again (those already stopped are
         released before step 2, so an admission never shows beside the quota it replaces)
      5. admitted jobs are released: templates stamped (scheduler name, flavor node
         selector, workload/pod-set labels), then unsuspended or ungated
      6. pods of admitted workloads are bound, a whole gang at a time, to the planned
         nodes through the Binding API, with their devices recorded on the pod; their
         ResourceClaims are allocated and reserved for them first (and released once they end)
      7. pending workloads get a QuotaReserved=False condition with the core's reason

What each step writes (all but the stopping of evicted jobs) is decided by pure functions that
return the writes as data (:mod:`gpuplane.k8s.plan_writes`, :mod:`gpuplane.k8s.bind_writes`). The
write paths gather their inputs from the cache and the worklist and apply them, each its own object:
:class:`~gpuplane.k8s.creating.WorkloadCreation` (step 1), :class:`~gpuplane.k8s.admitting.Admissions`
(step 2 and the evictions that admission checks decide), :class:`~gpuplane.k8s.evicting.Evictions`
(steps 3 and 4), :class:`~gpuplane.k8s.binding.Binder` (steps 5 and 6),
:class:`~gpuplane.k8s.reporting.PendingReasons` (step 7), :class:`~gpuplane.k8s.finishing.Finishing`
(jobs that ended) and :class:`~gpuplane.k8s.reporting.QueueStatuses`; the Events and the writer
threads are :mod:`gpuplane.k8s.writing`'s. :class:`Controller` is the loop: leader election, the
informers, the scheduling session, and the order of the steps. The runtimes of the Workloads the cache
shows finished are learned by :class:`~gpuplane.k8s.runtime_store.RuntimeStore`, which keeps them in a
ConfigMap across restarts (read on the leader's first pass, written when due and at shutdown).

Writes that do not depend on each other (admissions of different workloads, bindings of
different pods, statuses) go out at once from a pool of threads; the client's QPS and
burst bound them. Every step is idempotent, and the API server's resourceVersion checks
make a write from a stale view fail (409) instead of doing something twice. The
controller can be killed at any point and restarted: the cluster's objects are the only
state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from gpuplane.core.session import CycleOutcome, Plan, SchedulerConfig, Session, config_from_kueue
from gpuplane.insight.runtime_history import RuntimeSample
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.admitting import Admissions
from gpuplane.k8s.api import KubeApi
from gpuplane.k8s.binding import Binder
from gpuplane.k8s.clusterstate import STATE_RESOURCES
from gpuplane.k8s.creating import WorkloadCreation
from gpuplane.k8s.dra_claims import DRA_RESOURCES, ClaimWrites
from gpuplane.k8s.evicting import Evictions
from gpuplane.k8s.finishing import Finishing
from gpuplane.k8s.informer import Cache, Informer
from gpuplane.k8s.kueue_config import DEFAULT_SOURCE, KueueConfigReader, KueueConfigSource
from gpuplane.k8s.leader import LeaderElector
from gpuplane.k8s.live_session import LiveSession
from gpuplane.k8s.multikueue import MultiKueue, MultiKueueSettings
from gpuplane.k8s.provisioning import Provisioner
from gpuplane.k8s.reporting import PendingReasons, QueueStatuses
from gpuplane.k8s.runtime_seed import prometheus_samples
from gpuplane.k8s.runtime_store import (
    DEFAULT_FLUSH_SECONDS,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_SIZE,
    RuntimeHistory,
    RuntimeStore,
)
from gpuplane.k8s.spot import InterruptionGuard
from gpuplane.k8s.warm import WarmBuffer, placeholder_resource
from gpuplane.k8s.worklist import Worklist
from gpuplane.k8s.writing import Counters, Events, Tools, WritePool
from gpuplane.model import labels as keys
from gpuplane.model.errors import InputError
from gpuplane.model.objects import ClusterState

__all__ = ["Controller", "ControllerConfig", "Counters"]

log = logging.getLogger(__name__)

DEVICES_ANNOTATION = keys.DEVICES_ANNOTATION
HOSTNAME = keys.HOSTNAME_LABEL


# What the queues' status is derived from (:func:`gpuplane.k8s.queue_status.queue_status_writes`).
_QUEUE_STATUS_INPUTS = frozenset(
    ("ClusterQueue", "LocalQueue", "Workload", "ResourceFlavor", "Topology", "AdmissionCheck")
)


@dataclass
class ControllerConfig:
    """How the controller runs (owns only settings): preemption as a dry run or not, leader
    election and its lease, the job kinds it integrates, the scheduler's configuration (else the
    cluster's Kueue configuration), the writer threads, and the session's resync period."""

    dry_run_preemption: bool = True
    leader_election: bool = True
    identity: str = "gpuplane-0"
    lease_namespace: str = "gpuplane-system"
    lease_duration: float = 15.0
    integrations: tuple[str, ...] = tuple(jobs.INTEGRATIONS)
    scheduler: SchedulerConfig | None = None
    min_runtime_seconds: float = 0.0
    checkpoint_aware: bool = True
    write_workers: int = 16  # independent writes in flight at once
    checkpoint_grace_seconds: float = 120.0  # on a node interruption, before eviction
    session_resync_seconds: float = 300.0  # the scheduling session is rebuilt from the cache this often
    # The runtimes learned from finished Workloads, kept in a ConfigMap of lease_namespace (size 0: off).
    runtime_history_size: int = DEFAULT_SIZE
    runtime_history_retention_seconds: float = DEFAULT_RETENTION_SECONDS
    runtime_history_flush_seconds: float = DEFAULT_FLUSH_SECONDS
    runtime_history_prometheus: str | None = None  # seeds an empty history (kube-state-metrics' Jobs)
    # Kueue's Configuration (device class mappings, fair sharing, gates): its ConfigMap, read on the
    # first pass and again every session_resync_seconds (gpuplane.k8s.kueue_config).
    kueue_config: KueueConfigSource = DEFAULT_SOURCE
    # MultiKueue on a manager cluster (gpuplane.k8s.multikueue): None leaves MultiKueue checks alone.
    multikueue: MultiKueueSettings | None = None


class Controller:
    """The reconcile loop (module docstring). It owns the informers and their cache, the lease, the
    long-lived scheduling session, the worklist and the changes taken from the cache but not yet
    fed to the session; it runs the steps of a pass in order, each through the write path that
    owns it. Counters and observers (called after each pass with the state, the plan, the time
    and the pass's seconds: metrics, visibility, ETA) are its public surface."""

    def __init__(
        self, api: KubeApi, config: ControllerConfig | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.api = api
        self.config = config or ControllerConfig()
        self.clock = clock
        self.cache = Cache()
        self.counters = Counters()
        # Called after each pass with (state, plan, now, pass seconds): metrics, visibility, ETA.
        self.observers: list[Callable[[ClusterState, Plan, float, float], None]] = []
        # One scheduling session for as long as this controller leads, fed with the cache's changes.
        self.live = LiveSession(self._scheduler_config, self.config.session_resync_seconds)
        resources = list(STATE_RESOURCES)
        resources += [jobs.INTEGRATIONS[k].resource for k in self.config.integrations]
        # DeviceClasses, ResourceSlices, claims: an API server that does not serve them leaves them
        # empty (the informer lists such a kind again every few seconds).
        resources += DRA_RESOURCES
        self.informers = [Informer(api, r, self.cache) for r in resources]
        self.elector = LeaderElector(
            api,
            self.config.identity,
            namespace=self.config.lease_namespace,
            lease_duration=self.config.lease_duration,
            clock=clock,
        )
        self.writes = WritePool(self.config.write_workers)
        self.events = Events(api, clock, self.counters)
        # The pod index, and what a step may have to act on, kept from the cache's changes, so a
        # pass looks only at those (with a full sweep whenever the session is rebuilt).
        self.work = Worklist(tuple(self.config.integrations))
        self._unfed: dict[str, set[str]] = {}  # changed keys taken from the cache, not yet fed
        # Kueue's Configuration (its ConfigMap) into the cache, on the first pass and when due again.
        self.kueue_config = KueueConfigReader(
            api, self.config.kueue_config, self.config.session_resync_seconds
        )
        self._rebuilds_swept = -1
        event = self.events.record
        devices = (self.config.scheduler or SchedulerConfig()).devices
        self.provisioner = Provisioner(api, self.cache, clock, event)
        self.multikueue = (
            MultiKueue(api, self.cache, clock, time.monotonic, event, self.config.multikueue)
            if self.config.multikueue is not None
            else None
        )
        self.warm = WarmBuffer(
            api, self.cache, self.config.lease_namespace, event, placeholder_resource(devices)
        )
        self.warm.keys = lambda: self.work.placeholders
        self.interruptions = InterruptionGuard(
            api, self.cache, clock, event, self.config.checkpoint_grace_seconds
        )
        tools = Tools(
            api, self.cache, self.work, self.counters, clock, self.writes.each, event, self.live.invalidate
        )
        self.pending = PendingReasons(tools)
        self.queues = QueueStatuses(tools)
        self.creation = WorkloadCreation(tools)
        self.admissions = Admissions(tools, charged=self.live.claim_charges, unsent=self.creation.take)
        self.evictions = Evictions(
            tools, dry_run=self.config.dry_run_preemption, forget_pending=self.pending.forget
        )
        self.finishing = Finishing(
            tools, integrations=tuple(self.config.integrations), forget_pending=self.pending.forget
        )
        self.claims = ClaimWrites(tools)
        self.binder = Binder(tools, devices=devices, clear_warm=self.warm.clear, claims=self.claims)
        # What finished Workloads teach the ETA, kept across restarts (runtime_store.py).
        self.runtime_history = RuntimeStore(
            api,
            RuntimeHistory(self.config.runtime_history_size, self.config.runtime_history_retention_seconds),
            namespace=self.config.lease_namespace,
            flush_seconds=self.config.runtime_history_flush_seconds,
            clock=clock,
            seed=_prometheus_seed(self.config),
        )

    # --- lifecycle ---------------------------------------------------------------

    def start(self, wait: float = 10.0) -> None:
        for informer in self.informers:
            informer.start()
        deadline = time.monotonic() + wait
        for informer in self.informers:
            informer.synced.wait(max(0.0, deadline - time.monotonic()))

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop()
        self.close()
        if not self.config.leader_election or self.elector.is_leader:
            self.runtime_history.close()  # what it learned since its last write
        if self.config.leader_election:
            self.elector.release()

    def close(self) -> None:
        """End the writer and Event threads (idempotent); writes in flight finish first."""
        self.writes.close()
        self.events.close()
        if self.multikueue is not None:
            self.multikueue.close()

    def run(self, stop: Callable[[], bool], interval: float = 1.0) -> None:
        while not stop():
            try:
                self.reconcile()
            except Exception:  # keep running; the next pass starts from the cluster again
                log.exception("reconcile failed")
            self.cache.changed.wait(interval)
            self.cache.changed.clear()

    # --- one pass -----------------------------------------------------------------

    def reconcile(self) -> Plan | None:
        """One pass (module docstring). A pass that fails part way leaves the next one to start
        from the cluster again: the session is rebuilt and every object looked at, so nothing it
        had taken in (changes fed, reasons reported, candidates dropped) is lost with it."""
        try:
            return self._pass()
        except BaseException:
            self.live.invalidate("the last pass failed")
            self.work.sweep_due = True
            raise
        finally:
            self.creation.flush()  # a pass that ended early still creates the Workloads it assumed

    def _pass(self) -> Plan | None:
        if self.config.leader_election and not self.elector.try_acquire_or_renew():
            self.live.invalidate("not the leader")  # another leader may change anything meanwhile
            self.work.sweep_due = True
            self.queues.dirty = True
            return None
        if not all(informer.synced.is_set() for informer in self.informers):
            # A cache that has not listed yet (or is relisting after 410 Gone) hides admitted
            # workloads and bound pods: deciding on it would over-admit. The session waits: the
            # relist notes what changed meanwhile.
            return None
        started = time.monotonic()
        self.kueue_config.refresh(self.cache, started)
        self.runtime_history.sync()  # read the stored history on the first pass; write when due
        self._catch_up()
        self.interruptions.reconcile(
            signals=self.work.signalled, pods_on=self.work.pod_keys, asked=self.work.requested
        )
        self.warm.reconcile()
        with self.counters.lock:
            self.counters.extra["warm_buffer_pods"] = sum(self.warm.sizes.values())
        self.creation.run()
        self._catch_up()
        self.finishing.run()
        if self.multikueue is not None:
            self.multikueue.reconcile()
        failures = self.counters.write_failures
        replanned = self.counters.extra.get("replanned_devices", 0)
        plan = self._schedule()
        if plan is None:
            return None
        # Quota that evicted, stopped workloads give back is released before any admission that the
        # plan made with it is written: the API never shows both holding it at once. That includes
        # the workloads whose admission checks the plan ended: their evictions are written first.
        self.admissions.write_check_evictions(plan)
        self._catch_up()
        self.evictions.stop_evicted(stop_jobs=False)
        self.admissions.write_admissions(plan)  # creating the new Workloads it admits
        self.creation.flush()  # the other new Workloads, before any step below writes them
        self.provisioner.reconcile(plan)
        self.evictions.preempt(plan)
        self._catch_up()
        self.evictions.stop_evicted()
        self._catch_up()
        self.binder.run()
        self.claims.release_ended()
        self.pending.record(plan)
        if self.counters.write_failures > failures:
            self.live.invalidate("a write failed")  # the cluster may not show what the session holds
        if self.counters.extra.get("replanned_devices", 0) > replanned:
            self.live.invalidate("devices chosen again at bind time")
        self._catch_up()
        self.queues.write()
        self._notify(plan, time.monotonic() - started)
        return plan

    def _notify(self, plan: Plan, seconds: float) -> None:
        if not self.observers:
            return
        state = self.live.state()
        for observe in self.observers:
            try:
                observe(state, plan, self.clock(), seconds)
            except Exception:  # an observer (metrics, visibility) never stops scheduling
                log.exception("pass observer failed")

    def _catch_up(self) -> None:
        """Take the keys the cache noted as changed into the worklist (or sweep it, when due), and
        keep them for the session's next sync. Every step that looks at the worklist's candidates
        is preceded by one, so it sees what the steps before it wrote."""
        changes = self.cache.take_changes()
        self.runtime_history.observe(changes.get("Workload", ()), lambda key: self.cache.get("Workload", key))
        for kind, changed in changes.items():
            self._unfed.setdefault(kind, set()).update(changed)
            if changed and kind in _QUEUE_STATUS_INPUTS:
                self.queues.dirty = True
        if not self.work.sweep_due:
            self.work.note(changes, self.cache.get)
        if self.work.sweep_due:  # due before, or a Workload was deleted
            self.work.sweep(self.cache.items)

    def _scheduler_config(self, state: ClusterState) -> SchedulerConfig:
        return replace(
            self.config.scheduler or config_from_kueue(state.configuration),
            min_runtime_seconds=self.config.min_runtime_seconds,
            checkpoint_aware=self.config.checkpoint_aware,
        )

    def _schedule(self) -> Plan | None:
        """Bring the long-lived session up to date with what changed in the cache, then drain it."""
        self._catch_up()  # a relist notes the keys it changed
        changes, self._unfed = self._unfed, {}
        now = self.clock()
        try:
            session = self.live.sync(self.cache.items, self.cache.get, changes, now)
        except InputError as err:
            log.warning("cluster state rejected: %s", err)
            return None
        if self._rebuilds_swept != self.live.rebuilds:  # the worklist's safety net: a full sweep
            self._rebuilds_swept = self.live.rebuilds
            self.work.sweep(self.cache.items)
        if self.live.rebuilds_seen != self.live.rebuilds:
            self.live.rebuilds_seen = self.live.rebuilds
            for problem in self.live.skipped:  # one bad object must not stop scheduling for everyone
                log.warning("ignoring invalid object: %s", problem)
        with self.counters.lock:
            self.counters.extra["invalid_objects"] = len(self.live.skipped)
            self.counters.extra["session_rebuilds"] = self.live.rebuilds
        # Every pending workload's reason goes to the observers (metrics, visibility, ETA); the
        # pending step alone needs only the reasons that changed, which costs no pass over them all.
        plan, stopped = _drain_until_preemption(session, now, with_pending=bool(self.observers))
        if not self.observers:
            plan = replace(plan, pending=session.pending_changes())
        if plan.admitted:
            self.live.settle = True
        if stopped:
            # Victims hold their quota in the cluster until their jobs stop; the session already
            # counts it free. The next pass starts from the cluster again.
            self.live.invalidate("the last pass preempted")
        return plan


def _prometheus_seed(config: ControllerConfig) -> Callable[[], list[tuple[str, RuntimeSample]]] | None:
    url = config.runtime_history_prometheus
    if not url:
        return None
    return partial(prometheus_samples, url, config.runtime_history_retention_seconds)


def _drain_until_preemption(session: Session, now: float, *, with_pending: bool = True) -> tuple[Plan, bool]:
    """Scheduling cycles until one changes nothing or one preempts; and whether one preempted.

    The session lives across passes, so the heads of the queues that did not fit stay parked
    until capacity is freed, as in Kueue's long-lived queues, and the heads behind them get
    their turn in the same drain (BestEffortFIFO). It stops at the first cycle that preempts:
    the victims are gone only in the session, and a later admission could count on room they
    still hold; the controller rebuilds the session from the cluster for the next pass, which
    sees the evictions. A cycle whose preemptor only waits for victims already evicted (still
    holding their quota until their jobs stop) ends the drain the same way. An admission that a
    later cycle of the same drain preempted again is dropped together with that preemption.
    """
    new: set[str] = set()  # admitted in this drain, whether or not the admission still stands
    stopped = False

    def preempts(cycle: CycleOutcome) -> bool:
        nonlocal stopped
        new.update(d.workload for d in cycle.admitted)
        stopped = bool(cycle.preempted or cycle.waiting_on_victims or cycle.check_evictions)
        return stopped

    plan = session.drain(now, stop=preempts, with_pending=with_pending)
    # Only the last cycle can preempt (it ends the drain); a victim admitted earlier in the same
    # drain is dropped together with that preemption.
    return replace(plan, preempted=tuple(p for p in plan.preempted if p.workload not in new)), stopped
