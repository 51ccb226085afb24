"""The pure ETA estimates (insight.eta): a pool, and the queues with their quotas, played forward
from expected ends and queue order. Every expected start is worked out by hand in the case."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gpuplane.insight.eta import (
    Ahead,
    Capacity,
    Gang,
    NodeFree,
    NodeReplay,
    Queued,
    Running,
    gang_start,
    predict_start,
    replay_start,
    runtime_curve,
    van_der_corput,
)
from gpuplane.sim import forecast
from gpuplane.sim.metrics import GroupStats
from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job, Request


@dataclass
class Case:
    name: str
    need: float
    capacity: float
    held: float
    releases: list[tuple[float, float]]
    ahead: list[Ahead] = field(default_factory=list)
    backlog: float = 0.0
    want: float | None = 0.0


CASES = [
    Case("fits-now", need=2, capacity=8, held=4, releases=[(50, 4)], want=0),
    Case("waits-for-first-release", need=4, capacity=8, held=6, releases=[(50, 2), (90, 4)], want=50),
    Case(
        "waits-for-enough-releases",
        need=6,
        capacity=8,
        held=8,
        releases=[(50, 2), (90, 4), (300, 2)],
        want=90,
    ),
    Case(
        "queued-work-goes-first",
        need=8,
        capacity=8,
        held=8,
        releases=[(10, 8)],
        ahead=[Ahead(8, 100)],
        want=110,
    ),
    Case(
        "small-queued-work-shares-the-pool",
        need=4,
        capacity=8,
        held=4,
        releases=[(10, 4)],
        ahead=[Ahead(4, 100)],
        want=10,
    ),
    Case(
        "backlog-adds-its-work-over-the-pool", need=1, capacity=8, held=0, releases=[], backlog=800, want=100
    ),
    Case("never-fits", need=9, capacity=8, held=0, releases=[], want=None),
    Case("overdue-work-counts-as-ending-now", need=8, capacity=8, held=8, releases=[(0, 8)], want=0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_predict_start(case: Case) -> None:
    got = predict_start(
        0.0,
        case.need,
        capacity=case.capacity,
        held=case.held,
        releases=iter(case.releases),
        ahead=case.ahead,
        backlog=case.backlog,
    )
    assert got == case.want


def test_releases_are_read_only_as_far_as_needed() -> None:
    read: list[float] = []

    def releases() -> Iterator[tuple[float, float]]:
        for end in (10.0, 20.0, 30.0, 40.0):
            read.append(end)
            yield end, 1.0

    assert predict_start(0.0, 1.0, capacity=2.0, held=2.0, releases=releases()) == 10.0
    assert read == [10.0, 20.0]  # the release used, and one looked ahead


@dataclass
class Replay:
    name: str
    asked: Queued
    capacity: Capacity
    running: list[Running] = field(default_factory=list)
    ahead: list[Queued] = field(default_factory=list)
    backlog: float = 0.0
    want: float | None = 0.0


TWO_TEAMS = Capacity({"p": 8.0}, queue_limit={"a": 4.0, "b": 4.0}, preemption=False)
COHORT = Capacity({"p": 8.0}, nominal={("a", "p"): 4.0, ("b", "p"): 4.0})

REPLAYS = [
    Replay("fits-now", Queued("a", ("p",), 2, 50), Capacity({"p": 8.0}), [Running(100, "p", "b", 4)], want=0),
    # The pool has room, the namespace quota does not: the team's own work must end first (t=100).
    Replay(
        "quota-binds-before-the-pool",
        Queued("a", ("p",), 2, 50),
        TWO_TEAMS,
        [Running(100, "p", "a", 4)],
        want=100,
    ),
    # Another team's queue, held back by its own quota, does not delay this one.
    Replay(
        "another-teams-queue-waits-on-its-own-quota",
        Queued("a", ("p",), 2, 50),
        TWO_TEAMS,
        [Running(100, "p", "b", 4)],
        ahead=[Queued("b", ("p",), 4, 500), Queued("b", ("p",), 4, 500)],
        want=0,
    ),
    # FIFO in the team: the item ahead starts at 100 (when a's 4 end) and runs 50; then a fits.
    Replay(
        "own-queue-goes-first",
        Queued("a", ("p",), 4, 50),
        TWO_TEAMS,
        [Running(100, "p", "a", 4)],
        ahead=[Queued("a", ("p",), 4, 50)],
        want=150,
    ),
    # BestEffortFIFO: the 4 ahead does not fit in the 2 free, the asked 2 starts past it.
    Replay(
        "small-work-starts-past-a-head-that-does-not-fit",
        Queued("a", ("p",), 2, 50),
        Capacity({"p": 8.0}),
        [Running(100, "p", "b", 6)],
        ahead=[Queued("b", ("p",), 4, 50)],
        want=0,
    ),
    # Of b's three items ahead, the 4s do not fit in the 3 free, the 2 behind them does: the pool
    # keeps 1 free until b's 5 end at 100; then the first 4 starts (2 left) and a's 2 fits.
    Replay(
        "a-smaller-item-of-a-kind-with-no-room-still-starts",
        Queued("a", ("p",), 2, 50),
        Capacity({"p": 8.0}),
        [Running(100, "p", "b", 5)],
        ahead=[Queued("b", ("p",), 4, 50), Queued("b", ("p",), 4, 50), Queued("b", ("p",), 2, 500)],
        want=100,
    ),
    # Work ahead that could never fit its pool is left out.
    Replay(
        "work-ahead-that-never-fits-is-left-out",
        Queued("a", ("p",), 8, 50),
        Capacity({"p": 8.0}),
        ahead=[Queued("b", ("p",), 9, 50)],
        want=0,
    ),
    # The first pool is full until 300, the second frees at 100.
    Replay(
        "any-pool-of-its-own",
        Queued("a", ("p", "q"), 4, 50),
        Capacity({"p": 4.0, "q": 4.0}),
        [Running(100, "q", "b", 4), Running(300, "p", "b", 4)],
        want=100,
    ),
    # b borrows 4 of a's nominal 4: a may reclaim it at once.
    Replay("reclaim-borrowed-quota", Queued("a", ("p",), 4, 50), COHORT, [Running(900, "p", "b", 8)], want=0),
    # Reclaim only while a stays within its nominal: a already holds 2, asks 4 > 4 - 2; waits for b (900).
    Replay(
        "no-reclaim-above-nominal",
        Queued("a", ("p",), 4, 50),
        COHORT,
        [Running(900, "p", "b", 6), Running(1000, "p", "a", 2)],
        want=900,
    ),
    # Without borrowing (flavor limit = nominal) a's own 4 must end first.
    Replay(
        "flavor-limit",
        Queued("a", ("p",), 2, 50),
        Capacity({"p": 8.0}, flavor_limit={("a", "p"): 4.0}),
        [Running(100, "p", "a", 4)],
        want=100,
    ),
    # The backlog drains at what a's queue can hold at once: 1,000 GPU-s over its quota of 4 = 250.
    Replay("backlog-over-the-queue-quota", Queued("a", ("p",), 1, 50), TWO_TEAMS, backlog=1000, want=250),
    Replay("never-fits-its-quota", Queued("a", ("p",), 5, 50), TWO_TEAMS, want=None),
    Replay(
        "overdue-work-ends-now",
        Queued("a", ("p",), 8, 50),
        Capacity({"p": 8.0}),
        [Running(-5, "p", "b", 8)],
        want=0,
    ),
]


@pytest.mark.parametrize("case", REPLAYS, ids=lambda c: c.name)
def test_replay_start(case: Replay) -> None:
    used = [(r.pool, r.queue, r.amount) for r in case.running]
    got = replay_start(
        0.0,
        case.asked,
        capacity=case.capacity,
        used=used,
        releases=iter(sorted(case.running, key=lambda r: r.end)),
        ahead=case.ahead,
        backlog=case.backlog,
    )
    assert got == case.want


def test_a_job_the_scheduler_just_tried_starts_no_earlier_than_the_next_end() -> None:
    """A pool of 8 with 4 in use (ends at 100 and 300): a bucket shows room for 2 at once, but
    the scheduler just tried the job and it did not start (the nodes had no room in one piece).
    Tried, nothing starts before the first end: the item ahead (2 GPUs) and the job both start
    at 100. With nothing running, a job tried at ``now`` that did not start has no ETA."""
    running = [Running(100, "p", "b", 2), Running(300, "p", "b", 2)]

    def start(tried: bool, runs: list[Running]) -> float | None:
        return replay_start(
            0.0,
            Queued("a", ("p",), 2, 50),
            capacity=Capacity({"p": 8.0}),
            used=[(r.pool, r.queue, r.amount) for r in runs],
            releases=iter(runs),
            ahead=[Queued("b", ("p",), 2, 500)],
            tried=tried,
        )

    assert start(False, running) == 0
    assert start(True, running) == 100
    assert start(True, []) is None


def test_replay_extrapolates_after_its_step_limit() -> None:
    """Three items of 4 x 100 s ahead on a pool of 4, one step past the limit: the first starts at 0,
    the second at its end (100); at the second's end (200) the replay stops and counts the third's
    400 GPU-s over the pool of 4: 200 + 100 = 300."""
    ahead = [Queued("a", ("p",), 4, 100)] * 3
    got = replay_start(
        0.0,
        Queued("a", ("p",), 4, 10),
        capacity=Capacity({"p": 4.0}),
        used=[],
        releases=[],
        ahead=ahead,
        max_steps=1,
    )
    assert got == 300
    exact = replay_start(
        0.0, Queued("a", ("p",), 4, 10), capacity=Capacity({"p": 4.0}), used=[], releases=[], ahead=ahead
    )
    assert exact == 300  # played to the end, the same: 0, 100, 200 for the three, 300 for the asked


def test_lower_priority_work_is_left_out_by_the_caller() -> None:
    """With nothing of its priority running, the pool is free (what is lower gives way)."""
    assert replay_start(0.0, Queued("a", ("p",), 8, 10), capacity=COHORT, used=[], releases=[]) == 0


@pytest.mark.parametrize(
    ("finished", "running", "want"),
    [
        ([10.0, 20.0], [], 15.0),  # no running work: the plain mean
        # 10 finished; the other runs 30 s so far: S = 1 to 10, 1/2 to 30: 10 + 10 = 20.
        ([10.0], [30.0], 20.0),
        # Three at risk at 10: S = 2/3 to 20, then 1/3 to 40 (the runner): 10 + 20/3 + 20/3.
        ([10.0, 20.0], [40.0], 10.0 + 40.0 / 3),
        ([10.0], [10.0], 10.0),  # a run censored at a finished runtime was at risk then
        ([], [50.0], None),
    ],
)
def test_runtime_curve_mean(finished: list[float], running: list[float], want: float | None) -> None:
    curve = runtime_curve(finished, running)
    assert (curve.mean if curve is not None else None) == pytest.approx(want)


def test_runtime_curve_remaining_grows_with_age_for_a_long_tail() -> None:
    """Runtimes 10, 10, 10 and 1,000: a fresh run has 257.5 s to go on average; one that ran past
    10 is the long one and has 1,000 - 20 = 980 left at age 20; past the longest seen, nothing."""
    curve = runtime_curve([10.0, 10.0, 10.0, 1000.0], [])
    assert curve is not None
    assert curve.mean == pytest.approx(257.5)
    assert curve.remaining(5.0) == pytest.approx(252.5)  # still one in four long: 5 + 990/4 = 252.5
    assert curve.remaining(20.0) == pytest.approx(980.0)
    assert curve.remaining(2000.0) == 0.0


def gang(queue: str, nodes: int = 1, order: float = 0.0, duration: float = 100.0, priority: int = 0) -> Gang:
    return Gang(queue, ("p",), nodes, priority, order, duration)


@dataclass
class GangCase:
    name: str
    asked: Gang
    free: int = 0
    ends: list[float] = field(default_factory=list)
    queued: list[Gang] = field(default_factory=list)
    usage: dict[tuple[str, str], float] = field(default_factory=dict)
    nominal: dict[tuple[str, str], float] = field(default_factory=dict)
    want: float | None = 0.0


ASKED = gang("a", order=99.0)
GANG_CASES = [
    GangCase("a-free-node", ASKED, free=1, ends=[50.0], want=0.0),
    GangCase("waits-for-a-node", ASKED, ends=[50.0, 80.0], want=50.0),
    GangCase("two-nodes-at-once", gang("a", nodes=2, order=99.0), ends=[50.0, 80.0, 90.0], want=80.0),
    GangCase("a-free-node-and-a-release", gang("a", nodes=2, order=99.0), free=1, ends=[50.0], want=50.0),
    # The gang queued first takes the node freed at 50; the asked one the next, at 80.
    GangCase("queued-first-goes-first", ASKED, ends=[50.0, 80.0], queued=[gang("b", order=1.0)], want=80.0),
    # b's first gang asks two nodes: it cannot fit the one node free at 50, so it stays parked and
    # b's next gang, queued before the asked one, takes the node.
    GangCase(
        "a-gang-that-cannot-fit-is-passed-over",
        ASKED,
        ends=[50.0, 80.0],
        queued=[gang("b", nodes=2, order=1.0), gang("b", order=2.0)],
        want=80.0,
    ),
    # In its own queue, the two-node head lets the asked gang behind it start (in the next cycle).
    GangCase(
        "best-effort-in-its-own-queue",
        ASKED,
        ends=[50.0, 80.0],
        queued=[gang("a", nodes=2, order=1.0)],
        want=50.0,
    ),
    # a is within its nominal, b borrows: a goes first though b queued earlier.
    GangCase(
        "within-nominal-first",
        ASKED,
        ends=[50.0, 80.0],
        queued=[gang("b", order=1.0)],
        usage={("b", "p"): 8.0},
        nominal={("a", "p"): 8.0, ("b", "p"): 8.0},
        want=50.0,
    ),
    # Higher priority first, whatever the order.
    GangCase(
        "priority-first",
        gang("a", order=1.0),
        ends=[50.0, 80.0],
        queued=[gang("b", order=99.0, priority=10)],
        want=80.0,
    ),
    # The gang ahead starts at 50 on the only node and runs 30: the asked one starts at 80.
    GangCase(
        "a-started-gang-frees-its-nodes",
        ASKED,
        ends=[50.0],
        queued=[gang("b", order=1.0, duration=30.0)],
        want=80.0,
    ),
    GangCase("no-node-ever", ASKED, want=None),
]


@pytest.mark.parametrize("case", GANG_CASES, ids=lambda c: c.name)
def test_gang_start(case: GangCase) -> None:
    world = NodeReplay(
        free={"p": case.free} if case.free else {},
        releases=[NodeFree(end, "p") for end in case.ends],
        queued=case.queued,
        usage=case.usage,
        nominal=case.nominal,
        node_size=8.0,
    )
    got = gang_start(0.0, case.asked, world)
    assert got == case.want


@pytest.mark.parametrize(
    ("capacity", "usage", "want"),
    [
        # The pool's quota (16) is all used; a within its nominal (8) of it takes b's node, b
        # borrowing (16 of nominal 8): at once.
        ({"p": 16.0}, {("b", "p"): 16.0}, 0.0),
        # Room in quota (32): no preemption; a waits for a node (b's first, at 500).
        ({"p": 32.0}, {("b", "p"): 16.0}, 500.0),
        # b within its nominal: nothing to reclaim.
        ({"p": 16.0}, {("b", "p"): 8.0, ("c", "p"): 8.0}, 500.0),
        # No capacity given: no reclaim.
        (None, {("b", "p"): 16.0}, 500.0),
    ],
)
def test_gang_start_reclaims_nodes_of_borrowing_queues(
    capacity: dict[str, float] | None, usage: dict[tuple[str, str], float], want: float
) -> None:
    releases = [
        NodeFree(500.0, "p", "b", 8.0),
        NodeFree(900.0, "p", "b" if ("c", "p") not in usage else "c", 8.0),
    ]
    nominal = {("a", "p"): 8.0, ("b", "p"): 8.0, ("c", "p"): 8.0}
    got = gang_start(0.0, ASKED, NodeReplay({}, releases, [], usage, nominal, 8.0, capacity))
    assert got == want


def test_gang_start_draws_runs_from_the_curve() -> None:
    """A class that ran 10 s or 30 s, half each: the first gang started in a replay runs the
    curve's median (10 s), the second its first quartile (10 s), the third its third (30 s). Three
    gangs ahead on one node freed at 0: they end at 10, 20 and 50; the asked one starts at 50."""
    curve = runtime_curve([10.0, 30.0], [])
    assert curve is not None
    assert [curve.quantile(van_der_corput(k)) for k in (1, 2, 3)] == [10.0, 10.0, 30.0]
    ahead = [Gang("b", ("p",), 1, 0, float(k), 1000.0, curve) for k in range(3)]
    got = gang_start(0.0, ASKED, NodeReplay({"p": 1}, [], ahead, {}, {}, 8.0))
    assert got == 50.0


def test_gang_start_extrapolates_after_its_step_limit() -> None:
    """Two free nodes, four gangs ahead in the asked one's queue, running 100, 300, 300 and 300 s.
    Played to the end: the
    first two start at 0, the third at 100, the fourth at 300, and at 400 the asked one. With one
    release played (at 100, the third starts) and the next at 300, the fourth's 300 node-seconds
    are spread over the two nodes: 300 + 150 = 450."""
    ahead = [gang("b", order=float(k), duration=d) for k, d in enumerate((100.0, 300.0, 300.0, 300.0))]

    def start(max_steps: int) -> float | None:
        world = NodeReplay({"p": 2}, [], ahead, {}, {}, 8.0)
        return gang_start(0.0, gang("b", order=99.0), world, max_steps=max_steps)

    assert start(256) == 400.0
    assert start(1) == 450.0


def test_van_der_corput_spreads_evenly() -> None:
    assert [van_der_corput(k) for k in range(1, 8)] == [0.5, 0.25, 0.75, 0.125, 0.625, 0.375, 0.875]


def _run(job_id: int, pods: int, gpus: int, duration: float) -> JobRun:
    job = Job(
        job_id,
        f"j{job_id}",
        "a",
        "c",
        "normal",
        0.0,
        pods,
        Request(gpus=gpus),
        ("p",),
        duration,
        0.0,
        1.0,
        duration,
    )
    return JobRun(
        job, GroupStats(), float(gpus), 1.0, 0, pools=frozenset({"p"}), pool="p", expected_end=duration
    )


@pytest.mark.parametrize(
    ("asked_gpus", "want"),
    [
        # A one-GPU job: the backlog is the one-GPU job ahead (100 GPU-s; the eight-GPU one waits
        # for eight to free at once and lets it pass), drained at the 4 GPUs team a runs now.
        (1, 25.0),
        # An eight-GPU job: both ahead (8,100 GPU-s) at 4 GPUs, once a's 4 GPUs end at 100.
        (8, 100.0 + 8100.0 / 4),
    ],
)
def test_backlog_counts_work_no_larger_per_pod_at_the_rate_the_queue_runs(
    monkeypatch: pytest.MonkeyPatch, asked_gpus: int, want: float
) -> None:
    monkeypatch.setattr(forecast, "LISTED_PER_QUEUE", 0)  # every queued job is backlog
    book = forecast.Book()
    book.add_running(_run(1, 4, 1, 100.0))  # a runs 4 GPUs, expected to end at 100
    book.add_pending(_run(2, 1, 8, 1000.0), 1000.0)
    book.add_pending(_run(3, 1, 1, 100.0), 100.0)
    capacity = Capacity({"p": 8.0}, queue_limit={"a": 8.0}, preemption=False)
    got = book.estimate(_run(4, 1, asked_gpus, 50.0), 50.0, capacity, 0.0)
    assert got == pytest.approx(want)


def test_remaining_at_a_level_given_the_age() -> None:
    """Runs of 10, 20, 30 and 40 s, and one still running at 50 s (censored): of the runs that
    reached 15 s, half have ended by 30 s (15 s more); the one that outlives every finished run
    is past what the curve can tell."""
    curve = runtime_curve([10.0, 20.0, 30.0, 40.0], [50.0])
    assert curve is not None
    assert curve.remaining_at(15.0, 0.5) == 15.0
    assert curve.remaining_at(0.0, 0.2) == 10.0
    assert curve.remaining_at(15.0, 0.9) is None  # one in four that reached 15 s lasts past 50 s
