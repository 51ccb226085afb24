"""The generator's job names: reused by teams, runtimes close within a name, sizes going with names."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np

from gpuplane.sim.scenario import builtin_scenario
from gpuplane.sim.workloads import NAME_SIGMA, generate


def test_names_repeat_within_a_team_and_are_deterministic() -> None:
    scenario = builtin_scenario().with_days(2)
    first = generate(scenario)
    again = generate(scenario)
    assert [j.base_name for j in first.jobs] == [j.base_name for j in again.jobs]
    assert all(j.base_name.startswith(j.klass + "-") for j in first.jobs)
    runs = Counter((j.team, j.base_name) for j in first.jobs)
    assert len(runs) < len(first.jobs) / 4  # names are reused
    assert max(runs.values()) >= 20
    other = generate(scenario.with_seed(7))
    assert [j.base_name for j in other.jobs] != [j.base_name for j in first.jobs]


def test_runtimes_spread_less_within_a_name_and_sizes_follow_names() -> None:
    jobs = generate(builtin_scenario().with_days(3)).jobs
    for klass in ("training-single", "ci-eval"):
        mine = [j for j in jobs if j.klass == klass]
        by_name: dict[tuple[str, str], list[float]] = defaultdict(list)
        for j in mine:
            by_name[(j.team, j.base_name)].append(float(np.log(j.work)))
        within = float(np.median([np.std(v) for v in by_name.values() if len(v) >= 5]))
        overall = float(np.std([np.log(j.work) for j in mine]))
        assert within < 2 * NAME_SIGMA < overall
    sizes: dict[tuple[str, str], Counter[str]] = defaultdict(Counter)
    for j in jobs:
        if j.klass == "ci-eval":  # three in four on a whole GPU, one in four on a MIG slice
            sizes[(j.team, j.base_name)][repr(j.request)] += 1
    loyal = sum(c.most_common(1)[0][1] for c in sizes.values()) / sum(sum(c.values()) for c in sizes.values())
    assert loyal > 0.85
