"""The discrete-event loop: a virtual clock, one event queue, one configuration at a time.

::

    events (heap: time, sequence) ──> batch of everything at one virtual time
        arrival / completion / reap / deadline / node down / node up / wake-up
              │  calls the configuration's model (submit, release, node_down, ...)
              v
        one scheduling pass (the model runs its cycles until nothing changes)
              │  the model reports changes: hold(level), start(pool), stop(reason), deadlock(flag)
              v
        accounting (metrics.Ledger) and new events (completion, reap)

Nothing reads the wall clock or draws random numbers here: every draw was made when the workloads
were generated, so configurations see identical arrivals and failures, and ties break on a
sequence number. A model never decides when work ends; the engine does, from the work model in
:mod:`gpuplane.sim.workloads`.
"""

from __future__ import annotations

import gc
import heapq
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

from gpuplane.core.session import Reason
from gpuplane.insight import idle
from gpuplane.insight.eta import Capacity
from gpuplane.sim.accounts import Accounts
from gpuplane.sim.forecast import Forecaster
from gpuplane.sim.metrics import Cut, Ledger
from gpuplane.sim.runs import JobRun
from gpuplane.sim.wait_cut import CHECKS, WaitCut
from gpuplane.sim.workloads import Job, Workloads

# Event kinds, in the order they are handled within one virtual instant.
COMPLETE, END, REAP, NODE_DOWN, NODE_UP, ARRIVE, WAKE = range(7)

# Change kinds a model reports.
HOLD, START, STOP, DEADLOCK, RESTART = range(5)

# Why a model stopped a job (the lifecycle's eviction reasons).
PREEMPTED = Reason.PREEMPTED
NODE_FAILURE = Reason.NODE_FAILURES

ProgressCallback = Callable[[float], None]


@dataclass(slots=True)
class Change:
    kind: int
    job: int
    level: float = 0.0
    text: str = ""


class Model(Protocol):
    """A configuration: how workloads are queued, placed and preempted."""

    name: str
    reaper: bool

    def submit(self, job: Job, now: float) -> None: ...

    def release(self, job: Job, now: float) -> None:
        """The job ended (completed, reaped, deleted): give back everything it holds or queues."""

    def node_down(self, node: str, now: float) -> None: ...

    def node_up(self, node: str, now: float) -> None: ...

    def schedule(self, now: float, checkpoints: Callable[[], Iterable[tuple[Job, float]]]) -> int:
        """One scheduling pass; returns how many cycles it took."""

    def take_changes(self) -> list[Change]:
        """The changes since the last call, in order; the model forgets them."""

    def allocation(self, job: Job) -> tuple[float, float]:
        """GPU-equivalents one pod holds, and the busy GPU-equivalents one pod can show."""

    def priority(self, job: Job) -> int: ...

    def pools_of(self, job: Job) -> tuple[str, ...]:
        """The pools the job may run on in this configuration."""

    def eta_capacity(self) -> Capacity | None:
        """Pools and quotas the ETA replays queued work against (``None``: no ETA)."""

    def whole_nodes(self, job: Job) -> dict[str, list[tuple[str, list[int]]]] | None:
        """For a job whose every pod takes a whole node: per pool it may use, each node with the
        ids of the jobs running there; ``None`` for any other job (or if the model does not say)."""

    def quota_blocked(self) -> float:
        """GPU-equivalents of queued work held back by quota (not by placement)."""

    def node_gpus(self, node: str) -> int: ...

    def wake_ups(self) -> list[float]:
        """Times the model wants a scheduling pass at (timeouts)."""


def checkpoint_at(compute_start: float, period: float, now: float) -> tuple[float, float]:
    """The last checkpoint at or before ``now`` of work that computes from ``compute_start`` and
    checkpoints every ``period``, and when the next one is due: always after ``now``.

    At a checkpoint's own instant, ``(now - compute_start) / period`` can round to just below the
    whole number it is, which names the checkpoint before; the next one would then be due at
    ``now`` again, and a loop that waits for it would never end. That checkpoint is taken as the
    last one instead.
    """
    last = compute_start + math.floor((now - compute_start) / period) * period
    following = last + period
    if following <= now:
        last, following = following, following + period
    return last, max(following, math.nextafter(now, math.inf))


YOUNG_GENERATION = 50_000  # allocations between young collections during a run (Python's default: 700)


@contextmanager
def _batch_collection() -> Iterator[None]:
    """The cyclic garbage collector set for one long run, restored after it.

    A run allocates millions of short-lived objects over a heap that only grows (the drawn
    workloads, their runs, the statistics). With the default young generation of 700 allocations,
    objects still in use a moment later are promoted, and the oldest generation is scanned again
    and again as it grows. Everything that exists when the run starts is frozen (never scanned;
    reference counting still frees it), and the young generation holds more before a collection,
    so fewer short-lived objects are promoted. Nothing a run computes depends on it.
    """
    threshold = gc.get_threshold()
    gc.freeze()
    gc.set_threshold(max(threshold[0], YOUNG_GENERATION), *threshold[1:])
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()


class Engine:
    """Runs one model over one set of workloads: the virtual clock, the events, each job's life.

    Owns the event queue (``events``, ordered by time, kind and ``sequence``), the clock (``now``),
    the wake-ups asked for (``wakes``), every job (``jobs``, the reaped sessions' resumptions
    included) and its run (``runs``; those running now in ``running``), the next checkpoint of each
    running job (``checkpoint_due``) and the jobs that arrived at this instant (``arrived``). What a
    run measures is in its :class:`~gpuplane.sim.accounts.Accounts` (``accounts``), the ETAs in its
    :class:`~gpuplane.sim.forecast.Forecaster` (``forecast``).
    """

    def __init__(  # noqa: PLR0913 - keyword-only: progress, histogram bin, tick
        self,
        model: Model,
        workloads: Workloads,
        gpus: int,
        reaper_idle: float,
        *,
        progress: ProgressCallback | None = None,
        bin_width: float = 3600.0,
        tick: float = 0.0,
        cut: WaitCut | None = None,
        predict: bool = True,
    ) -> None:
        self.model = model
        self.workloads = workloads
        self.accounts = Accounts(model, Ledger(workloads.horizon, gpus, bin_width), workloads.start)
        self.reaper_idle = reaper_idle
        # The cluster reaper's policy with the scenario's threshold as its window; a simulated session
        # is reclaimed as soon as it qualifies (no grace: no one reads the warning).
        self.idle_settings = idle.IdleSettings(window=reaper_idle, grace=0.0)
        self.progress = progress
        self.runs: dict[int, JobRun] = {}
        self.running: dict[int, JobRun] = {}
        self.forecast = Forecaster(model, self.runs, self.accounts.down_since, workloads.jobs)
        self.events: list[tuple[float, int, int, int, int]] = []
        self.sequence = 0
        self.next_id = len(workloads.jobs)
        self.continuations: dict[int, int] = {}
        self.node_names: list[str] = []
        self.wakes: set[float] = set()
        self.now = workloads.start
        self.tick = tick
        self.checkpoint_due: list[tuple[float, int, int]] = []  # (next checkpoint, job, run gen)
        self.arrived: list[JobRun] = []  # arrived at this instant, their ETA not asked yet
        self.cut = cut  # stops the run once its p95 wait is sure to miss a target
        self.predict = predict  # whether each job pending on arrival gets an ETA (no effect on the schedule)

    # --- events ---------------------------------------------------------------

    def push(self, time: float, kind: int, ref: int, gen: int = 0) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (time, kind, self.sequence, ref, gen))

    def run(self) -> Ledger:
        with _batch_collection():
            return self._run()

    def _run(self) -> Ledger:
        for job in self.workloads.jobs:
            self.push(job.submit, ARRIVE, job.id)
        self.jobs: dict[int, Job] = {job.id: job for job in self.workloads.jobs}
        for i, ev in enumerate(self.workloads.node_events):
            self.node_names.append(ev.node)
            self.push(ev.time, NODE_UP if ev.up else NODE_DOWN, i)
        horizon = self.workloads.horizon
        start = self.workloads.start
        span = horizon - start
        last_report = -math.inf
        cut = self.cut
        next_check = start + span / CHECKS if cut is not None else math.inf
        events = self.events
        accounts = self.accounts
        ledger = accounts.ledger
        while events and events[0][0] < horizon:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, _, ref, gen = heapq.heappop(events)
                ledger.events += 1
                self.handle(kind, ref, gen, now)
            self.now = now
            passed = self._pass(now)
            if self.arrived:
                self.predict_pending(now, tried=passed)
            for wake in self.model.wake_ups():
                if wake not in self.wakes and wake > now:
                    self.wakes.add(wake)
                    self.push(wake, WAKE, -1)
            accounts.update_stranded(now)
            if now >= next_check:
                next_check = now + span / CHECKS
                if cut is not None and cut.decided(now):
                    horizon = self._cut_at(cut, now)
                    break
            if self.progress is not None and now - last_report > span / 200:
                last_report = now
                self.progress((now - start) / span)
        self.finish(horizon)
        if self.progress is not None:
            self.progress(1.0)
        return ledger

    def _pass(self, now: float) -> bool:
        """The scheduling pass at ``now``, or with a tick, a wake-up at the next tick instead;
        whether a pass ran."""
        tick = self.tick
        if tick > 0 and now % tick != 0:
            at = math.ceil(now / tick) * tick
            if at not in self.wakes:
                self.wakes.add(at)
                self.push(at, WAKE, -1)
            return False
        self.accounts.ledger.cycles += self.model.schedule(now, self.checkpoints)
        self.apply(now)
        return True

    def _cut_at(self, cut: WaitCut, now: float) -> float:
        """The run ends at ``now`` (returned: its new horizon), its p95 wait sure to miss the cut's
        target whatever came next; the ledger records the cut and measures up to it."""
        ledger = self.accounts.ledger
        started = (w for stats in ledger.groups.values() for w in stats.waits)
        ledger.cut = Cut(now, cut.lower_bound(started, now))
        ledger.horizon = now
        return now

    def handle(self, kind: int, ref: int, gen: int, now: float) -> None:
        if kind == ARRIVE:
            self.arrive(self.jobs[ref], now)
        elif kind == COMPLETE:
            run = self.runs[ref]
            if run.gen == gen and run.running_since is not None and not run.done:
                self.complete(run, now)
        elif kind == REAP:
            run = self.runs[ref]
            if run.gen == gen and run.running_since is not None and not run.done:
                self.reap(run, now)
        elif kind == END:
            run = self.runs[ref]
            if not run.done:
                if run.running_since is not None:
                    self.complete(run, now)
                else:
                    self.withdraw(run, now)
        elif kind == NODE_DOWN:
            node = self.node_names[ref]
            self.accounts.node_down(node, now)
            self.model.node_down(node, now)
            self.apply(now)
        elif kind == NODE_UP:
            node = self.node_names[ref]
            self.accounts.node_up(node, now)
            self.model.node_up(node, now)
            self.apply(now)

    # --- job life ---------------------------------------------------------------

    def arrive(self, job: Job, now: float) -> None:
        per_pod, busy_per_pod = self.model.allocation(job)
        stats = self.accounts.arrived(job, now)
        run = JobRun(
            job,
            stats,
            per_pod,
            busy_per_pod,
            self.model.priority(job),
            progress=job.start_progress,
            pools=frozenset(self.model.pools_of(job)),
        )
        self.runs[job.id] = run
        self.forecast.queued(run, now)
        if self.cut is not None:
            self.cut.arrived(run)
        if self.predict and now >= 0 and job.continuation_of is None:
            self.arrived.append(run)
        if job.deadline is not None:
            self.push(job.deadline, END, job.id)
        self.model.submit(job, now)
        self.apply(now)

    def complete(self, run: JobRun, now: float) -> None:
        self.forecast.ended(run, now)
        self.close_run(run, now)
        run.done = True
        self.accounts.completed(run, self._origin(run.job).submit, now)
        self.model.release(run.job, now)
        self.apply(now)

    def withdraw(self, run: JobRun, now: float) -> None:
        run.done = True
        self.forecast.unqueued(run)
        self.model.release(run.job, now)
        self.apply(now)

    def reap(self, run: JobRun, now: float) -> None:
        job = run.job
        usage = self._session_usage(run, now)
        decision = idle.decide(usage, idle.Workload(idle.WorkloadClass.SESSION), self.idle_settings, now)
        if decision.action is not idle.Action.RECLAIM:
            return
        gap = job.idle_gap_after(run.progress, self.reaper_idle)
        self.forecast.ended(run, now)
        self.close_run(run, now)
        run.done = True
        if now >= 0:
            run.stats.reaped += 1
        self.model.release(job, now)
        self.apply(now)
        if gap is not None and gap[1] < job.work:
            self.resubmit(job, now + (gap[1] - gap[0]), gap[1])
        else:
            # Reaped in the idle tail: the session's work was done.
            self.accounts.completed(run, self._origin(job).submit, now)

    def _session_usage(self, run: JobRun, now: float) -> idle.PodUsage:
        """What a DCGM exporter would have shown for the running session over the policy's window:
        one device, fully active during the work model's active stretches, idle otherwise (the
        startup included)."""
        job, since = run.job, run.running_since
        assert since is not None
        compute_start = since + job.startup
        window_start = max(since, now - self.idle_settings.window)
        p_now = min(job.work, run.progress + max(0.0, now - compute_start))
        p_from = max(run.progress, run.progress + (window_start - compute_start))
        samples = [idle.Sample(window_start, 0.0)]
        for a, b in job.active_spans(p_from, p_now):
            samples += [
                idle.Sample(compute_start + (a - run.progress), 1.0),
                idle.Sample(compute_start + (b - run.progress), 1.0),
            ]
        samples.append(idle.Sample(now, 0.0))
        device = idle.DeviceSamples("0", {idle.GR_ENGINE_ACTIVE: samples})
        return idle.PodUsage("", job.name, 1, (device,))

    def resubmit(self, job: Job, at: float, progress: float) -> None:
        """The user comes back to a reaped session: a new submission that resumes it."""
        origin = self._origin(job)
        count = self.continuations.get(origin.id, 0) + 1
        self.continuations[origin.id] = count
        again = replace(
            job,
            id=self.next_id,
            name=f"{origin.name}-r{count}",
            submit=at,
            start_progress=progress,
            continuation_of=origin.id,
        )
        self.next_id += 1
        self.jobs[again.id] = again
        if at < self.workloads.horizon:
            self.push(at, ARRIVE, again.id)

    def _origin(self, job: Job) -> Job:
        return self.jobs[job.continuation_of] if job.continuation_of is not None else job

    # --- changes reported by the model -------------------------------------------

    def apply(self, now: float) -> None:
        accounts = self.accounts
        for change in self.model.take_changes():
            run = self.runs[change.job]
            if change.kind == HOLD:
                accounts.set_held(run, change.level, now)
            elif change.kind == START:
                self.start(run, change.text, now)
            elif change.kind == STOP:
                self.stop(run, change.text, now)
            elif change.kind == DEADLOCK:
                accounts.close_hold(run, now)
                run.deadlocked = change.level > 0
            elif change.kind == RESTART and now >= 0:
                run.stats.deadlock_restarts += 1

    def start(self, run: JobRun, pool: str, now: float) -> None:
        job = run.job
        self.accounts.close_hold(run, now)
        self.forecast.unqueued(run)
        run.running_since = now
        run.pool = pool
        run.gen += 1
        self.running[job.id] = run
        if run.first_start is None:
            self.accounts.first_start(run, now)
            if self.cut is not None:
                self.cut.started(run, now)
        remaining = job.work - run.progress
        self.forecast.started(run, now)
        if job.checkpoint:
            heapq.heappush(self.checkpoint_due, (now + job.startup + job.checkpoint, job.id, run.gen))
        if job.deadline is None:
            self.push(now + job.startup + remaining, COMPLETE, job.id, run.gen)
        if self.model.reaper and job.is_session:
            gap = job.idle_gap_after(run.progress, idle.reclaim_delay(self.idle_settings))
            if gap is not None:
                self.push(now + job.startup + (gap[0] - run.progress), REAP, job.id, run.gen)

    def stop(self, run: JobRun, reason: str, now: float) -> None:
        """The job stopped running and went back to its queue (preemption, node failure)."""
        if run.running_since is None:
            return
        p0, p1 = self.close_run(run, now)
        job = run.job
        if job.stateless:
            saved = p1
        elif job.checkpoint:
            saved, _ = checkpoint_at(p0, job.checkpoint, p1)  # the checkpoint taken at p1 counts
        else:
            saved = p0
        run.progress = saved
        self.accounts.stopped(run, reason, p1 - saved, now)
        self.forecast.queued(run, now)

    def close_run(self, run: JobRun, now: float) -> tuple[float, float]:
        """End the current run at ``now`` (counted in the accounts); returns progress before and after."""
        p0, p1 = self.accounts.close_run(run, now)
        run.progress = p1
        run.running_since = None
        run.gen += 1
        self.running.pop(run.job.id, None)
        self.forecast.stopped(run)
        return p0, p1

    def finish(self, horizon: float) -> None:
        """Close everything still open at the end of the window."""
        for run in list(self.running.values()):
            self.close_run(run, horizon)
        self.accounts.close(self.runs.values(), horizon)

    # --- what the core and the forecast may know: checkpoints, running work, ETAs --------------

    def checkpoints(self) -> Iterable[tuple[Job, float]]:
        """The last checkpoint of every running job that reached a new one since the last call.

        A job that has not checkpointed since it started is not listed (its start is its last
        safe point, as the core assumes of a workload with no checkpoint). A heap of the next
        checkpoint of each run keeps a call proportional to the checkpoints reached, not to
        the running work.
        """
        due = self.checkpoint_due
        now = self.now
        while due and due[0][0] <= now:
            _, job_id, gen = heapq.heappop(due)
            run = self.runs[job_id]
            started = run.running_since
            if run.gen != gen or started is None:
                continue  # that run ended
            job = run.job
            period = job.checkpoint
            assert period is not None
            last, following = checkpoint_at(started + job.startup, period, now)
            heapq.heappush(due, (following, job_id, gen))
            yield job, last

    def predict_pending(self, now: float, *, tried: bool) -> None:
        """The ETA of each job that arrived at ``now`` and is still pending after the scheduling
        pass: what ``gpuplane why`` shows, which only a pending workload has. A job the pass
        started is not predicted (it never waited for an ETA) and counts in no ETA error."""
        arrived, self.arrived = self.arrived, []
        for run in arrived:
            if run.first_start is not None or run.done:
                continue
            run.predicted = self.forecast.predict(run, now, tried=tried)
            if run.predicted is None:
                run.stats.never_predicted += 1
