"""Shares of a GPU count against quota: charged under ``gpuplane.dev/gpu-fraction``, a resource the
ClusterQueue must cover (docs/devices.md, "Quota for shares of a GPU").

The bug this guards: fractional pods request no ``nvidia.com/gpu``, so with a team at 16 of its 16
GPUs, six more 0.5-GPU workloads were admitted, and the console, the metrics and ``why`` disagreed on
what the team used.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.core.session import Reason
from gpuplane.exporter.metrics import SchedulerMetrics
from gpuplane.insight.why import explain
from gpuplane.model.gpu_share import FRACTION_RESOURCE, charged_milli, quota_requests
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState, PodTemplate
from gpuplane.web import pages
from gpuplane.web.auth import Viewer
from gpuplane.web.snapshot import build_snapshot
from manifests import (
    GPU,
    Manifest,
    cluster_queue,
    documents,
    local_queue,
    namespace,
    resource_flavor,
    workload,
)

NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z
T0 = "2026-01-01T00:00:00Z"
NS = "team-a"


def whole(name: str, gpus: int) -> Manifest:
    """A workload already admitted in ``team-a`` with ``gpus`` whole GPUs."""
    return (
        workload(name, NS)
        .queue("lq")
        .created(T0)
        .podset(count=1, cpu="1", gpu=gpus)
        .admitted(
            "team-a",
            {
                "name": "main",
                "count": 1,
                "flavors": {"cpu": "default", GPU: "default"},
                "resourceUsage": {"cpu": "1", GPU: str(gpus)},
            },
        )
        .set(
            "status.conditions",
            [
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": T0},
                {"type": "Admitted", "status": "True", "lastTransitionTime": T0},
            ],
        )
    )


def halves(count: int) -> list[Manifest]:
    """``count`` queued workloads of one pod that asks for half a GPU by annotation."""
    return [
        workload(f"half-{i}", NS)
        .queue("lq")
        .created(f"2026-01-01T00:00:{i + 1:02}Z")
        .podset(count=1, cpu="1")
        .pod_annotation("gpuplane.dev/gpu-fraction", "0.5")
        for i in range(count)
    ]


def team_at_16_of_16(**fraction_quota: object) -> list[Manifest]:
    """The reported state: 16 GPUs nominal, all 16 held by whole-GPU workloads, six 0.5-GPU
    workloads queued; ``fraction_quota`` (``gpu_fraction=...``) adds a quota for shares."""
    return [
        namespace(NS),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", cpu="100", gpu=16, **fraction_quota),
        local_queue("lq", NS, "team-a"),
        *(whole(f"whole-{i}", 4) for i in range(4)),
        *halves(6),
    ]


def load(objects: list[Manifest]) -> ClusterState:
    return load_state([("state.yaml", documents(*objects))])


def gpuplane_schedule(tmp_path: Path, objects: list[Manifest]) -> dict[str, Any]:
    path = tmp_path / "state.yaml"
    path.write_text(documents(*objects))
    done = subprocess.run(
        [sys.executable, "-m", "gpuplane", "schedule", "-f", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout)
    return out


# --- the charge of one pod ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("annotations", "want_milli"),
    [
        pytest.param({"gpuplane.dev/gpu-fraction": "0.5"}, 500, id="half"),
        pytest.param({"gpuplane.dev/gpu-fraction": "250m"}, 250, id="milli-quantity"),
        pytest.param({"gpu-fraction": "0.3"}, 300, id="kai-spelling"),
        pytest.param({"gpuplane.dev/gpu-fraction": "0.0004"}, 1, id="tiny-rounds-up-never-0"),
        pytest.param({"gpuplane.dev/gpu-memory": "40Gi"}, 1, id="memory-only-takes-the-smallest-share"),
        pytest.param({"gpuplane.dev/gpu-fraction": "1.5"}, 1000, id="unreadable-is-a-whole-gpu"),
        pytest.param({"team": "a"}, 0, id="no-share"),
    ],
)
def test_a_share_is_charged_in_thousandths_of_a_gpu(annotations: dict[str, str], want_milli: int) -> None:
    assert charged_milli(annotations) == want_milli
    template = PodTemplate(requests={"cpu": 1000}, annotations=annotations)
    want = {"cpu": 1000} | ({FRACTION_RESOURCE: want_milli} if want_milli else {})
    assert dict(template.quota_requests) == want
    assert dict(template.requests) == {"cpu": 1000}  # what a node must hold does not change


def test_a_charge_the_pod_states_itself_is_kept() -> None:
    stated = {"cpu": 1000, FRACTION_RESOURCE: 700}
    assert quota_requests(stated, {"gpuplane.dev/gpu-fraction": "0.5"}) is stated


# --- the reported bug: a team at 16 of 16 GPUs --------------------------------------------------


def test_cli_admits_no_half_gpu_beyond_a_full_gpu_quota(tmp_path: Path) -> None:
    doc = gpuplane_schedule(tmp_path, team_at_16_of_16())
    assert doc["admitted"] == []
    got = {p["workload"]: (p["reason"], p["message"]) for p in doc["pending"]}
    want_message = (
        "couldn't assign flavors to pod set main: "
        "resource gpuplane.dev/gpu-fraction unavailable in ClusterQueue"
    )
    assert got == {f"{NS}/half-{i}": (Reason.NO_MATCHING_FLAVOR, want_message) for i in range(6)}


def test_core_admits_no_half_gpu_beyond_a_full_gpu_quota() -> None:
    state = load(team_at_16_of_16())
    plan = schedule(state, config_from_kueue(state.configuration), NOW, cycles=None)
    assert plan.admitted == ()
    assert {p.workload: p.reason for p in plan.pending} == {
        f"{NS}/half-{i}": Reason.NO_MATCHING_FLAVOR for i in range(6)
    }


def test_shares_beyond_their_quota_wait_for_quota(tmp_path: Path) -> None:
    """With 2 GPUs of quota for shares, four halves fit and two wait, with Kueue's reason."""
    doc = gpuplane_schedule(tmp_path, team_at_16_of_16(gpu_fraction=2))
    assert sorted(a["workload"] for a in doc["admitted"]) == [f"{NS}/half-{i}" for i in range(4)]
    assert all(a["podSets"][0]["flavors"][FRACTION_RESOURCE] == "default" for a in doc["admitted"])
    got = {p["workload"]: (p["reason"], p["message"]) for p in doc["pending"]}
    want_message = (
        "couldn't assign flavors to pod set main: insufficient unused quota for gpuplane.dev/gpu-fraction "
        "in flavor default, 500m more needed"
    )
    assert got == {f"{NS}/half-{i}": (Reason.WAITING_FOR_QUOTA, want_message) for i in (4, 5)}


def test_an_admitted_share_without_recorded_usage_still_holds_its_quota() -> None:
    """An admission whose podSetAssignments give no resourceUsage is charged its quota requests,
    the share included: a fifth half does not fit a quota of 2 held by four."""
    held = [
        workload(f"held-{i}", NS)
        .queue("lq")
        .created(T0)
        .podset(count=1, cpu="1")
        .pod_annotation("gpuplane.dev/gpu-fraction", "0.5")
        .admitted(
            "team-a",
            {"name": "main", "count": 1, "flavors": {"cpu": "default", FRACTION_RESOURCE: "default"}},
        )
        for i in range(4)
    ]
    objects = [
        namespace(NS),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", cpu="100", gpu=16, gpu_fraction=2),
        local_queue("lq", NS, "team-a"),
        *held,
        *halves(1),
    ]
    state = load(objects)
    plan = schedule(state, config_from_kueue(state.configuration), NOW, cycles=None)
    assert plan.admitted == ()
    assert [(p.workload, p.reason) for p in plan.pending] == [(f"{NS}/half-0", Reason.WAITING_FOR_QUOTA)]


# --- the console, the metrics and why agree ------------------------------------------------------


def test_console_metrics_and_why_agree_on_usage_with_fractional_pods() -> None:
    """16 whole GPUs held, four halves admitted by the plan on a share quota of 2, two halves
    waiting: all three report 2 GPUs of shares used (of 2), and 18 GPUs allocated in all."""
    state = load(team_at_16_of_16(gpu_fraction=2))
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, NOW, cycles=None)
    assert len(plan.admitted) == 4

    # Metrics: Kueue's usage gauge (in GPUs, as Kueue reports cores for cpu) and gpuplane's own.
    metrics = SchedulerMetrics()
    metrics.observe(state, plan, NOW, pass_seconds=0.01)
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))

    def gauge(name: str, resource: str) -> float:
        found = [
            v for lab, v in samples[name] if lab["cluster_queue"] == "team-a" and lab["resource"] == resource
        ]
        assert len(found) == 1, samples[name]
        return found[0]

    metric_fraction = gauge("kueue_cluster_queue_resource_usage", FRACTION_RESOURCE)
    metric_whole = gauge("kueue_cluster_queue_resource_usage", GPU)
    metric_allocated = sum(
        v for lab, v in samples["gpuplane_gpus_allocated"] if lab["cluster_queue"] == "team-a"
    )
    assert gauge("kueue_cluster_queue_nominal_quota", FRACTION_RESOURCE) == 2.0

    # Console: the queues page's lines and the overview's team row.
    snap = build_snapshot(state, config, NOW)
    admin = Viewer("admin")
    lines = {
        line.resource: line
        for root in pages.queues(snap, admin)["roots"]
        if root.name == "team-a"
        for line in root.lines
    }
    console_fraction = lines[FRACTION_RESOURCE].show(lines[FRACTION_RESOURCE].used)
    console_whole = lines[GPU].show(lines[GPU].used)
    team = dict(pages.overview(snap, admin, None)["teams"])["team-a"]

    # why: a waiting half names what the queue uses of its share quota.
    why = explain(state, plan, NOW, f"{NS}/half-4", config)
    assert why.reason == Reason.WAITING_FOR_QUOTA

    assert metric_fraction == 2.0
    assert console_fraction == "2"
    assert "(uses 2 of 2, this workload needs 0.5)" in why.fix
    assert metric_whole == 16.0
    assert console_whole == "16"
    assert metric_allocated == team["allocated"] == 18.0
    assert team["nominal"] == 18.0
