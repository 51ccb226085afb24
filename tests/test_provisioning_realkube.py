"""ProvisioningRequest for gangs, end to end on a real API server (the ``real_kube`` control plane).

The test plays the cluster autoscaler: it reads the ProvisioningRequest the controller made, sets its
conditions through the status subresource, and adds the Nodes. What is checked:

- a gang that has quota but no place triggers exactly one ProvisioningRequest, with a PodTemplate for
  its pod set and the gang's whole count;
- it is admitted only once the request is Provisioned *and* every pod has a node: Provisioned with
  half the nodes is not enough;
- it is then bound whole, its pods carrying ``autoscaling.x-k8s.io/consume-provisioning-request``;
- a Failed request evicts the gang (reason AdmissionCheck), gives its quota to the next workload,
  and requeues it; the next attempt is a second request.

The ProvisioningRequest CRD (``autoscaling.x-k8s.io/v1``) is installed when missing and never deleted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.fixtures import RealCluster
from controller_harness import CRDS, Scene, Webhooks, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.provisioning import ATOMIC_SCALE_UP, CONSUME_ANNOTATION
from realkube import RealKube

pytestmark = pytest.mark.timeout(120)

PROV = "kueue.x-k8s.io/provisioning-request"
PROVISIONING_REQUEST_CRD: dict[str, Any] = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "provisioningrequests.autoscaling.x-k8s.io"},
    "spec": {
        "group": "autoscaling.x-k8s.io",
        "names": {
            "kind": "ProvisioningRequest",
            "listKind": "ProvisioningRequestList",
            "plural": "provisioningrequests",
            "singular": "provisioningrequest",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture
def real_scene(real_kube: RealKube, webhooks: Webhooks) -> Iterator[Scene]:
    webhooks.ensure(str(real_kube.kubeconfig))
    yield from make_scene(RealCluster(real_kube.kubeconfig), real_kube.kubectl)


def provisioned_queue(
    scene: Scene, *, quota_gpus: int, backoff_limit: int = 3, backoff_seconds: int = 60
) -> str:
    """The scene's ClusterQueue (no nodes yet) with a ProvisioningRequest admission check."""
    cq = scene.setup(nodes=0, quota_gpus=quota_gpus)
    with contextlib.suppress(ApiError):  # 409: installed meanwhile
        scene.api.get(CRDS, PROVISIONING_REQUEST_CRD["metadata"]["name"])
    try:
        scene.api.get(CRDS, PROVISIONING_REQUEST_CRD["metadata"]["name"])
    except ApiError:
        with contextlib.suppress(ApiError):
            scene.api.create(CRDS, PROVISIONING_REQUEST_CRD)
    wait_until(lambda: _served(scene), 30, "provisioningrequests served")
    config = f"{scene.prefix}-prov"
    scene._create(
        k8s.PROVISIONING_CONFIGS,
        {
            "apiVersion": f"{k8s.KUEUE}/v1beta2",
            "kind": "ProvisioningRequestConfig",
            "metadata": {"name": config},
            "spec": {
                "provisioningClassName": ATOMIC_SCALE_UP,
                "retryStrategy": {"backoffLimitCount": backoff_limit, "backoffBaseSeconds": backoff_seconds},
            },
        },
    )
    scene._create(
        k8s.ADMISSION_CHECKS,
        {
            "apiVersion": f"{k8s.KUEUE}/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": config},
            "spec": {
                "controllerName": PROV,
                "parameters": {"apiGroup": k8s.KUEUE, "kind": "ProvisioningRequestConfig", "name": config},
            },
        },
    )
    queue = scene.api.get(k8s.CLUSTER_QUEUES, cq)
    queue["spec"]["admissionChecks"] = [config]
    scene.api.replace(k8s.CLUSTER_QUEUES, queue)
    return config


def _served(scene: Scene) -> bool:
    try:
        scene.api.list(k8s.PROVISIONING_REQUESTS, scene.namespace, limit=1)
    except ApiError:
        return False
    return True


def requests(scene: Scene) -> list[dict[str, Any]]:
    return sorted(scene.list(k8s.PROVISIONING_REQUESTS), key=lambda r: r["metadata"]["name"])


def set_conditions(scene: Scene, name: str, **conditions: str) -> None:
    """Play the autoscaler: set the request's conditions (``Provisioned="True"``, ...)."""
    req = scene.api.get(k8s.PROVISIONING_REQUESTS, name, scene.namespace)
    req["status"] = {
        "conditions": [
            {
                "type": ctype,
                "status": value,
                "reason": ctype,
                "message": f"{ctype} by the test's autoscaler",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
            for ctype, value in conditions.items()
        ]
    }
    scene.api.replace(k8s.PROVISIONING_REQUESTS, req, sub="status")


def condition(obj: dict[str, Any] | None, ctype: str) -> dict[str, Any]:
    return next(
        (c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == ctype), {}
    )


def check_state(scene: Scene, job: str) -> str:
    wl = scene.workloads().get(job) or {}
    states = (wl.get("status") or {}).get("admissionChecks") or [{}]
    return str(states[0].get("state", ""))


def test_a_gang_scales_up_whole_through_one_provisioning_request(real_scene: Scene) -> None:
    scene = real_scene
    provisioned_queue(scene, quota_gpus=32)
    run = scene.controller(leader_election=False)
    scene.job_controller()
    scene.submit(scene.job("gang", pods=4, gpus=8))

    [request] = wait_until(lambda: requests(scene), 30, "a ProvisioningRequest for the gang")
    wl = scene.workloads()["gang"]
    assert condition(wl, "QuotaReserved").get("status") == "True"
    assert condition(wl, "Admitted").get("status") != "True"
    assert check_state(scene, "gang") == "Pending"
    assert request["spec"]["provisioningClassName"] == ATOMIC_SCALE_UP
    [pod_set] = request["spec"]["podSets"]
    assert pod_set["count"] == 4
    template = scene.api.get(k8s.POD_TEMPLATES, pod_set["podTemplateRef"]["name"], scene.namespace)
    assert template["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] == "8"
    assert request["metadata"]["ownerReferences"][0]["name"] == wl["metadata"]["name"]
    assert scene.jobs()["gang"]["spec"]["suspend"] is True

    # Accepted, and half the nodes come: nothing is admitted or started.
    set_conditions(scene, request["metadata"]["name"], Accepted="True")
    scene.add_nodes(2)
    run.wait_passes(5, 20)
    assert check_state(scene, "gang") == "Pending"
    assert not scene.pods("gang")
    # Provisioned, still with half the nodes: the check passes, the gang still has no place.
    set_conditions(scene, request["metadata"]["name"], Accepted="True", Provisioned="True")
    wait_until(lambda: check_state(scene, "gang") == "Ready", 20, "the check Ready")
    run.wait_passes(5, 20)
    assert condition(scene.workloads()["gang"], "Admitted").get("status") != "True"
    assert scene.jobs()["gang"]["spec"]["suspend"] is True
    # The rest of the nodes register: admitted, released and bound whole.
    nodes = set(scene.add_nodes(2)) | {f"{scene.prefix}-n0", f"{scene.prefix}-n1"}
    wait_until(
        lambda: condition(scene.workloads()["gang"], "Admitted").get("status") == "True", 30, "admitted"
    )
    wait_until(lambda: scene.bound("gang", 4), 60, "the gang bound")
    pods = scene.pods("gang")
    assert {p["spec"]["nodeName"] for p in pods} == nodes
    for pod in pods:
        assert pod["metadata"]["annotations"][CONSUME_ANNOTATION] == request["metadata"]["name"]
        assert pod["metadata"]["annotations"]["karpenter.sh/do-not-disrupt"] == "true"  # a gang
    assert len(requests(scene)) == 1, "one request for the whole gang"


def test_a_failed_request_releases_the_quota_and_requeues_the_gang(real_scene: Scene) -> None:
    scene = real_scene
    provisioned_queue(scene, quota_gpus=32, backoff_limit=3, backoff_seconds=1)
    scene.controller(leader_election=False)
    scene.job_controller()
    scene.submit(scene.job("gang", pods=4, gpus=8))
    [first] = wait_until(lambda: requests(scene), 30, "the gang's ProvisioningRequest")
    scene.submit(scene.job("small", gpus=8))
    wait_until(
        lambda: (
            condition(scene.workloads().get("small"), "QuotaReserved").get("reason") == "WaitingForQuota"
            or condition(scene.workloads().get("small"), "QuotaReserved").get("status") == "False"
        ),
        20,
        "the small job waits: the gang holds all the quota",
    )
    assert condition(scene.workloads()["small"], "QuotaReserved").get("status") == "False"

    set_conditions(scene, first["metadata"]["name"], Failed="True")
    evicted = wait_until(
        lambda: condition(scene.workloads()["gang"], "Evicted") or None, 30, "the gang evicted by its check"
    )
    assert evicted["reason"] == "AdmissionCheck"
    assert first["metadata"]["name"] in evicted["message"]
    # The small job gets quota only once the gang has given it back, never both at once.
    small = wait_until(
        lambda: (w := scene.workloads())["small"]["status"].get("admission") and w,
        30,
        "the small job holds the released quota",
    )
    gang = scene.workloads()["gang"]
    assert not (gang.get("status") or {}).get("admission")
    assert condition(gang, "QuotaReserved").get("status") == "False"
    released = condition(gang, "QuotaReserved")["lastTransitionTime"]
    assert released <= condition(small["small"], "QuotaReserved")["lastTransitionTime"]
    # The gang is queued again: once the small job goes, it is reserved again and makes attempt 2.
    scene.delete_job("small")
    wait_until(
        lambda: len([r for r in requests(scene) if "gang" in r["metadata"]["name"]]) == 2, 40, "attempt 2"
    )
    names = [
        r["metadata"]["name"] for r in requests(scene) if r["metadata"]["name"] != first["metadata"]["name"]
    ]
    assert any(n.endswith("-2") for n in names), names
