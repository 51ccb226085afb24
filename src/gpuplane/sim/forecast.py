"""What a control plane can know of queued work, and the ETA the insight layer gives it.

The engine (:mod:`gpuplane.sim.engine`) tells the :class:`Forecaster` when work is queued, starts,
stops and ends; the forecaster keeps the running and queued work in a :class:`Book` and the
runtimes learned from finished runs, by the features users repeat (job name, team and size,
class), in a :class:`RuntimeHistory` (the runtime predictor the controller uses too), and
predicts a queued job's start: the queue replay (:meth:`Book.estimate`), or for a job whose every
pod takes a whole node, the node replay (:meth:`Forecaster.predict_gang`), with the range around
it that the starts seen so far call for (:class:`~gpuplane.sim.ranges.StartRanges`). Nothing here
changes what is simulated: the ETA is only measured against the start the job really had.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
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
from gpuplane.insight.runtime_history import JobFeatures
from gpuplane.insight.runtime_predictor import (
    OVERDUE_SHARE,
    PSEUDO_SAMPLES,
    TAIL_FLOOR_SECONDS,
    Prediction,
    Runs,
    RuntimePredictor,
    checked_runtime,
    learn_into,
)
from gpuplane.sim.ranges import StartRanges
from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job

if TYPE_CHECKING:
    from gpuplane.sim.engine import Model


def shape_of(job: Job) -> str:
    """A job's pod-set shape as :func:`gpuplane.insight.runtime_history.shape_of` writes it: its
    pods and what one pod asks."""
    request = job.request
    if request.gpus:
        asked = f"nvidia.com/gpu={request.gpus}"
    elif request.mig is not None:
        asked = f"nvidia.com/mig-{request.mig}=1"
    else:
        asked = f"nvidia.com/gpu.shared={request.fraction_milli}m"
    return f"{job.pods}x {asked}"


def features_of(job: Job) -> JobFeatures:
    """What a later job shares with ``job``: its team's namespace for its class (a team keeps its
    notebooks, its CI and its training apart, as a cluster's namespaces do: ``<team>-<class>``),
    the name the team reuses, its class as the queue (the scenario's classes are what a cluster
    splits into queues: training, inference, notebooks), its tier as the priority class, its
    shape."""
    return JobFeatures(f"{job.team}-{job.klass}", job.base_name, job.klass, job.tier, shape_of(job))


@dataclass(slots=True)
class Known:
    """What the history says of the runs of one set of features (``features``, with ``declared``
    standing in without history): the mean runtime of the runs its basis has (the expected
    runtime), its basis, how many finished runs call for the next look (``due``), the history's
    count of finished runs when last looked at (``seen``), and, made when first asked for, the
    prediction of a run not started yet (``made``, its runs ``made_from``) and its runtime curve."""

    features: JobFeatures
    declared: float
    mean: float
    basis: str
    due: float
    seen: int
    runs: tuple[tuple[str, Runs], ...] = ()
    made: Prediction | None = None
    made_from: float = 0.0
    curve: RuntimeCurve | None = None

    def runtime_curve(self, predictor: RuntimePredictor) -> RuntimeCurve | None:
        """The prediction as a runtime curve (for the node replay's draws of queued gangs)."""
        if self.curve is None:
            self.curve = runtime_curve(self.prediction(predictor).quantiles, ())
        return self.curve

    def median(self, predictor: RuntimePredictor) -> float:
        """The median runtime of a run not started yet (:meth:`prediction`'s middle quantile:
        ``Prediction.median``, read without the checks of ``Prediction.at``)."""
        return self.prediction(predictor).quantiles[PSEUDO_SAMPLES // 2]

    def prediction(self, predictor: RuntimePredictor) -> Prediction:
        """The prediction of a run not started yet, made when first asked for: what
        ``predictor.predict(features, declared=declared)`` gives, read from the runs of the
        features' keys at hand (``runs``, most specific first, with their bases) instead of
        looking the keys up again."""
        if self.made is None:
            least = predictor.min_samples
            for basis, runs in self.runs:
                count = len(runs.runtimes)
                if count >= least:
                    self.made, self.made_from = runs.not_started(basis), float(count)
                    return self.made
            self.made = predictor.predict(self.features, declared=self.declared)
            self.made_from = float(predictor.count(self.features)[1])
        return self.made


class RuntimeHistory:
    """Runtimes learned from what ran so far, by the features users repeat, in one
    :class:`~gpuplane.insight.runtime_predictor.RuntimePredictor` (``predictor``), as the
    controller learns them on a live cluster.

    What a control plane can know: how long finished runs ran (start to completion, in one run),
    and each job's features (:func:`features_of`). The predictor takes the most specific history
    with enough runs (this job name, the team at this shape, the class, everything); without any,
    the class mean the scenario declares (``Job.expected``) stands in, as a declared runtime would.
    What is known per set of features is kept (in ``slots``) and looked at again when the runs
    behind it grew by :data:`RELEARN` or its basis would change (per declared runtime too: it
    stands in until there is history); each job's features, slot and sums are worked out once
    (``jobs``).
    """

    def __init__(self) -> None:
        self.predictor = RuntimePredictor()
        # Per key of the predictor, [sum of the runtimes learned, their number, sum of the start
        # times of the first runs running now, their number]. The mean of a heavy-tailed runtime
        # lies mostly past its last quantiles (a lognormal of the spread of single-node training
        # has half its mean in its top 1 %), so it is kept exactly; and the long runs of a key are
        # still running while its short ones have finished, so its mean counts the time they ran
        # so far too (see :meth:`look`).
        self.sums: dict[tuple[str, ...], list[float]] = {}
        # Per (features, declared runtime), a slot holding what is known of them; per job, its
        # slot and the sums of its keys (most specific first) with their bases: looked up by the
        # job's id, so a job's features are hashed once.
        self.slots: dict[tuple[JobFeatures, float], list[Known | None]] = {}
        self.jobs: dict[int, _Entry] = {}
        # The same, per what a job's features and declared runtime are made of: most jobs rerun
        # work another job already ran, and share its entry.
        self.entries: dict[tuple[object, ...], _Entry] = {}
        self.learned = 0  # finished runs learned: nothing to look at again while it stays

    def prepare(self, jobs: Iterable[Job]) -> None:
        """Work out the features, slots and sums of ``jobs`` now: made before a run starts, they
        are frozen with the rest of what exists then (see
        :func:`gpuplane.sim.engine._batch_collection`) instead of being scanned again and again
        by the garbage collector as the run goes on."""
        for job in jobs:
            self._of(job)

    def _of(self, job: Job) -> _Entry:
        """``job``'s features, slot, sums (most specific key first, with their bases) and the
        predictor's runs of its keys."""
        found = self.jobs.get(job.id)
        if found is None:
            request = job.request
            made_of: tuple[object, ...] = (job.team, job.klass, job.base_name, job.tier, job.pods)
            made_of += (request.gpus, request.mig, request.fraction_milli, job.expected)
            found = self.entries.get(made_of)
            if found is None:
                features = features_of(job)
                slot = self.slots.setdefault((features, job.expected), [None])
                sums = self.sums
                entries = tuple(
                    ("name" if key[0] == "name+shape" else key[0], sums.setdefault(key, [0.0, 0.0, 0.0, 0.0]))
                    for key in _keys(features)
                )
                holders = self.predictor.runs_of(features)
                bases = tuple(zip((basis for basis, _ in entries), holders, strict=True))
                found = self.entries[made_of] = (features, slot, entries, holders, bases)
            self.jobs[job.id] = found
        return found

    def features_of(self, job: Job) -> JobFeatures:
        return self._of(job)[0]

    def slot_of(self, job: Job) -> list[Known | None]:
        return self._of(job)[1]

    def record(self, job: Job, seconds: float) -> None:
        """``job`` finished after running ``seconds``."""
        _, _, entries, holders, _ = self._of(job)
        seconds = checked_runtime(seconds)
        learn_into(holders, seconds)
        self.learned += 1
        for _, found in entries:
            found[0] += seconds
            found[1] += 1.0

    def run_started(self, job: Job, since: float) -> None:
        """A first run of ``job`` started at ``since``."""
        for _, found in self._of(job)[2]:
            found[2] += since
            found[3] += 1.0

    def run_stopped(self, job: Job, since: float) -> None:
        """The first run of ``job`` that started at ``since`` no longer runs."""
        for _, found in self._of(job)[2]:
            found[2] -= since
            found[3] -= 1.0

    def look(self, job: Job, now: float) -> tuple[str, float, float | None]:
        """The basis the predictor takes for ``job``'s features (``"declared"``: no key has
        enough finished runs), that key's finished runs, and its mean runtime: the time its runs
        ran, finished or running still, over its finished runs (the total time on test; exact
        for exponential runtimes, and what keeps the running long runs from going uncounted)."""
        least = self.predictor.min_samples
        for basis, found in self._of(job)[2]:
            if found[1] >= least:
                return basis, found[1], (found[0] + found[3] * now - found[2]) / found[1]
        return "declared", 0.0, None

    def known_of(self, job: Job, now: float) -> Known:
        features, slot, _, _, bases = self._of(job)
        known = slot[0]
        learned = self.learned
        if known is not None and known.seen == learned:
            return known
        basis, count, mean = self.look(job, now)
        if known is not None and count < known.due and basis == known.basis:
            known.seen = learned
            return known
        fresh = Known(
            features,
            job.expected,
            job.expected if mean is None else mean,
            basis,
            max(count + 1, count * RELEARN),
            learned,
            bases,
        )
        # The quantiles move less than the mean as runs come in: made again past REMAKE.
        if (
            known is not None
            and known.made is not None
            and basis == known.basis
            and count < max(known.made_from + REMAKE_LEAST, known.made_from * REMAKE)
        ):
            fresh.made, fresh.made_from, fresh.curve = known.made, known.made_from, known.curve
        slot[0] = fresh
        return fresh

    def remaining(self, job: Job, now: float, age: float, level: float | None = None) -> float:
        """What is left of a run of ``job`` that has run ``age``: the mean (``level`` None) or the
        quantile ``level`` of the runs of its prediction that lasted longer, less ``age`` (the
        predictor's conditioning on attained service, read from the prediction kept for its
        features); for a run past nearly all of them, the predictor's tail estimate, never 0."""
        return self.remaining_of(self.known_of(job, now), age, level)

    def remaining_of(self, known: Known, age: float, level: float | None = None) -> float:
        """:meth:`remaining`, with what is known of the job's features at hand."""
        quantiles = known.prediction(self.predictor).quantiles
        first = bisect.bisect_right(quantiles, age)
        longer = len(quantiles) - first
        if longer < OVERDUE_LEFT:
            # The predictor's tail for an overdue run scales with its age (its module says how).
            scale = max(age, TAIL_FLOOR_SECONDS)
            return scale * (_UNIT_TAIL.at(level) if level is not None else _UNIT_TAIL_MEAN)
        if level is None:
            return sum(quantiles[first:]) / longer - age
        pos = first + level * (longer - 1)
        low = int(pos)
        high = min(low + 1, len(quantiles) - 1)
        return quantiles[low] + (quantiles[high] - quantiles[low]) * (pos - low) - age


def _keys(features: JobFeatures) -> tuple[tuple[str, ...], ...]:
    """The keys the runtime predictor groups runs by, most specific first (its module lists them):
    job name and shape, job name, namespace and shape, queue, everything."""
    ns, name = features.namespace, features.name
    common = (("team", ns, features.shape), ("queue", features.queue), ("all",))
    if name:
        return (("name+shape", ns, name, features.shape), ("name", ns, name), *common)
    return common


_Entry = tuple[
    JobFeatures,
    list[Known | None],
    tuple[tuple[str, list[float]], ...],
    tuple[Runs, ...],
    tuple[tuple[str, Runs], ...],
]


class _Asked(dict[int, Known]):
    """What one prediction asks of :class:`RuntimeHistory`, asked once per set of features (by
    the identity of their slot).

    A prediction of a whole-node gang asks the expected runtime of every job on the gang's nodes
    and in its queue. Nothing finishes during a prediction, so every ask after the first for the
    same features returns what the first did."""

    def __init__(self, runtimes: RuntimeHistory, now: float) -> None:
        super().__init__()
        self.runtimes = runtimes
        self.now = now

    def of(self, job: Job) -> Known:
        key = id(self.runtimes.slot_of(job))
        known = self.get(key)
        if known is None:
            known = self[key] = self.runtimes.known_of(job, self.now)
        return known


# The tail the predictor gives a run overdue by ``TAIL_UNIT`` seconds, per second of its age.
TAIL_UNIT = 1e6
_UNIT_TAIL = RuntimePredictor().predict(JobFeatures("", "", "", "", ""), TAIL_UNIT, declared=1.0)
_UNIT_TAIL = Prediction(tuple(q / TAIL_UNIT for q in _UNIT_TAIL.quantiles), _UNIT_TAIL.basis, 0)
_UNIT_TAIL_MEAN = sum(_UNIT_TAIL.quantiles) / len(_UNIT_TAIL.quantiles)
RELEARN = 1.05  # look at a set of features' mean again when the runs behind it grew by 5 %
REMAKE, REMAKE_LEAST = 2.0, 10  # make its quantiles again when their runs doubled (10 at least)
OVERDUE_LEFT = math.ceil(OVERDUE_SHARE * PSEUDO_SAMPLES)  # fewer quantiles past a run's age: overdue
GANG_DRAWS = 3  # node replays of a whole-node gang, its holders' ends drawn apart: the ETA is their median


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

    Owns the book of running and queued work (:class:`Book`), the runtimes learned by features
    (:class:`RuntimeHistory`), the ranges learned from the starts that followed ETAs
    (:class:`~gpuplane.sim.ranges.StartRanges`), and the capacity the model replays queued work against
    (``capacity``; ``None``: the configuration gives no ETA). It reads, and never changes, the
    engine's runs (``runs``) and the nodes that are down (``down``, node -> since when); the engine
    tells it when a job is queued, starts, stops and ends; ``jobs``, the jobs it will hear of
    (the features of others are worked out when they come).
    """

    def __init__(
        self, model: Model, runs: Mapping[int, JobRun], down: Mapping[str, float], jobs: Iterable[Job] = ()
    ) -> None:
        self.model = model
        self.runs = runs
        self.down = down
        self.book = Book()
        self.capacity = model.eta_capacity()
        self.runtimes = RuntimeHistory()
        self.runtimes.prepare(jobs)
        self.ranges = StartRanges()

    # --- what the engine tells it ---------------------------------------------------------------

    def queued(self, run: JobRun, now: float) -> None:
        """``run`` waits in its queue from ``now``: it arrived, or it stopped and went back."""
        known = self.runtimes.known_of(run.job, now)
        run.basis = known.basis
        self.book.add_pending(run, known.mean)

    def unqueued(self, run: JobRun) -> None:
        """``run`` left its queue: it started, or it was withdrawn."""
        self.book.remove_pending(run)

    def started(self, run: JobRun, now: float) -> None:
        """``run`` started at ``now``: when it is expected to end, from the runtimes of its
        features; the first start of a job given an ETA calibrates the ranges."""
        job = run.job
        known = self.runtimes.known_of(job, now)
        run.basis = known.basis
        run.expected_end = now + max(job.startup, known.mean - run.progress)
        if run.progress == 0:
            run.predicted_runtime = known.median(self.runtimes.predictor)
            run.learning_since = now
            self.runtimes.run_started(job, now)
        self.book.add_running(run)
        if run.first_start == now and run.replayed is not None:
            given = None
            if run.predicted_low is not None and run.predicted_high is not None:
                given = (run.predicted_low, run.predicted_high)
            self.ranges.learn(
                run.eta_kind, run.asked_at, run.replayed, now, given=given, waited=now - job.submit
            )

    def stopped(self, run: JobRun) -> None:
        """``run`` no longer runs (it ended, or it went back to its queue)."""
        self.book.remove_running(run)
        if run.learning_since is not None:
            self.runtimes.run_stopped(run.job, run.learning_since)
            run.learning_since = None

    def ended(self, run: JobRun, now: float) -> None:
        """A run ended by itself (completed, or reaped idle): its runtime joins the history, and
        the runtime predicted at its start is measured against it."""
        since = run.running_since
        if since is not None and run.progress == 0:
            seconds = now - since
            self.runtimes.record(run.job, seconds)
            if run.predicted_runtime is not None and now >= 0 and seconds > 0:
                run.stats.runtime_errors.append(abs(run.predicted_runtime - seconds) / seconds)
                run.stats.runtime_bases.append(run.basis)

    # --- predictions --------------------------------------------------------------------------

    def expected_end(self, run: JobRun, now: float, asked: _Asked | None = None) -> float:
        """When a running job is expected to end: the mean of what is left of runs of its features
        that lasted as long as it has (never before ``now``), or its expected end taken at start.
        ``asked``: what the prediction under way asked of the runtimes already."""
        if run.running_since is None:
            return max(now, run.expected_end)
        age = now - run.running_since + run.progress
        if asked is not None:
            return now + max(0.0, self.runtimes.remaining_of(asked.of(run.job), age))
        return now + max(0.0, self.runtimes.remaining(run.job, now, age))

    def likely_end(self, run: JobRun, now: float, asked: _Asked | None = None) -> float:
        """A running job's end drawn from the runtimes of its features given its age, at the
        job's own point of a van der Corput sequence (so the running jobs' ends spread as their
        runtimes do, the first ones much earlier than any mean). Without a start, its expected
        end. ``asked``: as for :meth:`expected_end`."""
        if run.running_since is None:
            return max(now, run.expected_end)
        age = now - run.running_since + run.progress
        level = van_der_corput(run.job.id + 1)
        if asked is not None:
            return now + max(0.0, self.runtimes.remaining_of(asked.of(run.job), age, level))
        return now + max(0.0, self.runtimes.remaining(run.job, now, age, level))

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
            kind, predicted = "gang", self.predict_gang(run, nodes, capacity, now)
        else:
            kind = "queue"
            expected = self.runtimes.known_of(run.job, now).mean
            predicted = self.book.estimate(run, expected, capacity, now, tried=tried)
        run.asked_at, run.eta_kind, run.replayed = now, kind, predicted
        if predicted is None:
            return None
        run.predicted_low, run.predicted_high = self.ranges.range(kind, now, predicted)
        return self.ranges.centre(kind, now, predicted)

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
        runtime curve once it is learned. The replay is played :data:`GANG_DRAWS` times, each
        whole-node holder's end drawn at its level shifted by ``k / GANG_DRAWS``, and the ETA is
        the median of their starts: what the holders' runtimes call for, not one draw of them.
        """
        floor = run.priority if capacity.preemption else -(2**31)
        pools = tuple(p for p in capacity.pools if p in nodes)
        free: dict[str, int] = {}
        releases: list[NodeFree] = []
        runs = self.runs
        down = self.down
        node_gpus = self.model.node_gpus
        asked = _Asked(self.runtimes, now)  # each features' runtimes, asked once for the whole prediction
        # Per whole-node holder that runs: its release's index, the holder, its runtimes, age and level.
        wholes: list[tuple[int, JobRun, Known, float, float]] = []
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
                    end = self.likely_end(whole, now, asked)
                    if whole.running_since is not None:
                        age = now - whole.running_since + whole.progress
                        level = van_der_corput(whole.job.id + 1)
                        wholes.append((len(releases), whole, asked.of(whole.job), age, level))
                    releases.append(NodeFree(end, pool, whole.job.team, whole.per_pod))
                elif holders:
                    last = max([self.expected_end(h, now, asked) for h in holders])
                    releases.append(NodeFree(last, pool))
                else:
                    free[pool] = free.get(pool, 0) + 1
        mine = self.book.sequence_of(run)
        queued = self._queued_gangs(run, pools, floor, mine, asked)
        usage: dict[tuple[str, str], float] = {}
        for (pool, owner, priority), amount in self.book.held.items():
            if priority >= floor and pool in nodes:
                usage[(owner, pool)] = usage.get((owner, pool), 0.0) + amount
        gang = self._gang(run, run.job.team, pools, mine, asked)
        world = NodeReplay(
            free=free,
            releases=releases,
            queued=queued,
            usage=usage,
            nominal=capacity.nominal or capacity.flavor_limit,
            node_size=run.per_pod,
            capacity={p: capacity.pools[p] for p in pools} if capacity.preemption else None,
        )
        return self._median_start(now, gang, world, wholes)

    def _median_start(
        self, now: float, gang: Gang, world: NodeReplay, wholes: list[tuple[int, JobRun, Known, float, float]]
    ) -> float | None:
        """The median start over :data:`GANG_DRAWS` node replays of ``world``: in the ``k``-th,
        each whole-node holder of ``wholes`` (its release's index in ``world.releases``, the
        holder, its runtimes, its age and its level) ends at its level shifted by
        ``k / GANG_DRAWS`` (a rotation of the low-discrepancy levels; the first replay is
        ``world`` itself). Which of the holders' heavy-tailed runs end first decides the start,
        and one draw per holder leaves the ETA as spread as that one draw."""
        found = [gang_start(now, gang, world)]
        if wholes:
            releases = world.releases
            for k in range(1, GANG_DRAWS):
                shifted = list(releases)
                for i, holder, known, age, level in wholes:
                    left = self.runtimes.remaining_of(known, age, (level + k / GANG_DRAWS) % 1.0)
                    was = releases[i]
                    shifted[i] = NodeFree(now + max(0.0, left), was.pool, holder.job.team, holder.per_pod)
                found.append(gang_start(now, gang, replace(world, releases=shifted)))
        starts = sorted(start for start in found if start is not None)
        return starts[len(starts) // 2] if starts else None

    def _queued_gangs(
        self, run: JobRun, pools: tuple[str, ...], floor: int, mine: int, asked: _Asked
    ) -> list[Gang]:
        """The whole-node gangs queued before ``run`` (sequence ``mine``) that may use its pools,
        of priority ``floor`` or more, as the node replay sees them."""
        shared: dict[frozenset[str], tuple[str, ...]] = {}  # per group's pools, the ones of ``pools``
        queued = []
        for other, key, seq in self.book.gangs(run.pools, run.per_pod, floor, mine):
            theirs = shared.get(key[0])
            if theirs is None:
                theirs = shared[key[0]] = tuple(p for p in pools if p in key[0])
            queued.append(self._gang(other, key[1], theirs, seq, asked))
        return queued

    def _gang(self, run: JobRun, queue: str, pools: tuple[str, ...], order: float, asked: _Asked) -> Gang:
        """A queued whole-node job as the node replay sees it: a run not started yet is drawn from
        the runtimes of its features."""
        known = asked.of(run.job)
        curve = known.runtime_curve(self.runtimes.predictor) if run.progress == 0 else None
        duration = max(run.job.startup, known.mean - run.progress)
        return Gang(queue, pools, run.job.pods, run.priority, order, duration, curve)
