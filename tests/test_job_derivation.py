"""One Job -> Workload derivation: the CLI's input files and the controller agree."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuplane.core import scheduler as core_scheduler
from gpuplane.insight import usage as insight_usage
from gpuplane.k8s import controller as k8s_controller
from gpuplane.k8s import integrations, provisioning
from gpuplane.model import labels
from gpuplane.model.errors import InputError
from gpuplane.model.jobs import workload_name
from gpuplane.model.kinds import parse_workload, workload_from_job
from gpuplane.reaper import cluster as reaper_cluster


def batch_job(
    *,
    name: str = "train",
    namespace: str = "ml",
    uid: str | None = "u-1",
    parallelism: int | None = 2,
    completions: int | None = None,
    queue_in: str = "label",
    priority_class: str | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {}, "annotations": {}}
    meta["annotations"].update(annotations or {})
    if uid is not None:
        meta["uid"] = uid
    meta["labels" if queue_in == "label" else "annotations"][labels.QUEUE_NAME_LABEL] = "team"
    if priority_class:
        meta["labels"][labels.PRIORITY_CLASS_LABEL] = priority_class
    spec: dict[str, Any] = {
        "template": {
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "1"}}}]}
        }
    }
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


@dataclass(frozen=True)
class Case:
    id: str
    job: dict[str, Any]
    want_count: int
    want_priority: int = 0
    priorities: dict[str, int] = field(default_factory=dict)


CASES = [
    Case("defaults", batch_job(parallelism=None), want_count=1),
    Case("parallelism", batch_job(parallelism=4), want_count=4),
    Case("completions-cap", batch_job(parallelism=4, completions=3), want_count=3),
    Case("queue-annotation", batch_job(queue_in="annotation"), want_count=2),
    Case("no-uid", batch_job(uid=None), want_count=2),
    Case("priority", batch_job(priority_class="prod"), want_count=2, want_priority=7, priorities={"prod": 7}),
    Case("long-name", batch_job(name="x" * 63), want_count=2),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_cli_and_controller_derive_the_same_workload(case: Case) -> None:
    from_file = workload_from_job(case.job, case.priorities)
    document = integrations.workload_for("Job", case.job, case.priorities)
    assert from_file is not None
    assert document is not None
    from_controller = parse_workload(document, "v1beta2", case.priorities)
    for got in (from_file, from_controller):
        assert got.key == from_file.key
        assert got.queue_name == "team"
        assert got.priority == case.want_priority
        assert [(ps.name, ps.count) for ps in got.pod_sets] == [("main", case.want_count)]
        assert got.pod_sets[0].template.requests == from_file.pod_sets[0].template.requests
    assert len(from_file.name) <= 63
    assert from_file.name.startswith("job-")


@pytest.mark.parametrize(
    ("parallelism", "completions", "min_parallelism"),
    [(4, None, "2"), (4, 4, "1"), (6, 3, "3"), (4, None, "4")],
)
def test_both_paths_honour_job_min_parallelism(
    parallelism: int, completions: int | None, min_parallelism: str
) -> None:
    job = batch_job(
        parallelism=parallelism,
        completions=completions,
        annotations={labels.MIN_PARALLELISM: min_parallelism},
    )
    from_file = workload_from_job(job, {})
    document = integrations.workload_for("Job", job, {})
    assert from_file is not None
    assert document is not None
    assert document["spec"]["podSets"][0]["minCount"] == int(min_parallelism)
    from_controller = parse_workload(document, "v1beta2", {})
    assert from_controller.key == from_file.key
    assert from_controller.pod_sets == from_file.pod_sets
    assert from_file.pod_sets[0].min_count == int(min_parallelism)


@pytest.mark.parametrize("value", ["0", "5", "-1", "two", ""])
def test_an_invalid_min_parallelism_is_an_error_in_a_file_and_ignored_by_the_controller(value: str) -> None:
    job = batch_job(parallelism=4, annotations={labels.MIN_PARALLELISM: value})
    with pytest.raises(InputError) as raised:
        workload_from_job(job, {})
    assert raised.value.field == f"metadata.annotations[{labels.MIN_PARALLELISM}]"
    document = integrations.workload_for("Job", job, {})
    assert document is not None
    assert "minCount" not in document["spec"]["podSets"][0]
    assert integrations.released_job("Job", job, "wl", {}, counts={"main": 4})["spec"]["parallelism"] == 4


def test_a_partially_admitted_job_runs_the_admitted_count_and_gets_its_own_back_when_stopped() -> None:
    job = batch_job(parallelism=4, completions=4, annotations={labels.MIN_PARALLELISM: "2"})
    released = integrations.released_job("Job", job, "wl", {}, counts={"main": 2})
    assert released["spec"]["parallelism"] == 2
    assert released["spec"]["completions"] == 4, "completions follow only with the opt-in annotation"
    assert job["spec"]["parallelism"] == 4, "the observed job is left as it was"
    stopped = integrations.suspended_job("Job", released, {"main": 4})
    assert (stopped["spec"]["parallelism"], stopped["spec"]["suspend"]) == (4, True)

    job["metadata"]["annotations"][labels.COMPLETIONS_EQUAL_PARALLELISM] = "true"
    released = integrations.released_job("Job", job, "wl", {}, counts={"main": 2})
    assert (released["spec"]["parallelism"], released["spec"]["completions"]) == (2, 2)
    stopped = integrations.suspended_job("Job", released, {"main": 4})
    assert (stopped["spec"]["parallelism"], stopped["spec"]["completions"]) == (4, 4)


def test_a_job_without_partial_admission_keeps_its_parallelism() -> None:
    job = batch_job(parallelism=4)
    assert integrations.released_job("Job", job, "wl", {}, counts={"main": 2})["spec"]["parallelism"] == 4
    assert integrations.suspended_job("Job", job, {"main": 2})["spec"]["parallelism"] == 4


def test_names_differ_by_uid_or_namespace() -> None:
    assert workload_name("Job", "a", "u-1") != workload_name("Job", "a", "u-2")
    no_uid = [workload_from_job(batch_job(uid=None, namespace=ns), {}) for ns in ("a", "b")]
    assert no_uid[0] is not None
    assert no_uid[1] is not None
    assert no_uid[0].name != no_uid[1].name


def test_unqueued_job_has_no_workload() -> None:
    job = batch_job()
    job["metadata"]["labels"].pop(labels.QUEUE_NAME_LABEL)
    assert workload_from_job(job, {}) is None
    assert integrations.workload_for("Job", job, {}) is None


def test_one_spelling_per_key() -> None:
    keys = {name: value for name, value in vars(labels).items() if name.isupper()}
    assert len(set(keys.values())) == len(keys), "two constants share one key"


@pytest.mark.parametrize(
    ("module", "name", "key"),
    [
        (core_scheduler, "WORKLOAD_LABEL", labels.KUEUE_WORKLOAD_LABEL),
        (k8s_controller, "DEVICES_ANNOTATION", labels.DEVICES_ANNOTATION),
        (k8s_controller, "HOSTNAME", labels.HOSTNAME_LABEL),
        (reaper_cluster, "QUEUE_LABEL", labels.QUEUE_NAME_LABEL),
        (insight_usage, "QUEUE_NAME_LABEL", labels.QUEUE_NAME_LABEL),
        (provisioning, "WORKLOAD_LABEL", labels.PROVISIONING_WORKLOAD_LABEL),
    ],
    ids=lambda v: v if isinstance(v, str) and "/" not in v else "",
)
def test_old_names_are_the_one_key(module: object, name: str, key: str) -> None:
    assert getattr(module, name) is key


def test_workload_label_names_two_keys_on_purpose() -> None:
    # Kueue's key ties a pod to its workload for the core; gpuplane's own selects the pods the
    # webhook manages. Both are stamped on released pods; they must not collapse into one.
    assert labels.KUEUE_WORKLOAD_LABEL != labels.WORKLOAD_LABEL
    released = integrations.released_job("Job", batch_job(), "wl-1", {})
    pod_labels = released["spec"]["template"]["metadata"]["labels"]
    assert pod_labels[labels.KUEUE_WORKLOAD_LABEL] == pod_labels[labels.WORKLOAD_LABEL] == "wl-1"
