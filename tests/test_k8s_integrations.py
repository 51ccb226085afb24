"""Job integrations and the webhook: pure functions over Kubernetes objects."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.webhook import pod_patch, review
from gpuplane.model import labels as keys


def container(gpu: int = 1) -> dict[str, Any]:
    return {"name": "c", "resources": {"requests": {"cpu": "1", "nvidia.com/gpu": str(gpu)}}}


def template(gpu: int = 1) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [container(gpu)]}}


def obj(kind: str, spec: dict[str, Any], queue: str | None = "team") -> dict[str, Any]:
    labels = {keys.QUEUE_NAME_LABEL: queue} if queue else {}
    return {
        "apiVersion": jobs.INTEGRATIONS[kind].resource.api_version,
        "kind": kind,
        "metadata": {"name": "train", "namespace": "ml", "uid": "u-1", "labels": labels},
        "spec": spec,
    }


CASES = [
    pytest.param(
        "Job",
        {"parallelism": 4, "completions": 2, "suspend": True, "template": template()},
        [("main", 2)],
        id="job-count-is-min-of-parallelism-and-completions",
    ),
    pytest.param(
        "JobSet",
        {
            "suspend": True,
            "replicatedJobs": [
                {
                    "name": "driver",
                    "replicas": 1,
                    "template": {"spec": {"parallelism": 1, "template": template()}},
                },
                {
                    "name": "workers",
                    "replicas": 3,
                    "template": {"spec": {"parallelism": 2, "template": template()}},
                },
            ],
        },
        [("driver", 1), ("workers", 6)],
        id="jobset-replicas-times-parallelism",
    ),
    pytest.param(
        "PyTorchJob",
        {
            "runPolicy": {"suspend": True},
            "pytorchReplicaSpecs": {
                "Worker": {"replicas": 3, "template": template()},
                "Master": {"replicas": 1, "template": template()},
            },
        },
        [("master", 1), ("worker", 3)],
        id="pytorchjob-master-first",
    ),
    pytest.param(
        "RayJob",
        {
            "suspend": True,
            "rayClusterSpec": {
                "headGroupSpec": {"template": template(0)},
                "workerGroupSpecs": [{"groupName": "gpu", "replicas": 4, "template": template()}],
            },
        },
        [("head", 1), ("gpu", 4)],
        id="rayjob-head-and-groups",
    ),
    pytest.param(
        "LeaderWorkerSet",
        {"replicas": 2, "leaderWorkerTemplate": {"size": 4, "workerTemplate": template()}},
        [("leader", 2), ("workers", 6)],
        id="lws-leaders-and-workers",
    ),
    pytest.param(
        "TrainJob",
        {
            "suspend": True,
            "trainer": {"numNodes": 2, "resourcesPerNode": {"requests": {"nvidia.com/gpu": "8"}}},
        },
        [("node", 2)],
        id="trainjob-num-nodes",
    ),
]


@pytest.mark.parametrize(("kind", "spec", "want_pod_sets"), CASES)
def test_workload_for_each_integration(
    kind: str, spec: dict[str, Any], want_pod_sets: list[tuple[str, int]]
) -> None:
    wl = jobs.workload_for(kind, obj(kind, spec), {})
    assert wl is not None
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == want_pod_sets
    assert wl["spec"]["queueName"] == "team"
    assert wl["metadata"]["ownerReferences"][0]["kind"] == kind
    assert wl["metadata"]["labels"][keys.JOB_UID_LABEL] == "u-1"


def test_unqueued_job_has_no_workload() -> None:
    assert jobs.workload_for("Job", obj("Job", {"template": template()}, queue=None), {}) is None


def test_priority_class_resolves_to_its_value() -> None:
    job = obj("Job", {"suspend": True, "template": template()})
    job["metadata"]["labels"][keys.PRIORITY_CLASS_LABEL] = "prod"
    wl = jobs.workload_for("Job", job, {"prod": 1000})
    assert wl is not None
    assert wl["spec"]["priority"] == 1000


def test_release_stamps_templates_and_unsuspends() -> None:
    job = obj("JobSet", CASES[1].values[1])
    observed = copy.deepcopy(job)
    released = jobs.released_job("JobSet", job, "wl-1", {"workers": {"gpu": "h100"}})
    assert not jobs.is_suspended("JobSet", released)
    assert job == observed  # the job as observed (the cache's) is not changed, however deep
    workers = released["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]
    assert workers["metadata"]["labels"][keys.WORKLOAD_LABEL] == "wl-1"
    assert workers["metadata"]["labels"][keys.PODSET_LABEL] == "workers"
    assert "schedulerName" not in workers["spec"]  # immutable in a Job template: the webhook sets it
    assert workers["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert jobs.is_suspended("JobSet", jobs.suspended_job("JobSet", released))


def test_release_of_a_partially_admitted_job_leaves_the_observed_job_alone() -> None:
    spec = template()
    spec["spec"]["nodeSelector"] = {"zone": "a"}
    job = obj("Job", {"suspend": True, "parallelism": 4, "completions": 4, "template": spec})
    job["metadata"]["annotations"] = {keys.MIN_PARALLELISM: "2"}
    observed = copy.deepcopy(job)
    released = jobs.released_job(
        "Job", job, "wl-1", {"main": {"gpu": "h100"}}, {keys.LOCAL_QUEUE_LABEL: "team"}, counts={"main": 3}
    )
    assert job == observed
    assert released["spec"]["parallelism"] == 3
    assert released["spec"]["suspend"] is False
    pod = released["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"zone": "a", "gpu": "h100"}
    assert pod["metadata"]["labels"] == {
        "app": "x",
        keys.WORKLOAD_LABEL: "wl-1",
        keys.KUEUE_WORKLOAD_LABEL: "wl-1",
        keys.PODSET_LABEL: "main",
        keys.LOCAL_QUEUE_LABEL: "team",
    }
    assert pod["spec"]["containers"] == observed["spec"]["template"]["spec"]["containers"]


def test_suspending_restores_the_counts_and_leaves_the_released_job_alone() -> None:
    job = obj("Job", {"suspend": True, "parallelism": 4, "completions": 4, "template": template()})
    job["metadata"]["annotations"] = {keys.MIN_PARALLELISM: "2"}
    released = jobs.released_job("Job", job, "wl-1", {}, counts={"main": 3})
    observed = copy.deepcopy(released)
    stopped = jobs.suspended_job("Job", released, {"main": 4})
    assert released == observed
    assert stopped["spec"]["suspend"] is True
    assert stopped["spec"]["parallelism"] == 4
    # A PyTorchJob with no run policy gets one, on the copy only.
    pytorch = obj("PyTorchJob", {"pytorchReplicaSpecs": {"Worker": {"replicas": 1, "template": template()}}})
    assert jobs.is_suspended("PyTorchJob", jobs.suspended_job("PyTorchJob", pytorch))
    assert "runPolicy" not in pytorch["spec"]


def test_pod_group_workload_counts_the_whole_group() -> None:
    pod = {
        "metadata": {
            "name": "p0",
            "namespace": "ml",
            "labels": {keys.QUEUE_NAME_LABEL: "team", keys.POD_GROUP_LABEL: "g"},
            "annotations": {keys.POD_GROUP_COUNT: "4"},
        },
        "spec": {"containers": [container()], "schedulingGates": [{"name": keys.ADMISSION_GATE}]},
    }
    wl = jobs.pod_group_workload([pod], {})
    assert wl is not None
    assert wl["spec"]["podSets"][0]["count"] == 4
    assert "schedulingGates" not in wl["spec"]["podSets"][0]["template"]["spec"]


@pytest.mark.parametrize(
    ("labels", "owned", "want_ops"),
    [
        pytest.param({}, False, [], id="not-ours"),
        pytest.param(
            {keys.QUEUE_NAME_LABEL: "q"},
            False,
            ["/spec/schedulerName", "/spec/schedulingGates"],
            id="plain",
        ),
        pytest.param({keys.QUEUE_NAME_LABEL: "q"}, True, [], id="job-owned-waits-in-job"),
        pytest.param({keys.WORKLOAD_LABEL: "wl"}, True, ["/spec/schedulerName"], id="released-job-pod"),
    ],
)
def test_webhook_patches(labels: dict[str, str], owned: bool, want_ops: list[str]) -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p", "labels": labels}, "spec": {"containers": [container()]}}
    if owned:
        pod["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "j", "uid": "u", "controller": True}]
    assert [op["path"] for op in pod_patch(pod)] == want_ops
    answer = review({"request": {"uid": "r1", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod}})
    assert answer["response"]["uid"] == "r1"
    assert answer["response"]["allowed"] is True
    if want_ops:
        ops = json.loads(base64.b64decode(answer["response"]["patch"]))
        assert [op["path"] for op in ops] == want_ops
    else:
        assert "patch" not in answer["response"]


def test_a_rayjob_ends_when_kuberay_refuses_its_spec_before_making_a_cluster() -> None:
    def ray(**status: str) -> dict[str, Any]:
        return {"kind": "RayJob", "status": status}

    refused = jobs.outcome("RayJob", ray(jobDeploymentStatus="ValidationFailed", message="bad entrypoint"))
    assert refused == jobs.Outcome(False, "bad entrypoint")
    # A cluster was made: KubeRay may still go on, so the job has not ended.
    made = ray(jobDeploymentStatus="ValidationFailed", rayClusterName="ray-abc")
    assert jobs.outcome("RayJob", made) is None
    assert jobs.outcome("RayJob", ray(jobDeploymentStatus="Running")) is None
    assert jobs.outcome("RayJob", ray(jobDeploymentStatus="Complete")) == jobs.Outcome(
        True, "RayJob Complete"
    )
