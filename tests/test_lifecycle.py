"""The workload lifecycle: the transition table, the recorded history, and the reason spellings."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from gpuplane.core.lifecycle import (
    CONDITIONS,
    TERMINAL,
    TRANSITIONS,
    IllegalTransitionError,
    Lifecycle,
    Reason,
    Step,
    WorkloadState,
    can_transition,
)
from gpuplane.model.conditions import ConditionType, condition, with_conditions
from gpuplane.model.objects import INTERRUPTED_REASON
from gpuplane.reaper import loop as reaper_loop
from gpuplane.sim import engine as sim_engine

S = WorkloadState


@dataclass(frozen=True)
class Case:
    id: str
    path: tuple[tuple[WorkloadState, Reason], ...]
    want_state: WorkloadState
    want_error: bool = False


CASES = [
    Case("admit-finish", ((S.ADMITTED, Reason.ADMITTED), (S.FINISHED, Reason.SUCCEEDED)), S.FINISHED),
    Case("preempt-requeue-admit", ((S.ADMITTED, Reason.ADMITTED), (S.EVICTING, Reason.PREEMPTED),
                                   (S.PENDING, Reason.QUEUED), (S.ADMITTED, Reason.ADMITTED)), S.ADMITTED),
    Case("node-failure-requeues-at-once", ((S.ADMITTED, Reason.ADMITTED), (S.PENDING, Reason.NODE_FAILURES)),
         S.PENDING),
    Case("withdrawn-while-pending", ((S.PENDING, Reason.WAITING_FOR_QUOTA), (S.DELETED, Reason.DELETED)),
         S.DELETED),
    Case("checks-then-admitted", ((S.QUOTA_RESERVED, Reason.QUOTA_RESERVED), (S.ADMITTED, Reason.ADMITTED)),
         S.ADMITTED),
    Case("check-retry-evicts", ((S.QUOTA_RESERVED, Reason.QUOTA_RESERVED),
                                (S.EVICTING, Reason.ADMISSION_CHECK), (S.PENDING, Reason.WAITING_FOR_CHECKS)),
         S.PENDING),
    Case("reserved-cannot-reserve-again", ((S.QUOTA_RESERVED, Reason.QUOTA_RESERVED),
                                           (S.QUOTA_RESERVED, Reason.WAITING_FOR_CHECKS)),
         S.QUOTA_RESERVED, want_error=True),
    Case("admitted-cannot-go-back-to-reserved", ((S.ADMITTED, Reason.ADMITTED),
                                                 (S.QUOTA_RESERVED, Reason.QUOTA_RESERVED)),
         S.ADMITTED, want_error=True),
    Case("pending-cannot-finish", ((S.FINISHED, Reason.SUCCEEDED),), S.PENDING, want_error=True),
    Case("pending-cannot-be-evicted", ((S.EVICTING, Reason.PREEMPTED),), S.PENDING, want_error=True),
    Case("finished-is-terminal", ((S.ADMITTED, Reason.ADMITTED), (S.FINISHED, Reason.FAILED),
                                  (S.PENDING, Reason.QUEUED)), S.FINISHED, want_error=True),
    Case("deleted-is-terminal", ((S.DELETED, Reason.DELETED), (S.ADMITTED, Reason.ADMITTED)), S.DELETED,
         want_error=True),
    Case("evicting-cannot-be-admitted-again", ((S.ADMITTED, Reason.ADMITTED), (S.EVICTING, Reason.PREEMPTED),
                                               (S.ADMITTED, Reason.ADMITTED)), S.EVICTING, want_error=True),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_paths(case: Case) -> None:
    life = Lifecycle(created=0.0)
    error = False
    for t, (state, reason) in enumerate(case.path, start=1):
        try:
            life.transition(state, float(t), reason)
        except IllegalTransitionError:
            error = True
            break
    assert error == case.want_error
    assert life.state == case.want_state
    # A refused move records nothing: the history is the accepted prefix of the path.
    accepted = len(life.history) - 1
    assert [(s.state, s.reason) for s in life.history[1:]] == list(case.path[:accepted])


def test_every_pair_follows_the_table() -> None:
    for source, to in itertools.product(WorkloadState, repeat=2):
        life = Lifecycle(created=0.0, history=[Step(source, 0.0, Reason.QUEUED)])
        if to in TRANSITIONS[source]:
            life.transition(to, 1.0, Reason.PREEMPTED)
            assert life.state == to
        else:
            with pytest.raises(IllegalTransitionError, match=f"from {source} to {to}"):
                life.transition(to, 1.0, Reason.PREEMPTED)
            assert len(life.history) == 1
        assert can_transition(source, to) == (to in TRANSITIONS[source])


def test_terminal_states_and_reachability() -> None:
    assert {S.FINISHED, S.DELETED} == TERMINAL
    reached = {S.PENDING}
    frontier = [S.PENDING]
    while frontier:
        for to in TRANSITIONS[frontier.pop()]:
            if to not in reached:
                reached.add(to)
                frontier.append(to)
    assert reached == set(WorkloadState)
    # Every non-terminal state can still end.
    assert all(S.DELETED in TRANSITIONS[s] for s in WorkloadState if s not in TERMINAL)


def test_history_records_time_reason_message_and_since() -> None:
    life = Lifecycle(created=5.0)
    assert (life.state, life.reason, life.since) == (S.PENDING, Reason.QUEUED, 5.0)
    life.transition(S.PENDING, 7.0, Reason.WAITING_FOR_QUOTA, "needs 4 GPUs")
    # Reporting the same reason again records nothing.
    again = life.transition(S.PENDING, 9.0, Reason.WAITING_FOR_QUOTA, "needs 4 GPUs")
    assert again == Step(S.PENDING, 7.0, Reason.WAITING_FOR_QUOTA, "needs 4 GPUs")
    assert life.since == 5.0  # still pending since it was created
    life.transition(S.ADMITTED, 10.0, Reason.ADMITTED)
    assert life.since == 10.0
    assert life.history == [
        Step(S.PENDING, 5.0, Reason.QUEUED),
        Step(S.PENDING, 7.0, Reason.WAITING_FOR_QUOTA, "needs 4 GPUs"),
        Step(S.ADMITTED, 10.0, Reason.ADMITTED),
    ]


def test_time_never_runs_backwards() -> None:
    life = Lifecycle(created=10.0)
    with pytest.raises(IllegalTransitionError, match="backwards"):
        life.transition(S.ADMITTED, 9.0, Reason.ADMITTED)
    assert life.state == S.PENDING


@pytest.mark.parametrize(
    ("module", "name", "want"),
    [
        (reaper_loop, "IDLE_REASON", "IdleReclaimed"),
        (sim_engine, "PREEMPTED", "Preempted"),
        (sim_engine, "NODE_FAILURE", "NodeFailures"),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_old_constants_are_the_enum_members(module: object, name: str, want: str) -> None:
    value = getattr(module, name)
    assert value is Reason(want)
    assert value == want
    assert f"{value}" == want


def test_reason_spellings_are_unique() -> None:
    values = [r.value for r in Reason]
    assert len(values) == len(set(values))


def test_model_interrupted_reason_is_the_enum_member() -> None:
    # model cannot import core, so model keeps the spelling and the enum takes its value from it.
    assert Reason(INTERRUPTED_REASON) is Reason.NODE_INTERRUPTED


def test_conditions_follow_the_state() -> None:
    assert set(CONDITIONS) == set(WorkloadState)
    # Admitted implies quota reserved, in every state.
    for state, true in CONDITIONS.items():
        if ConditionType.ADMITTED in true:
            assert ConditionType.QUOTA_RESERVED in true, state
    assert CONDITIONS[S.PENDING] == frozenset()


def test_condition_and_with_conditions() -> None:
    old = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
        {"type": "Custom", "status": "True", "reason": "X"},
        {"type": "Evicted", "status": "True", "reason": "Preempted"},
    ]
    snapshot = [dict(c) for c in old]
    evicted = condition(ConditionType.EVICTED, Reason.IDLE_RECLAIMED, "t1", "idle")
    assert evicted == {
        "type": "Evicted",
        "status": "True",
        "reason": "IdleReclaimed",
        "message": "idle",
        "lastTransitionTime": "t1",
    }
    got = with_conditions(old, evicted, drop=("QuotaReserved",))
    assert [c["type"] for c in got] == ["Custom", "Evicted"]
    assert got[-1]["reason"] == "IdleReclaimed"
    assert old == snapshot  # the input is not modified
    pending = condition(ConditionType.QUOTA_RESERVED, Reason.WAITING_FOR_QUOTA, "t2", status=False)
    assert pending["status"] == "False"


def test_a_condition_set_again_with_the_same_status_keeps_its_transition_time() -> None:
    quota = ConditionType.QUOTA_RESERVED
    pending = condition(quota, Reason.WAITING_FOR_QUOTA, "t1", "no quota", status=False)
    other = condition(ConditionType.QUOTA_RESERVED, Reason.PENDING, "t2", "no node", status=False)
    again = with_conditions([pending], other)
    assert again == [{**other, "lastTransitionTime": "t1"}]  # reason and message new, time kept
    admitted = condition(ConditionType.QUOTA_RESERVED, Reason.QUOTA_RESERVED, "t3", "admitted")
    assert with_conditions(again, admitted) == [admitted]  # a change of status is a transition
