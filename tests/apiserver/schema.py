"""Structural OpenAPI v3 schemas of CRDs: validation, pruning of unknown fields, and defaulting.

Covers the keywords structural schemas use for shape and bounds: ``type``, ``nullable``, ``properties``,
``required``, ``additionalProperties``, ``items``, ``enum``, ``minimum``/``maximum`` (and exclusive),
``minLength``/``maxLength``, ``pattern``, ``minItems``/``maxItems``, ``minProperties``/``maxProperties``,
``default``, ``x-kubernetes-int-or-string``, ``x-kubernetes-preserve-unknown-fields``,
``x-kubernetes-embedded-resource`` and ``x-kubernetes-list-type``/``x-kubernetes-list-map-keys``.
CEL rules (``x-kubernetes-validations``) and ``format`` are not evaluated.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping
from typing import Any

from .errors import Cause
from .validation import invalid_value, not_supported, required

_ROOT_FIELDS = ("apiVersion", "kind", "metadata")
_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "array": (list,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
}


def _type_ok(kind: str, value: Any) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _TYPES.get(kind, (object,)))


# JSON's type names, first match wins (a bool is an int).
_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (dict, "object"),
    (list, "array"),
    (str, "string"),
)


def _json_type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "unknown")


def validate(root: Mapping[str, Any], obj: Mapping[str, Any]) -> list[Cause]:
    """Every violation of the schema by ``obj`` (apiVersion, kind and metadata are checked elsewhere)."""
    causes: list[Cause] = []
    body = {k: v for k, v in obj.items() if k not in _ROOT_FIELDS}
    shape = {
        **root,
        "properties": {k: v for k, v in (root.get("properties") or {}).items() if k not in _ROOT_FIELDS},
    }
    shape["required"] = [r for r in root.get("required") or [] if r not in _ROOT_FIELDS]
    _check(shape, body, "", causes)
    return causes


def _child(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _check(schema: Mapping[str, Any], value: Any, path: str, causes: list[Cause]) -> None:
    where = path or "<root>"
    if value is None:
        if not schema.get("nullable"):
            causes.append(
                invalid_value(
                    where, "null", f'{where} in body must be of type {schema.get("type", "object")}: "null"'
                )
            )
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not (isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))):
            causes.append(
                invalid_value(
                    where, value, f'{where} in body must be of type integer,string: "{_json_type(value)}"'
                )
            )
            return
    elif "type" in schema and not _type_ok(schema["type"], value):
        causes.append(
            invalid_value(
                where,
                _json_type(value),
                f'{where} in body must be of type {schema["type"]}: "{_json_type(value)}"',
            )
        )
        return
    if "enum" in schema and value not in schema["enum"]:
        causes.append(not_supported(where, value, [json.dumps(e).strip('"') for e in schema["enum"]]))
    if isinstance(value, int | float) and not isinstance(value, bool):
        _bounds(schema, value, where, causes)
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            causes.append(
                Cause(
                    where, "FieldValueTooLong", f"Too long: may not be more than {schema['maxLength']} bytes"
                )
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            causes.append(
                invalid_value(
                    where, value, f"{where} in body should be at least {schema['minLength']} chars long"
                )
            )
        if "pattern" in schema and re.search(_python_pattern(schema["pattern"]), value) is None:
            causes.append(invalid_value(where, value, f"{where} in body should match '{schema['pattern']}'"))
    if isinstance(value, list):
        _check_array(schema, value, path, causes)
    if isinstance(value, dict):
        _check_object(schema, value, path, causes)


def _bounds(schema: Mapping[str, Any], value: float, where: str, causes: list[Cause]) -> None:
    if "minimum" in schema:
        low = schema["minimum"]
        if value < low or (schema.get("exclusiveMinimum") and value == low):
            word = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
            causes.append(invalid_value(where, value, f"{where} in body should be {word} {low}"))
    if "maximum" in schema:
        high = schema["maximum"]
        if value > high or (schema.get("exclusiveMaximum") and value == high):
            word = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
            causes.append(invalid_value(where, value, f"{where} in body should be {word} {high}"))


def _check_array(schema: Mapping[str, Any], value: list[Any], path: str, causes: list[Cause]) -> None:
    where = path or "<root>"
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        causes.append(
            Cause(
                where,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxItems']} items",
            )
        )
    if "minItems" in schema and len(value) < schema["minItems"]:
        causes.append(
            invalid_value(
                where, len(value), f"{where} in body should have at least {schema['minItems']} items"
            )
        )
    items = schema.get("items")
    if isinstance(items, Mapping):
        for i, item in enumerate(value):
            _check(items, item, f"{path}[{i}]", causes)
    list_type = schema.get("x-kubernetes-list-type")
    if list_type == "set":
        seen: list[Any] = []
        for i, item in enumerate(value):
            if item in seen:
                causes.append(
                    Cause(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {json.dumps(item)}")
                )
            seen.append(item)
    elif list_type == "map":
        keys = schema.get("x-kubernetes-list-map-keys") or []
        seen_keys: list[tuple[Any, ...]] = []
        for i, item in enumerate(value):
            if not isinstance(item, Mapping):
                continue
            ident = tuple(item.get(k) for k in keys)
            if ident in seen_keys:
                shown = json.dumps({k: item.get(k) for k in keys})
                causes.append(Cause(f"{path}[{i}]", "FieldValueDuplicate", f"Duplicate value: {shown}"))
            seen_keys.append(ident)


def _check_object(schema: Mapping[str, Any], value: dict[str, Any], path: str, causes: list[Cause]) -> None:
    where = path or "<root>"
    causes.extend(required(_child(path, name)) for name in schema.get("required") or [] if name not in value)
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        causes.append(
            Cause(
                where,
                "FieldValueTooMany",
                f"Too many: {len(value)}: must have at most {schema['maxProperties']} items",
            )
        )
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        causes.append(
            invalid_value(
                where,
                len(value),
                f"{where} in body should have at least {schema['minProperties']} properties",
            )
        )
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    for key, item in value.items():
        if key in properties:
            _check(properties[key], item, _child(path, key), causes)
        elif isinstance(extra, Mapping):
            _check(extra, item, _child(path, key), causes)


def prune(root: Mapping[str, Any], obj: dict[str, Any]) -> list[str]:
    """Drop fields the schema does not declare, in place; returns their paths (``.spec.foo``)."""
    dropped: list[str] = []
    properties = root.get("properties") or {}
    for key in list(obj):
        if key in _ROOT_FIELDS:
            continue
        if key in properties:
            _prune_value(properties[key], obj[key], f".{key}", dropped)
        elif not root.get("x-kubernetes-preserve-unknown-fields"):
            dropped.append(f".{key}")
            del obj[key]
    return dropped


def _prune_value(schema: Mapping[str, Any], value: Any, path: str, dropped: list[str]) -> None:
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for i, item in enumerate(value):
            _prune_value(schema["items"], item, f"{path}[{i}]", dropped)
        return
    if not isinstance(value, dict):
        return
    properties = schema.get("properties") or {}
    extra = schema.get("additionalProperties")
    preserve = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
    embedded = schema.get("x-kubernetes-embedded-resource")
    for key in list(value):
        if key in properties:
            _prune_value(properties[key], value[key], f"{path}.{key}", dropped)
        elif isinstance(extra, Mapping):
            _prune_value(extra, value[key], f"{path}.{key}", dropped)
        elif embedded and key in _ROOT_FIELDS:
            continue
        elif not preserve:
            dropped.append(f"{path}.{key}")
            del value[key]


def apply_defaults(root: Mapping[str, Any], obj: dict[str, Any]) -> None:
    """Fill ``default`` values for absent properties of objects that are present, in place."""
    _default_value(root, obj)


def _default_value(schema: Mapping[str, Any], value: Any) -> None:
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        for item in value:
            _default_value(schema["items"], item)
        return
    if not isinstance(value, dict):
        return
    for key, sub in (schema.get("properties") or {}).items():
        if key not in value and isinstance(sub, Mapping) and "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        if key in value and isinstance(sub, Mapping):
            _default_value(sub, value[key])


def _python_pattern(pattern: str) -> str:
    """An OpenAPI (RE2) pattern as Python reads it: RE2 takes inline flags such as ``(?i)`` anywhere,
    Python only at the start."""
    flags = re.findall(r"\(\?[aiLmsux]+\)", pattern)
    return "".join(flags) + re.sub(r"\(\?[aiLmsux]+\)", "", pattern) if flags else pattern
