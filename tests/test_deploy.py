"""Checks on the deployment manifests under deploy/.

Every YAML file there is parsed with
PyYAML and checked against the code it deploys:

* the CRDs are structural and name the same kinds, plurals, scopes and storage version as the
  ``Resource`` constants in ``gpuplane.k8s.api``;
* the ClusterRole and the leader-election Role grant exactly what the controller uses: the set is
  written below from reading the code and cross-checked against the API calls found in the
  controller's source, the informers' resources and every ``Resource`` constant;
* the webhook configuration targets pod CREATE and the CREATE of every job kind the webhook
  suspends, nothing else, and reaches the webhook's Service and port;
* the Deployments run commands and flags that ``gpuplane`` really accepts, with hardened pods;
* ``kubectl kustomize`` renders, when kubectl is installed.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.main import get_command

from apiserver.fixtures import E2E_KUBECONFIG
from gpuplane.cli.app import build_app
from gpuplane.k8s import admitting as k8s_admitting
from gpuplane.k8s import api as k8s_api
from gpuplane.k8s import binding as k8s_binding
from gpuplane.k8s import clusterstate as k8s_clusterstate
from gpuplane.k8s import controller as k8s_controller
from gpuplane.k8s import creating as k8s_creating
from gpuplane.k8s import dra_claims as k8s_dra_claims
from gpuplane.k8s import (
    eta_writer,
    integrations,
    leader,
    multikueue_dispatch,
    multikueue_flow,
    multikueue_jobs,
    multikueue_status,
    visibility,
)
from gpuplane.k8s import evicting as k8s_evicting
from gpuplane.k8s import finishing as k8s_finishing
from gpuplane.k8s import informer as k8s_informer
from gpuplane.k8s import multikueue as k8s_multikueue
from gpuplane.k8s import provisioning as k8s_provisioning
from gpuplane.k8s import reporting as k8s_reporting
from gpuplane.k8s import runtime_store as k8s_runtime_store
from gpuplane.k8s import spot as k8s_spot
from gpuplane.k8s import warm as k8s_warm
from gpuplane.k8s import webhook as webhook_module
from gpuplane.k8s import writing as k8s_writing
from gpuplane.k8s.api import Resource
from gpuplane.k8s.webhook import WebhookSettings, job_patch, pod_patch
from gpuplane.model import labels as keys

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
CRDS = DEPLOY / "crds"
DOCS = ROOT / "docs" / "deploy.md"
NAMESPACE = "gpuplane-system"
SERVICE_ACCOUNT = "gpuplane-controller"
WEBHOOK_SECRET = "gpuplane-webhook-tls"

Perm = tuple[str, str, str]  # (API group, resource[/subresource], verb)
Doc = dict[str, Any]


# --- loading ----------------------------------------------------------------------------------------


def _yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def _load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


CRDS_KUSTOMIZATION = CRDS / "Kustomization"  # a name kustomize reads and `kubectl apply -f` skips


def _kustomization() -> Doc:
    return _load(DEPLOY / "kustomization.yaml")[0]


def _manifests() -> list[Doc]:
    """Every object that `kubectl apply -k deploy` creates (the CRDs are installed apart)."""
    return [doc for res in _kustomization()["resources"] for doc in _load(DEPLOY / res)]


def _one(docs: list[Doc], kind: str, name: str | None = None) -> Doc:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _crds() -> list[Doc]:
    """Every CRD that `kubectl apply -k deploy/crds` creates."""
    listed = _load(CRDS_KUSTOMIZATION)[0]["resources"]
    return [d for res in listed for d in _load(CRDS / res) if d["kind"] == "CustomResourceDefinition"]


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_parses(path: Path) -> None:
    docs = _load(path)
    assert docs, f"{path.name} holds no document"
    for doc in docs:
        assert isinstance(doc, dict)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = _kustomization()
    assert kustomization["kind"] == "Kustomization"
    listed = set(kustomization["resources"])
    on_disk = {str(p.relative_to(DEPLOY)) for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == on_disk
    crds = _load(CRDS_KUSTOMIZATION)[0]
    assert crds["kind"] == "Kustomization"
    assert set(crds["resources"]) == {p.name for p in CRDS.glob("*.yaml")}


def test_uninstalling_gpuplane_keeps_the_crds() -> None:
    # `kubectl delete -k deploy` deletes what deploy/kustomization.yaml lists: it must list no CRD
    # (deleting one deletes every queue and workload of its kind); deploy/crds lists them all.
    assert not [d for d in _manifests() if d["kind"] == "CustomResourceDefinition"]
    assert not [r for r in _kustomization()["resources"] if r.startswith("crds")]
    assert len(_crds()) == len({p.name for p in CRDS.glob("*.yaml")})


# --- CRDs -----------------------------------------------------------------------------------------

KUEUE_RESOURCES = [r for r in vars(k8s_api).values() if isinstance(r, Resource) and r.group == k8s_api.KUEUE]
_TYPES = {"object", "array", "string", "integer", "number", "boolean"}
_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("type", "description", "default", "additionalProperties", "nullable")


def _walk_junctor(node: Any, path: str, problems: list[str]) -> None:
    """Inside allOf/anyOf/oneOf/not only validations may appear (structural rule 3)."""
    if not isinstance(node, dict):
        return
    problems.extend(
        f"{path}: {key} inside a logical junctor" for key in _FORBIDDEN_IN_JUNCTORS if key in node
    )
    for child in node.get("properties", {}).values():
        _walk_junctor(child, path, problems)
    if isinstance(node.get("items"), dict):
        _walk_junctor(node["items"], path, problems)


def _default_matches(node: Doc, value: Any) -> bool:
    kind = node.get("type")
    ok = {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }.get(str(kind), False)
    return ok and ("enum" not in node or value in node["enum"])


def structural_problems(node: Any, path: str = "") -> list[str]:
    """What keeps an OpenAPI v3 schema from being structural in the API server's sense."""
    problems: list[str] = []
    if not isinstance(node, dict):
        return [f"{path}: not a schema"]
    preserve = node.get("x-kubernetes-preserve-unknown-fields") is True
    int_or_string = node.get("x-kubernetes-int-or-string") is True
    problems += _own_problems(node, path, preserve=preserve, int_or_string=int_or_string)
    for junctor in _JUNCTORS:
        if junctor in node and not (int_or_string and junctor == "anyOf"):
            for branch in node[junctor] if isinstance(node[junctor], list) else [node[junctor]]:
                _walk_junctor(branch, f"{path}.{junctor}", problems)
    for name, child in node.get("properties", {}).items():
        problems += structural_problems(child, f"{path}.{name}")
    if isinstance(node.get("additionalProperties"), dict):
        problems += structural_problems(node["additionalProperties"], f"{path}.*")
    if "items" in node:
        items = node["items"]
        problems += structural_problems(items, f"{path}[]")
        if node.get("x-kubernetes-list-type") == "map":
            for key in node.get("x-kubernetes-list-map-keys", []):
                key_schema = items.get("properties", {}).get(key, {})
                if key not in items.get("required", []) and "default" not in key_schema:
                    problems.append(f"{path}: list-map key {key!r} is neither required nor defaulted")
    return problems


def _own_problems(node: dict[str, Any], path: str, *, preserve: bool, int_or_string: bool) -> list[str]:
    """What keeps one schema node, apart from its children, from being structural."""
    problems: list[str] = []
    if "type" not in node and not (preserve or int_or_string):
        problems.append(
            f"{path or '<root>'}: no type (and neither preserve-unknown-fields nor int-or-string)"
        )
    if "type" in node and node["type"] not in _TYPES:
        problems.append(f"{path}: unknown type {node['type']!r}")
    if int_or_string:
        if "type" in node:
            problems.append(f"{path}: int-or-string with a type")
        if "anyOf" in node and node["anyOf"] != [{"type": "integer"}, {"type": "string"}]:
            problems.append(f"{path}: int-or-string anyOf must be exactly integer, string")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties together")
    if node.get("type") == "array" and "items" not in node:
        problems.append(f"{path}: array without items")
    if "default" in node and not _default_matches(node, node["default"]):
        problems.append(f"{path}: default {node['default']!r} does not fit the schema")
    return problems


def _schema_at(schema: Doc, json_path: str) -> Doc | None:
    """The schema node a printer column's JSONPath points at (filters skipped), or None."""
    node: Doc | None = schema
    for step in re.sub(r"\[[^\]]*\]", "", json_path).strip(".").split("."):
        while node is not None and node.get("type") == "array":
            node = node.get("items")
        if node is None:
            return None
        node = node.get("properties", {}).get(step)
    return node


def test_crds_match_the_kueue_resources_the_code_uses() -> None:
    crds = _crds()
    assert {c["spec"]["names"]["kind"] for c in crds} == {r.kind for r in KUEUE_RESOURCES}
    assert len(crds) == len(KUEUE_RESOURCES)


@pytest.mark.parametrize("resource", KUEUE_RESOURCES, ids=lambda r: r.kind)
def test_crd_is_consistent_and_structural(resource: Resource) -> None:
    crd = next(c for c in _crds() if c["spec"]["names"]["kind"] == resource.kind)
    spec = crd["spec"]
    names = spec["names"]
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert spec["group"] == resource.group == k8s_api.KUEUE
    assert names["plural"] == resource.plural
    assert crd["metadata"]["name"] == f"{names['plural']}.{spec['group']}"
    assert names["singular"] == resource.kind.lower()
    assert names["listKind"] == f"{resource.kind}List"
    assert spec["scope"] == ("Namespaced" if resource.namespaced else "Cluster")
    versions = {v["name"]: v for v in spec["versions"]}
    assert set(versions) == {"v1beta1", "v1beta2"}
    assert all(v["served"] for v in versions.values())
    storage = [name for name, v in versions.items() if v["storage"]]
    assert storage == [resource.version], "the controller reads the storage version"
    # Without a conversion webhook both versions must share one storage shape.
    assert spec.get("conversion", {"strategy": "None"})["strategy"] == "None"
    for name, version in versions.items():
        schema = version["schema"]["openAPIV3Schema"]
        assert schema["type"] == "object"
        assert structural_problems(schema) == [], name
        assert schema["properties"]["metadata"] == {"type": "object"}, "metadata may not be constrained"
        for column in version.get("additionalPrinterColumns", []):
            if column["jsonPath"].startswith(".metadata."):
                continue
            target = _schema_at(schema, column["jsonPath"])
            assert target is not None, f"{name}: column {column['name']} points at {column['jsonPath']}"
            assert target.get("type") in (column["type"], None) or column["type"] == "string"


def test_status_subresource_wherever_the_controller_writes_status() -> None:
    status_writes = {(g, r.split("/")[0]) for g, r, _ in _required_cluster_perms() if r.endswith("/status")}
    # Built-in kinds serve their status subresource already, and so do the CRDs of the JobSet, Kubeflow
    # and KubeRay projects (a MultiKueue manager copies a worker job's status back); gpuplane's CRDs
    # must declare theirs.
    assert {r for g, r in status_writes if g != k8s_api.KUEUE} == {
        "resourceclaims",
        "jobs",
        "jobsets",
        "pytorchjobs",
        "trainjobs",
        "rayjobs",
    }
    writes_status = {r for g, r in status_writes if g == k8s_api.KUEUE}
    assert writes_status == {
        "workloads",
        "clusterqueues",
        "localqueues",
        "multikueueclusters",
        "admissionchecks",
    }
    for crd in _crds():
        if crd["spec"]["names"]["plural"] in writes_status:
            for version in crd["spec"]["versions"]:
                assert "status" in version.get("subresources", {}), crd["metadata"]["name"]


def test_printer_columns_show_cohort_queue_and_admitting_cluster_queue() -> None:
    by_kind = {c["spec"]["names"]["kind"]: c for c in _crds()}
    for version in by_kind["ClusterQueue"]["spec"]["versions"]:
        paths = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
        assert any("cohort" in p for p in paths), version["name"]
    for version in by_kind["Workload"]["spec"]["versions"]:
        paths = [c["jsonPath"] for c in version["additionalPrinterColumns"]]
        assert ".spec.queueName" in paths
        assert ".status.admission.clusterQueue" in paths


# Where a CRD keeps fields its schema does not spell out: only inside Workloads (pod templates,
# topology requests and assignments, admission-check updates), which gpuplane writes in shapes of
# both Kueue versions. Everywhere else an unknown field is pruned, as Kueue's CRDs prune it, so
# kubectl's Strict field validation rejects a typo (tests/test_crd_schema_realkube.py).
PRESERVING_KINDS = {"Workload"}


def _preserving_paths(schema: object, path: str = "") -> list[str]:
    if not isinstance(schema, dict):
        return []
    found = [path] if schema.get("x-kubernetes-preserve-unknown-fields") else []
    for name, sub in (schema.get("properties") or {}).items():
        found += _preserving_paths(sub, f"{path}.{name}")
    found += _preserving_paths(schema.get("items"), f"{path}[]")
    return found


def test_crds_prune_unknown_fields_as_kueue_does() -> None:
    for crd in _crds():
        if crd["spec"]["names"]["kind"] in PRESERVING_KINDS:
            continue
        for version in crd["spec"]["versions"]:
            paths = _preserving_paths(version["schema"]["openAPIV3Schema"])
            assert paths == [], f"{crd['metadata']['name']} {version['name']} keeps unknown fields at {paths}"


def test_queue_printer_columns_show_the_counts() -> None:
    by_kind = {c["spec"]["names"]["kind"]: c for c in _crds()}
    for kind, first in (("ClusterQueue", "Cohort"), ("LocalQueue", "ClusterQueue")):
        for version in by_kind[kind]["spec"]["versions"]:
            shown = [c["name"] for c in version["additionalPrinterColumns"] if not c.get("priority")]
            assert shown == [first, "Pending Workloads", "Admitted Workloads", "Age"], (kind, version["name"])


def test_structural_check_catches_what_the_api_server_rejects() -> None:
    assert structural_problems({"type": "object", "properties": {"x": {}}})
    assert structural_problems({"type": "array"})
    assert structural_problems({"type": "string", "default": 3})
    assert structural_problems({"type": "object", "anyOf": [{"type": "object"}]})
    keyed = {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
    assert structural_problems(
        {**keyed, "items": {"type": "object", "properties": {"name": {"type": "string"}}}}
    )
    assert not structural_problems({"x-kubernetes-preserve-unknown-fields": True})


# --- RBAC -------------------------------------------------------------------------------------------

# Written from reading src/gpuplane/k8s/controller.py, its write paths and leader.py; the informers'
# list/watch is derived below. test_written_list_matches_the_code keeps this list honest.
CONTROLLER_WRITES: set[Perm] = {
    (k8s_api.KUEUE, "workloads", "create"),  # a Workload per queued job / gated pod group
    (k8s_api.KUEUE, "workloads/status", "update"),  # admission, eviction, pending reason
    ("", "pods", "update"),  # lift the scheduling gate, label the pod with its workload
    ("", "pods/binding", "create"),  # bind the gang to its planned nodes
    ("", "pods/eviction", "create"),  # preemption (when not a dry run)
    ("", "events", "create"),  # QuotaReserved, Pending, Preempted, WouldPreempt
    (k8s_api.KUEUE, "workloads", "patch"),  # ETA annotations on pending Workloads
    ("authorization.k8s.io", "subjectaccessreviews", "create"),  # the visibility API's authorization
    (k8s_api.KUEUE, "workloads", "update"),  # checkpoint-request annotations; deactivation by a check
    (k8s_api.KUEUE, "workloads", "delete"),  # the Workload of a job that is gone
    (k8s_api.KUEUE, "provisioningrequestconfigs", "get"),  # the ProvisioningRequest check's parameters
    ("autoscaling.x-k8s.io", "provisioningrequests", "list"),
    ("autoscaling.x-k8s.io", "provisioningrequests", "create"),  # one per gang and attempt
    ("", "podtemplates", "create"),  # a template per pod set of a request
    (k8s_api.KUEUE, "clusterqueues/status", "patch"),  # counts, flavor usage, Active
    (k8s_api.KUEUE, "localqueues/status", "patch"),
    (k8s_api.DRA, "resourceclaims", "update"),  # kube-scheduler's finalizer on a claim it allocates
    (k8s_api.DRA, "resourceclaims/status", "update"),  # allocation and reservedFor; their release
    # MultiKueue on a manager (--multikueue): its objects, their Active conditions, the Jobs' status
    (k8s_api.KUEUE, "workloads", "get"),  # a Workload read again after a status write met a newer one
    (k8s_api.KUEUE, "multikueueclusters", "list"),
    (k8s_api.KUEUE, "multikueueconfigs", "list"),
    (k8s_api.KUEUE, "multikueueclusters", "patch"),  # each worker's summary, an annotation
    (k8s_api.KUEUE, "multikueueclusters/status", "update"),
    (k8s_api.KUEUE, "admissionchecks/status", "update"),
    ("batch", "jobs/status", "update"),  # a worker Job's status copied to the manager's Job
    ("jobset.x-k8s.io", "jobsets/status", "update"),  # the same for a JobSet
    ("kubeflow.org", "pytorchjobs/status", "update"),  # ... a PyTorchJob
    ("trainer.kubeflow.org", "trainjobs/status", "update"),  # ... a TrainJob
    ("ray.io", "rayjobs/status", "update"),  # ... and a RayJob
} | {
    # stamp templates + unsuspend on admission; suspend on preemption
    (i.resource.group, i.resource.plural, "update")
    for i in integrations.INTEGRATIONS.values()
}
LEADER_ELECTION: set[Perm] = {("coordination.k8s.io", "leases", v) for v in ("get", "create", "update")}
# The runtime history's ConfigMap, in gpuplane's namespace (its own Role).
RUNTIME_HISTORY: set[Perm] = {("", "configmaps", v) for v in ("get", "create", "update")}
# The warm buffer's placeholder pods, in gpuplane's namespace only (its own Role).
WARM_BUFFER: set[Perm] = {("", "pods", "create"), ("", "pods", "delete")}
# The workers' kubeconfigs of MultiKueue, Secrets in gpuplane's namespace (its own Role).
MULTIKUEUE_SECRETS: set[Perm] = {("", "secrets", "get")}
ROLES = (
    "gpuplane-leader-election",
    "gpuplane-runtime-history",
    "gpuplane-warm-buffer",
    "gpuplane-multikueue",
)
# A Workload's owner reference to its job sets blockOwnerDeletion; with the
# OwnerReferencesPermissionEnforcement admission plugin that needs update on <owner>/finalizers.
OWNER_FINALIZERS: set[Perm] = {
    (i.resource.group, f"{i.resource.plural}/finalizers", "update")
    for i in integrations.INTEGRATIONS.values()
}


def _informer_resources() -> list[Resource]:
    kinds = k8s_controller.ControllerConfig().integrations
    dra = k8s_clusterstate.DRA_READ  # watched on every cluster (empty where not served)
    return [*k8s_clusterstate.STATE_RESOURCES, *dra, *(integrations.INTEGRATIONS[k].resource for k in kinds)]


def _informer_perms() -> set[Perm]:
    return {(r.group, r.plural, verb) for r in _informer_resources() for verb in ("list", "watch")}


def _required_cluster_perms() -> set[Perm]:
    return _informer_perms() | CONTROLLER_WRITES | OWNER_FINALIZERS


_CLIENT_VERBS = {
    "list": "list",
    "watch": "watch",
    "get": "get",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
}
_HTTP_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _resources_named(node: ast.expr) -> list[Resource]:
    text = ast.unparse(node)
    if text == "self.resource":  # an informer: one of the informer resources
        return _informer_resources()
    if text == "resource":  # Binder._write: a job of an integration, or a pod
        return [k8s_api.PODS, *(i.resource for i in integrations.INTEGRATIONS.values())]
    if text == "res":  # Provisioner._make: a ProvisioningRequest or its PodTemplate
        return [k8s_api.PROVISIONING_REQUESTS, k8s_api.POD_TEMPLATES]
    if text == "kind.resource":  # MultiKueue's flow: a job kind it carries to workers
        return list(multikueue_jobs.REMOTE_OWNER_RESOURCES)
    if isinstance(node, ast.Attribute) and node.attr == "resource":  # jobs.INTEGRATIONS[kind].resource
        return [i.resource for i in integrations.INTEGRATIONS.values()]
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    value = getattr(k8s_api, name, None)
    assert isinstance(value, Resource), f"cannot tell which resource {text!r} is"
    return [value]


def _api_calls(module: Any) -> Iterator[Perm]:
    """(group, resource, verb) for every call on ``self.api`` in a module's source."""
    tree = ast.parse(inspect.getsource(module))
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if ast.unparse(node.func.value) != "self.api":
            continue
        method = node.func.attr
        if method == "request":
            verb_node, path_node = node.args[0], node.args[1]
            assert isinstance(verb_node, ast.Constant), ast.unparse(node)
            assert isinstance(path_node, ast.Call), ast.unparse(node)
            assert isinstance(path_node.func, ast.Attribute), ast.unparse(node)
            assert path_node.func.attr == "path", ast.unparse(node)
            verb = _HTTP_VERBS[verb_node.value]
            resources = _resources_named(path_node.func.value)
            subs = [a.value for a in path_node.args[2:3] if isinstance(a, ast.Constant)]
        else:
            assert method in _CLIENT_VERBS, f"unknown API call {ast.unparse(node)}"
            verb = _CLIENT_VERBS[method]
            resources = _resources_named(node.args[0])
            subs = [
                k.value.value for k in node.keywords if k.arg == "sub" and isinstance(k.value, ast.Constant)
            ]
        for res in resources:
            plural = f"{res.plural}/{subs[0]}" if subs else res.plural
            yield res.group, plural, verb


def _code_perms() -> set[Perm]:
    modules = (
        k8s_controller,
        k8s_creating,
        k8s_admitting,
        k8s_evicting,
        k8s_finishing,
        k8s_binding,
        k8s_dra_claims,
        k8s_reporting,
        k8s_writing,
        leader,
        k8s_informer,
        eta_writer,
        visibility,
        k8s_provisioning,
        k8s_spot,
        k8s_warm,
        k8s_runtime_store,
        k8s_multikueue,
        multikueue_flow,
        multikueue_dispatch,
        multikueue_status,
    )
    return {p for module in modules for p in _api_calls(module)}


def _rule_perms(rules: list[Doc]) -> set[Perm]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def test_the_code_scan_sees_the_calls() -> None:
    found = _code_perms()
    assert ("", "pods/binding", "create") in found
    assert (k8s_api.KUEUE, "workloads/status", "update") in found
    assert ("coordination.k8s.io", "leases", "get") in found


def test_written_list_matches_the_code() -> None:
    found = _code_perms()
    rest = found - _informer_perms() - LEADER_ELECTION - RUNTIME_HISTORY - WARM_BUFFER - MULTIKUEUE_SECRETS
    assert rest == CONTROLLER_WRITES
    assert {p for p in found if p[1] == "leases"} == LEADER_ELECTION
    assert {p for p in found if p[1] == "configmaps"} == RUNTIME_HISTORY


def test_cluster_role_grants_exactly_what_the_controller_uses() -> None:
    role = _one(_manifests(), "ClusterRole", "gpuplane-controller")
    granted = _rule_perms(role["rules"])
    required = _required_cluster_perms()
    assert not required - granted, f"missing: {sorted(required - granted)}"
    assert not granted - required, f"more than needed: {sorted(granted - required)}"
    assert all("resourceNames" not in r and "nonResourceURLs" not in r for r in role["rules"])


def test_leases_only_in_gpuplane_namespace_and_only_the_controllers_lease() -> None:
    docs = _manifests()
    role = _one(docs, "Role", "gpuplane-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE == k8s_controller.ControllerConfig().lease_namespace
    assert _rule_perms(role["rules"]) == LEADER_ELECTION
    lease_name = inspect.signature(leader.LeaderElector).parameters["name"].default
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule.get("resourceNames") == [lease_name]
    cluster_role = _one(docs, "ClusterRole")
    assert not {p for p in _rule_perms(cluster_role["rules"]) if p[1] == "leases"}


def test_the_runtime_history_is_one_config_map_in_gpuplane_namespace() -> None:
    docs = _manifests()
    role = _one(docs, "Role", "gpuplane-runtime-history")
    assert role["metadata"]["namespace"] == NAMESPACE == k8s_controller.ControllerConfig().lease_namespace
    assert _rule_perms(role["rules"]) == RUNTIME_HISTORY
    for rule in role["rules"]:
        if set(rule["verbs"]) & {"get", "update"}:
            assert rule.get("resourceNames") == [k8s_runtime_store.CONFIG_MAP_NAME]
    assert not {p for p in _rule_perms(_one(docs, "ClusterRole")["rules"]) if p[1] == "configmaps"}


def test_warm_buffer_pods_only_in_gpuplane_namespace() -> None:
    docs = _manifests()
    role = _one(docs, "Role", "gpuplane-warm-buffer")
    assert role["metadata"]["namespace"] == NAMESPACE == k8s_controller.ControllerConfig().lease_namespace
    assert _rule_perms(role["rules"]) == WARM_BUFFER
    cluster_pods = {p for p in _rule_perms(_one(docs, "ClusterRole")["rules"]) if p[1] == "pods"}
    assert not cluster_pods & WARM_BUFFER


def test_worker_kubeconfigs_are_read_only_in_gpuplane_namespace() -> None:
    docs = _manifests()
    role = _one(docs, "Role", "gpuplane-multikueue")
    assert role["metadata"]["namespace"] == NAMESPACE == k8s_multikueue.MultiKueueSettings().namespace
    assert _rule_perms(role["rules"]) == MULTIKUEUE_SECRETS
    assert not {p for p in _rule_perms(_one(docs, "ClusterRole")["rules"]) if p[1] == "secrets"}


def test_no_wildcards_or_escalation_anywhere() -> None:
    for doc in _manifests():
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in doc["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)
            assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate", "deletecollection"}


def test_every_api_resource_is_covered() -> None:
    docs = _manifests()
    granted = _rule_perms(_one(docs, "ClusterRole")["rules"])
    for name in ROLES:
        granted |= _rule_perms(_one(docs, "Role", name)["rules"])
    # NodePools are read only by the command-line tools (doctor, schedule --kubeconfig, dump), with
    # the user's own credentials; the controller never touches them.
    cli_only = {k8s_api.NODE_POOLS}
    for res in (r for r in vars(k8s_api).values() if isinstance(r, Resource) and r not in cli_only):
        assert any(g == res.group and p == res.plural for g, p, _ in granted), res


def test_bindings_give_the_roles_to_the_service_account() -> None:
    docs = _manifests()
    account = _one(docs, "ServiceAccount", SERVICE_ACCOUNT)
    assert account["metadata"]["namespace"] == NAMESPACE
    subject = {"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}
    pairs = [("ClusterRoleBinding", "ClusterRole", None)] + [("RoleBinding", "Role", name) for name in ROLES]
    for kind, role_kind, name in pairs:
        binding = _one(docs, kind, name)
        role = _one(docs, role_kind, name)
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"] == [subject]
        if kind == "RoleBinding":
            assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]


def test_docs_explain_every_permission() -> None:
    text = DOCS.read_text()
    docs = _manifests()
    rules = _one(docs, "ClusterRole")["rules"] + [
        r for name in ROLES for r in _one(docs, "Role", name)["rules"]
    ]
    for group, resource, _ in _rule_perms(rules):
        assert f"`{resource}`" in text, f"docs/deploy.md does not explain {group}/{resource}"


# --- webhook ---------------------------------------------------------------------------------------


POD_RULE = {
    "apiGroups": [""],
    "apiVersions": ["v1"],
    "operations": ["CREATE"],
    "resources": ["pods"],
    "scope": "Namespaced",
}
JOBS_HOOK = "queued-jobs.gpuplane.dev"


def _job_rules() -> list[Doc]:
    """One CREATE rule per integrated kind the webhook suspends (it has a suspend field)."""
    return [
        {
            "apiGroups": [i.resource.group],
            "apiVersions": [i.resource.version],
            "operations": ["CREATE"],
            "resources": [i.resource.plural],
            "scope": "Namespaced",
        }
        for i in integrations.INTEGRATIONS.values()
        if i.suspend is not None
    ]


def test_webhook_targets_pod_and_job_create_only() -> None:
    config = _one(_manifests(), "MutatingWebhookConfiguration")
    hooks = {hook["name"]: hook for hook in config["webhooks"]}
    assert hooks[JOBS_HOOK]["rules"] == _job_rules()
    assert {r["resources"][0] for r in hooks[JOBS_HOOK]["rules"]} >= {
        "jobs",
        "jobsets",
        "pytorchjobs",
        "rayjobs",
    }
    for hook in config["webhooks"]:
        if hook["name"] != JOBS_HOOK:
            assert hook["rules"] == [POD_RULE]
        assert hook["failurePolicy"] == "Ignore"
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["name"].count(".") >= 2
        excluded = [
            e
            for e in hook["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
        ]
        assert len(excluded) == 1
        assert {"kube-system", NAMESPACE} <= set(excluded[0]["values"])
        assert hook["clientConfig"]["service"] == {
            "name": "gpuplane-webhook",
            "namespace": NAMESPACE,
            "path": "/",
            "port": 443,
        }


def test_webhook_object_selectors_lose_no_pod_the_webhook_would_change() -> None:
    config = _one(_manifests(), "MutatingWebhookConfiguration")
    selected = set()
    for hook in config["webhooks"]:
        if hook["name"] == JOBS_HOOK:
            continue
        (expression,) = hook["objectSelector"]["matchExpressions"]
        assert expression["operator"] == "Exists"
        selected.add(expression["key"])
    assert selected == {keys.QUEUE_NAME_LABEL, keys.WORKLOAD_LABEL}
    unselected = {"metadata": {"name": "p", "labels": {"app": "x"}}, "spec": {"containers": []}}
    assert pod_patch(unselected) == []
    for label in selected:
        pod = {"metadata": {"name": "p", "labels": {label: "v"}}, "spec": {"containers": []}}
        assert pod_patch(pod), label


def test_webhook_sees_every_job_it_would_suspend() -> None:
    """No object selector on the jobs entry: a queue name in Kueue's annotation, or none at all
    under --manage-jobs-without-queue-name, still gets the job suspended."""
    hook = _one(_manifests(), "MutatingWebhookConfiguration")["webhooks"]
    (jobs_hook,) = [h for h in hook if h["name"] == JOBS_HOOK]
    assert "objectSelector" not in jobs_hook
    annotated = {"metadata": {"name": "j", "annotations": {keys.QUEUE_NAME_LABEL: "q"}}, "spec": {}}
    assert job_patch("Job", annotated)
    assert job_patch("Job", {"metadata": {"name": "j"}, "spec": {}}, WebhookSettings(True))


def test_webhook_configuration_is_accepted_by_a_real_api_server(tmp_path: Path) -> None:
    """``kubectl apply --dry-run=server`` of the MutatingWebhookConfiguration, on the real control
    plane of the end-to-end suite (``GPUPLANE_E2E_KUBECONFIG``): the API server validates every
    rule, selector and client configuration as it would at install."""
    kubeconfig = os.environ.get(E2E_KUBECONFIG)
    if not kubeconfig or shutil.which("kubectl") is None:
        pytest.skip("needs a real API server (GPUPLANE_E2E_KUBECONFIG) and kubectl")
    config = _one(_manifests(), "MutatingWebhookConfiguration")
    path = tmp_path / "webhook.yaml"
    path.write_text(yaml.safe_dump(config))
    command = [
        "kubectl",
        "--kubeconfig",
        kubeconfig,
        "apply",
        "--dry-run=server",
        "-f",
        str(path),
        "-o",
        "yaml",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert result.returncode == 0, result.stderr
    stored = yaml.safe_load(result.stdout)
    assert [h["name"] for h in stored["webhooks"]] == [h["name"] for h in config["webhooks"]]
    assert [h["rules"] for h in stored["webhooks"]] == [h["rules"] for h in config["webhooks"]]


def test_the_webhook_needs_no_api_access() -> None:
    """It answers from the AdmissionReview alone, so its pod mounts no token and no Role names it."""
    docs = _manifests()
    pod = _one(docs, "Deployment", "gpuplane-webhook")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        assert all("webhook" not in s["name"] for d in docs if d["kind"] == kind for s in d["subjects"])
    source = inspect.getsource(webhook_module)
    assert "KubeApi" not in source
    assert "load_api_client" not in source


def test_webhook_service_reaches_the_webhook_port() -> None:
    docs = _manifests()
    service = _one(docs, "Service", "gpuplane-webhook")
    assert service["metadata"]["namespace"] == NAMESPACE
    (port,) = service["spec"]["ports"]
    assert port["port"] == 443
    deployment = _one(docs, "Deployment", "gpuplane-webhook")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    params = _parse_command(container)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports[port["targetPort"]] == params["port"]


# --- Deployments ------------------------------------------------------------------------------------


def _parse_command(container: Doc) -> dict[str, Any]:
    """Parse the container's command line with gpuplane's own CLI; returns the option values."""
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[0] == "gpuplane", argv
    commands = getattr(get_command(build_app()), "commands", {})
    command = commands.get(argv[1])
    assert command is not None, f"gpuplane has no command {argv[1]!r}"
    with command.make_context(argv[1], list(argv[2:])) as ctx:
        return dict(ctx.params)


def _deployments() -> list[Doc]:
    return [d for d in _manifests() if d["kind"] == "Deployment"]


def test_namespace_enforces_restricted_pod_security() -> None:
    namespace = _one(_manifests(), "Namespace", NAMESPACE)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_controller_runs_with_leader_election_dry_run_and_its_account() -> None:
    deployment = _one(_manifests(), "Deployment", "gpuplane-controller")
    assert deployment["metadata"]["namespace"] == NAMESPACE
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == SERVICE_ACCOUNT
    (container,) = pod["containers"]
    params = _parse_command(container)
    assert container["args"][0] == "controller"
    assert container["args"][1] == "--dry-run", "docs/deploy.md switches dry run off at args[1]"
    assert params["dry_run"] is True
    assert params["leader_elect"] is True
    env = {e["name"]: e for e in container["env"]}
    assert params["lease_namespace"] == "$(POD_NAMESPACE)"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert params["identity"] == "$(POD_NAME)"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_webhook_serves_tls_from_its_secret_and_has_a_liveness_probe() -> None:
    deployment = _one(_manifests(), "Deployment", "gpuplane-webhook")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    params = _parse_command(container)
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for file in (params["cert"], params["key"]):
        mount = mounts[str(Path(file).parent)]
        assert volumes[mount["name"]]["secret"]["secretName"] == WEBHOOK_SECRET
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    probe_port = container["livenessProbe"]["tcpSocket"]["port"]
    assert ports.get(probe_port, probe_port) == params["port"]


@pytest.mark.parametrize("name", ["gpuplane-controller", "gpuplane-webhook"])
def test_pods_are_hardened_and_sized(name: str) -> None:
    pod = _one(_deployments(), "Deployment", name)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["readOnlyRootFilesystem"] is True
        assert "ALL" in context["capabilities"]["drop"]
        assert not context.get("privileged", False)
        for bound in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(container["resources"][bound]), (container["name"], bound)


# --- rendering ---------------------------------------------------------------------------------------


def test_kubectl_kustomize_renders_every_object() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; `kubectl kustomize deploy` could not be tried")
    for directory, objects in ((DEPLOY, _manifests()), (CRDS, _crds())):
        out = subprocess.run(
            [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=True, timeout=60
        ).stdout
        rendered = sorted((d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(out) if d)
        assert rendered == sorted((d["kind"], d["metadata"]["name"]) for d in objects)
