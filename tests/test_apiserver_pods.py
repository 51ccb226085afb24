"""The pod subresources a scheduler uses: binding (assign once) and eviction (delete with grace)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from apiserver.fixtures import Cluster
from apiserver.rest import Rest
from apiserver.store import Store
from manifests import Manifest, pod_spec

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str = "p") -> dict[str, Any]:
    return (
        Manifest("v1", "Pod", name, "default").set("spec", pod_spec().container(cpu="1").to_dict()).to_dict()
    )


def binding(pod_name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": pod_name},
        "target": {"kind": "Node", "name": node},
    }


def eviction(pod_name: str, grace: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod_name}}
    if grace is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace}
    return body


def test_binding_assigns_the_node_and_marks_the_pod_scheduled(rest: Rest) -> None:
    assert rest.post(PODS, pod()).status == 201
    reply = rest.post(f"{PODS}/p/binding", binding("p", "n1"))
    assert (reply.status, reply.body["status"]) == (201, "Success")
    bound = rest.get(f"{PODS}/p").body
    assert bound["spec"]["nodeName"] == "n1"
    assert {"type": "PodScheduled", "status": "True"}.items() <= bound["status"]["conditions"][0].items()


BINDING_REFUSALS = [
    pytest.param({}, binding("p", "n2"), 409, "already assigned", id="already-bound"),
    pytest.param({"gated": True}, binding("p", "n1"), 409, "schedulingGates", id="gated"),
    pytest.param({"finalizer": True}, binding("p", "n1"), 409, "being deleted", id="being-deleted"),
    pytest.param({}, binding("other", "n1"), 400, "does not match", id="name-mismatch"),
    pytest.param(
        {},
        {"metadata": {"name": "p"}, "target": {"kind": "Pod", "name": "x"}},
        422,
        "target.kind",
        id="target-not-a-node",
    ),
]


@pytest.mark.parametrize(("setup", "body", "want_code", "want_text"), BINDING_REFUSALS)
def test_binding_refusals(
    rest: Rest, setup: dict[str, bool], body: dict[str, Any], want_code: int, want_text: str
) -> None:
    obj = pod()
    if setup.get("gated"):
        obj["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    if setup.get("finalizer"):
        obj["metadata"]["finalizers"] = ["example.com/hold"]
    assert rest.post(PODS, obj).status == 201
    if setup.get("finalizer"):
        assert rest.delete(f"{PODS}/p").status == 202
    elif not setup.get("gated"):
        assert rest.post(f"{PODS}/p/binding", binding("p", "n1")).status == 201
    reply = rest.post(f"{PODS}/p/binding", body)
    assert reply.status == want_code, reply.body
    assert want_text in reply.body["message"]


def test_binding_a_missing_pod_is_404(rest: Rest) -> None:
    assert rest.post(f"{PODS}/ghost/binding", binding("ghost", "n1")).status == 404


def test_official_client_binds_through_the_bindings_collection(
    apiserver: Cluster, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", pod("a"))
    core.create_namespaced_pod("default", pod("b"))
    for name, node in [("a", "n1"), ("b", "n2")]:
        core.create_namespaced_binding("default", binding(name, node), _preload_content=False)
    with pytest.raises(client.ApiException) as refused:
        core.create_namespaced_binding("default", binding("a", "n3"), _preload_content=False)
    assert refused.value.status == 409
    assert apiserver.requests.bindings() == [("default", "a", "n1"), ("default", "b", "n2")]
    assert {p.metadata.name: p.spec.node_name for p in core.list_namespaced_pod("default").items} == {
        "a": "n1",
        "b": "n2",
    }


def test_eviction_deletes_the_pod_honouring_the_grace_period(rest: Rest, store: Store) -> None:
    body = pod()
    body["spec"]["nodeName"] = "n1"
    assert rest.post(PODS, body).status == 201
    reply = rest.post(f"{PODS}/p/eviction", eviction("p", grace=5))
    assert reply.status == 201, reply.body
    terminating = rest.get(f"{PODS}/p").body
    assert terminating["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:05Z"
    assert rest.post(f"{PODS}/p/eviction", eviction("p")).status == 201  # evicting a terminating pod is fine
    store.advance(5)
    assert rest.get(f"{PODS}/p").status == 404
    assert rest.post(f"{PODS}/p/eviction", eviction("p")).status == 404


def test_eviction_of_an_unbound_pod_is_immediate(rest: Rest) -> None:
    assert rest.post(PODS, pod()).status == 201
    assert rest.post(f"{PODS}/p/eviction", eviction("p")).status == 201
    assert rest.get(f"{PODS}/p").status == 404


def test_official_client_evicts(kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    core.create_namespaced_pod("default", pod())
    core.create_namespaced_pod_eviction("p", "default", eviction("p"), _preload_content=False)
    assert core.list_namespaced_pod("default").items == []
