"""The data-stall hint as a line in ``gpuplane why`` for a running workload."""

from __future__ import annotations

from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.insight.idle import DATA_STALL_CONDITION
from gpuplane.insight.why import explain
from gpuplane.model.loader import load_state
from manifests import cluster_queue, documents, local_queue, namespace, resource_flavor
from why_cases import holder

NOW = 1_773_000_000.0
STALL = "SM activity below 0.2 in 100% of samples with work resident over 30m (window=30m, lowSmShare=1.00)"


def explain_running(conditions: list[dict[str, str]]) -> tuple[str, str, str]:
    running = holder("train", 4).set("status.conditions", conditions)
    text = documents(
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", gpu=8, cpu="100"),
        local_queue("lq", "default", "team-a"),
        running,
    )
    state = load_state([("s.yaml", text)])
    config = config_from_kueue(state.configuration)
    found = explain(state, schedule(state, config, NOW, cycles=None), NOW, "default/train", config)
    return found.reason, found.message, found.fix


def condition(ctype: str, status: str, message: str = "") -> dict[str, str]:
    return {
        "type": ctype,
        "status": status,
        "reason": ctype.rsplit("/", 1)[-1],
        "message": message,
        "lastTransitionTime": "2026-03-01T09:00:00Z",
    }


def test_why_names_a_suspected_data_stall_on_a_running_workload() -> None:
    reserved = condition("QuotaReserved", "True")
    reason, message, fix = explain_running([reserved, condition(DATA_STALL_CONDITION, "True", STALL)])
    assert reason == "Admitted"
    assert message.endswith(f"; data stall suspected: {STALL}")
    assert "input pipeline" in fix


def test_why_says_nothing_of_a_stall_that_ended() -> None:
    reserved = condition("QuotaReserved", "True")
    _, message, fix = explain_running([reserved, condition(DATA_STALL_CONDITION, "False", "steady")])
    assert "data stall" not in message
    assert fix == "nothing to fix"
