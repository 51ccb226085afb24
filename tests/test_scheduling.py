"""Behaviour of the scheduling core on small, hand-built cluster states."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import Scheduler, schedule
from gpuplane.model.loader import load_state
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    job,
    local_queue,
    namespace,
    pod_spec,
    priority_class,
    resource_flavor,
    workload,
)

T0 = "2026-01-01T00:00:00Z"


def decide(*objects: Manifest, cycles: int | None = 1) -> dict[str, Any]:
    state = load_state([("state.yaml", documents(*objects))])
    plan = schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=cycles)
    return plan_document(plan, 0.0, 0.0)


def admitted(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {a["workload"]: a for a in doc["admitted"]}


def pending(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["workload"]: p for p in doc["pending"]}


def preempted(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(p["workload"], p["reason"]) for p in doc["preempted"]}


def running(name: str, cq: str, cpu: str, priority: int = 0, ns: str = "default") -> Manifest:
    return (
        workload(name, ns)
        .priority(priority)
        .created(T0)
        .podset(cpu=cpu)
        .admitted(
            cq, {"name": "main", "count": 1, "flavors": {"cpu": "default"}, "resourceUsage": {"cpu": cpu}}
        )
        .set("status.conditions", [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": T0}])
    )


def base(*queues: Manifest) -> list[Manifest]:
    objects: list[Manifest] = [namespace("default"), resource_flavor("default"), *queues]
    objects += [
        local_queue(q.body["metadata"]["name"], "default", q.body["metadata"]["name"]) for q in queues
    ]
    return objects


def preempting(cq: Manifest, within: str = "LowerPriority", reclaim: str = "Any") -> Manifest:
    return cq.set("spec.preemption", {"withinClusterQueue": within, "reclaimWithinCohort": reclaim})


# --- admission and quota -------------------------------------------------------------------------


@dataclass
class Case:
    name: str
    objects: list[Manifest]
    want_admitted: set[str]
    want_pending: dict[str, str] = field(default_factory=dict)
    cycles: int | None = 1


CASES = [
    Case(
        name="fits-nominal",
        objects=[
            *base(cluster_queue("a").flavor("default", cpu="4")),
            workload("w").queue("a").podset(cpu="3"),
        ],
        want_admitted={"default/w"},
    ),
    Case(
        name="exceeds-max-quota",
        objects=[
            *base(cluster_queue("a").flavor("default", cpu="4")),
            workload("w").queue("a").podset(cpu="5"),
        ],
        want_admitted=set(),
        want_pending={"default/w": "ExceedsMaxQuota"},
    ),
    Case(
        name="requests-above-limits-are-misconfigured",
        objects=[
            *base(cluster_queue("a").flavor("default", cpu="4")),
            workload("w").queue("a").podset(spec=pod_spec().container(limits={"cpu": "1"}, cpu="2")),
        ],
        want_admitted=set(),
        want_pending={"default/w": "Misconfigured"},
    ),
    Case(
        name="namespace-selector-mismatch",
        objects=[
            *base(
                cluster_queue("a")
                .flavor("default", cpu="4")
                .namespace_selector({"matchLabels": {"team": "x"}})
            ),
            workload("w").queue("a").podset(cpu="1"),
        ],
        want_admitted=set(),
        want_pending={"default/w": "NamespaceMismatch"},
    ),
    Case(
        name="stopped-queue-is-inactive",
        objects=[
            *base(cluster_queue("a").flavor("default", cpu="4").set("spec.stopPolicy", "Hold")),
            workload("w").queue("a").podset(cpu="1"),
        ],
        want_admitted=set(),
        want_pending={"default/w": "Suspended"},
    ),
    Case(
        name="missing-local-queue",
        objects=[
            *base(cluster_queue("a").flavor("default", cpu="4")),
            workload("w").queue("nope").podset(cpu="1"),
        ],
        want_admitted=set(),
        want_pending={"default/w": "Misconfigured"},
    ),
    Case(
        name="partial-admission-reduces-count",
        objects=[
            *base(cluster_queue("a").flavor("default", cpu="6")),
            workload("w").queue("a").podset(count=10, min_count=4, cpu="1"),
        ],
        want_admitted={"default/w"},
    ),
    Case(
        name="borrow-from-cohort",
        objects=[
            *base(
                cluster_queue("a").cohort("c").flavor("default", cpu="2"),
                cluster_queue("b").cohort("c").flavor("default", cpu="4"),
            ),
            workload("w").queue("a").podset(cpu="5"),
        ],
        want_admitted={"default/w"},
    ),
    Case(
        name="lending-limit-caps-borrowing",
        objects=[
            *base(
                cluster_queue("a").cohort("c").flavor("default", cpu="2"),
                cluster_queue("b")
                .cohort("c")
                .flavor("default", cpu="4")
                .set("spec.resourceGroups[0].flavors[0].resources[0].lendingLimit", "1"),
            ),
            workload("w").queue("a").podset(cpu="4"),
        ],
        want_admitted=set(),
        want_pending={"default/w": "ExceedsMaxQuota"},
    ),
    Case(
        name="borrowing-limit-caps-borrowing",
        objects=[
            *base(
                cluster_queue("a")
                .cohort("c")
                .flavor("default", cpu="2")
                .set("spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit", "1"),
                cluster_queue("b").cohort("c").flavor("default", cpu="4"),
            ),
            workload("w").queue("a").podset(cpu="4"),
        ],
        want_admitted=set(),
        want_pending={"default/w": "ExceedsMaxQuota"},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_admission(case: Case) -> None:
    doc = decide(*case.objects, cycles=case.cycles)
    assert set(admitted(doc)) == case.want_admitted
    reasons = {k: v["reason"] for k, v in pending(doc).items()}
    for wl, reason in case.want_pending.items():
        assert reasons.get(wl) == reason, pending(doc).get(wl)


def test_partial_admission_takes_the_largest_count_that_fits() -> None:
    doc = decide(
        *base(cluster_queue("a").flavor("default", cpu="6")),
        workload("w").queue("a").podset(count=10, min_count=4, cpu="1"),
    )
    assert admitted(doc)["default/w"]["podSets"][0]["count"] == 6


def test_untolerated_flavor_taint_moves_to_next_flavor() -> None:
    tainted = resource_flavor("tainted").set(
        "spec.nodeTaints", [{"key": "spot", "value": "true", "effect": "NoSchedule"}]
    )
    cq = cluster_queue("a").flavor("tainted", cpu="4").flavor("default", cpu="4")
    doc = decide(tainted, *base(cq), workload("w").queue("a").podset(cpu="1"))
    assert admitted(doc)["default/w"]["podSets"][0]["flavors"] == {"cpu": "default"}


def test_job_with_queue_label_is_admitted_with_its_priority() -> None:
    doc = decide(
        *base(cluster_queue("a").flavor("default", cpu="4")),
        priority_class("high", 1000),
        job("train").queue("a").priority_class("high").parallelism(2).pod(pod_spec().container(cpu="1")),
        job("unmanaged").parallelism(2).pod(pod_spec().container(cpu="1")),
    )
    (only,) = doc["admitted"]
    assert only["workload"].startswith("default/job-train-")
    assert only["podSets"][0]["count"] == 2


# --- queues ---------------------------------------------------------------------------------------


def test_positions_in_cluster_queue_and_local_queue() -> None:
    objects = base(cluster_queue("a").flavor("default", cpu="1"))
    objects.append(local_queue("other", "default", "a"))
    objects += [
        workload(f"w{i}").queue("a" if i % 2 else "other").created(f"2026-01-01T00:00:0{i}Z").podset(cpu="1")
        for i in range(5)
    ]
    doc = decide(*objects, cycles=1)
    assert set(admitted(doc)) == {"default/w0"}
    waiting = pending(doc)
    assert [waiting[f"default/w{i}"]["position"] for i in range(1, 5)] == [1, 2, 3, 4]
    assert [waiting[f"default/w{i}"]["localQueuePosition"] for i in range(1, 5)] == [1, 1, 2, 2]


@pytest.mark.parametrize(
    ("strategy", "want_small_admitted"),
    [("BestEffortFIFO", True), ("StrictFIFO", False)],
)
def test_queueing_strategy_when_the_head_does_not_fit(strategy: str, want_small_admitted: bool) -> None:
    cq = cluster_queue("a").flavor("default", cpu="4").set("spec.queueingStrategy", strategy)
    doc = decide(
        *base(cq),
        running("busy", "a", "3"),
        workload("big").queue("a").priority(10).created(T0).podset(cpu="3"),
        workload("small").queue("a").priority(0).created(T0).podset(cpu="1"),
        cycles=None,
    )
    assert ("default/small" in admitted(doc)) is want_small_admitted
    assert "default/big" in pending(doc)


# --- preemption -----------------------------------------------------------------------------------


def test_preemptor_waits_one_cycle_then_is_admitted() -> None:
    cq = preempting(cluster_queue("a").flavor("default", cpu="4"))
    objects = [
        *base(cq),
        running("low", "a", "4", priority=0),
        workload("high").queue("a").priority(10).podset(cpu="4"),
    ]
    one = decide(*objects, cycles=1)
    assert preempted(one) == {("default/low", "InClusterQueue")}
    assert one["preempted"][0]["preemptor"] == "default/high"
    assert pending(one)["default/high"]["reason"] == "WaitingForPreemptedWorkloads"
    assert "default/high" not in admitted(one)
    drained = decide(*objects, cycles=None)
    assert set(admitted(drained)) == {"default/high"}
    assert drained["stats"]["cycles"] >= 2


def test_lower_priority_cannot_preempt() -> None:
    cq = preempting(cluster_queue("a").flavor("default", cpu="4"))
    doc = decide(
        *base(cq), running("high", "a", "4", priority=10), workload("low").queue("a").podset(cpu="4")
    )
    assert preempted(doc) == set()
    assert pending(doc)["default/low"]["reason"] == "WaitingForQuota"


def test_reclaim_borrowed_quota_from_the_cohort() -> None:
    a = preempting(cluster_queue("a").cohort("c").flavor("default", cpu="4"))
    b = preempting(cluster_queue("b").cohort("c").flavor("default", cpu="4"))
    doc = decide(
        *base(a, b),
        running("borrower", "b", "8", priority=100),
        workload("owner").queue("a").priority(0).podset(cpu="4"),
    )
    assert preempted(doc) == {("default/borrower", "InCohortReclamation")}


def test_already_evicted_target_is_not_preempted_again() -> None:
    cq = preempting(cluster_queue("a").flavor("default", cpu="4"))
    evicting = running("low", "a", "4").set(
        "status.conditions",
        [
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": T0},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": T0},
        ],
    )
    doc = decide(*base(cq), evicting, workload("high").queue("a").priority(10).podset(cpu="4"))
    assert preempted(doc) == set()
    assert pending(doc)["default/high"]["reason"] == "WaitingForPreemptedWorkloads"


def test_fair_sharing_admits_the_lower_share_first() -> None:
    config = Manifest("config.kueue.x-k8s.io/v1beta2", "Configuration", None).set(
        "fairSharing", {"enable": True}
    )
    config.body.pop("metadata")
    a = cluster_queue("a").cohort("c").flavor("default", cpu="0")
    b = cluster_queue("b").cohort("c").flavor("default", cpu="0")
    lender = cluster_queue("lender").cohort("c").flavor("default", cpu="10")
    doc = decide(
        config,
        *base(a, b, lender),
        running("a-old", "a", "4"),
        workload("a-new").queue("a").priority(100).created(T0).podset(cpu="4"),
        workload("b-new").queue("b").priority(0).created(T0).podset(cpu="4"),
        cycles=1,
    )
    assert "default/b-new" in admitted(doc)
    assert "default/a-new" not in admitted(doc)


# --- driving the scheduler over time ----------------------------------------------------------------


def test_incremental_submit_finish_and_evict() -> None:
    state = load_state([("state.yaml", documents(*base(cluster_queue("a").flavor("default", cpu="4"))))])
    scheduler = Scheduler(state, config_from_kueue(state.configuration), 0.0)
    first = load_state(
        [("w.yaml", documents(workload("w1").queue("a").created(T0).podset(cpu="4")))]
    ).workloads[0]
    second = load_state(
        [("w.yaml", documents(workload("w2").queue("a").created("2026-01-01T00:00:01Z").podset(cpu="4")))]
    ).workloads[0]
    scheduler.submit(first)
    scheduler.submit(second)
    assert [a.workload for a in scheduler.cycle().admitted] == ["default/w1"]
    assert scheduler.cycle().admitted == []
    assert scheduler.pending_count() == 1
    scheduler.advance(10.0)
    assert scheduler.finish("default/w1")
    assert not scheduler.finish("default/w1")  # idempotent
    assert [a.workload for a in scheduler.cycle().admitted] == ["default/w2"]
    assert scheduler.evict("default/w2", "idle")
    assert scheduler.pending_count() == 1
    assert [a.workload for a in scheduler.cycle().admitted] == ["default/w2"]


@pytest.mark.parametrize(
    ("checkpoints", "min_runtime", "want_victim"),
    [
        pytest.param({}, 0.0, "default/young", id="kueue-order-newest-first"),
        pytest.param({"old": "2026-01-01T09:59:00Z"}, 0.0, "default/old", id="checkpoint-makes-old-cheapest"),
        pytest.param({}, 3600.0, "default/old", id="min-runtime-protects-young"),
    ],
)
def test_checkpoint_aware_preemption(
    checkpoints: dict[str, str], min_runtime: float, want_victim: str
) -> None:
    cq = preempting(cluster_queue("a").flavor("default", cpu="4"))
    old = running("old", "a", "2").set(
        "status.conditions",
        [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    )
    young = running("young", "a", "2").set(
        "status.conditions",
        [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-01-01T09:30:00Z"}],
    )
    for name, when in checkpoints.items():
        (old if name == "old" else young).annotate("gpuplane.dev/last-checkpoint", when)
    incoming = workload("high").queue("a").priority(10).created("2026-01-01T10:00:00Z").podset(cpu="2")
    state = load_state([("state.yaml", documents(*base(cq), old, young, incoming))])
    config = replace(
        config_from_kueue(state.configuration), checkpoint_aware=True, min_runtime_seconds=min_runtime
    )
    plan = schedule(state, config, default_now(state), cycles=1)
    assert [p.workload for p in plan.preempted] == [want_victim]
