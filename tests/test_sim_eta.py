"""The pure ETA estimate (insight.eta): a pool played forward from expected ends and queue order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from gpuplane.insight.eta import Ahead, latest_start, predict_start


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


def test_latest_start_is_the_binding_view() -> None:
    assert latest_start([5.0, 20.0, 10.0]) == 20.0
    assert latest_start([5.0, None]) is None
    assert latest_start([]) is None
