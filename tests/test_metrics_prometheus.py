"""The exporter, the recording rules and the Grafana dashboard on a real Prometheus.

Prometheus (Debian's package) scrapes gpuplane's exporter and a DCGM exporter stand-in serving the
telemetry of :mod:`usage_fixture` in both label spellings, and loads ``deploy/prometheus/rules.yaml``.
The per-team numbers must equal the hand computation of the fixture, and every panel query of
``deploy/grafana/gpuplane.json`` must return data.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dcgm_fixture import DcgmExporter
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.exporter.metrics import SchedulerMetrics
from gpuplane.exporter.server import serve_metrics
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState
from manifests import GPU, cluster_queue, documents, local_queue, namespace, node, workload
from prometheus import Prometheus, PrometheusFactory
from usage_fixture import WANT, manifests, set_telemetry

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "deploy" / "prometheus" / "rules.yaml"
OPERATOR_RULES = ROOT / "deploy" / "prometheus" / "prometheusrule.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuplane.json"
NOW = 1_772_360_000.0
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__range": "5m"}


def _rfc(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def cluster() -> ClusterState:
    """The usage fixture plus a queue where a high-priority workload preempts a checkpointed one."""
    victim = (
        workload("low", "ml-c")
        .queue("lq")
        .created(_rfc(NOW - 3600))
        .podset(gpu=8)
        .annotate("gpuplane.dev/last-checkpoint", _rfc(NOW - 600))
        .admitted(
            "cq-c", {"name": "main", "count": 1, "flavors": {GPU: "default"}, "resourceUsage": {GPU: 8}}
        )
        .set(
            "status.conditions",
            [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "",
                    "lastTransitionTime": _rfc(NOW - 3600),
                }
            ],
        )
    )
    extra = [
        namespace("ml-c"),
        node("n4").allocatable(gpu=8, cpu="64", memory="512Gi", pods=110),
        cluster_queue("cq-c")
        .flavor("default", gpu=8)
        .set("spec.preemption.withinClusterQueue", "LowerPriority"),
        local_queue("lq", "ml-c", "cq-c"),
        victim,
        workload("high", "ml-c").queue("lq").priority(100).created(_rfc(NOW - 120)).podset(gpu=8),
        workload("tiny", "ml-a").queue("lq").created(_rfc(NOW - 90)).podset(cpu="1"),
    ]
    return load_state([("cluster.yaml", documents(*manifests(), *extra))])


def wait_value(
    prom: Prometheus, expr: str, accept: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Poll ``expr`` until ``accept`` takes its result (Prometheus scrapes and evaluates every second)."""
    deadline = time.monotonic() + 45
    while True:
        result = prom.query(expr)
        if accept(result):
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"{expr!r} never gave an accepted result; last: {result}")
        time.sleep(0.25)


def has_number(result: list[dict[str, Any]]) -> bool:
    return any(not math.isnan(float(series["value"][1])) for series in result)


@pytest.fixture
def scraped(prometheus_factory: PrometheusFactory) -> Iterator[Prometheus]:
    """Prometheus scraping the exporter (after one quiet pass and one eventful pass) and DCGM."""
    state = cluster()
    config = config_from_kueue(state.configuration)
    metrics = SchedulerMetrics()
    server, _ = serve_metrics(metrics.registry, 0, "127.0.0.1")
    try:
        with DcgmExporter() as dcgm:
            set_telemetry(dcgm)
            # Pass 1 decides nothing yet (every counter exists at 0, every pending workload gets an ETA).
            metrics.observe(state, schedule(state, config, NOW, cycles=0), NOW, pass_seconds=0.01)
            prom = prometheus_factory(
                scrape_targets=[f"127.0.0.1:{server.server_port}", dcgm.target], rule_files=[RULES]
            )
            prom.wait_for("kueue_admitted_workloads_total")
            # Pass 2, 30 s later: admissions (tiny), a preemption (low by high), a slower pass.
            plan = schedule(state, config, NOW, cycles=None)
            assert "ml-c/low" in {p.workload for p in plan.preempted}
            metrics.observe(state, plan, NOW + 30, pass_seconds=0.02)
            yield prom
    finally:
        server.shutdown()
        server.server_close()


def test_rules_kueue_metrics_and_every_dashboard_panel(scraped: Prometheus) -> None:
    """One Prometheus for the three checks (starting one costs seconds)."""
    check_recording_rules(scraped)
    check_kueue_metrics(scraped)
    check_dashboard_panels(scraped)


def check_recording_rules(prom: Prometheus) -> None:
    """The per-team numbers equal the hand computation of the fixture."""
    for team, want in WANT.items():
        for what in ("allocated", "busy"):
            expr = f'gpuplane:team_gpus_{what}:sum{{team="{team}"}}'
            wait_value(
                prom, expr, lambda r, w=want[what]: bool(r) and abs(float(r[0]["value"][1]) - w) < 1e-9
            )
        ratio = wait_value(prom, f'gpuplane:team_gpu_busy:ratio{{team="{team}"}}', bool)
        assert abs(float(ratio[0]["value"][1]) - want["busy"] / want["allocated"]) < 1e-9
    total = sum(w["allocated"] for w in WANT.values())
    wait_value(
        prom,
        "gpuplane:cluster_gpus_allocated:sum",
        lambda r: bool(r) and abs(float(r[0]["value"][1]) - total) < 1e-9,
    )
    # Both DCGM spellings joined: wa-1 (exported_*) counts with its PROF values, not GPU_UTIL.
    (wa1,) = wait_value(prom, 'gpuplane:pod_gpus_busy:sum{pod="wa-1"}', bool)
    assert abs(float(wa1["value"][1]) - 1.6) < 1e-9
    assert wa1["metric"]["cluster_queue"] == "cq-a"
    (idle,) = wait_value(prom, 'gpuplane:pod_gpus_idle:sum{pod="idle-0"}', bool)
    assert float(idle["value"][1]) == 1.0
    by_queue = wait_value(prom, 'gpuplane:cluster_queue_gpus_allocated:sum{cluster_queue="cq-b"}', bool)
    assert abs(float(by_queue[0]["value"][1]) - WANT["beta"]["allocated"]) < 1e-9


def check_kueue_metrics(prom: Prometheus) -> None:
    """Kueue's metrics arrive with their labels; the preemption counted once, with its cost."""
    wait_value(prom, 'kueue_pending_workloads{cluster_queue="cq-a",status="inadmissible"}', has_number)
    wait_value(
        prom,
        'kueue_cluster_queue_nominal_quota{cluster_queue="cq-c",flavor="default",resource="nvidia.com/gpu"}'
        " == 8",
        bool,
    )
    wait_value(
        prom,
        'kueue_preempted_workloads_total{preempting_cluster_queue="cq-c",reason="InClusterQueue"} == 1',
        bool,
    )
    wait_value(prom, 'gpuplane_preemption_cost_gpu_hours_total{cluster_queue="cq-c"} > 1.33', bool)


def dashboard_queries() -> list[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            out.append((panel["title"], expr))
    return out


def check_dashboard_panels(scraped: Prometheus) -> None:
    """Every panel's query returns a number."""
    queries = dashboard_queries()
    assert len({title for title, _ in queries}) >= 6
    for title, expr in queries:
        try:
            wait_value(scraped, expr, has_number)
        except AssertionError as err:
            raise AssertionError(f"panel {title!r}: {err}") from None


def test_operator_rules_are_the_same_groups() -> None:
    plain = yaml.safe_load(RULES.read_text())
    operator = yaml.safe_load(OPERATOR_RULES.read_text())
    assert operator["kind"] == "PrometheusRule"
    assert operator["spec"] == plain
