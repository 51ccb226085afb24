"""The controller's eviction write path: preemptions, and the stopping of evicted workloads.

Kueue's eviction, step by step (each step is one pass or more; each is idempotent)::

  admitted --preempted--> Evicted+Preempted, admission and quota kept
           --stop------->  pods evicted, job suspended
           --inactive--->  admission cleared, QuotaReserved=False: queued again

The victim's quota is given back only once its job is no longer active, so a preemptor is never
admitted into room that the victim's pods still use.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from gpuplane.core.session import Plan, Reason
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.plan_writes import Verb, Write, eviction_writes, preemption_writes
from gpuplane.k8s.writing import Tools, log_workload, owner_job, pods_of


class Evictions:
    """Writes preemptions (or, in a dry run, only their Events), stops the jobs of evicted
    workloads and gives their quota back once they are no longer active (owns no state: the
    evicted workloads are the worklist's ``evicted``)."""

    def __init__(self, tools: Tools, *, dry_run: bool, forget_pending: Callable[[str], None]) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.dry_run = dry_run
        self.forget_pending = forget_pending  # a requeued workload's pending reason is written anew

    def preempt(self, plan: Plan) -> None:
        """Mark the plan's victims Evicted and Preempted (assumed, then written), all at once."""
        get = partial(self.cache.get, "Workload")
        now = self.tools.now()
        applied: list[Callable[[], None]] = []
        for write in preemption_writes(get, plan, now, dry_run=self.dry_run):
            if write.verb == Verb.WOULD_PREEMPT:
                self.tools.counters.add("would_preempt")
                applied.append(
                    partial(self.tools.event, write.body, "Warning", "WouldPreempt", write.message)
                )
                continue
            self.cache.assume("Workload", write.body)
            applied.append(partial(self._write_eviction, write.body, write.message))
        self.tools.each(applied)

    def _write_eviction(self, updated: dict[str, Any], message: str) -> None:
        key = object_key(updated)
        try:
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
        except ApiError:
            self.cache.forget("Workload", key)
            self.tools.counters.add("write_failures")
            return
        except BaseException:
            self.cache.forget("Workload", key)
            raise
        self.cache.upsert("Workload", written)
        self.tools.counters.add("preempted")
        log_workload("evicted", key, message)
        self.tools.event(written, "Normal", Reason.PREEMPTED, message)

    def stop_evicted(self, stop_jobs: bool = True) -> None:
        """Stop the jobs of evicted workloads that still hold quota (unless ``stop_jobs`` is False);
        give the quota back once they are no longer active."""
        get = partial(self.cache.get, "Workload")
        now = self.tools.now()
        evicted = sorted(self.tools.work.evicted)
        writes = eviction_writes(get, evicted, self.still_active, now, stop_jobs=stop_jobs)
        self.tools.each(
            partial(self._stop_job, w.body) if w.verb == Verb.STOP else partial(self._release_quota, w)
            for w in writes
        )

    def still_active(self, wl: dict[str, Any]) -> bool:
        """Whether the workload's job may still run pods: Kueue's ``IsActive`` for its job kind
        (a batch Job: ``status.active`` > 0), and for pods without a job a pod in no terminal phase."""
        owner = owner_job(self.cache, wl)
        if owner is not None and jobs.is_active(*owner):
            return True
        for pod in pods_of(self.cache, self.tools.work, wl):
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
        owner = owner_job(self.cache, wl)
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
                    self.tools.counters.add("write_failures")
                    return  # retried next pass
                self.cache.upsert(kind, written)
        for pod in pods_of(self.cache, self.tools.work, wl):
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
                    self.tools.counters.add("write_failures")
                    return  # retried next pass

    def _release_quota(self, write: Write) -> None:
        """Write an evicted, no longer active workload with its admission cleared: it is queued again."""
        try:
            written = self.api.replace(k8s.WORKLOADS, write.body, sub="status")
        except ApiError:
            self.tools.counters.add("write_failures")
            return
        self.cache.upsert("Workload", written)
        self.forget_pending(write.workload)
        self.tools.counters.add("released")
        log_workload("requeued", write.workload, "its job stopped: quota given back")
