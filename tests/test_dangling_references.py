"""A broken reference or one bad workload is that workload's problem, never the whole input's.

Kueue keeps scheduling everything else when a LocalQueue names a ClusterQueue that does not exist
(yet), a ClusterQueue names a missing ResourceFlavor, a Workload names a missing LocalQueue, a
request overflows int64, or one Workload carries a value Kueue cannot use. Each case below puts
one such object next to a healthy workload: the healthy one is admitted, the bad one waits with
a reason and a message that name the problem. The same states run through ``gpuplane schedule``
(exit status 0, the bad object's problem as a warning at most).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.model.loader import load_state
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    job,
    local_queue,
    namespace,
    pod_spec,
    resource_flavor,
    workload,
)

GPUPLANE = (
    sys.executable,
    "-c",
    "import sys; from gpuplane.cli.app import main; sys.argv[0] = 'gpuplane'; main()",
)
T0 = "2026-01-01T00:00:00Z"
REQUESTS = "spec.podSets[0].template.spec.containers[0].resources.requests"


def healthy() -> list[Manifest]:
    """A working queue with one workload that fits."""
    return [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team").flavor("default", cpu="10"),
        local_queue("team", "default", "team"),
        workload("good").queue("team").created(T0).podset(cpu="2"),
    ]


@dataclass(frozen=True)
class Broken:
    objects: list[Manifest]
    want_workload: str
    want_reason: str
    want_message: str


CASES = [
    pytest.param(
        Broken(
            [
                local_queue("orphan", "default", "not-yet"),
                workload("bad").queue("orphan").created(T0).podset(cpu="1"),
            ],
            "default/bad",
            "Misconfigured",
            "ClusterQueue not-yet doesn't exist",
        ),
        id="local-queue-without-cluster-queue",
    ),
    pytest.param(
        Broken(
            [
                cluster_queue("ghost").flavor("missing-flavor", cpu="10"),
                local_queue("ghost", "default", "ghost"),
                workload("bad").queue("ghost").created(T0).podset(cpu="1"),
            ],
            "default/bad",
            "Suspended",
            "ClusterQueue ghost is inactive: FlavorNotFound (missing-flavor)",
        ),
        id="cluster-queue-with-missing-flavor",
    ),
    pytest.param(
        Broken(
            [workload("bad").queue("nowhere").created(T0).podset(cpu="1")],
            "default/bad",
            "Misconfigured",
            "LocalQueue nowhere doesn't exist",
        ),
        id="workload-without-local-queue",
    ),
    pytest.param(
        Broken(
            [workload("bad").queue("team").created(T0).podset(cpu="9223372036854776")],
            "default/bad",
            "ExceedsMaxQuota",
            "current podset request (9223372036854775807m) > maximum capacity (10)",
        ),
        id="request-overflows-int64-millicores",
    ),
    pytest.param(
        Broken(
            [workload("bad").queue("team").created(T0).podset(count=2, cpu="1").set(f"{REQUESTS}.cpu", -1)],
            "default/bad",
            "Misconfigured",
            f"Workload/default/bad: {REQUESTS}.cpu: invalid quantity -1: negative quantity for cpu",
        ),
        id="negative-request",
    ),
    pytest.param(
        Broken(
            [workload("bad").queue("team").created(T0).podset(count=2, min_count=3, cpu="1")],
            "default/bad",
            "Misconfigured",
            "spec.podSets[0].minCount: minCount must be between 0 and count (2)",
        ),
        id="min-count-above-count",
    ),
    pytest.param(
        Broken(
            [job("train").queue("team").priority_class("missing").pod(pod_spec().container(cpu="1"))],
            "default/job-train-",
            "Misconfigured",
            "WorkloadPriorityClass 'missing' not found",
        ),
        id="job-with-unknown-priority-class",
    ),
]


def decide(objects: list[Manifest]) -> dict[str, Any]:
    state = load_state([("state.yaml", documents(*objects))])
    plan = schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=None)
    return plan_document(plan, 0.0, 0.0)


def pending_of(doc: dict[str, Any], prefix: str) -> dict[str, Any]:
    (found,) = [p for p in doc["pending"] if p["workload"].startswith(prefix)]
    return found


@pytest.mark.parametrize("case", CASES)
def test_bad_object_waits_and_the_rest_is_admitted(case: Broken) -> None:
    doc = decide([*healthy(), *case.objects])

    assert [a["workload"] for a in doc["admitted"]] == ["default/good"]
    bad = pending_of(doc, case.want_workload)
    assert bad["reason"] == case.want_reason
    assert case.want_message in bad["message"]


@pytest.mark.parametrize("case", CASES)
def test_cli_schedules_the_rest_with_exit_0(case: Broken, tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(documents(*healthy(), *case.objects))

    run = subprocess.run(
        [*GPUPLANE, "schedule", "-f", str(path), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    doc = json.loads(run.stdout)
    assert [a["workload"] for a in doc["admitted"]] == ["default/good"]
    assert pending_of(doc, case.want_workload)["reason"] == case.want_reason


def test_workloads_join_the_cluster_queue_once_it_appears() -> None:
    waiting = [
        namespace("default"),
        resource_flavor("default"),
        local_queue("late", "default", "late"),
        workload("w").queue("late").created(T0).podset(cpu="1"),
    ]
    before = decide(waiting)
    after = decide([*waiting, cluster_queue("late").flavor("default", cpu="1")])

    assert pending_of(before, "default/w")["reason"] == "Misconfigured"
    assert [a["workload"] for a in after["admitted"]] == ["default/w"]


def test_workloads_of_an_inactive_queue_are_never_victims() -> None:
    """An inactive ClusterQueue is left out of the snapshot: its workloads are no candidates."""
    objects = [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("active")
        .cohort("c")
        .flavor("default", cpu="2")
        .set("spec.preemption", {"reclaimWithinCohort": "Any"}),
        cluster_queue("stopped").cohort("c").flavor("default", cpu="2").set("spec.stopPolicy", "Hold"),
        local_queue("active", "default", "active"),
        workload("borrower")
        .created(T0)
        .podset(cpu="3")
        .admitted(
            "stopped",
            {"name": "main", "count": 1, "flavors": {"cpu": "default"}, "resourceUsage": {"cpu": "3"}},
        )
        .set("status.conditions", [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": T0}]),
        workload("reclaimer").queue("active").created(T0).podset(cpu="2"),
    ]

    doc = decide(objects)

    assert doc["preempted"] == []
    assert pending_of(doc, "default/reclaimer")["reason"] == "WaitingForQuota"
