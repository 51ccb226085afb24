"""The least-privilege check's parts, without a cluster: the manifests' documented exceptions, the
audit log's reading, and the report (tests/test_deployed_e2e.py runs it on the real control plane)."""

from __future__ import annotations

import json

import pytest

import rbac_audit

CONTROLLER = rbac_audit.account("gpuplane-controller")
REAPER = rbac_audit.account("gpuplane-reaper")
WEB = rbac_audit.account("gpuplane-web")


def test_every_component_account_is_bound_and_every_documented_exception_is_granted() -> None:
    grants = rbac_audit.granted(rbac_audit.documents())
    assert set(grants) == {CONTROLLER, REAPER, WEB}
    for user, (pairs, documented) in grants.items():
        assert pairs
        extra = set(documented) - pairs
        assert not extra, f"{user} documents rights it is not granted: {extra}"
        assert all(reason for reason in documented.values())


def test_no_wildcards_and_no_escalating_verbs() -> None:
    for doc in rbac_audit.documents():
        if doc["kind"] not in rbac_audit.ROLE_KINDS:
            continue
        for rule in doc["rules"]:
            for key in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)
            assert not set(rule["verbs"]) & {"escalate", "bind", "impersonate", "deletecollection"}


def test_writes_in_gpuplane_namespace_are_namespaced() -> None:
    """The leader Lease and the runtime history live in gpuplane's namespace: a Role, not the ClusterRole."""
    for doc in rbac_audit.documents():
        if doc["kind"] == "ClusterRole":
            resources = {r for rule in doc["rules"] for r in rule["resources"]}
            assert not resources & {"leases", "configmaps", "secrets"}, doc["metadata"]["name"]


def _event(user: str, verb: str, resource: str, code: int, *, group: str = "", sub: str = "") -> str:
    ref = {"resource": resource, "apiGroup": group, **({"subresource": sub} if sub else {})}
    return json.dumps(
        {"user": {"username": user}, "verb": verb, "objectRef": ref, "responseStatus": {"code": code}}
    )


def test_the_audit_log_gives_each_account_its_pairs_and_refusals() -> None:
    lines = [
        _event(CONTROLLER, "list", "pods", 200),
        _event(CONTROLLER, "create", "pods", 201, sub="binding"),
        _event(CONTROLLER, "watch", "jobsets", 403, group="jobset.x-k8s.io"),
        json.dumps({"user": {"username": CONTROLLER}, "verb": "get", "requestURI": "/apis"}),  # discovery
        _event(REAPER, "delete", "pods", 200),
        "",
    ]
    calls = rbac_audit.used(lines)
    assert calls[CONTROLLER] == {
        ("", "pods", "list"): {200},
        ("", "pods/binding", "create"): {201},
        ("jobset.x-k8s.io", "jobsets", "watch"): {403},
    }
    assert rbac_audit.forbidden(calls[CONTROLLER]) == {("jobset.x-k8s.io", "jobsets", "watch")}
    granted = {("", "pods", "list"), ("", "pods", "delete"), ("", "events", "create")}
    documented = {("", "events", "create"): "a reason"}
    assert rbac_audit.unused(granted, documented, calls[CONTROLLER]) == {("", "pods", "delete")}
    assert rbac_audit.format_pairs({("", "pods", "delete"), ("apps", "deployments", "get")}) == (
        "delete pods, get deployments.apps"
    )


def test_documented_exceptions_parse_lists_and_need_a_reason() -> None:
    role = {
        "metadata": {
            "name": "r",
            "annotations": {rbac_audit.KEPT_ANNOTATION: "get,list deployments.apps,pods: owners\n"},
        }
    }
    assert rbac_audit.kept(role) == {
        ("apps", "deployments", "get"): "owners",
        ("apps", "deployments", "list"): "owners",
        ("", "pods", "get"): "owners",
        ("", "pods", "list"): "owners",
    }
    role["metadata"]["annotations"][rbac_audit.KEPT_ANNOTATION] = "get pods\n"
    with pytest.raises(ValueError, match="no reason"):
        rbac_audit.kept(role)
