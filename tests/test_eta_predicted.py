"""The live ETA with learned runtimes: history passed in, holders that ran past their expected end,
``activeDeadlineSeconds`` as a bound, the 10th-90th percentile range, and gangs waiting for room
on their nodes (the example of ``docs/visibility.md``)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from gpuplane.core.analysis import GangPodSet
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.core.session import pod_needs
from gpuplane.insight.node_eta import room_key
from gpuplane.insight.queue_eta import QUANTILES, play
from gpuplane.insight.runtime_history import RuntimeSample, features_of
from gpuplane.insight.why import Explanation, explain_all
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState, PodTemplate, frozen_map
from manifests import Manifest, cluster_queue, documents, local_queue, namespace, resource_flavor, workload
from why_cases import holder

NOW = 1_773_000_000
EXPECTED = "gpuplane.dev/expected-runtime"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "gpu-cluster.yaml"


def _rfc(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(name: str, ran: int, gpus: int = 4) -> Manifest:
    """A workload holding the whole quota (4 GPUs), admitted ``ran`` seconds ago."""
    reserved = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": "",
        "lastTransitionTime": _rfc(NOW - ran),
    }
    return holder(name, gpus).set("status.conditions", [reserved])


def state_of(*manifests: Manifest) -> ClusterState:
    return load_state(
        [
            (
                "s.yaml",
                documents(
                    namespace("default"),
                    resource_flavor("default"),
                    cluster_queue("team-a").flavor("default", gpu=4, cpu="100"),
                    local_queue("lq", "default", "team-a"),
                    *manifests,
                ),
            )
        ]
    )


def explained(state: ClusterState, history: tuple[RuntimeSample, ...] = ()) -> dict[str, Explanation]:
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, float(NOW), cycles=None)
    found = explain_all(state, plan, float(NOW), config, diagnose=False, history=history)
    return {e.workload: e for e in found}


def pending(name: str) -> Manifest:
    return workload(name).queue("lq").created(_rfc(NOW - 10)).podset(gpu=4, cpu="1")


def test_the_range_is_the_10th_to_90th_percentile() -> None:
    assert QUANTILES == (0.1, 0.5, 0.9)


def test_holders_past_their_declared_runtime_give_a_tail_estimate_not_0s() -> None:
    # r1 declared 600 s and has run an hour: the old estimate said it ends now ("0s").
    found = explained(state_of(running("r1", 3600).annotate(EXPECTED, "600"), pending("p")))
    eta = found["default/p"].eta
    assert eta.low is not None
    assert eta.seconds is not None
    assert eta.high is not None
    assert 0.0 < eta.low < eta.seconds < eta.high
    assert eta.seconds < 3600.0  # a share of the time it ran, not another full run
    assert "default/r1 ran past its expected end: tail estimate from the time run" in eta.basis


def test_holders_past_every_run_of_their_name_give_a_tail_estimate() -> None:
    state = state_of(running("r1", 7200), pending("p"))
    r1 = next(wl for wl in state.workloads if wl.name == "r1")
    assert r1.admission is not None
    history = tuple(
        RuntimeSample(features_of(r1, r1.admission.cluster_queue), 1000.0 + i, float(NOW - 86400 + i))
        for i in range(10)
    )
    eta = explained(state, history)["default/p"].eta
    assert eta.low is not None
    assert eta.low > 0.0
    assert "default/r1: the history of its job name (10 runs)" in eta.basis
    assert "ran past its expected end" in eta.basis
    taken = {b.workload: b for b in eta.runtimes}
    assert (taken["default/r1"].basis, taken["default/r1"].samples, taken["default/r1"].overdue) == (
        "name",
        10,
        True,
    )
    assert taken["default/r1"].remaining_seconds > 0.0
    assert (taken["default/p"].basis, taken["default/p"].overdue) == ("team", False)  # r1 runs at its size


def test_a_running_job_ends_with_the_runs_of_its_name_longer_than_its_age() -> None:
    state = state_of(running("r1", 3 * 3600), pending("p"))
    r1 = next(wl for wl in state.workloads if wl.name == "r1")
    assert r1.admission is not None
    hours = (3.6, 3.7, 3.8, 3.9, 4.0, 4.1, 4.2, 4.3, 4.4)
    history = tuple(
        RuntimeSample(features_of(r1, r1.admission.cluster_queue), h * 3600, float(NOW - 86400))
        for h in hours
    )
    eta = explained(state, history)["default/p"].eta
    assert eta.seconds is not None
    assert eta.low is not None
    assert eta.high is not None
    assert 0.6 * 3600 <= eta.low <= eta.seconds <= eta.high <= 1.4 * 3600  # about an hour left, not four


def test_active_deadline_seconds_caps_a_holders_runtime() -> None:
    # No history: r1 is assumed to run about an hour (up to many), but its pods stop at 1000 s.
    capped = running("r1", 200).set("spec.podSets[0].template.spec.activeDeadlineSeconds", 1000)
    state = state_of(capped, pending("p"))
    r1 = next(wl for wl in state.workloads if wl.name == "r1")
    assert r1.pod_sets[0].template.active_deadline == 1000
    eta = explained(state)["default/p"].eta
    assert eta.high is not None
    assert eta.high <= 800.0


def test_why_on_the_example_gives_a_range_for_a_gang_waiting_for_room() -> None:
    # toobig's quota is free; its rack's nodes are not: it starts when gang (and frac) end.
    result = CliRunner().invoke(build_app(), ["why", "toobig", "-f", str(EXAMPLE), "-o", "json"])
    assert result.exit_code == 0, result.stderr
    eta = json.loads(result.stdout)["eta"]
    assert eta["low"] is not None
    assert eta["high"] is not None
    assert 0.0 < eta["low"] < eta["seconds"] < eta["high"]
    assert "the nodes have room for the whole gang when default/gang" in eta["basis"]
    assert "about 3600s" in eta["basis"]  # no history: the runtimes are assumed, and it says so
    assert {(r["workload"], r["basis"], r["samples"]) for r in eta["runtimes"]} == {
        ("default/gang", "assumed", 0),
        ("default/toobig", "assumed", 0),
    }
    table = CliRunner().invoke(build_app(), ["why", "toobig", "-f", str(EXAMPLE)])
    assert "between 0s and 0s" not in table.stdout


def in_flavor(name: str, gpus: int, flavor: str, runtime: int) -> Manifest:
    """A workload holding ``gpus`` of ``flavor`` since now, declared to run ``runtime`` s."""
    reserved = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": "",
        "lastTransitionTime": _rfc(NOW),
    }
    assignment = {
        "name": "main",
        "count": 1,
        "flavors": {"nvidia.com/gpu": flavor, "cpu": flavor},
        "resourceUsage": {"nvidia.com/gpu": gpus, "cpu": "1"},
    }
    return (
        workload(name)
        .queue("lq")
        .created(_rfc(NOW - 100))
        .podset(count=1, gpu=gpus, cpu="1")
        .admitted("team-a", assignment)
        .annotate(EXPECTED, str(runtime))
        .set("status.conditions", [reserved])
    )


def two_flavors(*manifests: Manifest) -> ClusterState:
    queue = cluster_queue("team-a").flavor("a", gpu=4, cpu="100").flavor("b", gpu=4, cpu="100")
    text = documents(
        namespace("default"),
        resource_flavor("a"),
        resource_flavor("b"),
        queue,
        local_queue("lq", "default", "team-a"),
        *manifests,
    )
    return load_state([("s.yaml", text)])


def test_a_workload_that_may_run_on_several_flavors_starts_in_the_first_with_room() -> None:
    # 2 of 4 GPUs free in each flavor: 4 GPUs free in all, but no flavor has 4: the workload
    # starts when the first flavor frees, at 1000 s (flavor b) though flavor a frees at 3000 s.
    state = two_flavors(
        in_flavor("ra", 2, "a", 3000),
        in_flavor("rb", 2, "b", 1000),
        pending("p").annotate(EXPECTED, "600"),
    )
    found = explained(state)
    assert found["default/p"].reason == "WaitingForQuota"
    eta = found["default/p"].eta
    assert (eta.low, eta.seconds, eta.high) == (1000.0, 1000.0, 1000.0)
    assert "over 2 flavors" in eta.basis


def test_gangs_of_one_shape_share_the_nodes_answer() -> None:
    config = config_from_kueue(state_of().configuration)

    def gang(count: int, gpus: int) -> list[GangPodSet]:
        tpl = PodTemplate(requests=frozen_map({"nvidia.com/gpu": gpus, "cpu": 1000}))
        return [GangPodSet("main", count, pod_needs(tpl, config.devices), tpl, None, "rack")]

    assert room_key([gang(2, 4)]) == room_key([gang(2, 4)])
    assert room_key([gang(2, 4)]) != room_key([gang(3, 4)])
    assert room_key([gang(2, 4)]) != room_key([gang(2, 2)])


def test_work_still_to_come_starts_ahead_of_a_waiting_workload_where_it_fits() -> None:
    # 4 GPUs, all held: 2 free at 100 s, 2 more at 300 s; "big" needs 4. A 1-GPU job arriving at
    # 150 s for 1000 s fits in the 2 free ones and starts ahead of big (BestEffortFIFO), so big
    # waits for it: 1150 s instead of 300 s. Under StrictFIFO it queues behind big.
    releases = [(100.0, "f", 2.0), (300.0, "f", 2.0)]
    queue = [("big", 4.0, 500.0)]

    def start(arrivals: list[tuple[float, float, float]], strict: bool = False) -> float:
        found = play(0.0, {"f": 4.0}, {"f": 0.0}, releases, queue, strict=strict, arrivals=iter(arrivals))
        return found["big"]

    assert start([]) == 300.0
    assert start([(150.0, 1.0, 1000.0)]) == 1150.0
    assert start([(150.0, 1.0, 1000.0)], strict=True) == 300.0
    assert start([(350.0, 1.0, 1000.0)]) == 300.0  # after big started: no matter


def test_the_live_eta_plays_work_still_to_come_once_the_queue_has_seen_enough() -> None:
    def finished(name: str) -> Manifest:
        conditions = [
            {"type": t, "status": "True", "reason": t, "message": "", "lastTransitionTime": _rfc(at)}
            for t, at in (("QuotaReserved", NOW - 7200), ("Finished", NOW - 3600))
        ]
        return holder(name, 1).set("status.conditions", conditions)

    few = explained(state_of(running("r1", 600), pending("p"), *(finished(f"f{i}") for i in range(5))))
    assert "work still to come" not in few["default/p"].eta.basis
    many = explained(state_of(running("r1", 600), pending("p"), *(finished(f"f{i}") for i in range(30))))
    assert "work still to come at the recent rate" in many["default/p"].eta.basis
