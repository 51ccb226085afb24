"""``--sweep auto``: extended until every configuration misses the wait target, then bisected.

The runs are replaced by a known p95 wait per configuration and load (a wait that grows with load
and crosses the one-hour target at a known load), so the search itself is what is tested.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest

from gpuplane.sim import auto_sweep
from gpuplane.sim.auto_sweep import AutoSweep, run_auto_sweep
from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.experiment import SimInput
from gpuplane.sim.parallel import RunResult, Task
from gpuplane.sim.scenario import Team
from gpuplane.sim.workloads import Workloads

TARGET = 3600.0
CROSSING = {"stock": 0.73, "gpuplane": 2.9, "kueue": 1.37, "volcano": 0.02}


def _sim(load: float) -> SimInput:
    spec = ClusterSpec((NodeSpec("n-0", "gpu", 8),), ("gpu",), (Team("red", 1.0, 1.0),))
    return SimInput(
        "fake", spec, Workloads((), (), 0.0, 3600.0), 3600.0, 7200.0, 30.0, seed=1, notes={"load": load}
    )


def _wait(name: str, load: float) -> float:
    """A p95 wait that is the target exactly at the configuration's crossing load."""
    return TARGET * math.exp(4.0 * (load - CROSSING[name]))


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    ran: list[tuple[str, float]] = []

    def run_tasks(
        _runner: object, inputs: Sequence[SimInput], tasks: Sequence[Task], *_: object
    ) -> list[RunResult]:
        out: list[RunResult] = []
        for task in tasks:
            load = inputs[task.source].notes["load"]
            ran.append((task.name, load))
            doc = {"waitP95Seconds": _wait(task.name, load), "wallSeconds": 0.0, "gpuBusyOfCapacity": 0.5}
            out.append((None, doc))  # type: ignore[arg-type]
        return out

    monkeypatch.setattr(auto_sweep, "run_tasks", run_tasks)
    return ran


def test_auto_sweep_bisects_every_configuration_to_the_resolution(fake_runs: list[tuple[str, float]]) -> None:
    result = run_auto_sweep(_sim, ("stock", "gpuplane", "kueue"), wait_target=TARGET, jobs=1)
    doc = result.document
    for name in ("stock", "gpuplane", "kueue"):
        assert doc["capacityBound"][name] == "interpolated"
        assert doc["capacityAtWaitTarget"][name] == pytest.approx(CROSSING[name], abs=0.05)
        loads = [p["load"] for p in doc["autoSweep"][name]]
        assert max(loads) > CROSSING[name]  # it went past the target, however high
    # gpuplane's capacity is above the starting grid: found by extending, not reported as a bound.
    assert doc["capacityAtWaitTarget"]["gpuplane"] > 1.6
    assert doc["capacityRatioToGpuplane"]["kueue"] == pytest.approx(1.37 / 2.9, abs=0.03)
    assert doc["strongestPeer"] == "kueue"
    assert [p["load"] for p in doc["sweep"]] == [0.6, 1.0, 1.6]  # every configuration ran there
    assert len(fake_runs) == len(set(fake_runs))  # no load runs twice for one configuration


@pytest.mark.usefixtures("fake_runs")
def test_auto_sweep_goes_down_for_a_configuration_that_misses_everywhere() -> None:
    doc = run_auto_sweep(_sim, ("volcano",), wait_target=TARGET, jobs=1).document
    assert doc["capacityBound"]["volcano"] == "belowSweep"  # misses even at the lowest load tried
    assert min(p["load"] for p in doc["autoSweep"]["volcano"]) == pytest.approx(auto_sweep.MIN_LOAD)


def test_auto_sweep_refuses_a_bad_resolution() -> None:
    with pytest.raises(ValueError, match="resolution"):
        AutoSweep(_sim, ("stock",), wait_target=TARGET, jobs=1, progress=None, resolution=0.0)
