"""The exporter's metrics: Kueue's names and labels, gpuplane's own, numbers from a known state."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.exporter.metrics import SchedulerMetrics
from gpuplane.model.loader import load_state
from manifests import GPU, cluster_queue, documents, local_queue, namespace, resource_flavor, workload
from usage_fixture import WANT, manifests

NOW = 1_772_360_000.0  # 2026-03-01T10:13:20Z


def observed() -> dict[str, list[tuple[dict[str, str], float]]]:
    state = load_state([("usage.yaml", documents(*manifests()))])
    plan = schedule(state, config_from_kueue(state.configuration), NOW, cycles=None)
    metrics = SchedulerMetrics()
    metrics.observe(state, plan, NOW, pass_seconds=0.02)
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(samples: list[tuple[dict[str, str], float]], **labels: str) -> float:
    found = [v for lab, v in samples if all(lab.get(k) == w for k, w in labels.items())]
    assert len(found) == 1, (labels, samples)
    return found[0]


def test_kueue_metric_names_types_and_labels() -> None:
    got = observed()
    assert value(got["kueue_pending_workloads"], cluster_queue="cq-a", status="inadmissible") == 1
    assert value(got["kueue_pending_workloads"], cluster_queue="cq-b", status="active") == 0
    assert value(got["kueue_admitted_active_workloads"], cluster_queue="cq-b") == 3
    usage = got["kueue_cluster_queue_resource_usage"]
    assert value(usage, cluster_queue="cq-b", flavor="default", resource="nvidia.com/gpu", cohort="") == 5
    assert value(usage, cluster_queue="cq-a", flavor="default", resource="cpu") == 2
    assert (
        value(got["kueue_cluster_queue_nominal_quota"], cluster_queue="cq-a", resource="nvidia.com/gpu") == 16
    )
    assert value(got["kueue_cluster_queue_status"], cluster_queue="cq-a", status="active") == 1
    (reason,) = [lab["reason"] for lab, v in got["kueue_unadmitted_workloads"] if v]
    assert reason == "WaitingForQuota"  # 16 GPUs asked, 4 of 16 in use
    assert (
        value(got["kueue_local_queue_pending_workloads"], name="lq", namespace="ml-a", status="inadmissible")
        == 1
    )
    assert value(got["kueue_local_queue_admitted_active_workloads"], name="lq", namespace="ml-b") == 3
    # nothing preempted yet: the series exist at 0, so a first preemption is an increase
    assert (
        value(
            got["kueue_preempted_workloads_total"], preempting_cluster_queue="cq-a", reason="InClusterQueue"
        )
        == 0
    )


def test_gpuplane_allocation_by_namespace_queue_flavor_and_kind() -> None:
    got = observed()
    alloc = got["gpuplane_gpus_allocated"]
    assert value(alloc, namespace="ml-a", cluster_queue="cq-a", device_kind="whole") == 4
    assert value(alloc, namespace="ml-b", device_kind="whole") == 5
    assert abs(value(alloc, namespace="ml-b", device_kind="mig") - 3 / 7) < 1e-9
    per_pod = got["gpuplane_pod_gpus_allocated"]
    teams: dict[str, float] = {}
    for labels, gpus in per_pod:
        teams[labels["team"]] = teams.get(labels["team"], 0.0) + gpus
    assert set(teams) == set(WANT)
    for team, want in WANT.items():
        assert abs(teams[team] - want["allocated"]) < 1e-9
    assert value(per_pod, pod="wa-1") == 2
    assert value(per_pod, pod="wa-1", cluster_queue="cq-a", local_queue="lq", workload="wa") == 2
    assert value(got["gpuplane_pending_gpus"], cluster_queue="cq-a", reason="WaitingForQuota") == 16
    assert value(got["gpuplane_controller_pass_duration_seconds_count"]) == 1


def _rfc(seconds: float) -> str:
    import datetime  # noqa: PLC0415

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_admissions_and_preemptions_are_counted_once_with_wait_and_cost() -> None:
    # A low-priority workload holds all 8 GPUs since an hour, last checkpoint 10 minutes ago; a
    # high-priority one (queued 2 minutes) preempts it: 8 GPUs x 600 s = 4/3 GPU-hours lost.
    # A third, small queue admits a workload that waited 120 s.
    victim = (
        workload("low")
        .queue("lq")
        .priority(0)
        .created(_rfc(NOW - 3600))
        .podset(gpu=8)
        .annotate("gpuplane.dev/last-checkpoint", _rfc(NOW - 600))
        .admitted(
            "gpus", {"name": "main", "count": 1, "flavors": {GPU: "default"}, "resourceUsage": {GPU: 8}}
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
    text = documents(
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("gpus")
        .flavor("default", gpu=8)
        .set("spec.preemption.withinClusterQueue", "LowerPriority"),
        cluster_queue("cpus").flavor("default", cpu="8"),
        local_queue("lq", "default", "gpus"),
        local_queue("small", "default", "cpus"),
        victim,
        workload("high").queue("lq").priority(100).created(_rfc(NOW - 120)).podset(gpu=8),
        workload("tiny").queue("small").created(_rfc(NOW - 120)).podset(cpu="1"),
    )
    state = load_state([("s.yaml", text)])
    plan = schedule(state, config_from_kueue(state.configuration), NOW, cycles=1)
    assert [p.workload for p in plan.preempted] == ["default/low"]
    metrics = SchedulerMetrics()
    metrics.observe(state, plan, NOW)
    metrics.observe(state, plan, NOW + 1)  # the same decisions seen again count nothing new
    registry = metrics.registry
    assert registry.get_sample_value("kueue_admitted_workloads_total", {"cluster_queue": "cpus"}) == 1
    assert (
        registry.get_sample_value("kueue_admission_wait_time_seconds_count", {"cluster_queue": "cpus"}) == 1
    )
    assert (
        registry.get_sample_value("kueue_admission_wait_time_seconds_sum", {"cluster_queue": "cpus"}) == 120
    )
    evicted = registry.get_sample_value(
        "kueue_evicted_workloads_total", {"cluster_queue": "gpus", "reason": "Preempted"}
    )
    assert evicted == 1
    preempted = registry.get_sample_value(
        "kueue_preempted_workloads_total", {"preempting_cluster_queue": "gpus", "reason": "InClusterQueue"}
    )
    assert preempted == 1
    cost = registry.get_sample_value("gpuplane_preemption_cost_gpu_hours_total", {"cluster_queue": "gpus"})
    assert cost is not None
    assert abs(cost - 8 * 600 / 3600) < 1e-9
