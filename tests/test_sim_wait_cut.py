"""A run stops once its p95 wait is sure to miss the wait target, and only then.

The decision must be exact: a cut run's full-length twin misses the target too, its reported p95
is a lower bound of the twin's, and a run that meets the target is never cut (its summary is the
same as without the cut).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuplane.sim.experiment import SimInput, run_named, scenario_input
from gpuplane.sim.metrics import GroupStats
from gpuplane.sim.runs import JobRun
from gpuplane.sim.scenario import load_scenario
from gpuplane.sim.sweep import OVER_SHARE
from gpuplane.sim.wait_cut import PROJECT_AFTER, WaitCut
from gpuplane.sim.workloads import Job, Request

TINY = Path(__file__).resolve().parent / "golden" / "tiny-mixed.yaml"
TARGET = 3600.0


def _job(i: int, submit: float, *, deadline: float | None = None, continuation: int | None = None) -> Job:
    return Job(
        id=i,
        name=f"j{i}",
        team="t",
        klass="c",
        tier="normal",
        submit=submit,
        pods=1,
        request=Request(gpus=1),
        pools=("gpu",),
        work=60.0,
        startup=0.0,
        activity=1.0,
        expected=60.0,
        deadline=deadline,
        continuation_of=continuation,
    )


def _run(job: Job) -> JobRun:
    return JobRun(job, GroupStats(), 1.0, 1.0, 0)


def test_twenty_counted_waits_need_two_over_the_target() -> None:
    """p95 of 20 waits interpolates the 19th and 20th smallest: two over the target decide it."""
    jobs = [_job(i, 100.0 * i) for i in range(20)]
    jobs += [_job(20, -50.0), _job(21, 10.0, continuation=3)]  # warm-up and resumption: not counted
    cut = WaitCut(TARGET, jobs)
    assert (cut.total, cut.need) == (20, 2)
    runs = [_run(job) for job in jobs]
    for run in runs:
        cut.arrived(run)
    assert not cut.decided(TARGET + 50.0)  # only job 0 has waited over the target
    assert cut.decided(TARGET + 150.0)  # jobs 0 and 1 have
    quick = WaitCut(TARGET, jobs)
    for run in runs:
        quick.arrived(run)
        run.first_start = run.job.submit + 10.0
        quick.started(run, run.first_start)
    assert not quick.decided(1e6)  # all started within seconds: nothing is left to wait
    started = WaitCut(TARGET, jobs)
    started.started(runs[0], runs[0].job.submit + TARGET + 5.0)
    assert not started.decided(0.0)
    started.started(runs[20], runs[20].job.submit + TARGET + 5.0)  # a warm-up job: not counted
    assert not started.decided(0.0)
    started.started(runs[1], runs[1].job.submit + TARGET + 5.0)
    assert started.decided(0.0)


def test_only_jobs_with_no_deadline_count_while_they_wait() -> None:
    """A waiting job with a deadline may be withdrawn and then counts no wait: it never decides."""
    jobs = [_job(i, 0.0, deadline=1e6) for i in range(20)]
    cut = WaitCut(TARGET, jobs)
    for job in jobs:
        cut.arrived(_run(job))
    assert not cut.decided(10 * TARGET)
    plain = [_job(i, 0.0) for i in range(20)]
    cut = WaitCut(TARGET, plain)
    for job in plain:
        cut.arrived(_run(job))
    assert not cut.decided(TARGET)  # waited exactly the target: not over it
    assert cut.decided(TARGET + 1.0)
    assert cut.lower_bound([], TARGET + 1.0) == pytest.approx(TARGET + 1.0)


def test_a_bad_target_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be negative"):
        WaitCut(-1.0, [])


def _tiny(load: float) -> SimInput:
    return scenario_input(load_scenario(TINY).with_days(0.5).with_load(load))


@pytest.mark.parametrize("name", ["stock", "kueue"])
def test_a_cut_run_misses_the_target_and_reports_a_lower_bound(name: str) -> None:
    sim = _tiny(2.5)
    _, full = run_named(name, sim)
    _, cut = run_named(name, sim, cut_above=TARGET)
    assert "cut" not in full
    assert cut["cut"]["waitP95"] == "atLeast"
    assert 0 < cut["cut"]["atSeconds"] < sim.workloads.horizon
    assert cut["events"] < full["events"]
    assert TARGET < cut["waitP95Seconds"] <= full["waitP95Seconds"]


@pytest.mark.parametrize("load", [0.3, 0.8, 1.5, 2.5])
@pytest.mark.parametrize("name", ["stock", "gpuplane", "volcano"])
def test_the_cut_decides_exactly_what_the_whole_run_says(name: str, load: float) -> None:
    """Cut or not, the run says the same about the target; a run that meets it is not cut at all."""
    sim = _tiny(load)
    _, full = run_named(name, sim)
    _, cut = run_named(name, sim, cut_above=TARGET)
    missed = (full["waitP95Seconds"] or 0.0) > TARGET
    assert ((cut["waitP95Seconds"] or 0.0) > TARGET) == missed
    if "cut" in cut:
        assert missed
        assert cut["waitP95Seconds"] <= full["waitP95Seconds"]
    else:
        assert {k: v for k, v in cut.items() if k not in ("wallSeconds", "waitOverTargetShare")} == {
            k: v for k, v in full.items() if k != "wallSeconds"
        }


@pytest.mark.parametrize(("name", "load"), [("gpuplane", 2.0), ("volcano", 1.0), ("stock", 0.9)])
def test_a_run_tells_the_share_of_its_waits_over_the_target(name: str, load: float) -> None:
    """Run to the end, the share is the share of the counted waits over the target; cut in the
    window's second half, it is projected to the window's end (at least the 5 % that decided the
    cut, near what the whole run had); cut in the first half, it is not told."""
    sim = _tiny(load)
    ledger, full = run_named(name, sim)
    _, cut = run_named(name, sim, cut_above=TARGET)
    waits = [w for stats in ledger.groups.values() for w in stats.waits]
    over = sum(1 for w in waits if w > TARGET + 0.1) / len(waits)
    assert "waitOverTargetShare" not in full  # only a run with a target to cut at counts it
    share = cut["waitOverTargetShare"]
    if "cut" not in cut:
        assert share == pytest.approx(over, abs=1e-5)
        assert (share <= OVER_SHARE) == (full["waitP95Seconds"] <= TARGET)
    elif cut["cut"]["atSeconds"] >= PROJECT_AFTER * sim.workloads.horizon:
        assert OVER_SHARE <= share <= 2 * over
    else:
        assert share is None


def _without_eta(doc: Any) -> Any:
    """``doc`` without its ETA figures (any key that starts with ``eta``), at every depth."""
    if isinstance(doc, dict):
        return {k: _without_eta(v) for k, v in doc.items() if not k.startswith("eta")}
    return doc


@pytest.mark.parametrize("name", ["gpuplane", "volcano"])
def test_a_run_without_eta_predictions_schedules_the_same(name: str) -> None:
    """What a capacity search runs beyond its grid: no ETA figures, every other figure the same."""
    sim = _tiny(1.5)
    full_ledger, full = run_named(name, sim)
    bare_ledger, bare = run_named(name, replace(sim, eta=False))
    assert full["etaWaitedCount"] > 0
    assert (bare["etaWaitedCount"], bare["etaErrorP50"]) == (0, None)
    assert bare_ledger.cycles == full_ledger.cycles
    for key, group in full_ledger.groups.items():
        assert bare_ledger.groups[key].waits == group.waits
    del bare["wallSeconds"], full["wallSeconds"]
    assert _without_eta(bare) == _without_eta(full)
