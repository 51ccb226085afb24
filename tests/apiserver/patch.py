"""The three patch formats: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch.

Strategic merge is a subset good enough for ``kubectl apply``/``label``/``annotate`` and for controllers:
maps merge, ``null`` deletes, lists named in :data:`MERGE_KEYS` merge element-wise by their key, lists in
:data:`MERGE_PRIMITIVES` take the union, every other list is replaced; the ``$patch`` (replace, delete,
merge), ``$retainKeys``, ``$setElementOrder/<field>`` and ``$deleteFromPrimitiveList/<field>``
directives are honoured. Merge keys are looked up by field name, not by full path; the built-in types
the double serves never use one field name with two different strategies.

All functions are pure: they return a new document and never modify their arguments.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import ApiError, bad_request

# Field name -> merge key, for lists whose Go type carries patchStrategy=merge.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "env": "name",
    "ports": "containerPort",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
}
# Lists of scalars whose Go type carries patchStrategy=merge: the patch adds to the set.
MERGE_PRIMITIVES = frozenset({"finalizers"})

_ORDER = "$setElementOrder/"
_DELETE_PRIMITIVE = "$deleteFromPrimitiveList/"


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, ``null`` removes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# --- JSON patch --------------------------------------------------------------------------------------


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch path {path!r} must start with '/'")
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(422, f"jsonpatch: path {path!r} does not exist", "Invalid")
    return node, parts[-1]


def _index(container: list[Any], token: str, path: str, *, adding: bool) -> int:
    if adding and token == "-":
        return len(container)
    if not token.isdigit():
        raise ApiError(422, f"jsonpatch: invalid array index in {path!r}", "Invalid")
    index = int(token)
    limit = len(container) if adding else len(container) - 1
    if index > limit:
        raise ApiError(422, f"jsonpatch: index out of range in {path!r}", "Invalid")
    return index


def _get(doc: Any, path: str) -> Any:
    node = doc
    for part in _pointer(path):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(422, f"jsonpatch: path {path!r} does not exist", "Invalid")
    return node


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _pointer(path)
    if not parts:
        return copy.deepcopy(value)
    parent, token = _parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[token] = copy.deepcopy(value)
    elif isinstance(parent, list):
        parent.insert(_index(parent, token, path, adding=True), copy.deepcopy(value))
    else:
        raise ApiError(422, f"jsonpatch: cannot add at {path!r}", "Invalid")
    return doc


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent, token = _parent(doc, parts, path)
    if isinstance(parent, dict):
        if token not in parent:
            raise ApiError(
                422, f"jsonpatch remove operation does not apply: doc is missing path: {path}", "Invalid"
            )
        del parent[token]
    elif isinstance(parent, list):
        del parent[_index(parent, token, path, adding=False)]
    else:
        raise ApiError(422, f"jsonpatch: cannot remove {path!r}", "Invalid")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    """RFC 6902: add, remove, replace, move, copy, test, applied in order; any failure rejects all."""
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op!r}")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise bad_request(f"json patch {kind} operation at {path!r} has no value")
        if kind == "add":
            doc = _add(doc, path, op["value"])
        elif kind == "remove":
            doc = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)
            doc = (
                _add(_remove(doc, path), path, op["value"]) if _pointer(path) else copy.deepcopy(op["value"])
            )
        elif kind in ("move", "copy"):
            value = copy.deepcopy(_get(doc, op.get("from", "")))
            if kind == "move":
                doc = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "test":
            if _get(doc, path) != op["value"]:
                raise ApiError(422, f"jsonpatch: test operation for path {path!r} failed", "Invalid")
        else:
            raise bad_request(f"unknown json patch operation {kind!r}")
    return doc


# --- strategic merge patch ---------------------------------------------------------------------------


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes' strategic merge for built-in types (see the module docstring for the subset)."""
    if not isinstance(patch, dict):
        raise bad_request("strategic merge patch must be a JSON object")
    return _merge_map(copy.deepcopy(target) if isinstance(target, dict) else {}, patch)


def _merge_map(original: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any] | None:
    directive = patch.get("$patch")
    body = {k: v for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    if directive == "replace":
        replaced: dict[str, Any] = _strip_directives(body)
        return replaced
    if directive not in (None, "merge"):
        raise bad_request(f"unknown patch directive {directive!r}")
    result = original
    retain = body.pop("$retainKeys", None)
    orders = {k[len(_ORDER) :]: v for k, v in body.items() if k.startswith(_ORDER)}
    deletions = {k[len(_DELETE_PRIMITIVE) :]: v for k, v in body.items() if k.startswith(_DELETE_PRIMITIVE)}
    for key, value in body.items():
        if key.startswith(("$setElementOrder/", _DELETE_PRIMITIVE)):
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = _merge_map(result[key] if isinstance(result.get(key), dict) else {}, value)
            if merged is None:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = value
    for key, removed in deletions.items():
        if isinstance(result.get(key), list):
            result[key] = [item for item in result[key] if item not in removed]
    for key, order in orders.items():
        if isinstance(result.get(key), list) and isinstance(order, list):
            result[key] = _apply_order(key, result[key], order)
    if isinstance(retain, list):
        for key in list(result):
            if key not in retain:
                del result[key]
    return result


def _merge_list(field: str, original: Any, patch: list[Any]) -> list[Any]:
    current = original if isinstance(original, list) else []
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [
            _strip_directives(item) for item in patch if not (isinstance(item, dict) and "$patch" in item)
        ]
    if field in MERGE_PRIMITIVES:
        return current + [item for item in patch if item not in current]
    key = MERGE_KEYS.get(field)
    if key is None or not all(isinstance(item, dict) for item in patch):
        return [_strip_directives(item) for item in patch]
    result = list(current)
    for item in patch:
        if key not in item:
            raise bad_request(f"map in list {field!r} has no merge key {key!r}")
        position = next(
            (i for i, have in enumerate(result) if isinstance(have, dict) and have.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                del result[position]
            continue
        if position is None:
            result.append(_strip_directives(item))
        else:
            merged = _merge_map(result[position], item)
            if merged is not None:
                result[position] = merged
    return result


def _apply_order(field: str, items: list[Any], order: list[Any]) -> list[Any]:
    """Put listed elements first, in the given order; elements the patch does not name follow, in place."""
    key = MERGE_KEYS.get(field)

    def ident(item: Any) -> Any:
        return item.get(key) if key is not None and isinstance(item, dict) else item

    wanted = [ident(entry) for entry in order]
    ranked = sorted(
        (item for item in items if ident(item) in wanted), key=lambda item: wanted.index(ident(item))
    )
    return ranked + [item for item in items if ident(item) not in wanted]


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value
