"""What a control plane can know of queued work, and the ETA the insight layer gives it.

The engine (:mod:`gpuplane.sim.engine`) tells the :class:`Forecaster` when work is queued, starts,
stops and ends; the forecaster keeps the running and queued work in a :class:`Book` and the
runtimes learned per workload class in a :class:`RuntimeHistory`, and predicts a queued job's
start: the queue replay (:meth:`Book.estimate`), or for a job whose every pod takes a whole node,
the node replay (:meth:`Forecaster.predict_gang`). Nothing here changes what is simulated: the ETA
is only measured against the start the job really had.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

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
from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job

if TYPE_CHECKING:
    from gpuplane.sim.engine import Model


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


GroupKey = tuple[frozenset[str], str, int, float]  # (pools, team, priority, what one pod asks)
LISTED_PER_QUEUE = 16  # queued work per team the ETA plays one by one; the rest counts as a backlog


def _ends(pool: str, entries: list[tuple[float, int, float, str, int]], floor: int) -> Iterator[Running]:
    """One pool's running work of at least priority ``floor``, in order of expected end."""
    for end, _, amount, owner, priority in entries:
        if priority >= floor:
            yield Running(end, pool, owner, amount)


def _by_end(running: Running) -> float:
    return running.end


class Book:
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


class Forecaster:
    """The ETA of each queued job, from what a control plane can know.

    Owns the book of running and queued work (:class:`Book`), the runtimes learned per class
    (:class:`RuntimeHistory`), and the capacity the model replays queued work against
    (``capacity``; ``None``: the configuration gives no ETA). It reads, and never changes, the
    engine's runs (``runs``) and the nodes that are down (``down``, node -> since when); the engine
    tells it when a job is queued, starts, stops and ends.
    """

    def __init__(
        self,
        model: Model,
        runs: Mapping[int, JobRun],
        down: Mapping[str, float],
        running_for: Callable[[str], Iterable[float]],
    ) -> None:
        self.model = model
        self.runs = runs
        self.down = down
        self.book = Book()
        self.capacity = model.eta_capacity()
        self.runtimes = RuntimeHistory(running_for)

    # --- what the engine tells it ---------------------------------------------------------------

    def queued(self, run: JobRun) -> None:
        """``run`` waits in its queue: it arrived, or it stopped and went back."""
        self.book.add_pending(run, self.runtimes.expected(run.job))

    def unqueued(self, run: JobRun) -> None:
        """``run`` left its queue: it started, or it was withdrawn."""
        self.book.remove_pending(run)

    def started(self, run: JobRun, now: float) -> None:
        """``run`` started at ``now``: when it is expected to end, from its class's runtimes."""
        job = run.job
        run.expected_end = now + max(job.startup, self.runtimes.expected(job) - run.progress)
        self.book.add_running(run)

    def stopped(self, run: JobRun) -> None:
        """``run`` no longer runs (it ended, or it went back to its queue)."""
        self.book.remove_running(run)

    def ended(self, run: JobRun, now: float) -> None:
        """A run ended by itself (completed, or reaped idle): its runtime joins the history."""
        if run.running_since is not None and run.progress == 0:
            self.runtimes.record(run.job.klass, now - run.running_since)

    # --- predictions --------------------------------------------------------------------------

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

    def predict(self, run: JobRun, now: float, *, tried: bool = False) -> float | None:
        """The ETA the insight layer gives a queued job: the queue replay, or for a job whose every
        pod takes a whole node, the node replay. Only work queued before ``run`` counts as ahead
        of it (what arrived at the same instant after it queues behind it). ``tried``: the pass at
        ``now`` tried it and it did not start, so it cannot start before something ends."""
        capacity = self.capacity
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
        down = self.down
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
