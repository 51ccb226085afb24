"""Scenario files: the built-in one, sources on every number, validation errors, workload draws."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from gpuplane.sim.cluster import cluster_from_scenario, split
from gpuplane.sim.experiment import scenario_input
from gpuplane.sim.scenario import (
    KNOWN_SOURCES,
    ScenarioError,
    builtin_scenario,
    load_scenario,
    parse_scenario,
)
from gpuplane.sim.workloads import generate, offered_gpus

GOLDEN = Path(__file__).resolve().parent / "golden"
TINY = GOLDEN / "tiny-mixed.yaml"


def tiny_doc() -> dict[str, Any]:
    doc = yaml.safe_load(TINY.read_text())
    assert isinstance(doc, dict)
    return doc


def test_builtin_scenario_is_several_hundred_gpus_for_a_week() -> None:
    scenario = builtin_scenario()
    assert scenario.gpus >= 300
    assert scenario.days >= 7
    assert len({p.model for p in scenario.pools}) >= 2
    assert {c.name for c in scenario.classes} >= {"training-gang", "inference", "notebook", "ci-eval"}


def test_every_builtin_parameter_names_its_source() -> None:
    scenario = builtin_scenario()
    assert scenario.sources
    for path, _, source in scenario.sources:
        assert any(k in source.lower() for k in KNOWN_SOURCES), path
    published = [s for _, _, s in scenario.sources if not s.lower().startswith("assumed")]
    assert published, "at least some numbers come from published traces or the fact sheet"


def test_offered_load_follows_from_the_published_figure() -> None:
    scenario = builtin_scenario()
    assert scenario.offered_load is not None
    offered = sum(offered_gpus(scenario).values())
    assert offered == pytest.approx(scenario.offered_load.mean * scenario.gpus, rel=1e-9)


def test_draws_are_reproducible_and_seeded() -> None:
    scenario = load_scenario(TINY)
    first, again = generate(scenario), generate(scenario)
    assert [(j.submit, j.pods, j.work, j.team) for j in first.jobs] == [
        (j.submit, j.pods, j.work, j.team) for j in again.jobs
    ]
    assert first.node_events == again.node_events
    other = generate(scenario.with_seed(scenario.seed + 1))
    assert [j.submit for j in other.jobs] != [j.submit for j in first.jobs]


def test_a_class_draws_the_same_arrivals_whatever_the_other_classes() -> None:
    doc = tiny_doc()
    alone = copy.deepcopy(doc)
    alone["classes"] = [c | {"arrivalsPerDay": {"value": 20, "source": "assumed"}} for c in doc["classes"]]
    for c in alone["classes"]:
        c.pop("gpuTimeShare")
    fewer = copy.deepcopy(alone)
    fewer["classes"] = fewer["classes"][:2]
    a = [j.submit for j in generate(parse_scenario(alone, "a")).jobs if j.klass == "gang"]
    b = [j.submit for j in generate(parse_scenario(fewer, "b")).jobs if j.klass == "gang"]
    assert a == b


def test_sessions_alternate_active_and_idle_then_idle_tail() -> None:
    jobs = [j for j in generate(load_scenario(TINY)).jobs if j.klass == "notebook"]
    assert jobs
    for job in jobs:
        spans = np.asarray(job.active)
        assert len(spans) % 2 == 0
        assert (np.diff(spans) >= 0).all()
        assert spans[-1] <= job.work
        assert job.active_between(0, job.work) == pytest.approx(float(np.sum(spans[1::2] - spans[::2])))


def test_quota_split_adds_up() -> None:
    assert split(448, [128, 112, 96, 80]) == [138, 121, 103, 86]
    assert sum(split(1001, [1, 1, 1])) == 1001
    spec = cluster_from_scenario(builtin_scenario())
    milli = spec.team_milli()
    for pool in spec.pools:
        assert sum(v for (_, p), v in milli.items() if p == pool) == spec.pool_gpus(pool) * 1000
    assert sum(spec.team_gpus().values()) == spec.gpus


def test_warm_up_is_simulated_but_not_measured() -> None:
    sim = scenario_input(load_scenario(TINY))
    assert sim.workloads.start < 0
    assert any(j.submit < 0 for j in sim.workloads.jobs)


# --- bad scenarios ------------------------------------------------------------------------------


@dataclass
class Bad:
    name: str
    path: str  # dotted path into the document, [i] for list items
    value: Any
    want: str  # substring of the one-line error


def _set(doc: Any, path: str, value: Any) -> None:
    parts = path.replace("]", "").replace("[", ".").split(".")
    node = doc
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if value is _DROP:
        del node[int(last) if last.isdigit() else last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


_DROP = object()

BAD = [
    Bad("missing-source", "cluster.pools[0].nodes", {"value": 3}, "cluster.pools[0].nodes.source: missing"),
    Bad(
        "unknown-source",
        "classes[0].busy",
        {"value": 0.5, "source": "my notebook"},
        "classes[0].busy.source: must be 'assumed ...'",
    ),
    Bad("unknown-field", "classes[0].colour", "red", "classes[0].colour: unknown field"),
    Bad("bad-unit", "classes[0].duration.unit", "fortnights", "classes[0].duration.unit: expected one of"),
    Bad(
        "two-distributions",
        "classes[0].busy",
        {"value": 1, "uniform": [0, 1], "source": "assumed"},
        "exactly one",
    ),
    Bad("busy-above-one", "classes[0].busy", {"value": 1.5, "source": "assumed"}, "classes[0].busy"),
    Bad(
        "lognormal-mean-below-median",
        "classes[0].duration",
        {"lognormal": {"median": 5, "mean": 1}, "unit": "h", "source": "assumed"},
        "mean is never below its median",
    ),
    Bad("unknown-pool", "classes[0].shapes[0].pools", ["nowhere"], "unknown pool 'nowhere'"),
    Bad("mig-profile-missing", "classes[2].shapes[0].mig", "7g.80gb", "has no 7g.80gb instances"),
    Bad("whole-gpus-on-mig-pool", "classes[0].shapes[0].pools", ["h100-mig"], "is MIG-partitioned"),
    Bad("pod-larger-than-node", "classes[0].shapes[0].gpus", {"value": 16, "source": "assumed"}, "has 8"),
    Bad(
        "shares-do-not-add-up", "classes[0].gpuTimeShare", {"value": 0.9, "source": "assumed"}, "add up to 1"
    ),
    Bad(
        "bad-mig-layout",
        "cluster.pools[2].mig.layout",
        ["4g.40gb", "4g.40gb"],
        "cluster.pools[2].mig.layout",
    ),
    Bad("no-teams", "teams", [], "teams: expected a non-empty list"),
    Bad("negative-seed", "seed", -1, "seed: expected a non-negative integer"),
    Bad("missing-policies", "policies", _DROP, "policies: expected a mapping"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_bad_scenarios_name_the_field(case: Bad) -> None:
    doc = tiny_doc()
    _set(doc, case.path, case.value)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc, "s.yaml")
    message = str(err.value)
    assert message.startswith("s.yaml: ")
    assert "\n" not in message
    assert case.want in message


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    with pytest.raises(ScenarioError, match=r"broken.yaml: line \d+: not valid YAML"):
        load_scenario(broken)
