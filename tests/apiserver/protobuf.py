"""Decoding of Kubernetes protobuf request bodies into the JSON form the store works with.

kubectl's generator commands (``kubectl create namespace|configmap|job``) and ``kubectl drain`` send their
bodies as ``application/vnd.kubernetes.protobuf``: the bytes ``k8s\\x00`` and a ``runtime.Unknown``
envelope (type meta, then the object's own message). The double answers in JSON, which those clients
accept, so only decoding is needed.

Only the messages below are described, by field number, name and type. Go's encoder writes every
non-pointer field even when it holds its zero value, so a field the tables do not describe is skipped
when it is zero and refused (415) otherwise: the double never guesses at a field it cannot name.
Non-pointer fields holding zero values are dropped, as Go's JSON encoding omits them; pointer fields
(``opt``) keep an explicit zero (``gracePeriodSeconds: 0``).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import ApiError

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"


@dataclass(frozen=True)
class F:
    """One message field: JSON name, type, and whether Go holds it behind a pointer."""

    name: str
    kind: str  # string, bytes, int, bool, time, microtime, quantity, a message name; "[]x" repeated; "map:x"
    opt: bool = False


def _opt(name: str, kind: str) -> F:
    return F(name, kind, opt=True)


# Field numbers as in Kubernetes' generated.proto files.
MESSAGES: dict[str, dict[int, F]] = {
    "TypeMeta": {1: F("apiVersion", "string"), 2: F("kind", "string")},
    "ObjectMeta": {
        1: F("name", "string"),
        2: F("generateName", "string"),
        3: F("namespace", "string"),
        5: F("uid", "string"),
        6: F("resourceVersion", "string"),
        7: F("generation", "int"),
        8: F("creationTimestamp", "time"),
        9: _opt("deletionTimestamp", "time"),
        10: _opt("deletionGracePeriodSeconds", "int"),
        11: F("labels", "map:string"),
        12: F("annotations", "map:string"),
        13: F("ownerReferences", "[]OwnerReference"),
        14: F("finalizers", "[]string"),
    },
    "OwnerReference": {
        1: F("kind", "string"),
        3: F("name", "string"),
        4: F("uid", "string"),
        5: F("apiVersion", "string"),
        6: _opt("controller", "bool"),
        7: _opt("blockOwnerDeletion", "bool"),
    },
    "LabelSelector": {
        1: F("matchLabels", "map:string"),
        2: F("matchExpressions", "[]LabelSelectorRequirement"),
    },
    "LabelSelectorRequirement": {
        1: F("key", "string"),
        2: F("operator", "string"),
        3: F("values", "[]string"),
    },
    "DeleteOptions": {
        1: _opt("gracePeriodSeconds", "int"),
        2: _opt("preconditions", "Preconditions"),
        3: _opt("orphanDependents", "bool"),
        4: _opt("propagationPolicy", "string"),
        5: F("dryRun", "[]string"),
    },
    "Preconditions": {1: _opt("uid", "string"), 2: _opt("resourceVersion", "string")},
    # core/v1
    "Namespace": {
        1: F("metadata", "ObjectMeta"),
        2: F("spec", "NamespaceSpec"),
        3: F("status", "NamespaceStatus"),
    },
    "NamespaceSpec": {1: F("finalizers", "[]string")},
    "NamespaceStatus": {1: F("phase", "string")},
    "ConfigMap": {
        1: F("metadata", "ObjectMeta"),
        2: F("data", "map:string"),
        3: F("binaryData", "map:bytes"),
        4: _opt("immutable", "bool"),
    },
    "Pod": {1: F("metadata", "ObjectMeta"), 2: F("spec", "PodSpec"), 3: F("status", "PodStatus")},
    "PodStatus": {1: F("phase", "string")},
    "PodTemplateSpec": {1: F("metadata", "ObjectMeta"), 2: F("spec", "PodSpec")},
    "PodSpec": {
        2: F("containers", "[]Container"),
        3: F("restartPolicy", "string"),
        4: _opt("terminationGracePeriodSeconds", "int"),
        5: _opt("activeDeadlineSeconds", "int"),
        6: F("dnsPolicy", "string"),
        7: F("nodeSelector", "map:string"),
        8: F("serviceAccountName", "string"),
        10: F("nodeName", "string"),
        11: F("hostNetwork", "bool"),
        16: F("hostname", "string"),
        17: F("subdomain", "string"),
        19: F("schedulerName", "string"),
        20: F("initContainers", "[]Container"),
        22: F("tolerations", "[]Toleration"),
        24: F("priorityClassName", "string"),
        25: _opt("priority", "int"),
        30: _opt("enableServiceLinks", "bool"),
        31: _opt("preemptionPolicy", "string"),
        38: F("schedulingGates", "[]PodSchedulingGate"),
    },
    "Container": {
        1: F("name", "string"),
        2: F("image", "string"),
        3: F("command", "[]string"),
        4: F("args", "[]string"),
        5: F("workingDir", "string"),
        6: F("ports", "[]ContainerPort"),
        7: F("env", "[]EnvVar"),
        8: F("resources", "ResourceRequirements"),
        13: F("terminationMessagePath", "string"),
        14: F("imagePullPolicy", "string"),
        16: F("stdin", "bool"),
        17: F("stdinOnce", "bool"),
        18: F("tty", "bool"),
        20: F("terminationMessagePolicy", "string"),
        24: _opt("restartPolicy", "string"),
    },
    "ContainerPort": {
        1: F("name", "string"),
        2: F("hostPort", "int"),
        3: F("containerPort", "int"),
        4: F("protocol", "string"),
        5: F("hostIP", "string"),
    },
    "EnvVar": {1: F("name", "string"), 2: F("value", "string")},
    "ResourceRequirements": {1: F("limits", "map:quantity"), 2: F("requests", "map:quantity")},
    "Toleration": {
        1: F("key", "string"),
        2: F("operator", "string"),
        3: F("value", "string"),
        4: F("effect", "string"),
        5: _opt("tolerationSeconds", "int"),
    },
    "PodSchedulingGate": {1: F("name", "string")},
    "Binding": {1: F("metadata", "ObjectMeta"), 2: F("target", "ObjectReference")},
    "ObjectReference": {
        1: F("kind", "string"),
        2: F("namespace", "string"),
        3: F("name", "string"),
        4: F("uid", "string"),
        5: F("apiVersion", "string"),
        6: F("resourceVersion", "string"),
        7: F("fieldPath", "string"),
    },
    # batch/v1
    "Job": {1: F("metadata", "ObjectMeta"), 2: F("spec", "JobSpec"), 3: F("status", "JobStatus")},
    "JobSpec": {
        1: _opt("parallelism", "int"),
        2: _opt("completions", "int"),
        3: _opt("activeDeadlineSeconds", "int"),
        4: _opt("selector", "LabelSelector"),
        5: _opt("manualSelector", "bool"),
        6: F("template", "PodTemplateSpec"),
        7: _opt("backoffLimit", "int"),
        8: _opt("ttlSecondsAfterFinished", "int"),
        9: _opt("completionMode", "string"),
        10: _opt("suspend", "bool"),
    },
    "JobStatus": {},
    # policy/v1
    "Eviction": {1: F("metadata", "ObjectMeta"), 2: _opt("deleteOptions", "DeleteOptions")},
}

# The message each (apiVersion, kind) of an envelope names.
ENVELOPE_KINDS = {
    ("v1", "Namespace"): "Namespace",
    ("v1", "ConfigMap"): "ConfigMap",
    ("v1", "Pod"): "Pod",
    ("v1", "Binding"): "Binding",
    ("batch/v1", "Job"): "Job",
    ("policy/v1", "Eviction"): "Eviction",
    ("meta.k8s.io/v1", "DeleteOptions"): "DeleteOptions",
    ("v1", "DeleteOptions"): "DeleteOptions",
}


def _unsupported(message: str) -> ApiError:
    return ApiError(
        415,
        f"the API-server double cannot decode this protobuf body ({message}); send JSON",
        "UnsupportedMediaType",
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise _unsupported("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
            yield number, wire, value
        elif wire == 2:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise _unsupported("truncated field")
            yield number, wire, data[pos : pos + length]
            pos += length
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            yield number, wire, data[pos : pos + size]
            pos += size
        else:
            raise _unsupported(f"wire type {wire}")


def _is_zero(value: int | bytes) -> bool:
    """A zero scalar, an empty string, or a message whose fields are all zero."""
    if isinstance(value, int):
        return value == 0
    if not value:
        return True
    try:
        return all(_is_zero(inner) for _, _, inner in _fields(value))
    except ApiError:
        return False


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _scalar(kind: str, value: int | bytes, where: str) -> Any:
    if kind == "int" and isinstance(value, int):
        return _signed(value)
    if kind == "bool" and isinstance(value, int):
        return value != 0
    if isinstance(value, int):
        raise _unsupported(f"{where}: expected {kind}, found a number")
    if kind == "string":
        return value.decode()
    if kind == "bytes":
        return base64.b64encode(value).decode()
    if kind in ("time", "microtime"):
        moment = _time(value)
        if moment is None:
            return None
        return moment if kind == "time" else moment.replace("Z", ".000000Z")
    if kind == "quantity":
        return next((v.decode() for n, _, v in _fields(value) if n == 1 and isinstance(v, bytes)), "0")
    return message(kind, value, where)


_GO_ZERO_TIME = -62135596800  # 0001-01-01T00:00:00Z, Go's zero time.Time


def _time(value: bytes) -> str | None:
    """A meta/v1 Time message as RFC 3339; None for the zero time (an empty message)."""
    seconds = next((_signed(v) for n, _, v in _fields(value) if n == 1 and isinstance(v, int)), None)
    if seconds is None or seconds == _GO_ZERO_TIME:
        return None
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _empty(value: Any) -> bool:
    if isinstance(value, dict | list):
        return not value
    return value is None or value is False or value in ("", 0)


def message(name: str, data: bytes, where: str = "") -> dict[str, Any]:
    """Decode one message of the tables above into its JSON form."""
    schema = MESSAGES.get(name)
    if schema is None:
        raise _unsupported(f"{where or name}: no table for {name}")
    out: dict[str, Any] = {}
    for number, _, value in _fields(data):
        field = schema.get(number)
        if field is None:
            if _is_zero(value):
                continue
            raise _unsupported(f"{where or name}: field {number} of {name}")
        path = f"{where}.{field.name}" if where else field.name
        if field.kind.startswith("[]"):
            out.setdefault(field.name, []).append(_scalar(field.kind[2:], value, path))
        elif field.kind.startswith("map:"):
            if not isinstance(value, bytes):
                raise _unsupported(f"{path}: a map entry must be a message")
            entry = {n: v for n, _, v in _fields(value)}
            key = entry.get(1, b"")
            item = entry.get(2, b"")
            out.setdefault(field.name, {})[key.decode() if isinstance(key, bytes) else str(key)] = _scalar(
                field.kind[4:], item, path
            )
        else:
            decoded = _scalar(field.kind, value, path)
            if field.opt or not _empty(decoded):
                out[field.name] = decoded
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body as the JSON object it stands for (with apiVersion and kind)."""
    if not body.startswith(MAGIC):
        raise _unsupported("no k8s protobuf envelope")
    envelope = {number: value for number, _, value in _fields(body[len(MAGIC) :])}
    type_meta, payload = envelope.get(1, b""), envelope.get(2, b"")
    if not isinstance(type_meta, bytes) or not isinstance(payload, bytes):
        raise _unsupported("malformed envelope")
    meta = message("TypeMeta", type_meta)
    api_version, kind = meta.get("apiVersion", ""), meta.get("kind", "")
    name = ENVELOPE_KINDS.get((api_version, kind))
    if name is None:
        raise _unsupported(f"kind {api_version}/{kind}")
    obj = message(name, payload)
    return {"apiVersion": api_version, "kind": kind, **obj}
