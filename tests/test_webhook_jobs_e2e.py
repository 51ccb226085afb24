"""Kueue's guardrail end to end: a Job created with plain kubectl, carrying only its queue name (no
``suspend``, no scheduler name), is suspended at creation by gpuplane's webhook, admitted by the
controller, released, and its pods are bound by gpuplane, never by kube-scheduler.

On a real control plane (``GPUPLANE_E2E_KUBECONFIG``) the API server calls ``gpuplane webhook``,
registered for pods and jobs (:class:`controller_harness.RegisteredWebhook`), and kube-scheduler runs
beside gpuplane. On the API-server double, which calls no webhooks, ``Scene.submit`` applies the
webhook's own answer in-process.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from apiserver.fixtures import Cluster, manifest
from apiserver.server import ApiServerDouble
from controller_harness import CONTROLLER_AGENT, Scene, wait_until, webhook_admit
from gpuplane.k8s import api as k8s
from gpuplane.model.labels import QUEUE_NAME_LABEL, SCHEDULER_NAME, WORKLOAD_LABEL
from manifests import Manifest

pytestmark = pytest.mark.timeout(90)


def plain_job(scene: Scene, name: str, *, pods: int, gpus: int, annotation: bool = False) -> Manifest:
    """A queued Job as a user writes it: the queue name (label, or Kueue's older annotation) and
    nothing else of Kueue's or gpuplane's."""
    built = scene.job(name, pods=pods, gpus=gpus)
    built.body["spec"].pop("suspend")
    if annotation:
        queue = built.body["metadata"]["labels"].pop(QUEUE_NAME_LABEL)
        built.body["metadata"].setdefault("annotations", {})[QUEUE_NAME_LABEL] = queue
    assert "schedulerName" not in built.body["spec"]["template"]["spec"]
    return built


def scheduler_events(scene: Scene) -> list[dict[str, Any]]:
    """Events kube-scheduler wrote about the scene's pods (Scheduled, FailedScheduling)."""
    return [
        e
        for e in scene.list(k8s.EVENTS)
        if "default-scheduler" in (e.get("reportingComponent"), (e.get("source") or {}).get("component"))
    ]


JOBS = [  # name, pods, GPUs per pod, queue name as an annotation: a 2-pod gang and a single pod
    ("gang", 2, 4, False),
    ("annotated", 1, 2, True),
]


def test_a_job_created_unsuspended_with_a_queue_name_waits_for_gpuplane(
    scene: Scene, apiserver: Cluster
) -> None:
    cq = scene.setup(nodes=2)
    scene.job_controller()
    scene.submit(*(plain_job(scene, n, pods=p, gpus=g, annotation=a) for n, p, g, a in JOBS))

    # Suspended at creation, so the Job controller made no pod, and nobody could bind one.
    jobs = scene.jobs()
    for name, *_ in JOBS:
        assert jobs[name]["spec"]["suspend"] is True, f"{name}: not suspended at creation"
    assert scene.pods() == []

    scene.controller(leader_election=False)
    wait_until(lambda: all(scene.bound(n, p) for n, p, *_ in JOBS), 30, "every pod of both jobs bound")

    workloads, jobs = scene.workloads(), scene.jobs()
    for name, count, _, _ in JOBS:
        assert workloads[name]["status"]["admission"]["clusterQueue"] == cq
        assert jobs[name]["spec"]["suspend"] is False, f"{name}: released"
        pods = scene.pods(name)
        assert len(pods) == count
        for pod in pods:
            assert pod["spec"]["schedulerName"] == SCHEDULER_NAME, "the webhook handed the pod to gpuplane"
            assert pod["metadata"]["labels"][WORKLOAD_LABEL] == workloads[name]["metadata"]["name"]
            assert pod["spec"]["nodeName"].startswith(scene.prefix)
    assert scheduler_events(scene) == [], "kube-scheduler touched none of the pods"

    if isinstance(apiserver, ApiServerDouble):
        binders = {
            e.request.user_agent.split("/")[0]
            for e in apiserver.requests.find(verb="create", resource="pods", subresource="binding")
            if e.request.namespace == scene.namespace
        }
        assert binders == {CONTROLLER_AGENT}


def test_a_job_without_a_queue_name_is_left_alone(scene: Scene) -> None:
    """The webhook is registered for every Job, but suspends only queued ones (by default)."""
    scene.setup(nodes=1)
    job = scene.job("free", gpus=1)
    job.body["spec"].pop("suspend")
    job.body["metadata"]["labels"].pop(QUEUE_NAME_LABEL)
    body = job.to_dict() if scene.real else webhook_admit(job.to_dict())  # as Scene.submit sends it
    out = scene.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-", input=manifest(body))
    stored = json.loads(out.stdout)
    assert not stored["spec"].get("suspend")
    assert QUEUE_NAME_LABEL not in (stored["metadata"].get("labels") or {})
