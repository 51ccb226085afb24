"""core.session: the long-lived entry point drivers use, fed with events."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

import test_admission_checks as checks
from calls import count_calls
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.core.scheduling.nominator import Nominator
from gpuplane.core.scheduling.waker import Waker
from gpuplane.core.session import CycleOutcome, Reason, Session, WorkloadState
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState, Node, Taint, Workload
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    local_queue,
    namespace,
    node,
    resource_flavor,
    workload,
)

HOST = "kubernetes.io/hostname"
T = 1_767_225_600.0  # 2026-01-01T00:00:00Z


def gpu_node(name: str, gpus: int = 8) -> Manifest:
    return node(name).allocatable(cpu="64", memory="512Gi", gpu=gpus).label(HOST, name)


def queued(name: str, second: int, count: int = 1, gpu: int = 8) -> Manifest:
    return (
        workload(name)
        .queue("q")
        .created(f"2026-01-01T00:00:{second:02}Z")
        .podset(count=count, cpu="1", gpu=gpu)
    )


def cluster(*extra: Manifest, nodes: int = 2, quota_gpus: int = 64) -> ClusterState:
    objects = [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("q").flavor("default", cpu="1000", gpu=quota_gpus),
        local_queue("q", "default", "q"),
        *(gpu_node(f"n{i}") for i in range(1, nodes + 1)),
        *extra,
    ]
    return load_state([("state.yaml", documents(*objects))])


def session(state: ClusterState) -> Session:
    return Session(state, config_from_kueue(state.configuration), T)


def one(state: ClusterState, name: str) -> Workload:
    return next(w for w in state.workloads if w.name == name)


def devices(plan_admitted: object) -> dict[str, list[tuple[str, tuple[str, ...]]]]:
    out: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for a in plan_admitted:  # type: ignore[attr-defined]
        out[a.workload] = [(p.node, p.devices) for ps in a.pod_sets for p in ps.placement or ()]
    return out


def test_submit_cycle_admits_with_device_placement_and_history() -> None:
    state = cluster()
    s = session(state)
    later = load_state([("w.yaml", documents(queued("late", 5, count=2)))])
    s.submit(one(later, "late"), T + 1)
    plan = s.cycle(T + 2)
    assert devices(plan.admitted) == {
        "default/late": [("n1", tuple(str(i) for i in range(8))), ("n2", tuple(str(i) for i in range(8)))]
    }
    life = s.lifecycle("default/late")
    assert life is not None
    assert [(st.state, st.reason, st.time) for st in life.history] == [
        (WorkloadState.PENDING, Reason.QUEUED, T + 1),
        (WorkloadState.ADMITTED, Reason.ADMITTED, T + 2),
    ]
    assert [a.workload for a in s.admitted()] == ["default/late"]
    (usage,) = s.usage()
    assert usage.used[("default", "nvidia.com/gpu")] == 16
    assert usage.admitted == 1


def test_finish_frees_capacity_for_the_next_and_is_idempotent() -> None:
    s = session(cluster(queued("a", 1, count=2), queued("b", 2, count=2)))
    first = s.drain(T)
    assert [a.workload for a in first.admitted] == ["default/a"]
    assert {p.workload: p.reason for p in first.pending} == {"default/b": Reason.WAITING_FOR_GANG_CAPACITY}
    assert s.finish("default/a", T + 10)
    assert not s.finish("default/a", T + 11)
    second = s.drain(T + 12)
    assert [a.workload for a in second.admitted] == ["default/b"]
    life_a = s.lifecycle("default/a")
    assert life_a is not None
    assert life_a.state == WorkloadState.FINISHED


def test_evict_requeues_with_reason() -> None:
    s = session(cluster(queued("a", 1)))
    s.drain(T)
    assert s.evict("default/a", T + 5, Reason.INACTIVE_WORKLOAD, "idle")
    assert not s.evict("default/a", T + 6, Reason.INACTIVE_WORKLOAD, "idle")
    life = s.lifecycle("default/a")
    assert life is not None
    assert (life.state, life.reason) == (WorkloadState.PENDING, Reason.INACTIVE_WORKLOAD)
    assert [a.workload for a in s.drain(T + 7).admitted] == ["default/a"]


def test_node_down_evicts_and_holds_capacity_until_up() -> None:
    s = session(cluster(queued("a", 1), nodes=1))
    s.drain(T)
    assert s.node_down("n1", T + 1) == ("default/a",)
    assert s.node_down("n1", T + 2) == ()  # already down
    life = s.lifecycle("default/a")
    assert life is not None
    assert (life.state, life.reason, life.history[-1].message) == (
        WorkloadState.PENDING,
        Reason.NODE_FAILURES,
        "node n1 failed",
    )
    assert s.drain(T + 3).admitted == ()  # its capacity is held while the node is down
    assert s.node_up("n1", T + 4)
    assert not s.node_up("n1", T + 5)
    assert [a.workload for a in s.drain(T + 6).admitted] == ["default/a"]


def test_withdraw_deletes_a_pending_workload() -> None:
    s = session(cluster(queued("a", 1), queued("b", 2), nodes=1))
    s.drain(T)
    assert s.withdraw("default/b", T + 1)
    assert not s.withdraw("default/b", T + 2)
    life = s.lifecycle("default/b")
    assert life is not None
    assert life.state == WorkloadState.DELETED
    assert [p.workload for p in s.pending()] == []


def test_node_changed_taint_keeps_new_gangs_off() -> None:
    state = cluster(nodes=1)
    s = session(state)
    (n1,) = state.nodes
    tainted = Node(
        name=n1.name,
        allocatable=n1.allocatable,
        labels=n1.labels,
        taints=(Taint("maintenance", "", "NoSchedule"),),
        annotations=n1.annotations,
    )
    s.node_changed(tainted, T + 1)
    later = load_state([("w.yaml", documents(queued("late", 5)))])
    s.submit(one(later, "late"), T + 2)
    plan = s.drain(T + 3)
    assert plan.admitted == ()
    assert {p.workload: p.reason for p in plan.pending} == {"default/late": "UntoleratedTaint"}


@dataclass(frozen=True)
class DrainCase:
    id: str
    workloads: int
    stop_after_first: bool
    want_admitted: int


@pytest.mark.parametrize(
    "case",
    [DrainCase("to-fixed-point", 3, False, 2), DrainCase("stop-rule", 3, True, 1)],
    ids=lambda c: c.id,
)
def test_drain_stop_rule(case: DrainCase) -> None:
    s = session(cluster(*(queued(f"w{i}", i) for i in range(case.workloads))))
    plan = s.drain(T, stop=(lambda result: bool(result.admitted)) if case.stop_after_first else None)
    assert len(plan.admitted) == case.want_admitted


def test_drain_equals_the_pure_schedule() -> None:
    state = cluster(*(queued(f"w{i}", i, count=1 + i % 2, gpu=4) for i in range(6)), nodes=3)
    pure = schedule(state, config_from_kueue(state.configuration), T, cycles=None)
    drained = session(state).drain(T)
    assert devices(drained.admitted) == devices(pure.admitted)
    assert [(p.workload, p.reason) for p in drained.pending] == [(p.workload, p.reason) for p in pure.pending]


def test_run_cycles_decides_as_drain() -> None:
    """The count-only drain runs the same cycles, to the same decisions, as :meth:`drain`."""
    state = cluster(*(queued(f"w{i}", i, count=1 + i % 2, gpu=4) for i in range(6)), nodes=3)
    planned, counted = session(state), session(state)
    seen: list[str] = []

    def note(outcome: CycleOutcome) -> bool:
        seen.extend(d.workload for d in outcome.admitted)
        return False

    plan = planned.drain(T)
    ran = counted.run_cycles(T, stop=note)
    assert ran == plan.cycles > 1
    assert sorted(seen) == sorted(d.workload for d in plan.admitted)
    left = [(p.workload, p.reason) for p in plan.pending]
    assert [(p.workload, p.reason) for p in counted.pending()] == left
    assert counted.run_cycles(T + 1, max_cycles=2, until_quiet=False) == 2
    with pytest.raises(ValueError, match="backwards"):
        counted.run_cycles(T)


def test_checkpoint_and_time() -> None:
    s = session(cluster(queued("a", 1)))
    s.drain(T)
    assert s.record_checkpoint("default/a", T - 30)
    assert not s.record_checkpoint("default/none", T)
    with pytest.raises(ValueError, match="backwards"):
        s.cycle(T - 1)


def test_exact_cycles_and_pending_left_out() -> None:
    state = cluster(*(queued(f"w{i}", i) for i in range(4)), nodes=1)
    s = session(state)
    plan = s.drain(T, max_cycles=3, until_quiet=False, with_pending=False)
    pure = schedule(state, config_from_kueue(state.configuration), T, cycles=3)
    assert plan.cycles == pure.cycles == 3
    assert devices(plan.admitted) == devices(pure.admitted)
    assert plan.pending == ()
    assert s.has_pending()
    gang = [p.workload for p in pure.pending if p.reason == Reason.WAITING_FOR_GANG_CAPACITY]
    assert gang  # some were tried and found no place; the last one was not tried yet
    assert len(gang) < len(pure.pending)
    assert s.reasons.waiting_for({Reason.WAITING_FOR_GANG_CAPACITY}) == gang


def test_watched_reasons_name_every_workload_whose_reason_changed() -> None:
    state = cluster(*(queued(f"w{i}", i) for i in range(4)), nodes=1, quota_gpus=16)
    s = session(state)
    watched = s.reasons.watch()
    assert watched == {f"default/w{i}" for i in range(4)}  # every workload queued at the start
    watched.clear()
    plan = s.drain(T)
    admitted = {a.workload for a in plan.admitted}
    assert len(admitted) == 1  # one node of 8 GPUs
    waiting = {f"default/w{i}" for i in range(4)} - admitted
    assert watched == admitted | waiting  # admitted (reason gone) and tried (reason written)
    assert [s.reasons.reason_of(k) for k in sorted(admitted)] == [None]
    assert {s.reasons.reason_of(k) for k in waiting} <= {
        Reason.WAITING_FOR_QUOTA,
        Reason.WAITING_FOR_GANG_CAPACITY,
    }
    assert sorted(waiting) == sorted(s.reasons.waiting_for({s.reasons.reason_of(k) for k in waiting}))
    watched.clear()
    s.withdraw("default/w3", T + 1)
    assert watched == {"default/w3"}
    assert s.reasons.reason_of("default/w3") is None
    assert s.reasons.reason_of("default/nobody") is None


def test_update_requeues_a_pending_workload_with_its_new_spec() -> None:
    s = session(cluster(queued("big", 1, count=3), nodes=2))
    assert s.drain(T).admitted == ()
    smaller = load_state([("w.yaml", documents(queued("big", 1, count=2)))])
    s.update(one(smaller, "big"), T + 1)
    assert [a.workload for a in s.drain(T + 2).admitted] == ["default/big"]
    with pytest.raises(ValueError, match="already known"):
        s.submit(one(smaller, "big"), T + 3)


def test_preempted_victim_goes_back_to_pending_with_the_preemption_reason() -> None:
    state = load_state(
        [
            (
                "state.yaml",
                documents(
                    namespace("default"),
                    resource_flavor("default"),
                    cluster_queue("q")
                    .flavor("default", cpu="1000", gpu=8)
                    .set("spec.preemption.withinClusterQueue", "LowerPriority"),
                    local_queue("q", "default", "q"),
                    gpu_node("n1"),
                    queued("low", 1).priority(1),
                ),
            )
        ]
    )
    s = session(state)
    assert [a.workload for a in s.drain(T).admitted] == ["default/low"]
    later = load_state([("w.yaml", documents(queued("high", 2).priority(100)))])
    s.submit(one(later, "high"), T + 1)
    plan = s.drain(T + 2)
    assert [(p.workload, p.preemptor) for p in plan.preempted] == [("default/low", "default/high")]
    low = s.lifecycle("default/low")
    assert low is not None
    steps = [(st.state, st.reason) for st in low.history]
    assert (WorkloadState.ADMITTED, Reason.ADMITTED) in steps
    assert (WorkloadState.PENDING, Reason.PREEMPTED) in steps
    assert low.history[steps.index((WorkloadState.PENDING, Reason.PREEMPTED))].message == "InClusterQueue"


@dataclass(frozen=True)
class CheckCase:
    id: str
    objects: list[Manifest]
    want_path: list[tuple[WorkloadState, Reason]]


CHECK_CASES = [
    CheckCase(
        "checks-pending-reserve-quota",
        checks.base(checks.gang("train")),
        [(WorkloadState.PENDING, Reason.QUEUED), (WorkloadState.QUOTA_RESERVED, Reason.QUOTA_RESERVED)],
    ),
    CheckCase(
        "checks-ready-admit",
        checks.base(checks.reserved(checks.gang("train"), {"prov": "Ready"})),
        [
            (WorkloadState.PENDING, Reason.QUEUED),
            (WorkloadState.QUOTA_RESERVED, Reason.QUOTA_RESERVED),
            (WorkloadState.ADMITTED, Reason.ADMITTED),
        ],
    ),
    CheckCase(
        "retry-releases-and-requeues",
        checks.base(checks.reserved(checks.gang("train"), {"prov": "Retry"})),
        [
            (WorkloadState.PENDING, Reason.QUEUED),
            (WorkloadState.QUOTA_RESERVED, Reason.QUOTA_RESERVED),
            (WorkloadState.PENDING, Reason.ADMISSION_CHECK),
            # Queued again, it reserves quota again in the same cycle: its checks start over.
            (WorkloadState.QUOTA_RESERVED, Reason.QUOTA_RESERVED),
        ],
    ),
    CheckCase(
        "rejected-deactivates",
        checks.base(checks.reserved(checks.gang("train"), {"prov": "Rejected"})),
        [
            (WorkloadState.PENDING, Reason.QUEUED),
            (WorkloadState.QUOTA_RESERVED, Reason.QUOTA_RESERVED),
            (WorkloadState.PENDING, Reason.DEACTIVATED),
        ],
    ),
]


@pytest.mark.parametrize("case", CHECK_CASES, ids=lambda c: c.id)
def test_admission_checks_move_the_lifecycle(case: CheckCase) -> None:
    state = load_state([("state.yaml", documents(*case.objects))])
    s = Session(state, config_from_kueue(state.configuration), T)
    s.drain(T, max_cycles=2, until_quiet=False)
    life = s.lifecycle("default/train")
    assert life is not None
    got = [(st.state, st.reason) for st in life.history]
    # Pending reason updates in between are recorded too; the moves between states are the path.
    moves = [step for i, step in enumerate(got) if i == 0 or step[0] != got[i - 1][0]]
    assert moves == case.want_path


def test_a_workload_evicted_before_the_session_starts_is_evicting_with_its_reason() -> None:
    wl = checks.gang("train")
    wl.admitted(
        "gpu",
        {
            "name": "main",
            "count": 2,
            "flavors": {"nvidia.com/gpu": "h100"},
            "resourceUsage": {"nvidia.com/gpu": "8"},
        },
    )
    wl.set(
        "status.conditions",
        [
            {
                "type": "QuotaReserved",
                "status": "True",
                "reason": "QuotaReserved",
                "lastTransitionTime": checks.T0,
            },
            {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": checks.T0},
            {
                "type": "Evicted",
                "status": "True",
                "reason": "IdleReclaimed",
                "message": "idle for 2h",
                "lastTransitionTime": checks.T0,
            },
        ],
    )
    state = load_state([("state.yaml", documents(*checks.base(wl, queues=(checks.gpu_queue(),))))])
    s = Session(state, config_from_kueue(state.configuration), T)
    life = s.lifecycle("default/train")
    assert life is not None
    assert (life.state, life.reason, life.history[-1].message) == (
        WorkloadState.EVICTING,
        Reason.IDLE_RECLAIMED,
        "idle for 2h",
    )
    assert s.finish("default/train", T + 1)  # its pods are gone and the job completed meanwhile
    life = s.lifecycle("default/train")
    assert life is not None
    assert life.state == WorkloadState.FINISHED


def test_without_history_the_plans_are_the_same_and_no_lifecycle_is_kept() -> None:
    state = cluster(*(queued(f"w{i}", i, count=1 + i % 2, gpu=4) for i in range(6)), nodes=3)
    config = config_from_kueue(state.configuration)
    with_history = Session(state, config, T).drain(T)
    bare = Session(state, config, T, history=False)
    assert bare.drain(T) == with_history
    assert bare.lifecycle("default/w0") is None
    assert bare.finish(with_history.admitted[0].workload, T + 1)


def _borrowing_pair() -> ClusterState:
    """Queues ``a`` (2 GPUs) and ``b`` (6 GPUs) in one cohort, on one 8-GPU node; ``b`` runs 4 + 2
    GPUs, ``a`` 2, and ``a``'s ``big`` (4 GPUs) can only borrow what ``b`` leaves unused."""
    objects = [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("a").cohort("c").flavor("default", cpu="100", gpu=2),
        cluster_queue("b").cohort("c").flavor("default", cpu="100", gpu=6),
        local_queue("la", "default", "a"),
        local_queue("lb", "default", "b"),
        gpu_node("n1"),
    ]
    runs = (("b1", "lb", 1, 4), ("b2", "lb", 2, 2), ("a1", "la", 3, 2), ("big", "la", 4, 4))
    for name, queue, second, gpus in runs:
        objects.append(
            workload(name).queue(queue).created(f"2026-01-01T00:00:{second:02}Z").podset(cpu="1", gpu=gpus)
        )
    return load_state([("state.yaml", documents(*objects))])


@pytest.mark.parametrize("by_size", [True, False], ids=["woken-by-size", "woken-by-flavor-only"])
def test_a_release_wakes_work_parked_for_quota_only_when_it_could_let_it_in(
    by_size: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``big`` is parked for quota. ``a1`` ending frees 2 GPUs of ``a``'s own quota: ``a`` can then
    reach 2 + what ``b`` leaves unused (none) = 2 < 4, so ``big`` stays parked, with no
    nomination. ``b2`` ending leaves 2 of ``b``'s quota unused: 4, and ``big`` is admitted. Waking
    by flavor alone (the rule before sizes were looked at) makes the same decisions at one more
    nomination."""
    if not by_size:
        monkeypatch.setattr(Waker, "could_admit_on", lambda *_: True)  # no bound by size
    s = session(_borrowing_pair())
    first = s.drain(T)
    assert sorted(a.workload for a in first.admitted) == ["default/a1", "default/b1", "default/b2"]
    assert {p.workload: p.reason for p in first.pending} == {"default/big": Reason.WAITING_FOR_QUOTA}
    nominations = count_calls(monkeypatch, Nominator, "nominate")
    assert s.finish("default/a1", T + 10)
    second = s.drain(T + 10)
    assert second.admitted == ()
    assert {p.workload: p.reason for p in second.pending} == {"default/big": Reason.WAITING_FOR_QUOTA}
    assert nominations["count"] == (0 if by_size else 1)
    assert s.finish("default/b2", T + 20)
    third = s.drain(T + 20)
    assert [a.workload for a in third.admitted] == ["default/big"]


@pytest.mark.parametrize("by_size", [True, False], ids=["woken-by-size", "woken-by-flavor-only"])
def test_a_release_wakes_work_parked_for_room_only_when_the_nodes_could_hold_it(
    by_size: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``big`` (8 GPUs) fits its quota but not the one 8-GPU node, where ``r1`` holds 6 and ``r2``
    1. ``r2`` ending leaves 2 GPUs free: too few for its pod, so it stays parked with no
    nomination. ``r1`` ending frees the node, and ``big`` is admitted. Waking by flavor alone
    makes the same decisions at one more nomination."""
    if not by_size:
        monkeypatch.setattr(Waker, "could_admit_on", lambda *_: True)  # no bound by size
    s = session(cluster(queued("r1", 1, gpu=6), queued("big", 2, gpu=8), queued("r2", 3, gpu=1), nodes=1))
    first = s.drain(T)
    assert sorted(a.workload for a in first.admitted) == ["default/r1", "default/r2"]
    assert {p.workload: p.reason for p in first.pending} == {"default/big": Reason.WAITING_FOR_GANG_CAPACITY}
    nominations = count_calls(monkeypatch, Nominator, "nominate")
    assert s.finish("default/r2", T + 10)
    second = s.drain(T + 10)
    assert second.admitted == ()
    assert nominations["count"] == (0 if by_size else 1)
    assert s.finish("default/r1", T + 20)
    third = s.drain(T + 20)
    assert [a.workload for a in third.admitted] == ["default/big"]
