"""The elastic-capacity model's parts: pools of several node sizes, several pods per node, queues
with quota, prices, placeholders, the warm buffer's sizing and account, and the default's rule.

Small runs only (24 simulated hours); the 72-hour figures are in docs/simulator.md.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from gpuplane.core.session import SchedulerConfig, schedule
from gpuplane.sim.capacity import CapacityResult, CapacitySim, buffer_targets
from gpuplane.sim.capacity_core import FreeNode, core_state, remaining_quota
from gpuplane.sim.capacity_report import capacity_document, cheapest_at_equal_wait, with_twins
from gpuplane.sim.capacity_scenario import Arrival, CapacityScenario, PoolSpec, QueueSpec

SMALL = CapacityScenario(hours=24.0, seed=3, nodepool_limit_nodes=12)


@pytest.fixture(scope="module")
def stock() -> CapacitySim:
    sim = CapacitySim(SMALL, "stock")
    sim.result = sim.run()  # type: ignore[attr-defined]
    return sim


def test_pools_of_several_sizes_share_nodes_between_pods(stock: CapacitySim) -> None:
    sizes = {p.gpus_per_node for p in SMALL.pools()}
    assert len(sizes) == 3
    assert stock.result.shared_node_binds > 0  # type: ignore[attr-defined]
    gpuplane = CapacitySim(SMALL, "gpuplane-no-warm-buffer").run()
    assert gpuplane.shared_node_binds > 0


def test_stock_keeps_each_namespace_within_its_resource_quota(stock: CapacitySim) -> None:
    quota = {q.name: sum(n for _, n in q.quota) for q in SMALL.queues()}
    assert stock.peak_queue_gpus
    for queue, peak in stock.peak_queue_gpus.items():
        assert peak <= quota[queue]


def test_queues_in_one_cohort_borrow_what_the_others_leave() -> None:
    pools = [PoolSpec("p", 8, 1.0, 4)]
    queues = [QueueSpec("a", (("p", 8),)), QueueSpec("b", (("p", 8),))]
    job = Arrival(1, 0.0, "x", "a", 1, 8, 60.0, None)
    free = [FreeNode("n1", "p", 8, booked_first=False)]

    def admitted(used: dict[tuple[str, str], int]) -> list[str]:
        state = core_state(pools, queues, free=free, used=used, pending=[(job, False)], now=1.0)
        return [d.workload for d in schedule(state, SchedulerConfig(), 1.0, cycles=None).admitted]

    assert admitted({("a", "p"): 8}) == ["a/j1"]  # a is at its quota and borrows b's
    assert admitted({("a", "p"): 8, ("b", "p"): 8}) == []  # the cohort has nothing left
    left = remaining_quota(queues, {("a", "p"): 12})
    assert sum(left.values()) == 4  # what the cohort has left, however it is split
    assert left["a", "p"] == 0


def test_spot_costs_on_demand_over_the_price_ratio() -> None:
    # Without a buffer, prices change no decision (the buffer's own sizing weighs them).
    base = CapacitySim(SMALL, "gpuplane-static-buffer").run()
    dearer = CapacitySim(replace(SMALL, price_ratio=1.5), "gpuplane-static-buffer").run()
    assert dearer.gpu_hours_paid == base.gpu_hours_paid
    assert dearer.spot_dollars == pytest.approx(2 * base.spot_dollars, rel=0.01)
    assert dearer.on_demand_dollars == pytest.approx(base.on_demand_dollars, abs=0.2)
    assert base.on_demand_dollars > 0
    with pytest.raises(ValueError, match="price_ratio must be positive"):
        CapacitySim(replace(SMALL, price_ratio=0.0), "stock")


def test_placeholders_are_preempted_to_make_room_and_cost_spot() -> None:
    run = CapacitySim(SMALL, "stock-placeholders").run()
    assert run.buffer_uses > 0  # a real pod preempted a placeholder
    assert run.buffer_gpu_hours > 0
    assert run.on_demand_gpu_hours == 0


def _arrivals(klass: str, queue: str, every: float, work: float, gpus: int = 1) -> list[Arrival]:
    return [
        Arrival(i, 3600.0 - i * every, klass, queue, 1, gpus, work, None) for i in range(int(3600 / every))
    ]


def test_the_buffer_is_on_only_where_it_pays() -> None:
    now = 3600.0
    short_and_often = _arrivals("ci", "ci", 60.0, 300.0)  # 1 GPU a minute, 5-minute jobs
    assert buffer_targets(SMALL, short_and_often, now)["l4"] == 6  # 370 s of arrivals, rounded down
    rare = _arrivals("ci", "ci", 900.0, 300.0)  # one node-full per 15 min: idle longer than it saves
    assert buffer_targets(SMALL, rare, now)["l4"] == 0
    long_jobs = _arrivals("apps", "apps", 60.0, 3 * 3600.0)  # on-demand premium over the wait saved
    assert buffer_targets(SMALL, long_jobs, now)["l4"] == 0
    no_premium = replace(SMALL, price_ratio=1.0)  # spot costs what on-demand does
    assert buffer_targets(no_premium, long_jobs, now)["l4"] == 6
    assert buffer_targets(SMALL, short_and_often, now + 2 * 3600.0)["l4"] == 0  # nothing recent


def _result(name: str, dollars: float, p95: float) -> CapacityResult:
    return CapacityResult(name, 0, 0, 0, dollars, 0, 0, p95, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def test_the_default_costs_least_at_equal_p95_wait() -> None:
    results = [_result("a", 100.0, 6.2), _result("b", 90.0, 6.2), _result("c", 80.0, 7.0)]
    assert cheapest_at_equal_wait(results) == "b"  # c is cheaper but waits longer
    assert cheapest_at_equal_wait([_result("a", 100.0, 5.4), _result("b", 90.0, 6.2)]) == "a"
    assert cheapest_at_equal_wait([_result("a", 100.0, 6.0), _result("b", 90.0, 6.5)]) == "b"  # within 10 %
    assert with_twins(("gpuplane", "stock-placeholders")) == (
        "gpuplane",
        "stock-placeholders",
        "gpuplane-no-warm-buffer",
        "stock",
    )


@pytest.mark.parametrize("spot_rate", [0.03, 0.1], ids=["default-market", "volatile-market"])
def test_the_default_pays_fewer_gpu_dollars_than_stock_at_no_worse_p95(spot_rate: float) -> None:
    doc = capacity_document(replace(SMALL, spot_interruptions_per_node_hour=spot_rate))
    against = doc["defaultAgainstStock"]
    assert doc["defaultConfiguration"].startswith("gpuplane")
    assert against["waitP95NoWorse"]
    assert against["dollarsSaved"] > 0
    account = doc["warmBuffer"]["gpuplane"]
    assert account["comparedWith"] == "gpuplane-no-warm-buffer"
    assert account["bufferIdleGpuHours"] > 0
    assert {"extraGpuHours", "extraDollars", "waitP95SavedMinutes", "waitMeanSavedMinutes"} <= set(account)


def test_the_command_takes_prices_and_more_configurations() -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "gpuplane", "simulate-capacity", "--hours", "6", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    run = cli("--price-ratio", "2", "--compare", "stock-placeholders", "--output", "json")
    assert run.returncode == 0, run.stderr
    assert '"price_ratio": 2.0' in run.stdout
    assert '"configuration": "stock-placeholders"' in run.stdout
    bad = cli("--price-ratio", "0")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "gpuplane simulate-capacity: --price-ratio must be positive"
    unknown = cli("--compare", "karpenter")
    assert unknown.returncode == 2
    assert "unknown configuration 'karpenter'" in unknown.stderr
