"""The warm buffer, end to end on a real API server (the ``real_kube`` control plane).

A flavor annotated ``gpuplane.dev/warm-nodes: "1"`` gets one placeholder pod; the test plays the
default scheduler and binds it to the flavor's only node. A real job then takes that node at once: the
core does not count the placeholder, the controller deletes it before binding the job's pod there, and
makes it again (pending, for the autoscaler to bring the next warm node).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.fixtures import RealCluster
from controller_harness import Scene, Webhooks, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.model.objects import WARM_BUFFER_LABEL, WARM_NODES_ANNOTATION
from realkube import RealKube

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def real_scene(real_kube: RealKube, webhooks: Webhooks) -> Iterator[Scene]:
    webhooks.ensure(str(real_kube.kubeconfig))
    yield from make_scene(RealCluster(real_kube.kubeconfig), real_kube.kubectl)


def placeholders(scene: Scene) -> list[dict[str, Any]]:
    return [
        p
        for p in scene.list(k8s.PODS)
        if WARM_BUFFER_LABEL in (p["metadata"].get("labels") or {})
        and not p["metadata"].get("deletionTimestamp")
    ]


def test_a_real_job_takes_the_warm_node_and_the_buffer_is_made_again(real_scene: Scene) -> None:
    scene = real_scene
    scene.setup(nodes=1, quota_gpus=8)
    [node] = [
        n["metadata"]["name"] for n in scene.list(k8s.NODES) if n["metadata"]["name"].startswith(scene.prefix)
    ]
    flavor = scene.api.get(k8s.RESOURCE_FLAVORS, scene.flavor)
    flavor["metadata"].setdefault("annotations", {})[WARM_NODES_ANNOTATION] = "1"
    scene.api.replace(k8s.RESOURCE_FLAVORS, flavor)
    run = scene.controller(leader_election=False)
    scene.job_controller()

    [first] = wait_until(lambda: placeholders(scene), 20, "the placeholder pod")
    assert first["spec"]["nodeSelector"] == flavor["spec"]["nodeLabels"]
    assert first["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    if not first["spec"].get("nodeName"):  # play the default scheduler (no kubelet marks the node Ready)
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": first["metadata"]["name"], "namespace": scene.namespace},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        with contextlib.suppress(ApiError):  # 409: kube-scheduler bound it first
            scene.api.request(
                "POST", k8s.PODS.path(scene.namespace, first["metadata"]["name"], "binding"), body=binding
            )
    wait_until(
        lambda: all(p["spec"].get("nodeName") == node for p in placeholders(scene)), 20, "the warm node held"
    )
    run.wait_passes(3, 20)
    assert run.controller.counters.extra["warm_buffer_pods"] == 1

    scene.submit(scene.job("train", gpus=8))
    wait_until(lambda: scene.bound("train", 1), 40, "the job bound to the warm node")
    assert scene.pods("train")[0]["spec"]["nodeName"] == node
    # The placeholder made room and was made again, waiting for the next node.
    again = wait_until(
        lambda: [p for p in placeholders(scene) if p["metadata"]["uid"] != first["metadata"]["uid"]],
        20,
        "remade",
    )
    assert not again[0]["spec"].get("nodeName")
    with contextlib.suppress(ApiError):
        for pod in placeholders(scene):
            scene.api.delete(k8s.PODS, pod["metadata"]["name"], scene.namespace, gracePeriodSeconds=0)
