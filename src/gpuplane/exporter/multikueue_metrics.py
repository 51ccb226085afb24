"""The metrics of MultiKueue on a manager (``gpuplane controller --multikueue``): one series per
worker cluster of what the manager last saw there (kueue #9988: the manager could not see its
workers' quota or usage), and the dispatch counters.

========================================================  =========================================
``gpuplane_multikueue_worker_active{cluster}``            1 when the manager reaches the worker
``gpuplane_multikueue_worker_quota{cluster,resource}``    nominal quota of its ClusterQueues (units
                                                          as Kueue reports them: cores, GPUs, bytes)
``gpuplane_multikueue_worker_usage{cluster,resource}``    what its admitted workloads use
``gpuplane_multikueue_worker_pending_workloads{cluster}`` its workloads without a reservation
``gpuplane_multikueue_worker_admitted_workloads{cluster}``  its admitted workloads
``gpuplane_multikueue_{dispatched,requeued,remote_jobs_created,gc_deleted}_total``  what the manager did
``gpuplane_multikueue_status_conflicts_retried_total``   status writes that met a newer Workload, retried
========================================================  =========================================
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuplane.k8s.multikueue_workers import WorkerSummary
from gpuplane.model.quantity import QuantityError, base_units_per_unit, parse_resource_quantity

Source = Callable[[], tuple[Mapping[str, WorkerSummary], Mapping[str, int]]]


class MultiKueueMetrics(Collector):
    """Reads the manager's worker summaries and counters at scrape time (owns nothing: ``source``
    returns them, e.g. from :class:`gpuplane.k8s.multikueue.MultiKueue`)."""

    def __init__(self, source: Source) -> None:
        self.source = source

    def describe(self) -> Iterable[Metric]:
        return ()  # computed at scrape time

    def collect(self) -> Iterator[Metric]:
        summaries, counters = self.source()
        active = GaugeMetricFamily(
            "gpuplane_multikueue_worker_active",
            "1 when the manager reaches the worker cluster",
            labels=["cluster"],
        )
        quota = GaugeMetricFamily(
            "gpuplane_multikueue_worker_quota",
            "Nominal quota of the worker's ClusterQueues, per resource",
            labels=["cluster", "resource"],
        )
        usage = GaugeMetricFamily(
            "gpuplane_multikueue_worker_usage",
            "What the worker's admitted workloads use, per resource",
            labels=["cluster", "resource"],
        )
        pending = GaugeMetricFamily(
            "gpuplane_multikueue_worker_pending_workloads",
            "The worker's workloads without a quota reservation",
            labels=["cluster"],
        )
        admitted = GaugeMetricFamily(
            "gpuplane_multikueue_worker_admitted_workloads",
            "The worker's admitted workloads",
            labels=["cluster"],
        )
        for name, summary in sorted(summaries.items()):
            active.add_metric([name], 1.0 if summary.active else 0.0)
            for family, amounts in ((quota, summary.quota), (usage, summary.usage)):
                for resource, text in sorted(amounts.items()):
                    value = _units(resource, text)
                    if value is not None:
                        family.add_metric([name, resource], value)
            pending.add_metric([name], float(summary.pending_workloads))
            admitted.add_metric([name], float(summary.admitted_workloads))
        yield from (active, quota, usage, pending, admitted)
        for counter, value in sorted(counters.items()):
            total = CounterMetricFamily(
                f"gpuplane_multikueue_{counter}", f"MultiKueue on this manager: {counter.replace('_', ' ')}"
            )
            total.add_metric([], float(value))
            yield total


def _units(resource: str, text: str) -> float | None:
    try:
        return parse_resource_quantity(resource, text) / base_units_per_unit(resource)
    except QuantityError:
        return None
