"""Configurations and sweep points in worker processes: the same documents as from one process."""

from __future__ import annotations

import json
import os
import pickle
import time
from collections.abc import Hashable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpuplane.sim.auto_sweep import run_auto_sweep
from gpuplane.sim.experiment import ScenarioDraw, SimInput, run_experiment, run_named, scenario_input
from gpuplane.sim.gpus_match import at_demand
from gpuplane.sim.metrics import Ledger
from gpuplane.sim.parallel import RunResult, Task, Workers, run_tasks
from gpuplane.sim.scenario import load_scenario
from gpuplane.sim.sweep import run_sweep
from test_sim_golden import without_timings
from test_sim_sweep import gpuplane_cli

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "tests" / "golden" / "tiny-mixed.yaml"


def _tiny(load: float = 1.4) -> SimInput:
    return scenario_input(load_scenario(TINY).with_days(0.25).with_load(load))


def test_an_experiment_in_two_processes_gives_the_one_process_document() -> None:
    sim = _tiny()
    names = ("stock", "gpuplane", "gpuplane-no-preemption")
    alone = run_experiment(sim, names, jobs=1)
    seen: dict[str, float] = {}
    side_by_side = run_experiment(sim, names, jobs=2, progress=seen.__setitem__)
    assert without_timings(side_by_side.document) == without_timings(alone.document)
    assert list(side_by_side.document["configurations"]) == list(names)
    for name in names:
        assert side_by_side.ledgers[name].events == alone.ledgers[name].events > 0
    # Every worker's progress reached the parent, each run to its end.
    assert seen == dict.fromkeys(names, 1.0)


def test_a_sweep_in_two_processes_gives_the_one_process_document() -> None:
    loads = [1.6, 0.4]  # out of order on purpose: the document orders by load
    names = ("stock", "gpuplane")
    alone = run_sweep(_tiny, loads, names, wait_target=1800.0, jobs=1)
    labels: set[str] = set()
    side_by_side = run_sweep(
        _tiny, loads, names, wait_target=1800.0, jobs=2, progress=lambda label, _: labels.add(label)
    )
    assert without_timings(side_by_side.document) == without_timings(alone.document)
    assert [p["load"] for p in side_by_side.document["sweep"]] == [0.4, 1.6]
    assert labels == {"stock @ 0.4", "gpuplane @ 0.4", "stock @ 1.6", "gpuplane @ 1.6"}


def _broken(name: str, sim: SimInput, progress: Any) -> tuple[Ledger, dict[str, Any]]:
    if name == "boom":
        raise RuntimeError("the run failed in its worker")
    return run_named(name, sim, progress)


def test_a_failure_in_a_worker_reaches_the_caller() -> None:
    tasks = [Task("stock", "stock", 0), Task("boom", "boom", 0)]
    with pytest.raises(RuntimeError, match="the run failed in its worker"):
        run_tasks(_broken, [_tiny()], tasks, jobs=2)


def _dies(name: str, sim: SimInput, progress: Any) -> tuple[Ledger, dict[str, Any]]:
    if name == "boom":
        os._exit(9)  # as a worker killed by the kernel would
    return run_named(name, sim, progress)


def test_a_worker_that_dies_is_one_clear_error() -> None:
    tasks = [Task("boom", "boom", 0), Task("stock", "stock", 0)]
    with pytest.raises(RuntimeError, match=r"worker process stopped unexpectedly .* --jobs 1"):
        run_tasks(_dies, [_tiny()], tasks, jobs=2)


def test_jobs_must_be_positive() -> None:
    with pytest.raises(ValueError, match="jobs must be at least 1"):
        run_tasks(run_named, [], [], jobs=0)
    run = gpuplane_cli("--jobs", "0", "--days", "0.1")
    assert run.returncode == 2
    assert run.stderr.strip() == "error: --jobs must be at least 1, got 0"


def test_the_cli_gives_the_same_json_with_one_job_or_two() -> None:
    def simulate(jobs: str) -> dict[str, Any]:
        args = ("--scenario", str(TINY), "--days", "0.25", "--load", "1.4", "--jobs", jobs, "-o", "json")
        run = gpuplane_cli(*args)
        assert run.returncode == 0, run.stderr
        document: dict[str, Any] = json.loads(run.stdout)
        return document

    assert without_timings(simulate("2")) == without_timings(simulate("1"))


def _slow_unless_stopped(name: str, sim: SimInput, progress: Any) -> tuple[Ledger, dict[str, Any]]:
    if name == "slow":
        for i in range(600):  # a minute, reporting progress as a run does
            progress(i / 600)
            time.sleep(0.1)
    return run_named("stock", sim, progress)


@pytest.mark.parametrize("jobs", [1, 2])
def test_workers_hand_out_runs_and_stop_one_no_longer_needed(jobs: int) -> None:
    """:class:`Workers` runs what it is given as workers free up and returns each result as it
    ends; a run stopped while it goes ends at its next progress report, and its worker counts as
    free at once: a run started then goes on that worker once the stopped run has ended, without
    waiting for the other workers' runs. A run stopped before it started never runs. With one
    job, runs go in the order started."""
    sim = _tiny()
    started = time.perf_counter()
    with Workers(_slow_unless_stopped, jobs) as workers:
        workers.start("slow", "slow", "slow", sim)
        if jobs == 2:
            workers.start("busy", "slow", "busy", sim)  # holds the other worker for a minute
            assert workers.free() == 0
            time.sleep(3)  # the slow run is under way in its worker
        workers.cancel("slow")
        assert workers.running() == ([] if jobs == 1 else ["busy"])
        assert workers.free() == 1  # the stopped run's worker is free for the next run
        workers.start("quick", "stock", "quick", sim)
        done = workers.next_done()
        assert done is not None
        key, (ledger, doc) = done
        assert key == "quick"  # before the busy run's minute is up
        assert doc["started"] > 0
        assert ledger.events > 0
        assert time.perf_counter() - started < 40
        if jobs == 2:
            workers.cancel("busy")
        assert workers.next_done() is None  # the stopped runs ended and give nothing back
        assert workers.free() == jobs
    assert time.perf_counter() - started < 40  # far less than the slow runs' minute


def test_a_worker_that_dies_under_workers_is_the_same_clear_error() -> None:
    with Workers(_dies, 2) as workers:
        workers.start("boom", "boom", "boom", _tiny())
        with pytest.raises(RuntimeError, match=r"worker process stopped unexpectedly .* --jobs 1"):
            workers.next_done()


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_input_given_as_its_draw_is_drawn_where_it_runs_and_runs_the_same(jobs: int) -> None:
    """A :class:`ScenarioDraw` handed to :class:`Workers` is drawn by the process that runs it:
    the runs are those on the input drawn in the parent, and the parent pickles a few kilobytes
    instead of the workloads. What a search reads before the run needs no draw."""
    scenario = load_scenario(TINY).with_days(0.25).with_load(1.4)
    draw = ScenarioDraw(scenario, eta=False)
    drawn = replace(scenario_input(scenario), eta=False)
    assert draw.draw() == drawn
    assert (draw.cluster, draw.name, draw.seed, draw.days) == (
        drawn.cluster,
        drawn.name,
        drawn.seed,
        drawn.days,
    )
    assert len(pickle.dumps(draw)) < min(10_000, len(pickle.dumps(drawn)) / 5)  # the workloads stay out
    results: dict[Hashable, RunResult] = {}
    with Workers(run_named, jobs) as workers:
        for key, name, source in (("a", "stock", draw), ("b", "stock", drawn), ("c", "gpuplane", draw)):
            while not workers.free():
                finished = workers.next_done()
                assert finished is not None
                results[finished[0]] = finished[1]
            workers.start(key, name, key, source)
        while (finished := workers.next_done()) is not None:
            results[finished[0]] = finished[1]
    assert set(results) == {"a", "b", "c"}
    assert without_timings(results["a"][1]) == without_timings(results["b"][1])
    assert results["a"][0].events == results["b"][0].events > 0
    assert without_timings(results["c"][1]) == without_timings(run_named("gpuplane", drawn)[1])


def test_an_auto_sweep_on_inputs_drawn_in_the_workers_gives_the_document_of_inputs_drawn_here() -> None:
    """The command's auto sweep hands its runs beyond the grid and its GPUs to match to the
    workers as draws; the document is the one from inputs drawn in the parent."""
    scenario = load_scenario(TINY).with_days(0.25)
    names = ("stock", "gpuplane")

    def here(load: float) -> SimInput:
        return scenario_input(scenario.with_load(load))

    def there(load: float) -> ScenarioDraw:
        return ScenarioDraw(scenario.with_load(load))

    def grown_here(load: float, m: float) -> SimInput:
        return scenario_input(at_demand(scenario, load, m))

    def grown_there(load: float, m: float) -> ScenarioDraw:
        return ScenarioDraw(at_demand(scenario, load, m))

    drawn = run_auto_sweep(here, names, wait_target=1800.0, jobs=1, grown=grown_here).document
    given = run_auto_sweep(there, names, wait_target=1800.0, jobs=1, grown=grown_there).document
    beyond = [p["load"] for p in drawn["autoSweep"]["gpuplane"] if p["load"] not in (0.6, 1.0, 1.6)]
    assert beyond  # the search went beyond the grid, where the inputs are draws
    assert any(match["runs"] for match in drawn["gpusToMatch"].values())  # and matched on grown clusters
    assert without_timings({k: v for k, v in given.items() if k != "phases"}) == without_timings(
        {k: v for k, v in drawn.items() if k != "phases"}
    )
