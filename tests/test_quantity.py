"""Kubernetes quantity parsing and formatting: exact values, base units, errors, round trips."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuplane.model.quantity import (
    QuantityError,
    format_quantity,
    parse_quantity,
    parse_resource_quantity,
    to_base_units,
)

KI, MI, GI, TI, PI, EI = (1024**power for power in range(1, 7))

BINARY_SUFFIXES = {"Ki": KI, "Mi": MI, "Gi": GI, "Ti": TI, "Pi": PI, "Ei": EI}
DECIMAL_SUFFIXES = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
RESOURCES = ["cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "nvidia.com/gpu", "amd.com/gpu", "pods"]
MAX_INT64 = 2**63 - 1


@pytest.mark.parametrize(
    ("text", "want_value"),
    [
        pytest.param("500m", Fraction(1, 2), id="millis"),
        pytest.param("2", Fraction(2), id="plain-integer"),
        pytest.param("16Gi", Fraction(16 * GI), id="gibi"),
        pytest.param("1.5Gi", Fraction(3 * GI, 2), id="fractional-gibi"),
        pytest.param("100Mi", Fraction(100 * MI), id="mebi"),
        pytest.param("1Ki", Fraction(KI), id="kibi"),
        pytest.param("1Ei", Fraction(EI), id="exbi"),
        pytest.param("2k", Fraction(2000), id="kilo"),
        pytest.param("1M", Fraction(10**6), id="mega"),
        pytest.param("1E", Fraction(10**18), id="exa-suffix"),
        pytest.param("1e3", Fraction(1000), id="exponent"),
        pytest.param("1E3", Fraction(1000), id="exponent-capital"),
        pytest.param("1e+3", Fraction(1000), id="exponent-plus"),
        pytest.param("1E-3", Fraction(1, 1000), id="exponent-negative"),
        pytest.param("2.5e2", Fraction(250), id="fraction-with-exponent"),
        pytest.param("0.5", Fraction(1, 2), id="decimal-fraction"),
        pytest.param(".5", Fraction(1, 2), id="leading-dot"),
        pytest.param("1.", Fraction(1), id="trailing-dot"),
        pytest.param("1.Gi", Fraction(GI), id="trailing-dot-suffix"),
        pytest.param("0.1", Fraction(1, 10), id="tenth-is-exact"),
        pytest.param("100n", Fraction(1, 10**7), id="nano"),
        pytest.param("250u", Fraction(1, 4000), id="micro"),
        pytest.param("+3", Fraction(3), id="plus-sign"),
        pytest.param("-3", Fraction(-3), id="minus-sign"),
        pytest.param("-0", Fraction(0), id="negative-zero"),
        pytest.param("007", Fraction(7), id="leading-zeros"),
        pytest.param(" 1Gi\n", Fraction(GI), id="outer-whitespace-ignored"),
        pytest.param(4, Fraction(4), id="yaml-int"),
        pytest.param(0.5, Fraction(1, 2), id="yaml-float-exact"),
        pytest.param(0.1, Fraction(1, 10), id="yaml-float-tenth"),
        pytest.param(1e16, Fraction(10**16), id="yaml-float-exponent"),
        pytest.param(-2.0, Fraction(-2), id="yaml-float-negative"),
    ],
)
def test_parse_quantity(text: str | int | float, want_value: Fraction) -> None:
    assert parse_quantity(text) == want_value


@pytest.mark.parametrize(
    ("resource", "text", "want_base_units"),
    [
        pytest.param("cpu", "500m", 500, id="cpu-millis"),
        pytest.param("cpu", "2", 2000, id="cpu-cores"),
        pytest.param("cpu", "0.5", 500, id="cpu-decimal"),
        pytest.param("cpu", 0.25, 250, id="cpu-yaml-float"),
        pytest.param("cpu", "1E-3", 1, id="cpu-exponent-one-milli"),
        pytest.param("cpu", "0.1m", 1, id="cpu-sub-milli-rounds-up"),
        pytest.param("cpu", "1001u", 2, id="cpu-micro-rounds-up"),
        pytest.param("cpu", "1e3", 1_000_000, id="cpu-exponent"),
        pytest.param("memory", "16Gi", 16 * GI, id="memory-gibi"),
        pytest.param("memory", "1.5Gi", 1536 * MI, id="memory-fractional-gibi"),
        pytest.param("memory", "100Mi", 100 * MI, id="memory-mebi"),
        pytest.param("memory", "1Ki", 1024, id="memory-kibi"),
        pytest.param("memory", "2k", 2000, id="memory-kilo"),
        pytest.param("memory", "0.5", 1, id="memory-half-byte-rounds-up"),
        pytest.param("memory", "1e3", 1000, id="memory-exponent"),
        pytest.param("memory", "9223372036854775807", MAX_INT64, id="memory-int64-max"),
        pytest.param("nvidia.com/gpu", "8", 8, id="gpu-count"),
        pytest.param("nvidia.com/gpu", 8, 8, id="gpu-yaml-int"),
        pytest.param("nvidia.com/mig-1g.10gb", "7", 7, id="mig-slices"),
        pytest.param("pods", "110", 110, id="pods"),
        pytest.param("nvidia.com/gpu", "0", 0, id="zero"),
    ],
)
def test_parse_resource_quantity(resource: str, text: str | int | float, want_base_units: int) -> None:
    assert parse_resource_quantity(resource, text) == want_base_units


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("abc", id="letters"),
        pytest.param("1.2.3", id="two-dots"),
        pytest.param("Gi", id="suffix-without-number"),
        pytest.param("--1", id="double-sign"),
        pytest.param("+-1", id="mixed-signs"),
        pytest.param("1Xi", id="unknown-binary-suffix"),
        pytest.param("1K", id="capital-k-is-not-kilo"),
        pytest.param("1Gb", id="bytes-suffix"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("1 Gi", id="inner-space"),
        pytest.param(".", id="lone-dot"),
        pytest.param("-", id="lone-sign"),
        pytest.param("1e", id="exponent-without-digits"),
        pytest.param("1e1.5", id="fractional-exponent"),
        pytest.param("1e3Gi", id="exponent-and-suffix"),
        pytest.param("1GiB", id="trailing-letter"),
        pytest.param("1m1", id="digits-after-suffix"),
        pytest.param("0x10", id="hexadecimal"),
        pytest.param("1_000", id="underscore-separator"),
        pytest.param("\u0661", id="non-ascii-digit"),
        pytest.param("1e1001", id="exponent-too-large"),
        pytest.param("1" * 101, id="too-long"),
        pytest.param(True, id="yaml-bool"),
        pytest.param(float("nan"), id="nan"),
        pytest.param(float("inf"), id="infinity"),
        pytest.param(None, id="null"),
        pytest.param(["1"], id="list"),
    ],
)
def test_malformed_quantity_is_rejected_with_its_text(text: object) -> None:
    with pytest.raises(QuantityError) as caught:
        parse_quantity(text)  # type: ignore[arg-type]  # deliberately wrong types from untyped YAML
    assert repr(text) in str(caught.value)
    assert caught.value.text is text


@pytest.mark.parametrize(
    ("resource", "text", "want_reason"),
    [
        pytest.param("cpu", "-1", "negative", id="negative-cpu"),
        pytest.param("memory", "-1Gi", "negative", id="negative-memory"),
        pytest.param("nvidia.com/gpu", -1, "negative", id="negative-yaml-int"),
        pytest.param("cpu", "-0.1m", "negative", id="negative-below-one-unit"),
    ],
)
def test_parse_resource_quantity_rejects_out_of_range(
    resource: str, text: str | int, want_reason: str
) -> None:
    with pytest.raises(QuantityError, match=want_reason):
        parse_resource_quantity(resource, text)


@pytest.mark.parametrize(
    ("resource", "text"),
    [
        pytest.param("memory", "8Ei", id="beyond-int64"),
        pytest.param("cpu", "9223372036854776", id="cpu-beyond-int64-millicores"),
        pytest.param("nvidia.com/gpu", "1e30", id="device-count-1e30"),
    ],
)
def test_parse_resource_quantity_saturates_beyond_int64(resource: str, text: str) -> None:
    # Kueue clamps at the int64 bound (SafeMilliValue / SafeValue) instead of refusing the object.
    assert parse_resource_quantity(resource, text) == MAX_INT64


def test_negative_zero_is_not_negative() -> None:
    assert parse_resource_quantity("cpu", "-0") == 0


@pytest.mark.parametrize(
    ("resource", "base_units", "want_text"),
    [
        pytest.param("cpu", 500, "500m", id="cpu-millis"),
        pytest.param("cpu", 2000, "2", id="cpu-whole"),
        pytest.param("cpu", 1500, "1500m", id="cpu-fractional"),
        pytest.param("cpu", 0, "0", id="cpu-zero"),
        pytest.param("cpu", -1500, "-1500m", id="cpu-negative"),
        pytest.param("memory", 16 * GI, "16Gi", id="memory-gibi"),
        pytest.param("memory", 1536 * MI, "1536Mi", id="memory-not-whole-gibi"),
        pytest.param("memory", 2000, "2k", id="memory-kilo"),
        pytest.param("memory", 10**9, "1G", id="memory-giga"),
        pytest.param("memory", 1500, "1500", id="memory-plain"),
        pytest.param("memory", 1023, "1023", id="memory-below-kibi"),
        pytest.param("memory", 0, "0", id="memory-zero"),
        pytest.param("ephemeral-storage", 100 * GI, "100Gi", id="ephemeral-storage"),
        pytest.param("hugepages-2Mi", 4 * MI, "4Mi", id="hugepages"),
        pytest.param("nvidia.com/gpu", 8, "8", id="gpu-count"),
        pytest.param("nvidia.com/gpu", 1024, "1024", id="gpu-count-no-binary-suffix"),
        pytest.param("pods", 2000, "2000", id="pods-no-decimal-suffix"),
    ],
)
def test_format_quantity(resource: str, base_units: int, want_text: str) -> None:
    assert format_quantity(resource, base_units) == want_text


def test_to_base_units_rounds_up_towards_positive_infinity() -> None:
    assert to_base_units("cpu", Fraction(1, 3)) == 334
    assert to_base_units("memory", Fraction(-1, 2)) == 0


@given(resource=st.sampled_from(RESOURCES), base_units=st.integers(min_value=0, max_value=MAX_INT64))
def test_format_then_parse_round_trips(resource: str, base_units: int) -> None:
    text = format_quantity(resource, base_units)
    assert parse_resource_quantity(resource, text) == base_units


@given(resource=st.sampled_from(RESOURCES), base_units=st.integers(min_value=-MAX_INT64, max_value=-1))
def test_format_then_parse_round_trips_negative(resource: str, base_units: int) -> None:
    text = format_quantity(resource, base_units)
    assert to_base_units(resource, parse_quantity(text)) == base_units


@given(number=st.integers(min_value=0, max_value=10**12), suffix=st.sampled_from(list(BINARY_SUFFIXES)))
def test_binary_suffix_multiplies_exactly(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * BINARY_SUFFIXES[suffix]


@given(number=st.integers(min_value=0, max_value=10**12), suffix=st.sampled_from(list(DECIMAL_SUFFIXES)))
def test_decimal_suffix_multiplies_exactly(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * DECIMAL_SUFFIXES[suffix]


@given(
    number=st.integers(min_value=0, max_value=10**12),
    exponent=st.integers(min_value=-30, max_value=30),
    letter=st.sampled_from(["e", "E"]),
)
def test_decimal_exponent_multiplies_exactly(number: int, exponent: int, letter: str) -> None:
    assert parse_quantity(f"{number}{letter}{exponent}") == number * Fraction(10) ** exponent


@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_float_equals_its_shortest_decimal_spelling(value: float) -> None:
    assert parse_quantity(value) == Fraction(repr(value))


@given(text=st.text(max_size=30))
def test_arbitrary_text_parses_or_raises_quantity_error(text: str) -> None:
    try:
        value = parse_quantity(text)
    except QuantityError:
        return
    assert isinstance(value, Fraction)
