"""CustomResourceDefinitions on the double: custom resources are served once their CRD exists."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes import client

from apiserver.crds import KUEUE_GROUP, custom_resource_definition, job_framework_crds, kueue_crds
from apiserver.rest import Rest
from manifests import cluster_queue, local_queue, resource_flavor, workload

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
KUEUE = f"/apis/{KUEUE_GROUP}/v1beta2"


def install(rest: Rest, *crds: dict[str, Any]) -> None:
    for crd in crds:
        reply = rest.post(CRDS, crd)
        assert reply.status == 201, reply.body


def test_custom_resources_appear_with_their_crd(rest: Rest) -> None:
    assert rest.get(f"{KUEUE}/clusterqueues").status == 404
    assert KUEUE_GROUP not in [g["name"] for g in rest.get("/apis").body["groups"]]
    install(rest, *kueue_crds())
    groups = {g["name"]: g for g in rest.get("/apis").body["groups"]}
    assert groups[KUEUE_GROUP]["preferredVersion"]["version"] == "v1beta2"
    resources = {r["name"]: r for r in rest.get(KUEUE).body["resources"]}
    assert {
        "clusterqueues",
        "clusterqueues/status",
        "localqueues",
        "resourceflavors",
        "workloads",
        "workloads/status",
        "cohorts",
        "workloadpriorityclasses",
        "topologies",
    } <= set(resources)
    assert resources["clusterqueues"]["namespaced"] is False
    assert resources["workloads"]["namespaced"] is True
    assert resources["clusterqueues"]["shortNames"] == ["cq"]
    crd = rest.get(f"{CRDS}/workloads.{KUEUE_GROUP}").body
    conditions = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
    assert conditions == {"NamesAccepted": "True", "Established": "True"}


def test_kueue_objects_through_the_official_client(rest: Rest, kube_client: client.ApiClient) -> None:
    extensions = client.ApiextensionsV1Api(kube_client)
    for crd in kueue_crds():
        extensions.create_custom_resource_definition(crd)
    custom = client.CustomObjectsApi(kube_client)
    custom.create_cluster_custom_object(
        KUEUE_GROUP, "v1beta2", "resourceflavors", resource_flavor("default").to_dict()
    )
    custom.create_cluster_custom_object(
        KUEUE_GROUP, "v1beta2", "clusterqueues", cluster_queue("team").flavor("default", cpu="4").to_dict()
    )
    custom.create_namespaced_custom_object(
        KUEUE_GROUP, "v1beta2", "default", "localqueues", local_queue("lq", "default", "team").to_dict()
    )
    wl = workload("w").queue("lq").podset(cpu="1").to_dict()
    wl["status"] = {"conditions": [{"type": "Admitted", "status": "True"}]}
    made = custom.create_namespaced_custom_object(KUEUE_GROUP, "v1beta2", "default", "workloads", wl)
    assert "status" not in made, "a CR with a status subresource drops status on create"
    admitted = {"status": {"conditions": [{"type": "QuotaReserved", "status": "True"}]}}
    patched = custom.patch_namespaced_custom_object_status(
        KUEUE_GROUP, "v1beta2", "default", "workloads", "w", admitted
    )
    assert patched["status"] == admitted["status"]
    assert patched["metadata"]["generation"] == 1
    queues = custom.list_cluster_custom_object(KUEUE_GROUP, "v1beta2", "clusterqueues")
    assert [q["metadata"]["name"] for q in queues["items"]] == ["team"]
    assert queues["items"][0]["kind"] == "ClusterQueue"
    assert rest.get(f"{KUEUE}/namespaces/default/clusterqueues/team").status == 404, "cluster-scoped"


def test_custom_resource_updates_need_a_resource_version_and_count_generations(rest: Rest) -> None:
    install(rest, *kueue_crds())
    made = rest.post(f"{KUEUE}/clusterqueues", cluster_queue("q").to_dict()).body
    body = copy.deepcopy(made)
    del body["metadata"]["resourceVersion"]
    assert rest.put(f"{KUEUE}/clusterqueues/q", body).status == 422
    made["spec"]["cohortName"] = "all"
    updated = rest.put(f"{KUEUE}/clusterqueues/q", made).body
    assert updated["metadata"]["generation"] == 2
    updated["status"] = {"pendingWorkloads": 3}
    via_status = rest.put(f"{KUEUE}/clusterqueues/q/status", updated).body
    assert (via_status["status"], via_status["metadata"]["generation"]) == ({"pendingWorkloads": 3}, 2)


def test_several_versions_share_the_objects(rest: Rest) -> None:
    install(rest, *kueue_crds(versions=("v1beta1", "v1beta2")))
    made = rest.post(
        f"/apis/{KUEUE_GROUP}/v1beta1/resourceflavors",
        resource_flavor("f").set("apiVersion", f"{KUEUE_GROUP}/v1beta1").to_dict(),
    )
    assert made.status == 201, made.body
    seen = rest.get(f"{KUEUE}/resourceflavors/f").body
    assert seen["apiVersion"] == f"{KUEUE_GROUP}/v1beta2"
    assert seen["metadata"]["uid"] == made.body["metadata"]["uid"]
    wrong = rest.post(
        f"{KUEUE}/resourceflavors", resource_flavor("g").set("apiVersion", f"{KUEUE_GROUP}/v1beta1").to_dict()
    )
    assert wrong.status == 400


def test_deleting_a_crd_removes_its_objects_and_endpoint(rest: Rest) -> None:
    install(rest, *kueue_crds())
    rest.post(f"{KUEUE}/resourceflavors", resource_flavor("f").to_dict())
    assert rest.delete(f"{CRDS}/resourceflavors.{KUEUE_GROUP}").status == 200
    assert rest.get(f"{KUEUE}/resourceflavors").status == 404
    install(rest, next(c for c in kueue_crds() if c["spec"]["names"]["kind"] == "ResourceFlavor"))
    assert rest.get(f"{KUEUE}/resourceflavors").body["items"] == []


def test_job_framework_kinds_are_served(rest: Rest) -> None:
    install(rest, *job_framework_crds())
    for crd in job_framework_crds():
        spec = crd["spec"]
        group, version, plural = spec["group"], spec["versions"][0]["name"], spec["names"]["plural"]
        obj = {
            "apiVersion": f"{group}/{version}",
            "kind": spec["names"]["kind"],
            "metadata": {"name": "x"},
            "spec": {"anything": [1, 2]},
        }
        reply = rest.post(f"/apis/{group}/{version}/namespaces/default/{plural}", obj)
        assert reply.status == 201, (plural, reply.body)
        assert reply.body["spec"] == {"anything": [1, 2]}


def widget_crd() -> dict[str, Any]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["size"],
                "properties": {
                    "size": {"type": "integer", "minimum": 1},
                    "mode": {"type": "string", "enum": ["fast", "slow"], "default": "slow"},
                    "name": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5},
                    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}},
                    "limits": {
                        "type": "object",
                        "additionalProperties": {"x-kubernetes-int-or-string": True},
                    },
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                },
            },
        },
    }
    return custom_resource_definition("example.com", "Widget", schema=schema)


def widget(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}


WIDGETS = "/apis/example.com/v1/namespaces/default/widgets"

SCHEMA_CASES = [
    pytest.param(widget(size=2), 201, None, id="valid"),
    pytest.param(widget(), 422, "spec.size", id="required"),
    pytest.param(widget(size="2"), 422, "spec.size", id="wrong-type"),
    pytest.param(widget(size=0), 422, "spec.size", id="below-minimum"),
    pytest.param(widget(size=1, mode="medium"), 422, "spec.mode", id="not-in-enum"),
    pytest.param(widget(size=1, name="ABC"), 422, "spec.name", id="pattern"),
    pytest.param(widget(size=1, name="abcdef"), 422, "spec.name", id="too-long"),
    pytest.param(widget(size=1, tags=["a", "b", "c"]), 422, "spec.tags", id="too-many-items"),
    pytest.param(widget(size=1, tags=[1]), 422, "spec.tags[0]", id="item-type"),
    pytest.param(widget(size=1, limits={"gpu": 2, "cpu": "500m"}), 201, None, id="int-or-string"),
    pytest.param(widget(size=1, limits={"gpu": 1.5}), 422, "spec.limits.gpu", id="int-or-string-float"),
    pytest.param(widget(size=1, free={"deep": {"x": 1}}), 201, None, id="preserve-unknown"),
]


@pytest.mark.parametrize(("obj", "want_code", "want_field"), SCHEMA_CASES)
def test_custom_resources_are_validated_against_the_schema(
    rest: Rest, obj: dict[str, Any], want_code: int, want_field: str | None
) -> None:
    install(rest, widget_crd())
    reply = rest.post(WIDGETS, obj)
    assert reply.status == want_code, reply.body
    if want_field:
        assert want_field in [c["field"] for c in reply.body["details"]["causes"]], reply.body


def test_schema_defaults_and_pruning(rest: Rest) -> None:
    install(rest, widget_crd())
    reply = rest.post(WIDGETS, widget(size=1, colour="red"))
    assert reply.status == 201
    assert reply.body["spec"] == {"size": 1, "mode": "slow"}
    assert any("spec.colour" in w for w in reply.warnings)
    strict = rest.post(
        WIDGETS, {**widget(size=1, colour="red"), "metadata": {"name": "v"}}, fieldValidation="Strict"
    )
    assert strict.status == 400
    assert 'unknown field "spec.colour"' in strict.body["message"]


CRD_REFUSALS = [
    pytest.param(
        lambda c: c["metadata"].update(name="wrong.example.com"), "metadata.name", id="name-not-plural-group"
    ),
    pytest.param(lambda c: c["spec"].update(group="example"), "spec.group", id="group-without-dot"),
    pytest.param(
        lambda c: c["spec"]["versions"][0].update(storage=False), "spec.versions", id="no-storage-version"
    ),
    pytest.param(lambda c: c["spec"].update(scope="Global"), "spec.scope", id="bad-scope"),
    pytest.param(
        lambda c: c["spec"]["versions"][0].pop("schema"),
        "spec.versions[0].schema.openAPIV3Schema",
        id="no-schema",
    ),
]


@pytest.mark.parametrize(("breakage", "want_field"), CRD_REFUSALS)
def test_invalid_crds_are_refused(rest: Rest, breakage: Any, want_field: str) -> None:
    crd = custom_resource_definition("example.com", "Widget")
    breakage(crd)
    reply = rest.post(CRDS, crd)
    assert reply.status == 422, reply.body
    assert want_field in [c["field"] for c in reply.body["details"]["causes"]]


def test_watch_custom_resources(rest: Rest) -> None:
    install(rest, *kueue_crds())
    since = rest.get(f"{KUEUE}/workloads").body["metadata"]["resourceVersion"]
    rest.post(f"{KUEUE}/namespaces/default/workloads", workload("w").queue("lq").podset(cpu="1").to_dict())
    with rest.watch(f"{KUEUE}/workloads", resourceVersion=since) as stream:
        (event,) = stream.take(1)
    assert (event["type"], event["object"]["kind"], event["object"]["metadata"]["name"]) == (
        "ADDED",
        "Workload",
        "w",
    )
