"""Prometheus metrics of the scheduler: Kueue's names where they mean the same, gpuplane's own after.

One :class:`SchedulerMetrics` per controller. The controller calls :meth:`SchedulerMetrics.observe`
after every pass with the state it decided on, the plan and the pass latency; gauges are computed
from the last observation when Prometheus scrapes (a custom collector), counters and histograms
advance as passes see things happen.

Kueue's metrics (same names, types and labels, so existing Kueue dashboards work):

==============================================  =========  ==========================================
``kueue_pending_workloads``                      gauge      ``cluster_queue``, ``status`` (active,
                                                            inadmissible)
``kueue_admitted_active_workloads``              gauge      ``cluster_queue``
``kueue_cluster_queue_status``                   gauge      ``cluster_queue``, ``status``
``kueue_cluster_queue_resource_usage``           gauge      ``cohort``, ``cluster_queue``, ``flavor``,
                                                            ``resource``
``kueue_cluster_queue_nominal_quota``            gauge      same
``kueue_cluster_queue_borrowing_limit``          gauge      same
``kueue_unadmitted_workloads``                   gauge      ``cluster_queue``, ``reason``
``kueue_admitted_workloads_total``               counter    ``cluster_queue``
``kueue_admission_wait_time_seconds``            histogram  ``cluster_queue``
``kueue_evicted_workloads_total``                counter    ``cluster_queue``, ``reason``
``kueue_preempted_workloads_total``              counter    ``preempting_cluster_queue``, ``reason``
``kueue_local_queue_pending_workloads``          gauge      ``name``, ``namespace``, ``status``
``kueue_local_queue_admitted_active_workloads``  gauge      ``name``, ``namespace``
``kueue_local_queue_resource_usage``             gauge      ``name``, ``namespace``, ``flavor``,
                                                            ``resource``
``kueue_local_queue_admitted_workloads_total``   counter    ``name``, ``namespace``
``kueue_local_queue_admission_wait_time_seconds``  histogram  ``name``, ``namespace``
==============================================  =========  ==========================================

gpuplane's own: ``gpuplane_gpus_allocated`` (GPU-equivalents held, by ``namespace``,
``cluster_queue``, ``local_queue``, ``flavor``, ``device_kind``), ``gpuplane_pending_gpus`` (demand
by ``cluster_queue`` and ``reason``), ``gpuplane_pending_gpus_fit_if_defragmented``,
``gpuplane_workload_eta_seconds`` (per pending workload), ``gpuplane_cluster_queue_head_eta_seconds``
(the ETA of each ClusterQueue's first pending workload), ``gpuplane_eta_error_seconds`` (histogram:
first prediction against the real start), ``gpuplane_preemption_cost_gpu_hours_total`` (work lost
since the victim's last checkpoint, by victim ``cluster_queue``) and
``gpuplane_controller_pass_duration_seconds``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.core.session import Plan, Reason, SchedulerConfig, config_from_kueue
from gpuplane.insight.aftermath import state_after, world_after
from gpuplane.insight.usage import allocations, pod_allocations, workload_gpus
from gpuplane.insight.why import Explanation, explain_all
from gpuplane.model.objects import ClusterState
from gpuplane.model.quantity import base_units_per_unit
from gpuplane.model.records import last_checkpoint

WAIT_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 28800, 86400, float("inf"))
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, float("inf"))
ACTIVE = frozenset({Reason.QUEUED, Reason.WAITING_FOR_PREEMPTED})
PREEMPTION_REASONS = (
    "InClusterQueue",
    "InCohortReclamation",
    "InCohortReclaimWhileBorrowing",
    "InCohortFairSharing",
)


@dataclass
class _Snapshot:
    state: ClusterState
    plan: Plan
    explanations: tuple[Explanation, ...]
    config: SchedulerConfig


@dataclass
class _History:
    """What earlier passes saw, so each event is counted once."""

    admitted: set[str] = field(default_factory=set)
    preempted: set[tuple[str, str]] = field(default_factory=set)
    first_eta: dict[str, float] = field(default_factory=dict)  # workload -> predicted start time


class SchedulerMetrics(Collector):
    """The controller's metrics on their own registry (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._lock = threading.Lock()
        self._snapshot: _Snapshot | None = None
        self._history = _History()
        r = self.registry
        self.admitted_total = Counter(
            "kueue_admitted_workloads",
            "The total number of admitted workloads.",
            ["cluster_queue"],
            registry=r,
        )
        self.admission_wait = Histogram(
            "kueue_admission_wait_time_seconds",
            "The time between a workload was created or requeued until admission.",
            ["cluster_queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.lq_admitted_total = Counter(
            "kueue_local_queue_admitted_workloads",
            "The total number of admitted workloads per local_queue.",
            ["name", "namespace"],
            registry=r,
        )
        self.lq_admission_wait = Histogram(
            "kueue_local_queue_admission_wait_time_seconds",
            "The time between a workload was created or requeued until admission, per local_queue.",
            ["name", "namespace"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.evicted_total = Counter(
            "kueue_evicted_workloads",
            "The total number of evicted workloads.",
            ["cluster_queue", "reason"],
            registry=r,
        )
        self.preempted_total = Counter(
            "kueue_preempted_workloads",
            "The total number of preempted workloads per preempting_cluster_queue.",
            ["preempting_cluster_queue", "reason"],
            registry=r,
        )
        self.preemption_cost = Counter(
            "gpuplane_preemption_cost_gpu_hours",
            "GPU-hours of work lost by preemptions (since the victim's last checkpoint or admission).",
            ["cluster_queue"],
            registry=r,
        )
        self.eta_error = Histogram(
            "gpuplane_eta_error_seconds",
            "Absolute error of the first ETA given to a workload, measured when it is admitted.",
            ["cluster_queue"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.pass_duration = Histogram(
            "gpuplane_controller_pass_duration_seconds",
            "Latency of one controller reconcile pass.",
            buckets=PASS_BUCKETS,
            registry=r,
        )
        r.register(self)

    # --- feeding ----------------------------------------------------------------

    def observe(
        self,
        state: ClusterState,
        plan: Plan,
        now: float,
        pass_seconds: float | None = None,
        explanations: tuple[Explanation, ...] | None = None,
    ) -> None:
        """Record one pass: ``state`` the controller decided on, ``plan`` its decision, at ``now``.

        The same as :meth:`record_pass` then :meth:`record_view`; ``explanations`` are
        :func:`explain_all`'s for this plan when the caller has them already.
        """
        self.record_pass(state, plan, now, pass_seconds)
        if explanations is None:
            explanations = explain_all(
                state, plan, now, config_from_kueue(state.configuration), diagnose=False
            )
        self.record_view(state, plan, now, explanations)

    def record_pass(
        self, state: ClusterState, plan: Plan, now: float, pass_seconds: float | None = None
    ) -> None:
        """The events of one pass (admissions, preemptions, its latency); cheap, for every pass."""
        config = config_from_kueue(state.configuration)
        workloads = {wl.key: wl for wl in state.workloads}
        with self._lock:
            self._zeros(state)
            history = self._history
            for decision in plan.admitted:
                wl = workloads.get(decision.workload)
                if wl is None or decision.workload in history.admitted:
                    continue
                history.admitted.add(decision.workload)
                wait = max(0.0, now - wl.queue_order_timestamp)
                self.admitted_total.labels(decision.cluster_queue).inc()
                self.admission_wait.labels(decision.cluster_queue).observe(wait)
                if wl.queue_name:
                    self.lq_admitted_total.labels(wl.queue_name, wl.namespace).inc()
                    self.lq_admission_wait.labels(wl.queue_name, wl.namespace).observe(wait)
                predicted = history.first_eta.pop(decision.workload, None)
                if predicted is not None:
                    self.eta_error.labels(decision.cluster_queue).observe(abs(predicted - now))
            for victim in plan.preempted:
                event = (victim.workload, victim.preemptor)
                if event in history.preempted:
                    continue
                history.preempted.add(event)
                history.admitted.discard(victim.workload)
                preemptor_cq = next(
                    (p.cluster_queue for p in plan.pending if p.workload == victim.preemptor),
                    victim.cluster_queue,
                )
                self.evicted_total.labels(victim.cluster_queue, "Preempted").inc()
                self.preempted_total.labels(preemptor_cq or "", victim.reason).inc()
                wl = workloads.get(victim.workload)
                if wl is not None:
                    since = max(wl.quota_reservation_time(now), last_checkpoint(wl.annotations) or 0.0)
                    lost = workload_gpus(wl, config.devices) * max(0.0, now - since) / 3600
                    self.preemption_cost.labels(victim.cluster_queue).inc(lost)
            if pass_seconds is not None:
                self.pass_duration.observe(pass_seconds)

    def record_view(
        self, state: ClusterState, plan: Plan, now: float, explanations: tuple[Explanation, ...]
    ) -> None:
        """What the gauges show from now on, and each pending workload's first ETA (to measure it)."""
        with self._lock:
            for found in explanations:
                if found.eta.seconds is not None and found.workload not in self._history.first_eta:
                    self._history.first_eta[found.workload] = now + found.eta.seconds
            self._snapshot = _Snapshot(state, plan, explanations, config_from_kueue(state.configuration))

    def _zeros(self, state: ClusterState) -> None:
        """Create every queue's counter series at 0, so a first event is an increase, not a new series."""
        for cq in state.cluster_queues:
            self.admitted_total.labels(cq)
            self.admission_wait.labels(cq)
            self.evicted_total.labels(cq, "Preempted")
            self.preemption_cost.labels(cq)
            self.eta_error.labels(cq)
            for reason in PREEMPTION_REASONS:
                self.preempted_total.labels(cq, reason)
        for lq in state.local_queues.values():
            self.lq_admitted_total.labels(lq.name, lq.namespace)
            self.lq_admission_wait.labels(lq.name, lq.namespace)

    # --- exposition -------------------------------------------------------------

    def describe(self) -> Iterable[Metric]:
        return ()  # computed at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snap = self._snapshot
        if snap is None:
            return
        yield from _queue_gauges(snap)
        yield from _gpuplane_gauges(snap)


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _queue_gauges(snap: _Snapshot) -> Iterator[Metric]:
    """Kueue's own metrics: pending workloads, admitted ones, and quota per ClusterQueue."""
    yield from _pending_gauges(snap)
    yield from _admitted_gauges(snap)
    yield from _quota_gauges(snap)


def _pending_gauges(snap: _Snapshot) -> Iterator[Metric]:
    pending = _gauge(
        "kueue_pending_workloads", "The number of pending workloads.", ["cluster_queue", "status"]
    )
    unadmitted = _gauge(
        "kueue_unadmitted_workloads",
        "Pending workloads by the reason they wait.",
        ["cluster_queue", "reason"],
    )
    lq_pending = _gauge(
        "kueue_local_queue_pending_workloads",
        "The number of pending workloads, per local_queue and status.",
        ["name", "namespace", "status"],
    )
    counts: dict[tuple[str, str], int] = {}
    reasons: dict[tuple[str, str], int] = {}
    lq_counts: dict[tuple[str, str, str], int] = {}
    for name in snap.state.cluster_queues:
        counts[(name, "active")] = counts[(name, "inadmissible")] = 0
    for p in snap.plan.pending:
        status = "active" if p.reason in ACTIVE else "inadmissible"
        if p.cluster_queue is not None:
            counts[(p.cluster_queue, status)] = counts.get((p.cluster_queue, status), 0) + 1
            reasons[(p.cluster_queue, p.reason)] = reasons.get((p.cluster_queue, p.reason), 0) + 1
        if p.local_queue:
            ns, _, lq = p.local_queue.partition("/")
            lq_counts[(lq, ns, status)] = lq_counts.get((lq, ns, status), 0) + 1
    for labels, value in sorted(counts.items()):
        pending.add_metric(list(labels), value)
    for labels, value in sorted(reasons.items()):
        unadmitted.add_metric(list(labels), value)
    for lq_labels, value in sorted(lq_counts.items()):
        lq_pending.add_metric(list(lq_labels), value)
    yield from (pending, unadmitted, lq_pending)


def _admitted_gauges(snap: _Snapshot) -> Iterator[Metric]:
    after = state_after(snap.state, snap.plan, 0.0)
    active = _gauge(
        "kueue_admitted_active_workloads", "Admitted workloads that are active.", ["cluster_queue"]
    )
    lq_active = _gauge(
        "kueue_local_queue_admitted_active_workloads",
        "Admitted workloads that are active, per local_queue.",
        ["name", "namespace"],
    )
    per_cq: dict[str, int] = dict.fromkeys(snap.state.cluster_queues, 0)
    per_lq: dict[tuple[str, str], int] = {}
    lq_usage: dict[tuple[str, str, str, str], int] = {}
    for wl in after.workloads:
        if wl.admission is None or wl.finished:
            continue
        per_cq[wl.admission.cluster_queue] = per_cq.get(wl.admission.cluster_queue, 0) + 1
        if wl.queue_name:
            per_lq[(wl.queue_name, wl.namespace)] = per_lq.get((wl.queue_name, wl.namespace), 0) + 1
            for psa in wl.admission.pod_set_assignments:
                for res, q in psa.resource_usage.items():
                    key = (wl.queue_name, wl.namespace, psa.flavors.get(res, ""), res)
                    lq_usage[key] = lq_usage.get(key, 0) + q
    for cq, value in sorted(per_cq.items()):
        active.add_metric([cq], value)
    for lq_key, value in sorted(per_lq.items()):
        lq_active.add_metric(list(lq_key), value)
    lq_res = _gauge(
        "kueue_local_queue_resource_usage",
        "The LocalQueue's total resource usage within all the flavors.",
        ["name", "namespace", "flavor", "resource"],
    )
    for usage_key, value in sorted(lq_usage.items()):
        lq_res.add_metric(list(usage_key), _unit(usage_key[3], value))
    yield from (active, lq_active, lq_res)


def _quota_gauges(snap: _Snapshot) -> Iterator[Metric]:
    world = world_after(snap.state, snap.plan, snap.config, 0.0)
    quota_labels = ["cohort", "cluster_queue", "flavor", "resource"]
    usage = _gauge(
        "kueue_cluster_queue_resource_usage", "The ClusterQueue's total resource usage.", quota_labels
    )
    nominal = _gauge("kueue_cluster_queue_nominal_quota", "The ClusterQueue's resource quota.", quota_labels)
    borrowing = _gauge(
        "kueue_cluster_queue_borrowing_limit", "The ClusterQueue's borrowing limit.", quota_labels
    )
    cq_status = _gauge(
        "kueue_cluster_queue_status", "The status of the ClusterQueue.", ["cluster_queue", "status"]
    )
    for name, node in sorted(world.tree.queues.items()):
        cohort = node.spec.cohort or ""
        for (flavor, res), quota in sorted(node.quotas.items()):
            row = [cohort, name, flavor, res]
            usage.add_metric(row, _unit(res, node.usage.get((flavor, res), 0)))
            nominal.add_metric(row, _unit(res, quota.nominal))
            if quota.borrowing_limit is not None:
                borrowing.add_metric(row, _unit(res, quota.borrowing_limit))
        flavors = {f.name for g in node.spec.resource_groups for f in g.flavors}
        ok = node.spec.stop_policy == "None" and flavors <= set(world.flavors)
        for state in ("pending", "active", "terminated"):
            cq_status.add_metric([name, state], 1.0 if state == ("active" if ok else "pending") else 0.0)
    yield from (usage, nominal, borrowing, cq_status)


def _unit(resource: str, value: int) -> float:
    """Kueue reports CPU in cores, and GPU shares in GPUs; the model keeps thousandths of both."""
    return value / base_units_per_unit(resource)


def _gpuplane_gauges(snap: _Snapshot) -> Iterator[Metric]:
    after = state_after(snap.state, snap.plan, 0.0)
    allocated = _gauge(
        "gpuplane_gpus_allocated",
        "GPU-equivalents held by admitted workloads.",
        ["namespace", "cluster_queue", "local_queue", "flavor", "device_kind"],
    )
    totals: dict[tuple[str, str, str, str, str], float] = {}
    for a in allocations(after, snap.config.devices):
        key = (a.namespace, a.cluster_queue, a.local_queue, a.flavor, a.device_kind)
        totals[key] = totals.get(key, 0.0) + a.gpus
    for alloc_key, gpus in sorted(totals.items()):
        allocated.add_metric(list(alloc_key), gpus)
    per_pod = _gauge(
        "gpuplane_pod_gpus_allocated",
        "GPU-equivalents a bound pod holds, with its queue and team (joins DCGM series to queues).",
        ["namespace", "pod", "node", "workload", "cluster_queue", "local_queue", "team", "device_kind"],
    )
    for pa in pod_allocations(snap.state, snap.config.devices):
        row = [
            pa.namespace,
            pa.pod,
            pa.node,
            pa.workload,
            pa.cluster_queue,
            pa.local_queue,
            pa.team,
            pa.device_kind,
        ]
        per_pod.add_metric(row, pa.gpus)
    yield from (allocated, per_pod)

    workloads = {wl.key: wl for wl in snap.state.workloads}
    demand = _gauge(
        "gpuplane_pending_gpus", "GPU-equivalents pending workloads ask for.", ["cluster_queue", "reason"]
    )
    defrag = _gauge(
        "gpuplane_pending_gpus_fit_if_defragmented",
        "Pending GPU demand blocked only by fragmentation (free capacity exists, split across nodes).",
        ["cluster_queue"],
    )
    eta = _gauge(
        "gpuplane_workload_eta_seconds",
        "Predicted seconds until a pending workload starts.",
        ["namespace", "workload", "cluster_queue"],
    )
    head = _gauge(
        "gpuplane_cluster_queue_head_eta_seconds",
        "Predicted seconds until the first pending workload of a ClusterQueue starts (median).",
        ["cluster_queue"],
    )
    by_reason: dict[tuple[str, str], float] = {}
    fragmented: dict[str, float] = dict.fromkeys(snap.state.cluster_queues, 0.0)
    for found in snap.explanations:
        wl = workloads.get(found.workload)
        cq = found.cluster_queue or ""
        gpus = workload_gpus(wl, snap.config.devices) if wl is not None else 0.0
        by_reason[(cq, found.reason)] = by_reason.get((cq, found.reason), 0.0) + gpus
        if found.reason == Reason.FRAGMENTED:
            fragmented[cq] = fragmented.get(cq, 0.0) + gpus
        if found.eta.seconds is not None:
            ns, _, name = found.workload.partition("/")
            eta.add_metric([ns, name, cq], found.eta.seconds)
            if found.position_in_cluster_queue == 0:
                head.add_metric([cq], found.eta.seconds)
    for reason_key, gpus in sorted(by_reason.items()):
        demand.add_metric(list(reason_key), gpus)
    for cq, gpus in sorted(fragmented.items()):
        defrag.add_metric([cq], gpus)
    yield from (demand, defrag, eta, head)
