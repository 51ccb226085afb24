"""Label and field selectors with the API server's grammar, and the fields each kind can be selected on.

Label selectors: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``, ``a``, ``!a``, ``a>1``,
``a<1``, comma-separated (all must hold). Field selectors: ``path=value``, ``path==value``,
``path!=value``, comma-separated, with ``\\`` escapes; only the fields listed per kind are allowed, as on
a real server (anything else is 400 ``field label not supported``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, bad_request

Predicate = Callable[[Mapping[str, Any]], bool]

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_CMP = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|!=|=|>|<)\s*(?P<value>{_VALUE})\s*$")
_EXISTS = re.compile(rf"^\s*(?P<neg>!?)\s*(?P<key>{_KEY})\s*$")


def _split_requirements(selector: str) -> list[str]:
    """Split on commas that are not inside a parenthesised value set."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in selector:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return labels if isinstance(labels, Mapping) else {}


def _requirement(text: str) -> Predicate:
    if match := _SET.match(text):
        key, op = match["key"], match["op"]
        values = {v.strip() for v in match["values"].split(",") if v.strip()}
        if not values:
            raise bad_request(f"unable to parse requirement: values set can't be empty: {text!r}")
        if op == "in":
            return lambda obj: _labels(obj).get(key) in values
        return lambda obj: _labels(obj).get(key) not in values
    if match := _CMP.match(text):
        key, op, value = match["key"], match["op"], match["value"]
        if op in ("=", "=="):
            return lambda obj: _labels(obj).get(key) == value
        if op == "!=":
            return lambda obj: _labels(obj).get(key) != value
        if not re.fullmatch(r"-?\d+", value):
            raise bad_request(
                "unable to parse requirement: for 'Gt', 'Lt' operators, the value must be an integer: "
                f"{text!r}"
            )
        bound = int(value)

        def compare(obj: Mapping[str, Any]) -> bool:
            have = _labels(obj).get(key)
            if have is None or not re.fullmatch(r"-?\d+", have):
                return False
            return int(have) > bound if op == ">" else int(have) < bound

        return compare
    if match := _EXISTS.match(text):
        key, negated = match["key"], bool(match["neg"])
        return lambda obj: (key in _labels(obj)) != negated
    raise bad_request(f"unable to parse requirement: {text!r}")


def label_selector(selector: str | None) -> Predicate:
    """A predicate over objects; an empty selector matches everything."""
    if not selector or not selector.strip():
        return lambda _obj: True
    requirements = [_requirement(part) for part in _split_requirements(selector)]
    return lambda obj: all(req(obj) for req in requirements)


def match_labels_selector(selector: Mapping[str, Any]) -> Predicate:
    """A ``metav1.LabelSelector`` (matchLabels and matchExpressions) as a predicate."""
    parts = [f"{k}={v}" for k, v in (selector.get("matchLabels") or {}).items()]
    for expr in selector.get("matchExpressions") or []:
        op, key, values = expr.get("operator"), expr.get("key"), expr.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
    return label_selector(",".join(parts))


# Fields a real server lets clients select on, per kind, beyond metadata.name and metadata.namespace.
SELECTABLE_FIELDS: dict[str, tuple[str, ...]] = {
    "Pod": (
        "spec.nodeName",
        "spec.restartPolicy",
        "spec.schedulerName",
        "spec.serviceAccountName",
        "spec.hostNetwork",
        "status.phase",
        "status.podIP",
        "status.nominatedNodeName",
    ),
    "Event": (
        "involvedObject.kind",
        "involvedObject.namespace",
        "involvedObject.name",
        "involvedObject.uid",
        "involvedObject.apiVersion",
        "involvedObject.resourceVersion",
        "involvedObject.fieldPath",
        "reason",
        "reportingComponent",
        "source",
        "type",
    ),
    "Node": ("spec.unschedulable",),
    "Namespace": ("status.phase",),
    "Job": ("status.successful",),
}


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    node: Any = obj
    for part in path.split("."):
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, bool):
        return "true" if node else "false"
    if node is None:
        return "false" if path in ("spec.hostNetwork", "spec.unschedulable") else ""
    if path == "source" and isinstance(node, Mapping):
        return str(node.get("component", ""))
    return str(node)


@dataclass(frozen=True)
class _FieldRequirement:
    path: str
    negated: bool
    value: str


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", r"\1", text)


def _parse_field_requirement(text: str) -> _FieldRequirement:
    for op in ("!=", "==", "="):
        index = _find_unescaped(text, op)
        if index >= 0:
            path = text[:index].strip()
            value = _unescape(text[index + len(op) :])
            return _FieldRequirement(path, op == "!=", value)
    raise bad_request(f"invalid selector: '{text}'; can't understand '{text}'")


def _find_unescaped(text: str, needle: str) -> int:
    i = 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text.startswith(needle, i):
            return i
        i += 1
    return -1


def field_selector(selector: str | None, kind: str) -> Predicate:
    """A predicate for a field selector, refusing fields the kind cannot be selected on (400)."""
    if not selector or not selector.strip():
        return lambda _obj: True
    allowed = {"metadata.name", "metadata.namespace", *SELECTABLE_FIELDS.get(kind, ())}
    requirements = []
    for piece in _split_unescaped_commas(selector):
        if not piece.strip():
            continue
        req = _parse_field_requirement(piece)
        if req.path not in allowed:
            raise ApiError(400, f"field label not supported: {req.path}", "BadRequest")
        requirements.append(req)

    def matches(obj: Mapping[str, Any]) -> bool:
        return all((_field_value(obj, r.path) == r.value) != r.negated for r in requirements)

    return matches


def _split_unescaped_commas(text: str) -> list[str]:
    out: list[str] = []
    current: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "\\" and i + 1 < len(text):
            current.append(text[i : i + 2])
            i += 2
            continue
        if text[i] == ",":
            out.append("".join(current))
            current = []
        else:
            current.append(text[i])
        i += 1
    out.append("".join(current))
    return out
