"""CEL device selectors, evaluated as Kubernetes' Dynamic Resource Allocation evaluates them.

The environment is the one of ``resource.k8s.io/v1``: ``device.driver``, ``device.attributes``
and ``device.capacity`` (maps of domain -> name -> value; an unknown domain is an empty map, a
name without a domain is in the driver's domain) and ``device.allowMultipleAllocations``.
Quantities (capacities, ``quantity("80Gi")``) and semantic versions (``version`` attributes,
``semver("1.2.3")``) have the Kubernetes library functions ``compareTo``, ``isGreaterThan``,
``isLessThan``, and for quantities also ``asInteger``, ``asApproximateFloat``, ``sign``, ``add``
and ``sub``; for versions ``major``, ``minor`` and ``patch``. Quantities and versions also compare
with ``==``.

Each expression is compiled once (:class:`CelSelectors` caches by text). A compile or runtime
error, or a result that is not a boolean, raises :class:`SelectorError`, which placement turns
into a pending reason naming the class and the expression.

The simplest expressions (``device.driver == "x"`` and ``device.attributes["d"].name == value``,
joined by ``&&``), the most common by far, are read by a small matcher of their own with the same
result: the CEL interpreter takes about a millisecond per device.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from fractions import Fraction
from typing import Any

import celpy
from celpy import celtypes

from gpuplane.model.dra import Device, Version
from gpuplane.model.quantity import QuantityError, parse_quantity


class SelectorError(Exception):
    """A selector that cannot be compiled or evaluated (``expression`` and why)."""

    def __init__(self, expression: str, problem: str) -> None:
        super().__init__(f"CEL expression {expression!r}: {problem}")
        self.expression = expression
        self.problem = problem


class CelQuantity(celtypes.DoubleType):
    """A Kubernetes quantity in CEL; ``exact`` keeps its exact value."""

    exact: Fraction

    def __new__(cls, value: Fraction) -> CelQuantity:
        out = super().__new__(cls, float(value))
        assert isinstance(out, CelQuantity)
        out.exact = value
        return out


class CelVersion(celtypes.StringType):
    """A semantic version in CEL, compared by :meth:`Version.key`."""

    def key(self) -> Any:
        return Version(str(self)).key()


class _Domains(celtypes.MapType):
    """``device.attributes`` / ``device.capacity``: an unknown domain reads as an empty map."""

    def __getitem__(self, key: Any) -> Any:
        if key in self:
            return super().__getitem__(key)
        return celtypes.MapType({})


def _value(value: object) -> Any:
    if isinstance(value, bool):
        return celtypes.BoolType(value)
    if isinstance(value, int):
        return celtypes.IntType(value)
    if isinstance(value, Version):
        return CelVersion(value.text)
    if isinstance(value, Fraction):
        return CelQuantity(value)
    return celtypes.StringType(str(value))


def _by_domain(values: Mapping[str, object]) -> _Domains:
    domains: dict[str, dict[Any, Any]] = {}
    for qualified, value in values.items():
        domain, _, name = qualified.rpartition("/")
        domains.setdefault(domain, {})[celtypes.StringType(name)] = _value(value)
    return _Domains({celtypes.StringType(d): celtypes.MapType(m) for d, m in domains.items()})


def device_activation(driver: str, device: Device) -> dict[str, Any]:
    """The CEL variables one device is selected by."""
    view = celtypes.MapType(
        {
            celtypes.StringType("driver"): celtypes.StringType(driver),
            celtypes.StringType("attributes"): _by_domain(device.attributes),
            celtypes.StringType("capacity"): _by_domain(device.capacity),
            celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(device.allow_multiple),
        }
    )
    return {"device": view}


# --- the Kubernetes library functions -------------------------------------------------------


def _quantity(text: Any) -> CelQuantity:
    try:
        return CelQuantity(parse_quantity(str(text)))
    except QuantityError as err:
        raise ValueError(str(err)) from None


def _semver(text: Any) -> CelVersion:
    version = CelVersion(str(text))
    try:
        version.key()
    except ValueError:
        raise ValueError(f"invalid semantic version {str(text)!r}") from None
    return version


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, CelQuantity) and isinstance(b, CelQuantity):
        return int(a.exact > b.exact) - int(a.exact < b.exact)
    if isinstance(a, CelVersion) and isinstance(b, CelVersion):
        ka, kb = a.key(), b.key()
        return int(ka > kb) - int(ka < kb)
    raise TypeError(f"cannot compare {type(a).__name__} with {type(b).__name__}")


def _is_quantity(text: Any) -> celtypes.BoolType:
    try:
        parse_quantity(str(text))
    except QuantityError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _is_semver(text: Any) -> celtypes.BoolType:
    try:
        Version(str(text)).key()
    except ValueError:
        return celtypes.BoolType(False)
    return celtypes.BoolType(True)


def _part(i: int) -> Callable[[Any], celtypes.IntType]:
    return lambda v: celtypes.IntType(v.key()[0][i])


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": _quantity,
    "isQuantity": _is_quantity,
    "semver": _semver,
    "isSemver": _is_semver,
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "isGreaterThan": lambda a, b: celtypes.BoolType(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: celtypes.BoolType(_cmp(a, b) < 0),
    "asInteger": lambda q: celtypes.IntType(int(q.exact)),
    "asApproximateFloat": lambda q: celtypes.DoubleType(float(q.exact)),
    "sign": lambda q: celtypes.IntType((q.exact > 0) - (q.exact < 0)),
    "isInteger": lambda q: celtypes.BoolType(q.exact.denominator == 1),
    "add": lambda a, b: CelQuantity(a.exact + (b.exact if isinstance(b, CelQuantity) else Fraction(int(b)))),
    "sub": lambda a, b: CelQuantity(a.exact - (b.exact if isinstance(b, CelQuantity) else Fraction(int(b)))),
    "major": _part(0),
    "minor": _part(1),
    "patch": _part(2),
}

# --- the fast path ----------------------------------------------------------------------------

_STRING = r'"(?:[^"\\]|\\.)*"'
_TERM = re.compile(
    r"\s*device\.(?:driver|attributes\[(" + _STRING + r")\]\.([A-Za-z_][A-Za-z0-9_]*))\s*==\s*"
    r"(" + _STRING + r"|-?[0-9]+|true|false)\s*"
)
_DRIVER = object()
Term = tuple[object, object]  # (the driver marker or a qualified attribute name, the literal)


def _literal(text: str) -> object:
    if text.startswith('"'):
        return text[1:-1].encode().decode("unicode_escape") if "\\" in text else text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    return int(text)


def _simple(expression: str) -> list[Term] | None:
    """The terms of ``a == x && b == y ...`` over the driver and attributes, or None."""
    terms: list[Term] = []
    for part in expression.split("&&"):
        m = _TERM.fullmatch(part)
        if m is None:
            return None
        if m.group(1) is None:
            if not part.strip().startswith("device.driver"):
                return None
            terms.append((_DRIVER, _literal(m.group(3))))
        else:
            terms.append((f"{_literal(m.group(1))}/{m.group(2)}", _literal(m.group(3))))
    return terms


def _same(have: object, want: object) -> bool:
    # CEL's == is typed: 1 == true is an error in CEL, and no match here.
    return type(have) is type(want) and have == want


def _simple_match(expression: str, terms: list[Term], driver: str, device: Device) -> bool:
    """The fast path's answer. As CEL's ``&&``, a false term wins over a missing attribute."""
    missing = None
    for name, want in terms:
        have = driver if name is _DRIVER else device.attributes.get(str(name))
        if have is None:
            missing = str(name)
        elif not _same(have, want):
            return False
    if missing is not None:
        domain, _, attr = missing.rpartition("/")
        raise SelectorError(
            expression, f"fails on device {device.name}: no such key: {attr} (domain {domain})"
        )
    return True


class CelSelectors:
    """Compiled selectors by expression text (compiled once), and each device's CEL variables
    (built once per device object)."""

    def __init__(self) -> None:
        self._env = celpy.Environment()
        self._programs: dict[str, Any] = {}
        self._simple: dict[str, list[Term] | None] = {}
        self._activations: dict[int, tuple[Device, dict[str, Any]]] = {}

    def check(self, expression: str) -> None:
        """Compile ``expression`` (cached); :class:`SelectorError` when it does not compile."""
        self._program(expression)

    def _program(self, expression: str) -> Any:
        program = self._programs.get(expression)
        if program is None:
            try:
                program = self._env.program(self._env.compile(expression), functions=FUNCTIONS)
            except Exception as err:
                program = SelectorError(expression, f"does not compile: {_first_line(err)}")
            self._programs[expression] = program
        if isinstance(program, SelectorError):
            raise program
        return program

    def matches(self, expression: str, driver: str, device: Device) -> bool:
        """Whether ``device`` of ``driver`` is selected; :class:`SelectorError` on an error."""
        if expression not in self._simple:
            self._program(expression)  # a compile error is an error even on the fast path
            self._simple[expression] = _simple(expression)
        terms = self._simple[expression]
        # A version attribute compares as CEL's semver, which the fast path leaves to CEL.
        if terms is not None and not any(
            isinstance(device.attributes.get(str(n)), Version) for n, _ in terms
        ):
            return _simple_match(expression, terms, driver, device)
        program = self._program(expression)
        cached = self._activations.get(id(device))
        if cached is None or cached[0] is not device:
            cached = (device, device_activation(driver, device))
            self._activations[id(device)] = cached
        try:
            result = program.evaluate(cached[1])
        except Exception as err:
            raise SelectorError(expression, f"fails on device {device.name}: {_first_line(err)}") from None
        if not isinstance(result, celtypes.BoolType):
            raise SelectorError(expression, f"gives {type(result).__name__}, not a boolean")
        return bool(result)


def _first_line(err: BaseException) -> str:
    text = str(err.args[0]) if err.args else type(err).__name__
    return " ".join(text.split())[:200]
