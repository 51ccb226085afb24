"""Load sweeps, capacity at a wait target, GPUs to match, and the one-sentence result."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuplane.sim.headline import headline, sweep_headline
from gpuplane.sim.scenario import builtin_scenario, load_scenario
from gpuplane.sim.sweep import AT_LEAST, BELOW, EXACT, Capacity, capacity_at_wait_target, gpus_to_match
from gpuplane.sim.workloads import generate

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "golden" / "tiny-mixed.yaml"


@pytest.mark.parametrize(
    ("points", "want_load", "want_bound"),
    [
        pytest.param([(0.6, 0.0), (0.8, 0.0), (1.0, 7200.0)], 0.9, EXACT, id="halfway-between-points"),
        pytest.param([(1.0, 4500.0), (0.6, 0.0), (0.8, 900.0)], 0.95, EXACT, id="unsorted-points"),
        pytest.param([(0.6, 0.0), (0.8, None), (1.0, 10.0)], 1.0, AT_LEAST, id="never-exceeded"),
        pytest.param([(0.6, 4000.0), (0.8, 9000.0)], None, BELOW, id="exceeded-at-lowest-load"),
        pytest.param([(0.6, 0.0), (0.8, 7200.0), (1.0, 0.0)], 0.7, EXACT, id="first-crossing-counts"),
    ],
)
def test_capacity_at_wait_target(
    points: list[tuple[float, float | None]], want_load: float | None, want_bound: str
) -> None:
    got = capacity_at_wait_target(points, 3600.0)
    assert got.bound == want_bound
    if want_load is None:
        assert got.load is None
    else:
        assert got.load == pytest.approx(want_load)


@pytest.mark.parametrize(
    ("stock", "other", "want_gpus", "want_bound"),
    [
        pytest.param(Capacity(0.5, EXACT), Capacity(1.0, EXACT), 896, EXACT, id="twice-the-capacity"),
        pytest.param(Capacity(0.8, EXACT), Capacity(1.6, AT_LEAST), 896, AT_LEAST, id="lower-bound"),
        pytest.param(Capacity(None, BELOW), Capacity(1.0, EXACT), None, "unknown", id="stock-below-sweep"),
        pytest.param(
            Capacity(1.6, AT_LEAST), Capacity(1.6, AT_LEAST), None, "unknown", id="stock-never-full"
        ),
    ],
)
def test_gpus_to_match(stock: Capacity, other: Capacity, want_gpus: int | None, want_bound: str) -> None:
    got = gpus_to_match(448, stock, other)
    assert (got.gpus, got.bound) == (want_gpus, want_bound)


def test_load_scales_arrivals_of_share_driven_classes() -> None:
    base = builtin_scenario().with_days(0.5)
    low = generate(base.with_load(0.5))
    high = generate(base.with_load(1.5))
    # Same seed, three times the offered GPU time: about three times as many workloads.
    assert 2.5 < len(high.jobs) / len(low.jobs) < 3.5


def _config(
    busy: float, allocated: float, p95: float, deadlocked: float, classes: dict[str, float]
) -> dict[str, Any]:
    return {
        "busyGpuHours": busy,
        "allocatedGpuHours": allocated,
        "gpuBusyShare": busy / allocated,
        "waitP95Seconds": p95,
        "deadlockedGpuHours": deadlocked,
        "strandedQuotaGpuHours": 0.0,
        "classes": {name: {"gpuBusyShare": share} for name, share in classes.items()},
    }


def test_headline_names_gains_from_the_numbers() -> None:
    document = {
        "configurations": {
            "stock": _config(1000.0, 2000.0, 19080.0, 2072.0, {"inference": 0.249, "training": 0.6}),
            "gpuplane": _config(1005.0, 1680.0, 0.0, 0.0, {"inference": 0.534, "training": 0.61}),
            "gpuplane-no-sharing": _config(1000.0, 1900.0, 0.0, 0.0, {}),
        }
    }
    text = headline(document)
    first = text.split(". ")[0]
    assert first.startswith("Same work on 16 % fewer allocated GPU-hours")
    assert "p95 wait 5.3 h → 0 s" in first
    assert "2,072 GPU-hours no longer held by partly placed gangs" in first
    assert "most from inference (busy share 24.9 % → 53.4 %)" in text
    assert "sharing (fractions, MIG) +7.2 points of busy share" in text


def test_sweep_headline_states_capacity_and_match() -> None:
    document = {
        "gpus": 448,
        "waitTargetSeconds": 3600.0,
        "sweep": [{"load": 0.6}, {"load": 1.6}],
        "capacityAtWaitTarget": {"stock": 0.7, "gpuplane": 1.6},
        "capacityBound": {"stock": EXACT, "gpuplane": AT_LEAST},
        "gpusToMatch": {"gpuplane": {"stockGpus": 1024, "bound": AT_LEAST}},
    }
    text = sweep_headline(document)
    assert "at least 1.60 under gpuplane and 0.70 under stock" in text
    assert "stock would need at least 1,024 GPUs" in text


def gpuplane_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", "simulate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
    )


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param(["--sweep", "0.6,abc"], "--sweep: 'abc' is not a number", id="sweep-not-a-number"),
        pytest.param(["--sweep", "0.6,-1"], "--sweep: loads must be positive", id="sweep-negative"),
        pytest.param(["--sweep", "0.6", "--wait-target", "soon"], "--wait-target: 'soon'", id="bad-target"),
        pytest.param(["--wait-target", "1h"], "--wait-target needs --sweep", id="target-without-sweep"),
        pytest.param(["--load", "0"], "--load must be positive", id="load-zero"),
        pytest.param(["--sweep", "0.6", "--load", "1"], "--sweep and --load exclude", id="sweep-and-load"),
    ],
)
def test_bad_sweep_options_are_one_line_and_exit_2(args: list[str], want: str) -> None:
    run = gpuplane_cli(*args)
    assert run.returncode == 2
    assert want in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1
    assert "Traceback" not in run.stderr


def test_sweep_json_on_a_small_scenario() -> None:
    run = gpuplane_cli(
        "--scenario",
        str(TINY),
        "--days",
        "0.25",
        "--sweep",
        "0.4,1.6",
        "--wait-target",
        "30min",
        "--output",
        "json",
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["waitTargetSeconds"] == 1800.0
    assert [point["load"] for point in doc["sweep"]] == [0.4, 1.6]
    low, high = (point["configurations"] for point in doc["sweep"])
    assert set(low) == {"stock", "gpuplane"}
    assert doc["sweep"][1]["workloads"] > doc["sweep"][0]["workloads"]
    # More offered work: at least as much busy time on the same GPUs.
    assert high["gpuplane"]["busyGpuHours"] > low["gpuplane"]["busyGpuHours"]
    for name in ("stock", "gpuplane"):
        assert name in doc["capacityAtWaitTarget"]
        assert doc["capacityBound"][name] in (EXACT, AT_LEAST, BELOW)
        assert "etaRelativeErrorP50" in high[name]
    assert "gpuplane" in doc["gpusToMatch"]
    assert doc["headline"].startswith("At p95 wait ≤ 30.0 min")


def test_single_run_opens_with_the_result_in_words() -> None:
    scenario = load_scenario(TINY)
    assert scenario.offered_load is not None
    run = gpuplane_cli("--scenario", str(TINY), "--days", "0.25", "--load", "1.2")
    assert run.returncode == 0, run.stderr
    first = run.stdout.strip().splitlines()[0]
    assert "p95 wait" in first
    assert first.split(" on ")[0] in ("Same work",) or "work done" in first
