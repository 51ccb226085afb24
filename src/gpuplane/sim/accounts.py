"""What one run of the simulator measures: GPU time held, busy, lost, down and stranded; waits.

The engine (:mod:`gpuplane.sim.engine`) decides what happens; it tells the :class:`Accounts` each
thing that happened, and the accounts count it in the run's :class:`~gpuplane.sim.metrics.Ledger`.
Only what happens in the measured window counts (from time 0, after the warm-up; the ledger clips
spans to it).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from gpuplane.core.session import Reason
from gpuplane.sim.metrics import ETA_RELATIVE_MIN_WAIT, GroupStats, Ledger
from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job

if TYPE_CHECKING:
    from gpuplane.sim.engine import Model


class Accounts:
    """The measurements of one run.

    Owns the ledger (per team and class statistics, the allocated and busy series, the run's
    counters), the GPU-equivalents the model holds for jobs now (``held_total``), the nodes that are
    down and since when (``down_since``), and the quota stranded now (``stranded_value``, counted
    from ``stranded_since``). A job's hold (``JobRun.held`` since ``JobRun.held_since``) is counted
    here too.
    """

    def __init__(self, model: Model, ledger: Ledger, start: float) -> None:
        self.model = model
        self.ledger = ledger
        self.held_total = 0.0
        self.down_since: dict[str, float] = {}
        self.stranded_value = 0.0
        self.stranded_since = start

    # --- jobs -----------------------------------------------------------------------------------

    def arrived(self, job: Job, now: float) -> GroupStats:
        """``job`` was submitted (or a reaped session resumed) at ``now``: the statistics of its
        group, with the submission counted."""
        stats = self.ledger.group(job.team, job.klass)
        if now >= 0:
            if job.continuation_of is None:
                stats.submitted += 1
            else:
                stats.resumed += 1
        return stats

    def set_held(self, run: JobRun, level: float, now: float) -> None:
        """The model holds ``level`` GPU-equivalents for ``run`` from ``now``."""
        self.close_hold(run, now)
        self.held_total += level - run.held
        run.held = level

    def close_hold(self, run: JobRun, now: float) -> None:
        """Count ``run``'s hold up to ``now`` (as deadlocked while it does not run)."""
        if run.held > 0:
            span = self.ledger.clip(run.held_since, now)
            if span > 0:
                stats = run.stats
                stats.allocated += run.held * span
                self.ledger.allocated_series.add(run.held_since, now, run.held)
                if run.running_since is None:
                    stats.deadlocked += run.held * span
                    if run.deadlocked:
                        stats.circular += run.held * span
        run.held_since = now

    def first_start(self, run: JobRun, now: float) -> None:
        """``run`` starts for the first time at ``now``: its wait, and the error of its ETA."""
        run.first_start = now
        job = run.job
        submit = job.submit
        if job.counts_wait:
            run.stats.started += 1
            run.stats.waits.append(now - submit)
            if run.predicted is not None:
                error = abs(run.predicted - now)
                run.stats.eta_errors.append(error)
                waited = now - submit
                if waited > ETA_RELATIVE_MIN_WAIT:
                    run.stats.eta_relative_errors.append(error / waited)
                    low, high = run.predicted_low, run.predicted_high
                    run.stats.eta_inside.append(low is not None and high is not None and low <= now <= high)
                    run.stats.eta_bases.append(run.basis)
        elif submit >= 0:
            run.stats.resume_waits.append(now - submit)

    def close_run(self, run: JobRun, now: float) -> tuple[float, float]:
        """Count ``run``'s hold and busy GPU time up to ``now``, when its current run ends; returns
        its progress before and after the run (it does not change the run)."""
        started = run.running_since
        assert started is not None
        self.close_hold(run, now)
        job = run.job
        compute_start = started + job.startup
        p0 = run.progress
        p1 = min(job.work, p0 + max(0.0, now - compute_start))
        rate = run.busy_rate
        if rate > 0:
            ledger = self.ledger
            for a, b in job.active_spans(p0, p1):
                t0, t1 = compute_start + (a - p0), compute_start + (b - p0)
                span = ledger.clip(t0, t1)
                if span > 0:
                    run.stats.busy += rate * span
                    ledger.busy_series.add(t0, t1, rate)
        return p0, p1

    def stopped(self, run: JobRun, reason: str, lost: float, now: float) -> None:
        """``run`` was stopped at ``now`` for ``reason`` and lost ``lost`` seconds of work."""
        if now >= 0:
            run.stats.lost += lost * run.alloc
            if reason == Reason.PREEMPTED:
                run.stats.preemptions += 1
            else:
                run.stats.interrupted_by_failure += 1

    def completed(self, run: JobRun, submitted: float, now: float) -> None:
        """``run``'s work is done at ``now``; ``submitted``: when its first submission was."""
        if now >= 0 and submitted >= 0:
            run.stats.completed += 1
            run.stats.completion_times.append(now - submitted)

    # --- nodes and the cluster ------------------------------------------------------------------

    def node_down(self, node: str, now: float) -> None:
        if now >= 0:
            self.ledger.node_failures += 1
        self.down_since[node] = now

    def node_up(self, node: str, now: float) -> None:
        since = self.down_since.pop(node, None)
        if since is not None:
            self.ledger.down_gpu_seconds += self.model.node_gpus(node) * self.ledger.clip(since, now)

    def update_stranded(self, now: float) -> None:
        """Stranded quota: GPUs idle while work waits only because of quota limits."""
        self.ledger.stranded += self.stranded_value * self.ledger.clip(self.stranded_since, now)
        self.stranded_since = now
        down = sum(self.model.node_gpus(n) for n in self.down_since)
        idle = max(0.0, self.ledger.gpus - down - self.held_total)
        self.stranded_value = min(idle, self.model.quota_blocked()) if idle > 1e-9 else 0.0

    def close(self, runs: Iterable[JobRun], horizon: float) -> None:
        """Close what is still open at the end of the window (the runs were closed before): holds,
        the waits of jobs that never started (a lower bound), nodes still down, stranded quota."""
        for run in runs:
            self.close_hold(run, horizon)
            if not run.done and run.first_start is None and run.job.submit >= 0:
                waits = run.stats.waits if run.job.continuation_of is None else run.stats.resume_waits
                waits.append(horizon - run.job.submit)
        for node, since in self.down_since.items():
            self.ledger.down_gpu_seconds += self.model.node_gpus(node) * self.ledger.clip(since, horizon)
        self.update_stranded(horizon)
