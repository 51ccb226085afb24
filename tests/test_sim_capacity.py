"""The autoscaling and spot simulation: what each configuration must show, whatever the numbers.

- gpuplane never holds GPUs for a partly placed gang; stock does, once gangs meet a NodePool limit;
- every configuration sees the same arrivals and the same interruption draws (reproducible per seed);
- spot interruptions cost stock work since its last checkpoint, gpuplane none (checkpoint grace);
- a cold start of zero shortens the waits; no spot interruptions means none are counted;
- the warm buffer is paid for in on-demand GPU-hours.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from gpuplane.sim.capacity import CapacityResult, CapacityScenario, CapacitySim, arrivals, compare

SMALL = CapacityScenario(hours=24.0, seed=3, nodepool_limit_nodes=12)


@pytest.fixture(scope="module")
def results() -> dict[str, CapacityResult]:
    return {r.configuration: r for r in compare(SMALL)}


def test_only_stock_holds_gpus_for_partly_placed_gangs(results: dict[str, CapacityResult]) -> None:
    stock, gp, nobuf = (results[c] for c in ("stock", "gpuplane", "gpuplane-no-warm-buffer"))
    assert stock.partial_gang_gpu_hours > 0
    assert gp.partial_gang_gpu_hours == 0
    assert nobuf.partial_gang_gpu_hours == 0


def test_interruptions_cost_stock_work_and_gpuplane_none(results: dict[str, CapacityResult]) -> None:
    assert results["stock"].interruptions > 0
    assert results["stock"].lost_work_hours > 0
    assert results["gpuplane-no-warm-buffer"].lost_work_hours == 0


def test_the_warm_buffer_is_on_demand(results: dict[str, CapacityResult]) -> None:
    assert results["gpuplane"].on_demand_gpu_hours > 0
    assert results["gpuplane-no-warm-buffer"].on_demand_gpu_hours == 0
    assert results["stock"].on_demand_gpu_hours == 0


def test_same_arrivals_for_every_configuration_and_reproducible() -> None:
    assert arrivals(SMALL) == arrivals(SMALL)
    assert arrivals(SMALL) != arrivals(replace(SMALL, seed=4))
    first = CapacitySim(SMALL, "gpuplane").run()
    assert CapacitySim(SMALL, "gpuplane").run() == first


def test_cold_start_and_spot_rate_are_parameters() -> None:
    slow = CapacitySim(SMALL, "gpuplane-no-warm-buffer").run()
    instant = CapacitySim(
        replace(SMALL, node_ready_seconds=0.0, image_pull_seconds=0.0), "gpuplane-no-warm-buffer"
    ).run()
    assert instant.wait_mean_minutes < slow.wait_mean_minutes
    calm = CapacitySim(replace(SMALL, spot_interruptions_per_node_hour=0.0), "stock").run()
    assert calm.interruptions == 0
    assert calm.lost_work_hours == 0


def test_an_unknown_configuration_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown configuration"):
        CapacitySim(SMALL, "karpenter")


def test_the_command_prints_json_and_refuses_bad_input() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "gpuplane", "simulate-capacity", "--hours", "12", "--output", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert [r["configuration"] for r in doc["results"]] == ["stock", "gpuplane", "gpuplane-no-warm-buffer"]
    assert doc["scenario"]["hours"] == 12
    bad = subprocess.run(
        [sys.executable, "-m", "gpuplane", "simulate-capacity", "--spot-rate", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stderr.strip() == "gpuplane simulate-capacity: --spot-rate must not be negative"
