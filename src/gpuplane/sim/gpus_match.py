"""GPUs to match, simulated: how many GPUs each configuration needs to serve what gpuplane serves.

The grid sweep estimates this by scaling capacity fractions (:mod:`gpuplane.sim.sweep`). The auto
sweep simulates it instead, on larger clusters of the same shape::

    demand   D = Lg x G            a load gpuplane met the target at on the installed G GPUs (the
                                   auto sweep's: the highest below its lowest miss, within the
                                   resolution below its bisected capacity)
    cluster  every pool's node count x m, rounded up   -> G'(m) GPUs
    load     D / G'(m)             the same absolute demand: the same arrival rates, so the same
                                   kinds of work drawn with the same seed
    search   m0 = Lg / Cc (the scaling estimate); missed -> x GROWTH until one meets the target;
             then bisect m between the largest miss and the smallest meet until the two clusters
             differ by at most TOLERANCE of G in GPUs, or MAX_RUNS runs were made
    answer   G'(m) of the smallest cluster that met the target

A configuration whose capacity is at least ``Lg`` needs no more GPUs than installed (no run).
One that never met the target within ``MAX_RUNS`` gets its largest miss as a lower bound
(``atLeast``). A multiplier that rounds to a cluster already run reuses that run. The runs go on
the auto sweep's workers with no rounds (:class:`~gpuplane.sim.parallel.Workers`): whenever one is
free, the next useful run starts (of the search expected to take longest: its start times what a
run of the configuration took near its capacity on the installed cluster), several for one
configuration where workers would otherwise idle
(:func:`~gpuplane.sim.parallel.points_per_search`: further steps up, or the middle of the widest
gap left in the bracket), and a run that can no longer change its configuration's answer (a
larger cluster than one that met) is stopped. The search costs at most ``MAX_RUNS`` runs per
configuration, each at gpuplane's demand on a larger cluster. The auto sweep drives the runs
(:meth:`Matching.start_next`, :meth:`Matching.finished`) beside its own last ones, and stops them
all (:meth:`Matching.cancel`) if the load gpuplane met moves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuplane.sim.experiment import ScenarioDraw, SimInput, expected_cost, over_target_share
from gpuplane.sim.parallel import Workers, points_per_search
from gpuplane.sim.scenario import Scenario
from gpuplane.sim.sweep import AT_LEAST, EXACT, Capacity

GROWTH = 1.25
TOLERANCE = 0.05  # of the installed GPUs
MAX_RUNS = 5
METHOD = "simulated with more nodes at gpuplane's capacity demand"

GrownInput = Callable[[float, float], SimInput | ScenarioDraw]
Run = tuple[float, int, float, float, float]  # (multiplier, GPUs, load, p95 wait, wall seconds)


def grow(scenario: Scenario, multiplier: float) -> Scenario:
    """``scenario`` with every pool's node count times ``multiplier``, rounded up."""
    if not multiplier >= 1.0 or math.isinf(multiplier):
        raise ValueError(f"node multiplier must be at least 1, got {multiplier}")
    pools = tuple(replace(p, nodes=math.ceil(p.nodes * multiplier - 1e-9)) for p in scenario.pools)
    return replace(scenario, pools=pools)


def at_demand(scenario: Scenario, load: float, multiplier: float) -> Scenario:
    """The grown scenario offered the absolute demand of ``load`` on the original cluster."""
    grown = grow(scenario, multiplier)
    return grown.with_load(load * scenario.gpus / grown.gpus)


@dataclass(slots=True)
class _Search:
    """One configuration's search: the multiplier runs made so far, as (m, GPUs, load, p95 wait,
    the run's wall seconds: 0 where a multiplier reused a cluster already run)."""

    name: str
    start: float
    runs: list[Run] = field(default_factory=list)
    shares: dict[float, float | None] = field(default_factory=dict)  # per m: waits over the target

    def met(self, target: float) -> list[Run]:
        return sorted((r for r in self.runs if r[3] <= target), key=lambda r: (r[1], r[0]))

    def missed(self, target: float) -> list[Run]:
        return sorted((r for r in self.runs if r[3] > target), key=lambda r: (r[1], r[0]))

    def closed(self, target: float, installed: int) -> bool:
        """Whether the smallest cluster that met and the largest miss below it are close enough
        (or no cluster lies between them: node counts round up)."""
        met = self.met(target)
        if not met:
            return False
        low_m, low_gpus = self._below(met[0], installed, target)
        return met[0][1] - low_gpus <= max(1, TOLERANCE * installed) or met[0][0] - low_m < 1e-3

    def _below(
        self, met: tuple[float, int, float, float, float], installed: int, target: float
    ) -> tuple[float, int]:
        """The largest miss below the cluster ``met`` as (m, GPUs); the installed cluster if none."""
        low = max((r for r in self.missed(target) if r[1] < met[1]), key=lambda r: (r[1], r[0]), default=None)
        return (1.0, installed) if low is None else (low[0], low[1])

    def candidate(self, target: float, installed: int, going: Sequence[float]) -> float | None:
        """The multiplier to run next beside the multipliers ``going``, or None: the scaling
        estimate; while nothing met, a :data:`GROWTH` step up from the largest miss or multiplier
        going (a peer that pools its demand on a larger cluster may need less than the estimate,
        but on the built-in week the peers needed more); then the middle of the widest gap left
        between the largest miss below the smallest meet, that meet and the multipliers going
        between them, while that gap spans more than the tolerance. (It does not aim as the
        capacity search does, :func:`~gpuplane.sim.sweep.aim`: near the target the p95 wait
        swings between neighbouring cluster sizes more than a step of the tolerance, and on
        the built-in week aimed clusters landed on one side and left wider brackets.)"""
        if len({r[1] for r in self.runs}) + len(going) >= MAX_RUNS or len(self.runs) >= 4 * MAX_RUNS:
            return None
        met, missed = self.met(target), self.missed(target)
        if not met:
            tops = [r[0] for r in missed] + list(going)
            return max(tops) * GROWTH if tops else self.start
        if self.closed(target, installed):
            return None
        low_m, _ = self._below(met[0], installed, target)
        points = sorted({low_m, met[0][0], *(m for m in going if low_m < m < met[0][0])})
        width, a, b = max((round(b - a, 9), a, b) for a, b in itertools.pairwise(points))
        if width < 1e-3 or width * installed <= max(1, TOLERANCE * installed):
            return None
        return (a + b) / 2

    def useless(self, target: float, installed: int, m: float) -> bool:
        """Whether a run at ``m`` can no longer change the answer: above the smallest cluster that
        met, below the largest miss under it, or the search is closed."""
        met = self.met(target)
        if not met:
            return False
        low_m, _ = self._below(met[0], installed, target)
        return m > met[0][0] or m < low_m or self.closed(target, installed)

    def answer(self, target: float) -> dict[str, Any]:
        """The smallest cluster that met the target, or the largest miss as a lower bound."""
        runs = [
            {
                "nodeMultiplier": m,
                "gpus": g,
                "load": load,
                "waitP95Seconds": w,
                "waitOverTargetShare": self.shares.get(m),
                "wallSeconds": wall,
            }
            for m, g, load, w, wall in sorted(self.runs)
        ]
        met = self.met(target)
        if met:
            return {"gpus": met[0][1], "bound": EXACT, "method": METHOD, "runs": runs}
        return {"gpus": self.missed(target)[-1][1], "bound": AT_LEAST, "method": METHOD, "runs": runs}


def unknown_matches(capacity: dict[str, Capacity]) -> dict[str, dict[str, Any]]:
    """What each configuration other than gpuplane needs where gpuplane's capacity is no number."""
    return {n: {"gpus": None, "bound": "unknown", "method": METHOD} for n in capacity if n != "gpuplane"}


@dataclass(frozen=True, slots=True)
class MatchKey:
    """A GPUs-to-match run on the workers: configuration ``name`` on a cluster grown ``m`` times."""

    name: str
    m: float


def match_gpus(  # noqa: PLR0913 - keyword-only: the installed GPUs, the target, the workers
    grown: GrownInput,
    capacity: dict[str, Capacity],
    demand: float,
    *,
    installed: int,
    wait_target: float,
    workers: Workers,
    run_seconds: dict[str, float] | None = None,
) -> Matching:
    """The search for each configuration other than gpuplane: the GPUs it needs to serve the
    absolute demand of ``demand`` (a load gpuplane met on the ``installed`` GPUs).

    ``grown(load, m)`` gives the input of the cluster grown ``m`` times at the absolute demand of
    ``load`` on the installed one (:func:`at_demand`), drawn or as a :class:`ScenarioDraw` (drawn
    by the worker that runs it). The runs go on ``workers`` (whose runner
    stops a run once sure to miss), started by the caller that shares them
    (:meth:`Matching.start_next`, :meth:`Matching.finished`). ``run_seconds``: what one run of
    each configuration took on the installed cluster near its capacity, where measured (the
    searches whose runs take longest start first; without it, :func:`expected_cost`).
    """
    fixed: dict[str, dict[str, Any]] = {}
    searches: dict[str, _Search] = {}
    for name, own in capacity.items():
        if name == "gpuplane":
            continue
        if own.load is not None and own.load >= demand:
            fixed[name] = {"gpus": installed, "bound": EXACT, "method": METHOD, "runs": []}
            continue
        start = demand / own.load if own.load else demand / 0.05
        searches[name] = _Search(name, max(1.0, start))
    order = [n for n in capacity if n in fixed or n in searches]
    measured = run_seconds or {}
    use = all(measured.get(n, 0.0) > 0 for n in searches)
    costs = {n: measured[n] if use else expected_cost(n) for n in searches}
    return Matching(searches, grown, demand, installed, wait_target, workers, fixed, order, costs)


@dataclass(slots=True)
class Matching:
    """The searches of :func:`match_gpus` on the workers: the inputs drawn per multiplier, the
    clusters (GPUs) of the runs going (``going``), and the answers that needed no run (``fixed``)."""

    searches: dict[str, _Search]
    grown: GrownInput
    demand: float
    installed: int
    target: float
    workers: Workers
    fixed: dict[str, dict[str, Any]]
    order: list[str]
    costs: dict[str, float]  # per search, a run's relative cost on the installed cluster
    inputs: dict[float, SimInput | ScenarioDraw] = field(default_factory=dict)
    going: dict[MatchKey, int] = field(default_factory=dict)

    def finished(self, key: MatchKey, doc: dict[str, Any]) -> None:
        """Record the run ``key``, and stop the runs that can no longer change an answer."""
        gpus = self.going.pop(key)
        wait = float(doc["waitP95Seconds"] or 0.0)
        wall = float(doc.get("wallSeconds") or 0.0)
        load = round(self.demand * self.installed / gpus, 4)
        search = self.searches[key.name]
        search.runs.append((key.m, gpus, load, wait, wall))
        search.shares[key.m] = over_target_share(doc)
        for other in list(self.going):
            if self.searches[other.name].useless(self.target, self.installed, other.m):
                self.workers.cancel(other)
                del self.going[other]

    def cancel(self) -> None:
        """Stop every run going (the demand moved: their answers would be for another)."""
        for key in self.going:
            self.workers.cancel(key)
        self.going.clear()

    def answers(self) -> dict[str, dict[str, Any]]:
        """Per configuration other than gpuplane, in the capacity's order: its GPUs to match."""
        out = dict(self.fixed)
        for name, search in self.searches.items():
            out[name] = search.answer(self.target)
        return {n: out[n] for n in self.order}

    def start_next(self) -> bool:
        """Start one run (or reuse one: a multiplier that rounds to a cluster already run); False
        when no search has a run to start now."""
        going: dict[str, list[float]] = {n: [] for n in self.searches}
        for key in self.going:
            going[key.name].append(key.m)
        wanted = {n: s.candidate(self.target, self.installed, going[n]) for n, s in self.searches.items()}
        searching = sum(1 for n in self.searches if wanted[n] is not None or going[n])
        k = points_per_search(self.workers.jobs, searching)
        # The longest search first: its runs, each on a cluster about ``start`` times installed,
        # cost about that many times a run on the installed one.
        order = sorted(self.searches, key=lambda n: -self.searches[n].start * self.costs[n])
        for name in order:
            want = wanted[name]
            if want is None or len(going[name]) >= k:
                continue
            m = round(want, 4)
            if m not in self.inputs:
                self.inputs[m] = replace(self.grown(self.demand, m), eta=False)  # only its waits are read
            gpus = self.inputs[m].cluster.gpus
            search = self.searches[name]
            same = next((r for r in search.runs if r[1] == gpus), None)
            if same is not None:
                search.runs.append((m, *same[1:4], 0.0))
                search.shares[m] = search.shares.get(same[0])
                return True
            if any(key.name == name and g == gpus for key, g in self.going.items()):
                continue  # that cluster is running already
            key = MatchKey(name, m)
            self.workers.start(key, name, f"{name} x{m:g} nodes", self.inputs[m])
            self.going[key] = gpus
            return True
        return False
