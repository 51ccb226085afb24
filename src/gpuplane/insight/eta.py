"""When will a pending workload start? A pure estimate from what a scheduler can know.

The estimate treats a pool of capacity as one bucket (GPU-equivalents) and plays the queue
forward::

    free = capacity - held by running work
    for each workload ahead in queue order, then the one asked about:
        wait for the earliest expected releases until it fits; it starts, and releases
        `expected duration` later

Inputs are only what the control plane knows at submission time: the queue order, each
workload's request, and *expected* durations (a declared runtime annotation, or the mean of the
workload's class); never the true run times. Running work past its expected end is taken to end
now. Placement (fragmentation, topology) is ignored, so the estimate is a lower bound when the
pool is fragmented.

Several views can bound one workload (its team's quota, the nodes it may use): the ETA is the
latest of their estimates (:func:`latest_start`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

EPSILON = 1e-9


@dataclass(frozen=True, slots=True)
class Ahead:
    """A workload queued before the one asked about: what it holds once started, for how long."""

    amount: float
    expected_duration: float


def predict_start(  # noqa: PLR0913  the pool as it stands, keyword-only
    now: float,
    need: float,
    *,
    capacity: float,
    held: float,
    releases: Iterable[tuple[float, float]],
    ahead: Sequence[Ahead] = (),
    backlog: float = 0.0,
) -> float | None:
    """Expected start of a workload needing ``need`` of a pool of ``capacity``.

    ``held`` is what running work holds now; ``releases`` yields ``(expected end, amount)`` of
    that running work in order of expected end (it is read only as far as needed); ``ahead`` is
    queued work in queue order. ``backlog`` is further queued work, in GPU-equivalent seconds,
    not worth playing forward one by one: it is taken to run after ``ahead`` on the whole pool,
    delaying the start by ``backlog / capacity``. Returns ``None`` when the workload can never
    fit (``need > capacity``).
    """
    if need > capacity + EPSILON:
        return None
    free = capacity - held
    t = now
    started: list[tuple[float, float]] = []  # heap of (end, amount) for work started in the estimate
    running = iter(releases)
    next_running = next(running, None)

    def release_one() -> bool:
        nonlocal free, t, next_running
        use_started = bool(started) and (next_running is None or started[0][0] <= next_running[0])
        if use_started:
            end, amount = heapq.heappop(started)
        elif next_running is not None:
            end, amount = next_running
            next_running = next(running, None)
        else:
            return False
        t = max(t, end)
        free += amount
        return True

    for item in ahead:
        amount = min(item.amount, capacity)
        while free + EPSILON < amount:
            if not release_one():
                break
        free -= amount
        heapq.heappush(started, (t + item.expected_duration, amount))
    while free + EPSILON < need:
        if not release_one():
            return None
    return t + (backlog / capacity if capacity > 0 else 0.0)


def latest_start(estimates: Iterable[float | None]) -> float | None:
    """The binding view: the latest estimate, or ``None`` if any view says never."""
    out: float | None = None
    for value in estimates:
        if value is None:
            return None
        out = value if out is None else max(out, value)
    return out
