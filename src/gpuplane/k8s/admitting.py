"""The controller's admission write path: the plan's admissions, and the evictions that admission
checks decided (written before any admission, so a quota they give back is never shown twice)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from gpuplane.core.session import CheckEviction, Plan, Reason
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.plan_writes import Charged, Write, admission_writes
from gpuplane.k8s.provisioning import evicted_by_check
from gpuplane.k8s.writing import Tools, condition, log, log_workload
from gpuplane.model.admission_checks import CheckState
from gpuplane.model.conditions import ConditionType
from gpuplane.model.labels import PLACEMENT_ANNOTATION


class Admissions:
    """Writes admissions (assumed in the cache first, forgotten on failure) and admission-check
    evictions (owns no state: what it writes comes from the plan and the cache)."""

    def __init__(
        self,
        tools: Tools,
        charged: Charged | None = None,
        unsent: Callable[[str], dict[str, Any] | None] | None = None,
    ) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.charged = charged  # what claims cost a pod (the scheduling session's charged workloads)
        # A Workload assumed and not created yet, taken to be created here (WorkloadCreation.take).
        self.unsent = unsent or (lambda _key: None)

    def write_check_evictions(self, plan: Plan) -> None:
        """The evictions of workloads whose admission checks the plan ended, all at once."""
        self.tools.each(partial(self._write_check_eviction, e) for e in plan.check_evictions)

    def write_admissions(self, plan: Plan) -> None:
        """Assume every admission of the plan in the cache, then write them all at once."""
        writes = admission_writes(partial(self.cache.get, "Workload"), plan, self.tools.now(), self.charged)
        if len(writes) < len(plan.admitted):
            self.tools.invalidate("an admission was not written")
        for write in writes:
            self.cache.assume("Workload", write.body)  # assume, then write
        self.tools.each(partial(self._write_admission, w) for w in writes)

    def _write_admission(self, write: Write) -> None:
        """Write an assumed admission; forget the assumption if the write fails, for any reason.

        The plan's placement annotation (metadata, which a status write leaves alone) goes first,
        when it differs from the one recorded on the observed Workload: an admission is never
        written without it. A Workload that this pass assumed and has not created yet is created
        now, carrying the annotation, which spares the patch.
        """
        updated = write.body
        planned = (updated["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        unsent = self.unsent(write.workload)
        created: dict[str, Any] | None = None
        try:
            if unsent is not None:
                meta = updated["metadata"]
                body = {**unsent, "metadata": {**unsent["metadata"], "annotations": meta.get("annotations")}}
                if not body["metadata"]["annotations"]:
                    del body["metadata"]["annotations"]
                created = self.api.create(k8s.WORKLOADS, body, meta.get("namespace"))
                self.tools.counters.add("workloads_created")
                meta.update(
                    (field, value)
                    for field in ("resourceVersion", "uid", "creationTimestamp")
                    if (value := created["metadata"].get(field)) is not None
                )
            elif planned != write.recorded:
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
            self._forget(write.workload, created)
            self.tools.counters.add("write_failures")
            log.debug("admission of %s failed: %s", write.workload, err)
            return
        except BaseException:
            self._forget(write.workload, created)
            raise
        self.cache.upsert("Workload", written)
        self.tools.counters.add("admitted")
        assert write.admission is not None
        log_workload("admitted", write.workload, f"by ClusterQueue {write.admission.cluster_queue}")
        self.tools.event(
            written,
            "Normal",
            Reason.QUOTA_RESERVED,
            f"Admitted by ClusterQueue {write.admission.cluster_queue}",
        )

    def _forget(self, key: str, created: dict[str, Any] | None) -> None:
        """Drop a failed admission's assumption; a Workload it created stays, as the server made it."""
        self.cache.forget("Workload", key)
        if created is not None:
            self.cache.upsert("Workload", created)

    def _write_check_eviction(self, eviction: CheckEviction) -> None:
        """A Retry check evicts the workload (its quota goes back once its job has stopped, as for
        a preemption victim, and it is queued again); a Rejected one also deactivates it."""
        wl = self.cache.get("Workload", eviction.workload)
        if wl is None or condition(wl, ConditionType.EVICTED) or not wl.get("status", {}).get("admission"):
            return
        updated = evicted_by_check(wl, eviction, self.tools.now())
        try:
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
            if eviction.state == CheckState.REJECTED and written.get("spec", {}).get("active", True):
                written = self.api.replace(
                    k8s.WORKLOADS, {**written, "spec": {**written["spec"], "active": False}}
                )
        except ApiError:
            self.tools.counters.add("write_failures")
            return
        self.cache.upsert("Workload", written)
        self.tools.counters.add("check_evictions")
        log_workload("evicted", eviction.workload, f"by admission check: {eviction.state}")
        self.tools.event(
            written, "Warning", "EvictedDueToAdmissionCheck", updated["status"]["conditions"][-1]["message"]
        )
