"""Discovery and OpenAPI documents, computed from the registry each time (CRDs change them).

Clients find resources through legacy discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/<g>/<v>``).
kubectl also fetches ``/openapi/v3``: it uses it only to learn that the server takes the
``fieldValidation`` and ``dryRun`` query parameters, after which it leaves validation to the server and
never needs ``/openapi/v2`` (which the double does not serve). The per-group documents therefore list one
PATCH operation per resource, tagged with its group/version/kind and those parameters, and no schemas; the
PATCH request bodies do not offer strategic merge, so kubectl computes apply patches from its compiled-in
types (built-in kinds) or as JSON merge patches (custom resources), as it does without OpenAPI.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .resources import Registry, ResourceType, version_priority

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.0",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.23.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def api_versions(address: str) -> dict[str, Any]:
    return {
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
    }


def _group_entry(group: str, versions: list[str]) -> dict[str, Any]:
    ordered = sorted(versions, key=version_priority, reverse=True)
    entries = [{"groupVersion": f"{group}/{v}", "version": v} for v in ordered]
    return {"name": group, "versions": entries, "preferredVersion": entries[0]}


def api_group_list(registry: Registry) -> dict[str, Any]:
    groups = [_group_entry(g, vs) for g, vs in registry.groups().items() if g]
    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}


def api_group(registry: Registry, group: str) -> dict[str, Any] | None:
    versions = registry.groups().get(group)
    if not group or not versions:
        return None
    return {"kind": "APIGroup", "apiVersion": "v1", **_group_entry(group, versions)}


def api_resource_list(registry: Registry, group: str, version: str) -> dict[str, Any] | None:
    types = registry.types(group, version)
    if not types:
        return None
    resources = [entry for rt in sorted(types, key=lambda t: t.plural) for entry in rt.api_resources()]
    group_version = f"{group}/{version}" if group else version
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": resources,
    }


def _openapi_path(group: str, version: str) -> str:
    return f"apis/{group}/{version}" if group else f"api/{version}"


def _group_versions(registry: Registry) -> list[tuple[str, str]]:
    return [(g, v) for g, versions in registry.groups().items() for v in versions]


def openapi_v3_index(registry: Registry) -> dict[str, Any]:
    paths = {}
    for group, version in _group_versions(registry):
        doc = openapi_v3_document(registry, group, version)
        digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:32].upper()
        path = _openapi_path(group, version)
        paths[path] = {"serverRelativeURL": f"/openapi/v3/{path}?hash={digest}"}
    return {"paths": paths}


_QUERY_PARAMETERS = ("dryRun", "fieldManager", "fieldValidation", "force")


def _patch_operation(rt: ResourceType) -> dict[str, Any]:
    parameters = [
        {"name": p, "in": "query", "schema": {"type": "string", "uniqueItems": True}}
        for p in _QUERY_PARAMETERS
    ]
    content = {
        t: {"schema": {"type": "object"}}
        for t in (
            "application/json-patch+json",
            "application/merge-patch+json",
            "application/apply-patch+yaml",
        )
    }
    return {
        "operationId": f"patch{rt.kind}",
        "parameters": parameters,
        "requestBody": {"content": content, "required": True},
        "responses": {"200": {"description": "OK"}, "201": {"description": "Created"}},
        "x-kubernetes-action": "patch",
        "x-kubernetes-group-version-kind": {"group": rt.group, "version": rt.version, "kind": rt.kind},
    }


def openapi_v3_document(registry: Registry, group: str, version: str) -> dict[str, Any]:
    base = "/" + _openapi_path(group, version)
    paths: dict[str, Any] = {}
    for rt in sorted(registry.types(group, version), key=lambda t: t.plural):
        scope = f"{base}/namespaces/{{namespace}}" if rt.namespaced else base
        paths[f"{scope}/{rt.plural}/{{name}}"] = {"patch": _patch_operation(rt)}
        if rt.has_status:
            paths[f"{scope}/{rt.plural}/{{name}}/status"] = {"patch": _patch_operation(rt)}
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": SERVER_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": {}},
    }
