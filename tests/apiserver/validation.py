"""Field rules the real API server enforces, written as small checks that return :class:`Cause` lists.

The double must never accept what a real server refuses, so each check here mirrors one rule of
Kubernetes' validation (names, labels, quantities, required fields, immutable fields). Messages follow the
server's wording ("Required value", "Invalid value: ...", "field is immutable") so that a client that
matches on them behaves the same against both.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from .errors import Cause

DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_CONFIG_KEY = re.compile(r"[-._a-zA-Z0-9]+")
_QUANTITY = re.compile(
    r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))(?P<suffix>(?:[eE][+-]?\d+)|Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?"
)

STANDARD_FINALIZERS = frozenset({"kubernetes", "orphan", "foregroundDeletion"})
MAX_ANNOTATIONS_BYTES = 256 * 1024


# --- cause constructors (the server's field.Error types) ---------------------------------------------


def required(path: str, detail: str = "") -> Cause:
    return Cause(path, "FieldValueRequired", "Required value" + (f": {detail}" if detail else ""))


def invalid_value(path: str, value: Any, detail: str) -> Cause:
    shown = (
        f'"{value}"' if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else value
    )
    return Cause(path, "FieldValueInvalid", f"Invalid value: {shown}: {detail}")


def forbidden(path: str, detail: str) -> Cause:
    return Cause(path, "FieldValueForbidden", f"Forbidden: {detail}")


def not_supported(path: str, value: Any, supported: Iterable[str]) -> Cause:
    listed = ", ".join(f'"{s}"' for s in supported)
    return Cause(path, "FieldValueNotSupported", f'Unsupported value: "{value}": supported values: {listed}')


def duplicate(path: str, value: Any) -> Cause:
    return Cause(path, "FieldValueDuplicate", f'Duplicate value: "{value}"')


def too_long(path: str, limit: int) -> Cause:
    return Cause(path, "FieldValueTooLong", f"Too long: may not be more than {limit} bytes")


def immutable(path: str, value: Any) -> Cause:
    return invalid_value(
        path, value if isinstance(value, str | int | bool) else "{...}", "field is immutable"
    )


# --- names -------------------------------------------------------------------------------------------


def dns1123_subdomain(value: str) -> list[str]:
    errors = []
    if len(value) > 253:
        errors.append("must be no more than 253 characters")
    if not DNS1123_SUBDOMAIN.fullmatch(value):
        errors.append(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
            "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        )
    return errors


def dns1123_label(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not DNS1123_LABEL.fullmatch(value):
        errors.append(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
            "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
            "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        )
    return errors


def qualified_name(value: str) -> list[str]:
    """A label or annotation key: an optional DNS subdomain prefix and a name of at most 63 characters."""
    prefix, slash, name = value.rpartition("/")
    errors = []
    if slash:
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            errors.extend(f"prefix part {e}" for e in dns1123_subdomain(prefix))
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    elif not _QUALIFIED_NAME.fullmatch(name):
        errors.append(
            "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
            "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
            "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
        )
    return errors


def label_value(value: str) -> list[str]:
    errors = []
    if len(value) > 63:
        errors.append("must be no more than 63 characters")
    if not _LABEL_VALUE.fullmatch(value):
        errors.append(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
            "and must start and end with an alphanumeric character"
        )
    return errors


def check_name(path: str, value: Any, rule: Any) -> list[Cause]:
    if not isinstance(value, str):
        return [invalid_value(path, value, "must be a string")]
    return [invalid_value(path, value, message) for message in rule(value)]


# --- metadata ----------------------------------------------------------------------------------------


def object_meta(meta: Mapping[str, Any], name_rule: Any, *, creating: bool) -> list[Cause]:
    causes: list[Cause] = []
    name = meta.get("name")
    if not name and not (creating and meta.get("generateName")):
        causes.append(required("metadata.name", "name or generateName is required"))
    elif name:
        causes.extend(check_name("metadata.name", name, name_rule))
    causes.extend(string_map("metadata.labels", meta.get("labels"), value_rule=label_value))
    annotations = meta.get("annotations")
    causes.extend(string_map("metadata.annotations", annotations, value_rule=None))
    if isinstance(annotations, Mapping):
        size = sum(len(k) + len(str(v)) for k, v in annotations.items())
        if size > MAX_ANNOTATIONS_BYTES:
            causes.append(too_long("metadata.annotations", MAX_ANNOTATIONS_BYTES))
    for i, finalizer in enumerate(meta.get("finalizers") or []):
        path = f"metadata.finalizers[{i}]"
        if not isinstance(finalizer, str):
            causes.append(invalid_value(path, finalizer, "must be a string"))
            continue
        causes.extend(invalid_value(path, finalizer, e) for e in qualified_name(finalizer))
        if "/" not in finalizer and finalizer not in STANDARD_FINALIZERS:
            causes.append(
                invalid_value(
                    path, finalizer, "name is neither a standard finalizer name nor is it fully qualified"
                )
            )
    controllers = 0
    for i, ref in enumerate(meta.get("ownerReferences") or []):
        path = f"metadata.ownerReferences[{i}]"
        causes.extend(
            required(f"{path}.{key}", f"{key} must not be empty")
            for key in ("apiVersion", "kind", "name", "uid")
            if not (isinstance(ref, Mapping) and ref.get(key))
        )
        if isinstance(ref, Mapping) and ref.get("controller"):
            controllers += 1
    if controllers > 1:
        causes.append(
            invalid_value(
                "metadata.ownerReferences", "...", "Only one reference can have Controller set to true"
            )
        )
    return causes


def string_map(path: str, value: Any, *, value_rule: Any) -> list[Cause]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [invalid_value(path, "...", "must be a map of strings")]
    causes: list[Cause] = []
    for key, item in value.items():
        causes.extend(invalid_value(path, key, e) for e in qualified_name(key))
        if not isinstance(item, str):
            causes.append(invalid_value(f"{path}[{key}]", item, "must be a string"))
        elif value_rule is not None:
            causes.extend(invalid_value(f"{path}[{key}]", item, e) for e in value_rule(item))
    return causes


def config_keys(path: str, value: Any) -> list[Cause]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [invalid_value(path, "...", "must be a map")]
    message = "a valid config key must consist of alphanumeric characters, '-', '_' or '.'"
    return [
        invalid_value(f"{path}[{key}]", key, message)
        for key in value
        if len(key) > 253 or not _CONFIG_KEY.fullmatch(key) or key in (".", "..")
    ]


# --- quantities --------------------------------------------------------------------------------------

_SUFFIX = {
    "": Fraction(1),
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 1000),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
    "Ki": Fraction(2**10),
    "Mi": Fraction(2**20),
    "Gi": Fraction(2**30),
    "Ti": Fraction(2**40),
    "Pi": Fraction(2**50),
    "Ei": Fraction(2**60),
}


def parse_quantity(value: Any) -> Fraction | None:
    """A resource.Quantity as an exact number, or None when the text is not a quantity."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return Fraction(value)
    if not isinstance(value, str):
        return None
    match = _QUANTITY.fullmatch(value)
    if match is None:
        return None
    number = Fraction(match["num"])
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E"):
        return number * Fraction(10) ** int(suffix[1:])
    return number * _SUFFIX[suffix]


def is_native_resource(name: str) -> bool:
    """Resources Kubernetes itself accounts for; everything else is an extended resource."""
    return "/" not in name or name.startswith(("kubernetes.io/", "requests.kubernetes.io/"))


def is_overcommitable(name: str) -> bool:
    return is_native_resource(name) and not name.startswith("hugepages-")


def resource_list(path: str, value: Any) -> list[Cause]:
    if value is None:
        return []
    if not isinstance(value, Mapping):
        return [invalid_value(path, "...", "must be a map of resource quantities")]
    causes: list[Cause] = []
    for name, amount in value.items():
        causes.extend(invalid_value(path, name, e) for e in qualified_name(name))
        parsed = parse_quantity(amount)
        item = f"{path}[{name}]"
        if parsed is None:
            causes.append(
                invalid_value(
                    item,
                    amount,
                    "quantities must match the regular expression "
                    "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'",
                )
            )
        elif parsed < 0:
            causes.append(invalid_value(item, amount, "must be greater than or equal to 0"))
        elif not is_native_resource(name) and parsed.denominator != 1:
            causes.append(invalid_value(item, amount, "must be an integer"))
    return causes
