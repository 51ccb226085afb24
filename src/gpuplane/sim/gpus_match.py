"""GPUs to match, simulated: how many GPUs each configuration needs to serve gpuplane's capacity.

The grid sweep estimates this by scaling capacity fractions (:mod:`gpuplane.sim.sweep`). The auto
sweep simulates it instead, on larger clusters of the same shape::

    demand   D = Cg x G            gpuplane's capacity (a bisected number) on the installed G GPUs
    cluster  every pool's node count x m, rounded up   -> G'(m) GPUs
    load     D / G'(m)             the same absolute demand: the same arrival rates, so the same
                                   kinds of work drawn with the same seed
    search   m0 = Cg / Cc (the scaling estimate); missed -> x GROWTH until one meets the target;
             then bisect m between the largest miss and the smallest meet until the two clusters
             differ by at most TOLERANCE of G in GPUs, or MAX_RUNS runs were made
    answer   G'(m) of the smallest cluster that met the target

A configuration whose capacity is at least gpuplane's needs no more GPUs than installed (no run).
One that never met the target within ``MAX_RUNS`` gets its largest miss as a lower bound
(``atLeast``). A multiplier that rounds to a cluster already run reuses that run. Each round's
runs go side by side, one per configuration still searching, or more where workers would idle
(:func:`~gpuplane.sim.parallel.points_per_search`: further steps up, or points that split the
bracket in equal parts), so the search costs at most ``MAX_RUNS`` runs per configuration, each at
gpuplane's demand on a larger cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from gpuplane.sim.experiment import SimInput, expected_cost, run_named
from gpuplane.sim.parallel import ProgressCallback, Task, points_per_search, run_tasks
from gpuplane.sim.scenario import Scenario
from gpuplane.sim.sweep import AT_LEAST, EXACT, Capacity

GROWTH = 1.25
TOLERANCE = 0.05  # of the installed GPUs
MAX_RUNS = 5
METHOD = "simulated with more nodes at gpuplane's capacity demand"

GrownInput = Callable[[float, float], SimInput]


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
    runs: list[tuple[float, int, float, float, float]] = field(default_factory=list)

    def met(self, target: float) -> list[tuple[float, int, float, float, float]]:
        return sorted((r for r in self.runs if r[3] <= target), key=lambda r: (r[1], r[0]))

    def missed(self, target: float) -> list[tuple[float, int, float, float, float]]:
        return sorted((r for r in self.runs if r[3] > target), key=lambda r: (r[1], r[0]))

    def next_multipliers(self, target: float, installed: int, k: int = 1) -> list[float]:
        """The next ``k`` multipliers to run side by side (fewer near the end; none once done):
        the scaling estimate and, with ``k`` > 1, further steps up by :data:`GROWTH` (a peer
        that pools its demand on a larger cluster may need less than the estimate, but on the
        built-in week the peers needed more); while nothing met, ``k`` steps up from the largest
        miss; then ``k`` points that split the bracket between the largest miss below the
        smallest meet and that meet in equal parts."""
        distinct = len({r[1] for r in self.runs})
        if distinct >= MAX_RUNS or len(self.runs) >= 4 * MAX_RUNS:
            return []
        k = max(1, min(k, MAX_RUNS - distinct))
        if not self.runs:
            return [self.start * GROWTH**i for i in range(k)]
        met, missed = self.met(target), self.missed(target)
        if not met:
            return [missed[-1][0] * GROWTH**i for i in range(1, k + 1)]
        low = max((r for r in missed if r[1] < met[0][1]), key=lambda r: (r[1], r[0]), default=None)
        low_m, low_gpus = (1.0, installed) if low is None else (low[0], low[1])
        if met[0][1] - low_gpus <= max(1, TOLERANCE * installed) or met[0][0] - low_m < 1e-3:
            return []  # close enough, or no cluster between the two (node counts round up)
        return [low_m + (met[0][0] - low_m) * i / (k + 1) for i in range(1, k + 1)]

    def answer(self, target: float) -> dict[str, Any]:
        """The smallest cluster that met the target, or the largest miss as a lower bound."""
        runs = [
            {"nodeMultiplier": m, "gpus": g, "load": load, "waitP95Seconds": w, "wallSeconds": wall}
            for m, g, load, w, wall in sorted(self.runs)
        ]
        met = self.met(target)
        if met:
            return {"gpus": met[0][1], "bound": EXACT, "method": METHOD, "runs": runs}
        return {"gpus": self.missed(target)[-1][1], "bound": AT_LEAST, "method": METHOD, "runs": runs}


def match_gpus(  # noqa: PLR0913 - keyword-only settings
    grown: GrownInput,
    capacity: dict[str, Capacity],
    *,
    installed: int,
    wait_target: float,
    jobs: int,
    progress: ProgressCallback | None = None,
) -> dict[str, dict[str, Any]]:
    """Per configuration other than gpuplane: the GPUs it needs to serve gpuplane's capacity.

    ``grown(load, m)`` draws the input of the cluster grown ``m`` times at the absolute demand of
    ``load`` on the installed one (:func:`at_demand`).
    """
    reference = capacity.get("gpuplane")
    out: dict[str, dict[str, Any]] = {}
    if reference is None or reference.load is None or reference.bound != EXACT:
        return {n: {"gpus": None, "bound": "unknown", "method": METHOD} for n in capacity if n != "gpuplane"}
    demand = reference.load
    searches: dict[str, _Search] = {}
    for name, own in capacity.items():
        if name == "gpuplane":
            continue
        if own.load is not None and own.load >= demand:
            out[name] = {"gpus": installed, "bound": EXACT, "method": METHOD, "runs": []}
            continue
        start = demand / own.load if own.load else demand / 0.05
        searches[name] = _Search(name, max(1.0, start))
    inputs: dict[float, SimInput] = {}
    while _round(
        searches,
        grown,
        inputs,
        demand=demand,
        installed=installed,
        wait_target=wait_target,
        jobs=jobs,
        progress=progress,
    ):
        pass
    for name, search in searches.items():
        out[name] = search.answer(wait_target)
    return {n: out[n] for n in capacity if n in out}


def _round(  # noqa: PLR0913 - the search's state and settings
    searches: dict[str, _Search],
    grown: GrownInput,
    inputs: dict[float, SimInput],
    *,
    demand: float,
    installed: int,
    wait_target: float,
    jobs: int,
    progress: ProgressCallback | None,
) -> bool:
    """Run each searching configuration's next multipliers side by side (more than one each where
    workers would idle, :func:`points_per_search`); False when none is left."""
    searching = [s for s in searches.values() if s.next_multipliers(wait_target, installed)]
    if not searching:
        return False
    k = points_per_search(jobs, len(searching))
    todo = [
        (search.name, m)
        for search in searching
        for m in dict.fromkeys(round(m, 4) for m in search.next_multipliers(wait_target, installed, k))
    ]
    for _, m in todo:
        if m not in inputs:
            inputs[m] = grown(demand, m)
    fresh = []
    planned: set[tuple[str, int]] = set()
    for name, m in todo:  # a multiplier that rounds to a cluster already run reuses that run
        gpus = inputs[m].cluster.gpus
        same = next((r for r in searches[name].runs if r[1] == gpus), None)
        if same is not None:
            searches[name].runs.append((m, *same[1:4], 0.0))
        elif (name, gpus) not in planned:  # two of this round's multipliers round to one cluster
            planned.add((name, gpus))
            fresh.append((name, m))
    keys = sorted({m for _, m in fresh})
    index = {m: i for i, m in enumerate(keys)}
    tasks = [Task(f"{n} x{m:g} nodes", n, index[m], m * demand * expected_cost(n)) for n, m in fresh]
    runner = partial(run_named, cut_above=wait_target)  # a run stops once it surely misses
    results = run_tasks(runner, [inputs[m] for m in keys], tasks, jobs, progress) if tasks else []
    for (name, m), (_, doc) in zip(fresh, results, strict=True):
        gpus = inputs[m].cluster.gpus
        wait = float(doc["waitP95Seconds"] or 0.0)
        wall = float(doc.get("wallSeconds") or 0.0)
        searches[name].runs.append((m, gpus, round(demand * installed / gpus, 4), wait, wall))
    return True
