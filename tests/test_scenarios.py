"""The project's own Kueue-behaviour scenarios under ``tests/scenarios``, one cycle each.

Each folder holds ``state.yaml`` and ``expected.json`` in the format of the shared conformance
scenarios; ``source`` names the Kueue function whose rule the scenario pins, and ``cycles``
(default 1; ``null`` drains to a fixed point) how many cycles run. The admitted and
preempted sets must match exactly, and every pending reason listed must be the one reported.
A second test turns the feature gate behind each rule off and checks that the answer changes
the way Kueue's does, so a scenario cannot pass by accident.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.model.loader import load_state
from test_conformance import admitted_set, preempted_set

SCENARIOS = Path(__file__).resolve().parent / "scenarios"


def one_cycle(text: str, cycles: int | None = 1) -> dict[str, Any]:
    state = load_state([("state.yaml", text)])
    plan = schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=cycles)
    return plan_document(plan, 0.0, 0.0)


def with_gates(text: str, **gates: bool) -> str:
    """The state with its Configuration's feature gates set."""
    lines = "".join(f"  {name}: {str(value).lower()}\n" for name, value in gates.items())
    head, sep, rest = text.partition("kind: Configuration\n")
    assert sep, "scenario has no Configuration"
    return f"{head}{sep}featureGates:\n{lines}{rest}"


@pytest.mark.parametrize("name", sorted(p.name for p in SCENARIOS.iterdir() if p.is_dir()))
def test_scenario(name: str) -> None:
    folder = SCENARIOS / name
    expected = json.loads((folder / "expected.json").read_text())

    got = one_cycle((folder / "state.yaml").read_text(), expected.get("cycles", 1))

    assert admitted_set(got["admitted"]) == admitted_set(expected["admitted"])
    assert preempted_set(got["preempted"]) == preempted_set(expected["preempted"])
    reasons = {p["workload"]: p["reason"] for p in got["pending"]}
    for item in expected["pending"]:
        assert reasons.get(item["workload"]) == item["reason"], item["workload"]


@pytest.mark.parametrize(
    ("name", "gates", "want_admitted", "want_preempted"),
    [
        pytest.param(
            "fair-sharing-preempt-within-nominal",
            {"FairSharingPreemptWithinNominal": False},
            set(),
            {("default/b2", "InCohortFairSharing")},
            id="within-nominal-off-uses-the-strategies",
        ),
        pytest.param(
            "placement-failure-moves-to-next-flavor",
            {"FlavorFungibility": False},
            set(),
            set(),
            id="fungibility-off-never-leaves-the-first-flavor",
        ),
        pytest.param(
            "overlapping-targets-recomputed",
            {"RecomputeAssignmentUponPreemptionTargetsOverlap": False},
            set(),
            {("default/c2", "InCohortReclamation")},
            id="recompute-off-skips-the-second-preemptor",
        ),
    ],
)
def test_gate_off_changes_the_answer(
    name: str, gates: dict[str, bool], want_admitted: set[str], want_preempted: set[Any]
) -> None:
    folder = SCENARIOS / name
    expected = json.loads((folder / "expected.json").read_text())

    got = one_cycle(with_gates((folder / "state.yaml").read_text(), **gates), expected.get("cycles", 1))

    assert {a["workload"] for a in got["admitted"]} == want_admitted
    assert preempted_set(got["preempted"]) == want_preempted
    assert (want_admitted, want_preempted) != (
        {a["workload"] for a in expected["admitted"]},
        preempted_set(expected["preempted"]),
    ), "the gate must matter in this scenario"
