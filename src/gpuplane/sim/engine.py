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

import bisect
import gc
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Protocol

from gpuplane.core.session import Reason
from gpuplane.insight import idle
from gpuplane.insight.eta import (
    Capacity,
    Gang,
    NodeFree,
    NodeReplay,
    Queued,
    Running,
    RuntimeCurve,
    gang_start,
    replay_start,
    runtime_curve,
    van_der_corput,
)
from gpuplane.sim.metrics import ETA_RELATIVE_MIN_WAIT, GroupStats, Ledger
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


@dataclass(slots=True)
class JobRun:
    """One configuration's state of one job."""

    job: Job
    stats: GroupStats
    per_pod: float
    busy_per_pod: float
    priority: int
    held: float = 0.0
    held_since: float = 0.0
    deadlocked: bool = False
    running_since: float | None = None
    progress: float = 0.0
    gen: int = 0
    first_start: float | None = None
    done: bool = False
    predicted: float | None = None
    pools: frozenset[str] = frozenset()
    pool: str = ""
    expected_end: float = 0.0

    @property
    def alloc(self) -> float:
        return self.per_pod * self.job.pods

    @property
    def busy_rate(self) -> float:
        return min(self.per_pod, self.busy_per_pod) * self.job.pods


class RuntimeHistory:
    """Expected runtimes per workload class, learned from what ran so far.

    What a control plane can know: how long finished workloads of a class ran (start to
    completion, in one run) and how long the running ones have run. Their Kaplan-Meier curve
    (:func:`gpuplane.insight.eta.runtime_curve`) is recomputed when a class's finished runs grew
    by :data:`RELEARN` since the last time; it gives the expected runtime (its mean up to the
    longest seen) and, for the node replay of whole-node gangs, runtimes at chosen levels of the
    curve (of a run not started yet, or of one of a given age). Until
    :data:`LEARN_AFTER` of a class have finished, a job's own ``expected`` (the class mean the
    scenario declares) stands in.
    """

    def __init__(self, running: Callable[[str], Iterable[float]]) -> None:
        self.running = running
        self.finished: dict[str, list[float]] = {}
        self.learned: dict[str, RuntimeCurve | None] = {}
        # Per class, how many finished runs call for the next curve: LEARN_AFTER, then RELEARN
        # times the count it was last learned from. Asked for several times per arriving job, so
        # a look-up and one comparison when nothing is due.
        self.due: dict[str, float] = {}

    def record(self, klass: str, seconds: float) -> None:
        # In the order they ended: the curve sorts them (insorting here moved the whole list
        # at every finish of a class with tens of thousands of runs).
        self.finished.setdefault(klass, []).append(seconds)

    def curve(self, klass: str) -> RuntimeCurve | None:
        finished = self.finished.get(klass)
        if finished is None:
            return None
        count = len(finished)
        if count < self.due.get(klass, LEARN_AFTER):
            return self.learned.get(klass)
        self.due[klass] = count * RELEARN
        curve = self.learned[klass] = runtime_curve(finished, self.running(klass))
        return curve

    def expected(self, job: Job) -> float:
        curve = self.curve(job.klass)
        return job.expected if curve is None else curve.mean


class _Classes(dict[str, RuntimeCurve | None]):
    """What one prediction asks of :class:`RuntimeHistory`, asked once per class: by class, its
    curve (``classes[klass]``), and :meth:`expected`.

    A prediction of a whole-node gang asks each class's curve and expected runtime for every job
    of it on the gang's nodes and in its queue. Nothing finishes during a prediction, so every
    ask after a class's first returns what the first did (that one still relearns the curve when
    it is due, as before)."""

    def __init__(self, runtimes: RuntimeHistory) -> None:
        super().__init__()
        self.runtimes = runtimes
        self.means: dict[str, float | None] = {}

    def __missing__(self, klass: str) -> RuntimeCurve | None:
        curve = self[klass] = self.runtimes.curve(klass)
        return curve

    def expected(self, job: Job) -> float:
        klass = job.klass
        try:
            mean = self.means[klass]
        except KeyError:
            curve = self[klass]
            mean = self.means[klass] = None if curve is None else curve.mean
        return job.expected if mean is None else mean


LEARN_AFTER = 20  # finished runs of a class before its curve replaces the declared class mean
RELEARN = 1.05  # relearn a class's curve when its finished runs grew by 5 %


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


GroupKey = tuple[frozenset[str], str, int, float]  # (pools, team, priority, what one pod asks)
LISTED_PER_QUEUE = 16  # queued work per team the ETA plays one by one; the rest counts as a backlog


def _ends(pool: str, entries: list[tuple[float, int, float, str, int]], floor: int) -> Iterator[Running]:
    """One pool's running work of at least priority ``floor``, in order of expected end."""
    for end, _, amount, owner, priority in entries:
        if priority >= floor:
            yield Running(end, pool, owner, amount)


def _by_end(running: Running) -> float:
    return running.end


class _Book:
    """What an ETA may know: running work by pool (by expected end), queued work in queue order.

    Queued work is grouped by (pools, team, priority) so an estimate can pick the groups it
    competes with without scanning every queued job.
    """

    def __init__(self) -> None:
        self.running: dict[str, list[tuple[float, int, float, str, int]]] = {}
        self.held: dict[tuple[str, str, int], float] = {}
        self.groups: dict[GroupKey, dict[int, tuple[int, float, float]]] = {}
        self.group_work: dict[GroupKey, float] = {}
        self.where: dict[int, GroupKey] = {}
        self.queued: dict[int, JobRun] = {}
        self.sequence = 0
        self.pool_order: dict[frozenset[str], tuple[str, ...]] = {}

    def add_running(self, run: JobRun) -> None:
        entry = (run.expected_end, run.job.id, run.alloc, run.job.team, run.priority)
        bisect.insort(self.running.setdefault(run.pool, []), entry)
        key = (run.pool, run.job.team, run.priority)
        self.held[key] = self.held.get(key, 0.0) + run.alloc

    def remove_running(self, run: JobRun) -> None:
        entries = self.running.get(run.pool)
        if entries is not None:
            i = bisect.bisect_left(entries, (run.expected_end, run.job.id))
            if i < len(entries) and entries[i][1] == run.job.id:
                del entries[i]
        key = (run.pool, run.job.team, run.priority)
        self.held[key] = self.held.get(key, 0.0) - run.alloc

    def add_pending(self, run: JobRun, expected: float) -> None:
        """Queue ``run``, expected to run ``expected`` seconds in all (startup included)."""
        if run.job.id in self.where:
            return
        key = (run.pools, run.job.team, run.priority, run.per_pod)
        self.sequence += 1
        duration = max(run.job.startup, expected - run.progress)
        self.groups.setdefault(key, {})[run.job.id] = (self.sequence, run.alloc, duration)
        self.group_work[key] = self.group_work.get(key, 0.0) + run.alloc * duration
        self.where[run.job.id] = key
        self.queued[run.job.id] = run

    def remove_pending(self, run: JobRun) -> None:
        key = self.where.pop(run.job.id, None)
        if key is None:
            return
        del self.queued[run.job.id]
        _, amount, duration = self.groups[key].pop(run.job.id)
        self.group_work[key] -= amount * duration

    def sequence_of(self, run: JobRun) -> int:
        """Where ``run`` was queued (one past the last queued when it is not queued)."""
        key = self.where.get(run.job.id)
        return self.sequence + 1 if key is None else self.groups[key][run.job.id][0]

    def gangs(
        self, pools: frozenset[str], per_pod: float, floor: int, before: int
    ) -> Iterator[tuple[JobRun, GroupKey, int]]:
        """Queued work of at least priority ``floor``, queued before sequence ``before``, that may
        use one of ``pools`` and asks ``per_pod`` for each pod (whole nodes, for the caller): each
        run, its group, its sequence."""
        for key, members in self.groups.items():
            if key[3] != per_pod or key[2] < floor or pools.isdisjoint(key[0]):
                continue
            for job_id, (seq, _, _) in members.items():
                if seq >= before:
                    break  # a group's members are in the order they were queued
                yield self.queued[job_id], key, seq

    def _in_order(self, key: GroupKey, before: int) -> Iterator[tuple[int, int, GroupKey, float, float]]:
        """One group's work queued before sequence ``before``, in queue order: (-priority,
        sequence, group, amount, duration)."""
        for seq, amount, duration in self.groups[key].values():
            if seq >= before:
                return
            yield -key[2], seq, key, amount, duration

    def _work_from(self, key: GroupKey, before: int) -> float:
        """The work (GPU-equivalent seconds) of a group queued at or after sequence ``before``."""
        total = 0.0
        for seq, amount, duration in reversed(self.groups[key].values()):
            if seq < before:
                break
            total += amount * duration
        return total

    def _pools(self, pools: frozenset[str], capacity: Capacity) -> tuple[str, ...]:
        """``pools`` in the order of the capacity's pools (the order flavors are tried in)."""
        order = self.pool_order.get(pools)
        if order is None:
            order = self.pool_order[pools] = tuple(p for p in capacity.pools if p in pools)
        return order

    def estimate(
        self, run: JobRun, expected: float, capacity: Capacity, now: float, *, tried: bool = False
    ) -> float | None:
        """The ETA of ``run``, queued behind everything queued before it (``tried``: the scheduler
        tried it at ``now`` and it did not start, see :func:`gpuplane.insight.eta.replay_start`).

        The queued work it competes with (same team, or a pool in common) of at least its
        priority (any priority without preemption) is replayed with the running work's expected
        ends (:func:`gpuplane.insight.eta.replay_start`): the first :data:`LISTED_PER_QUEUE` of
        each team one by one, the rest of its own team (of every team when its team has no quota
        of its own) as a backlog. The backlog counts only work whose pods ask no more than
        ``run``'s: capacity frees a little at a time under load, and work that asks more per pod
        waits for more to free at once while smaller work behind it takes what frees (the replay
        itself does the same with the work it lists).
        """
        team = run.job.team
        floor = run.priority if capacity.preemption else -(2**31)
        used = [
            (pool, owner, amount)
            for (pool, owner, priority), amount in self.held.items()
            if priority >= floor and amount > 0
        ]
        asked = Queued(
            team,
            self._pools(run.pools, capacity),
            run.alloc,
            max(run.job.startup, expected - run.progress),
        )
        # With nothing else queued (most pending arrivals, below saturation) nothing is ahead.
        ahead, backlog = self._ahead(run, floor, capacity) if len(self.queued) > 1 else ([], 0.0)
        streams = [_ends(p, entries, floor) for p in capacity.pools if (entries := self.running.get(p))]
        releases = streams[0] if len(streams) == 1 else heapq.merge(*streams, key=_by_end)
        return replay_start(
            now,
            asked,
            capacity=capacity,
            used=used,
            releases=releases,
            ahead=ahead,
            backlog=backlog,
            rate=sum(amount for (_, owner, _), amount in self.held.items() if owner == team) or None,
            tried=tried,
        )

    def _ahead(self, run: JobRun, floor: int, capacity: Capacity) -> tuple[list[Queued], float]:
        """The queued work :meth:`estimate` replays ahead of ``run``, in queue order, and the
        backlog (GPU-equivalent seconds) it counts behind that."""
        team, pools = run.job.team, run.pools
        before = self.sequence_of(run)
        by_team: dict[str, list[GroupKey]] = {}
        for k, members in self.groups.items():
            if members and k[2] >= floor and (k[1] == team or not pools.isdisjoint(k[0])):
                by_team.setdefault(k[1], []).append(k)
        listed: list[tuple[int, int, Queued]] = []
        unlisted = 0.0
        own_limit = team in capacity.queue_limit or any(q == team for q, _ in capacity.flavor_limit)
        for owner, owned in by_team.items():
            ordered = heapq.merge(*(self._in_order(k, before) for k in owned))
            work = sum(self.group_work[k] - self._work_from(k, before) for k in owned if k[3] <= run.per_pod)
            for neg, seq, k, amount, duration in itertools.islice(ordered, LISTED_PER_QUEUE):
                listed.append((neg, seq, Queued(owner, self._pools(k[0], capacity), amount, duration)))
                if k[3] <= run.per_pod:
                    work -= amount * duration
            if owner == team or not own_limit:
                unlisted += max(0.0, work)
        listed.sort(key=lambda entry: (entry[0], entry[1]))
        return [entry[2] for entry in listed], unlisted


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
    """Runs one model over one set of workloads."""

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
    ) -> None:
        self.model = model
        self.workloads = workloads
        self.ledger = Ledger(workloads.horizon, gpus, bin_width)
        self.reaper_idle = reaper_idle
        # The cluster reaper's policy with the scenario's threshold as its window; a simulated session
        # is reclaimed as soon as it qualifies (no grace: no one reads the warning).
        self.idle_settings = idle.IdleSettings(window=reaper_idle, grace=0.0)
        self.progress = progress
        self.runs: dict[int, JobRun] = {}
        self.running: dict[int, JobRun] = {}
        self.book = _Book()
        self.eta_capacity = model.eta_capacity()
        self.runtimes = RuntimeHistory(self.running_for)
        self.events: list[tuple[float, int, int, int, int]] = []
        self.sequence = 0
        self.next_id = len(workloads.jobs)
        self.continuations: dict[int, int] = {}
        self.node_names: list[str] = []
        self.node_down_since: dict[str, float] = {}
        self.stranded_value = 0.0
        self.stranded_since = workloads.start
        self.held_total = 0.0
        self.wakes: set[float] = set()
        self.now = workloads.start
        self.tick = tick
        self.checkpoint_due: list[tuple[float, int, int]] = []  # (next checkpoint, job, run gen)
        self.arrived: list[JobRun] = []  # arrived at this instant, their ETA not asked yet

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
        events = self.events
        while events and events[0][0] < horizon:
            now = events[0][0]
            while events and events[0][0] == now:
                _, kind, _, ref, gen = heapq.heappop(events)
                self.ledger.events += 1
                self.handle(kind, ref, gen, now)
            self.now = now
            tick = self.tick
            passed = not (tick > 0 and now % tick != 0)  # a scheduling pass runs at this instant
            if not passed:
                at = math.ceil(now / tick) * tick
                if at not in self.wakes:
                    self.wakes.add(at)
                    self.push(at, WAKE, -1)
            else:
                self.ledger.cycles += self.model.schedule(now, self.checkpoints)
                self.apply(now)
            if self.arrived:
                self.predict_pending(now, tried=passed)
            for wake in self.model.wake_ups():
                if wake not in self.wakes and wake > now:
                    self.wakes.add(wake)
                    self.push(wake, WAKE, -1)
            self.update_stranded(now)
            if self.progress is not None and now - last_report > span / 200:
                last_report = now
                self.progress((now - start) / span)
        self.finish(horizon)
        if self.progress is not None:
            self.progress(1.0)
        return self.ledger

    def handle(self, kind: int, ref: int, gen: int, now: float) -> None:  # noqa: PLR0912 - one branch per event kind, in the hot loop (no dispatch call)
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
            if now >= 0:
                self.ledger.node_failures += 1
            self.node_down_since[node] = now
            self.model.node_down(node, now)
            self.apply(now)
        elif kind == NODE_UP:
            node = self.node_names[ref]
            since = self.node_down_since.pop(node, None)
            if since is not None:
                self.ledger.down_gpu_seconds += self.model.node_gpus(node) * self.ledger.clip(since, now)
            self.model.node_up(node, now)
            self.apply(now)

    # --- job life ---------------------------------------------------------------

    def arrive(self, job: Job, now: float) -> None:
        per_pod, busy_per_pod = self.model.allocation(job)
        stats = self.ledger.group(job.team, job.klass)
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
        measured = now >= 0
        if measured:
            if job.continuation_of is None:
                stats.submitted += 1
            else:
                stats.resumed += 1
        self.book.add_pending(run, self.runtimes.expected(run.job))
        if measured and job.continuation_of is None:
            self.arrived.append(run)
        if job.deadline is not None:
            self.push(job.deadline, END, job.id)
        self.model.submit(job, now)
        self.apply(now)

    def complete(self, run: JobRun, now: float) -> None:
        self._ended(run, now)
        self.close_run(run, now)
        run.done = True
        if now >= 0 and self._origin(run.job).submit >= 0:
            run.stats.completed += 1
            run.stats.completion_times.append(now - self._origin(run.job).submit)
        self.model.release(run.job, now)
        self.apply(now)

    def _ended(self, run: JobRun, now: float) -> None:
        """A run ended by itself (completed, or reaped idle): its runtime joins the history."""
        if run.running_since is not None and run.progress == 0:
            self.runtimes.record(run.job.klass, now - run.running_since)

    def withdraw(self, run: JobRun, now: float) -> None:
        run.done = True
        self._unpend(run)
        self.model.release(run.job, now)
        self.apply(now)

    def reap(self, run: JobRun, now: float) -> None:
        job = run.job
        usage = self._session_usage(run, now)
        decision = idle.decide(usage, idle.Workload(idle.WorkloadClass.SESSION), self.idle_settings, now)
        if decision.action is not idle.Action.RECLAIM:
            return
        gap = job.idle_gap_after(run.progress, self.reaper_idle)
        self._ended(run, now)
        self.close_run(run, now)
        run.done = True
        if now >= 0:
            run.stats.reaped += 1
        self.model.release(job, now)
        self.apply(now)
        if gap is not None and gap[1] < job.work:
            self.resubmit(job, now + (gap[1] - gap[0]), gap[1])
        elif now >= 0 and self._origin(job).submit >= 0:
            # Reaped in the idle tail: the session's work was done.
            run.stats.completed += 1
            run.stats.completion_times.append(now - self._origin(job).submit)

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

    def _unpend(self, run: JobRun) -> None:
        self.book.remove_pending(run)

    # --- changes reported by the model -------------------------------------------

    def apply(self, now: float) -> None:
        for change in self.model.take_changes():
            run = self.runs[change.job]
            if change.kind == HOLD:
                self.set_held(run, change.level, now)
            elif change.kind == START:
                self.start(run, change.text, now)
            elif change.kind == STOP:
                self.stop(run, change.text, now)
            elif change.kind == DEADLOCK:
                self.close_hold(run, now)
                run.deadlocked = change.level > 0
            elif change.kind == RESTART and now >= 0:
                run.stats.deadlock_restarts += 1

    def set_held(self, run: JobRun, level: float, now: float) -> None:
        self.close_hold(run, now)
        self.held_total += level - run.held
        run.held = level

    def close_hold(self, run: JobRun, now: float) -> None:
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

    def start(self, run: JobRun, pool: str, now: float) -> None:
        job = run.job
        self.close_hold(run, now)
        self._unpend(run)
        run.running_since = now
        run.pool = pool
        run.gen += 1
        self.running[job.id] = run
        if run.first_start is None:
            run.first_start = now
            submit = job.submit
            if submit >= 0 and job.continuation_of is None:
                run.stats.started += 1
                run.stats.waits.append(now - submit)
                if run.predicted is not None:
                    error = abs(run.predicted - now)
                    run.stats.eta_errors.append(error)
                    waited = now - submit
                    if waited > ETA_RELATIVE_MIN_WAIT:
                        run.stats.eta_relative_errors.append(error / waited)
            elif submit >= 0:
                run.stats.resume_waits.append(now - submit)
        remaining = job.work - run.progress
        run.expected_end = now + max(job.startup, self.runtimes.expected(job) - run.progress)
        self.book.add_running(run)
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
        alloc = run.alloc
        p0, p1 = self.close_run(run, now)
        job = run.job
        if job.stateless:
            saved = p1
        elif job.checkpoint:
            saved, _ = checkpoint_at(p0, job.checkpoint, p1)  # the checkpoint taken at p1 counts
        else:
            saved = p0
        run.progress = saved
        if now >= 0:
            run.stats.lost += (p1 - saved) * alloc
            if reason == PREEMPTED:
                run.stats.preemptions += 1
            else:
                run.stats.interrupted_by_failure += 1
        self.book.add_pending(run, self.runtimes.expected(run.job))

    def close_run(self, run: JobRun, now: float) -> tuple[float, float]:
        """End the current run at ``now``: count busy GPU time; returns progress before and after."""
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
        run.progress = p1
        run.running_since = None
        run.gen += 1
        self.running.pop(job.id, None)
        self.book.remove_running(run)
        return p0, p1

    def finish(self, horizon: float) -> None:
        """Close everything still open at the end of the window."""
        for run in list(self.running.values()):
            self.close_run(run, horizon)
        for run in self.runs.values():
            self.close_hold(run, horizon)
            if not run.done and run.first_start is None and run.job.submit >= 0:
                # Never started: its wait so far is a lower bound.
                waits = run.stats.waits if run.job.continuation_of is None else run.stats.resume_waits
                waits.append(horizon - run.job.submit)
        for node, since in self.node_down_since.items():
            self.ledger.down_gpu_seconds += self.model.node_gpus(node) * self.ledger.clip(since, horizon)
        self.update_stranded(horizon)

    # --- stranded quota ---------------------------------------------------------

    def update_stranded(self, now: float) -> None:
        """Stranded quota: GPUs idle while work waits only because of quota limits."""
        self.ledger.stranded += self.stranded_value * self.ledger.clip(self.stranded_since, now)
        self.stranded_since = now
        down = sum(self.model.node_gpus(n) for n in self.node_down_since)
        idle = max(0.0, self.ledger.gpus - down - self.held_total)
        self.stranded_value = min(idle, self.model.quota_blocked()) if idle > 1e-9 else 0.0

    # --- what the core may know: checkpoints and ETAs --------------------------------

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

    def expected_end(self, run: JobRun, now: float, classes: _Classes) -> float:
        """When a running job is expected to end: its age on its class's runtime curve (the mean
        of what is left), or its expected end taken at start; never before ``now``. ``classes``:
        what one prediction asked of the runtimes already."""
        curve = classes[run.job.klass]
        if curve is None or run.running_since is None:
            return max(now, run.expected_end)
        return now + curve.remaining(now - run.running_since + run.progress)

    def likely_end(self, run: JobRun, now: float, classes: _Classes) -> float | None:
        """A running job's end drawn from its class's curve given its age, at the job's own point
        of a van der Corput sequence (so the running jobs' ends spread as the curve says, the
        first ones much earlier than any mean); ``None`` past the longest run seen. Without a
        curve, its expected end. ``classes``: what one prediction asked of the runtimes already."""
        curve = classes[run.job.klass]
        if curve is None or run.running_since is None:
            return max(now, run.expected_end)
        left = curve.remaining_at(now - run.running_since + run.progress, van_der_corput(run.job.id + 1))
        return None if left is None else now + left

    def running_for(self, klass: str) -> Iterator[float]:
        """How long each running job of ``klass`` has run so far (in its current run)."""
        now = self.now
        for run in self.running.values():
            if run.job.klass == klass and run.running_since is not None and run.progress == 0:
                yield now - run.running_since

    def predict_pending(self, now: float, *, tried: bool) -> None:
        """The ETA of each job that arrived at ``now`` and is still pending after the scheduling
        pass: what ``gpuplane why`` shows, which only a pending workload has. A job the pass
        started is not predicted (it never waited for an ETA) and counts in no ETA error."""
        arrived, self.arrived = self.arrived, []
        for run in arrived:
            if run.first_start is not None or run.done:
                continue
            run.predicted = self.predict(run, now, tried=tried)
            if run.predicted is None:
                run.stats.never_predicted += 1

    def predict(self, run: JobRun, now: float, *, tried: bool = False) -> float | None:
        """The ETA the insight layer gives a queued job: the queue replay, or for a job whose every
        pod takes a whole node, the node replay. Only work queued before ``run`` counts as ahead
        of it (what arrived at the same instant after it queues behind it). ``tried``: the pass at
        ``now`` tried it and it did not start, so it cannot start before something ends."""
        capacity = self.eta_capacity
        if capacity is None:
            return None
        nodes = self.model.whole_nodes(run.job)
        if nodes:
            return self.predict_gang(run, nodes, capacity, now)
        return self.book.estimate(run, self.runtimes.expected(run.job), capacity, now, tried=tried)

    def predict_gang(
        self, run: JobRun, nodes: dict[str, list[tuple[str, list[int]]]], capacity: Capacity, now: float
    ) -> float | None:
        """The node replay (:func:`gpuplane.insight.eta.gang_start`) of a whole-node gang.

        Work of a lower priority than the gang is left out where preemption is on. A node with
        nothing else on it is free; one held by a whole-node pod frees at that job's likely end
        (:meth:`likely_end`; never, past the longest run its class has shown); one held by smaller
        work only, when the last of it is expected to end (the scheduler keeps placing small work
        on partly used nodes, so these seldom free before). Queued gangs of the same node size
        that may use these pools are replayed with their queues, each run drawn from its class's
        runtime curve once it is learned.
        """
        floor = run.priority if capacity.preemption else -(2**31)
        pools = tuple(p for p in capacity.pools if p in nodes)
        free: dict[str, int] = {}
        releases: list[NodeFree] = []
        runs = self.runs
        down = self.node_down_since
        node_gpus = self.model.node_gpus
        classes = _Classes(self.runtimes)  # each class's runtimes, asked once for the whole prediction
        for pool, on_nodes in nodes.items():
            for node, ids in on_nodes:
                if node in down:
                    continue
                size = node_gpus(node)
                holders: list[JobRun] = []  # those before the first whole-node one, if any
                whole = None
                for i in ids:
                    h = runs.get(i)
                    if h is None or h.priority < floor:
                        continue
                    if h.per_pod >= size:
                        whole = h
                        break
                    holders.append(h)
                if whole is not None:
                    end = self.likely_end(whole, now, classes)
                    if end is not None:
                        releases.append(NodeFree(end, pool, whole.job.team, whole.per_pod))
                elif holders:
                    last = max([self.expected_end(h, now, classes) for h in holders])
                    releases.append(NodeFree(last, pool))
                else:
                    free[pool] = free.get(pool, 0) + 1
        mine = self.book.sequence_of(run)
        queued = self._queued_gangs(run, pools, floor, mine, classes)
        usage: dict[tuple[str, str], float] = {}
        for (pool, owner, priority), amount in self.book.held.items():
            if priority >= floor and pool in nodes:
                usage[(owner, pool)] = usage.get((owner, pool), 0.0) + amount
        asked = self._gang(run, run.job.team, pools, mine, classes)
        world = NodeReplay(
            free=free,
            releases=releases,
            queued=queued,
            usage=usage,
            nominal=capacity.nominal or capacity.flavor_limit,
            node_size=run.per_pod,
            capacity={p: capacity.pools[p] for p in pools} if capacity.preemption else None,
        )
        return gang_start(now, asked, world)

    def _queued_gangs(
        self, run: JobRun, pools: tuple[str, ...], floor: int, mine: int, classes: _Classes
    ) -> list[Gang]:
        """The whole-node gangs queued before ``run`` (sequence ``mine``) that may use its pools,
        of priority ``floor`` or more, as the node replay sees them."""
        shared: dict[frozenset[str], tuple[str, ...]] = {}  # per group's pools, the ones of ``pools``
        queued = []
        for other, key, seq in self.book.gangs(run.pools, run.per_pod, floor, mine):
            theirs = shared.get(key[0])
            if theirs is None:
                theirs = shared[key[0]] = tuple(p for p in pools if p in key[0])
            queued.append(self._gang(other, key[1], theirs, seq, classes))
        return queued

    def _gang(self, run: JobRun, queue: str, pools: tuple[str, ...], order: float, classes: _Classes) -> Gang:
        """A queued whole-node job as the node replay sees it."""
        expected = classes.expected(run.job)
        curve = classes[run.job.klass] if run.progress == 0 else None
        duration = max(run.job.startup, expected - run.progress)
        return Gang(queue, pools, run.job.pods, run.priority, order, duration, curve)
