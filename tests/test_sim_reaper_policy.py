"""The simulator's reaper decides with the cluster reaper's policy (insight/idle.py), not its own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuplane.insight import idle
from gpuplane.sim.experiment import run_experiment, scenario_input
from gpuplane.sim.scenario import load_scenario

SCENARIO = Path(__file__).resolve().parent / "golden" / "tiny-mixed.yaml"


def reaped(result: Any) -> int:
    return int(result.document["configurations"]["gpuplane"]["sessionsReaped"])


def test_sim_reaper_asks_the_shared_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = scenario_input(load_scenario(SCENARIO))
    decisions: list[idle.Decision] = []
    real = idle.decide

    def spy(*args: Any) -> idle.Decision:
        decision = real(*args)
        decisions.append(decision)
        return decision

    monkeypatch.setattr(idle, "decide", spy)
    count = reaped(run_experiment(sim, ("gpuplane",)))
    assert count > 0
    # Every reap event is one policy decision, and the policy agreed with the event's timing.
    assert len(decisions) >= count
    assert all(d.action is idle.Action.RECLAIM for d in decisions), {d.message for d in decisions}

    def keep(*_args: Any) -> idle.Decision:
        return idle.Decision(idle.Action.KEEP, idle.Reason.OPTED_OUT, "kept")

    monkeypatch.setattr(idle, "decide", keep)
    assert reaped(run_experiment(sim, ("gpuplane",))) == 0
