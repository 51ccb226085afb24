"""When will a pending workload start? Pure estimates from what a scheduler can know.

Three estimates, each playing the queue forward from expected ends:

* :func:`replay_start`, the simulator's ETA at submission: pools (flavors) with their
  capacity, queues with their quotas (a namespace quota over every pool, a ClusterQueue's
  nominal and borrowing limit per flavor), the queued work of every queue in the order the
  scheduler takes it (priority, then arrival; BestEffortFIFO lets work that fits start past
  work that does not), and reclaim of borrowed quota by a queue within its nominal::

      at now, and after each expected end (of running work, or of work started in the replay):
          start every queued item that fits, in order; then the asked one, if it fits

* :func:`gang_start`, the ETA of a gang whose every pod takes a whole node, in the simulator at
  submission and in the live ETA (:mod:`gpuplane.insight.queue_eta`): the nodes (free, or
  freeing at an expected end) and the queued gangs of every queue, taken as the scheduler's
  BestEffortFIFO cycles take them (one head per queue per cycle; within nominal, then priority,
  then queue time), with reclaim of nodes that borrowing queues hold.

* :func:`predict_start`, one pool as one bucket (a node's GPUs, for the live ETA of a pod
  that needs one node).

Inputs are only what the control plane knows: the queue order, each workload's request, and
*expected* durations (a declared runtime, or what the caller learned per class, as a mean or as
a curve); never the true run times. Running work past its expected end is taken to end now.
Placement (fragmentation, topology) is ignored except by :func:`gang_start`, so the others are a
lower bound when a pool is fragmented.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

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


# --- the queue replay: pools, queues, quotas and queue order together -------------------------


@dataclass(frozen=True, slots=True)
class Capacity:
    """What bounds every start: pools (flavors) and the quotas of queues.

    ``pools`` is each pool's capacity. ``queue_limit`` caps a queue's usage over every pool (a
    namespace ResourceQuota); ``flavor_limit`` caps it in one pool (nominal quota plus borrowing
    limit; missing means the queue may borrow the whole pool). ``nominal`` is a queue's nominal
    quota per pool when borrowed quota can be reclaimed: a queue below it there may count what the
    other queues use above theirs as free. ``preemption``: work of a lower priority than the
    asked workload gives way to it (it is left out of the replay).
    """

    pools: Mapping[str, float]
    queue_limit: Mapping[str, float] = field(default_factory=dict)
    flavor_limit: Mapping[tuple[str, str], float] = field(default_factory=dict)
    nominal: Mapping[tuple[str, str], float] = field(default_factory=dict)
    preemption: bool = True


@dataclass(frozen=True, slots=True)
class Running:
    """Running work: what it holds of a pool, for which queue, until when (expected)."""

    end: float
    pool: str
    queue: str
    amount: float


@dataclass(frozen=True, slots=True)
class Queued:
    """Queued work: the pools it may use (in the order it tries them), its queue, size and expected run."""

    queue: str
    pools: tuple[str, ...]
    amount: float
    duration: float


@dataclass(slots=True)
class _Usage:
    """What is in use during a replay, by pool, by queue and pool, and by queue."""

    capacity: Capacity
    pool: dict[str, float]
    queue_pool: dict[tuple[str, str], float]
    queue: dict[str, float]

    @classmethod
    def of(cls, capacity: Capacity, used: Iterable[tuple[str, str, float]]) -> _Usage:
        """What ``used`` holds, added up as :meth:`add` would one by one (the same sums in the same
        order), without a call per entry: a replay starts from every running queue and pool."""
        pool: dict[str, float] = {}
        queue_pool: dict[tuple[str, str], float] = {}
        queue: dict[str, float] = {}
        for name, owner, amount in used:
            pool[name] = pool.get(name, 0.0) + amount
            key = (owner, name)
            queue_pool[key] = queue_pool.get(key, 0.0) + amount
            queue[owner] = queue.get(owner, 0.0) + amount
        return cls(capacity, pool, queue_pool, queue)

    def add(self, pool: str, queue: str, amount: float) -> None:
        self.pool[pool] = self.pool.get(pool, 0.0) + amount
        key = (queue, pool)
        self.queue_pool[key] = self.queue_pool.get(key, 0.0) + amount
        self.queue[queue] = self.queue.get(queue, 0.0) + amount

    def reclaimable(self, queue: str, pool: str, amount: float) -> float:
        """What other queues borrow in ``pool``, if ``queue`` stays within its nominal quota there."""
        nominal = self.capacity.nominal
        mine = nominal.get((queue, pool))
        if mine is None or self.queue_pool.get((queue, pool), 0.0) + amount > mine + EPSILON:
            return 0.0
        return sum(
            max(0.0, used - nominal.get(key, 0.0))
            for key, used in self.queue_pool.items()
            if key[1] == pool and key[0] != queue
        )

    def room(self, item: Queued, reclaim: bool) -> str | None:
        """The first pool ``item`` fits in now, or ``None``."""
        cap = self.capacity
        amount = item.amount
        limit = cap.queue_limit.get(item.queue)
        if limit is not None and self.queue.get(item.queue, 0.0) + amount > limit + EPSILON:
            return None
        for pool in item.pools:
            flavor = cap.flavor_limit.get((item.queue, pool))
            if (
                flavor is not None
                and self.queue_pool.get((item.queue, pool), 0.0) + amount > flavor + EPSILON
            ):
                continue
            free = cap.pools.get(pool, 0.0) - self.pool.get(pool, 0.0)
            if reclaim and free + EPSILON < amount:
                free += self.reclaimable(item.queue, pool, amount)
            if free + EPSILON >= amount:
                return pool
        return None


def largest_fit(queue: str, pools: tuple[str, ...], capacity: Capacity) -> float:
    """The most one item of ``queue`` may ask and still fit one of ``pools`` with nothing else
    running (``-inf`` with no pools)."""
    limit = capacity.queue_limit.get(queue, math.inf)
    flavor = capacity.flavor_limit
    return max(
        (min(capacity.pools.get(p, 0.0), flavor.get((queue, p), math.inf), limit) for p in pools),
        default=-math.inf,
    )


def ever_fits(item: Queued, capacity: Capacity) -> bool:
    """Whether ``item`` fits some pool of its own with nothing else running."""
    return item.amount <= largest_fit(item.queue, item.pools, capacity) + EPSILON


def drain_rate(item: Queued, capacity: Capacity) -> float:
    """What ``item``'s queue can hold at most at once in ``item``'s pools: the rate a backlog drains at."""
    in_pools = sum(
        min(capacity.pools.get(p, 0.0), capacity.flavor_limit.get((item.queue, p), math.inf))
        for p in item.pools
    )
    return max(EPSILON, min(in_pools, capacity.queue_limit.get(item.queue, math.inf)))


def _by_kind(ahead: Sequence[Queued], capacity: Capacity) -> tuple[list[tuple[Queued, int]], int]:
    """The items of ``ahead`` that could ever fit, each with its kind (its queue and pools), and
    the number of kinds."""
    kinds: dict[tuple[str, tuple[str, ...]], tuple[int, float]] = {}
    waiting: list[tuple[Queued, int]] = []
    for item in ahead:
        kind = kinds.get((item.queue, item.pools))
        if kind is None:
            largest = largest_fit(item.queue, item.pools, capacity) + EPSILON
            kind = kinds[(item.queue, item.pools)] = (len(kinds), largest)
        if item.amount <= kind[1]:
            waiting.append((item, kind[0]))
    return waiting, len(kinds)


def _start_what_fits(  # noqa: PLR0913 - one round of the replay's state
    waiting: list[tuple[Queued, int]],
    *,
    kinds: int,
    usage: _Usage,
    freed: tuple[str, str] | None,
    t: float,
    started: list[tuple[float, int, str, str, float]],
) -> list[tuple[Queued, int]]:
    """One round of :func:`replay_start`: start, in order, each waiting item with room at ``t``
    (onto the ``started`` heap); returns those left waiting. Within a round usage only grows, so
    once an item of a kind finds no room, no later item of that kind asking as much or more does."""
    still: list[tuple[Queued, int]] = []
    refused = [math.inf] * kinds  # by kind, the least amount found no room this round
    for entry in waiting:
        item, kind = entry
        if freed is not None and freed[1] != item.queue and freed[0] not in item.pools:
            still.append(entry)  # nothing that bounds it got room back since it last did not fit
            continue
        if item.amount >= refused[kind]:
            still.append(entry)
            continue
        room = usage.room(item, reclaim=False)
        if room is None:
            refused[kind] = item.amount
            still.append(entry)
            continue
        usage.add(room, item.queue, item.amount)
        heapq.heappush(started, (t + item.duration, len(started), room, item.queue, item.amount))
    return still


MAX_STEPS = 256  # expected ends a replay plays (one more than this) before it extrapolates


def replay_start(  # noqa: PLR0913 - keyword-only: what runs, ends, waits ahead, and the bound
    now: float,
    asked: Queued,
    *,
    capacity: Capacity,
    used: Iterable[tuple[str, str, float]],
    releases: Iterable[Running],
    ahead: Sequence[Queued] = (),
    backlog: float = 0.0,
    rate: float | None = None,
    max_steps: int = MAX_STEPS,
    tried: bool = False,
) -> float | None:
    """Expected start of ``asked``, queued behind ``ahead``, by playing the queues forward.

    ``used`` is ``(pool, queue, amount)`` of the running work; ``releases`` the same work as
    :class:`Running` in order of expected end (read only as far as needed; an end in the past is
    taken as ``now``). ``ahead`` is the queued work that goes first, in the order the scheduler
    takes it (priority, then arrival). ::

        at now, and after each expected end:
            for each queued item in order, then ``asked``:
                start it in its first pool with room (pool capacity, queue and flavor quotas)
                -- an item that does not fit lets the ones behind it try (BestEffortFIFO) --
                a started item ends ``duration`` later
        ``asked`` alone may reclaim what other queues borrow, while it stays within its nominal

    ``backlog`` is further queued work ahead (GPU-equivalent seconds) not worth playing one by
    one: it delays the start by ``backlog`` over :func:`drain_rate`, or over ``rate`` when that is
    lower (what the queue is seen to run at once: under load, what holds its quota without
    running lowers it). After
    ``max_steps`` expected ends the rest of the queue ahead is counted the same way. Returns
    ``None`` when ``asked`` can never fit, or nothing left running would make room for it.

    ``tried``: the scheduler has just tried ``asked`` and everything ``ahead`` at ``now``, and
    none started (where a pool as a bucket may show room, nodes or gang shapes had none). Then
    nothing starts before the first expected end: the replay's first round is after it.
    """
    if not ever_fits(asked, capacity):
        return None
    usage = _Usage.of(capacity, used)
    most = drain_rate(asked, capacity)
    rate = most if rate is None else max(EPSILON, min(rate, most))
    waiting, kinds = _by_kind(ahead, capacity)
    started: list[tuple[float, int, str, str, float]] = []  # heap: (end, sequence, pool, queue, amount)
    pending = iter(releases)
    # The first release is read only when one is needed: most often ``asked`` fits at once, and
    # reading one may cost a merge of every pool's running work.
    upcoming: Running | None = None
    unread = True
    t = now
    freed: tuple[str, str] | None = None  # (pool, queue) of the last release: all else only filled up
    for step in range(max_steps + 1):
        # Tried at ``now`` and not started: the first round is after the first expected end.
        if not (tried and step == 0):
            waiting = _start_what_fits(waiting, kinds=kinds, usage=usage, freed=freed, t=t, started=started)
            if usage.room(asked, reclaim=True) is not None:
                return t + backlog / rate
        # The next expected end: of running work or of work started in the replay.
        if unread:
            upcoming, unread = next(pending, None), False
        if started and (upcoming is None or started[0][0] <= upcoming.end):
            end, _, pool, queue, amount = heapq.heappop(started)
        elif upcoming is not None:
            end, pool, queue, amount = upcoming.end, upcoming.pool, upcoming.queue, upcoming.amount
            upcoming = next(pending, None)
        else:
            return None
        t = max(t, end)
        usage.add(pool, queue, -amount)
        freed = (pool, queue)
    left = sum(item.amount * item.duration for item, _ in waiting)
    return t + (backlog + left) / rate


@dataclass(frozen=True, slots=True)
class RuntimeCurve:
    """A runtime distribution as a step survival curve: ``survival[i]`` on ``[times[i], times[i+1])``,
    zero from ``times[-1]`` on (the longest runtime observed); ``area[i]`` is the area under the
    curve from ``times[i]`` to the end."""

    times: tuple[float, ...]
    survival: tuple[float, ...]
    area: tuple[float, ...]
    # The survival negated (it never rises, so this never falls): what the searches by level
    # bisect, the same order a key of ``-alive`` gives, without a call per step.
    falling: tuple[float, ...] = field(init=False, repr=False, compare=False)
    # The expected runtime of a run not started yet (what is left at age 0), asked at every
    # arrival and start: worked out once.
    mean: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "falling", tuple(-alive for alive in self.survival))
        object.__setattr__(self, "mean", self.remaining(0.0))

    def remaining(self, age: float) -> float:
        """Expected further runtime of a run that has run ``age`` so far (0 past the longest seen)."""
        i = bisect.bisect_right(self.times, age) - 1
        if i < 0:
            return self.area[0] - age if self.area else 0.0
        if i >= len(self.survival) or self.survival[i] <= 0.0:
            return 0.0
        return (self.area[i] - self.survival[i] * (age - self.times[i])) / self.survival[i]

    def survival_at(self, age: float) -> float:
        """Share of runs still running at ``age``."""
        i = bisect.bisect_right(self.times, age) - 1
        if i < 0:
            return 1.0
        return self.survival[i] if i < len(self.survival) else 0.0

    def quantile(self, level: float) -> float:
        """The runtime by which a share ``level`` of runs has ended (the longest seen, past the
        curve's last drop)."""
        # survival never rises: the first level at or below 1 - level, by bisection.
        i = bisect.bisect_left(self.falling, level - 1.0 - EPSILON)
        return self.times[i] if i < len(self.survival) else self.times[-1]

    def remaining_at(self, age: float, level: float) -> float | None:
        """The further runtime by which a share ``level`` of the runs that reached ``age`` have
        ended; ``None`` when that lies past the longest run seen (the curve cannot tell)."""
        target = self.survival_at(age) * (1.0 - level)
        i = bisect.bisect_left(self.falling, -target - EPSILON)
        if i >= len(self.survival) or target <= 0.0:
            return None
        return max(0.0, self.times[i] - age)


def runtime_curve(finished: Sequence[float], running: Iterable[float]) -> RuntimeCurve | None:
    """The Kaplan-Meier runtime curve of ``finished`` runtimes and the runtimes so far of
    ``running`` work (censored: they last at least that long), up to the longest seen.

    At each finished runtime the survival drops by one over the runs still at risk (finished
    later, or running longer). Finished runs alone would say "runs are short" while the long ones
    are still running; the class mean of a heavy-tailed distribution counts runs longer than
    anything a queue will wait for. ``None`` without a finished run.
    """
    if not finished:
        return None
    # The walk over the runtimes in order, vectorized (a class's curve is relearned from every run
    # it finished, tens of thousands in a long run). Each step is the float operation the plain
    # loop would do, in the same order (cumprod and cumsum accumulate one element at a time), so
    # the curve is the same to the last bit:
    #   for each runtime in order (at equal times the finished first: a censored run is still
    #   at risk then): when it is past the last step, a step (the last time, the survival so far);
    #   when finished, survival *= 1 - 1 / at_risk; then one fewer at risk.
    ends = np.fromiter(finished, dtype=np.float64, count=len(finished))
    runtimes = np.concatenate((ends, np.fromiter(running, dtype=np.float64)))
    order = np.argsort(runtimes, kind="stable")  # stable: the finished (first in ``runtimes``) first
    times = runtimes[order]
    at_risk = np.arange(len(times), 0, -1, dtype=np.float64)
    after = np.cumprod(np.where(order >= len(ends), 1.0, 1.0 - 1.0 / at_risk))  # survival after each
    before = np.concatenate(([1.0], after[:-1]))
    steps = np.flatnonzero(times > np.maximum(np.concatenate(([0.0], times[:-1])), 0.0))
    levels = before[steps]
    starts = np.concatenate(([0.0], times[steps]))
    areas = np.cumsum((levels * np.diff(starts))[::-1])[::-1]  # area from each step to the end
    return RuntimeCurve(tuple(starts.tolist()), tuple(levels.tolist()), tuple(areas.tolist()))


def van_der_corput(k: int) -> float:
    """The ``k``-th point (from 1) of the base-2 van der Corput sequence: 1/2, 1/4, 3/4, 1/8, ...

    Any prefix of it spreads over (0, 1) about evenly, so drawing the ``k``-th runtime at this
    level of a runtime curve gives a deterministic sample with the curve's short and long runs in
    their proportions, whatever the number drawn.
    """
    # Its binary digits mirrored past the point: the digits reversed over 2**bits. The sum of
    # their powers of two is exact in a float (fewer than 53 digits), and so is this quotient, so
    # it is the same number as adding the digits one by one, without a loop over them.
    return int(format(k, "b")[::-1], 2) / (1 << k.bit_length()) if k > 0 else 0.0


@dataclass(frozen=True, slots=True, eq=False)
class Gang:
    """Queued work whose every pod takes a whole node.

    ``pools`` are the pools it may use, in the order the scheduler tries them; ``nodes`` how many
    it takes at once; ``priority`` and ``order`` (its queue time, or any number that sorts the
    same) its place in the scheduler's order; ``duration`` its expected run, or, with ``runtime``
    (its class's learned curve), a run drawn from that curve when it starts in a replay;
    ``reclaim``: whether its queue may reclaim nodes that borrowing queues hold.
    """

    queue: str
    pools: tuple[str, ...]
    nodes: int
    priority: int
    order: float
    duration: float
    runtime: RuntimeCurve | None = None
    reclaim: bool = True


@dataclass(frozen=True, slots=True)
class NodeFree:
    """A node of ``pool`` that is expected to be free (nothing of the asked priority or higher left
    on it) at ``end``; ``amount`` of ``queue``'s quota there is given back then."""

    end: float
    pool: str
    queue: str = ""
    amount: float = 0.0


@dataclass(frozen=True, slots=True)
class _Held:
    """Nodes held in a replay until ``end``: how many, in which pool, and the quota they take."""

    end: float
    pool: str
    queue: str
    nodes: int
    amount: float


@dataclass(slots=True)
class _GangReplay:
    """The state of a :func:`gang_start` replay: free nodes, quota used, queued gangs, held nodes."""

    free: dict[str, int]
    usage: dict[tuple[str, str], float]
    nominal: Mapping[tuple[str, str], float]
    capacity: Mapping[str, float]
    node_size: float
    queues: dict[str, list[Gang]] = field(default_factory=dict)
    held: dict[int, _Held] = field(default_factory=dict)
    ends: list[tuple[float, int]] = field(default_factory=list)  # heap: (end, key in held)
    started: int = 0
    holds: int = 0
    last_order: float = 0.0
    starts: dict[int, float] = field(default_factory=dict)  # by id of the gang: when it started

    def hold(self, held: _Held) -> None:
        self.holds += 1
        self.held[self.holds] = held
        heapq.heappush(self.ends, (held.end, self.holds))

    def next_end(self) -> _Held | None:
        """The next nodes to free (those of evicted gangs are gone already)."""
        while self.ends:
            _, key = heapq.heappop(self.ends)
            held = self.held.pop(key, None)
            if held is not None:
                return held
        return None

    def borrows(self, queue: str, pool: str, more: float = 0.0) -> bool:
        used = self.usage.get((queue, pool), 0.0) + more
        return used > self.nominal.get((queue, pool), 0.0) + EPSILON

    def borrowing(self, gang: Gang) -> bool:
        """Whether ``gang`` would take its queue above its nominal quota in its first pool."""
        return self.borrows(gang.queue, gang.pools[0], gang.nodes * self.node_size)

    def release(self, held: _Held) -> None:
        self.free[held.pool] = self.free.get(held.pool, 0) + held.nodes
        if held.queue:
            key = (held.queue, held.pool)
            self.usage[key] = self.usage.get(key, 0.0) - held.amount

    def start(self, gang: Gang, pool: str, t: float) -> None:
        self.queues[gang.queue].remove(gang)
        self.free[pool] -= gang.nodes
        amount = gang.nodes * self.node_size
        self.usage[(gang.queue, pool)] = self.usage.get((gang.queue, pool), 0.0) + amount
        self.started += 1
        self.starts.setdefault(id(gang), t)
        duration = gang.duration
        if gang.runtime is not None:
            duration = gang.runtime.quantile(van_der_corput(self.started))
        self.hold(_Held(t + duration, pool, gang.queue, gang.nodes, amount))

    def reclaim(self, gang: Gang, t: float) -> str | None:
        """The pool where ``gang`` reclaims nodes, or ``None``. As the scheduler does: only when
        the pool's quota is short (with room in quota, a gang that finds no node waits), only while
        its queue stays within its nominal quota there, and only nodes of gangs of queues that
        borrow there, the latest to end first; they go back to the end of their queues with what
        was left of their run."""
        plan = self._reclaim_plan(gang)
        if plan is None:
            return None
        pool, chosen = plan
        for key in chosen:
            held = self.held.pop(key)
            self.release(held)
            self.last_order += 1.0
            victim = Gang(held.queue, gang.pools, held.nodes, gang.priority, self.last_order, held.end - t)
            self.queues.setdefault(held.queue, []).append(victim)
        return pool

    def _reclaim_plan(self, gang: Gang) -> tuple[str, list[int]] | None:
        """Where :meth:`reclaim` would take nodes, and whose, changing nothing."""
        amount = gang.nodes * self.node_size
        for pool in gang.pools if gang.reclaim else ():
            if pool not in self.capacity or self.borrows(gang.queue, pool, amount):
                continue
            in_use = sum(used for (_, p), used in self.usage.items() if p == pool)
            if self.capacity[pool] - in_use + EPSILON >= amount:
                continue
            candidates = sorted(
                (
                    (held.end, key)
                    for key, held in self.held.items()
                    if held.pool == pool and held.queue and held.queue != gang.queue
                ),
                reverse=True,
            )
            chosen: list[int] = []
            taken: dict[str, float] = {}
            found = self.free.get(pool, 0)
            for _, key in candidates:
                if found >= gang.nodes:
                    break
                held = self.held[key]
                given = taken.get(held.queue, 0.0)
                if self.borrows(held.queue, pool, -given):  # still borrows without what is taken
                    chosen.append(key)
                    taken[held.queue] = given + held.amount
                    found += held.nodes
            if found < gang.nodes:
                continue
            return pool, chosen
        return None

    def could_start(self, gang: Gang) -> bool:
        """Whether ``gang`` fits the free nodes of one of its pools or could reclaim some: the
        scheduler wakes a parked gang only then (``Waker.still_short`` in the core)."""
        free = self.free
        for pool in gang.pools:
            if free.get(pool, 0) >= gang.nodes:
                return True
        return self._reclaim_plan(gang) is not None

    def cycles(self, asked: Gang, t: float) -> bool:
        """The scheduler's cycles at ``t``: each queue's first gang not tried yet that could start
        (:meth:`could_start`) is its head; heads go in the scheduler's order (within nominal
        first, then priority, then queue time); a head that fits the free nodes of one of its
        pools, or reclaims nodes (:meth:`reclaim`), starts there; one that does not waits for the
        next release. After the first cycle, cycles go on while nodes are free and heads are
        left. True when ``asked`` started."""
        tried: dict[str, int] = {}  # per queue, how many of its first gangs were tried (none started)
        # could_start per kind of gang (queue, pools, nodes, reclaim) until the next start.
        verdicts: dict[tuple[str, tuple[str, ...], int, bool], bool] = {}
        first = True
        while first or any(n > 0 for n in self.free.values()):
            first = False
            heads = []
            for name, queue in self.queues.items():
                # Gangs that could not start are left parked: the next one heads the queue.
                i = tried.get(name, 0)
                while i < len(queue):
                    gang = queue[i]
                    kind = (name, gang.pools, gang.nodes, gang.reclaim)
                    could = verdicts.get(kind)
                    if could is None:
                        could = verdicts[kind] = self.could_start(gang)
                    if could:
                        break
                    i += 1
                tried[name] = i
                if i < len(queue):
                    heads.append(queue[i])
            if not heads:
                return False
            heads.sort(key=lambda g: (self.borrowing(g), -g.priority, g.order))
            for gang in heads:
                pool = next((p for p in gang.pools if self.free.get(p, 0) >= gang.nodes), None)
                if pool is None:
                    pool = self.reclaim(gang, t)
                if pool is None:
                    tried[gang.queue] = tried.get(gang.queue, 0) + 1
                    continue
                if gang is asked:
                    return True
                self.start(gang, pool, t)  # out of its queue: the next one is that queue's head
                verdicts.clear()
        return False


@dataclass(frozen=True, slots=True)
class NodeReplay:
    """What a node replay (:func:`gang_start`, :func:`gang_starts`) starts from.

    ``free`` is how many nodes of each pool are free now; ``releases`` the others, each at its
    expected end (an end in the past is taken as the replay's start). ``queued`` are the gangs
    queued (of at least the asked one's priority), any queue, any order. ``usage`` and
    ``nominal`` are each queue's quota used and nominal quota per pool (for the scheduler's
    order, and reclaim); ``node_size`` what one node counts for in them; ``capacity`` each pool's
    quota in all (without it, nothing is reclaimed)."""

    free: Mapping[str, int]
    releases: Sequence[NodeFree]
    queued: Sequence[Gang]
    usage: Mapping[tuple[str, str], float]
    nominal: Mapping[tuple[str, str], float]
    node_size: float
    capacity: Mapping[str, float] | None = None


def gang_start(
    now: float,
    asked: Gang,
    world: NodeReplay,
    *,
    max_steps: int = MAX_STEPS,
    starts: dict[int, float] | None = None,
) -> float | None:
    """Expected start of a whole-node gang, by playing the nodes and the gangs' queues forward.

    ``world`` holds the nodes, the queued gangs and the quotas (see :class:`NodeReplay`); its
    queued gangs are those queued before ``asked``, with ``order`` below ``asked``'s, and
    ``asked`` goes last in its own queue. It mirrors the scheduler's BestEffortFIFO cycles,
    which take one head per queue per cycle::

        at now, and after each release (of a node of the input, or of a gang started here):
            cycle: each queue's head = its first gang not tried since the last release
                   heads in order: within nominal first, then priority, then queue time
                   a head that fits the free nodes of one of its pools starts there,
                   or one that reclaims nodes of borrowing queues (see _GangReplay.reclaim)
                   -- one that does not is tried again after the next release --
            cycle again while nodes are free and heads are left

    So a gang at the head of its queue that asks more nodes than are free keeps its queue out of
    a cycle, and a gang behind it starts only in a later cycle, when what freed may be taken. A
    gang started here runs its ``duration``, or with a ``runtime`` curve the curve's quantile at
    the next point of :func:`van_der_corput`: gangs that end early free nodes for the ones after
    them, which a single mean would hide. After ``max_steps`` releases, the gangs left ahead of
    ``asked`` (queued earlier, or ahead in its queue) count as node-seconds over the nodes seen.
    Returns ``None`` when no release would make room for ``asked``. With ``starts``, the start of
    every gang of ``queued`` the replay reached is put there, by ``id`` (see :func:`gang_starts`).
    """
    state = _GangReplay(
        dict(world.free), dict(world.usage), world.nominal, world.capacity or {}, world.node_size
    )
    for gang in sorted(world.queued, key=lambda g: (-g.priority, g.order)):
        state.queues.setdefault(gang.queue, []).append(gang)
        state.last_order = max(state.last_order, gang.order)
    state.queues.setdefault(asked.queue, []).append(asked)
    state.last_order = max(state.last_order, asked.order)
    nodes = sum(world.free.values()) + len(world.releases)
    # As many holds as releases, heaped at once: each key in ``held`` is new, so the heap's
    # entries are all different and come off in the same order as pushed one by one.
    for node in world.releases:
        freeing = _Held(max(now, node.end), node.pool, node.queue, 1, node.amount)
        state.holds += 1
        state.held[state.holds] = freeing
        state.ends.append((freeing.end, state.holds))
    heapq.heapify(state.ends)
    t = now
    if starts is not None:
        state.starts = starts
    for _ in range(max_steps + 1):
        if state.cycles(asked, t):
            return t
        held = state.next_end()  # of a node of the input, or the nodes of a gang started here
        if held is None:
            return None
        t = max(t, held.end)
        state.release(held)
    if starts is not None:  # the gangs left start as their node-seconds ahead allow, in order
        left = sorted(
            (g for q in state.queues.values() for g in q if g is not asked),
            key=lambda g: (-g.priority, g.order),
        )
        work = 0.0
        for g in left:
            starts.setdefault(id(g), t + work / max(1, nodes))
            work += g.nodes * g.duration
    ahead = [
        g
        for queue in state.queues.values()
        for g in queue
        if g is not asked and (g.order < asked.order or g.queue == asked.queue)
    ]
    return t + sum(g.nodes * g.duration for g in ahead) / max(1, nodes)


def gang_starts(now: float, world: NodeReplay, *, max_steps: int = MAX_STEPS) -> dict[int, float]:
    """Expected starts of all of ``world.queued`` (by ``id``) in one replay of :func:`gang_start`:
    the asked gang is one that never fits, so the replay plays until the releases run out (a gang
    missing never starts) or for ``max_steps`` releases (the gangs left then start as their
    node-seconds over the nodes allow, in the scheduler's order)."""
    never = Gang("", ("",), 1, -(2**63), math.inf, 0.0, reclaim=False)
    out: dict[int, float] = {}
    gang_start(now, never, world, max_steps=max_steps, starts=out)
    return out
