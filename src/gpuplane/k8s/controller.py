"""The gpuplane controller: carries the core's plan out in a cluster.

One reconcile pass (only on the leader, once every informer has synced)::

    informer cache --snapshot--> core cycles (until quiet or one preempts) --plan-->
      1. queued jobs / gated pods get their Workload
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
         nodes through the Binding API, with their devices recorded on the pod
      7. pending workloads get a QuotaReserved=False condition with the core's reason

What each step writes (all but the stopping of evicted jobs) is decided by pure functions that
return the writes as data (:mod:`gpuplane.k8s.plan_writes`, :mod:`gpuplane.k8s.bind_writes`); this
class gathers their inputs from the cache and the worklist and applies them.

Writes that do not depend on each other (admissions of different workloads, bindings of
different pods, statuses) go out at once from a pool of threads; the client's QPS and
burst bound them. Every step is idempotent, and the API server's resourceVersion checks
make a write from a stale view fail (409) instead of doing something twice. The
controller can be killed at any point and restarted: the cluster's objects are the only
state.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gpuplane.core.session import (
    PLACEMENT_ANNOTATION,
    CheckEviction,
    ConditionType,
    CycleOutcome,
    Plan,
    Reason,
    SchedulerConfig,
    Session,
    config_from_kueue,
)
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.bind_writes import (
    NodeView,
    binding_writes,
    gang_plan,
    release_writes,
    waiting,
    workload_create_writes,
)
from gpuplane.k8s.clusterstate import STATE_RESOURCES
from gpuplane.k8s.informer import Cache, Informer, object_key
from gpuplane.k8s.leader import LeaderElector, micro_time
from gpuplane.k8s.live_session import LiveSession
from gpuplane.k8s.plan_writes import (
    Verb,
    Write,
    admission_writes,
    copy_object,
    eviction_writes,
    finished_workload,
    pending_writes,
    preemption_writes,
)
from gpuplane.k8s.provisioning import (
    Provisioner,
    awaiting_checks,
    evicted_by_check,
)
from gpuplane.k8s.queue_status import QueueObjects, QueueStatusWrite, queue_status_writes
from gpuplane.k8s.spot import InterruptionGuard
from gpuplane.k8s.warm import WarmBuffer
from gpuplane.k8s.worklist import Worklist
from gpuplane.model import labels as keys
from gpuplane.model.admission_checks import CheckState
from gpuplane.model.errors import InputError
from gpuplane.model.objects import ClusterState

log = logging.getLogger(__name__)

DEVICES_ANNOTATION = keys.DEVICES_ANNOTATION
HOSTNAME = keys.HOSTNAME_LABEL


# What the queues' status is derived from (:func:`gpuplane.k8s.queue_status.queue_status_writes`).
_QUEUE_STATUS_INPUTS = frozenset(
    ("ClusterQueue", "LocalQueue", "Workload", "ResourceFlavor", "Topology", "AdmissionCheck")
)


@dataclass
class ControllerConfig:
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


@dataclass
class Counters:
    """What the controller did; safe to update from the writer threads through :meth:`add`."""

    admitted: int = 0
    bound: int = 0
    preempted: int = 0
    released: int = 0  # evicted workloads whose quota was given back
    finished: int = 0  # workloads marked Finished because their job ended
    would_preempt: int = 0
    write_failures: int = 0
    workloads_created: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, amount: int = 1) -> None:
        """Add to the counter ``name`` (a field, or else an entry of :attr:`extra`)."""
        with self.lock:
            if name in _COUNTER_FIELDS:
                setattr(self, name, getattr(self, name) + amount)
            else:
                self.extra[name] = self.extra.get(name, 0) + amount


_COUNTER_FIELDS = frozenset(
    (
        "admitted",
        "bound",
        "preempted",
        "released",
        "finished",
        "would_preempt",
        "write_failures",
        "workloads_created",
    )
)


class Controller:
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
        self.informers = [Informer(api, r, self.cache) for r in resources]
        self.elector = LeaderElector(
            api,
            self.config.identity,
            namespace=self.config.lease_namespace,
            lease_duration=self.config.lease_duration,
            clock=clock,
        )
        self._writers = ThreadPoolExecutor(
            max_workers=max(1, self.config.write_workers), thread_name_prefix="gpuplane-write"
        )
        self._events = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuplane-event")
        self._pending_written: dict[str, tuple[str, str]] = {}
        self._gang_noted: set[str] = set()  # pods told (by an Event) that they wait for their gang
        self._queues_dirty = True  # an object the queues' status is derived from changed
        # The pod index, and what a step may have to act on, kept from the cache's changes, so a
        # pass looks only at those (with a full sweep whenever the session is rebuilt).
        self.work = Worklist(tuple(self.config.integrations))
        self._unfed: dict[str, set[str]] = {}  # changed keys taken from the cache, not yet fed
        self._rebuilds_swept = -1
        self.provisioner = Provisioner(api, self.cache, clock, self._event)
        self.warm = WarmBuffer(api, self.cache, self.config.lease_namespace, self._event)
        self.warm.keys = lambda: self.work.placeholders
        self.interruptions = InterruptionGuard(
            api, self.cache, clock, self._event, self.config.checkpoint_grace_seconds
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
        if self.config.leader_election:
            self.elector.release()

    def close(self) -> None:
        """End the writer and Event threads (idempotent); writes in flight finish first."""
        self._writers.shutdown(wait=True)
        self._events.shutdown(wait=True)

    def run(self, stop: Callable[[], bool], interval: float = 1.0) -> None:
        while not stop():
            try:
                self.reconcile()
            except Exception:  # keep running; the next pass starts from the cluster again
                log.exception("reconcile failed")
            self.cache.changed.wait(interval)
            self.cache.changed.clear()

    def _each(self, writes: Iterable[Callable[[], None]]) -> None:
        """Run independent writes at once on the writer threads and wait for all of them.

        Each write handles its own API errors; anything else it raises (a bug, a broken
        connection) is raised here once every write has ended, so no write outlives its pass.
        """
        futures = [self._writers.submit(write) for write in writes]
        failure: BaseException | None = None
        for future in futures:
            error = future.exception()
            if error is not None and failure is None:
                failure = error
        if failure is not None:
            raise failure

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

    def _pass(self) -> Plan | None:
        if self.config.leader_election and not self.elector.try_acquire_or_renew():
            self.live.invalidate("not the leader")  # another leader may change anything meanwhile
            self.work.sweep_due = True
            self._queues_dirty = True
            return None
        if not all(informer.synced.is_set() for informer in self.informers):
            # A cache that has not listed yet (or is relisting after 410 Gone) hides admitted
            # workloads and bound pods: deciding on it would over-admit. The session waits: the
            # relist notes what changed meanwhile.
            return None
        started = time.monotonic()
        self._catch_up()
        self.interruptions.reconcile(
            signals=self.work.signalled, pods_on=self.work.pod_keys, asked=self.work.requested
        )
        self.warm.reconcile()
        with self.counters.lock:
            self.counters.extra["warm_buffer_pods"] = sum(self.warm.sizes.values())
        self._ensure_workloads()
        self._finish_workloads()
        failures = self.counters.write_failures
        replanned = self.counters.extra.get("replanned_devices", 0)
        plan = self._schedule()
        if plan is None:
            return None
        # Quota that evicted, stopped workloads give back is released before any admission that the
        # plan made with it is written: the API never shows both holding it at once. That includes
        # the workloads whose admission checks the plan ended: their evictions are written first.
        self._each(partial(self._write_check_eviction, e) for e in plan.check_evictions)
        self._stop_evicted(stop_jobs=False)
        self._apply_admissions(plan)
        self.provisioner.reconcile(plan)
        self._apply_preemptions(plan)
        self._stop_evicted()
        self._release_and_bind()
        self._record_pending(plan)
        if self.counters.write_failures > failures:
            self.live.invalidate("a write failed")  # the cluster may not show what the session holds
        if self.counters.extra.get("replanned_devices", 0) > replanned:
            self.live.invalidate("devices chosen again at bind time")
        self._write_queue_statuses()
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

    def _priorities(self) -> dict[str, int]:
        out = {}
        for pc in self.cache.items("WorkloadPriorityClass"):
            value = pc.get("value")
            if isinstance(value, int):
                out[pc["metadata"]["name"]] = value
        return out

    def _catch_up(self) -> None:
        """Take the keys the cache noted as changed into the worklist (or sweep it, when due), and
        keep them for the session's next sync."""
        changes = self.cache.take_changes()
        for kind, changed in changes.items():
            self._unfed.setdefault(kind, set()).update(changed)
            if changed and kind in _QUEUE_STATUS_INPUTS:
                self._queues_dirty = True
        if not self.work.sweep_due:
            self.work.note(changes, self.cache.get)
        if self.work.sweep_due:  # due before, or a Workload was deleted
            self.work.sweep(self.cache.items)

    def _create_workload(self, body: dict[str, Any]) -> None:
        try:
            created = self.api.create(k8s.WORKLOADS, body, body["metadata"]["namespace"])
        except ApiError as err:
            if not err.conflict:
                self.counters.add("write_failures")
            return
        self.cache.upsert("Workload", created)
        self.counters.add("workloads_created")

    def _ensure_workloads(self) -> None:
        """Create the Workloads of queued jobs and gated pod groups that have none.

        Only the worklist's candidates are looked at (jobs and pod groups that changed, or whose
        Workload is still being created); one that needs no Workload leaves the list."""
        candidates = [(kind, key, self.cache.get(kind, key)) for kind, key in sorted(self.work.to_create)]
        groups = []
        for group in sorted(self.work.groups):
            ns, name = group
            members = self.work.pods_by.get((ns, "group", name), set()) | self.work.pods_by.get(
                (ns, "name", name), set()
            )
            groups.append(
                (group, [p for key in sorted(members) if (p := self.cache.get("Pod", key)) is not None])
            )
        creations = workload_create_writes(candidates, groups, self.work.owned, self._priorities())
        self.work.to_create -= creations.settled_jobs
        self.work.groups -= creations.settled_groups
        self._each(partial(self._create_workload, w.body) for w in creations.writes)

    # --- finishing ---------------------------------------------------------------------------
    #
    # As Kueue does: a job that ended (its kind's terminal condition; for plain pods and pod
    # groups, every pod in a terminal phase) gets Finished=True on its Workload, which gives the
    # quota and devices back in this same pass (the session sees the change before it schedules);
    # the Workload of a job that is gone is deleted (on a real cluster the garbage collector may
    # get there first). Candidates are the worklist's: Workloads whose job or pods changed, every
    # Workload after a sweep, so a restarted controller finishes what ended while it was down.

    def _finish_workloads(self) -> None:
        self._catch_up()
        now = micro_time(self.clock())
        finishes: list[Callable[[], None]] = []
        candidates = sorted(self.work.to_finish)
        self.work.to_finish.clear()  # a change of the Workload, its job or a pod makes it one again
        for key in candidates:
            wl = self.cache.get("Workload", key)
            if wl is None or _condition(wl, ConditionType.FINISHED):
                continue
            watched = [
                ref
                for ref in wl["metadata"].get("ownerReferences") or []
                if ref.get("kind") in self.config.integrations
            ]
            owner = self._owner_job(wl)
            if watched and owner is None:
                finishes.append(partial(self._delete_orphan, wl))
                continue
            if owner is not None:
                ended = jobs.outcome(*owner)
                if ended is None and wl.get("status", {}).get("admission"):
                    finishes += self._reclaim(wl, jobs.reclaimable_pods(*owner))
            elif not wl["metadata"].get("ownerReferences") and wl.get("status", {}).get("admission"):
                expected = sum(int(ps.get("count", 1)) for ps in wl.get("spec", {}).get("podSets", []))
                ended = jobs.pods_outcome(self._pods_of(wl), expected)
            else:
                ended = None
            if ended is not None:
                body = finished_workload(wl, ended.succeeded, ended.message, now)
                finishes.append(partial(self._write_finished, body, ended.succeeded, ended.message))
        self._each(finishes)

    def _reclaim(self, wl: dict[str, Any], counts: dict[str, int]) -> list[Callable[[], None]]:
        """The write of ``status.reclaimablePods`` when the job's ended pods differ from it: the
        quota and devices of pods that will not run again go back before the job finishes."""
        if jobs.recorded_reclaimable(wl) == counts:
            return []
        body = copy_object(wl)
        body["status"]["reclaimablePods"] = [{"name": n, "count": c} for n, c in sorted(counts.items())]
        return [partial(self._write_reclaimable, body)]

    def _write_ended_status(self, body: dict[str, Any]) -> dict[str, Any] | None:
        """Write a Workload status the finishing step decided (cached on success); on failure the
        Workload is a finishing candidate again next pass. None when it was not written."""
        try:
            written = self.api.replace(k8s.WORKLOADS, body, sub="status")
        except ApiError as err:
            if not err.not_found:
                self.counters.add("write_failures")
                self.work.to_finish.add(object_key(body))
            return None
        self.cache.upsert("Workload", written)
        return written

    def _write_reclaimable(self, body: dict[str, Any]) -> None:
        if self._write_ended_status(body) is None:
            return
        self.counters.add("reclaimed_pods")
        reclaimable = body["status"]["reclaimablePods"]
        log.info("workload %s: pods that ended give their quota back: %s", object_key(body), reclaimable)

    def _write_finished(self, body: dict[str, Any], succeeded: bool, message: str) -> None:
        written = self._write_ended_status(body)
        if written is None:
            return
        key = object_key(body)
        self._pending_written.pop(key, None)
        self.counters.add("finished")
        outcome = "succeeded" if succeeded else "failed"
        _log_workload("finished", key, f"{outcome} ({message})")
        self._event(written, "Normal" if succeeded else "Warning", Reason.FINISHED, message)

    def _delete_orphan(self, wl: dict[str, Any]) -> None:
        """Delete the Workload of a job that is gone (the one with that name, if any, is another)."""
        meta = wl["metadata"]
        try:
            self.api.delete(
                k8s.WORKLOADS, meta["name"], meta["namespace"], preconditions={"uid": meta.get("uid")}
            )
        except ApiError as err:
            if not err.not_found and not err.conflict:
                self.counters.add("write_failures")
                self.work.to_finish.add(object_key(wl))  # looked at again next pass
            return
        self.cache.remove("Workload", wl)
        self.counters.add("orphans_deleted")
        _log_workload("deleted", object_key(wl), "its job is gone")

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

    # --- admissions -------------------------------------------------------------

    def _apply_admissions(self, plan: Plan) -> None:
        writes = admission_writes(partial(self.cache.get, "Workload"), plan, micro_time(self.clock()))
        if len(writes) < len(plan.admitted):
            self.live.invalidate("an admission was not written")
        for write in writes:
            self.cache.assume("Workload", write.body)  # assume, then write
        self._each(partial(self._write_admission, w) for w in writes)

    def _write_admission(self, write: Write) -> None:
        """Write an assumed admission; forget the assumption if the write fails, for any reason.

        The plan's placement annotation (metadata, which a status write leaves alone) goes first,
        when it differs from the one recorded on the observed Workload: an admission is never
        written without it.
        """
        updated = write.body
        planned = (updated["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        try:
            if planned != write.recorded:
                meta = updated["metadata"]
                # The observed version is a precondition: a Workload changed meanwhile (admitted by
                # another replica, say) keeps its own placement, and this admission is retried.
                patch: dict[str, Any] = {"metadata": {"annotations": {PLACEMENT_ANNOTATION: planned}}}
                if meta.get("resourceVersion"):
                    patch["metadata"]["resourceVersion"] = meta["resourceVersion"]
                patched = self.api.patch(k8s.WORKLOADS, meta["name"], patch, meta.get("namespace"))
                meta["resourceVersion"] = patched["metadata"]["resourceVersion"]
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
        except ApiError as err:
            self.cache.forget("Workload", write.workload)
            self.counters.add("write_failures")
            log.debug("admission of %s failed: %s", write.workload, err)
            return
        except BaseException:
            self.cache.forget("Workload", write.workload)
            raise
        self.cache.upsert("Workload", written)
        self.counters.add("admitted")
        assert write.admission is not None
        _log_workload("admitted", write.workload, f"by ClusterQueue {write.admission.cluster_queue}")
        self._event(
            written,
            "Normal",
            Reason.QUOTA_RESERVED,
            f"Admitted by ClusterQueue {write.admission.cluster_queue}",
        )

    def _write_check_eviction(self, eviction: CheckEviction) -> None:
        """A Retry check evicts the workload (its quota goes back once its job has stopped, as for
        a preemption victim, and it is queued again); a Rejected one also deactivates it."""
        wl = self.cache.get("Workload", eviction.workload)
        if wl is None or _condition(wl, ConditionType.EVICTED) or not wl.get("status", {}).get("admission"):
            return
        updated = evicted_by_check(wl, eviction, micro_time(self.clock()))
        try:
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
            if eviction.state == CheckState.REJECTED and written.get("spec", {}).get("active", True):
                written = self.api.replace(
                    k8s.WORKLOADS, {**written, "spec": {**written["spec"], "active": False}}
                )
        except ApiError:
            self.counters.add("write_failures")
            return
        self.cache.upsert("Workload", written)
        self.counters.add("check_evictions")
        _log_workload("evicted", eviction.workload, f"by admission check: {eviction.state}")
        self._event(
            written, "Warning", "EvictedDueToAdmissionCheck", updated["status"]["conditions"][-1]["message"]
        )

    # --- preemption ---------------------------------------------------------------
    #
    # Kueue's eviction, step by step (each step is one pass or more; each is idempotent):
    #
    #   admitted --preempted--> Evicted+Preempted, admission and quota kept
    #            --stop------->  pods evicted, job suspended
    #            --inactive--->  admission cleared, QuotaReserved=False: queued again
    #
    # The victim's quota is given back only once its job is no longer active, so a preemptor is
    # never admitted into room that the victim's pods still use.

    def _apply_preemptions(self, plan: Plan) -> None:
        get = partial(self.cache.get, "Workload")
        now = micro_time(self.clock())
        applied: list[Callable[[], None]] = []
        for write in preemption_writes(get, plan, now, dry_run=self.config.dry_run_preemption):
            if write.verb == Verb.WOULD_PREEMPT:
                self.counters.add("would_preempt")
                applied.append(partial(self._event, write.body, "Warning", "WouldPreempt", write.message))
                continue
            self.cache.assume("Workload", write.body)
            applied.append(partial(self._write_eviction, write.body, write.message))
        self._each(applied)

    def _write_eviction(self, updated: dict[str, Any], message: str) -> None:
        key = object_key(updated)
        try:
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
        except ApiError:
            self.cache.forget("Workload", key)
            self.counters.add("write_failures")
            return
        except BaseException:
            self.cache.forget("Workload", key)
            raise
        self.cache.upsert("Workload", written)
        self.counters.add("preempted")
        _log_workload("evicted", key, message)
        self._event(written, "Normal", Reason.PREEMPTED, message)

    def _stop_evicted(self, stop_jobs: bool = True) -> None:
        """Stop the jobs of evicted workloads that still hold quota (unless ``stop_jobs`` is False);
        give the quota back once they are no longer active."""
        self._catch_up()
        get = partial(self.cache.get, "Workload")
        now = micro_time(self.clock())
        writes = eviction_writes(get, sorted(self.work.evicted), self._still_active, now, stop_jobs=stop_jobs)
        self._each(
            partial(self._stop_job, w.body) if w.verb == Verb.STOP else partial(self._release_quota, w)
            for w in writes
        )

    def _still_active(self, wl: dict[str, Any]) -> bool:
        """Whether the workload's job may still run pods: Kueue's ``IsActive`` for its job kind
        (a batch Job: ``status.active`` > 0), and for pods without a job a pod in no terminal phase."""
        owner = self._owner_job(wl)
        if owner is not None and jobs.is_active(*owner):
            return True
        for pod in self._pods_of(wl):
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if owner is None or not pod["metadata"].get("deletionTimestamp"):
                return True
        return False

    def _stop_job(self, wl: dict[str, Any]) -> None:
        """Suspend the workload's job, then evict its pods (their grace period honoured).

        The job is suspended first: were its pods evicted while it still ran, its job controller
        would start replacements, and those would hold the node until the next pass evicted them too.
        """
        owner = self._owner_job(wl)
        if owner is not None:
            kind, job = owner
            if not jobs.is_suspended(kind, job) and jobs.INTEGRATIONS[kind].suspend is not None:
                try:
                    counts = {
                        str(ps.get("name")): int(ps.get("count", 1))
                        for ps in (wl.get("spec") or {}).get("podSets") or []
                    }
                    written = self.api.replace(
                        jobs.INTEGRATIONS[kind].resource, jobs.suspended_job(kind, job, counts)
                    )
                except ApiError:
                    self.counters.add("write_failures")
                    return  # retried next pass
                self.cache.upsert(kind, written)
        for pod in self._pods_of(wl):
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                continue
            grace = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
            body = {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": meta["name"], "namespace": meta["namespace"]},
                "deleteOptions": {"gracePeriodSeconds": grace},
            }
            try:
                self.api.request(
                    "POST", k8s.PODS.path(meta["namespace"], meta["name"], "eviction"), body=body
                )
            except ApiError as err:
                if not err.not_found:
                    self.counters.add("write_failures")
                    return  # retried next pass

    def _release_quota(self, write: Write) -> None:
        """Write an evicted, no longer active workload with its admission cleared: it is queued again."""
        try:
            written = self.api.replace(k8s.WORKLOADS, write.body, sub="status")
        except ApiError:
            self.counters.add("write_failures")
            return
        self.cache.upsert("Workload", written)
        self._pending_written.pop(write.workload, None)
        self.counters.add("released")
        _log_workload("requeued", write.workload, "its job stopped: quota given back")

    # --- release and bind -----------------------------------------------------------

    def _owner_job(self, wl: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        for ref in wl.get("metadata", {}).get("ownerReferences", []) or []:
            kind = ref.get("kind")
            if kind in jobs.INTEGRATIONS:
                job = self.cache.get(kind, f"{wl['metadata']['namespace']}/{ref['name']}")
                if job is not None and job.get("metadata", {}).get("uid") == ref.get("uid"):
                    return kind, job
        return None

    def _pods_of(self, wl: dict[str, Any]) -> list[dict[str, Any]]:
        """The workload's pods as cached now: by its workload label, or for plain pods and pod
        groups (no owner) by group label or pod name."""
        ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
        uid = (wl["metadata"].get("labels") or {}).get(keys.JOB_UID_LABEL)
        by = self.work.pods_by
        pod_keys = set(by.get((ns, "workload", name), ()))
        if uid and not wl["metadata"].get("ownerReferences"):
            pod_keys |= by.get((ns, "group", uid), set()) | by.get((ns, "name", uid), set())
        out = []
        for key in sorted(pod_keys):
            pod = self.cache.get("Pod", key)
            if pod is not None:
                out.append(pod)
        return out

    def _release_and_bind(self) -> None:
        """Release admitted jobs (all at once), then bind the pods of complete gangs (all at once).

        What to write is decided by the pure functions of :mod:`gpuplane.k8s.bind_writes`; devices
        are chosen one pod after another, each beside the pods chosen before it (each gang's
        bindings are assumed in the cache before the next gang is fitted), and only the API calls
        run in parallel.
        """
        self._catch_up()
        admitted = []
        for key in sorted(self.work.to_bind):
            wl = self.cache.get("Workload", key)
            if (
                wl is None
                or not wl.get("status", {}).get("admission")
                or _condition(wl, ConditionType.EVICTED)
                or _condition(wl, ConditionType.FINISHED)
                or awaiting_checks(wl)
            ):
                self.work.to_bind.discard(key)  # a change of the Workload makes it a candidate again
                continue
            admitted.append((wl, wl["status"]["admission"]))
        flavors = {f["metadata"]["name"]: f for f in self.cache.items("ResourceFlavor")} if admitted else {}
        releases: list[Write] = []
        for wl, admission in admitted:
            pods = self._pods_of(wl)
            release = release_writes(wl, admission, self._owner_job(wl), pods, flavors)
            if not release and not waiting(pods):
                # Released, and every pod of it bound: nothing to do until it, its job or a pod
                # of it changes.
                self.work.to_bind.discard(object_key(wl))
            releases += release
        self._each(partial(self._write, w.kind, w.body) for w in releases)
        bindings: list[Callable[[], None]] = []
        try:
            for wl, admission in admitted:
                bindings += self._bind_gang(wl, admission)
        except BaseException:
            # The gangs fitted before the failure are whole and assumed: send them, as planned;
            # the failing gang has forgotten its own assumptions (see _bind_gang).
            self._each(bindings)
            raise
        self._each(bindings)

    def _write(self, kind: str, body: dict[str, Any]) -> None:
        """Replace one Pod or job object, and cache what the server answered (a failure is retried
        next pass)."""
        try:
            if kind == "Pod":
                written = self.api.replace(k8s.PODS, body)
            else:
                written = self.api.replace(jobs.INTEGRATIONS[kind].resource, body)
        except ApiError:
            self.counters.add("write_failures")
            return
        self.cache.upsert(kind, written)

    def _bind_gang(self, wl: dict[str, Any], admission: dict[str, Any]) -> list[Callable[[], None]]:
        """The bindings of every pod of the workload to its planned node, once all have arrived,
        each assumed in the cache (and the worklist) before it is written.

        While pods are missing, each one that waits gets an Event (once) saying so.
        """
        plan = gang_plan(wl, admission, self._pods_of(wl), self._gang_noted_already)
        if plan.waits:
            return [partial(self._note_gang_wait, pod, message) for pod, message in plan.waits]
        if plan.nodes:  # the gang is complete: placeholders on its nodes make room
            self.warm.clear(plan.nodes)
        if not plan.pods:
            return []
        config = (self.config.scheduler or SchedulerConfig()).devices
        writes: list[Callable[[], None]] = []
        assumed: list[str] = []
        nodes: Counter[str] = Counter()
        try:
            for bind in binding_writes(plan, self._node_view, config):
                if bind.replanned:
                    self.counters.add("replanned_devices")
                    log.info(
                        "planned devices %s on %s are taken: fitting the pod again", bind.planned, bind.node
                    )
                if bind.binding is None or bind.bound is None:
                    self.counters.add("device_waits")
                    continue
                self.cache.assume("Pod", bind.bound)
                assumed.append(bind.pod)
                self.work.note({"Pod": [bind.pod]}, self.cache.get)  # the next gang is fitted beside it
                writes.append(partial(self._write_binding, bind.pod, bind.binding))
                nodes[bind.node] += 1
        except BaseException:
            # Part of a gang is never sent: what it assumed is forgotten, and the gang is fitted
            # again, whole, on a later pass.
            for key in assumed:
                self.cache.forget("Pod", key)
            self.work.note({"Pod": assumed}, self.cache.get)
            raise
        if writes:
            where = ", ".join(f"{n} on {node}" for node, n in sorted(nodes.items()))
            _log_workload("binding", object_key(wl), f"{len(writes)} pods: {where}")
        return writes

    def _node_view(self, name: str) -> NodeView | None:
        """The node as the cache and the worklist show it now (``None``: not known)."""
        node = self.cache.get("Node", name)
        if node is None:
            return None
        pods = tuple(p for key in self.work.pod_keys(name) if (p := self.cache.get("Pod", key)) is not None)
        return NodeView(node, pods, self.work.plans_on(name))

    def _gang_noted_already(self, pod: dict[str, Any]) -> bool:
        return pod["metadata"].get("uid", object_key(pod)) in self._gang_noted

    def _note_gang_wait(self, pod: dict[str, Any], message: str) -> None:
        self._gang_noted.add(pod["metadata"].get("uid", object_key(pod)))
        self._event({**pod, "apiVersion": "v1", "kind": "Pod"}, "Normal", "WaitingForGang", message)

    def _write_binding(self, key: str, binding: dict[str, Any]) -> None:
        meta = binding["metadata"]
        try:
            self.api.request("POST", k8s.PODS.path(meta["namespace"], meta["name"], "binding"), body=binding)
        except ApiError as err:
            self.cache.forget("Pod", key)
            if not err.conflict:  # 409: already bound, by us before a restart
                self.counters.add("write_failures")
            return
        except BaseException:
            self.cache.forget("Pod", key)
            raise
        self.counters.add("bound")
        node = binding["target"]["name"]
        pod = self.cache.get("Pod", key) or {"metadata": meta}
        message = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"  # as kube-scheduler
        self._event({**pod, "apiVersion": "v1", "kind": "Pod"}, "Normal", "Scheduled", message)

    # --- queue status ---------------------------------------------------------------

    def _write_queue_statuses(self) -> None:
        """Bring every ClusterQueue's and LocalQueue's status (counts, flavor usage, Active) up to
        date; only those that differ are written (:mod:`gpuplane.k8s.queue_status`). Nothing is
        computed in a pass where none of the objects it is derived from changed."""
        self._catch_up()
        if not self._queues_dirty:
            return
        self._queues_dirty = False
        items = self.cache.items
        objects = QueueObjects(
            cluster_queues=items("ClusterQueue"),
            local_queues=items("LocalQueue"),
            workloads=items("Workload"),
            flavors=items("ResourceFlavor"),
            topologies=items("Topology"),
            admission_checks=items("AdmissionCheck"),
        )
        writes = queue_status_writes(objects, micro_time(self.clock())[:19] + "Z")
        self._each(partial(self._write_queue_status, w) for w in writes)

    def _write_queue_status(self, write: QueueStatusWrite) -> None:
        body = {"status": write.status}
        try:
            if write.kind == "ClusterQueue":
                written = self.api.patch(k8s.CLUSTER_QUEUES, write.name, body, sub="status")
            else:
                written = self.api.patch(k8s.LOCAL_QUEUES, write.name, body, write.namespace, sub="status")
        except ApiError as err:
            if not err.not_found:
                self.counters.add("queue_status_failures")
                self._queues_dirty = True  # computed and written again next pass
            return
        self.cache.upsert(write.kind, written)

    # --- pending --------------------------------------------------------------------

    def _record_pending(self, plan: Plan) -> None:
        get = partial(self.cache.get, "Workload")
        writes = pending_writes(get, plan, micro_time(self.clock()), self._pending_written)
        self._each(partial(self._write_pending, w) for w in writes)

    def _write_pending(self, write: Write) -> None:
        pending = write.pending
        assert pending is not None
        try:
            written = self.api.replace(k8s.WORKLOADS, write.body, sub="status")
        except ApiError:
            # The session reports a reason once; the next pass looks at every one again.
            self.live.invalidate("a pending condition was not written")
            return
        self.cache.upsert("Workload", written)
        self._pending_written[pending.workload] = (pending.reason, pending.message)
        where = ""
        if pending.position is not None:
            where = f" (position {pending.position} in ClusterQueue {pending.cluster_queue})"
        self._event(written, "Normal", Reason.PENDING, f"{pending.reason}{where}: {pending.message}")

    # --- events ----------------------------------------------------------------------

    def _event(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Record an Event about ``obj`` in the background: Events are best effort, and no step of a
        pass waits for them (they would double the round trips on the way to a binding)."""
        meta = obj.get("metadata", {})
        ns = meta.get("namespace") or "default"
        now = micro_time(self.clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", ""),
                "kind": obj.get("kind", ""),
                "name": meta.get("name", ""),
                "namespace": ns,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "firstTimestamp": now[:19] + "Z",
            "lastTimestamp": now[:19] + "Z",
            "count": 1,
            "source": {"component": "gpuplane-controller"},
        }
        with contextlib.suppress(RuntimeError):  # shut down: the controller is stopping
            self._events.submit(self._send_event, body, ns)

    def _send_event(self, body: dict[str, Any], namespace: str) -> None:
        try:
            self.api.create(k8s.EVENTS, body, namespace)
        except ApiError:
            self.counters.add("event_failures")


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


def _log_workload(what: str, key: str, detail: str) -> None:
    """One INFO line about a step in a workload's life (admitted, binding, evicted, requeued,
    finished, deleted), naming its key; with ``--log-format json`` the fields come apart."""
    log.info("workload %s %s: %s", key, what, detail, extra={"event": what, "workload": key})


def _condition(obj: dict[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", []) or []
    )
