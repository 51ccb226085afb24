"""The live ETA (`gpuplane why`, the visibility API) of whole-node gangs: the node replay.

Small cluster states where the start is known by hand: nodes of 8 GPUs, running workloads that
each hold a whole node with a declared runtime (exact, so every scenario agrees), gangs whose
every pod takes a whole node. Quota is larger than the nodes, so only the nodes hold a gang back.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.insight.eta import Gang, NodeFree, NodeReplay, gang_start, gang_starts
from gpuplane.insight.why import Explanation, explain_all
from gpuplane.model.loader import load_state
from manifests import Manifest, cluster_queue, documents, local_queue, namespace, resource_flavor, workload
from why_cases import gpu_node, holder

NOW = 1_773_000_000
EXPECTED = "gpuplane.dev/expected-runtime"
GPU = "nvidia.com/gpu"


def _rfc(seconds: int) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def running(name: str, runtime: int, ran: int = 0, cq: str = "team-a") -> Manifest:
    """A workload holding one whole node (8 GPUs), declared to run ``runtime`` s, ``ran`` s so far."""
    reserved = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": "",
        "lastTransitionTime": _rfc(NOW - ran),
    }
    return holder(name, 8, cq).annotate(EXPECTED, str(runtime)).set("status.conditions", [reserved])


def gang(name: str, nodes: int, runtime: int, created: int, lq: str = "lq") -> Manifest:
    return (
        workload(name)
        .queue(lq)
        .created(_rfc(NOW - created))
        .podset(count=nodes, gpu=8, cpu="1")
        .annotate(EXPECTED, str(runtime))
    )


def explained(*manifests: Manifest) -> dict[str, Explanation]:
    state = load_state([("s.yaml", documents(*manifests))])
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, float(NOW), cycles=None)
    return {e.workload: e for e in explain_all(state, plan, float(NOW), config, diagnose=False)}


def base(nodes: int, quota: int = 64) -> list[Manifest]:
    return [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", gpu=quota, cpu="100"),
        local_queue("lq", "default", "team-a"),
        *(gpu_node(f"n{i}") for i in range(1, nodes + 1)),
    ]


def test_a_two_node_gang_waits_for_both_running_jobs_to_end() -> None:
    # Two nodes, each held by a whole-node job: r1 ends in 1000 s (ran 200 of 1200), r2 in 3000 s.
    # The quota (64 GPUs) has room now, so the queue estimate alone says 0 s; the gang needs both
    # nodes, so it starts when r2 ends: 3000 s.
    found = explained(
        *base(2), running("r1", 1200, ran=200), running("r2", 3000), gang("g", 2, 600, created=60)
    )
    eta = found["default/g"].eta
    assert (eta.low, eta.seconds, eta.high) == (3000.0, 3000.0, 3000.0)
    assert eta.basis.startswith("whole-node gang: replayed on the nodes of default (0 of 2 free, 8 ")
    assert "with 0 other pending whole-node gangs" in eta.basis


def test_the_basis_says_declared_runtimes_are_used_when_none_finished() -> None:
    declared = explained(*base(2), running("r1", 1200), gang("g", 2, 600, created=60))
    assert "no finished workloads: runtimes as declared" in declared["default/g"].eta.basis
    assumed = explained(
        *base(2), running("r1", 1200), gang("g", 2, 600, created=60).annotate(EXPECTED, "soon")
    )
    assert "runtimes declared where given, else about 3600s" in assumed["default/g"].eta.basis


def test_a_one_node_gang_takes_the_first_node_to_free() -> None:
    found = explained(
        *base(2), running("r1", 1200, ran=200), running("r2", 3000), gang("g", 1, 600, created=60)
    )
    assert found["default/g"].eta.seconds == 1000.0


def test_a_gang_behind_a_larger_head_starts_when_its_own_nodes_free() -> None:
    # Three nodes: one free, one frees at 1000 s, one at 2000 s. Head "big" takes 3 nodes for
    # 5000 s; "g" (2 nodes) is behind it. At 1000 s two nodes are free: big does not fit, so the
    # next cycle takes g (BestEffortFIFO, one head per queue per cycle), which holds them until
    # 1600 s; big starts when all three are free, at 2000 s.
    found = explained(
        *base(3),
        running("r1", 1000),
        running("r2", 2000),
        gang("big", 3, 5000, created=120),
        gang("g", 2, 600, created=60),
    )
    assert found["default/g"].eta.seconds == 1000.0
    assert found["default/big"].eta.seconds == 2000.0
    assert "with 1 other pending whole-node gangs" in found["default/g"].eta.basis


def test_a_gang_behind_a_head_of_its_size_waits_for_the_heads_run() -> None:
    # The same nodes, but the head asks 2 nodes: it starts at 1000 s and holds them 5000 s; g needs
    # two nodes: the one freed at 2000 s and one of the head's, at 6000 s.
    found = explained(
        *base(3),
        running("r1", 1000),
        running("r2", 2000),
        gang("head", 2, 5000, created=120),
        gang("g", 2, 600, created=60),
    )
    assert found["default/head"].eta.seconds == 1000.0
    assert found["default/g"].eta.seconds == 6000.0


def cohort_state(reclaim: str) -> list[Manifest]:
    """Three nodes. team-a (nominal 16 GPUs) runs a1 on one node until 1000 s; team-b (nominal 8)
    borrows: it runs b1 and b2 on the other two until 10000 s. team-a's gang of two nodes would
    borrow now (8 + 16 > 16), so it cannot reclaim yet and waits."""
    preemption = {"reclaimWithinCohort": reclaim, "withinClusterQueue": "Never"}
    return [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a")
        .cohort("c")
        .flavor("default", gpu=16, cpu="100")
        .set("spec.preemption", preemption),
        cluster_queue("team-b").cohort("c").flavor("default", gpu=8, cpu="100"),
        local_queue("lq", "default", "team-a"),
        gpu_node("n1"),
        gpu_node("n2"),
        gpu_node("n3"),
        running("a1", 1000),
        running("b1", 10000, cq="team-b"),
        running("b2", 10000, cq="team-b"),
        gang("g", 2, 600, created=60),
    ]


def test_a_gang_within_its_nominal_quota_reclaims_borrowed_nodes() -> None:
    # At 1000 s a1 ends: team-a is back to 0 of its 16, so g stays within its nominal quota and
    # takes the free node and one of the nodes team-b borrows.
    eta = explained(*cohort_state("Any"))["default/g"].eta
    assert eta.seconds == 1000.0
    assert "borrowed nodes reclaimed" in eta.basis


def test_without_reclaim_the_gang_waits_for_the_borrowers_to_end() -> None:
    eta = explained(*cohort_state("Never"))["default/g"].eta
    assert eta.seconds == 10000.0
    assert "reclaimed" not in eta.basis


def test_why_shows_the_gangs_eta_and_its_basis(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(
        documents(*base(2), running("r1", 1200, ran=200), running("r2", 3000), gang("g", 2, 600, created=60))
    )
    runner = CliRunner()
    result = runner.invoke(build_app(), ["why", "g", "-o", "json", "--now", _rfc(NOW), "-f", str(path)])
    assert result.exit_code == 0, result.stderr
    eta = json.loads(result.stdout)["eta"]
    assert (eta["low"], eta["seconds"], eta["high"]) == (3000.0, 3000.0, 3000.0)
    assert "whole-node gang: replayed on the nodes of default" in eta["basis"]
    table = runner.invoke(build_app(), ["why", "g", "--now", _rfc(NOW), "-f", str(path)])
    assert table.exit_code == 0, table.stderr
    text = " ".join(table.stdout.split())
    assert "starts in 3000s (between 3000s and 3000s)" in text
    assert "eta basis whole-node gang: replayed on the nodes of default (0 of 2 free" in text


def test_one_replay_for_all_gangs_gives_each_the_start_of_its_own_replay() -> None:
    # gang_starts (one replay, every gang) against gang_start (one replay per asked gang): three
    # nodes (one free, one at 1000 s, one at 2000 s), gangs of two queues.
    free = {"p": 1}
    releases = [NodeFree(1000.0, "p"), NodeFree(2000.0, "p")]
    gangs = [
        Gang("a", ("p",), 3, 0, 1.0, 5000.0),
        Gang("a", ("p",), 2, 0, 2.0, 600.0),
        Gang("b", ("p",), 1, 0, 3.0, 300.0),
        Gang("b", ("p",), 2, 0, 4.0, 900.0),
    ]
    together = gang_starts(0.0, NodeReplay(free, releases, gangs, {}, {}, 8.0))
    assert set(together) == {id(g) for g in gangs}
    for last in (gangs[1], gangs[3]):  # the last of each queue: gang_start sees the same gangs
        others = [g for g in gangs if g is not last]
        alone = gang_start(0.0, last, NodeReplay(free, releases, others, {}, {}, 8.0))
        assert together[id(last)] == alone
    # b's one-node gang takes the free node at once. At 1000 s two nodes are free: a's 3-node
    # gang cannot fit, so it stays parked and a's 2-node gang heads a, ahead of b's (queued
    # later); b's starts when it ends, at 1600 s, and a's 3-node gang when b's ends, at 2500 s.
    assert [together[id(g)] for g in gangs] == [2500.0, 1000.0, 0.0, 1600.0]
