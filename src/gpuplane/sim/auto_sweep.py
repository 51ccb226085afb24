"""``--sweep auto``: capacity at the wait target with no ceiling, each configuration bisected.

::

    1. every configuration at the starting loads (0.6, 1.0, 1.6): the sweep's grid
    2. up:   a configuration that has not missed the target yet runs at 1.5x its highest load
             (at most 1.1x the load where its GPUs would be fully allocated, by proportion),
             until it misses (or reaches MAX_LOAD: then its capacity is a bound)
       down: a configuration that missed at every load runs at half its lowest, until it meets it
    3. bisect each configuration between the highest load that met the target below the lowest that
       missed it, until the two are within RESOLUTION (0.05) of load; where both runs tell the
       share of their waits over the target, aim at the load where it crosses 5 % instead
       (:func:`~gpuplane.sim.sweep.aim`): two loads around it close the bracket in one round
    4. capacity: interpolated linearly between the two, a number (never a bound, unless step 2 ran
       out of room)
    5. GPUs to match (given ``grown``): each configuration on larger clusters at the demand of
       the load gpuplane met below its lowest miss (:mod:`gpuplane.sim.gpus_match`), simulated,
       not scaled; started on a worker the search leaves idle beside gpuplane's last runs

Steps 1-3 run on :class:`~gpuplane.sim.parallel.Workers` (``jobs`` worker processes), with no
rounds: whenever a worker is free, the next useful run starts. The configuration whose runs cost
most goes first: its next step starts before the grid's remaining runs
(:meth:`AutoSweep.lead_run`), since its chain of runs, each needing the one before, is the sweep's
wall time. A configuration may have several runs going where workers would otherwise idle
(:func:`~gpuplane.sim.parallel.points_per_search`): further steps up beyond a run still going, or
the middle of the widest gap left in its bracket between the runs going there. A run whose result
can no longer narrow its configuration's capacity (a step up beyond a load that missed) is
stopped. Every load draws the same workloads for every configuration (same seed, so the same
kinds of work), and only the configurations that need a load run at it. Beyond the grid a run
predicts no ETAs (``SimInput.eta``): the search reads only its waits, and the schedule is the
same. Given a :class:`~gpuplane.sim.experiment.ScenarioDraw`, those runs' inputs are drawn by
the worker that runs them; the grid's, which the document reads, here.

Which loads run depends on ``jobs`` and, with more than one, on which runs end first, so two
sweeps may find capacities that differ within the resolution; ``jobs`` 1 runs one load at a time
and finds the same every time. A configuration's p95 wait is taken to grow with load; where the
draws make it dip, the bracket is the lowest load that missed and the highest below it that met.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any, cast

from gpuplane.sim.experiment import (
    PEER_FEATURES,
    ExperimentResult,
    ScenarioDraw,
    SimInput,
    check_names,
    expected_cost,
    experiment_result,
    over_target_share,
    run_named,
)
from gpuplane.sim.gpus_match import GrownInput, Matching, MatchKey, match_gpus, unknown_matches
from gpuplane.sim.parallel import ProgressCallback, RunResult, Workers, points_per_search
from gpuplane.sim.sweep import (
    AT_LEAST,
    BELOW,
    DEFAULT_WAIT_TARGET,
    EXACT,
    Capacity,
    SweepResult,
    aim,
    capacity_at_wait_target,
)

START_LOADS = (0.6, 1.0, 1.6)
GROWTH = 1.5
ALLOCATION_MARGIN = 0.1  # how far past full allocation (by proportion) a step up may go
MAX_LOAD = 8.0
MIN_LOAD = 0.05
RESOLUTION = 0.05
AIM_STEP = 0.98  # of the resolution: two loads aimed around the crossing close the bracket (see aim)
GOAL = 2.0  # gpuplane's capacity over the strongest peer's that the sweep is held to


class AutoSweep:
    """One auto sweep in progress: the inputs drawn per load (``inputs``) and every run's summary
    by configuration and load (``done``)."""

    def __init__(
        self,
        sim_at: Callable[[float], SimInput | ScenarioDraw],
        names: tuple[str, ...],
        *,
        wait_target: float,
        jobs: int,
        resolution: float = RESOLUTION,
    ) -> None:
        if resolution <= 0:
            raise ValueError(f"resolution must be positive, got {resolution}")
        if wait_target < 0:
            raise ValueError(f"wait target must not be negative, got {wait_target}")
        self.sim_at = sim_at
        self.names = names
        self.target = wait_target
        self.jobs = jobs
        self.resolution = resolution
        # Per load, its input: drawn here on the grid (its runs make the document), elsewhere
        # as ``sim_at`` gives it (a ScenarioDraw is drawn by the worker that runs it).
        self.inputs: dict[float, SimInput | ScenarioDraw] = {}
        self.done: dict[str, dict[float, RunResult]] = {name: {} for name in names}
        self.aimed: dict[str, set[float]] = {name: set() for name in names}  # loads aimed (see aim)
        self.matching: Matching | None = None  # the GPUs to match, once started (see search)
        # When the search's last run ended, and when the matching (the last one made) began.
        self.searched = self.matched = time.perf_counter()

    def wait(self, name: str, load: float) -> float:
        value = self.done[name][load][1]["waitP95Seconds"]
        return 0.0 if value is None else float(value)

    def bracket(self, name: str) -> tuple[float | None, float | None]:
        """(highest load that met the target below the lowest that missed it, that lowest miss)."""
        runs = sorted(self.done[name])
        missed = [load for load in runs if self.wait(name, load) > self.target]
        high = missed[0] if missed else None
        met = [
            load for load in runs if self.wait(name, load) <= self.target and (high is None or load < high)
        ]
        return (met[-1] if met else None), high

    def step_up(self, name: str) -> float:
        """The next load above ``name``'s highest: 1.5x it, but no further than where its GPUs would
        be fully allocated if allocation grew in proportion to load (its highest load over its
        allocated share there, plus :data:`ALLOCATION_MARGIN`), so that the first miss is not far
        above capacity, where a run costs most (the backlog grows for the whole run). Never less
        than two resolution steps up; a load that still meets the target is stepped up again."""
        highest = max(self.done[name])
        step = highest * GROWTH
        share = self.done[name][highest][1].get("gpuAllocatedShare")
        if share:
            step = min(step, highest / float(share) * (1 + ALLOCATION_MARGIN))
        return max(step, highest + 2 * self.resolution)

    def search(self, workers: Workers, grown: GrownInput | None = None) -> None:
        """Steps 1-3 of the module docstring, and step 5 given ``grown``, on :class:`Workers`:
        whenever a worker is free, the next run that can narrow some configuration's capacity
        starts (:meth:`next_run`), and a started run that no longer can is stopped
        (:meth:`useless`). No worker waits for a round's longest run; with ``jobs`` 1 the runs go
        one at a time, the same every time. Once no search has a run to start and only
        gpuplane's runs are going, a free worker takes the GPUs to match (``matching``) at the
        load gpuplane met (:meth:`match_load`); a going run of gpuplane that meets the target
        moves that load, and the matching starts again there."""
        grid = sorted(
            ((n, load) for load in START_LOADS for n in self.names), key=lambda p: -p[1] * expected_cost(p[0])
        )
        while True:
            while workers.free():
                going = self._flying(workers)
                pair = self.lead_run(going) if grid else None
                if pair is None:
                    pair = grid.pop(0) if grid else self.next_run(going)
                if pair is not None:
                    self._start(workers, pair)
                    continue
                if grown is None or grid or not self._start_matching(workers, grown, going):
                    break
            finished = workers.next_done()
            if finished is None:
                break
            key, result = finished
            if isinstance(key, MatchKey):
                assert self.matching is not None
                self.matching.finished(key, result[1])
                continue
            name, load = cast(tuple[str, float], key)
            self.done[name][load] = result
            self.searched = time.perf_counter()
            for flying in self._flying(workers):
                if self.useless(*flying):
                    workers.cancel(flying)
            going = self._flying(workers)
            if self.matching is not None and self.matching.demand != self.match_load(going):
                self.matching.cancel()
                self.matching = None

    def match_load(self, going: Sequence[tuple[str, float]] = ()) -> float | None:
        """The load whose demand the GPUs to match are sought at: the highest load at which
        gpuplane met the target below its lowest miss, once both are known (so its capacity is a
        number, within the resolution above this load); while a run of gpuplane is ``going``
        inside that bracket, the highest such run's load, as if it met. A search that goes on
        only while gpuplane's last runs go beside it must bet on their outcome: a run aimed
        just below the lowest miss (:func:`~gpuplane.sim.sweep.aim`) is expected to meet, and
        a run of a bisection is as likely to meet as not. If it misses, the demand moves back
        down, and the GPUs to match start again there."""
        if "gpuplane" not in self.names:
            return None
        low, high = self.bracket("gpuplane")
        if high is None or low is None:
            return None
        inside = [load for name, load in going if name == "gpuplane" and low < load < high]
        return max(inside, default=low)

    def _start_matching(self, workers: Workers, grown: GrownInput, going: list[tuple[str, float]]) -> bool:
        """Start a GPUs-to-match run, the matching first made if it may start now; False if not."""
        if self.matching is None:
            load = self.match_load(going)
            if load is None or any(n != "gpuplane" for n, _ in going):
                return False
            if any(self.candidate(n, [load for g, load in going if g == n]) is not None for n in self.names):
                return False
            capacity = {n: self.capacity(n) for n in self.names}
            installed = next(iter(self.inputs.values())).cluster.gpus
            seconds = {n: self.run_seconds(n) for n in self.names}
            self.matching = match_gpus(
                grown,
                capacity,
                load,
                installed=installed,
                wait_target=self.target,
                workers=workers,
                run_seconds=seconds,
            )
            self.matched = time.perf_counter()
        return self.matching.start_next()

    def run_seconds(self, name: str) -> float:
        """What a run of ``name`` took at the highest load that met the target below its lowest
        miss (or its lowest load, if none met): a run to the end near its capacity, as the GPUs
        to match run it (at about that load, on a larger cluster)."""
        low, _ = self.bracket(name)
        load = low if low is not None else min(self.done[name])
        return float(self.done[name][load][1].get("wallSeconds") or 0.0)

    def _flying(self, workers: Workers) -> list[tuple[str, float]]:
        """The search's runs going (not the GPUs to match)."""
        return [cast(tuple[str, float], key) for key in workers.running() if not isinstance(key, MatchKey)]

    def _start(self, workers: Workers, pair: tuple[str, float]) -> None:
        name, load = pair
        if load not in self.inputs:
            sim = self.sim_at(load)
            if load in START_LOADS:
                self.inputs[load] = sim.draw() if isinstance(sim, ScenarioDraw) else sim
            else:
                # Beyond the grid only the waits are read: no ETA predictions (same schedule, cheaper).
                self.inputs[load] = replace(sim, eta=False)
        workers.start(pair, name, f"{name} @ {load:g}", self.inputs[load])

    def lead_run(self, flying: Sequence[tuple[str, float]]) -> tuple[str, float] | None:
        """The next run of the configuration whose runs cost most, while the grid still has runs to
        start: that configuration's chain of runs, each needing the one before, is the sweep's
        wall time, so its next step goes before the grid's cheaper runs instead of after them.
        Only with none of its runs going, and only a step up, or a step its grid loads are all in
        for (a step down or a bisection before them could be one they answer)."""
        lead = max(self.names, key=self._cost)
        if not self.done[lead] or any(n == lead for n, _ in flying):
            return None
        if self.bracket(lead)[1] is not None and not all(load in self.done[lead] for load in START_LOADS):
            return None
        want = self.candidate(lead, [])
        if want is None:
            return None
        load = round(want, 4)
        return None if load in self.done[lead] else (lead, load)

    def _cost(self, name: str) -> float:
        """How much ``name``'s runs cost, to serve the costliest first: its highest load run so far
        by its expected cost."""
        return max(self.done[name], default=0.0) * expected_cost(name)

    def next_run(self, flying: Sequence[tuple[str, float]]) -> tuple[str, float] | None:
        """The next (configuration, load) to start beside the runs ``flying``, or None. Each
        configuration still searching may have :func:`points_per_search` runs going at once, and
        the one whose runs cost most (the highest load run, by its expected cost) goes first:
        its runs are the sweep's wall time."""
        going: dict[str, list[float]] = {n: [] for n in self.names}
        for n, load in flying:
            going[n].append(load)
        wanted = {n: self.candidate(n, going[n]) for n in self.names}
        searching = sum(1 for n in self.names if wanted[n] is not None or going[n])
        k = points_per_search(self.jobs, searching)
        order = sorted(self.names, key=lambda n: -self._cost(n))
        for n in order:
            want = wanted[n]
            if want is None or len(going[n]) >= k:
                continue
            load = round(want, 4)
            if load not in self.done[n] and load not in going[n]:
                return n, load
        return None

    def candidate(self, name: str, going: Sequence[float]) -> float | None:
        """The load ``name`` would run next beside its runs ``going``, or None: up (no miss yet)
        by :meth:`step_up`, and beyond a run still going by the same ratio; down (no load met
        yet) to half the lowest; inside the bracket, while a gap between its ends and the loads
        going inside it is wider than the resolution: a load aimed where the share of waits over
        the target crosses (:func:`~gpuplane.sim.sweep.aim`: around the crossing, so that two
        loads side by side can close the bracket), or where that share cannot aim, the middle of
        the widest gap (of two gaps as wide, the higher)."""
        done = self.done[name]
        if not done:
            return None
        low, high = self.bracket(name)
        if high is None:
            top = max([*done, *going])
            if top >= MAX_LOAD:
                return None
            highest = max(done)
            first = min(MAX_LOAD, self.step_up(name))
            if top == highest:
                return first
            return min(MAX_LOAD, max(top * first / highest, top + 2 * self.resolution))
        if low is None:
            bottom = min([*done, *going])
            return None if bottom <= MIN_LOAD else max(MIN_LOAD, bottom / 2)
        return self._inside(name, low, high, going)

    def _inside(self, name: str, low: float, high: float, going: Sequence[float]) -> float | None:
        """The load to run inside the bracket ``(low, high)`` beside the loads ``going`` (see
        :meth:`candidate`), or None once every gap is within the resolution."""
        done = self.done[name]
        points = sorted({low, high, *(load for load in going if low < load < high)})
        width, a, b = max((round(b - a, 9), a, b) for a, b in itertools.pairwise(points))
        if width <= self.resolution:
            return None
        aimed = aim(
            (low, self.over_share(name, low)),
            (high, self.over_share(name, high)),
            step=AIM_STEP * self.resolution,
            taken=[*done, *going],
            close=self.resolution,
            recent=[self.wait(name, load) <= self.target for load in done if load in self.aimed[name]],
        )
        if aimed is None:
            return (a + b) / 2
        for load in aimed:
            self.aimed[name].add(round(load, 4))  # the load it runs at (see next_run)
        return aimed[0] if aimed else None

    def over_share(self, name: str, load: float) -> float | None:
        """The share of ``name``'s waits over the target at ``load`` (projected where the run was
        cut), or None where its run did not say."""
        return over_target_share(self.done[name][load][1])

    def useless(self, name: str, load: float) -> bool:
        """Whether a run of ``name`` at ``load`` can no longer narrow its capacity: above the
        lowest miss, below the highest met load under it, or the bracket is already narrow
        enough. The grid's loads always run to the end (every configuration runs there)."""
        if load in START_LOADS:
            return False
        low, high = self.bracket(name)
        if high is not None and load > high:
            return True
        if low is not None and load < low:
            return True
        return low is not None and high is not None and high - low <= self.resolution

    def grid_result(self, load: float) -> ExperimentResult:
        """Every configuration's run at one of the grid's loads, as one experiment."""
        results = [self.done[n][load] for n in self.names]
        sim = self.inputs[load]
        assert isinstance(sim, SimInput)  # drawn here (see _start)
        return experiment_result(sim, self.names, results, sum(d["wallSeconds"] for _, d in results))

    def capacity(self, name: str) -> Capacity:
        low, high = self.bracket(name)
        if high is None:
            return Capacity(max(self.done[name]), AT_LEAST)
        if low is None:
            return Capacity(None, BELOW)
        return capacity_at_wait_target(
            [(low, self.wait(name, low)), (high, self.wait(name, high))], self.target
        )


def run_auto_sweep(  # noqa: PLR0913 - keyword-only: wait target, progress, jobs, resolution
    sim_at: Callable[[float], SimInput | ScenarioDraw],
    names: tuple[str, ...],
    *,
    wait_target: float = DEFAULT_WAIT_TARGET,
    progress: ProgressCallback | None = None,
    jobs: int = 1,
    resolution: float = RESOLUTION,
    grown: GrownInput | None = None,
) -> SweepResult:
    """The auto sweep of the module docstring; its document has the grid sweep's fields (``sweep``
    holds the starting loads, where every configuration ran) plus each configuration's runs
    (``autoSweep``), its capacity ratio to gpuplane's and, given ``grown`` (the input of a cluster
    grown ``m`` times at the demand of a load on the installed one), ``gpusToMatch``."""
    check_names(names)
    started = time.perf_counter()
    unique = tuple(dict.fromkeys(names))
    sweep = AutoSweep(sim_at, unique, wait_target=wait_target, jobs=jobs, resolution=resolution)
    # One set of workers for both searches: the capacities, then the GPUs to match.
    runner = partial(run_named, cut_above=wait_target)  # a run stops once it surely misses
    with Workers(runner, jobs, progress) as workers:
        document = _auto_sweep_document(sweep, workers, grown, started)
    grid = [load for load in START_LOADS if all(load in sweep.done[n] for n in unique)]
    return SweepResult(grid, [sweep.grid_result(load) for load in grid], document)


def _auto_sweep_document(
    sweep: AutoSweep, workers: Workers, grown: GrownInput | None, started: float
) -> dict[str, Any]:
    unique, wait_target = sweep.names, sweep.target
    sweep.search(workers, grown)
    grid = [load for load in START_LOADS if all(load in sweep.done[n] for n in unique)]
    runs = [sweep.grid_result(load) for load in grid]
    capacity = {n: sweep.capacity(n) for n in unique}
    first = sweep.inputs[grid[0]] if grid else next(iter(sweep.inputs.values()))
    document: dict[str, Any] = {
        "scenario": first.name,
        "seed": first.seed,
        "days": first.days,
        "gpus": first.cluster.gpus,
        "waitTargetSeconds": wait_target,
        "resolution": sweep.resolution,
        "sweep": [
            {
                "load": load,
                "workloads": run.document["workloads"],
                "configurations": run.document["configurations"],
            }
            for load, run in zip(grid, runs, strict=True)
        ],
        "autoSweep": {
            n: [
                {
                    "load": load,
                    "waitP95Seconds": doc["waitP95Seconds"],
                    "gpuBusyOfCapacity": doc.get("gpuBusyOfCapacity"),
                    "wallSeconds": doc.get("wallSeconds"),
                    "waitOverTargetShare": doc.get("waitOverTargetShare"),
                    **({"cut": doc["cut"]} if "cut" in doc else {}),
                }
                for load, (_, doc) in sorted(sweep.done[n].items())
            ]
            for n in unique
        },
        "capacityAtWaitTarget": {n: _round(c.load) for n, c in capacity.items()},
        "capacityBound": {n: c.bound for n, c in capacity.items()},
    }
    reference = capacity.get("gpuplane")
    if reference is not None and reference.load:
        document["capacityRatioToGpuplane"] = {
            n: None if c.load is None else round(c.load / reference.load, 3) for n, c in capacity.items()
        }
    exact = {n: c for n, c in capacity.items() if c.bound == EXACT and n != "gpuplane" and c.load is not None}
    peers = {n: c for n, c in exact.items() if not n.startswith("gpuplane")}
    if peers:
        strongest = max(peers, key=lambda n: peers[n].load or 0.0)
        document["strongestPeer"] = strongest
    if reference is not None and reference.load:
        document["peerGaps"] = peer_gaps(capacity, reference.load)
    ended = time.perf_counter()
    document["phases"] = {"search": {"wallSeconds": round(sweep.searched - started, 3)}}
    if grown is not None and "gpuplane" in capacity:
        if sweep.matching is None:
            document["gpusToMatch"] = unknown_matches(capacity)
        else:
            document["gpusToMatchLoad"] = sweep.matching.demand
            document["gpusToMatch"] = sweep.matching.answers()
            document["phases"]["gpusToMatch"] = {"wallSeconds": round(ended - sweep.matched, 3)}
    document["wallSeconds"] = round(ended - started, 3)
    return document


def peer_gaps(capacity: dict[str, Capacity], gpuplane: float) -> dict[str, dict[str, Any]]:
    """Per peer whose capacity and whose base configuration's are both numbers: the feature it
    adds to its base (:data:`PEER_FEATURES`), the capacity that feature adds, and gpuplane's
    capacity over the peer's against the :data:`GOAL` multiple."""
    out: dict[str, dict[str, Any]] = {}
    for name, (base, feature) in PEER_FEATURES.items():
        own, under = capacity.get(name), capacity.get(base)
        if own is None or under is None or own.bound != EXACT or under.bound != EXACT:
            continue
        if own.load is None or under.load is None:
            continue
        out[name] = {
            "base": base,
            "feature": feature,
            "capacityAdded": round(own.load - under.load, 3),
            "gpuplaneMultiple": round(gpuplane / own.load, 3),
            "meetsGoal": gpuplane >= GOAL * own.load,
        }
    return out


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)
