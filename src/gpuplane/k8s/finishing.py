"""The controller's finishing write path.

As Kueue does: a job that ended (its kind's terminal condition; for plain pods and pod groups,
every pod in a terminal phase) gets Finished=True on its Workload, which gives the quota and devices
back in this same pass (the session sees the change before it schedules); the Workload of a job that
is gone is deleted (on a real cluster the garbage collector may get there first). Candidates are the
worklist's: Workloads whose job or pods changed, every Workload after a sweep, so a restarted
controller finishes what ended while it was down. Pods of a running job that will not run again are
recorded in ``status.reclaimablePods``, so their quota and devices go back before the job ends.
A Workload written Finished here reaches the controller's cache at once, and from there its runtime
history (:mod:`gpuplane.k8s.runtime_store`), as does one that another replica finished.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from gpuplane.core.session import Reason
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.plan_writes import copy_object, finished_workload
from gpuplane.k8s.writing import Tools, condition, log, log_workload, owner_job, pods_of
from gpuplane.model.conditions import ConditionType


class Finishing:
    """Marks the Workloads of ended jobs Finished, records reclaimable pods, and deletes the
    Workloads of jobs that are gone (owns no state: its candidates are the worklist's
    ``to_finish``, and a failed write puts its Workload back there)."""

    def __init__(
        self, tools: Tools, *, integrations: tuple[str, ...], forget_pending: Callable[[str], None]
    ) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.integrations = integrations  # the job kinds whose owner references are watched
        self.forget_pending = forget_pending  # a finished workload has no pending reason

    def run(self) -> None:
        """Look at every finishing candidate and write what it needs, all at once."""
        work = self.tools.work
        now = self.tools.now()
        finishes: list[Callable[[], None]] = []
        candidates = sorted(work.to_finish)
        work.to_finish.clear()  # a change of the Workload, its job or a pod makes it one again
        for key in candidates:
            wl = self.cache.get("Workload", key)
            if wl is None or condition(wl, ConditionType.FINISHED):
                continue
            watched = [
                ref
                for ref in wl["metadata"].get("ownerReferences") or []
                if ref.get("kind") in self.integrations
            ]
            owner = owner_job(self.cache, wl)
            if watched and owner is None:
                finishes.append(partial(self._delete_orphan, wl))
                continue
            if owner is not None:
                ended = jobs.outcome(*owner)
                if ended is None and wl.get("status", {}).get("admission"):
                    finishes += self._reclaim(wl, jobs.reclaimable_pods(*owner))
            elif not wl["metadata"].get("ownerReferences") and wl.get("status", {}).get("admission"):
                expected = sum(int(ps.get("count", 1)) for ps in wl.get("spec", {}).get("podSets", []))
                ended = jobs.pods_outcome(pods_of(self.cache, work, wl), expected)
            else:
                ended = None
            if ended is not None:
                body = finished_workload(wl, ended.succeeded, ended.message, now)
                finishes.append(partial(self._write_finished, body, ended.succeeded, ended.message))
        self.tools.each(finishes)

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
                self.tools.counters.add("write_failures")
                self.tools.work.to_finish.add(object_key(body))
            return None
        self.cache.upsert("Workload", written)
        return written

    def _write_reclaimable(self, body: dict[str, Any]) -> None:
        if self._write_ended_status(body) is None:
            return
        self.tools.counters.add("reclaimed_pods")
        reclaimable = body["status"]["reclaimablePods"]
        log.info("workload %s: pods that ended give their quota back: %s", object_key(body), reclaimable)

    def _write_finished(self, body: dict[str, Any], succeeded: bool, message: str) -> None:
        written = self._write_ended_status(body)
        if written is None:
            return
        key = object_key(body)
        self.forget_pending(key)
        self.tools.counters.add("finished")
        outcome = "succeeded" if succeeded else "failed"
        log_workload("finished", key, f"{outcome} ({message})")
        self.tools.event(written, "Normal" if succeeded else "Warning", Reason.FINISHED, message)

    def _delete_orphan(self, wl: dict[str, Any]) -> None:
        """Delete the Workload of a job that is gone (the one with that name, if any, is another)."""
        meta = wl["metadata"]
        try:
            self.api.delete(
                k8s.WORKLOADS, meta["name"], meta["namespace"], preconditions={"uid": meta.get("uid")}
            )
        except ApiError as err:
            if not err.not_found and not err.conflict:
                self.tools.counters.add("write_failures")
                self.tools.work.to_finish.add(object_key(wl))  # looked at again next pass
            return
        self.cache.remove("Workload", wl)
        self.tools.counters.add("orphans_deleted")
        log_workload("deleted", object_key(wl), "its job is gone")
