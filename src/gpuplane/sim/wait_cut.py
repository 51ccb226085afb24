"""Stop a run as soon as its p95 wait is sure to miss the wait target.

A sweep asks of most runs only whether the p95 wait meets the target. Above a configuration's
capacity the backlog grows for the whole run, and so does the cost of every scheduling cycle: the
runs that miss are the costliest, and most of their time goes to a question already answered.

The answer is certain before the run ends. The waits counted are those of the ``N`` jobs
submitted in the measured window (not the warm-up, not a reaped session's resumption); a job never
started counts its wait up to the window's end, and a job withdrawn before it started (its deadline
passed) is not counted. So at any moment, these jobs will count a wait above the target ``T``:

- every job that started after waiting more than ``T``;
- every job still waiting, with no deadline, that has waited more than ``T`` already.

Call their number ``k``. The p95 of ``n <= N`` waits interpolates between the sorted waits at
``floor(h)`` and ``ceil(h)``, ``h = 0.95 (n - 1)``; both are above ``T`` once ``k >= n - floor(h)``,
which grows with ``n``. So ``k >= N - floor(0.95 (N - 1))`` decides the miss whatever happens
next, and the run stops there (:meth:`WaitCut.decided`, asked every :data:`CHECKS`-th of the
window).

A cut run reports a lower bound for its p95 wait (:meth:`WaitCut.lower_bound`): the p95 of the
started waits, the still-waiting jobs' waits so far, and a zero for every other job of the ``N``.
Each counted job's final wait is at least its figure there, and the jobs left out (withdrawn) only
remove zeros, so the final p95 is at least this one, and it is above ``T``. The run's other figures
cover the window up to the cut (``cut.atSeconds`` in its summary).

How far a run is from the target tells its share of the ``N`` waits over ``T``
(:meth:`WaitCut.over_share`): the p95 meets the target while that share stays under 5 %, so the
auto sweep aims its next loads where it crosses 5 % (:func:`gpuplane.sim.sweep.aim`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

import numpy as np

from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job

QUANTILE = 0.95
CHECKS = 500  # decisions asked per window
ROUNDING = 0.1  # summaries round waits to 0.1 s; a wait counts as over only past this much more
PROJECT_AFTER = 0.5  # of the window: a cut earlier than this projects no share over the target


class WaitCut:
    """Decides, during a run, that its p95 wait misses ``target``.

    Owns the count of started jobs that waited over the target (``over``) and the jobs that may
    still count a wait with no deadline to withdraw them, in submission order (``waiting``; the
    engine submits in time order).
    """

    def __init__(self, target: float, jobs: Iterable[Job]) -> None:
        if not target >= 0:
            raise ValueError(f"wait target must not be negative, got {target}")
        self.target = target
        self.total = sum(1 for job in jobs if job.counts_wait)
        self.need = self.total - math.floor(QUANTILE * (self.total - 1)) if self.total else math.inf
        self.over = 0
        self.waiting: deque[JobRun] = deque()

    def arrived(self, run: JobRun) -> None:
        if run.job.counts_wait and run.job.deadline is None:
            self.waiting.append(run)

    def started(self, run: JobRun, now: float) -> None:
        """``run`` starts for the first time at ``now``."""
        if run.job.counts_wait and now - run.job.submit > self.target + ROUNDING:
            self.over += 1

    def decided(self, now: float) -> bool:
        """Whether the p95 wait is sure to be above the target, from what happened up to ``now``."""
        waiting = self.waiting
        while waiting and (waiting[0].first_start is not None or waiting[0].done):
            waiting.popleft()
        if self.over >= self.need:
            return True
        return self.over + self._aged(now) >= self.need

    def _aged(self, now: float) -> int:
        """The jobs still waiting at ``now`` that have waited more than the target already."""
        since = now - self.target - ROUNDING
        aged = 0
        for run in self.waiting:
            if run.job.submit >= since:
                break
            if run.first_start is None and not run.done:
                aged += 1
        return aged

    def over_share(self, now: float, horizon: float) -> float | None:
        """The share of the counted jobs whose wait is over the target, for a run that ended at
        ``now`` of a window ending at ``horizon``: at the window's end, what it is; at a cut, what
        it was projected to the window's end in proportion to the time run (those jobs have been
        piling up since the window began). None without counted jobs, or for a cut before
        :data:`PROJECT_AFTER` of the window (its backlog grows too fast for the projection to
        say much). The auto sweep aims its next loads with it (:func:`gpuplane.sim.sweep.aim`)."""
        if not self.total or now <= 0 or horizon <= 0:
            return None
        share = (self.over + self._aged(now)) / self.total
        if now >= horizon:
            return share
        if now < PROJECT_AFTER * horizon:
            return None
        return share * horizon / now

    def lower_bound(self, waits: Iterable[float], now: float) -> float:
        """The p95 wait's lower bound at a cut at ``now``; ``waits``: the started jobs' waits."""
        values = list(waits)
        values += [now - r.job.submit for r in self.waiting if r.first_start is None and not r.done]
        values += [0.0] * max(0, self.total - len(values))
        return float(np.percentile(np.asarray(values, dtype=float), QUANTILE * 100))
