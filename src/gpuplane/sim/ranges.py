"""The range around an ETA: the 10th to the 90th percentile of the start, learned from how the
ETAs given so far met the starts that followed.

A replay of the queues gives one expected start; the start that follows spreads around it as the
runtimes that were not known spread. :class:`StartRanges` keeps, for the last :data:`WINDOW`
predictions that met their start, the real wait over the predicted wait (a wait predicted under
:data:`SHORT` seconds: the real wait itself), and reads the range of a new ETA from their 10th and
90th percentiles (split conformal prediction, online): over the predictions it learned from, eight
in ten real starts fell inside. Until :data:`LEAST` have been learned, the range is half to twice
the predicted wait. The ETA itself is the median of the same spread (:meth:`StartRanges.centre`).
Each kind of prediction (the queue replay, the node replay of whole-node
gangs) learns apart: their errors differ.
"""

from __future__ import annotations

import bisect
from collections import deque

LOW, HIGH = 0.10, 0.90  # the range's percentiles of the start
WINDOW = 2000  # the last predictions a range is learned from
LEAST = 20  # predictions learned before the range is read from them
SHORT = 60.0  # seconds: a predicted wait under this is calibrated by the real wait itself
DEFAULT = (0.5, 2.0)  # the range before anything is learned, as multiples of the predicted wait


class _Spread:
    """The last :data:`WINDOW` values seen, in arrival order and sorted."""

    __slots__ = ("arrived", "sorted")

    def __init__(self) -> None:
        self.arrived: deque[float] = deque()
        self.sorted: list[float] = []

    def add(self, value: float) -> None:
        self.arrived.append(value)
        bisect.insort(self.sorted, value)
        if len(self.arrived) > WINDOW:
            old = self.arrived.popleft()
            del self.sorted[bisect.bisect_left(self.sorted, old)]

    def at(self, level: float) -> float | None:
        values = self.sorted
        if len(values) < LEAST:
            return None
        return values[min(len(values) - 1, int(level * len(values)))]


class StartRanges:
    """Per kind of prediction, the spread of real waits around the predicted ones: the ratio of
    real to predicted wait (``ratios``) and, for waits predicted shorter than :data:`SHORT`, the
    real waits (``short``)."""

    def __init__(self) -> None:
        self.ratios: dict[str, _Spread] = {}
        self.short: dict[str, _Spread] = {}

    def centre(self, kind: str, now: float, predicted: float) -> float:
        """The median start of a job predicted at ``now`` to start at ``predicted`` by the replay:
        the predicted wait times the median ratio learned (the replay's own bias taken out); for
        a wait predicted shorter than :data:`SHORT`, the median real wait of such predictions
        when longer (a replay that sees room now, where the nodes' fragments or the work that
        arrives later keep the job waiting); ``predicted`` itself before enough are learned."""
        wait = max(0.0, predicted - now)
        if wait < SHORT:
            short = self.short.get(kind)
            middle = short.at(0.5) if short is not None else None
            return predicted if middle is None else now + max(wait, middle)
        spread = self.ratios.get(kind)
        middle = spread.at(0.5) if spread is not None else None
        return predicted if middle is None else now + wait * middle

    def range(self, kind: str, now: float, predicted: float) -> tuple[float, float]:
        """The 10th and 90th percentile of the start of a job predicted at ``now`` to start at
        ``predicted``."""
        wait = max(0.0, predicted - now)
        if wait < SHORT:
            spread = self.short.get(kind)
            low = spread.at(LOW) if spread is not None else None
            high = spread.at(HIGH) if spread is not None else None
            if low is None or high is None:
                return now, now + max(2.0 * wait, SHORT)
            return now + low, now + high
        spread = self.ratios.get(kind)
        low = spread.at(LOW) if spread is not None else None
        high = spread.at(HIGH) if spread is not None else None
        if low is None or high is None:
            low, high = DEFAULT
        return now + wait * low, now + wait * high

    def learn(self, kind: str, asked: float, predicted: float, started: float) -> None:
        """A job predicted at ``asked`` to start at ``predicted`` started at ``started``."""
        wait = max(0.0, predicted - asked)
        real = max(0.0, started - asked)
        if wait < SHORT:
            self.short.setdefault(kind, _Spread()).add(real)
        else:
            self.ratios.setdefault(kind, _Spread()).add(real / wait)
