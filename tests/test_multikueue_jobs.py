"""MultiKueue's job kinds (gpuplane.k8s.multikueue_jobs): the worker's copy of a batch Job, a JobSet,
a PyTorchJob, a TrainJob and a RayJob, their status synced back, an evicted job's status, and the
owner found from a Workload."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations
from gpuplane.k8s.multikueue_jobs import KINDS, REMOTE_OWNER_RESOURCES, JobKind, owner_of
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
    lws = {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet", "name": "serve"}
    assert owner_of(wl(lws)) is None  # not carried
    assert owner_of({"metadata": {}}) is None
    assert REMOTE_OWNER_RESOURCES == (k8s.JOBS, k8s.JOBSETS, k8s.PYTORCH_JOBS, k8s.TRAIN_JOBS, k8s.RAY_JOBS)


# The other kinds gpuplane integrates, as a manager holds them: suspended, left to MultiKueue.


def _meta(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": "team",
        "uid": f"{name}-uid",
        "resourceVersion": "7",
        "generation": 1,
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {keys.QUEUE_NAME_LABEL: "queue"},
    }


def _template() -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}


def _pytorch_job(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": _meta("torch"),
        "spec": {
            "runPolicy": {"managedBy": MANAGED, "suspend": True, "cleanPodPolicy": "None"},
            "pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": _template()},
                "Worker": {"replicas": 2, "template": _template()},
            },
        },
        "status": status,
    }


def _train_job(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": _meta("trainer"),
        "spec": {
            "managedBy": MANAGED,
            "suspend": True,
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 2},
        },
        "status": status,
    }


def _ray_job(**status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayJob",
        "metadata": _meta("ray"),
        "spec": {
            "managedBy": MANAGED,
            "suspend": True,
            "entrypoint": "python train.py",
            "rayClusterSpec": {
                "headGroupSpec": {"template": _template()},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, "template": _template()}],
            },
        },
        "status": status,
    }


NEW_KINDS = {"PyTorchJob": _pytorch_job, "TrainJob": _train_job, "RayJob": _ray_job}


def _unsuspended(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    if kind == "PyTorchJob":
        obj["spec"]["runPolicy"]["suspend"] = False
    else:
        obj["spec"]["suspend"] = False
    return obj


@pytest.mark.parametrize("kind", sorted(NEW_KINDS))
def test_the_workers_copy_of_each_other_kind_is_the_managers_without_managed_by(kind: str) -> None:
    local = NEW_KINDS[kind]()
    adapter = KINDS[kind]
    assert adapter.multikueue_managed(local)
    copy = adapter.remote_copy(local, f"{kind.lower()}-wl", "origin-1")
    assert copy["apiVersion"] == local["apiVersion"]
    assert copy["kind"] == kind
    meta = copy["metadata"]
    assert set(meta) == {"name", "namespace", "labels", "annotations"}  # no uid, version, generation, time
    assert meta["labels"] == {
        keys.QUEUE_NAME_LABEL: "queue",
        keys.PREBUILT_WORKLOAD_LABEL: f"{kind.lower()}-wl",
        keys.MULTIKUEUE_ORIGIN_LABEL: "origin-1",
    }
    assert meta["annotations"] == {keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION: local["metadata"]["uid"]}
    assert "status" not in copy
    assert adapter.managed_by(copy) is None  # the worker's own controller takes it over
    assert not adapter.multikueue_managed(copy)
    assert adapter.suspended(copy)  # the worker's Kueue (or gpuplane) releases it once admitted there
    assert adapter.managed_by(local) == MANAGED  # the manager's object is not changed
    # The rest of the spec is the manager's, whole.
    expected = {k: v for k, v in local["spec"].items() if k != "managedBy"}
    if kind == "PyTorchJob":
        expected["runPolicy"] = {"suspend": True, "cleanPodPolicy": "None"}
    assert copy["spec"] == expected
    # The worker reads the same pod sets from its copy as the manager from its object.
    pod_sets = integrations.INTEGRATIONS[kind].pod_sets
    assert pod_sets(copy) == pod_sets(local)
    assert pod_sets(copy)


def test_a_pytorch_jobs_managed_by_is_read_and_cleared_in_its_run_policy() -> None:
    local = _pytorch_job()
    local["spec"]["managedBy"] = "not-the-path"  # a stray field where other kinds keep it: left alone
    adapter = KINDS["PyTorchJob"]
    assert adapter.managed_by_path == ("spec", "runPolicy", "managedBy")
    assert adapter.managed_by(local) == MANAGED
    copy = adapter.remote_copy(local, "wl", "origin-1")
    assert "managedBy" not in copy["spec"]["runPolicy"]
    assert copy["spec"]["managedBy"] == "not-the-path"
    no_policy = _pytorch_job()
    del no_policy["spec"]["runPolicy"]
    assert adapter.managed_by(no_policy) is None
    assert "runPolicy" not in adapter.remote_copy(no_policy, "wl", "origin-1")["spec"]
    assert KINDS["RayJob"].managed_by(local) == "not-the-path"  # spec.managedBy for the others
    assert KINDS["Job"].managed_by_path == ("spec", "managedBy")


def test_a_job_kind_must_be_integrated_and_keep_managed_by_under_its_spec() -> None:
    with pytest.raises(ValueError, match="does not integrate"):
        JobKind("MPIJob", k8s.JOBS)
    with pytest.raises(ValueError, match="under spec"):
        JobKind("Job", k8s.JOBS, ("metadata", "managedBy"))
    with pytest.raises(ValueError, match="under spec"):
        JobKind("Job", k8s.JOBS, ("spec",))


def _running_status(kind: str) -> dict[str, Any]:
    if kind == "PyTorchJob":
        return {
            "conditions": [{"type": "Running", "status": "True"}],
            "replicaStatuses": {"Master": {"active": 1}, "Worker": {"active": 2}},
        }
    if kind == "TrainJob":
        return {"jobsStatus": [{"name": "node", "active": 2, "ready": 2, "succeeded": 0, "failed": 0}]}
    return {"jobDeploymentStatus": "Running", "jobStatus": "RUNNING", "rayClusterName": "ray-abc"}


def _finished_status(kind: str, *, succeeded: bool = True) -> dict[str, Any]:
    if kind == "PyTorchJob":
        kind_of = "Succeeded" if succeeded else "Failed"
        return {
            "conditions": [{"type": kind_of, "status": "True", "message": f"PyTorchJob torch is {kind_of}"}],
            "replicaStatuses": {"Master": {"succeeded": 1}, "Worker": {"succeeded": 2}},
        }
    if kind == "TrainJob":
        kind_of = "Complete" if succeeded else "Failed"
        return {
            "conditions": [{"type": kind_of, "status": "True"}],
            "jobsStatus": [{"name": "node", "succeeded": 2}],
        }
    return {"jobDeploymentStatus": "Complete" if succeeded else "Failed", "jobStatus": "SUCCEEDED"}


@pytest.mark.parametrize("kind", sorted(NEW_KINDS))
def test_each_other_kind_shows_the_workers_whole_status_only_while_it_runs(kind: str) -> None:
    adapter = KINDS[kind]
    make = NEW_KINDS[kind]
    local = make()
    running = make(**_running_status(kind))
    done = make(**_finished_status(kind))
    # Suspended on the manager: never a running status, a finished one only once final.
    assert adapter.synced_status(local, running, final=False) is None
    assert adapter.synced_status(local, running, final=True) is None
    assert adapter.synced_status(local, done, final=False) is None
    assert adapter.synced_status(local, done, final=True) == done["status"]
    # Released on the manager (its Workload admitted there): the worker's status, whole.
    local = _unsuspended(kind, make())
    assert adapter.synced_status(local, running, final=False) == running["status"]
    local["status"] = running["status"]
    assert adapter.synced_status(local, running, final=False) is None  # already shown
    assert adapter.synced_status(local, done, final=False) is None  # its Workload has not finished
    assert adapter.synced_status(local, done, final=True) == done["status"]
    failed = make(**_finished_status(kind, succeeded=False))
    assert adapter.finished(done)
    assert adapter.finished(failed)
    assert not adapter.finished(running)
    assert adapter.synced_status(local, failed, final=True) == failed["status"]


def test_an_evicted_pytorch_job_counts_no_active_replicas() -> None:
    adapter = KINDS["PyTorchJob"]
    job = _pytorch_job(**_running_status("PyTorchJob"))
    assert adapter.stopped_status(job) == {
        "conditions": [{"type": "Running", "status": "True"}],
        "replicaStatuses": {"Master": {"active": 0}, "Worker": {"active": 0}},
    }
    assert job["status"]["replicaStatuses"]["Worker"]["active"] == 2  # not changed in place
    job["status"] = adapter.stopped_status(job)
    assert adapter.stopped_status(job) is None  # says so already
    assert adapter.stopped_status(_pytorch_job()) is None  # never ran
    running = _unsuspended("PyTorchJob", _pytorch_job(**_running_status("PyTorchJob")))
    assert adapter.stopped_status(running) is None  # running: not the manager's to reset


def test_an_evicted_train_job_counts_no_active_or_ready_jobs() -> None:
    adapter = KINDS["TrainJob"]
    job = _train_job(**_running_status("TrainJob"))
    assert adapter.stopped_status(job) == {
        "jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 0, "failed": 0}]
    }
    assert job["status"]["jobsStatus"][0]["active"] == 2
    assert adapter.stopped_status(_train_job(jobsStatus=[{"name": "node", "active": 0}])) is None
    assert adapter.stopped_status(_unsuspended("TrainJob", _train_job(**_running_status("TrainJob")))) is None


def test_an_evicted_ray_job_is_marked_suspended_unless_it_ended() -> None:
    adapter = KINDS["RayJob"]
    job = _ray_job(**_running_status("RayJob"))
    stopped = adapter.stopped_status(job)
    assert stopped == {**_running_status("RayJob"), "jobDeploymentStatus": "Suspended"}
    assert job["status"]["jobDeploymentStatus"] == "Running"
    job["status"] = stopped
    assert adapter.stopped_status(job) is None
    for at_rest in ("Complete", "Failed", "ValidationFailed", "New"):
        assert adapter.stopped_status(_ray_job(jobDeploymentStatus=at_rest)) is None
    assert adapter.stopped_status(_ray_job()) is None  # no status yet
    assert adapter.stopped_status(_unsuspended("RayJob", _ray_job(**_running_status("RayJob")))) is None


@pytest.mark.parametrize(
    ("api_version", "kind", "resource"),
    [
        ("kubeflow.org/v1", "PyTorchJob", k8s.PYTORCH_JOBS),
        ("trainer.kubeflow.org/v1alpha1", "TrainJob", k8s.TRAIN_JOBS),
        ("ray.io/v1", "RayJob", k8s.RAY_JOBS),
    ],
)
def test_the_owner_of_each_other_kind_is_found_by_kind_and_group(
    api_version: str, kind: str, resource: k8s.Resource
) -> None:
    def wl(*refs: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "w", "namespace": "team", "ownerReferences": list(refs)}}

    found = owner_of(wl({"apiVersion": api_version, "kind": kind, "name": "mine"}))
    assert found is not None
    assert (found[0].kind, found[0].resource, found[1]) == (kind, resource, "mine")
    assert owner_of(wl({"apiVersion": "example.com/v1", "kind": kind, "name": "x"})) is None
