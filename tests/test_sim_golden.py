"""Golden summaries of the simulator on small checked-in scenarios.

Each ``tests/golden/<name>.yaml`` has its expected JSON summary in ``<name>.json``: every
configuration, minus the wall-clock timings. A change to a golden file is a reviewed change with
a reason; regenerate with ``GPUPLANE_UPDATE_GOLDEN=1 python3 -m pytest tests/test_sim_golden.py``
and read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from gpuplane.sim.experiment import CONFIGURATIONS, run_experiment, scenario_input
from gpuplane.sim.scenario import load_scenario

GOLDEN = Path(__file__).resolve().parent / "golden"
SCENARIOS = sorted(GOLDEN.glob("*.yaml"))
UPDATE = os.environ.get("GPUPLANE_UPDATE_GOLDEN") == "1"


def without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if k != "wallSeconds"}
    if isinstance(value, list):
        return [without_timings(v) for v in value]
    return value


def assert_close(got: Any, want: Any, where: str = "") -> None:
    """Equal, except floats within their printed rounding (so a last-digit flip is not a failure)."""
    if isinstance(want, dict):
        assert isinstance(got, dict), where
        assert sorted(got) == sorted(want), where
        for key in want:
            assert_close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list), where
        assert len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{where}[{i}]")
    elif isinstance(want, float) or isinstance(got, float):
        assert got == pytest.approx(want, rel=1e-6, abs=0.011), where
    else:
        assert got == want, where


def summary(path: Path) -> dict[str, Any]:
    result = run_experiment(scenario_input(load_scenario(path)), CONFIGURATIONS)
    doc = without_timings(result.document)
    assert isinstance(doc, dict)
    return doc


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_golden_summary(path: Path) -> None:
    got = summary(path)
    expected = path.with_suffix(".json")
    if UPDATE:
        expected.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    assert expected.exists(), f"no golden file {expected.name}: run with GPUPLANE_UPDATE_GOLDEN=1"
    assert_close(got, json.loads(expected.read_text()))


def test_golden_scenarios_exist() -> None:
    assert len(SCENARIOS) >= 2
