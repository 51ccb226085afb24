"""The webhook's job guardrail: queued jobs of every integrated kind are suspended at creation.

Pure functions over AdmissionReviews; the patch is applied with the API-server double's own JSON
patch code, so what is checked is the object the API server would store.
"""

from __future__ import annotations

import base64
import json
import threading
import urllib.request
from typing import Any

import pytest
from typer.main import get_command

from apiserver.patch import json_patch
from gpuplane.cli.app import build_app
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.webhook import DEFAULT_LOCAL_QUEUE, WebhookSettings, job_patch, review, serve
from gpuplane.model import labels as keys
from gpuplane.model.jobs import get_path

MANAGE_ALL = WebhookSettings(manage_jobs_without_queue_name=True)
SUSPENDABLE = [kind for kind, i in jobs.INTEGRATIONS.items() if i.suspend is not None]


def job_object(
    kind: str = "Job",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owner: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "train", "namespace": "ml"}
    if labels is not None:
        meta["labels"] = labels
    if annotations is not None:
        meta["annotations"] = annotations
    if owner is not None:
        meta["ownerReferences"] = [owner]
    return {
        "apiVersion": jobs.INTEGRATIONS[kind].resource.api_version,
        "kind": kind,
        "metadata": meta,
        "spec": {} if spec is None else spec,
    }


def admitted(
    obj: dict[str, Any], settings: WebhookSettings | None = None, kind: str | None = None
) -> dict[str, Any]:
    """``obj`` as the API server stores it after the webhook's answer to a CREATE review."""
    kind = kind or obj["kind"]
    group = jobs.INTEGRATIONS[kind].resource.group if kind in jobs.INTEGRATIONS else ""
    request = {
        "uid": "r1",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "operation": "CREATE",
        "object": obj,
    }
    answer = review({"request": request}, settings)["response"]
    assert answer["uid"] == "r1"
    assert answer["allowed"] is True
    if "patch" not in answer:
        return obj
    assert answer["patchType"] == "JSONPatch"
    patched: dict[str, Any] = json_patch(obj, json.loads(base64.b64decode(answer["patch"])))
    return patched


def suspended(kind: str, obj: dict[str, Any]) -> bool:
    return jobs.is_suspended(kind, obj)


@pytest.mark.parametrize("kind", SUSPENDABLE)
def test_a_queued_job_of_every_suspendable_kind_is_suspended(kind: str) -> None:
    obj = job_object(kind, labels={keys.QUEUE_NAME_LABEL: "team"})
    stored = admitted(obj)
    assert suspended(kind, stored)
    assert stored["metadata"]["labels"] == {keys.QUEUE_NAME_LABEL: "team"}


@pytest.mark.parametrize(
    ("spec", "want_spec"),
    [
        pytest.param({}, {"suspend": True}, id="no-suspend-field"),
        pytest.param(
            {"suspend": False, "parallelism": 2}, {"suspend": True, "parallelism": 2}, id="explicit-false"
        ),
        pytest.param({"suspend": True}, {"suspend": True}, id="already-suspended"),
    ],
)
def test_a_batch_job_is_suspended_whatever_it_asked(spec: dict[str, Any], want_spec: dict[str, Any]) -> None:
    obj = job_object(labels={keys.QUEUE_NAME_LABEL: "team"}, spec=spec)
    assert admitted(obj)["spec"] == want_spec


def test_an_already_suspended_job_gets_no_patch() -> None:
    obj = job_object(labels={keys.QUEUE_NAME_LABEL: "team"}, spec={"suspend": True})
    assert job_patch("Job", obj) == []


@pytest.mark.parametrize(
    ("spec", "want_run_policy"),
    [
        pytest.param({}, {"suspend": True}, id="no-run-policy"),
        pytest.param(
            {"runPolicy": {"backoffLimit": 3}}, {"backoffLimit": 3, "suspend": True}, id="run-policy"
        ),
    ],
)
def test_a_pytorch_job_is_suspended_under_its_run_policy(
    spec: dict[str, Any], want_run_policy: dict[str, Any]
) -> None:
    obj = job_object("PyTorchJob", labels={keys.QUEUE_NAME_LABEL: "team"}, spec=spec)
    stored = admitted(obj)
    assert get_path(stored, ("spec", "runPolicy")) == want_run_policy


def test_the_queue_name_annotation_counts_as_kueue_reads_it() -> None:
    obj = job_object(annotations={keys.QUEUE_NAME_LABEL: "team"})
    assert suspended("Job", admitted(obj))


@pytest.mark.parametrize(
    ("owner", "want_suspended"),
    [
        pytest.param(
            {
                "apiVersion": "jobset.x-k8s.io/v1alpha2",
                "kind": "JobSet",
                "name": "js",
                "uid": "u",
                "controller": True,
            },
            False,
            id="jobset-child-waits-in-its-jobset",
        ),
        pytest.param(
            {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u", "controller": True},
            True,
            id="cronjob-child-is-queued",
        ),
        pytest.param(
            {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "name": "js", "uid": "u"},
            True,
            id="non-controller-owner",
        ),
        pytest.param(
            {"apiVersion": "example.com/v1", "kind": "JobSet", "name": "js", "uid": "u", "controller": True},
            True,
            id="same-kind-other-group",
        ),
    ],
)
def test_children_of_an_integrated_kind_are_left_to_their_owner(
    owner: dict[str, Any], want_suspended: bool
) -> None:
    obj = job_object(labels={keys.QUEUE_NAME_LABEL: "team"}, owner=owner)
    assert suspended("Job", admitted(obj)) is want_suspended


@pytest.mark.parametrize(
    ("labels", "settings", "want_suspended", "want_queue"),
    [
        pytest.param(None, None, False, None, id="no-labels-unmanaged"),
        pytest.param({"app": "x"}, WebhookSettings(), False, None, id="other-labels-unmanaged"),
        pytest.param(None, MANAGE_ALL, True, DEFAULT_LOCAL_QUEUE, id="no-labels-managed"),
        pytest.param({"app": "x"}, MANAGE_ALL, True, DEFAULT_LOCAL_QUEUE, id="other-labels-managed"),
        pytest.param({keys.QUEUE_NAME_LABEL: "team"}, MANAGE_ALL, True, "team", id="named-queue-kept"),
    ],
)
def test_manage_jobs_without_queue_name(
    labels: dict[str, str] | None,
    settings: WebhookSettings | None,
    want_suspended: bool,
    want_queue: str | None,
) -> None:
    stored = admitted(job_object(labels=labels), settings)
    assert suspended("Job", stored) is want_suspended
    assert (stored["metadata"].get("labels") or {}).get(keys.QUEUE_NAME_LABEL) == want_queue
    if labels:
        assert labels.items() <= stored["metadata"]["labels"].items()


def test_manage_jobs_without_queue_name_leaves_pods_and_gated_kinds_alone() -> None:
    lws = job_object("LeaderWorkerSet")
    assert admitted(lws, MANAGE_ALL) == lws
    pod = {"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {"containers": []}}
    answer = review(
        {"request": {"uid": "r", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod}}, MANAGE_ALL
    )
    assert "patch" not in answer["response"]


@pytest.mark.parametrize(
    "request_",
    [
        pytest.param({"operation": "UPDATE"}, id="update"),
        pytest.param({"kind": {"group": "example.com", "version": "v1", "kind": "Job"}}, id="other-group"),
        pytest.param({"kind": {"group": "batch", "version": "v1", "kind": "CronJob"}}, id="not-integrated"),
    ],
)
def test_only_integrated_kinds_at_create(request_: dict[str, Any]) -> None:
    obj = job_object(labels={keys.QUEUE_NAME_LABEL: "team"})
    body = {
        "uid": "r",
        "kind": {"group": "batch", "version": "v1", "kind": "Job"},
        "operation": "CREATE",
        "object": obj,
    }
    answer = review({"request": {**body, **request_}})["response"]
    assert answer["allowed"] is True
    assert "patch" not in answer


def test_a_label_key_with_a_slash_is_escaped_in_the_pointer() -> None:
    ops = job_patch("Job", job_object(labels={"app": "x"}), MANAGE_ALL)
    assert ops[0] == {"op": "add", "path": "/metadata/labels/kueue.x-k8s.io~1queue-name", "value": "default"}


def test_the_served_webhook_applies_its_settings() -> None:
    """``gpuplane webhook --manage-jobs-without-queue-name`` reaches the answers it serves."""
    command = getattr(get_command(build_app()), "commands", {})["webhook"]
    assert command.make_context("webhook", []).params["manage_jobs_without_queue_name"] is False
    parsed = command.make_context("webhook", ["--manage-jobs-without-queue-name"]).params
    assert parsed["manage_jobs_without_queue_name"] is True
    server = serve(0, host="127.0.0.1", settings=MANAGE_ALL)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        obj = job_object(labels={"app": "x"})
        request = {"uid": "r", "kind": {"group": "batch", "version": "v1", "kind": "Job"}, "object": obj}
        body = json.dumps({"request": {**request, "operation": "CREATE"}}).encode()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        with urllib.request.urlopen(
            urllib.request.Request(url, data=body, method="POST"), timeout=5
        ) as answer:
            response = json.loads(answer.read())["response"]
        ops = json.loads(base64.b64decode(response["patch"]))
        stored = json_patch(obj, ops)
        assert stored["spec"]["suspend"] is True
        assert stored["metadata"]["labels"][keys.QUEUE_NAME_LABEL] == DEFAULT_LOCAL_QUEUE
    finally:
        server.shutdown()
        server.server_close()
