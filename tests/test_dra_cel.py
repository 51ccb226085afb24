"""CEL device selectors in Kubernetes' device environment (resource.k8s.io/v1)."""

from __future__ import annotations

from fractions import Fraction

import pytest

from gpuplane.model.dra import Device, Version
from gpuplane.model.dra_cel import CelSelectors, SelectorError

DRIVER = "gpu.example.com"
GPU = Device(
    "gpu-0",
    attributes={
        "gpu.example.com/model": "H100",
        "gpu.example.com/index": 3,
        "gpu.example.com/mig": False,
        "gpu.example.com/driverVersion": Version("550.54.15"),
        "nvlink.example.com/domain": "rack-1",
    },
    capacity={"gpu.example.com/memory": Fraction(80 * 2**30)},
)


@pytest.mark.parametrize(
    ("expression", "selected"),
    [
        ('device.driver == "gpu.example.com"', True),
        ('device.driver == "other.example.com"', False),
        ('device.attributes["gpu.example.com"].model == "H100"', True),
        ('device.attributes["gpu.example.com"].model == "A100" && device.driver == "gpu.example.com"', False),
        ('device.attributes["nvlink.example.com"].domain == "rack-1"', True),
        (
            'device.attributes["gpu.example.com"].index >= 2 && !device.attributes["gpu.example.com"].mig',
            True,
        ),
        ('device.attributes["gpu.example.com"].model.startsWith("H1")', True),
        ('device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0', True),
        ('device.capacity["gpu.example.com"].memory.isGreaterThan(quantity("80Gi"))', False),
        ('device.capacity["gpu.example.com"].memory.isLessThan(quantity("0.1Ti"))', True),
        ('device.capacity["gpu.example.com"].memory == quantity("80Gi")', True),
        ('device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("550.9.0"))', True),
        ('device.attributes["gpu.example.com"].driverVersion.major() == 550', True),
        ('"model" in device.attributes["unknown.example.com"]', False),
        ("device.allowMultipleAllocations", False),
    ],
)
def test_kubernetes_device_environment(expression: str, selected: bool) -> None:
    assert CelSelectors().matches(expression, DRIVER, GPU) is selected


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("device.driver ==", "does not compile"),
        ('device.attributes["gpu.example.com"].memoryGiB > 10', "no such member"),
        ('device.attributes["gpu.example.com"].nope == "x"', "no such key: nope"),
        ('device.attributes["gpu.example.com"].index', "not a boolean"),
        (
            'device.capacity["gpu.example.com"].memory.compareTo(quantity("lots")) > 0',
            "fails on device gpu-0",
        ),
    ],
)
def test_an_error_names_the_expression_and_never_escapes_as_another_exception(
    expression: str, problem: str
) -> None:
    with pytest.raises(SelectorError) as err:
        CelSelectors().matches(expression, DRIVER, GPU)
    assert expression in str(err.value)
    assert problem in str(err.value)


def test_a_false_term_wins_over_a_missing_attribute_as_cel_and_does() -> None:
    cel = CelSelectors()
    assert not cel.matches('device.attributes["x.io"].a == 1 && device.driver == "other"', DRIVER, GPU)


def test_each_expression_is_compiled_once() -> None:
    cel = CelSelectors()
    expression = 'device.attributes["gpu.example.com"].index > 1'
    cel.matches(expression, DRIVER, GPU)
    program = cel._programs[expression]
    cel.matches(expression, DRIVER, GPU)
    assert cel._programs[expression] is program
    assert len(cel._programs) == 1
