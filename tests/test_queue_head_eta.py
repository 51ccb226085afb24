"""A queue's head ETA: in the visibility API's summary and as a metric, per ClusterQueue."""

from __future__ import annotations

import datetime

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.exporter.metrics import SchedulerMetrics
from gpuplane.k8s.visibility import pending_workloads_summary, view_of_state
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState
from manifests import Manifest, cluster_queue, documents, local_queue, namespace, resource_flavor, workload
from why_cases import holder

NOW = 1_773_000_000
EXPECTED = "gpuplane.dev/expected-runtime"


def _rfc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(name: str, runtime: int) -> Manifest:
    reserved = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": "",
        "lastTransitionTime": _rfc(NOW),
    }
    return holder(name, 4).annotate(EXPECTED, str(runtime)).set("status.conditions", [reserved])


def pending(name: str, ago: int, runtime: int) -> Manifest:
    return (
        workload(name)
        .queue("lq")
        .created(_rfc(NOW - ago))
        .podset(gpu=4, cpu="1")
        .annotate(EXPECTED, str(runtime))
    )


def state() -> ClusterState:
    # Quota 4, held until 1000 s; p1 then runs 600 s, so p2 starts at 1600 s.
    text = documents(
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", gpu=4, cpu="100"),
        local_queue("lq", "default", "team-a"),
        running("r1", 1000),
        pending("p1", 60, 600),
        pending("p2", 30, 600),
    )
    return load_state([("s.yaml", text)])


def test_the_summary_carries_the_heads_eta_whatever_the_page() -> None:
    view = view_of_state(state(), float(NOW))
    whole = pending_workloads_summary(view, "v1beta2", cluster_queue="team-a")
    assert [i["metadata"]["name"] for i in whole["items"]] == ["p1", "p2"]
    head = whole["headEta"]
    assert head["workload"] == "default/p1"
    assert (head["low"], head["seconds"], head["high"]) == (1000.0, 1000.0, 1000.0)
    assert head["basis"] == whole["items"][0]["eta"]["basis"]
    second_page = pending_workloads_summary(view, "v1beta2", cluster_queue="team-a", offset=1)
    assert second_page["headEta"] == head
    by_lq = pending_workloads_summary(view, "v1beta1", local_queue=("default", "lq"))
    assert by_lq["headEta"]["workload"] == "default/p1"
    empty = pending_workloads_summary(view, "v1beta2", cluster_queue="nobody")
    assert "headEta" not in empty


def test_the_heads_eta_is_a_metric_per_cluster_queue() -> None:
    s = state()
    plan = schedule(s, config_from_kueue(s.configuration), float(NOW), cycles=None)
    metrics = SchedulerMetrics()
    metrics.observe(s, plan, float(NOW), pass_seconds=0.01)
    found = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for sample in family.samples
        if sample.name == "gpuplane_cluster_queue_head_eta_seconds"
    ]
    assert found == [({"cluster_queue": "team-a"}, 1000.0)]
