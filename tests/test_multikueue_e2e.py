"""MultiKueue end to end (tests/multikueue_fleet.py builds the fleet): a gang, and a JobSet, dispatched
where it fits and completed with its status synced back, data locality, a job not left to MultiKueue
rejected, orphans collected, a manager restart, and a worker lost within and past
``workerLostTimeout``. On the double by default; with
``GPUPLANE_E2E_KUBECONFIG`` on three real control planes.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.fixtures import E2E_KUBECONFIG
from controller_harness import gpu_job, wait_until
from fake_kubelet import run_annotations
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.model import labels as keys
from multikueue_fleet import CHECK, NS, Fleet, Member, build_fleet, dispatched, finished, true


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with build_fleet(tmp_path_factory.mktemp("fleet"), os.environ.get(E2E_KUBECONFIG)) as built:
        yield built


def test_the_check_and_the_workers_turn_active(fleet: Fleet) -> None:
    def active(res: k8s.Resource, name: str) -> bool:
        return true(fleet.manager.api.get(res, name), "Active")

    wait_until(
        lambda: active(k8s.MULTIKUEUE_CLUSTERS, "small") and active(k8s.MULTIKUEUE_CLUSTERS, "big"),
        60,
        "workers Active",
    )
    wait_until(lambda: active(k8s.ADMISSION_CHECKS, CHECK), 30, "the MultiKueue check Active")


def test_the_manager_shows_each_workers_health_quota_and_usage(fleet: Fleet) -> None:
    def summary(name: str) -> dict[str, Any] | None:
        obj = fleet.manager.api.get(k8s.MULTIKUEUE_CLUSTERS, name)
        text = (obj["metadata"].get("annotations") or {}).get("gpuplane.dev/worker-summary")
        return json.loads(text) if text else None

    # Each worker's summary is written once the manager reaches it (its watch has listed): wait for both.
    def active(name: str) -> dict[str, Any] | None:
        found = summary(name)
        return found if found and found["active"] and found["quota"] else None

    big = wait_until(lambda: active("big"), 60, "the summary of worker big")
    assert big["active"] is True
    assert big["quota"]["nvidia.com/gpu"] == "16"  # two nodes of 8: its ClusterQueue's quota
    small = wait_until(lambda: active("small"), 60, "the summary of worker small")
    assert small["quota"]["nvidia.com/gpu"] == "8"

    def scraped() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{fleet.metrics_port}/metrics", timeout=5) as reply:
            return str(reply.read().decode())

    def has_worker_series() -> str | None:
        try:
            text = scraped()
        except OSError:
            return None
        return text if 'gpuplane_multikueue_worker_active{cluster="big"} 1.0' in text else None

    text = wait_until(has_worker_series, 60, "the manager's MultiKueue metrics")
    assert 'gpuplane_multikueue_worker_quota{cluster="big",resource="nvidia.com/gpu"} 16.0' in text
    assert 'gpuplane_multikueue_worker_pending_workloads{cluster="small"}' in text


def test_a_gang_goes_where_it_fits_runs_and_its_status_comes_back(fleet: Fleet) -> None:
    # 2 pods x 8 GPUs: only "big" (two nodes) can hold it; the gpuplane dispatcher asks first.
    fleet.submit("gang", pods=2, gpus=8, seconds=2.0)
    local = wait_until(lambda: fleet.workload(fleet.manager, "gang"), 60, "the manager's Workload")
    key = local["metadata"]["name"]

    done = wait_until(lambda: finished(fleet, key), 180, "the manager's Workload finished")
    assert done["status"]["clusterName"] == "big"
    assert "From big" in next(c for c in done["status"]["conditions"] if c["type"] == "Finished")["message"]
    check = next(c for c in done["status"]["admissionChecks"] if c["name"] == CHECK)
    assert check["state"] == "Ready"
    # Why it went there, in the check's message (what `kubectl describe workload` shows).
    assert check["message"].startswith('The workload was admitted on "big" (nominated big'), check["message"]
    assert "small" in check["message"]
    # The manager's Job carries the worker Job's final status.
    job = fleet.manager.api.get(k8s.JOBS, "gang", NS)
    assert job["status"].get("succeeded") == 2
    # The worker's copies are gone, and "small" never had one.
    wait_until(lambda: fleet.workload(fleet.big, "gang") is None, 60, "copies deleted on big")
    assert not [w for w in fleet.remote_workloads(fleet.small) if w["metadata"]["name"] == key]


def test_a_jobset_goes_where_it_fits_runs_and_its_status_comes_back(fleet: Fleet) -> None:
    # A leader and two workers, 4 GPUs each: 12 GPUs, which only "big" (two nodes of 8) has.
    fleet.submit_jobset("js", {"leader": (1, 4), "workers": (2, 4)}, seconds=3.0)
    local = wait_until(lambda: fleet.workload(fleet.manager, "js"), 60, "the manager's Workload")
    key = local["metadata"]["name"]
    assert [r["kind"] for r in local["metadata"]["ownerReferences"]] == ["JobSet"]
    assert [(p["name"], p["count"]) for p in local["spec"]["podSets"]] == [("leader", 1), ("workers", 2)]

    def copied() -> dict[str, Any] | None:
        try:
            return fleet.big.api.get(k8s.JOBSETS, "js", NS)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    remote = wait_until(copied, 120, "the JobSet created on big")
    labels = remote["metadata"]["labels"]
    assert labels[keys.PREBUILT_WORKLOAD_LABEL] == key
    assert labels[keys.MULTIKUEUE_ORIGIN_LABEL] == "multikueue"
    assert "managedBy" not in remote["spec"]

    done = wait_until(lambda: finished(fleet, key), 180, "the manager's Workload finished")
    assert done["status"]["clusterName"] == "big"
    ended = next(c for c in done["status"]["conditions"] if c["type"] == "Finished")
    assert ended["reason"] == "Succeeded", ended
    assert ended["message"].startswith("From big"), ended  # the worker's Workload, not the copied status
    check = next(c for c in done["status"]["admissionChecks"] if c["name"] == CHECK)
    assert check["state"] == "Ready"
    # The manager's JobSet carries the worker JobSet's final status, its Jobs' counts included.
    jobset = fleet.manager.api.get(k8s.JOBSETS, "js", NS)
    assert true(jobset, "Completed"), jobset.get("status")
    counts = {r["name"]: r["succeeded"] for r in jobset["status"]["replicatedJobsStatus"]}
    assert counts == {"leader": 1, "workers": 2}
    # No pod and no Job of it ran on the manager (managedBy), and the worker's copies are gone.
    assert not [
        j
        for j in fleet.manager.api.list(k8s.JOBS, NS).get("items") or []
        if j["metadata"]["name"].startswith("js-")
    ]
    wait_until(
        lambda: (
            copied() is None
            and not [w for w in fleet.remote_workloads(fleet.big) if w["metadata"]["name"] == key]
        ),
        60,
        "copies deleted on big",
    )
    assert not [w for w in fleet.remote_workloads(fleet.small) if w["metadata"]["name"] == key]


def test_a_selector_keeps_the_job_in_its_region(fleet: Fleet) -> None:
    # One GPU fits both workers, and "small" comes first in the MultiKueueConfig; but the data sits in
    # "eu", which only "big" has. The user says so on the Job.
    fleet.submit(
        "local", pods=1, gpus=1, seconds=1.0, annotations={"gpuplane.dev/cluster-selector": "region=eu"}
    )
    wl = wait_until(lambda: fleet.workload(fleet.manager, "local"), 60, "the manager's Workload")
    done = wait_until(lambda: finished(fleet, wl["metadata"]["name"]), 180, "finished")
    assert done["status"]["clusterName"] == "big"


def test_without_a_selector_the_first_worker_that_fits_takes_it(fleet: Fleet) -> None:
    fleet.submit("anywhere", pods=1, gpus=1, seconds=1.0)
    wl = wait_until(lambda: fleet.workload(fleet.manager, "anywhere"), 60, "the manager's Workload")
    done = wait_until(lambda: finished(fleet, wl["metadata"]["name"]), 180, "finished")
    assert done["status"]["clusterName"] == "small"  # first in the MultiKueueConfig, and it fits


def test_a_job_not_left_to_multikueue_is_rejected_and_never_copied(fleet: Fleet) -> None:
    # The same Job as every other, but without spec.managedBy: Kueue rejects its check.
    body = gpu_job("unmanaged", NS, "queue", pods=1, gpus=1, annotations=run_annotations(1.0)).to_dict()
    fleet.manager.api.create(k8s.JOBS, body, NS)
    local = wait_until(lambda: fleet.workload(fleet.manager, "unmanaged"), 60, "the manager's Workload")

    def rejected() -> dict[str, Any] | None:
        wl = fleet.manager.api.get(k8s.WORKLOADS, local["metadata"]["name"], NS)
        checks = (wl.get("status") or {}).get("admissionChecks") or []
        return wl if any(c["name"] == CHECK and c["state"] == "Rejected" for c in checks) else None

    wl = wait_until(rejected, 60, "the check Rejected")
    check = next(c for c in wl["status"]["admissionChecks"] if c["name"] == CHECK)
    assert check["message"] == (
        'The owner is not managed by Kueue: Expecting spec.managedBy to be "kueue.x-k8s.io/multikueue" not ""'
    )
    # The core deactivates it and gives its quota back; no worker ever had a copy.
    wait_until(
        lambda: (
            fleet.manager.api.get(k8s.WORKLOADS, wl["metadata"]["name"], NS)["spec"].get("active") is False
        ),
        60,
        "the Workload deactivated",
    )
    for worker in (fleet.small, fleet.big):
        assert fleet.workload(worker, "unmanaged") is None
    fleet.manager.api.delete(k8s.JOBS, "unmanaged", NS, propagationPolicy="Background")


def test_orphans_on_a_worker_are_collected(fleet: Fleet) -> None:
    orphan = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "orphan",
            "namespace": NS,
            "labels": {keys.MULTIKUEUE_ORIGIN_LABEL: "multikueue"},
        },
        "spec": {
            "queueName": "missing",
            "active": False,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
                }
            ],
        },
    }
    fleet.small.api.create(k8s.WORKLOADS, orphan, NS)
    mine = {**orphan, "metadata": {"name": "not-ours", "namespace": NS}}
    fleet.small.api.create(k8s.WORKLOADS, mine, NS)

    def gone() -> bool:
        try:
            fleet.small.api.get(k8s.WORKLOADS, "orphan", NS)
        except ApiError as err:
            return err.not_found
        return False

    wait_until(gone, 60, "the orphan deleted")
    assert fleet.small.api.get(k8s.WORKLOADS, "not-ours", NS)  # no origin label: not the manager's


def test_a_manager_restart_resumes_without_a_requeue(fleet: Fleet) -> None:
    fleet.submit("steady", pods=1, gpus=8, seconds=6.0)
    local = wait_until(lambda: fleet.workload(fleet.manager, "steady"), 60, "the manager's Workload")
    key = local["metadata"]["name"]
    wait_until(
        lambda: dispatched(fleet, key),
        120,
        "dispatched and admitted on a worker",
    )
    fleet.stop_manager()
    fleet.start_manager()
    done = wait_until(
        lambda: finished(fleet, key),
        180,
        "finished",
    )
    assert not true(done, "Evicted")
    assert "requeueState" not in done["status"]
    assert all(c["state"] == "Ready" for c in done["status"]["admissionChecks"])


def test_a_worker_back_within_the_timeout_keeps_its_job(fleet: Fleet) -> None:
    fleet.submit("kept", pods=1, gpus=8, seconds=20.0)
    local = wait_until(lambda: fleet.workload(fleet.manager, "kept"), 60, "the manager's Workload")
    key = local["metadata"]["name"]
    where = wait_until(lambda: dispatched(fleet, key), 120, "dispatched and admitted on a worker")
    worker = fleet.big if where == "big" else fleet.small
    wait_until(lambda: _running_pods(worker) > 0, 60, "the job running on its worker")
    worker.outage(5.0)
    done = wait_until(lambda: finished(fleet, key), 240, "finished")
    assert done["status"]["clusterName"] == where
    assert not true(done, "Evicted")
    assert all(c["state"] == "Ready" for c in done["status"]["admissionChecks"])


def test_a_worker_lost_past_the_timeout_gives_its_job_to_another_and_its_duplicate_goes(fleet: Fleet) -> None:
    fleet.stop_manager()
    fleet.start_manager(lost_timeout=3.0)
    fleet.submit("moved", pods=1, gpus=8, seconds=30.0)
    local = wait_until(lambda: fleet.workload(fleet.manager, "moved"), 60, "the manager's Workload")
    key = local["metadata"]["name"]
    first = wait_until(lambda: dispatched(fleet, key), 120, "dispatched and admitted on a worker")
    lost, other = (fleet.big, fleet.small) if first == "big" else (fleet.small, fleet.big)
    wait_until(lambda: _running_pods(lost) > 0, 60, "the job running on its worker")
    lost.outage(12.0)
    done = wait_until(lambda: finished(fleet, key), 300, "finished")
    assert done["status"]["clusterName"] == other.name
    # The lost worker's copy, admitted there before the loss, is removed once it answers again.
    wait_until(
        lambda: not [w for w in fleet.remote_workloads(lost) if w["metadata"]["name"] == key],
        120,
        "the duplicate removed on reconnect",
    )


def _running_pods(member: Member) -> int:
    pods = member.api.list(k8s.PODS, NS).get("items") or []
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")
