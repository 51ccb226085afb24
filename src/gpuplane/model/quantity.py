"""Exact Kubernetes resource quantities (``resource.Quantity``).

Grammar, as apimachinery documents it::

    quantity     ::= signedNumber suffix
    signedNumber ::= [ "+" | "-" ] number
    number       ::= digits | digits "." digits | digits "." | "." digits
    suffix       ::= binarySI | decimalExponent | decimalSI
    binarySI     ::= "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei"           (powers of 1024)
    decimalSI    ::= "n" | "u" | "m" | "" | "k" | "M" | "G" | "T" | "P" | "E"
    decimalExponent ::= ( "e" | "E" ) [ "+" | "-" ] digits

Notes on where this follows apimachinery's parser rather than the prose:

- ``n`` and ``u`` are accepted: the parser knows them although the grammar comment omits them.
- The exponent is a signed *integer* (``1e3``, ``1E-3``); the parser rejects ``1e1.5``.
- ``1E`` is 10**18 (the ``E`` suffix); ``1E3`` is an exponent; ``1Ei`` is 2**60.
- At least one digit is required, so ``Gi``, ``.`` and ``-`` are errors (the OpenAPI pattern for
  quantities agrees; the Go parser happens to read them as zero).
- Leading and trailing whitespace is ignored, as the API server's JSON decoding does; whitespace
  inside (``1 Gi``) is an error.

Values are ``fractions.Fraction`` from end to end, never floats, so ``0.1 + 0.2`` cores is exactly
300 millicores. Kubernetes caps values at 2**63-1 and rounds to nano precision; here parsing is
exact, and :func:`parse_resource_quantity` saturates a value beyond 2**63-1 base units at
:data:`MAX_BASE_UNITS`, as Kueue does (``ResourceValue`` for requests, ``AmountFromQuantity`` for
quotas, where the saturated value means "unlimited"): one huge request makes one workload exceed
every quota, it does not make the whole input unreadable.
"""

from __future__ import annotations

import functools
import math
import re
from fractions import Fraction

from gpuplane.model import labels as keys

__all__ = [
    "MAX_BASE_UNITS",
    "QuantityError",
    "base_units_per_unit",
    "format_quantity",
    "parse_quantity",
    "parse_resource_quantity",
    "to_base_units",
]

_BINARY_MULTIPLIERS: dict[str, int] = {
    "Ki": 1024**1,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}
_DECIMAL_EXPONENTS: dict[str, int] = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}

# Alternatives are tried in order, which resolves the ambiguous letter E: "Ei" is binary,
# "E" followed by digits is an exponent, a lone "E" is the exa suffix.
_QUANTITY_PATTERN = re.compile(
    r"""
    (?P<sign>[+-]?)
    (?P<whole>[0-9]*)
    (?:\.(?P<fraction>[0-9]*))?
    (?:
        (?P<binary>[KMGTPE]i)
      | [eE](?P<exponent>[+-]?[0-9]+)
      | (?P<decimal>[numkMGTPE]?)
    )
    """,
    re.VERBOSE,
)

# Guards against inputs that are cheap to write but costly to evaluate exactly (10**10**9).
# Real quantities are a handful of characters with exponents well inside +-30.
_MAX_TEXT_LENGTH = 100
_MAX_EXPONENT = 1000

# Kubernetes stores quantities in an int64; base-unit values saturate here (Kueue's int64 clamp).
MAX_BASE_UNITS = 2**63 - 1

# Resources whose base unit is a thousandth rather than one whole unit: cpu (millicores) and
# gpuplane's quota resource for shares of a GPU (see gpuplane.model.gpu_share).
_MILLI_RESOURCES = frozenset({"cpu", keys.GPU_FRACTION_RESOURCE})


def _is_byte_resource(resource: str) -> bool:
    """Whether ``resource`` counts bytes, so binary suffixes read naturally when formatting it."""
    return resource in {"memory", "ephemeral-storage", "storage"} or resource.startswith("hugepages-")


class QuantityError(ValueError):
    """A value that is not a valid Kubernetes quantity (or not a valid one for its resource).

    ``text`` is the offending input as given and ``reason`` says what is wrong with it, so a caller
    that knows the file and field path can prefix its own location to ``str(error)``.
    """

    def __init__(self, text: object, reason: str, *, negative: bool = False) -> None:
        self.text = text
        self.reason = reason
        self.negative = negative  # well-formed, but below zero
        super().__init__(f"invalid quantity {text!r}: {reason}")


def parse_quantity(text: str | int | float) -> Fraction:
    """Parse a Kubernetes quantity into its exact value, in the quantity's own unit.

    ``text`` may be a string (``"500m"``, ``"16Gi"``, ``"1e3"``), or an int or float as YAML and
    JSON deliver unquoted numbers. A float is read through ``repr()`` so that ``0.5`` stays exactly
    one half; NaN and infinities are rejected. Booleans are rejected even though ``bool`` is an
    ``int`` subclass, because ``cpu: true`` is a mistake, not the number one.

    Raises :class:`QuantityError` naming the text for anything outside the grammar.
    """
    if isinstance(text, bool):
        raise QuantityError(text, "a boolean is not a quantity")
    if isinstance(text, int):
        return Fraction(text)
    if isinstance(text, float):
        if not math.isfinite(text):
            raise QuantityError(text, "not a finite number")
        return _parse_text(repr(text), original=text)
    if isinstance(text, str):
        return _parse_text(text.strip(), original=text)
    raise QuantityError(text, f"expected a string or a number, got {type(text).__name__}")


def _parse_text(text: str, *, original: object) -> Fraction:
    if not text:
        raise QuantityError(original, "empty")
    if len(text) > _MAX_TEXT_LENGTH:
        raise QuantityError(original, f"longer than {_MAX_TEXT_LENGTH} characters")
    match = _QUANTITY_PATTERN.fullmatch(text)
    if match is None:
        raise QuantityError(original, "expected <number><suffix> such as 500m, 16Gi or 1e3")
    whole = match["whole"]
    fraction = match["fraction"] or ""
    if not whole and not fraction:
        raise QuantityError(original, "no digits in the number")

    value = Fraction(int(whole or "0") * 10 ** len(fraction) + int(fraction or "0"), 10 ** len(fraction))
    if match["binary"] is not None:
        value *= _BINARY_MULTIPLIERS[match["binary"]]
    else:
        exponent = int(match["exponent"]) if match["exponent"] is not None else 0
        exponent += _DECIMAL_EXPONENTS[match["decimal"] or ""]
        if abs(exponent) > _MAX_EXPONENT:
            raise QuantityError(original, f"decimal exponent beyond +-{_MAX_EXPONENT}")
        value *= Fraction(10) ** exponent
    return -value if match["sign"] == "-" else value


def to_base_units(resource: str, q: Fraction) -> int:
    """Convert an exact quantity of ``resource`` to integer base units, rounding up.

    Unit convention: ``cpu`` is counted in millicores (``"500m"`` -> 500, ``"2"`` -> 2000), and
    ``gpuplane.dev/gpu-fraction`` in thousandths of a GPU the same way; every other resource in whole
    units (bytes for ``memory``, devices for ``nvidia.com/gpu``). A value
    finer than one base unit is rounded up (ceiling, toward +infinity), as Kubernetes'
    ``MilliValue()`` and ``Value()`` do, so ``0.1m`` of cpu is 1 millicore and half a byte is 1 byte.
    """
    return math.ceil(q * base_units_per_unit(resource))


def base_units_per_unit(resource: str) -> int:
    """How many base units make one whole unit of ``resource`` (1000 for ``cpu`` and
    ``gpuplane.dev/gpu-fraction``, 1 otherwise): what a report divides by to show whole units."""
    return 1000 if resource in _MILLI_RESOURCES else 1


@functools.lru_cache(maxsize=4096, typed=True)
def parse_resource_quantity(resource: str, text: str | int | float) -> int:
    """Parse ``text`` as a quantity of ``resource`` and return it in base units (see :func:`to_base_units`).

    Raises :class:`QuantityError` for malformed text and for negative values (requests, capacities
    and quotas are never negative). A value beyond 2**63-1 base units saturates at
    :data:`MAX_BASE_UNITS`, which Kueue's int64 arithmetic does too (``SafeMilliValue``).
    """
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(text, f"negative quantity for {resource}", negative=True)
    return min(to_base_units(resource, value), MAX_BASE_UNITS)


def format_quantity(resource: str, base_units: int) -> str:
    """Return a short canonical string that parses back to exactly ``base_units`` of ``resource``.

    - ``cpu`` and ``gpuplane.dev/gpu-fraction``: whole units as a plain number (``"2"``), otherwise
      thousandths (``"500m"``).
    - byte resources (``memory``, ``ephemeral-storage``, ``storage``, ``hugepages-*``): the shortest
      exact form among binary suffixes, decimal suffixes and plain bytes (``"16Gi"``, ``"2k"``,
      ``"1500"``); a tie goes to the binary suffix.
    - anything else (device counts such as ``nvidia.com/gpu``, ``pods``): a plain integer.

    Negative values get a leading ``-`` and otherwise follow the same rules.
    Invariant: ``to_base_units(resource, parse_quantity(format_quantity(resource, n))) == n``.
    """
    if base_units < 0:
        return "-" + format_quantity(resource, -base_units)
    if resource in _MILLI_RESOURCES:
        cores, millicores = divmod(base_units, 1000)
        return f"{base_units}m" if millicores else str(cores)
    if not _is_byte_resource(resource) or base_units == 0:
        return str(base_units)

    candidates = [
        f"{base_units // multiplier}{suffix}"
        for suffix, multiplier in reversed(_BINARY_MULTIPLIERS.items())
        if base_units % multiplier == 0
    ]
    candidates += [
        f"{base_units // 10**exponent}{suffix}"
        for suffix, exponent in reversed(_DECIMAL_EXPONENTS.items())
        if exponent > 0 and base_units % 10**exponent == 0
    ]
    candidates.append(str(base_units))
    return min(candidates, key=len)
