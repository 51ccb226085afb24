"""A spot node taken back, end to end on a real API server (the ``real_kube`` control plane).

The ClusterQueue offers a spot flavor first and an on-demand flavor second. A training job runs on the
spot node and has checkpointed once. The test plays Karpenter: it taints the spot node
``karpenter.sh/disrupted:NoSchedule``. What is checked, in order:

- the checkpoint request: the Workload and the job's pod are annotated with the request time and the
  deadline (the grace the Workload asks for);
- the grace: before the deadline nothing is evicted;
- the eviction: Evicted with reason NodeInterrupted, the pod evicted, the quota given back;
- the requeue: admitted again, now on the on-demand flavor, bound to the on-demand node, with its
  ``gpuplane.dev/last-checkpoint`` annotation unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.fixtures import RealCluster
from controller_harness import POOL_LABEL, Scene, Webhooks, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s.spot import DEADLINE, GRACE, REQUESTED
from gpuplane.model.fields import lenient_timestamp
from gpuplane.model.labels import CHECKPOINT_ANNOTATION
from manifests import node, resource_flavor
from realkube import RealKube

pytestmark = pytest.mark.timeout(120)

CAPACITY_TYPE = "karpenter.sh/capacity-type"
CHECKPOINTED = "2026-12-01T10:00:00Z"
GRACE_SECONDS = 4


@pytest.fixture
def real_scene(real_kube: RealKube, webhooks: Webhooks) -> Iterator[Scene]:
    webhooks.ensure(str(real_kube.kubeconfig))
    yield from make_scene(RealCluster(real_kube.kubeconfig), real_kube.kubectl)


def spot_then_on_demand(scene: Scene) -> tuple[str, str]:
    """Flavors spot and on-demand (8 GPUs of quota each), one Node of each; returns the node names."""
    cq = scene.setup(nodes=0, quota_gpus=8)
    names = []
    for capacity in ("spot", "on-demand"):
        flavor = f"{scene.prefix}-{capacity}"
        labels = {POOL_LABEL: scene.prefix, CAPACITY_TYPE: capacity}
        scene._create(k8s.RESOURCE_FLAVORS, resource_flavor(flavor).set("spec.nodeLabels", labels).to_dict())
        name = f"{scene.prefix}-{capacity}-n0"
        body = (
            node(name)
            .allocatable(cpu="64", memory="512Gi", pods="110", gpu=8)
            .label(POOL_LABEL, scene.prefix)
            .label(CAPACITY_TYPE, capacity)
            .label("kubernetes.io/hostname", name)
            .to_dict()
        )
        scene._create(k8s.NODES, body)
        names.append(name)
    queue = scene.api.get(k8s.CLUSTER_QUEUES, cq)
    queue["spec"]["resourceGroups"] = [
        {
            "coveredResources": ["cpu", "nvidia.com/gpu"],
            "flavors": [
                {
                    "name": f"{scene.prefix}-{capacity}",
                    "resources": [
                        {"name": "cpu", "nominalQuota": "1000"},
                        {"name": "nvidia.com/gpu", "nominalQuota": 8},
                    ],
                }
                for capacity in ("spot", "on-demand")
            ],
        }
    ]
    scene.api.replace(k8s.CLUSTER_QUEUES, queue)
    return names[0], names[1]


def annotate(scene: Scene, wl: dict[str, Any], **annotations: str) -> None:
    current = scene.api.get(k8s.WORKLOADS, wl["metadata"]["name"], scene.namespace)
    current["metadata"].setdefault("annotations", {}).update(annotations)
    scene.api.replace(k8s.WORKLOADS, current)


def flavor_of(wl: dict[str, Any]) -> str:
    admission = (wl.get("status") or {}).get("admission") or {}
    return str(admission.get("podSetAssignments", [{}])[0].get("flavors", {}).get("nvidia.com/gpu", ""))


def evicted(wl: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in (wl.get("status") or {}).get("conditions") or [] if c["type"] == "Evicted"), {})


def test_a_spot_interruption_checkpoints_evicts_and_requeues_on_demand(real_scene: Scene) -> None:
    scene = real_scene
    spot_node, on_demand_node = spot_then_on_demand(scene)
    scene.controller(leader_election=False)
    scene.job_controller()
    scene.submit(scene.job("train", gpus=8))
    wait_until(lambda: scene.bound("train", 1), 40, "the training pod bound")
    wl = scene.workloads()["train"]
    assert flavor_of(wl) == f"{scene.prefix}-spot"
    assert scene.pods("train")[0]["spec"]["nodeName"] == spot_node
    annotate(scene, wl, **{CHECKPOINT_ANNOTATION: CHECKPOINTED, GRACE: str(GRACE_SECONDS)})

    tainted = scene.api.get(k8s.NODES, spot_node)
    tainted["spec"]["taints"] = [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]
    scene.api.replace(k8s.NODES, tainted)

    # The checkpoint request, on the Workload and on the pod the job runs in.
    wl = wait_until(
        lambda: (w := scene.workloads()["train"])["metadata"].get("annotations", {}).get(REQUESTED) and w,
        20,
        "the checkpoint request",
    )
    marks = wl["metadata"]["annotations"]
    requested, deadline = lenient_timestamp(marks[REQUESTED]), lenient_timestamp(marks[DEADLINE])
    assert requested is not None
    assert deadline is not None
    assert deadline - requested == pytest.approx(GRACE_SECONDS, abs=0.01)
    pod = scene.pods("train")[0]
    assert pod["metadata"]["annotations"][DEADLINE] == marks[DEADLINE]
    # The grace: nothing is evicted before the deadline.
    assert not evicted(wl)
    assert (wl["status"] or {}).get("admission")

    # The eviction, once the grace is over.
    condition = wait_until(lambda: evicted(scene.workloads()["train"]), 30, "the eviction")
    assert time.time() >= deadline - 0.5
    assert condition["reason"] == "NodeInterrupted"
    assert spot_node in condition["message"]
    assert lenient_timestamp(condition["lastTransitionTime"]) >= deadline - 0.01

    # The requeue: admitted again on the on-demand flavor, with its checkpoint time kept.
    wl = wait_until(
        lambda: flavor_of(w := scene.workloads()["train"]) == f"{scene.prefix}-on-demand" and w,
        40,
        "admitted again on on-demand",
    )
    assert wl["metadata"]["annotations"][CHECKPOINT_ANNOTATION] == CHECKPOINTED
    wait_until(
        lambda: scene.bound("train", 1) and scene.pods("train")[0]["spec"]["nodeName"] == on_demand_node,
        40,
        "the pod bound to the on-demand node",
    )
    wl = scene.workloads()["train"]
    assert REQUESTED not in wl["metadata"].get("annotations", {}), "a later interruption starts anew"
