"""Patches against the double: JSON merge, JSON patch, strategic merge and apply, on built-ins and CRs."""

from __future__ import annotations

from typing import Any

import pytest

from apiserver import patch
from apiserver.crds import custom_resource_definition
from apiserver.rest import Rest
from manifests import Manifest, pod_spec

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster

PODS = "/api/v1/namespaces/default/pods"
MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


@pytest.fixture
def base_pod(rest: Rest) -> dict[str, Any]:
    body = (
        Manifest("v1", "Pod", "p", "default")
        .label("keep", "1")
        .label("drop", "1")
        .set("metadata.finalizers", ["example.com/a"])
        .set("spec", pod_spec().container(cpu="1").container(cpu="2").to_dict())
        .set("spec.containers[0].env", [{"name": "A", "value": "1"}])
        .to_dict()
    )
    reply = rest.post(PODS, body)
    assert reply.status == 201, reply.body
    result: dict[str, Any] = reply.body
    return result


PATCHES = [
    pytest.param(
        MERGE,
        {"metadata": {"labels": {"drop": None, "new": "2"}}},
        lambda p: p["metadata"]["labels"] == {"keep": "1", "new": "2"},
        id="merge-labels",
    ),
    pytest.param(
        MERGE,
        {"metadata": {"finalizers": ["example.com/z"]}},
        lambda p: p["metadata"]["finalizers"] == ["example.com/z"],
        id="merge-replaces-lists",
    ),
    pytest.param(
        JSON_PATCH,
        [
            {"op": "replace", "path": "/spec/containers/1/image", "value": "x:1"},
            {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}},
        ],
        lambda p: p["spec"]["containers"][1]["image"] == "x:1" and p["metadata"]["annotations"] == {"a": "b"},
        id="json-patch",
    ),
    pytest.param(
        JSON_PATCH,
        [
            {"op": "remove", "path": "/metadata/labels/drop"},
            {"op": "move", "from": "/metadata/labels/keep", "path": "/metadata/labels/kept"},
        ],
        lambda p: p["metadata"]["labels"] == {"kept": "1"},
        id="json-patch-remove-move",
    ),
    pytest.param(
        STRATEGIC,
        {"spec": {"containers": [{"name": "c1", "image": "y:1"}]}},
        lambda p: [c["image"] for c in p["spec"]["containers"]] == ["busybox", "y:1"],
        id="strategic-merges-containers-by-name",
    ),
    pytest.param(
        STRATEGIC,
        {"metadata": {"finalizers": ["example.com/b"]}},
        lambda p: p["metadata"]["finalizers"] == ["example.com/a", "example.com/b"],
        id="strategic-finalizers-are-a-set",
    ),
    pytest.param(
        STRATEGIC,
        {"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/a"]}},
        lambda p: p["metadata"]["finalizers"] == [],
        id="strategic-delete-from-primitive-list",
    ),
    pytest.param(
        STRATEGIC,
        {"metadata": {"labels": {"$patch": "replace", "only": "x"}}},
        lambda p: p["metadata"]["labels"] == {"only": "x"},
        id="strategic-replace-directive",
    ),
    pytest.param(
        STRATEGIC,
        {"spec": {"tolerations": [{"key": "a", "operator": "Exists"}]}},
        lambda p: p["spec"]["tolerations"] == [{"key": "a", "operator": "Exists"}],
        id="strategic-tolerations-replace",
    ),
]


@pytest.mark.parametrize(("content_type", "body", "want"), PATCHES)
def test_patch_types(rest: Rest, base_pod: dict[str, Any], content_type: str, body: Any, want: Any) -> None:
    reply = rest.patch(f"{PODS}/p", body, content_type)
    assert reply.status == 200, reply.body
    assert want(reply.body), reply.body
    assert int(reply.body["metadata"]["resourceVersion"]) > int(base_pod["metadata"]["resourceVersion"])


REFUSED_PATCHES = [
    pytest.param(
        JSON_PATCH, [{"op": "test", "path": "/metadata/name", "value": "other"}], 422, id="json-test-fails"
    ),
    pytest.param(JSON_PATCH, [{"op": "remove", "path": "/metadata/nothing"}], 422, id="json-remove-missing"),
    pytest.param(JSON_PATCH, {"op": "add"}, 400, id="json-patch-not-a-list"),
    pytest.param(MERGE, {"metadata": {"resourceVersion": "1"}}, 409, id="stale-resource-version-in-patch"),
    pytest.param(MERGE, {"spec": {"nodeName": "n1"}}, 422, id="patch-cannot-bind"),
    pytest.param(MERGE, {"metadata": {"name": "other"}}, 400, id="patch-renames"),
    pytest.param("application/xml", {"a": 1}, 415, id="unknown-content-type"),
    pytest.param(
        APPLY, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}, 400, id="apply-needs-manager"
    ),
]


@pytest.mark.usefixtures("base_pod")
@pytest.mark.parametrize(("content_type", "body", "want_code"), REFUSED_PATCHES)
def test_refused_patches(rest: Rest, content_type: str, body: Any, want_code: int) -> None:
    reply = rest.patch(f"{PODS}/p", body, content_type)
    assert reply.status == want_code, reply.body


def test_patch_of_a_missing_object_is_404_but_apply_creates(rest: Rest) -> None:
    assert rest.patch(f"{PODS}/none", {"metadata": {"labels": {"a": "b"}}}, MERGE).status == 404
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}}
    first = rest.patch("/api/v1/namespaces/default/configmaps/c", config, APPLY, fieldManager="test")
    assert first.status == 201, first.body
    config["data"] = {"k": "w"}
    second = rest.patch("/api/v1/namespaces/default/configmaps/c", config, APPLY, fieldManager="test")
    assert (second.status, second.body["data"]) == (200, {"k": "w"})


def test_strategic_patch_merges_node_conditions_by_type(rest: Rest) -> None:
    ready = {"type": "Ready", "status": "False"}
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, "status": {"conditions": [ready]}}
    assert rest.post("/api/v1/nodes", node).status == 201
    body = {
        "status": {
            "conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "True"}]
        }
    }
    reply = rest.patch("/api/v1/nodes/n1/status", body, STRATEGIC)
    assert reply.status == 200, reply.body
    conditions = {c["type"]: c["status"] for c in reply.body["status"]["conditions"]}
    assert conditions == {"Ready": "True", "MemoryPressure": "False"}


def test_status_patch_changes_only_status(rest: Rest, base_pod: dict[str, Any]) -> None:
    body = {"status": {"phase": "Running"}, "metadata": {"labels": {"x": "y"}}}
    reply = rest.patch(f"{PODS}/p/status", body, MERGE)
    assert reply.status == 200, reply.body
    assert reply.body["status"]["phase"] == "Running"
    assert reply.body["metadata"]["labels"] == base_pod["metadata"]["labels"]


def test_custom_resources_take_merge_and_json_patches_but_not_strategic(rest: Rest) -> None:
    crd = custom_resource_definition("example.com", "Widget")
    assert rest.post("/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd).status == 201
    widgets = "/apis/example.com/v1/namespaces/default/widgets"
    widget = {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": "w"},
        "spec": {"size": 1},
    }
    assert rest.post(widgets, widget).status == 201
    assert rest.patch(f"{widgets}/w", {"spec": {"size": 2}}, MERGE).body["spec"] == {"size": 2}
    json_patched = rest.patch(
        f"{widgets}/w", [{"op": "replace", "path": "/spec/size", "value": 3}], JSON_PATCH
    )
    assert json_patched.body["spec"] == {"size": 3}
    refused = rest.patch(f"{widgets}/w", {"spec": {"size": 4}}, STRATEGIC)
    assert (refused.status, refused.reason) == (415, "UnsupportedMediaType")


# --- the patch functions on their own ------------------------------------------------------------------

SET_ELEMENT_ORDER = [
    pytest.param(
        {"containers": [{"name": "a"}, {"name": "b"}]},
        {
            "$setElementOrder/containers": [{"name": "b"}, {"name": "a"}],
            "containers": [{"name": "b", "image": "x"}],
        },
        {"containers": [{"name": "b", "image": "x"}, {"name": "a"}]},
        id="set-element-order",
    ),
    pytest.param(
        {"containers": [{"name": "a"}, {"name": "b"}]},
        {"containers": [{"name": "a", "$patch": "delete"}]},
        {"containers": [{"name": "b"}]},
        id="delete-element",
    ),
    pytest.param(
        {"spec": {"a": 1, "b": 2}},
        {"spec": {"$retainKeys": ["a", "c"], "c": 3}},
        {"spec": {"a": 1, "c": 3}},
        id="retain-keys",
    ),
    pytest.param({"a": {"b": 1}}, {"a": {"$patch": "delete"}}, {}, id="delete-map"),
    pytest.param(
        {"env": [{"name": "A", "value": "1"}]},
        {"env": [{"name": "B", "value": "2"}]},
        {"env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}]},
        id="merge-by-key",
    ),
    pytest.param(
        {"env": [{"name": "A", "value": "1"}, {"name": "B"}]},
        {"env": [{"$patch": "replace"}, {"name": "C"}]},
        {"env": [{"name": "C"}]},
        id="replace-list",
    ),
]


@pytest.mark.parametrize(("original", "body", "want"), SET_ELEMENT_ORDER)
def test_strategic_merge_directives(
    original: dict[str, Any], body: dict[str, Any], want: dict[str, Any]
) -> None:
    assert patch.strategic_merge_patch(original, body) == want


def test_patch_functions_do_not_modify_their_arguments() -> None:
    original = {"a": {"b": [1, 2]}}
    body = {"a": {"b": [3]}}
    patch.merge_patch(original, body)
    patch.strategic_merge_patch(original, body)
    patch.json_patch(original, [{"op": "add", "path": "/a/b/-", "value": 9}])
    assert original == {"a": {"b": [1, 2]}}
    assert body == {"a": {"b": [3]}}
