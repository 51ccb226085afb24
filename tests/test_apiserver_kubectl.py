"""The real kubectl against the double: apply, create, get, label, patch, wait and delete, unchanged."""

from __future__ import annotations

import json

import pytest

from apiserver.crds import KUEUE_GROUP, kueue_crds
from apiserver.fixtures import Cluster, Kubectl, manifest
from manifests import Manifest, cluster_queue, job, pod_spec, resource_flavor

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster


def batch_job(image: str = "busybox") -> Manifest:
    return (
        job("train")
        .set("spec.template.spec.restartPolicy", "Never")
        .set("spec.template.spec.containers[0].image", image)
    )


def pod(name: str) -> Manifest:
    return Manifest("v1", "Pod", name, "default").set("spec", pod_spec().container(cpu="1").to_dict())


def test_apply_a_job_then_reapply_changes(apiserver: Cluster, kubectl: Kubectl) -> None:
    assert (
        kubectl("apply", "-f", "-", input=manifest(batch_job().to_dict())).stdout.strip()
        == "job.batch/train created"
    )
    assert "unchanged" in kubectl("apply", "-f", "-", input=manifest(batch_job().to_dict())).stdout
    relabelled = batch_job().label("team", "a").to_dict()
    assert "configured" in kubectl("apply", "-f", "-", input=manifest(relabelled)).stdout
    stored = apiserver.store.object("jobs.batch", "train", "default")
    assert stored is not None
    assert stored["metadata"]["labels"] == {"team": "a"}
    assert "kubectl.kubernetes.io/last-applied-configuration" in stored["metadata"]["annotations"]
    patches = apiserver.requests.find(verb="patch", resource="jobs")
    assert [e.request.content_type for e in patches] == ["application/strategic-merge-patch+json"]


def test_apply_refused_by_validation_reports_the_server_message(kubectl: Kubectl) -> None:
    result = kubectl("apply", "-f", "-", input=manifest(job("bad").to_dict()), check=False)
    assert result.returncode == 1
    assert 'Unsupported value: "Always"' in result.stderr
    assert "spec.template.spec.restartPolicy" in result.stderr


def test_apply_kueue_crds_then_a_cluster_queue(apiserver: Cluster, kubectl: Kubectl) -> None:
    kubectl("apply", "-f", "-", input=manifest(*kueue_crds()))
    kubectl("wait", "--for", "condition=established", "--timeout=10s", f"crd/clusterqueues.{KUEUE_GROUP}")
    queue = cluster_queue("team").flavor("default", cpu="4").to_dict()
    out = kubectl("apply", "-f", "-", input=manifest(resource_flavor("default").to_dict(), queue)).stdout
    assert out.split() == [
        f"resourceflavor.{KUEUE_GROUP}/default",
        "created",
        f"clusterqueue.{KUEUE_GROUP}/team",
        "created",
    ]
    queue["spec"]["cohortName"] = "org"
    assert "configured" in kubectl("apply", "-f", "-", input=manifest(queue)).stdout
    patches = apiserver.requests.find(verb="patch", resource="clusterqueues")
    assert [e.request.content_type for e in patches] == ["application/merge-patch+json"]
    got = json.loads(kubectl("get", "cq", "team", "-o", "json").stdout)
    assert (got["kind"], got["spec"]["cohortName"], got["metadata"]["generation"]) == (
        "ClusterQueue",
        "org",
        2,
    )
    table = kubectl("get", f"clusterqueues.{KUEUE_GROUP}").stdout.split()
    assert table[:3] == ["NAME", "AGE", "team"]


def test_create_get_label_patch_and_delete_pods(apiserver: Cluster, kubectl: Kubectl) -> None:
    kubectl("create", "-f", "-", input=manifest(pod("a").to_dict(), pod("b").label("team", "x").to_dict()))
    listed = json.loads(kubectl("get", "pods", "-o", "json").stdout)
    assert [(p["kind"], p["metadata"]["name"]) for p in listed["items"]] == [("Pod", "a"), ("Pod", "b")]
    assert kubectl("get", "pods", "-l", "team=x", "-o", "name").stdout.split() == ["pod/b"]
    header = kubectl("get", "pods").stdout.splitlines()[0].split()
    assert header == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    kubectl("label", "pod", "a", "tier=1")
    kubectl("annotate", "pod", "a", "note=hi")
    kubectl(
        "patch", "pod", "a", "--type=json", "-p", '[{"op":"add","path":"/metadata/labels/x","value":"y"}]'
    )
    kubectl("patch", "pod", "a", "--type=merge", "-p", '{"metadata":{"labels":{"tier":null}}}')
    stored = apiserver.store.object("pods", "a", "default")
    assert stored is not None
    assert (stored["metadata"]["labels"], stored["metadata"]["annotations"]) == ({"x": "y"}, {"note": "hi"})
    assert kubectl("delete", "pod", "a").stdout.strip() == 'pod "a" deleted'
    assert kubectl("get", "pods", "-o", "name").stdout.split() == ["pod/b"]
    assert kubectl("get", "pods", "--field-selector", "spec.nodeName=", "-o", "name").stdout.split() == [
        "pod/b"
    ]
    missing = kubectl("get", "pod", "a", check=False)
    assert missing.returncode == 1
    assert 'pods "a" not found' in missing.stderr


def test_delete_a_job_from_its_manifest(apiserver: Cluster, kubectl: Kubectl) -> None:
    text = manifest(batch_job().to_dict())
    kubectl("apply", "-f", "-", input=text)
    assert kubectl("delete", "-f", "-", input=text).stdout.strip() == 'job.batch "train" deleted'
    assert apiserver.store.objects("jobs.batch") == []


def test_server_side_apply_and_dry_run(apiserver: Cluster, kubectl: Kubectl) -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "1"}}
    kubectl("apply", "--server-side", "-f", "-", input=manifest(config))
    stored = apiserver.store.object("configmaps", "c", "default")
    assert stored is not None
    assert stored["data"] == {"k": "1"}
    before = apiserver.store.resource_version
    kubectl("apply", "--dry-run=server", "-f", "-", input=manifest({**config, "data": {"k": "2"}}))
    assert apiserver.store.resource_version == before


def test_generator_commands_and_drain_send_protobuf(apiserver: Cluster, kubectl: Kubectl) -> None:
    kubectl("create", "namespace", "team")
    kubectl("create", "configmap", "settings", "--from-literal=mode=fast", "-n", "team")
    kubectl("create", "job", "once", "--image=busybox", "-n", "team", "--", "sleep", "1")
    bodies = [e.request.content_type for e in apiserver.requests.find(verb="create")]
    assert bodies == ["application/vnd.kubernetes.protobuf"] * 3
    settings = apiserver.store.object("configmaps", "settings", "team")
    assert settings is not None
    assert settings["data"] == {"mode": "fast"}
    once = apiserver.store.object("jobs.batch", "once", "team")
    assert once is not None
    assert once["spec"]["template"]["spec"]["containers"][0]["command"] == ["sleep", "1"]
    assert once["spec"]["template"]["spec"]["restartPolicy"] == "Never"
    apiserver.store.add({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}})
    bound = pod("p").set("spec.nodeName", "n1").to_dict()
    apiserver.store.add(bound)
    kubectl("drain", "n1", "--force", "--grace-period=0", "--timeout=10s")
    assert apiserver.store.object("pods", "p", "default") is None
    node = apiserver.store.object("nodes", "n1")
    assert node is not None
    assert node["spec"]["unschedulable"] is True
