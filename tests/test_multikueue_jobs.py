"""MultiKueue's job kinds (gpuplane.k8s.multikueue_jobs): the worker's copy of a batch Job and of a
JobSet, their status synced back, an evicted job's status, and the owner found from a Workload."""

from __future__ import annotations

from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.multikueue_jobs import KINDS, REMOTE_OWNER_RESOURCES, owner_of
from gpuplane.model import labels as keys

MANAGED = keys.MULTIKUEUE_CONTROLLER


def _jobset(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": "train",
            "namespace": "team",
            "uid": "js-uid",
            "resourceVersion": "12",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {keys.QUEUE_NAME_LABEL: "queue"},
            "annotations": {"note": "kept"},
        },
        "spec": {
            "managedBy": MANAGED,
            "suspend": True,
            "replicatedJobs": [
                {"name": "leader", "replicas": 1, "template": {"spec": {"template": {"spec": {}}}}},
                {"name": "workers", "replicas": 2, "template": {"spec": {"template": {"spec": {}}}}},
            ],
        },
        "status": status,
    }


def _job() -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "gang", "namespace": "team", "uid": "job-uid", "resourceVersion": "3"},
        "spec": {
            "managedBy": MANAGED,
            "suspend": True,
            "selector": {"matchLabels": {"batch.kubernetes.io/controller-uid": "job-uid"}},
            "template": {
                "metadata": {
                    "labels": {
                        "controller-uid": "job-uid",
                        "batch.kubernetes.io/controller-uid": "job-uid",
                        "job-name": "gang",
                        "batch.kubernetes.io/job-name": "gang",
                        "app": "mine",
                    }
                },
                "spec": {},
            },
        },
        "status": {"active": 2},
    }


def test_the_workers_jobset_is_the_managers_without_what_the_server_and_multikueue_set() -> None:
    local = _jobset(conditions=[])
    copy = KINDS["JobSet"].remote_copy(local, "jobset-train-abc", "origin-1")
    assert copy["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    assert copy["kind"] == "JobSet"
    meta = copy["metadata"]
    assert set(meta) == {"name", "namespace", "labels", "annotations"}  # no uid, resourceVersion, time
    assert (meta["name"], meta["namespace"]) == ("train", "team")
    assert meta["labels"] == {
        keys.QUEUE_NAME_LABEL: "queue",
        keys.PREBUILT_WORKLOAD_LABEL: "jobset-train-abc",
        keys.MULTIKUEUE_ORIGIN_LABEL: "origin-1",
    }
    assert meta["annotations"] == {"note": "kept", keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION: "js-uid"}
    assert "managedBy" not in copy["spec"]
    assert "status" not in copy
    assert copy["spec"]["replicatedJobs"] == local["spec"]["replicatedJobs"]
    assert local["spec"]["managedBy"] == MANAGED  # the manager's object is not changed


def test_the_workers_batch_job_leaves_out_the_selector_and_the_job_controllers_labels() -> None:
    local = _job()
    copy = KINDS["Job"].remote_copy(local, "job-gang-abc", "multikueue")
    assert copy["apiVersion"] == "batch/v1"
    assert "selector" not in copy["spec"]
    assert "managedBy" not in copy["spec"]
    assert copy["spec"]["template"]["metadata"]["labels"] == {"app": "mine"}
    assert local["spec"]["template"]["metadata"]["labels"]["job-name"] == "gang"


def test_a_running_jobset_shows_the_workers_whole_status() -> None:
    local = _jobset()
    local["spec"]["suspend"] = False
    remote = _jobset(
        replicatedJobsStatus=[{"name": "leader", "active": 1, "ready": 1}],
        restarts=0,
    )
    status = KINDS["JobSet"].synced_status(local, remote, final=False)
    assert status == remote["status"]
    local["status"] = status
    assert KINDS["JobSet"].synced_status(local, remote, final=False) is None  # already shown
    done = _jobset(conditions=[{"type": "Completed", "status": "True"}])
    assert KINDS["JobSet"].synced_status(local, done, final=False) is None  # its Workload has not finished
    assert KINDS["JobSet"].synced_status(local, done, final=True) == done["status"]


def test_a_suspended_jobset_shows_only_the_final_status() -> None:
    local = _jobset()
    running = _jobset(replicatedJobsStatus=[{"name": "leader", "active": 1}])
    done = _jobset(conditions=[{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}])
    kind = KINDS["JobSet"]
    assert kind.synced_status(local, running, final=False) is None
    assert kind.synced_status(local, running, final=True) is None  # not ended there: no running status
    assert kind.synced_status(local, done, final=False) is None
    assert kind.synced_status(local, done, final=True) == done["status"]
    assert kind.finished(done)
    assert not kind.finished(running)


def test_a_batch_job_finishes_on_complete_or_failed() -> None:
    kind = KINDS["Job"]
    failed = {**_job(), "status": {"conditions": [{"type": "Failed", "status": "True"}]}}
    assert kind.finished(failed)
    assert not kind.finished(_job())
    assert kind.synced_status(_job(), failed, final=True) == failed["status"]


def test_an_evicted_job_counts_nothing_running() -> None:
    job = _job()
    assert KINDS["Job"].stopped_status(job) == {"active": 0}
    job["status"] = {"active": 0}
    assert KINDS["Job"].stopped_status(job) is None
    jobset = _jobset(replicatedJobsStatus=[{"name": "leader", "active": 1, "ready": 1, "succeeded": 0}])
    assert KINDS["JobSet"].stopped_status(jobset) == {
        "replicatedJobsStatus": [{"name": "leader", "active": 0, "ready": 0, "succeeded": 0}]
    }
    assert jobset["status"]["replicatedJobsStatus"][0]["active"] == 1  # not changed in place
    jobset["spec"]["suspend"] = False
    assert KINDS["JobSet"].stopped_status(jobset) is None  # running: not the manager's to reset


def test_the_owner_is_found_by_kind_and_group() -> None:
    def wl(*refs: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "w", "namespace": "team", "ownerReferences": list(refs)}}

    found = owner_of(wl({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "train"}))
    assert found is not None
    assert (found[0].kind, found[1]) == ("JobSet", "train")
    found = owner_of(wl({"kind": "Job", "name": "gang"}))
    assert found is not None
    assert (found[0].resource, found[1]) == (k8s.JOBS, "gang")
    assert owner_of(wl({"apiVersion": "example.com/v1", "kind": "JobSet", "name": "x"})) is None
    assert owner_of(wl({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "p"})) is None
    assert owner_of({"metadata": {}}) is None
    assert REMOTE_OWNER_RESOURCES == (k8s.JOBS, k8s.JOBSETS)
