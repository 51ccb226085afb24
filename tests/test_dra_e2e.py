"""Dynamic Resource Allocation end to end: a fake driver's devices, Jobs with claim templates, the
controller allocating the claims and binding the pods, a restart, and the claims released.

A fake driver publishes ResourceSlices (``resource.k8s.io/v1``): two nodes of 8 GPUs, and one node
with a GPU partitioned into MIG-like devices that consume its shared counters (40 GiB of memory: two
2g partitions of 20 GiB or four 1g of 10 GiB, never more than the GPU has). Jobs whose pods use
ResourceClaimTemplates are queued in a ClusterQueue. kube-controller-manager's resource-claim
controller (the real one) makes each pod's claim; the controller admits the Jobs, writes each
claim's ``status.allocation`` and ``reservedFor`` (the API server validates them), then binds the
pods. A restarted controller reads the allocations back from the claims and hands out no device
twice; when the pods end, their claims are released and the devices go to the next Job.

It needs a real control plane (``GPUPLANE_E2E_KUBECONFIG``, ``scripts/kube-up.sh``): the API-server
double serves no ``resource.k8s.io`` kinds and runs no resource-claim controller.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any

import pytest
import yaml

from controller_harness import Scene, wait_until
from fake_kubelet import run_annotations
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.clusterstate import read_cluster
from gpuplane.k8s.dra_claims import DRA_RESOURCES, served_resources
from gpuplane.k8s.kueue_config import KUEUE_CONFIG_KEY, KueueConfigSource
from gpuplane.model import labels as keys
from gpuplane.model.records import recorded_claims
from manifests import Manifest

pytestmark = pytest.mark.timeout(150)

GIB = 1024**3


@pytest.fixture
def dra_scene(scene: Scene) -> Scene:
    if not served_resources(scene.api):
        pytest.skip(
            "this API server serves no resource.k8s.io/v1 (the double does not; run it on a real one)"
        )
    return scene


def _slice(name: str, driver: str, node: str, pool_count: int = 1, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": pool_count},
            **spec,
        },
    }


def _class(scene: Scene, driver: str, kind: str) -> dict[str, Any]:
    expression = f'device.driver == "{driver}" && device.attributes["{driver}"].type == "{kind}"'
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": f"{scene.prefix}-{kind}"},
        "spec": {"selectors": [{"cel": {"expression": expression}}]},
    }


def publish(scene: Scene, driver: str, nodes: list[str]) -> None:
    """The fake driver's DeviceClasses and slices: 8 GPUs on each of the first two nodes, a
    partitionable GPU on the third (shared counters in a slice of their own, as v1 wants)."""
    gpus, mig = nodes[0:2], nodes[2]
    for node in gpus:
        devices = [
            {"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "index": {"int": i}}}
            for i in range(8)
        ]
        scene._create(k8s.RESOURCE_SLICES, _slice(f"{node}-gpus", driver, node, devices=devices))
    counters = [{"name": "gpu-0", "counters": {"memory": {"value": "40Gi"}}}]
    scene._create(k8s.RESOURCE_SLICES, _slice(f"{mig}-counters", driver, mig, 2, sharedCounters=counters))
    parts = [(f"mig-1g-{i}", "1g", "10Gi") for i in range(4)] + [
        (f"mig-2g-{i}", "2g", "20Gi") for i in range(2)
    ]
    devices = [
        {
            "name": name,
            "attributes": {"type": {"string": "mig"}, "profile": {"string": profile}},
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": memory}}}],
        }
        for name, profile, memory in parts
    ]
    scene._create(k8s.RESOURCE_SLICES, _slice(f"{mig}-parts", driver, mig, 2, devices=devices))
    for kind in ("gpu", "mig"):
        scene._create(k8s.DEVICE_CLASSES, _class(scene, driver, kind))


def template(scene: Scene, name: str, kind: str, count: int = 1, profile: str | None = None) -> None:
    exactly: dict[str, Any] = {"deviceClassName": f"{scene.prefix}-{kind}", "count": count}
    if profile:
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["{scene.prefix}.example.com"].profile == "{profile}"'}}
        ]
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": scene.namespace},
        "spec": {"spec": {"devices": {"requests": [{"name": "dev", "exactly": exactly}]}}},
    }
    scene.api.create(k8s.RESOURCE_CLAIM_TEMPLATES, body, scene.namespace)


def claim_job(scene: Scene, name: str, tmpl: str, *, pods: int = 1, seconds: float = 600) -> Manifest:
    """A queued Job of ``pods`` pods, each with its own claim from ``tmpl``, running ``seconds``."""
    built = scene.job(name, pods=pods, gpus=0, annotations=run_annotations(seconds))
    spec = built.body["spec"]["template"]["spec"]
    spec["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": tmpl}]
    spec["containers"][0].setdefault("resources", {})["claims"] = [{"name": "devices"}]
    built.set("spec.backoffLimit", 0)
    return built


def claims(scene: Scene) -> list[dict[str, Any]]:
    return scene.list(k8s.RESOURCE_CLAIMS)


def allocated(scene: Scene) -> list[tuple[str, str, str]]:
    """Every (claim, node, device) the API server shows allocated."""
    out = []
    for claim in claims(scene):
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            continue
        term = allocation["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]
        node = term["values"][0]
        name = claim["metadata"]["name"]
        out += [(name, node, f"{r['pool']}/{r['device']}") for r in allocation["devices"]["results"]]
    return out


def no_device_twice(scene: Scene) -> list[tuple[str, str, str]]:
    got = allocated(scene)
    twice = [d for d, n in Counter(dev for _, _, dev in got).items() if n > 1]
    assert not twice, f"devices allocated twice: {twice}"
    return got


def partitions_fit(scene: Scene, mig_node: str) -> None:
    memory = {"mig-1g": 10, "mig-2g": 20}
    used = sum(
        memory[dev.split("/")[1].rsplit("-", 1)[0]] for _, node, dev in allocated(scene) if node == mig_node
    )
    assert used <= 40, f"partitions of the MIG GPU overlap: {used} GiB of 40 allocated"


def bound_pods(scene: Scene, job: str) -> list[dict[str, Any]]:
    return [p for p in scene.pods(job) if p.get("spec", {}).get("nodeName")]


def reserved_for_its_pod(scene: Scene, job: str) -> None:
    """Each bound pod's claim is allocated on the pod's node and reserved for that pod."""
    by_name = {c["metadata"]["name"]: c for c in claims(scene)}
    for pod in bound_pods(scene, job):
        (entry,) = pod["status"]["resourceClaimStatuses"]
        claim = by_name[entry["resourceClaimName"]]
        status = claim["status"]
        node = status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        assert node == pod["spec"]["nodeName"]
        assert {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]} in status[
            "reservedFor"
        ]
        assert pod["spec"]["schedulerName"] == "gpuplane", "kube-scheduler must not act on these pods"


def planned_devices(scene: Scene, *jobs: str) -> list[tuple[str, str]]:
    """Every (node, pool/device) the Workloads of ``jobs`` recorded as planned for their claims."""
    out = []
    for job in jobs:
        record = scene.workloads()[job]["metadata"]["annotations"][keys.PLACEMENT_ANNOTATION]
        for pods in recorded_claims(record).values():
            for node, planned in pods:
                out += [(node, f"{d.pool}/{d.device}") for devices in planned.values() for d in devices]
    return sorted(out)


def test_jobs_with_claim_templates_get_their_devices_across_a_restart(dra_scene: Scene) -> None:
    scene = dra_scene
    scene.setup(nodes=3, gpus_per_node=0)
    nodes = [f"{scene.prefix}-n{i}" for i in range(3)]
    driver = f"{scene.prefix}.example.com"
    publish(scene, driver, nodes)
    template(scene, "eight-gpus", "gpu", count=8)
    template(scene, "mig-2g", "mig", profile="2g")
    template(scene, "mig-1g", "mig", profile="1g")
    scene.job_controller()
    scene.kubelet()
    run = scene.controller(leader_election=False)

    # A gang of two pods with 8 GPUs each, two pods with a 2g partition each (the GPU's whole memory).
    scene.submit(claim_job(scene, "train", "eight-gpus", pods=2), claim_job(scene, "mig", "mig-2g", pods=2))
    wait_until(lambda: len(bound_pods(scene, "train")) == 2, 60, "the 8-GPU gang bound")
    wait_until(lambda: len(bound_pods(scene, "mig")) == 2, 60, "the two 2g pods bound")
    reserved_for_its_pod(scene, "train")
    reserved_for_its_pod(scene, "mig")
    got = no_device_twice(scene)
    assert len(got) == 2 * 8 + 2, got
    assert sorted(dev for _, node, dev in got if node == nodes[2]) == [
        f"{nodes[2]}/mig-2g-{i}" for i in range(2)
    ]
    assert sorted(pod["spec"]["nodeName"] for pod in bound_pods(scene, "train")) == nodes[0:2]
    partitions_fit(scene, nodes[2])
    assert run.controller.counters.extra.get("claims_allocated", 0) >= 4
    # The claims got the devices the plan recorded for them, not devices chosen again.
    assert sorted((node, dev) for _, node, dev in got) == planned_devices(scene, "train", "mig")
    assert run.controller.counters.extra.get("replanned_devices", 0) == 0

    # A 1g partition does not fit beside two 2g ones: the counters are spent.
    scene.submit(claim_job(scene, "small", "mig-1g", seconds=1))
    run.wait_passes(3, 20)
    assert not bound_pods(scene, "small"), "a partition overlapping the 2g ones was handed out"

    # A restart: the new controller reads the allocations back from the claims.
    run.stop()
    scene.submit(claim_job(scene, "more", "eight-gpus", seconds=1))
    again = scene.controller(leader_election=False)
    again.wait_passes(5, 30)
    assert not bound_pods(scene, "more"), "the restarted controller handed out GPUs held by claims"
    assert not bound_pods(scene, "small")
    no_device_twice(scene)
    partitions_fit(scene, nodes[2])

    # The gang ends: its claims are released, and the job behind it gets a node of 8 GPUs.
    scene.kubectl("delete", "job", "train", "-n", scene.namespace, "--wait=false")
    for pod in scene.pods("train"):
        with contextlib.suppress(ApiError):
            scene.api.delete(k8s.PODS, pod["metadata"]["name"], scene.namespace, gracePeriodSeconds=0)
    wait_until(
        lambda: len(bound_pods(scene, "more")) == 1, 60, "the next 8-GPU job bound into the freed GPUs"
    )
    reserved_for_its_pod(scene, "more")
    no_device_twice(scene)

    # It ends (after 1 s): as upstream, its pod leaves reservedFor and the claim, reserved for nobody,
    # is deallocated (by the controller or kube-controller-manager, whichever comes first; the latter
    # then deletes the claim made for the pod).
    (pod,) = scene.pods("more")
    (entry,) = pod["status"]["resourceClaimStatuses"]

    def released() -> bool:
        claim = {c["metadata"]["name"]: c for c in claims(scene)}.get(entry["resourceClaimName"])
        status = (claim or {}).get("status") or {}
        return not status.get("allocation") and not status.get("reservedFor")

    wait_until(released, 60, "the ended pod's claim released")
    no_device_twice(scene)


def kueue_config_map(scene: Scene, resource: str) -> KueueConfigSource:
    """Kueue's Configuration in a ConfigMap of the scene's namespace (the controller is pointed at it,
    as ``--kueue-config-namespace``/``--kueue-config-name`` do), mapping the scene's GPU class to
    ``resource``."""
    source = KueueConfigSource(scene.namespace, f"{scene.prefix}-kueue-config")
    configuration = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "resources": {
            "deviceClassMappings": [{"name": resource, "deviceClassNames": [f"{scene.prefix}-gpu"]}]
        },
    }
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": source.name, "namespace": source.namespace},
        "data": {KUEUE_CONFIG_KEY: yaml.safe_dump(configuration)},
    }
    scene.api.create(k8s.CONFIG_MAPS, body, source.namespace)
    return source


def quota_reserved(scene: Scene, job: str) -> dict[str, Any]:
    wl = scene.workloads().get(job) or {}
    conditions = (wl.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "QuotaReserved"), {})


def test_claims_are_charged_against_quota_through_kueues_config_map(dra_scene: Scene) -> None:
    """The ClusterQueue has 8 of a resource that Kueue's ConfigMap maps the GPU class to: one 8-GPU
    job holds it all, the next waits for quota (devices are free on the other node) with Kueue's
    reason, and is admitted and bound once the first one is gone."""
    scene = dra_scene
    resource = "example.com/dra-gpus"
    scene.setup(nodes=3, gpus_per_node=0, quota={resource: 8})
    nodes = [f"{scene.prefix}-n{i}" for i in range(3)]
    publish(scene, f"{scene.prefix}.example.com", nodes)
    template(scene, "eight-gpus", "gpu", count=8)
    source = kueue_config_map(scene, resource)
    scene.job_controller()
    scene.kubelet()
    run = scene.controller(leader_election=False, kueue_config=source)

    scene.submit(claim_job(scene, "first", "eight-gpus"))
    wait_until(lambda: len(bound_pods(scene, "first")) == 1, 60, "the first 8-GPU job bound")
    usage = scene.workloads()["first"]["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
    assert usage.get(resource) == "8", usage

    scene.submit(claim_job(scene, "second", "eight-gpus", seconds=1))

    def waits_for_quota() -> bool:
        cond = quota_reserved(scene, "second")
        return cond.get("status") == "False" and resource in cond.get("message", "")

    wait_until(waits_for_quota, 30, f"the second job waiting for {resource} quota")
    cond = quota_reserved(scene, "second")
    assert cond["reason"] == "WaitingForQuota", cond  # gpuplane's reason; the message is Kueue's
    kueue_says = "couldn't assign flavors to pod set main: insufficient unused quota"
    assert cond["message"].startswith(kueue_says), cond
    run.wait_passes(3, 20)
    assert not bound_pods(scene, "second"), "a job over the DRA quota was bound"

    scene.kubectl("delete", "job", "first", "-n", scene.namespace, "--wait=false")
    for pod in scene.pods("first"):
        with contextlib.suppress(ApiError):
            scene.api.delete(k8s.PODS, pod["metadata"]["name"], scene.namespace, gracePeriodSeconds=0)
    wait_until(lambda: len(bound_pods(scene, "second")) == 1, 60, "the second job bound once quota freed")
    reserved_for_its_pod(scene, "second")
    no_device_twice(scene)


def test_schedule_reads_dra_objects_from_a_live_cluster(dra_scene: Scene) -> None:
    """``gpuplane schedule --kubeconfig`` (read_cluster) lists the DRA kinds the server serves."""
    scene = dra_scene
    scene.setup(nodes=1, gpus_per_node=0)
    publish_one = _slice(f"{scene.prefix}-n0-gpus", f"{scene.prefix}.example.com", f"{scene.prefix}-n0")
    publish_one["spec"]["devices"] = [{"name": "gpu-0"}]
    scene._create(k8s.RESOURCE_SLICES, publish_one)
    listed = read_cluster(scene.api)
    assert {res.kind for res in DRA_RESOURCES} <= set(listed)
    assert any(s["metadata"]["name"] == publish_one["metadata"]["name"] for s in listed["ResourceSlice"])
