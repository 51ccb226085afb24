"""The runtime predictor: fallback from the most specific features, attained service, overdue
tails that are never 0, limits, and incremental learning equal to batch learning."""

from __future__ import annotations

import random

import pytest

from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample
from gpuplane.insight.runtime_predictor import (
    DEFAULT_RUNTIME_SECONDS,
    LIMIT_GRACE_SECONDS,
    PSEUDO_SAMPLES,
    Prediction,
    RuntimePredictor,
    learn_into,
)

TRAIN = JobFeatures("ml", "train", "gpus", "", "4x nvidia.com/gpu=1")
TRAIN_8 = JobFeatures("ml", "train", "gpus", "", "8x nvidia.com/gpu=1")
EVAL = JobFeatures("ml", "eval", "gpus", "", "4x nvidia.com/gpu=1")
OTHER_TEAM = JobFeatures("cv", "detect", "gpus", "", "1x nvidia.com/gpu=1")
ELSEWHERE = JobFeatures("nlp", "tune", "other", "", "2x nvidia.com/gpu=1")


def runs(features: JobFeatures, *seconds: float) -> list[RuntimeSample]:
    return [RuntimeSample(features, s, 1000.0 + i) for i, s in enumerate(seconds)]


def test_without_history_a_lognormal_around_an_hour_is_assumed() -> None:
    found = RuntimePredictor().predict(TRAIN)
    assert found.basis == "assumed"
    assert found.samples == 0
    assert len(found.quantiles) == PSEUDO_SAMPLES
    assert found.at(0.5) == pytest.approx(DEFAULT_RUNTIME_SECONDS)
    assert found.at(0.1) < found.at(0.5) < found.at(0.9)


def test_a_declared_runtime_is_taken_without_history() -> None:
    found = RuntimePredictor().predict(TRAIN, declared=600.0)
    assert found.basis == "declared"
    assert found.at(0.1) == found.at(0.9) == 600.0
    assert RuntimePredictor().predict(TRAIN, 200.0, declared=600.0).at(0.5) == 400.0


def test_fallback_from_the_most_specific_key_with_enough_runs() -> None:
    p = RuntimePredictor(min_samples=3)
    p.add(RuntimeSample(TRAIN, 100.0, 1.0))
    for s in runs(OTHER_TEAM, 5000.0, 5000.0, 5000.0):
        p.add(s)
    assert p.predict(TRAIN).basis == "queue"  # the queue has 4 runs; nothing narrower has 3
    assert p.predict(ELSEWHERE).basis == "all"
    for s in runs(EVAL, 300.0, 300.0):
        p.add(s)
    assert p.predict(TRAIN).basis == "team"  # ml's 4x1-GPU jobs: train once, eval twice
    assert p.predict(TRAIN).samples == 3
    for s in runs(TRAIN_8, 900.0, 900.0):
        p.add(s)
    found = p.predict(TRAIN)
    assert (found.basis, found.samples) == ("name", 3)  # train at any size
    assert found.at(0.5) == 900.0
    for s in runs(TRAIN, 120.0, 140.0):
        p.add(s)
    found = p.predict(TRAIN)
    assert (found.basis, found.samples) == ("name", 3)  # train at this size
    assert found.at(0.5) == 120.0
    assert p.count(TRAIN) == ("name", 3)


def test_history_wins_over_a_declared_runtime() -> None:
    p = RuntimePredictor(runs(TRAIN, 100.0, 110.0, 120.0, 130.0, 140.0))
    assert p.predict(TRAIN, declared=5000.0).basis == "name"


def test_a_declared_runtime_may_be_preferred_over_all_but_the_job_names_history() -> None:
    p = RuntimePredictor(runs(EVAL, 100.0, 110.0, 120.0, 130.0, 140.0))
    assert p.predict(TRAIN, declared=5000.0).basis == "team"
    assert p.predict(TRAIN, declared=5000.0, prefer_declared=True).basis == "declared"
    assert p.predict(TRAIN, prefer_declared=True).basis == "team"  # nothing declared: history
    assert p.predict(EVAL, declared=5000.0, prefer_declared=True).basis == "name"


def test_conditioned_on_attained_service() -> None:
    hours = [3.6, 3.7, 3.8, 3.9, 4.0, 4.0, 4.1, 4.2, 4.3, 4.4]
    p = RuntimePredictor(runs(TRAIN, *(h * 3600 for h in hours)))
    fresh = p.predict(TRAIN)
    three_hours_in = p.predict(TRAIN, 3 * 3600.0)
    assert fresh.at(0.5) == pytest.approx(4.0 * 3600)
    assert three_hours_in.at(0.5) == pytest.approx(1.0 * 3600)  # ends soon, not in another 4 h
    assert three_hours_in.samples == 10
    # 3.95 h in: only the runs longer than that count.
    late = p.predict(TRAIN, 3.95 * 3600)
    assert late.at(0.0) == pytest.approx(0.05 * 3600)
    assert late.at(1.0) == pytest.approx(0.45 * 3600)


def test_an_overdue_job_gets_a_tail_never_zero() -> None:
    p = RuntimePredictor(runs(TRAIN, 100.0, 110.0, 120.0, 130.0, 140.0))
    found = p.predict(TRAIN, 1000.0)
    assert found.basis == "name, overdue"
    assert found.overdue
    assert min(found.quantiles) > 0.0
    assert list(found.quantiles) == sorted(found.quantiles)
    assert 0.2 * 1000 < found.at(0.5) < 1000  # a share of what it has run
    assert found.at(0.9) > found.at(0.5)
    past_declared = RuntimePredictor().predict(TRAIN, 7200.0, declared=3600.0)
    assert past_declared.basis == "declared, overdue"
    assert min(past_declared.quantiles) > 0.0
    exactly_declared = RuntimePredictor().predict(TRAIN, 3600.0, declared=3600.0)
    assert min(exactly_declared.quantiles) > 0.0
    long_past_assumed = RuntimePredictor().predict(TRAIN, 30 * 86400.0)
    assert long_past_assumed.basis == "assumed, overdue"
    assert min(long_past_assumed.quantiles) > 0.0


def test_a_limit_caps_the_whole_run() -> None:
    p = RuntimePredictor(runs(TRAIN, 100.0, 1000.0, 2000.0, 4000.0, 8000.0))
    found = p.predict(TRAIN, 500.0, limit=3000.0)
    assert max(found.quantiles) <= 3000.0 - 500.0
    assert found.at(0.0) == pytest.approx(500.0)  # the shortest run longer than 500 s, 1000 s
    assert RuntimePredictor().predict(TRAIN, limit=600.0).at(0.9) == 600.0
    overdue = p.predict(TRAIN, 20000.0, limit=21000.0)
    assert max(overdue.quantiles) <= 1000.0
    past = p.predict(TRAIN, 5000.0, limit=4000.0)
    assert max(past.quantiles) == LIMIT_GRACE_SECONDS  # past its deadline: being stopped


def test_incremental_add_equals_batch() -> None:
    rng = random.Random(7)
    features = [TRAIN, TRAIN_8, EVAL, OTHER_TEAM, ELSEWHERE]
    samples = [RuntimeSample(rng.choice(features), rng.lognormvariate(7, 1), float(i)) for i in range(400)]
    batch = RuntimePredictor(samples)
    one_by_one = RuntimePredictor()
    asked: list[Prediction] = []
    for s in samples:
        one_by_one.add(s)
        asked.append(one_by_one.predict(TRAIN))  # caches along the way do not go stale
    assert asked[-1] == batch.predict(TRAIN)
    for f in features:
        for elapsed in (0.0, 500.0, 3000.0, 50000.0):
            assert one_by_one.predict(f, elapsed) == batch.predict(f, elapsed)
    assert len(batch) == len(samples)


def test_learning_into_the_runs_of_features_equals_adding() -> None:
    rng = random.Random(3)
    added, learned = RuntimePredictor(), RuntimePredictor()
    for i in range(200):
        features = rng.choice([TRAIN, TRAIN_8, EVAL])
        seconds = rng.lognormvariate(7, 1)
        added.add(RuntimeSample(features, seconds, float(i)))
        learn_into(learned.runs_of(features), seconds)
    for f in (TRAIN, TRAIN_8, EVAL, OTHER_TEAM):
        for elapsed in (0.0, 900.0, 4000.0):
            assert learned.predict(f, elapsed) == added.predict(f, elapsed)
    assert learned.predict(TRAIN).median == added.predict(TRAIN).quantiles[PSEUDO_SAMPLES // 2]


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="runtime"):
        RuntimePredictor().add(RuntimeSample(TRAIN, -1.0, 0.0))
    with pytest.raises(ValueError, match="min_samples"):
        RuntimePredictor(min_samples=0)
    with pytest.raises(ValueError, match="quantile"):
        RuntimePredictor().predict(TRAIN).at(1.5)
    with pytest.raises(ValueError, match="limit"):
        RuntimePredictor().predict(TRAIN, limit=0.0)
    with pytest.raises(ValueError, match="declared"):
        RuntimePredictor().predict(TRAIN, declared=float("nan"))
