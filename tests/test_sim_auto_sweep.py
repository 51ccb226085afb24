"""``--sweep auto``: extended until every configuration misses the wait target, then bisected.

The runs are replaced by a known p95 wait per configuration and load (a wait that grows with load
and crosses the one-hour target at a known load), so the search itself is what is tested.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Hashable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from gpuplane.cli.simulate_scenario import sweep_table
from gpuplane.sim import auto_sweep, gpus_match
from gpuplane.sim.auto_sweep import AutoSweep, run_auto_sweep
from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.experiment import SimInput, expected_cost
from gpuplane.sim.gpus_match import at_demand, grow
from gpuplane.sim.headline import sweep_headline
from gpuplane.sim.parallel import RunResult
from gpuplane.sim.report import write_sweep_report
from gpuplane.sim.scenario import Team, load_scenario
from gpuplane.sim.sweep import OVER_SHARE, aim, sweep_points
from gpuplane.sim.workloads import Workloads, class_rate

TINY = Path(__file__).resolve().parent / "golden" / "tiny-mixed.yaml"

TARGET = 3600.0
CUT_PAST = 4.0  # a fake run whose wait is this many targets was cut
CROSSING = {"stock": 0.73, "gpuplane": 2.9, "kueue": 1.37, "volcano": 0.02}


def _sim(load: float) -> SimInput:
    spec = ClusterSpec((NodeSpec("n-0", "gpu", 8),), ("gpu",), (Team("red", 1.0, 1.0),))
    return SimInput(
        "fake", spec, Workloads((), (), 0.0, 3600.0), 3600.0, 7200.0, 30.0, seed=1, notes={"load": load}
    )


def _wait(name: str, load: float) -> float:
    """A p95 wait that is the target exactly at the configuration's crossing load."""
    return TARGET * math.exp(4.0 * (load - CROSSING[name]))


def _fake_doc(name: str, load: float) -> dict[str, Any]:
    doc: dict[str, Any] = {"waitP95Seconds": _wait(name, load), "wallSeconds": 0.0, "gpuBusyOfCapacity": 0.5}
    if doc["waitP95Seconds"] > CUT_PAST * TARGET:  # as a run cut once sure to miss reports
        doc["cut"] = {"atSeconds": 1800.0, "waitP95": "atLeast"}
    return doc


class FakeWorkers:
    """Stands in for :class:`~gpuplane.sim.parallel.Workers`: a started run takes
    ``duration(name, load)`` on a fake clock (by default its load), the first to end is done
    first, and its summary is ``doc(name, load)``. A stopped run frees its worker at once."""

    def __init__(
        self,
        _runner: object,
        jobs: int,
        _progress: object = None,
        *,
        doc: Callable[[str, float], dict[str, Any]] = _fake_doc,
        ran: list[tuple[str, float]],
        duration: Callable[[str, float], float] = lambda _name, load: load,
    ) -> None:
        self.jobs = jobs
        self.doc = doc
        self.ran = ran
        self.duration = duration
        self.clock = 0.0
        self.serial = 0
        self.going: dict[Hashable, tuple[float, int, str, float]] = {}
        self.cancelled: list[Hashable] = []
        self.most = 0  # runs going at once, at most

    def __enter__(self) -> FakeWorkers:
        return self

    def __exit__(self, *_: object) -> None:
        return None

    def free(self) -> int:
        return self.jobs - len(self.going)

    def running(self) -> list[Hashable]:
        return sorted(self.going, key=lambda key: self.going[key][1])

    def start(self, key: Hashable, name: str, _label: str, source: SimInput) -> None:
        assert self.free() >= 1
        load = source.notes["load"]
        self.ran.append((name, load))
        self.going[key] = (self.clock + self.duration(name, load), self.serial, name, load)
        self.serial += 1
        self.most = max(self.most, len(self.going))

    def cancel(self, key: Hashable) -> None:
        self.cancelled.append(key)
        del self.going[key]

    def next_done(self) -> tuple[Hashable, RunResult] | None:
        if not self.going:
            return None
        key = min(self.going, key=lambda k: self.going[k][:2])
        end, _, name, load = self.going.pop(key)
        self.clock = end
        return key, (None, self.doc(name, load))  # type: ignore[return-value]


@pytest.fixture
def fake_runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, float]]:
    ran: list[tuple[str, float]] = []
    monkeypatch.setattr(auto_sweep, "Workers", partial(FakeWorkers, ran=ran))
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
        AutoSweep(_sim, ("stock",), wait_target=TARGET, jobs=1, resolution=0.0)


def _grown(load: float, multiplier: float) -> SimInput:
    """100 one-GPU nodes grown ``multiplier`` times, at the demand of ``load`` on the 100."""
    count = math.ceil(100 * multiplier - 1e-9)
    nodes = tuple(NodeSpec(f"n-{i}", "gpu", 1) for i in range(count))
    spec = ClusterSpec(nodes, ("gpu",), (Team("red", 1.0, 1.0),))
    return SimInput(
        "fake",
        spec,
        Workloads((), (), 0.0, 3600.0),
        3600.0,
        7200.0,
        30.0,
        seed=1,
        notes={"load": load * 100 / count},
    )


@pytest.mark.usefixtures("fake_runs")
def test_gpus_to_match_is_simulated_on_larger_clusters() -> None:
    doc = run_auto_sweep(
        _sim, ("stock", "gpuplane", "kueue"), wait_target=TARGET, jobs=1, grown=_grown
    ).document
    capacity = doc["capacityAtWaitTarget"]
    # The demand matched is that of the highest load gpuplane met, within the resolution below
    # its interpolated capacity.
    runs = doc["autoSweep"]["gpuplane"]
    lowest_miss = min(r["load"] for r in runs if r["waitP95Seconds"] > TARGET)
    met = max(r["load"] for r in runs if r["waitP95Seconds"] <= TARGET and r["load"] < lowest_miss)
    assert doc["gpusToMatchLoad"] == met
    assert met <= capacity["gpuplane"] <= met + auto_sweep.RESOLUTION
    for name in ("stock", "kueue"):
        match = doc["gpusToMatch"][name]
        # The fake's wait depends on the load of the cluster it runs on: a configuration meets the
        # target on G' GPUs once gpuplane's demand is at most its own capacity fraction of G'.
        need = 100 * doc["gpusToMatchLoad"] / CROSSING[name]
        assert match["bound"] == "interpolated"
        assert need - 1 <= match["gpus"] <= need + 0.05 * 100 + 1, match
        assert 1 <= len(match["runs"]) <= gpus_match.MAX_RUNS
        assert all(run["gpus"] > 100 for run in match["runs"])  # simulated on more nodes, never scaled
    assert "gpuplane" not in doc["gpusToMatch"]
    text = sweep_headline(doc)
    assert f"stock would need {doc['gpusToMatch']['stock']['gpus']:,} GPUs to match (simulated" in text
    assert "the strongest peer, kueue, serves 1.3" in text
    assert f"gpuplane serves {capacity['gpuplane'] / capacity['kueue']:.2f}x its load" in text


def test_gpus_to_match_keeps_the_demand_of_the_load() -> None:
    scenario = load_scenario(TINY)
    grown = at_demand(scenario, 1.5, 2.5)
    assert [p.nodes for p in grown.pools] == [math.ceil(p.nodes * 2.5) for p in scenario.pools]
    for before, after in zip(scenario.with_load(1.5).classes, grown.classes, strict=True):
        assert class_rate(grown, after) == pytest.approx(class_rate(scenario.with_load(1.5), before))
    with pytest.raises(ValueError, match="at least 1"):
        grow(scenario, 0.5)


@pytest.mark.usefixtures("fake_runs")
def test_the_table_shows_every_load_the_auto_sweep_ran() -> None:
    doc = run_auto_sweep(_sim, ("stock", "gpuplane"), wait_target=TARGET, jobs=1).document
    ran = sorted({p["load"] for runs in doc["autoSweep"].values() for p in runs})
    assert len(ran) > len(auto_sweep.START_LOADS)
    assert [load for load, _ in sweep_points(doc)] == ran
    console = Console(width=200, record=True)
    console.print(sweep_table(doc))
    printed = console.export_text()
    for load in ran:
        assert f"\n{load:g} " in printed or f"│ {load:g} " in printed


@pytest.mark.usefixtures("fake_runs")
def test_the_report_plots_every_run_with_the_target_and_each_capacity(tmp_path: Path) -> None:
    names = ("stock", "gpuplane", "kueue", "gpuplane-no-sharing")
    CROSSING["gpuplane-no-sharing"] = 2.1
    try:
        result = run_auto_sweep(_sim, names, wait_target=TARGET, jobs=1)
    finally:
        del CROSSING["gpuplane-no-sharing"]
    doc = result.document
    index = write_sweep_report(result, tmp_path)
    wait_png = tmp_path / "sweep-wait.png"
    assert wait_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert index.is_file()
    plotted = json.loads((tmp_path / "sweep-series.json").read_text())
    wait = plotted["sweep-wait.png"]
    assert plotted["waitTargetHours"] == pytest.approx(1.0)
    for name in names:  # the plotted series is the JSON's, at every load the sweep ran
        line = wait["lines"][name]
        runs = doc["autoSweep"][name]
        assert line["load"] == [r["load"] for r in runs]
        assert line["value"] == pytest.approx([r["waitP95Seconds"] / 3600 for r in runs])
        assert line["capacity"] == doc["capacityAtWaitTarget"][name]
    assert set(wait["panels"]) == {"peers", "ablations"}
    assert wait["panels"]["peers"] == ["stock", "gpuplane", "kueue"]
    assert wait["panels"]["ablations"] == ["gpuplane", "gpuplane-no-sharing"]
    page = index.read_text()
    assert all(f"<td>{load:g}</td>" in page for load, _ in sweep_points(doc))
    # Runs cut once sure to miss are marked: a lower bound in the plot, the page and the table.
    cut = {name: [r["load"] for r in doc["autoSweep"][name] if "cut" in r] for name in names}
    assert any(cut.values())
    for name in names:
        assert wait["lines"][name].get("cutLoads", []) == cut[name]
    assert page.count("<td>≥ ") == sum(len(loads) for loads in cut.values())
    console = Console(width=250, record=True)
    console.print(sweep_table(doc))
    assert console.export_text().count("≥ ") >= sum(len(loads) for loads in cut.values())


@pytest.mark.usefixtures("fake_runs")
def test_gpus_to_match_ends_when_node_counts_round_to_clusters_already_run() -> None:
    def coarse(load: float, multiplier: float) -> SimInput:
        count = math.ceil(2 * multiplier - 1e-9)  # two 8-GPU nodes: clusters come 8 GPUs apart
        spec = ClusterSpec(
            tuple(NodeSpec(f"n-{i}", "gpu", 8) for i in range(count)), ("gpu",), (Team("red", 1.0, 1.0),)
        )
        return SimInput(
            "fake",
            spec,
            Workloads((), (), 0.0, 3600.0),
            3600.0,
            7200.0,
            30.0,
            seed=1,
            notes={"load": load * 2 / count},
        )

    doc = run_auto_sweep(_sim, ("stock", "gpuplane"), wait_target=TARGET, jobs=1, grown=coarse).document
    match = doc["gpusToMatch"]["stock"]
    need = 16 * doc["gpusToMatchLoad"] / CROSSING["stock"]
    assert match["bound"] == "interpolated"
    assert need <= match["gpus"] < need + 8
    assert len({run["gpus"] for run in match["runs"]}) <= gpus_match.MAX_RUNS


def test_a_step_up_stops_near_full_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    full = 3.2  # the fake's GPUs are fully allocated at this load (allocation grows with load)
    ran: list[tuple[str, float]] = []

    def doc(name: str, load: float) -> dict[str, Any]:
        return {"waitP95Seconds": _wait(name, load), "wallSeconds": 0.0, "gpuAllocatedShare": load / full}

    monkeypatch.setattr(auto_sweep, "Workers", partial(FakeWorkers, doc=doc, ran=ran))
    doc_ = run_auto_sweep(_sim, ("gpuplane",), wait_target=TARGET, jobs=1).document
    assert max(load for _, load in ran) <= full * (1 + auto_sweep.ALLOCATION_MARGIN) + 1e-9  # 1.5x: 3.6
    assert doc_["capacityAtWaitTarget"]["gpuplane"] == pytest.approx(CROSSING["gpuplane"], abs=0.05)


def test_a_peer_within_twice_gpuplanes_capacity_names_the_feature_that_closes_the_gap(
    fake_runs: list[tuple[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(CROSSING, "kueue-timeslicing", 1.6)
    doc = run_auto_sweep(
        _sim, ("stock", "gpuplane", "kueue", "kueue-timeslicing"), wait_target=TARGET, jobs=1
    ).document
    gaps = doc["peerGaps"]
    assert doc["strongestPeer"] == "kueue-timeslicing"
    sliced = gaps["kueue-timeslicing"]
    assert sliced["base"] == "kueue"
    assert sliced["capacityAdded"] == pytest.approx(1.6 - 1.37, abs=0.06)
    assert sliced["gpuplaneMultiple"] == pytest.approx(2.9 / 1.6, abs=0.06)
    assert not sliced["meetsGoal"]
    assert gaps["kueue"]["base"] == "stock"
    assert gaps["kueue"]["meetsGoal"]  # 2.9 / 1.37: more than twice
    text = sweep_headline(doc)
    feature = "the device plugin's time-slicing on the inference and notebook pools"
    assert f"short of 2x: {feature} adds 0.2" in text
    assert fake_runs  # the runs were the fake's


def test_spare_workers_run_more_loads_at_once_and_stop_the_runs_no_longer_needed(
    monkeypatch: pytest.MonkeyPatch, fake_runs: list[tuple[str, float]]
) -> None:
    """One configuration on one worker, then on three: with three, its search runs up to three
    loads at once (further steps up, then points in the bracket), a run starts whenever a worker
    is free, and a step up beyond a load that missed is stopped. The search takes far less time
    on the fake clock, and both find the capacity within the resolution."""
    made: list[FakeWorkers] = []

    def workers(*args: Any, **kwargs: Any) -> FakeWorkers:
        made.append(FakeWorkers(*args, ran=fake_runs, **kwargs))
        return made[-1]

    monkeypatch.setattr(auto_sweep, "Workers", workers)
    alone = run_auto_sweep(_sim, ("gpuplane",), wait_target=TARGET, jobs=1).document
    one_by_one = made[-1]
    assert one_by_one.most == 1
    assert not one_by_one.cancelled  # one at a time, nothing runs ahead of what is known
    fake_runs.clear()
    spread = run_auto_sweep(_sim, ("gpuplane",), wait_target=TARGET, jobs=3).document
    side_by_side = made[-1]
    assert side_by_side.most == 3
    assert side_by_side.clock < 0.7 * one_by_one.clock
    for doc in (alone, spread):
        assert doc["capacityBound"]["gpuplane"] == "interpolated"
        assert doc["capacityAtWaitTarget"]["gpuplane"] == pytest.approx(CROSSING["gpuplane"], abs=0.05)
    assert len(fake_runs) == len(set(fake_runs))  # no load runs twice
    # What was stopped was above a load that missed: never a load whose result the bracket uses.
    assert side_by_side.cancelled
    lowest_miss = min(p["load"] for p in spread["autoSweep"]["gpuplane"] if p["waitP95Seconds"] > TARGET)
    assert all(load > lowest_miss for _, load in side_by_side.cancelled)


def test_spare_workers_give_the_gpus_to_match_search_more_clusters_at_once(
    monkeypatch: pytest.MonkeyPatch, fake_runs: list[tuple[str, float]]
) -> None:
    """The GPUs-to-match search on the same workers: with three, one configuration left to match
    runs up to three clusters at once, the search takes less time on the fake clock, and the
    answer is still within the tolerance of what the fake needs."""
    made: list[FakeWorkers] = []

    def workers(*args: Any, **kwargs: Any) -> FakeWorkers:
        made.append(FakeWorkers(*args, ran=fake_runs, **kwargs))
        return made[-1]

    monkeypatch.setattr(auto_sweep, "Workers", workers)
    clocks = {}
    for jobs in (1, 3):
        fake_runs.clear()
        sweep = run_auto_sweep(_sim, ("stock", "gpuplane"), wait_target=TARGET, jobs=jobs, grown=_grown)
        doc = sweep.document
        match = doc["gpusToMatch"]["stock"]
        need = 100 * doc["gpusToMatchLoad"] / CROSSING["stock"]
        assert match["bound"] == "interpolated"
        assert need - 1 <= match["gpus"] <= need + 0.05 * 100 + 1, match
        assert len({run["gpus"] for run in match["runs"]}) <= gpus_match.MAX_RUNS
        searched = {p["load"] for p in doc["autoSweep"]["stock"]}
        matched = [load for name, load in fake_runs if name == "stock" and load not in searched]
        assert len(matched) == len(set(matched)) >= len({run["gpus"] for run in match["runs"]})
        clocks[jobs] = made[-1].clock
        assert made[-1].most == jobs
    assert clocks[3] < 0.7 * clocks[1]


def test_the_costliest_configurations_step_up_goes_before_the_grids_cheaper_runs(
    monkeypatch: pytest.MonkeyPatch, fake_runs: list[tuple[str, float]]
) -> None:
    """gpuplane's runs cost most and each of its steps needs the one before, so once its highest
    grid load is in, its step up starts on the next free worker, ahead of the grid runs still to
    start; the grid still runs everywhere, and every capacity is found within the resolution."""

    def duration(name: str, load: float) -> float:
        return load * (10.0 if name == "gpuplane" else 3.0)

    monkeypatch.setattr(auto_sweep, "Workers", partial(FakeWorkers, ran=fake_runs, duration=duration))
    names = ("stock", "gpuplane", "kueue")
    doc = run_auto_sweep(_sim, names, wait_target=TARGET, jobs=2).document
    grid = [i for i, (_, load) in enumerate(fake_runs) if load in auto_sweep.START_LOADS]
    assert len(grid) == len(names) * len(auto_sweep.START_LOADS)
    first_step = next(i for i, (n, load) in enumerate(fake_runs) if n == "gpuplane" and load > 1.6)
    assert first_step < grid[-1]  # before the grid's last run started
    assert fake_runs.index(("gpuplane", 1.6)) < first_step  # and only once its own top load was in
    for name in names:
        assert doc["capacityAtWaitTarget"][name] == pytest.approx(CROSSING[name], abs=0.05)


class TimedWorkers(FakeWorkers):
    """The fake, recording when each run started and ended on its clock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.starts: dict[Hashable, float] = {}
        self.ends: dict[Hashable, float] = {}

    def start(self, key: Hashable, name: str, label: str, source: SimInput) -> None:
        self.starts[key] = self.clock
        super().start(key, name, label, source)

    def next_done(self) -> tuple[Hashable, RunResult] | None:
        done = super().next_done()
        if done is not None:
            self.ends[done[0]] = self.clock
        return done


def _gpuplane_slow(name: str, load: float) -> float:
    return load * (30.0 if name == "gpuplane" else 1.0)


def _timed(monkeypatch: pytest.MonkeyPatch, ran: list[tuple[str, float]]) -> list[TimedWorkers]:
    """Timed fakes in place of the workers, gpuplane's runs 30 times the others'."""
    made: list[TimedWorkers] = []

    def workers(*args: Any, **more: Any) -> TimedWorkers:
        made.append(TimedWorkers(*args, ran=ran, duration=_gpuplane_slow, **more))
        return made[-1]

    monkeypatch.setattr(auto_sweep, "Workers", workers)
    return made


def test_the_gpus_to_match_start_on_a_worker_the_search_leaves_idle(
    monkeypatch: pytest.MonkeyPatch, fake_runs: list[tuple[str, float]]
) -> None:
    """gpuplane's last runs are long; once no search has a run to start, the idle worker takes
    the GPUs to match at the load gpuplane met, before gpuplane's last run ends, and the answers
    are those of that load's demand."""
    made = _timed(monkeypatch, fake_runs)
    doc = run_auto_sweep(_sim, ("stock", "gpuplane"), wait_target=TARGET, jobs=2, grown=_grown).document
    workers = made[-1]
    matched = [k for k in workers.starts if isinstance(k, gpus_match.MatchKey)]
    searched = [k for k in workers.ends if not isinstance(k, gpus_match.MatchKey)]
    assert matched
    assert min(workers.starts[k] for k in matched) < max(workers.ends[k] for k in searched)
    demand = doc["gpusToMatchLoad"]
    match = doc["gpusToMatch"]["stock"]
    assert all(run["load"] == round(demand * doc["gpus"] / run["gpus"], 4) for run in match["runs"])
    need = 100 * demand / CROSSING["stock"]
    assert need - 1 <= match["gpus"] <= need + 0.05 * 100 + 1, match


@pytest.mark.parametrize(("crossing", "restarts"), [(2.9, False), (2.8, True)])
def test_the_gpus_to_match_bet_that_gpuplanes_last_run_meets_and_start_again_if_it_misses(
    monkeypatch: pytest.MonkeyPatch, fake_runs: list[tuple[str, float]], crossing: float, restarts: bool
) -> None:
    """The matching starts while gpuplane's last run is going, at that run's load, as if it met
    the target. Where it does (crossing 2.9 on this fake), that demand stands. Where it misses
    (2.8), the load moves back down to the highest one met: the runs at the first demand are
    stopped, and every answer is of the new demand."""
    monkeypatch.setitem(CROSSING, "gpuplane", crossing)
    made = _timed(monkeypatch, fake_runs)
    demands: list[float] = []
    made_matching = auto_sweep.match_gpus

    def recorded(*args: Any, **kwargs: Any) -> gpus_match.Matching:
        demands.append(args[2])
        return made_matching(*args, **kwargs)

    monkeypatch.setattr(auto_sweep, "match_gpus", recorded)
    doc = run_auto_sweep(_sim, ("stock", "gpuplane"), wait_target=TARGET, jobs=2, grown=_grown).document
    runs = doc["autoSweep"]["gpuplane"]
    assert demands[0] in {p["load"] for p in runs}  # a load gpuplane ran
    stopped = [k for k in made[-1].cancelled if isinstance(k, gpus_match.MatchKey)]
    if not restarts:
        assert demands == [doc["gpusToMatchLoad"]]
        assert not stopped
        return
    assert len(demands) == 2
    assert demands[0] > demands[1] == doc["gpusToMatchLoad"]
    assert next(p for p in runs if p["load"] == demands[0])["waitP95Seconds"] > TARGET
    assert stopped
    match = doc["gpusToMatch"]["stock"]
    assert all(run["load"] == round(demands[1] * doc["gpus"] / run["gpus"], 4) for run in match["runs"])
    need = 100 * demands[1] / CROSSING["stock"]
    assert need - 1 <= match["gpus"] <= need + 0.05 * 100 + 1, match


def test_the_gpus_to_match_search_whose_runs_took_longest_near_capacity_starts_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With one worker, the GPUs to match go one search after another: the search expected to
    take longest goes first (a run costs about its cluster's size times what a run near the
    configuration's capacity took on the installed one, as measured by the search). Here stock's
    runs take five times kueue's, so stock goes first, though the rough cost by kind (the core
    costs more than stock) would have started kueue."""

    def seconds(name: str, load: float) -> float:
        return load * (5.0 if name == "stock" else 1.0)

    def doc(name: str, load: float) -> dict[str, Any]:
        return {**_fake_doc(name, load), "wallSeconds": seconds(name, load)}

    ran: list[tuple[str, float]] = []
    made: list[TimedWorkers] = []

    def workers(*args: Any, **more: Any) -> TimedWorkers:
        made.append(TimedWorkers(*args, ran=ran, duration=seconds, doc=doc, **more))
        return made[-1]

    monkeypatch.setattr(auto_sweep, "Workers", workers)
    names = ("stock", "gpuplane", "kueue")
    result = run_auto_sweep(_sim, names, wait_target=TARGET, jobs=1, grown=_grown).document
    matched = sorted((t, k.name) for k, t in made[-1].starts.items() if isinstance(k, gpus_match.MatchKey))
    assert matched[0][1] == "stock"
    assert {name for _, name in matched} == {"stock", "kueue"}
    starts = {n: result["gpusToMatchLoad"] / CROSSING[n] for n in ("stock", "kueue")}
    assert starts["kueue"] * expected_cost("kueue") > starts["stock"] * expected_cost("stock")


def _doc_with_share(name: str, load: float) -> dict[str, Any]:
    """The fake run's summary with the share of its waits over the target, which crosses 5 %
    where its p95 wait crosses the target."""
    doc = _fake_doc(name, load)
    doc["waitOverTargetShare"] = OVER_SHARE * doc["waitP95Seconds"] / TARGET
    return doc


@pytest.mark.parametrize("jobs", [1, 2])
def test_loads_aimed_by_the_share_over_the_target_close_the_bracket_sooner(
    monkeypatch: pytest.MonkeyPatch, jobs: int
) -> None:
    """Where the runs tell the share of their waits over the target, the search aims at the load
    where it crosses 5 %: fewer runs, less time on the fake clock (a run takes its load), and the
    same capacity within the resolution as bisecting."""
    made: list[FakeWorkers] = []
    ran: dict[str, list[tuple[str, float]]] = {}
    docs: dict[str, dict[str, Any]] = {}
    for label, doc in (("bisected", _fake_doc), ("aimed", _doc_with_share)):
        ran[label] = []

        def workers(*args: Any, doc: Any = doc, label: str = label, **kwargs: Any) -> FakeWorkers:
            made.append(FakeWorkers(*args, doc=doc, ran=ran[label], **kwargs))
            return made[-1]

        monkeypatch.setattr(auto_sweep, "Workers", workers)
        docs[label] = run_auto_sweep(_sim, ("gpuplane", "kueue"), wait_target=TARGET, jobs=jobs).document
    bisected, aimed = made
    assert len(ran["aimed"]) < len(ran["bisected"])
    assert aimed.clock < bisected.clock
    for name in ("gpuplane", "kueue"):
        for doc in docs.values():
            assert doc["capacityAtWaitTarget"][name] == pytest.approx(CROSSING[name], abs=0.05)
    assert all(p["waitOverTargetShare"] is not None for p in docs["aimed"]["autoSweep"]["gpuplane"])
    assert all(p["waitOverTargetShare"] is None for p in docs["bisected"]["autoSweep"]["gpuplane"])


def test_aim_runs_two_points_around_where_the_share_over_the_target_crosses() -> None:
    """Between a met point (share 1 %) and a miss (8 %), the share taken as exponential crosses
    5 % at 1 + log 5 / log 8; the two points half a step either side of it come first, then
    nothing; where the crossing lies within a step of an end, only that end plus a step. A share
    that falls with ``x`` (a cluster's size) aims the same way."""
    kw: dict[str, Any] = {"step": 0.049, "close": 0.05, "recent": [True, False]}
    guess = 1.0 + math.log(5) / math.log(8)
    [first] = aim((1.0, 0.01), (2.0, 0.08), taken=[], **kw) or [None]
    [second] = aim((1.0, 0.01), (2.0, 0.08), taken=[first], **kw) or [None]
    assert (first, second) == (pytest.approx(guess - 0.0245), pytest.approx(guess + 0.0245))
    assert aim((1.0, 0.01), (2.0, 0.08), taken=[first, second], **kw) == []  # closed if so
    assert aim((1.0, 0.049), (2.0, 0.08), taken=[], **kw) == [pytest.approx(1.049)]
    assert aim((1.0, 0.049), (2.0, 0.08), taken=[1.049], **kw) == []  # no hedge below it
    assert aim((1.0, 0.0), (1.05, 0.06), taken=[], **kw) == []  # within the width: nothing
    assert aim((1.0, 0.0), (1.09, 0.06), taken=[], **kw) == [pytest.approx(1.045)]  # its middle
    falling = aim((2.0, 0.01), (1.0, 0.08), taken=[], **kw)
    assert falling == [pytest.approx(2.0 - math.log(5) / math.log(8) - 0.0245)]


@pytest.mark.parametrize(
    ("met", "missed", "recent"),
    [
        ((1.0, None), (2.0, 0.08), []),  # a run that did not tell its share
        ((1.0, 0.01), (2.0, 0.5), []),  # a miss far past the target
        ((1.0, 0.09), (2.0, 0.08), []),  # shares that disagree with the outcomes
        ((1.0, 0.01), (2.0, 0.08), [False, True, True]),  # the last two aimed runs both met
    ],
)
def test_aim_leaves_the_bracket_to_bisection_where_the_share_cannot_aim(
    met: tuple[float, float | None], missed: tuple[float, float | None], recent: list[bool]
) -> None:
    assert aim(met, missed, step=0.049, taken=[], close=0.05, recent=recent) is None
