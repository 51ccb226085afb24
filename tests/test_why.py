"""`gpuplane why` on state files: every FAQ cause gets its reason, blockers and fix; JSON shape; ETA."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from gpuplane.cli.schedule import default_now
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.insight.why import NotFoundError, explain, explain_all, resolve, split_reference
from gpuplane.model.loader import load_state
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    job,
    local_queue,
    namespace,
    pod_spec,
    resource_flavor,
    workload,
)
from why_cases import WhyCase, cases, holder

SHAPE = {
    "workload",
    "clusterQueue",
    "localQueue",
    "positionInClusterQueue",
    "positionInLocalQueue",
    "eta",
    "reason",
    "message",
    "blockers",
    "fix",
}


def run_why(tmp_path: Path, text: str, *args: str) -> tuple[int, str, str]:
    path = tmp_path / "state.yaml"
    path.write_text(text)
    result = CliRunner().invoke(build_app(), ["why", *args, "-f", str(path)])
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_each_cause_has_its_reason_blockers_and_fix(tmp_path: Path, case: WhyCase) -> None:
    code, out, err = run_why(tmp_path, documents(*case.manifests), case.target, "--output", "json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == SHAPE
    assert set(doc["eta"]) == {"seconds", "low", "high", "basis", "runtimes"}
    assert doc["workload"] == "default/w"
    assert doc["reason"] == case.want_reason, doc
    got = {(b["kind"], b["name"]) for b in doc["blockers"]}
    assert case.want_blockers <= got, doc["blockers"]
    for words in case.want_fix:
        assert words in doc["fix"], doc["fix"]
    details = " | ".join(b["detail"] for b in doc["blockers"])
    for words in case.want_detail:
        assert words in details, details


def test_table_output_names_reason_fix_and_blockers(tmp_path: Path) -> None:
    case = next(c for c in cases() if c.id == "fragmented")
    code, out, err = run_why(tmp_path, documents(*case.manifests), "w")
    assert code == 0, err
    assert "Fragmented" in out
    assert "one preemption makes room" in out
    assert "Blocked by" in out


def test_reasons_that_never_clear_have_no_eta(tmp_path: Path) -> None:
    case = next(c for c in cases() if c.id == "taint-without-toleration")
    code, out, _ = run_why(tmp_path, documents(*case.manifests), "w", "-o", "json")
    assert code == 0
    eta = json.loads(out)["eta"]
    assert (eta["seconds"], eta["low"], eta["high"]) == (None, None, None)
    assert "UntoleratedTaint" in eta["basis"]


def finished(name: str, runtime: int) -> object:
    start = 1_772_000_000
    return holder(name, 4).set(
        "status.conditions",
        [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": "",
                "lastTransitionTime": _rfc(start),
            },
            {
                "type": "Finished",
                "status": "True",
                "reason": "Succeeded",
                "message": "",
                "lastTransitionTime": _rfc(start + runtime),
            },
        ],
    )


def _rfc(seconds: int) -> str:
    import datetime  # noqa: PLC0415

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


NOW = 1_773_000_000


EXPECTED = "gpuplane.dev/expected-runtime"


def eta_state(declared: dict[str, str] | None = None) -> str:
    """Quota of 4 GPUs; one running for 300 s; two queued of 4; runtimes 600/1200/1800 s learned."""
    declared = declared or {}

    def runtime(manifest: Manifest, name: str) -> Manifest:
        return manifest.annotate(EXPECTED, declared[name]) if name in declared else manifest

    running = holder("r1", 4).set(
        "status.conditions",
        [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "message": "",
                "lastTransitionTime": _rfc(NOW - 300),
            }
        ],
    )
    return documents(
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", gpu=4, cpu="100"),
        local_queue("lq", "default", "team-a"),
        finished("f1", 600),
        finished("f2", 1200),
        finished("f3", 1800),
        runtime(running, "r1"),
        runtime(workload("p1").queue("lq").created(_rfc(NOW - 60)).podset(gpu=4, cpu="1"), "p1"),
        runtime(workload("p2").queue("lq").created(_rfc(NOW - 30)).podset(gpu=4, cpu="1"), "p2"),
    )


def test_eta_with_declared_runtimes_equals_a_hand_computation(tmp_path: Path) -> None:
    # r1 declared 1200 s and ran 300 s: it ends in 900 s, when p1 starts; p1 declared 1200 s, so p2
    # starts 2100 s from now. Declared runtimes are exact: low = seconds = high.
    text = eta_state(declared={"r1": "1200", "p1": "20m", "p2": "1h"})
    code, out, err = run_why(tmp_path, text, "p2", "-o", "json", "--now", _rfc(NOW))
    assert code == 0, err
    doc = json.loads(out)
    assert doc["reason"] == "WaitingForQuota"
    assert (doc["positionInClusterQueue"], doc["positionInLocalQueue"]) == (2, 2)  # 1 is next
    assert (doc["eta"]["low"], doc["eta"]["seconds"], doc["eta"]["high"]) == (2100.0, 2100.0, 2100.0)
    code, out, _ = run_why(tmp_path, text, "p1", "-o", "json", "--now", _rfc(NOW))
    first = json.loads(out)
    assert first["positionInClusterQueue"] == 1
    assert first["eta"]["seconds"] == 900.0


def test_eta_from_learned_runtimes_is_a_range_within_the_history(tmp_path: Path) -> None:
    # Learned runtimes 600/1200/1800 s; r1 ran 300 s, so it ends 300..1500 s from now; p2 waits for
    # r1 and then p1 (600..1800 s): between 900 and 3300 s, low <= median <= high.
    code, out, err = run_why(tmp_path, eta_state(), "p2", "-o", "json", "--now", _rfc(NOW))
    assert code == 0, err
    eta = json.loads(out)["eta"]
    assert 900.0 <= eta["low"] <= eta["seconds"] <= eta["high"] <= 3300.0
    assert eta["low"] < eta["high"]
    assert "3 finished in team-a" in eta["basis"]
    again = run_why(tmp_path, eta_state(), "p2", "-o", "json", "--now", _rfc(NOW))[1]
    assert json.loads(again)["eta"] == eta  # the scenarios are the same on every run


def test_a_small_workload_backfills_past_a_blocked_big_one() -> None:
    # Quota 4, all held: r1 (3 GPUs) ends in 1000 s, r2 (1 GPU) in 100 s. Queue: big (4), small (1).
    # BestEffortFIFO: at 100 s small fits in r2's GPU and starts, though big is ahead of it;
    # big starts at 1000 s. Under StrictFIFO small would wait for big.
    def running(name: str, gpus: int, runtime: int) -> Manifest:
        return (
            holder(name, gpus)
            .annotate(EXPECTED, str(runtime))
            .set(
                "status.conditions",
                [
                    {
                        "type": "QuotaReserved",
                        "status": "True",
                        "reason": "QuotaReserved",
                        "message": "",
                        "lastTransitionTime": _rfc(NOW),
                    }
                ],
            )
        )

    text = documents(
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", gpu=4, cpu="100"),
        local_queue("lq", "default", "team-a"),
        running("r1", 3, 1000),
        running("r2", 1, 100),
        workload("big").queue("lq").created(_rfc(NOW - 60)).podset(gpu=4, cpu="1").annotate(EXPECTED, "600"),
        workload("small")
        .queue("lq")
        .created(_rfc(NOW - 30))
        .podset(gpu=1, cpu="1")
        .annotate(EXPECTED, "300"),
    )
    state = load_state([("s.yaml", text)])
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, float(NOW), cycles=None)
    found = {e.workload: e for e in explain_all(state, plan, float(NOW), config)}
    assert found["default/small"].eta.seconds == 100.0
    assert found["default/big"].eta.seconds == 1000.0


def test_explain_all_matches_the_plan_positions() -> None:
    state = load_state([("state.yaml", eta_state())])
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, float(NOW), cycles=None)
    found = explain_all(state, plan, float(NOW), config)
    assert [(e.workload, e.position_in_cluster_queue) for e in found] == [
        (p.workload, (p.position or 0) - 1) for p in plan.pending
    ]
    assert explain(state, plan, float(NOW), "default/r1", config).reason == "Admitted"


def test_names_resolve_as_kubectl_spells_them() -> None:
    text = documents(
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", gpu=8, cpu="100"),
        local_queue("lq", "default", "team-a"),
        job("train").queue("lq").parallelism(2).pod(pod_spec().container(gpu=1, cpu="1")),
        workload("plain").queue("lq").podset(gpu=1),
    )
    state = load_state([("s.yaml", text)])
    assert resolve(state, "job/train", "default").name.startswith("job-train-")
    assert resolve(state, "jobs.batch/train" if False else "job.batch/train", "default").name.startswith(
        "job-train-"
    )
    assert resolve(state, "plain", "default").name == "plain"
    assert resolve(state, "workload/plain", "default").name == "plain"
    with pytest.raises(NotFoundError, match="job default/missing"):
        resolve(state, "job/missing", "default")
    with pytest.raises(NotFoundError, match="expected \\[KIND/\\]NAME"):
        split_reference("deployment/x")
    assert split_reference("po/x") == ("pod", "x")


def test_unknown_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    case = cases()[0]
    code, _, err = run_why(tmp_path, documents(*case.manifests), "job/nope")
    assert code == 2
    assert err.strip().count("\n") == 0
    assert "no workload for job default/nope" in err


def test_needs_exactly_one_source() -> None:
    result = CliRunner().invoke(build_app(), ["why", "w"])
    assert result.exit_code == 2
    assert "either -f STATE or --kubeconfig" in result.stderr


def test_default_now_is_the_states_latest_time() -> None:
    state = load_state([("s.yaml", eta_state())])
    assert default_now(state) >= NOW - 30


DOC = Path(__file__).resolve().parents[1] / "docs" / "visibility.md"


def test_the_commands_of_docs_visibility_run() -> None:
    commands = [
        line[2:].split() for line in DOC.read_text().splitlines() if line.startswith("$ gpuplane why")
    ]
    assert commands
    for argv in commands:
        with pytest.MonkeyPatch.context() as patch:
            patch.chdir(DOC.parents[1])
            result = CliRunner().invoke(build_app(), argv[1:])
        assert result.exit_code == 0, (argv, result.stderr)
