"""The eta-floor benchmark's parts: the conditional runtime draw, the best ETA of a set of futures,
and the forked futures themselves (with constant runtimes every future is the run that happened)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from types import ModuleType

import numpy as np
import pytest

from bench_scripts import load_bench
from gpuplane.sim.experiment import build_model, scenario_input
from gpuplane.sim.scenario import Param, Scenario, builtin_scenario


@pytest.fixture(scope="module")
def floor() -> ModuleType:
    return load_bench("eta_floor.py")


def test_lognormal_draw_is_the_distribution_above_what_ran(floor: ModuleType) -> None:
    param = Param("lognormal", 874.0, 18006.0)
    rng = np.random.default_rng(1)
    unconditional = [floor.conditional_draw(param, 0.0, rng) for _ in range(4000)]
    assert statistics.median(unconditional) == pytest.approx(874.0, rel=0.08)
    done = 10_000.0
    above = [floor.conditional_draw(param, done, rng) for _ in range(4000)]
    assert min(above) > done
    # The median given X > done is the quantile (1 + F(done)) / 2 of the lognormal.
    mu, sigma = math.log(874.0), math.sqrt(2 * math.log(18006.0 / 874.0))
    normal = statistics.NormalDist()
    level = (1 + normal.cdf((math.log(done) - mu) / sigma)) / 2
    assert statistics.median(above) == pytest.approx(math.exp(mu + sigma * normal.inv_cdf(level)), rel=0.08)


def test_other_kinds_are_drawn_until_longer(floor: ModuleType) -> None:
    rng = np.random.default_rng(2)
    exponential = Param("exponential", 600.0)
    left = [floor.conditional_draw(exponential, 900.0, rng) - 900.0 for _ in range(4000)]
    assert min(left) > 0
    assert statistics.fmean(left) == pytest.approx(600.0, rel=0.08)  # memoryless
    assert floor.conditional_draw(Param.constant(50.0, ""), 10.0, rng) == 50.0


def test_best_eta(floor: ModuleType) -> None:
    assert floor.best_eta([100.0, 100.0, 100.0, 1000.0]) == 100.0
    assert floor.best_eta([math.inf, math.inf]) == floor.NO_START
    waits = [60.0, 120.0, 240.0, 480.0, 960.0]
    best = floor.best_eta(waits)
    assert floor.spread(best, waits) <= min(floor.spread(w, waits) for w in waits)
    assert floor.relative_error(150.0, 100.0) == 0.5
    assert floor.relative_error(150.0, math.inf) == 1.0


def _short_saturated(durations: str) -> Scenario:
    """The built-in scenario at load 1.5, shortened: constant runtimes (each class's mean) fill the
    queue within a day; lognormal ones take two."""
    scenario = builtin_scenario().with_load(1.5)
    if durations == "constant":
        classes = tuple(
            replace(wc, duration=Param.constant(wc.duration.mean, "test")) if wc.session is None else wc
            for wc in scenario.classes
        )
        return replace(scenario, classes=classes, days=1.0, warmup=6 * 3600.0)
    return replace(scenario, days=2.0, warmup=12 * 3600.0)


def _follow(floor: ModuleType, scenario: Scenario, every: int) -> list[object]:
    sim = scenario_input(scenario)
    engine = floor.FollowingEngine(
        build_model("gpuplane", sim),
        sim.workloads,
        sim.cluster.gpus,
        sim.reaper_idle,
        scenario=scenario,
        every=every,
        futures=2,
        jobs=2,
    )
    return list(engine.follow())


def test_with_known_runtimes_every_future_is_what_happened(floor: ModuleType) -> None:
    followed = _follow(floor, _short_saturated("constant"), every=12)
    started = [f for f in followed if f.wait is not None]
    assert len(started) >= 4
    assert any(f.wait > 300 for f in started)
    for f in started:
        assert f.futures == pytest.approx([f.wait] * 2, abs=1e-6)


def test_unknown_runtimes_make_futures_differ(floor: ModuleType) -> None:
    followed = _follow(floor, _short_saturated("lognormal"), every=4)
    waited = [f for f in followed if f.wait is not None and f.wait > 300]
    assert len(waited) >= 3
    # Every future differs from the run that happened and from the other future.
    assert all(f.futures[0] != f.futures[1] for f in waited)
    assert sum(f.wait not in f.futures for f in waited) >= len(waited) - 1


def test_knowing_names_draws_from_each_name_s_own_runs(floor: ModuleType) -> None:
    scenario = replace(builtin_scenario(), days=0.5, warmup=0.0)
    base = next(j for j in scenario_input(scenario).workloads.jobs if not j.is_session and j.deadline is None)
    works = (100.0, 400.0, 1600.0)
    runs = [replace(base, id=i, team="a", base_name="train", work=w) for i, w in enumerate(works)]
    few = [replace(base, id=10 + i, team="a", base_name="eval", work=60.0) for i in range(2)]
    other_team = [replace(base, id=20 + i, team="b", base_name="train", work=9000.0) for i in range(3)]
    unnamed = [replace(base, id=30 + i, base_name="", work=50.0) for i in range(3)]
    params = floor.name_runtimes(runs + few + other_team + unnamed)
    assert set(params) == {("a", "train"), ("b", "train")}  # a name needs three runs
    train = params["a", "train"]
    assert train.kind == "lognormal"
    assert train.a == pytest.approx(400.0)  # the median: the runs' geometric mean
    sigma = statistics.pstdev([math.log(w) for w in works])
    assert train.b == pytest.approx(400.0 * math.exp(sigma**2 / 2))  # the mean
    # A name whose runs all took the same time draws (almost) that time again.
    same = params["b", "train"]
    draws = [floor.conditional_draw(same, 0.0, np.random.default_rng(k)) for k in range(50)]
    assert min(draws) == pytest.approx(9000.0, rel=0.05)
    assert max(draws) == pytest.approx(9000.0, rel=0.05)
