"""Typed field access on decoded YAML/JSON with precise error paths.

Each helper takes the parent mapping, the key and the dotted path of the parent, and
raises :class:`InputError` with ``field`` set to the full path of the offending value.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from types import UnionType
from typing import Any

from gpuplane.model.errors import InputError
from gpuplane.model.quantity import QuantityError, parse_resource_quantity

_MISSING = object()


def join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


# JSON's names for Python's types, first match wins (a bool is an int, a str a Sequence).
_TYPE_NAMES: tuple[tuple[type | UnionType, str], ...] = (
    (type(None), "null"),
    (bool, "boolean"),
    (int | float, "number"),
    (str, "string"),
    (Mapping, "object"),
    (Sequence, "list"),
)


def type_name(value: object) -> str:
    return next((name for kind, name in _TYPE_NAMES if isinstance(value, kind)), type(value).__name__)


def as_map(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"expected an object, got {type_name(value)}", field=path)
    for key in value:
        if not isinstance(key, str):
            raise InputError(f"object keys must be strings, got {type_name(key)}", field=path)
    return value


def as_list(value: object, path: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise InputError(f"expected a list, got {type_name(value)}", field=path)
    return value


def as_str(value: object, path: str) -> str:
    if not isinstance(value, str):
        raise InputError(f"expected a string, got {type_name(value)}", field=path)
    return value


def as_int(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"expected an integer, got {type_name(value)}", field=path)
    return value


def as_bool(value: object, path: str) -> bool:
    if not isinstance(value, bool):
        raise InputError(f"expected true or false, got {type_name(value)}", field=path)
    return value


def get(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> Any:
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise InputError("required field is missing", field=join(path, key))
        return None
    return value


def get_map(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> Mapping[str, Any]:
    value = get(obj, key, path, required=required)
    if value is None:
        return {}
    return as_map(value, join(path, key))


def get_list(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> Sequence[Any]:
    value = get(obj, key, path, required=required)
    if value is None:
        return ()
    return as_list(value, join(path, key))


def get_str(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
    value = get(obj, key, path, required=required)
    if value is None:
        return None
    text = as_str(value, join(path, key))
    if required and not text:
        raise InputError("must not be empty", field=join(path, key))
    return text


def req_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = get_str(obj, key, path, required=True)
    assert value is not None  # required=True never returns None
    return value


def get_int(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False) -> int | None:
    value = get(obj, key, path, required=required)
    if value is None:
        return None
    return as_int(value, join(path, key))


def get_bool(obj: Mapping[str, Any], key: str, path: str, default: bool) -> bool:
    value = get(obj, key, path)
    if value is None:
        return default
    return as_bool(value, join(path, key))


def get_enum(
    obj: Mapping[str, Any], key: str, path: str, allowed: Sequence[str], default: str | None
) -> str | None:
    value = get_str(obj, key, path)
    if value is None:
        return default
    if value not in allowed:
        choices = ", ".join(allowed)
        raise InputError(f"unsupported value {value!r}; expected one of {choices}", field=join(path, key))
    return value


def string_map(obj: Mapping[str, Any], key: str, path: str) -> dict[str, str]:
    """A ``map[string]string`` such as labels; numbers and booleans are refused."""
    raw = get_map(obj, key, path)
    out: dict[str, str] = {}
    for k, v in raw.items():
        out[k] = as_str(v, join(join(path, key), k))
    return out


def quantity(resource: str, value: object, path: str) -> int:
    if isinstance(value, bool) or value is None:
        raise InputError(f"expected a quantity, got {type_name(value)}", field=path)
    if not isinstance(value, str | int | float):
        raise InputError(f"expected a quantity, got {type_name(value)}", field=path)
    try:
        return parse_resource_quantity(resource, value)
    except QuantityError as err:
        raise InputError(str(err), field=path, invalid_value=err.negative) from None


def resource_list(obj: Mapping[str, Any], key: str, path: str) -> dict[str, int]:
    raw = get_map(obj, key, path)
    here = join(path, key)
    return {name: quantity(name, v, join(here, name)) for name, v in raw.items()}


def lenient_timestamp(text: str | None) -> float | None:
    """An RFC 3339 time (with a zone) as epoch seconds, or ``None`` when absent or unreadable."""
    if not text:
        return None
    try:
        return timestamp(text, "")
    except InputError:
        return None


def timestamp(value: object, path: str) -> float:
    if isinstance(value, datetime):  # YAML may decode unquoted timestamps itself
        return value.timestamp()
    text = as_str(value, path)
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise InputError(f"invalid RFC 3339 timestamp {text!r}", field=path) from None
    if parsed.tzinfo is None:
        raise InputError(f"timestamp {text!r} has no time zone", field=path)
    return parsed.timestamp()
