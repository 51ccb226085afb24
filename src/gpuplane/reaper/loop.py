"""The reaper: one pass reads pods, owners and samples, asks the policy, and (with ``enforce``) acts.

::

    pods holding GPUs --describe--> Subject (session|batch, owner, method, settings)
         |   Prometheus: raw samples over the longest window
         v
    insight.idle.decide (sessions) / insight.idle.data_stall (batch) --> Report per pod
         |   enforce only
         v
    keep:    a stale gpuplane.dev/reclaim-at is removed (the user came back)
    warn:    Events on pod and owner, reclaim-at on the owner, webhook message (queued) -- once
    reclaim: the owner's way (subjects.Method), an Event on pod and owner, the metric
    stall:   Warning Event, Workload condition gpuplane.dev/DataStallSuspected -- once

A dry run (the default) computes the same reports and writes nothing. Writes are idempotent and a
failed write is logged and retried by the next pass; the webhook is never waited for.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.core.session import Reason
from gpuplane.insight import idle
from gpuplane.model.conditions import ConditionType, condition, with_conditions
from gpuplane.reaper.cluster import (
    NOTEBOOK_STOPPED,
    REPLICAS_ANNOTATION,
    ClusterApi,
    annotations_of,
)
from gpuplane.reaper.metrics import ReaperMetrics
from gpuplane.reaper.notify import IdleNotice
from gpuplane.reaper.prometheus import PrometheusClient, Samples, usage
from gpuplane.reaper.subjects import Method, Subject, describe

log = logging.getLogger(__name__)

IDLE_REASON = Reason.IDLE_RECLAIMED  # Workload eviction reason and Event reason of a reclaim

PodDecision = tuple[Subject, idle.Decision, idle.StallEvidence | None]


@dataclass
class ReaperConfig:
    defaults: idle.IdleSettings = field(default_factory=idle.IdleSettings)
    stall: idle.StallSettings = field(default_factory=idle.StallSettings)
    enforce: bool = False
    namespaces: tuple[str, ...] = ()  # empty: every namespace


@dataclass(frozen=True, slots=True)
class Report:
    """One pod's decision, as ``gpuplane reaper --output json`` prints it."""

    subject: Subject
    decision: idle.Decision  # the owner's, combined over its pods
    stall: idle.StallEvidence | None = None
    owner_gpus: int = 0  # GPUs of all the owner's pods: what a reclaim frees

    def as_json(self) -> dict[str, Any]:
        d = self.decision
        out: dict[str, Any] = {
            "pod": self.subject.name,
            "namespace": self.subject.namespace,
            "owner": {"kind": self.subject.owner.kind, "name": self.subject.owner.name},
            "gpus": self.subject.gpus,
            "idleSeconds": None if d.idle_seconds is None else round(d.idle_seconds),
            "action": str(d.action),
            "reason": str(d.reason),
            "reclaimAt": None if d.reclaim_at is None else idle.format_time(d.reclaim_at),
            "message": d.message,
        }
        if self.stall is not None and self.stall.suspected:
            out["dataStall"] = {"message": self.stall.message, **self.stall.as_fields()}
        return out


class Reaper:
    def __init__(
        self,
        api: ClusterApi,
        prometheus: PrometheusClient,
        config: ReaperConfig,
        *,
        notify: Callable[[IdleNotice], None] | None = None,
        metrics: ReaperMetrics | None = None,
    ) -> None:
        self.api = api
        self.prometheus = prometheus
        self.config = config
        self.notify = notify
        self.metrics = metrics or ReaperMetrics()

    # --- one pass ------------------------------------------------------------------------------

    def decide(self, now: float) -> list[Report]:
        """Reports for every pod holding accelerators at ``now``; reads only."""
        subjects = [
            describe(self.api, pod, self.config.defaults) for pod in self.api.gpu_pods(self.config.namespaces)
        ]
        for subject in subjects:
            for problem in subject.problems:
                log.warning("%s/%s: ignoring reaper setting %s", subject.namespace, subject.name, problem)
        lookback = max([s.settings.window + s.settings.stale for s in subjects] + [self.config.stall.window])
        samples: Samples = self.prometheus.samples(now, lookback) if subjects else {}
        decided: dict[tuple[str, str, str], list[PodDecision]] = {}
        for subject in subjects:
            pod_usage = usage(samples, subject.namespace, subject.name, subject.gpus)
            decision = idle.decide(
                pod_usage, idle.Workload(subject.klass, subject.notes), subject.settings, now
            )
            stall = None
            if subject.klass is idle.WorkloadClass.BATCH:
                stall = idle.data_stall(pod_usage, self.config.stall, now)
            decided.setdefault(subject.owner_key, []).append((subject, decision, stall))
        reports = []
        for group in decided.values():
            # Every pod of an owner reports the owner's decision: it is warned or reclaimed as one.
            joint = idle.combine([decision for _, decision, _ in group])
            gpus = sum(subject.gpus for subject, _, _ in group)
            reports += [Report(subject, joint, stall, gpus) for subject, _, stall in group]
        return sorted(reports, key=lambda r: (r.subject.namespace, r.subject.name))

    def run_once(self, now: float) -> list[Report]:
        """Decide, then act on the decisions when enforcing; returns the reports."""
        reports = self.decide(now)
        if not self.config.enforce:
            return reports
        acted: set[tuple[str, str, str]] = set()
        for report in reports:
            try:
                if report.stall is not None:
                    self._flag_stall(report.subject, report.stall, now)
                if report.subject.owner_key not in acted:  # one owner, one warning or reclaim
                    acted.add(report.subject.owner_key)
                    self._act(report, now)
            except Exception:  # one pod's failed write must not stop the others
                log.exception("acting on %s/%s failed", report.subject.namespace, report.subject.name)
        return reports

    def run(
        self,
        stop: Callable[[], bool],
        clock: Callable[[], float],
        wait: Callable[[float], object],
        interval: float = 60.0,
    ) -> None:
        """Passes every ``interval`` seconds until ``stop()``; a failed pass is logged and retried."""
        while not stop():
            try:
                self.run_once(clock())
            except Exception:
                log.exception("reaper pass failed")
            wait(interval)

    # --- acting ----------------------------------------------------------------------------------

    def _act(self, report: Report, now: float) -> None:
        subject, decision = report.subject, report.decision
        if subject.reclaiming:
            return  # asked already; the owner's controller is stopping it
        if decision.action is idle.Action.KEEP:
            if idle.RECLAIM_AT_ANNOTATION in annotations_of(subject.holder) and decision.reason in (
                idle.Reason.BUSY,
                idle.Reason.IDLE_BELOW_WINDOW,
            ):
                self.api.merge_patch(
                    subject.holder, {"metadata": {"annotations": {idle.RECLAIM_AT_ANNOTATION: None}}}
                )
            return
        if decision.action is idle.Action.WARN:
            self._warn(subject, decision, report.owner_gpus, now)
        else:
            self._reclaim(subject, decision, report.owner_gpus, now)

    def _notice(self, subject: Subject, decision: idle.Decision, reclaimed: bool, gpus: int) -> None:
        if self.notify is None:
            return
        self.notify(
            IdleNotice(
                subject.namespace,
                subject.name,
                subject.owner.kind,
                subject.owner.name,
                gpus,
                decision.idle_seconds or 0.0,
                decision.reclaim_at or 0.0,
                reclaimed,
            )
        )

    def _events(self, subject: Subject, etype: str, reason: str, message: str, now: float) -> None:
        self.api.event(subject.pod, etype, reason, message, now)
        if subject.holder is not subject.pod:
            self.api.event(subject.owner.obj, etype, reason, message, now)

    def _warn(self, subject: Subject, decision: idle.Decision, gpus: int, now: float) -> None:
        assert decision.reclaim_at is not None
        stamp = idle.format_time(decision.reclaim_at)
        if annotations_of(subject.holder).get(idle.RECLAIM_AT_ANNOTATION) == stamp:
            return  # already warned for this reclaim time
        self.api.merge_patch(
            subject.holder, {"metadata": {"annotations": {idle.RECLAIM_AT_ANNOTATION: stamp}}}
        )
        self._events(subject, "Warning", "IdleGPU", decision.message, now)
        self.metrics.warned.labels(subject.namespace, subject.owner.kind).inc()
        self._notice(subject, decision, reclaimed=False, gpus=gpus)

    def _reclaim(self, subject: Subject, decision: idle.Decision, gpus: int, now: float) -> None:
        owner = subject.owner.obj
        clear: dict[str, str | None] = {idle.RECLAIM_AT_ANNOTATION: None}
        method = subject.method
        if method is Method.NONE:
            log.info(
                "%s/%s: idle, but %s has no reclaim method",
                subject.namespace,
                subject.name,
                subject.owner.kind,
            )
            return
        if method is Method.STOP_NOTEBOOK:
            stopped = {NOTEBOOK_STOPPED: idle.format_time(now), **clear}
            self.api.merge_patch(owner, {"metadata": {"annotations": stopped}})
        elif method is Method.SCALE_TO_ZERO:
            replicas = owner.get("spec", {}).get("replicas", 1)
            notes = {REPLICAS_ANNOTATION: str(replicas), **clear}
            self.api.merge_patch(owner, {"metadata": {"annotations": notes}, "spec": {"replicas": 0}})
        elif method is Method.EVICT_WORKLOAD:
            assert subject.workload is not None
            if not self._evict_workload(subject.workload, decision.message, now):
                return
            self.api.merge_patch(owner, {"metadata": {"annotations": clear}})
        elif method is Method.DELETE_POD:
            grace = subject.pod.get("spec", {}).get("terminationGracePeriodSeconds")
            self.api.delete(subject.pod, grace)
        self._events(subject, "Normal", IDLE_REASON, decision.message, now)
        self.metrics.record_reclaim(subject.namespace, subject.owner.kind, gpus, decision.idle_seconds or 0.0)
        self._notice(subject, decision, reclaimed=True, gpus=gpus)

    def _evict_workload(self, workload: Mapping[str, Any], message: str, now: float) -> bool:
        """Kueue's way to stop an admitted workload from outside: condition Evicted=True. The queue
        controller then suspends the job, releases the quota and requeues the workload. False when the
        workload is not admitted or already evicted (nothing to do)."""
        status = workload.get("status") or {}
        conditions = list(status.get("conditions") or [])
        if not status.get("admission") or any(
            c.get("type") == ConditionType.EVICTED and c.get("status") == "True" for c in conditions
        ):
            return False
        evicted = condition(ConditionType.EVICTED, IDLE_REASON, idle.format_time(now), message)
        body = json.loads(json.dumps(workload))
        body["status"]["conditions"] = with_conditions(conditions, evicted)
        self.api.replace_status(body)
        return True

    def _flag_stall(self, subject: Subject, stall: idle.StallEvidence, now: float) -> None:
        """The data-stall hint as a Warning Event and a Workload condition (an annotation on a pod
        without a Workload), once per episode: written when a stall starts, set False when the
        evidence says it has ended. Missing metrics change nothing."""
        if not stall.suspected and stall.low_sm_share is None and stall.zero_share is None:
            return
        workload = subject.workload
        if workload is None and subject.owner.kind == "Job" and not subject.owner.stub:
            workload = self.api.workload_of(subject.owner.obj)
        fields = ", ".join(f"{k}={v}" for k, v in stall.as_fields().items())
        message = f"{stall.message} ({fields})"
        if workload is None:
            flagged = annotations_of(subject.pod).get(idle.DATA_STALL_CONDITION) == "True"
            if stall.suspected != flagged:
                value = "True" if stall.suspected else None
                self.api.merge_patch(
                    subject.pod, {"metadata": {"annotations": {idle.DATA_STALL_CONDITION: value}}}
                )
                if stall.suspected:
                    self.api.event(subject.pod, "Warning", "DataStallSuspected", message, now)
            return
        conditions = list((workload.get("status") or {}).get("conditions") or [])
        current = next((c for c in conditions if c.get("type") == idle.DATA_STALL_CONDITION), None)
        flagged = current is not None and current.get("status") == "True"
        if stall.suspected == flagged:
            return
        if current is None and not stall.suspected:
            return
        body = json.loads(json.dumps(workload))
        body.setdefault("status", {})["conditions"] = [
            c for c in conditions if c.get("type") != idle.DATA_STALL_CONDITION
        ] + [
            {
                "type": idle.DATA_STALL_CONDITION,
                "status": "True" if stall.suspected else "False",
                "reason": stall.pattern if stall.suspected else "NoDataStall",
                "message": message,
                "lastTransitionTime": idle.format_time(now),
            }
        ]
        self.api.replace_status(body)
        if stall.suspected:
            self.api.event(subject.pod, "Warning", "DataStallSuspected", message, now)
            self.api.event(workload, "Warning", "DataStallSuspected", message, now)
