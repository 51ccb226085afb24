"""`gpuplane simulate --clusters N`: several clusters behind one MultiKueue manager
(gpuplane.sim.multicluster*), on the tiny scenario over hours of simulated time."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpuplane.cli.app import app
from gpuplane.insight.dispatch import DispatchPolicy
from gpuplane.sim.experiment import SimInput, scenario_input
from gpuplane.sim.gpuplane_model import GpuplaneOptions
from gpuplane.sim.multicluster import (
    Dispatched,
    MultiClusterEngine,
    MultiClusterModel,
    MultiClusterSettings,
    split_cluster,
)
from gpuplane.sim.multicluster_run import dispatch_figures, run_fleet
from gpuplane.sim.scenario import load_scenario

TINY = Path(__file__).parent / "golden" / "tiny-mixed.yaml"
HOURS = 6.0


@cache
def tiny() -> SimInput:
    return scenario_input(load_scenario(TINY).with_days(HOURS / 24))


class CountingModel(MultiClusterModel):
    """Remembers the most copies a workload ever had at once."""

    most_copies = 0

    def _dispatch(self, entry: Dispatched, now: float) -> None:
        super()._dispatch(entry, now)
        self.most_copies = max(self.most_copies, len(entry.copies))


def run(settings: MultiClusterSettings) -> tuple[CountingModel, MultiClusterEngine, dict[str, Any]]:
    sim = tiny()
    model = CountingModel(
        sim.cluster, GpuplaneOptions(), sim.workloads.start, grace=sim.eviction_grace, settings=settings
    )
    engine = MultiClusterEngine(model, sim.workloads, sim.cluster.gpus, sim.reaper_idle)
    engine.run()
    return model, engine, dispatch_figures(model)


def test_nodes_are_dealt_round_robin_so_each_worker_has_a_mix() -> None:
    cluster = tiny().cluster
    workers = split_cluster(cluster, 2)
    assert sum(len(w.nodes) for w in workers) == len(cluster.nodes)
    assert sorted(n.name for w in workers for n in w.nodes) == sorted(n.name for n in cluster.nodes)
    assert all(len(w.pools) >= 2 for w in workers)
    assert abs(len(workers[0].nodes) - len(workers[1].nodes)) <= 1
    with pytest.raises(ValueError, match="between 1 and the scenario's 8 nodes"):
        split_cluster(cluster, 9)
    with pytest.raises(ValueError, match="at least 1"):
        MultiClusterSettings(0, "AllAtOnce")


def test_the_gpuplane_dispatcher_never_nominates_more_than_one_cluster() -> None:
    model, _, figures = run(MultiClusterSettings(3, "gpuplane"))
    assert model.most_copies == 1
    assert figures["cancelledStarts"] == 0
    assert figures["preemptionsByLosingCopies"] == 0
    assert figures["cancelledStartGpuHours"] == 0
    assert sum(figures["wins"].values()) > 0


def test_all_at_once_with_two_workers_that_both_admit_shows_a_cancelled_start() -> None:
    model, _, figures = run(MultiClusterSettings(2, "AllAtOnce"))
    assert model.most_copies == 2
    assert figures["cancelledStarts"] > 0
    assert figures["heldByLosingCopiesGpuHours"] > 0
    assert figures["cancelledStartGpuHours"] >= figures["heldByLosingCopiesGpuHours"]
    assert figures["copiesPerWorkload"] == 2.0


def test_incremental_nominates_three_first_then_more() -> None:
    model, _, figures = run(MultiClusterSettings(4, "Incremental"))
    assert 3 <= model.most_copies <= 4
    assert 3.0 <= figures["copiesPerWorkload"] < 4.0


def test_a_job_whose_selector_matches_no_cluster_never_runs_and_says_why() -> None:
    settings = MultiClusterSettings(
        2,
        "gpuplane",
        labels={"worker-1": {"region": "eu"}, "worker-2": {"region": "us"}},
        selectors={"ci": {"region": "ap"}, "gang": {"region": "us"}},
    )
    model, engine, figures = run(settings)
    ci = [run for run in engine.runs.values() if run.job.klass == "ci"]
    assert ci
    assert all(run.first_start is None for run in ci)
    why = "no worker nominated: no active worker cluster has the labels region=ap"
    assert {model.reason_of(run.job) for run in ci} == {why}
    assert figures["neverDispatched"] == {why: len(ci)}
    gangs = [e for e in model.dispatched.values() if e.job.klass == "gang" and e.winner is not None]
    assert gangs
    assert all(model.workers[e.winner].name == "worker-2" for e in gangs if e.winner is not None)


def test_dispatchers_compare_on_the_same_workloads() -> None:
    dispatchers: tuple[DispatchPolicy, ...] = ("AllAtOnce", "gpuplane")
    document = run_fleet(tiny(), MultiClusterSettings(2, "AllAtOnce"), dispatchers)
    docs = document["dispatchers"]
    assert list(docs) == ["AllAtOnce", "gpuplane"]
    assert docs["AllAtOnce"]["submitted"] == docs["gpuplane"]["submitted"]
    assert document["headline"].startswith("Over 2 clusters behind one manager, the gpuplane dispatcher")
    assert [w["name"] for w in document["workers"]] == ["worker-1", "worker-2"]


def test_cli_prints_the_sentence_first_and_json_per_dispatcher() -> None:
    runner = CliRunner()
    args = ["simulate", "--scenario", str(TINY), "--days", "0.1", "--clusters", "2", "--jobs", "1"]
    table = runner.invoke(app, [*args, "--dispatchers", "gpuplane"])
    assert table.exit_code == 0, table.output
    assert table.output.startswith("Over 2 clusters behind one manager")
    out = runner.invoke(app, [*args, "--output", "json"])
    assert out.exit_code == 0, out.output
    document = json.loads(out.output)
    assert set(document["dispatchers"]) == {"AllAtOnce", "Incremental", "gpuplane"}
    for figures in document["dispatchers"].values():
        assert {"waitP95Seconds", "preemptions", "cancelledStartGpuHours"} <= set(figures)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--clusters", "0"], "--clusters must be at least 1"),
        (["--clusters", "99"], "between 1 and the scenario's 8 nodes"),
        (["--clusters", "2", "--dispatchers", "random"], "unknown dispatcher 'random'"),
        (["--dispatchers", "gpuplane"], "--dispatchers needs --clusters"),
        (["--clusters", "2", "--sweep", "1,2"], "does not combine with --sweep"),
    ],
)
def test_cli_bad_input_is_one_line_and_status_2(extra: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["simulate", "--scenario", str(TINY), *extra])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output
