"""The ETA's range (learned from how ETAs met starts) and the simulator's runtime history."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuplane.insight.eta import Gang, NodeFree, NodeReplay
from gpuplane.sim import ranges
from gpuplane.sim.forecast import GANG_DRAWS, Forecaster, RuntimeHistory, features_of, shape_of
from gpuplane.sim.metrics import GroupStats, basis_document
from gpuplane.sim.ranges import StartRanges
from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job, Request


def test_range_before_anything_is_learned_is_half_to_twice_the_wait() -> None:
    r = StartRanges()
    assert r.range("queue", 100.0, 1100.0) == (600.0, 2100.0)
    assert r.centre("queue", 100.0, 1100.0) == 1100.0
    assert r.range("queue", 100.0, 110.0) == (100.0, 160.0)  # a short wait: up to a minute


def test_range_reads_the_10th_and_90th_percentile_of_the_learned_ratios() -> None:
    r = StartRanges()
    for k in range(1, 101):  # real waits 0.01 .. 1.00 of twice the predicted one
        r.learn("queue", 0.0, 1000.0, 20.0 * k)
    low, high = r.range("queue", 0.0, 1000.0)
    assert low == pytest.approx(1000.0 * 0.22)
    assert high == pytest.approx(1000.0 * 1.82)
    assert r.centre("queue", 0.0, 1000.0) == pytest.approx(1020.0)
    assert r.range("gang", 0.0, 1000.0) == (500.0, 2000.0)  # each kind learns apart
    inside = sum(low <= 20.0 * k <= high for k in range(1, 101))
    assert inside == 81


def test_a_short_predicted_wait_is_centred_on_the_real_waits_of_such_predictions() -> None:
    r = StartRanges()
    assert r.centre("queue", 0.0, 30.0) == 30.0  # nothing learned: the replay's own
    for k in range(1, 41):  # predicted to start at once; started after 10 .. 400 s
        r.learn("queue", 0.0, 0.0, 10.0 * k)
    assert r.centre("queue", 0.0, 0.0) == pytest.approx(210.0)  # the median real wait
    assert r.centre("queue", 100.0, 130.0) == pytest.approx(310.0)
    low, high = r.range("queue", 0.0, 0.0)
    assert low <= r.centre("queue", 0.0, 0.0) <= high
    assert r.centre("gang", 0.0, 0.0) == 0.0  # each kind learns apart


def test_range_forgets_past_its_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranges, "WINDOW", 30)
    r = StartRanges()
    for _ in range(30):
        r.learn("queue", 0.0, 100.0, 1000.0)
    for _ in range(30):
        r.learn("queue", 0.0, 100.0, 100.0)
    assert r.range("queue", 0.0, 100.0) == (100.0, 100.0)  # only the last 30: ratios of 1


def test_ranges_that_miss_more_than_two_in_ten_of_the_long_waits_widen_until_they_do_not() -> None:
    # Half the starts learned from come after a short wait, exactly when predicted; the other
    # half, after long waits, spread from 0 to 2 times the predicted wait. The 10th to 90th
    # percentile of all of them (0.4 to 1.6) misses four long waits in ten; fed back by the long
    # waits alone, the levels widen until two in ten of those fall outside.
    def run(feedback: bool) -> list[bool]:
        r = StartRanges()
        outside = []
        for k in range(8000):
            low, high = r.range("queue", 0.0, 1000.0)
            if k % 2:
                start = 1000.0 * 2.0 * ((k * 0.618034) % 1.0)
                outside.append(not low <= start <= high)
                waited = ranges.MEASURED + start
            else:
                start, waited = 1000.0, 10.0
            r.learn("queue", 0.0, 1000.0, start, given=(low, high) if feedback else None, waited=waited)
        return outside[-2000:]

    assert sum(run(feedback=False)) / 2000 == pytest.approx(0.4, abs=0.05)
    assert sum(run(feedback=True)) / 2000 == pytest.approx(0.2, abs=0.05)

    short = StartRanges()  # a start that waited no longer than MEASURED moves nothing
    short.learn("queue", 0.0, 100.0, 500.0, given=(0.0, 1.0), waited=ranges.MEASURED)
    assert short.levels("queue") == (ranges.LOW, ranges.HIGH)
    short.learn("queue", 0.0, 100.0, 500.0, given=(0.0, 1.0), waited=ranges.MEASURED + 1)
    low_level, high_level = short.levels("queue")
    assert low_level < ranges.LOW < ranges.HIGH < high_level, "a miss widens the levels"


def _job(i: int, name: str, work: float, team: str = "a") -> Job:
    return Job(
        i,
        f"j{i}",
        team,
        "train",
        "normal",
        0.0,
        2,
        Request(gpus=8),
        ("p",),
        work,
        0.0,
        1.0,
        999.0,
        base_name=name,
    )


def test_history_predicts_from_the_name_and_counts_running_runs() -> None:
    job = _job(0, "resnet", 100.0)
    assert features_of(job).name == "resnet"
    assert features_of(job).namespace == "a-train"
    assert shape_of(job) == "2x nvidia.com/gpu=8"
    history = RuntimeHistory()
    assert history.known_of(job, 0.0).mean == 999.0  # the declared class mean, before any history
    assert history.known_of(job, 0.0).basis == "declared"
    for i in range(5):
        history.record(_job(i, "resnet", 100.0), 100.0 + i)
    known = history.known_of(job, 1000.0)
    assert known.basis == "name"
    assert known.mean == pytest.approx(102.0)
    assert history.remaining(job, 1000.0, 101.0) == pytest.approx(1.5, abs=0.1)  # runs 101..104 left
    assert history.remaining(job, 1000.0, 500.0) > 0  # overdue: a tail, never 0
    other = _job(9, "bert", 100.0)
    history.run_started(other, 0.0)  # a long run of the team's size still running
    for i in range(5):
        history.record(_job(10 + i, "bert", 10.0), 10.0)
    assert history.known_of(other, 100.0).mean == pytest.approx((50.0 + 100.0) / 5)
    history.run_stopped(other, 0.0)
    assert history.look(other, 100.0) == ("name", 5.0, pytest.approx(10.0))


def test_errors_by_basis() -> None:
    stats = GroupStats(
        eta_relative_errors=[0.1, 0.3, 0.5],
        eta_inside=[True, False, True],
        eta_bases=["name", "name", "queue, overdue"],
        runtime_errors=[0.2],
        runtime_bases=["team"],
    )
    doc = basis_document(stats)
    assert list(doc) == ["name", "team", "class"]
    assert doc["name"]["etaRelativeErrorP50"] == 0.2
    assert doc["name"]["etaRangeCoverage"] == 0.5
    assert doc["class"]["etaWaitedCount"] == 1
    assert doc["team"]["runtimeRelativeErrorP50"] == 0.2


def test_a_gangs_eta_is_the_median_start_over_draws_of_the_holders_ends() -> None:
    history = RuntimeHistory()
    for i in range(20):  # runs of 100 .. 2000 s
        history.record(_job(i, "resnet", 100.0), 100.0 * (i + 1))
    holder = JobRun(_job(99, "resnet", 100.0), GroupStats(), 8.0, 8.0, 0, running_since=0.0)
    known = history.known_of(holder.job, 0.0)
    level = 0.5
    first = NodeFree(history.remaining_of(known, 0.0, level), "p", "a", 8.0)
    world = NodeReplay(free={}, releases=[first], queued=[], usage={}, nominal={}, node_size=8.0)
    gang = Gang("a", ("p",), 1, 0, 1.0, 100.0)
    forecaster = SimpleNamespace(runtimes=history)
    median = Forecaster._median_start(forecaster, 0.0, gang, world, [(0, holder, known, 0.0, level)])  # type: ignore[arg-type]
    draws = sorted(
        history.remaining_of(known, 0.0, (level + k / GANG_DRAWS) % 1.0) for k in range(GANG_DRAWS)
    )
    assert median == pytest.approx(draws[GANG_DRAWS // 2])
    assert Forecaster._median_start(forecaster, 0.0, gang, world, []) == first.end  # type: ignore[arg-type]
