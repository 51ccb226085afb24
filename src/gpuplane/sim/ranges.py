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

The percentiles read are adjusted online so that the share of starts the ranges miss stays at
two in ten (adaptive conformal inference, Gibbs and Candes, NeurIPS 2021): a start outside the
range it was given widens the next ones a step, one inside narrows them by a quarter step. The
spread learned from past predictions holds only while the queues behave as they did; when they
change (a backlog builds, a pool frees) the ranges given meanwhile miss more than two in ten,
and the adjustment follows. Only starts that waited longer than :data:`MEASURED` feed it back:
those are the waits whose ranges users plan by, and the ones the simulator measures the
coverage of (``etaRangeCoverage``).
"""

from __future__ import annotations

import bisect
from collections import deque

LOW, HIGH = 0.10, 0.90  # the range's percentiles of the start
WINDOW = 2000  # the last predictions a range is learned from
LEAST = 20  # predictions learned before the range is read from them
SHORT = 60.0  # seconds: a predicted wait under this is calibrated by the real wait itself
DEFAULT = (0.5, 2.0)  # the range before anything is learned, as multiples of the predicted wait
MISSED = 1.0 - (HIGH - LOW)  # the share of starts a range is meant to miss
STEP = 0.002  # how far one start outside its range moves the levels read (adaptive conformal)
MISSED_BOUNDS = (0.02, 0.5)  # the levels never go past these shares missed
MEASURED = 300.0  # seconds: a start that waited longer than this feeds the adjustment back


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
        # Per kind, the share of starts the levels read now leave out (adaptive, see the module).
        self.missed: dict[str, float] = {}

    def levels(self, kind: str) -> tuple[float, float]:
        """The percentiles of the spread that a range of ``kind`` reads now."""
        missed = self.missed.get(kind)
        if missed is None:  # nothing fed back yet
            return LOW, HIGH
        return missed / 2.0, 1.0 - missed / 2.0

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
        at_low, at_high = self.levels(kind)
        if wait < SHORT:
            spread = self.short.get(kind)
            low = spread.at(at_low) if spread is not None else None
            high = spread.at(at_high) if spread is not None else None
            if low is None or high is None:
                return now, now + max(2.0 * wait, SHORT)
            return now + low, now + high
        spread = self.ratios.get(kind)
        low = spread.at(at_low) if spread is not None else None
        high = spread.at(at_high) if spread is not None else None
        if low is None or high is None:
            low, high = DEFAULT
        return now + wait * low, now + wait * high

    def learn(  # noqa: PLR0913 - the prediction, its start, and the range it was given
        self,
        kind: str,
        asked: float,
        predicted: float,
        started: float,
        *,
        given: tuple[float, float] | None = None,
        waited: float = 0.0,
    ) -> None:
        """A job predicted at ``asked`` to start at ``predicted`` started at ``started``, having
        waited ``waited`` seconds since it was submitted; ``given``: the range it was given then.
        A start that waited longer than :data:`MEASURED` moves the levels (see the module)."""
        if given is not None and waited > MEASURED:
            outside = not given[0] <= started <= given[1]
            # A miss lowers the share left out by a step (wider ranges), a hit raises it by a
            # quarter step: at two misses in ten the two balance.
            missed = self.missed.get(kind, MISSED) + STEP * (MISSED - (1.0 if outside else 0.0)) / (
                1.0 - MISSED
            )
            self.missed[kind] = min(MISSED_BOUNDS[1], max(MISSED_BOUNDS[0], missed))
        wait = max(0.0, predicted - asked)
        real = max(0.0, started - asked)
        if wait < SHORT:
            self.short.setdefault(kind, _Spread()).add(real)
        else:
            self.ratios.setdefault(kind, _Spread()).add(real / wait)
