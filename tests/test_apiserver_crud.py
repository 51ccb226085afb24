"""The API-server double's object semantics: create, get, list, update, delete, and what it refuses.

Driven over plain HTTP (``rest``) so status codes, reasons and headers are checked exactly.
"""

from __future__ import annotations

from typing import Any

import pytest

from apiserver.rest import Rest
from apiserver.store import Store
from manifests import GPU, Manifest, job, namespace, node, pod_spec

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster

PODS = "/api/v1/namespaces/default/pods"
JOBS = "/apis/batch/v1/namespaces/default/jobs"
NODES = "/api/v1/nodes"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def pod(name: str = "p", ns: str = "default") -> Manifest:
    return Manifest("v1", "Pod", name, ns).set("spec", pod_spec().container(cpu="1").to_dict())


def batch_job(name: str = "j") -> Manifest:
    return job(name).set("spec.template.spec.restartPolicy", "Never")


def created(rest: Rest, path: str, obj: Manifest | dict[str, Any]) -> dict[str, Any]:
    body = obj.to_dict() if isinstance(obj, Manifest) else obj
    reply = rest.post(path, body)
    assert reply.status == 201, reply.body
    result: dict[str, Any] = reply.body
    return result


def test_create_fills_system_fields_and_get_returns_the_object(rest: Rest) -> None:
    made = created(rest, PODS, pod("p"))
    meta = made["metadata"]
    assert (meta["name"], meta["namespace"]) == ("p", "default")
    assert meta["uid"]
    assert meta["creationTimestamp"] == "2026-01-01T00:00:00Z"
    assert int(meta["resourceVersion"]) > 0
    assert made["status"] == {"phase": "Pending", "qosClass": "Burstable"}
    fetched = rest.get(f"{PODS}/p")
    assert fetched.status == 200
    assert fetched.body == made


def test_resource_versions_increase_across_kinds(rest: Rest) -> None:
    versions = [
        int(created(rest, path, obj)["metadata"]["resourceVersion"])
        for path, obj in [(PODS, pod("a")), (NODES, node("n1")), (PODS, pod("b")), (JOBS, batch_job())]
    ]
    assert versions == sorted(versions)
    assert len(set(versions)) == len(versions)


def test_generate_name_makes_unique_names(rest: Rest) -> None:
    body = pod().drop("metadata.name").set("metadata.generateName", "worker-").to_dict()
    names = {created(rest, PODS, body)["metadata"]["name"] for _ in range(5)}
    assert len(names) == 5
    assert all(name.startswith("worker-") and len(name) == len("worker-") + 5 for name in names)


def test_defaults_copy_limits_to_requests_and_generate_the_job_selector(rest: Rest) -> None:
    made = created(
        rest,
        PODS,
        Manifest("v1", "Pod", "g", "default").set(
            "spec", pod_spec().container(limits={GPU: 2, "cpu": "1", "memory": "1Gi"}).to_dict()
        ),
    )
    container = made["spec"]["containers"][0]
    assert container["resources"]["requests"] == {GPU: 2, "cpu": "1", "memory": "1Gi"}
    assert made["status"]["qosClass"] == "Guaranteed"
    assert made["spec"]["restartPolicy"] == "Always"
    made_job = created(rest, JOBS, batch_job())
    uid = made_job["metadata"]["uid"]
    assert made_job["spec"]["selector"] == {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
    assert made_job["spec"]["template"]["metadata"]["labels"]["batch.kubernetes.io/job-name"] == "j"
    assert (made_job["spec"]["completions"], made_job["spec"]["parallelism"]) == (1, 1)


def test_get_and_create_errors(rest: Rest) -> None:
    missing = rest.get(f"{PODS}/nope")
    assert (missing.status, missing.reason) == (404, "NotFound")
    assert missing.body["details"] == {"kind": "pods", "name": "nope"}
    created(rest, PODS, pod("p"))
    again = rest.post(PODS, pod("p").to_dict())
    assert (again.status, again.reason) == (409, "AlreadyExists")


REFUSED_CREATES = [
    pytest.param(PODS, pod("Bad_Name"), 422, "metadata.name", id="name-not-dns-subdomain"),
    pytest.param(PODS, pod().drop("metadata.name"), 422, "metadata.name", id="no-name"),
    pytest.param(PODS, pod().set("spec.containers", []), 422, "spec.containers", id="no-containers"),
    pytest.param(
        PODS, pod().drop("spec.containers[0].image"), 422, "spec.containers[0].image", id="no-image"
    ),
    pytest.param(
        PODS,
        pod().set("spec.containers[1]", {"name": "c0", "image": "x"}),
        422,
        "spec.containers[1].name",
        id="duplicate-container",
    ),
    pytest.param(
        PODS,
        pod().set("spec.containers[0].resources", {"requests": {GPU: 1}}),
        422,
        f"spec.containers[0].resources.requests[{GPU}]",
        id="extended-resource-without-limit",
    ),
    pytest.param(
        PODS,
        pod().set("spec.containers[0].resources", {"requests": {GPU: 1}, "limits": {GPU: 2}}),
        422,
        f"spec.containers[0].resources.requests[{GPU}]",
        id="extended-request-not-limit",
    ),
    pytest.param(
        PODS,
        pod().set("spec.containers[0].resources", {"limits": {GPU: "0.5"}}),
        422,
        f"spec.containers[0].resources.limits[{GPU}]",
        id="fractional-extended-resource",
    ),
    pytest.param(
        PODS,
        pod().set("spec.containers[0].resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
        422,
        "spec.containers[0].resources.requests[cpu]",
        id="request-above-limit",
    ),
    pytest.param(
        PODS,
        pod().set("spec.containers[0].resources", {"requests": {"cpu": "lots"}}),
        422,
        "spec.containers[0].resources.requests[cpu]",
        id="bad-quantity",
    ),
    pytest.param(PODS, pod().label("app", "not valid!"), 422, "metadata.labels[app]", id="bad-label-value"),
    pytest.param(
        PODS,
        pod().set("metadata.finalizers", ["nodomain"]),
        422,
        "metadata.finalizers[0]",
        id="unqualified-finalizer",
    ),
    pytest.param(
        PODS,
        pod().set("spec.tolerations", [{"key": "k", "effect": "Sometimes"}]),
        422,
        "spec.tolerations[0].effect",
        id="bad-toleration-effect",
    ),
    pytest.param(JOBS, job("j"), 422, "spec.template.spec.restartPolicy", id="job-restart-always"),
    pytest.param(
        JOBS,
        batch_job().set("spec.selector", {"matchLabels": {"a": "b"}}),
        422,
        "spec.template.metadata.labels",
        id="job-manual-selector-mismatch",
    ),
    pytest.param(JOBS, batch_job("j" * 64), 422, "metadata.name", id="job-name-over-63"),
    pytest.param(NODES, node("n").taint("k", "v", "Never"), 422, "spec.taints[0].effect", id="bad-taint"),
    pytest.param(NODES, node("n").allocatable(cpu="x"), 422, "status.allocatable[cpu]", id="bad-allocatable"),
    pytest.param("/api/v1/namespaces", namespace("has.dot"), 422, "metadata.name", id="namespace-not-label"),
    pytest.param(
        CONFIGMAPS,
        Manifest("v1", "ConfigMap", "c").set("data", {"a/b": "x"}),
        422,
        "data[a/b]",
        id="bad-config-key",
    ),
    pytest.param(
        "/apis/coordination.k8s.io/v1/namespaces/default/leases",
        Manifest("coordination.k8s.io/v1", "Lease", "l").set("spec.leaseDurationSeconds", 0),
        422,
        "spec.leaseDurationSeconds",
        id="lease-zero-duration",
    ),
    pytest.param("/api/v1/namespaces/nowhere/pods", pod(ns="nowhere"), 404, None, id="namespace-missing"),
    pytest.param(PODS, pod(ns="other"), 400, None, id="namespace-mismatch"),
    pytest.param(
        PODS, pod().set("metadata.resourceVersion", "5"), 500, None, id="resource-version-on-create"
    ),
    pytest.param(PODS, Manifest("batch/v1", "Job", "x"), 400, None, id="kind-mismatch"),
    pytest.param("/api/v1/namespaces/default/widgets", pod(), 404, None, id="unknown-resource"),
    pytest.param("/apis/batch/v2/namespaces/default/jobs", batch_job(), 404, None, id="unknown-version"),
]


@pytest.mark.parametrize(("path", "obj", "want_code", "want_field"), REFUSED_CREATES)
def test_refuses_what_a_real_server_refuses(
    rest: Rest, store: Store, *, path: str, obj: Manifest, want_code: int, want_field: str | None
) -> None:
    before = store.resource_version
    reply = rest.post(path, obj.to_dict())
    assert reply.status == want_code, reply.body
    assert (reply.body["kind"], reply.body["code"]) == ("Status", want_code)
    if want_field is not None:
        assert want_field in [cause["field"] for cause in reply.body["details"]["causes"]], reply.body
    assert store.resource_version == before, "a refused write must not change anything"


def test_unknown_fields_are_dropped_with_a_warning_or_refused_when_strict(rest: Rest) -> None:
    body = pod().set("extra", 1).set("metadata.colour", "red").to_dict()
    lenient = rest.post(PODS, body)
    assert lenient.status == 201
    assert "extra" not in lenient.body
    assert "colour" not in lenient.body["metadata"]
    assert any('unknown field \\"extra\\"' in w for w in lenient.warnings), lenient.warnings
    strict = rest.post(PODS, pod("q").set("extra", 1).to_dict(), fieldValidation="Strict")
    assert (strict.status, strict.reason) == (400, "BadRequest")
    assert 'unknown field "extra"' in strict.body["message"]


def test_dry_run_validates_without_storing(rest: Rest, store: Store) -> None:
    before = store.resource_version
    assert rest.post(PODS, pod("p").to_dict(), dryRun="All").status == 201
    assert rest.post(PODS, pod("BAD").to_dict(), dryRun="All").status == 422
    assert store.resource_version == before
    assert rest.get(f"{PODS}/p").status == 404


# --- update ------------------------------------------------------------------------------------------


def test_update_with_a_stale_resource_version_conflicts(rest: Rest) -> None:
    first = created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c").set("data", {"k": "1"}))
    second = rest.put(f"{CONFIGMAPS}/c", {**first, "data": {"k": "2"}})
    assert second.status == 200
    assert int(second.body["metadata"]["resourceVersion"]) > int(first["metadata"]["resourceVersion"])
    stale = rest.put(f"{CONFIGMAPS}/c", {**first, "data": {"k": "3"}})
    assert (stale.status, stale.reason) == (409, "Conflict")
    assert "the object has been modified" in stale.body["message"]
    unconditional = {**first, "data": {"k": "4"}, "metadata": {"name": "c"}}
    assert rest.put(f"{CONFIGMAPS}/c", unconditional).status == 200


def test_update_that_changes_nothing_keeps_the_resource_version(rest: Rest) -> None:
    made = created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c").set("data", {"k": "1"}))
    same = rest.put(f"{CONFIGMAPS}/c", made)
    assert same.body["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]


def test_update_of_a_missing_object_or_with_a_different_name_is_refused(rest: Rest) -> None:
    assert rest.put(f"{CONFIGMAPS}/c", Manifest("v1", "ConfigMap", "c").to_dict()).status == 404
    created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c"))
    assert rest.put(f"{CONFIGMAPS}/c", Manifest("v1", "ConfigMap", "d").to_dict()).status == 400


def _pod_with(made: dict[str, Any], path: list[str | int], value: Any) -> dict[str, Any]:
    node: Any = made
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    return made


IMMUTABLE_POD_CHANGES = [
    pytest.param(["spec", "containers", 0, "image"], "busybox:2", 200, id="image-may-change"),
    pytest.param(["spec", "activeDeadlineSeconds"], 30, 200, id="deadline-may-be-set"),
    pytest.param(
        ["spec", "tolerations"], [{"key": "k", "operator": "Exists"}], 200, id="tolerations-may-grow"
    ),
    pytest.param(
        ["spec", "containers", 0, "resources"], {"requests": {"cpu": "2"}}, 422, id="resources-fixed"
    ),
    pytest.param(["spec", "nodeName"], "n1", 422, id="node-name-only-by-binding"),
    pytest.param(["spec", "nodeSelector"], {"a": "b"}, 422, id="node-selector-fixed-without-gates"),
]


@pytest.mark.parametrize(("path", "value", "want_code"), IMMUTABLE_POD_CHANGES)
def test_pod_spec_is_immutable_but_for_a_few_fields(
    rest: Rest, path: list[str | int], value: Any, want_code: int
) -> None:
    made = created(rest, PODS, pod("p"))
    reply = rest.put(f"{PODS}/p", _pod_with(made, path, value))
    assert reply.status == want_code, reply.body


def test_gated_pod_takes_node_selector_additions_and_gate_removals_only(rest: Rest) -> None:
    made = created(rest, PODS, pod("p").set("spec.schedulingGates", [{"name": "example.com/gate"}]))
    made["spec"]["nodeSelector"] = {"pool": "a"}
    step = rest.put(f"{PODS}/p", made)
    assert step.status == 200, step.body
    changed = step.body
    changed["spec"]["nodeSelector"] = {"pool": "b"}
    assert rest.put(f"{PODS}/p", changed).status == 422
    changed["spec"]["nodeSelector"] = {"pool": "a"}
    changed["spec"]["schedulingGates"] = [{"name": "example.com/gate"}, {"name": "example.com/other"}]
    assert rest.put(f"{PODS}/p", changed).status == 422
    changed["spec"]["schedulingGates"] = []
    assert rest.put(f"{PODS}/p", changed).status == 200


def test_job_template_changes_only_while_suspended_and_never_started(rest: Rest) -> None:
    made = created(rest, JOBS, batch_job().set("spec.suspend", True))
    assert made["spec"]["suspend"] is True
    made["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "h100"}
    made["spec"]["suspend"] = False
    resumed = rest.put(f"{JOBS}/j", made)
    assert resumed.status == 200, resumed.body
    running = resumed.body
    running["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "a100"}
    refused = rest.put(f"{JOBS}/j", running)
    assert refused.status == 422
    assert refused.body["details"]["causes"][0]["field"] == "spec.template"
    running["spec"]["template"]["spec"]["nodeSelector"] = {"gpu": "h100"}
    running["spec"]["selector"] = {"matchLabels": {"other": "x"}}
    assert rest.put(f"{JOBS}/j", running).status == 422


def test_immutable_configmap(rest: Rest) -> None:
    made = created(
        rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c").set("data", {"k": "1"}).set("immutable", True)
    )
    made["data"] = {"k": "2"}
    assert rest.put(f"{CONFIGMAPS}/c", made).status == 422


def test_uid_is_immutable_and_generation_follows_spec_changes(rest: Rest) -> None:
    made = created(rest, JOBS, batch_job().set("spec.suspend", True))
    assert made["metadata"]["generation"] == 1
    made["metadata"]["labels"] = {"a": "b"}
    relabelled = rest.put(f"{JOBS}/j", made).body
    assert relabelled["metadata"]["generation"] == 1
    relabelled["spec"]["suspend"] = False
    resumed = rest.put(f"{JOBS}/j", relabelled).body
    assert resumed["metadata"]["generation"] == 2
    resumed["metadata"]["uid"] = "00000000-0000-0000-0000-000000000000"
    assert rest.put(f"{JOBS}/j", resumed).status == 422


# --- status subresource ------------------------------------------------------------------------------


def test_status_changes_only_through_the_status_subresource(rest: Rest) -> None:
    made = created(rest, PODS, pod("p"))
    made["status"] = {"phase": "Running"}
    via_main = rest.put(f"{PODS}/p", made)
    assert via_main.status == 200
    assert via_main.body["status"]["phase"] == "Pending"
    current = via_main.body
    current["status"] = {"phase": "Running"}
    current["spec"]["activeDeadlineSeconds"] = 5
    current["metadata"]["labels"] = {"ignored": "yes"}
    via_status = rest.put(f"{PODS}/p/status", current)
    assert via_status.status == 200, via_status.body
    assert via_status.body["status"]["phase"] == "Running"
    assert "activeDeadlineSeconds" not in via_status.body["spec"]
    assert "labels" not in via_status.body["metadata"]
    bad = {**via_status.body, "status": {"phase": "Sleeping"}}
    assert rest.put(f"{PODS}/p/status", bad).status == 422


def test_status_subresource_exists_only_where_served(rest: Rest) -> None:
    created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c"))
    assert rest.get(f"{CONFIGMAPS}/c/status").status == 404
    created(rest, PODS, pod("p"))
    assert rest.get(f"{PODS}/p/binding").status == 405  # served, but for create only
    assert rest.get(f"{PODS}/p/logs").status == 404


# --- list ---------------------------------------------------------------------------------------------


@pytest.fixture
def labelled(rest: Rest) -> None:
    for name, labels, node_name in [
        ("a", {"team": "x", "tier": "1"}, "n1"),
        ("b", {"team": "y", "tier": "2"}, "n2"),
        ("c", {"team": "x"}, None),
    ]:
        obj = pod(name)
        for key, value in labels.items():
            obj.label(key, value)
        if node_name:
            obj.set("spec.nodeName", node_name)
        created(rest, PODS, obj)


SELECTIONS = [
    pytest.param({}, ["a", "b", "c"], id="all"),
    pytest.param({"labelSelector": "team=x"}, ["a", "c"], id="equals"),
    pytest.param({"labelSelector": "team==x,tier=1"}, ["a"], id="and"),
    pytest.param({"labelSelector": "team!=x"}, ["b"], id="not-equals"),
    pytest.param({"labelSelector": "tier in (1,2)"}, ["a", "b"], id="in"),
    pytest.param({"labelSelector": "tier notin (1)"}, ["b", "c"], id="notin-includes-missing"),
    pytest.param({"labelSelector": "tier"}, ["a", "b"], id="exists"),
    pytest.param({"labelSelector": "!tier"}, ["c"], id="does-not-exist"),
    pytest.param({"labelSelector": "tier>1"}, ["b"], id="greater-than"),
    pytest.param({"fieldSelector": "spec.nodeName=n1"}, ["a"], id="node-name"),
    pytest.param({"fieldSelector": "spec.nodeName="}, ["c"], id="unbound"),
    pytest.param({"fieldSelector": "spec.nodeName!=n1"}, ["b", "c"], id="node-name-not"),
    pytest.param({"fieldSelector": "metadata.name=b"}, ["b"], id="name"),
    pytest.param({"fieldSelector": "status.phase=Pending", "labelSelector": "team=y"}, ["b"], id="both"),
]


@pytest.mark.usefixtures("labelled")
@pytest.mark.parametrize(("params", "want_names"), SELECTIONS)
def test_list_selects_by_labels_and_fields(rest: Rest, params: dict[str, str], want_names: list[str]) -> None:
    reply = rest.get(PODS, **params)
    assert reply.status == 200, reply.body
    assert reply.body["kind"] == "PodList"
    assert [item["metadata"]["name"] for item in reply.body["items"]] == want_names
    assert "kind" not in reply.body["items"][0] if reply.body["items"] else True


@pytest.mark.usefixtures("labelled")
@pytest.mark.parametrize(
    "params",
    [{"fieldSelector": "spec.containers=x"}, {"labelSelector": "a in ()"}, {"labelSelector": "a>b"}],
    ids=["unsupported-field", "empty-set", "non-integer-gt"],
)
def test_list_refuses_bad_selectors(rest: Rest, params: dict[str, str]) -> None:
    assert rest.get(PODS, **params).status == 400


@pytest.mark.usefixtures("labelled")
def test_list_across_namespaces_and_pages(rest: Rest) -> None:
    created(rest, "/api/v1/namespaces", namespace("other"))
    created(rest, "/api/v1/namespaces/other/pods", pod("z", "other"))
    everywhere = rest.get("/api/v1/pods").body["items"]
    assert [(p["metadata"]["namespace"], p["metadata"]["name"]) for p in everywhere] == [
        ("default", "a"),
        ("default", "b"),
        ("default", "c"),
        ("other", "z"),
    ]
    first = rest.get(PODS, limit=2).body
    assert [p["metadata"]["name"] for p in first["items"]] == ["a", "b"]
    assert first["metadata"]["remainingItemCount"] == 1
    created(rest, PODS, pod("d"))  # not in the snapshot the continuation reads
    rest_of = rest.get(PODS, limit=2, **{"continue": first["metadata"]["continue"]}).body
    assert [p["metadata"]["name"] for p in rest_of["items"]] == ["c"]
    assert rest_of["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert "continue" not in rest_of["metadata"]


def test_list_at_an_exact_past_version_and_410_after_compaction(rest: Rest, store: Store) -> None:
    created(rest, PODS, pod("a"))
    then = rest.get(PODS).body["metadata"]["resourceVersion"]
    created(rest, PODS, pod("b"))
    assert rest.delete(f"{PODS}/a", gracePeriodSeconds=0).status == 200
    past = rest.get(PODS, resourceVersion=then, resourceVersionMatch="Exact").body
    assert [p["metadata"]["name"] for p in past["items"]] == ["a"]
    now = rest.get(PODS, resourceVersion=then).body  # NotOlderThan: the current state
    assert [p["metadata"]["name"] for p in now["items"]] == ["b"]
    too_new = rest.get(PODS, resourceVersion=str(store.resource_version + 10))
    assert (too_new.status, too_new.reason) == (504, "Timeout")
    store.compact()
    gone = rest.get(PODS, resourceVersion=then, resourceVersionMatch="Exact")
    assert (gone.status, gone.reason) == (410, "Expired")


# --- delete -------------------------------------------------------------------------------------------


def test_delete_answers_with_the_object_or_a_status(rest: Rest) -> None:
    created(rest, PODS, pod("p"))
    created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c"))
    deleted_pod = rest.delete(f"{PODS}/p")
    assert (deleted_pod.status, deleted_pod.body["kind"]) == (200, "Pod")
    deleted_cm = rest.delete(f"{CONFIGMAPS}/c")
    assert (deleted_cm.status, deleted_cm.body["kind"], deleted_cm.body["status"]) == (
        200,
        "Status",
        "Success",
    )
    assert rest.delete(f"{CONFIGMAPS}/c").status == 404


def test_finalizers_hold_an_object_until_they_are_removed(rest: Rest) -> None:
    created(
        rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c").set("metadata.finalizers", ["example.com/hold"])
    )
    pending = rest.delete(f"{CONFIGMAPS}/c")
    assert pending.status == 202
    assert pending.body["metadata"]["deletionTimestamp"]
    held = rest.get(f"{CONFIGMAPS}/c").body
    held["metadata"]["finalizers"] = ["example.com/hold", "example.com/more"]
    assert rest.put(f"{CONFIGMAPS}/c", held).status == 422
    held["metadata"]["finalizers"] = []
    assert rest.put(f"{CONFIGMAPS}/c", held).status == 200
    assert rest.get(f"{CONFIGMAPS}/c").status == 404


def test_bound_pods_wait_out_their_grace_period_on_the_virtual_clock(rest: Rest, store: Store) -> None:
    created(rest, PODS, pod("p").set("spec.nodeName", "n1"))
    pending = rest.delete(f"{PODS}/p", gracePeriodSeconds=10)
    assert pending.status == 202
    assert pending.body["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:10Z"
    assert pending.body["metadata"]["deletionGracePeriodSeconds"] == 10
    store.advance(9)
    assert rest.get(f"{PODS}/p").status == 200
    store.advance(1)
    assert rest.get(f"{PODS}/p").status == 404
    created(rest, PODS, pod("q").set("spec.nodeName", "n1"))
    assert rest.delete(f"{PODS}/q", gracePeriodSeconds=0).status == 200
    created(rest, PODS, pod("unbound"))
    assert rest.delete(f"{PODS}/unbound").status == 200


def test_delete_preconditions(rest: Rest) -> None:
    made = created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "c"))
    wrong = rest.delete(f"{CONFIGMAPS}/c", {"preconditions": {"uid": "nope"}})
    assert wrong.status == 409
    right = rest.delete(
        f"{CONFIGMAPS}/c", {"preconditions": {"resourceVersion": made["metadata"]["resourceVersion"]}}
    )
    assert right.status == 200


def test_owned_objects_are_collected_or_orphaned(rest: Rest) -> None:
    owner = created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "owner"))
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
    created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "child").set("metadata.ownerReferences", [ref]))
    assert rest.delete(f"{CONFIGMAPS}/owner").status == 200
    assert rest.get(f"{CONFIGMAPS}/child").status == 404
    owner = created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "owner"))
    ref["uid"] = owner["metadata"]["uid"]
    created(rest, CONFIGMAPS, Manifest("v1", "ConfigMap", "child").set("metadata.ownerReferences", [ref]))
    assert rest.delete(f"{CONFIGMAPS}/owner", propagationPolicy="Orphan").status == 200
    orphan = rest.get(f"{CONFIGMAPS}/child").body
    assert "ownerReferences" not in orphan["metadata"]


def test_deleting_a_namespace_deletes_its_content(rest: Rest) -> None:
    created(rest, "/api/v1/namespaces", namespace("team"))
    created(
        rest,
        "/api/v1/namespaces/team/configmaps",
        Manifest("v1", "ConfigMap", "c", "team").set("metadata.finalizers", ["example.com/hold"]),
    )
    created(rest, "/api/v1/namespaces/team/pods", pod("p", "team"))
    terminating = rest.delete("/api/v1/namespaces/team")
    assert terminating.status == 202
    assert terminating.body["status"]["phase"] == "Terminating"
    assert rest.get("/api/v1/namespaces/team/pods/p").status == 404
    refused = rest.post("/api/v1/namespaces/team/pods", pod("q", "team").to_dict())
    assert (refused.status, refused.reason) == (403, "Forbidden")
    held = rest.get("/api/v1/namespaces/team/configmaps/c").body
    held["metadata"]["finalizers"] = []
    assert rest.put("/api/v1/namespaces/team/configmaps/c", held).status == 200
    assert rest.get("/api/v1/namespaces/team").status == 404


def test_delete_collection_by_label(rest: Rest) -> None:
    for name, team in [("a", "x"), ("b", "y"), ("c", "x")]:
        created(rest, PODS, pod(name).label("team", team))
    reply = rest.delete(PODS, labelSelector="team=x")
    assert reply.status == 200
    assert [p["metadata"]["name"] for p in reply.body["items"]] == ["a", "c"]
    assert [p["metadata"]["name"] for p in rest.get(PODS).body["items"]] == ["b"]
