"""Workloads of a scenario: arrivals, sizes, durations and GPU busy fractions, drawn once.

Every random draw happens here, before any configuration runs, from a ``numpy`` Generator per
workload class (seeded from the scenario seed and the class name, so adding a class leaves the
others' draws alone). Every configuration then replays the *same* :class:`Job` list and the same
node failures.

Work model of one job::

    run:  | startup (GPU idle) | compute: progress advances 1 s per s ... | done when progress = work
    stop: checkpointed work keeps progress up to the last checkpoint; stateless work keeps all of it;
          other work starts over. The next run pays the startup again.

Job names: each team reuses names for reruns of the same work (:func:`base_names`). A name has its
own typical runtime and its own pod shape, so runtimes spread much less within a name than across
the class, and sizes go with names. The names are drawn after everything else, from a stream of
their own, and conditioned on what was drawn: every arrival, size and runtime is what it was
without them.

GPU activity while computing is ``activity`` GPU-equivalents per pod: a whole-GPU pod's busy
fraction times its GPUs; a fraction or MIG pod's busy fraction of one GPU. Sessions (notebooks)
compute only inside their ``active`` stretches of progress.
"""

from __future__ import annotations

import math
import zlib
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from gpuplane.model import mig
from gpuplane.sim.scenario import Scenario, Shape, WorkloadClass

MILLI = 1000

# Job names (see docs/simulator.md, "Job names"): assumptions informed by the PAI 2020 trace, whose
# group tag marks repeated instances; its figures per group were not at hand.
RUNS_PER_NAME = 20.0  # mean submissions of one name by one team in one class over a scenario
NAME_ZIPF = 1.0  # name popularity within a team and class: the k-th name is used ~ 1 / k**NAME_ZIPF
NAME_SIGMA = 0.35  # spread (sd of log runtime) of the runs of one name: CoV about 0.36
SHAPE_LOYALTY = 0.8  # share of a name's runs at its own shape (the rest as the class's sizes fall)
_NAME_ROWS = 2048  # jobs whose names are drawn in one numpy block


@dataclass(frozen=True, slots=True)
class Request:
    """What one pod asks for: whole GPUs, a fraction of one GPU (milli) or a MIG profile."""

    gpus: int = 0
    fraction_milli: int = 0
    mig: str | None = None
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def share(self) -> float:
        """GPU-equivalents this pod holds when sharing is on."""
        if self.gpus:
            return float(self.gpus)
        if self.fraction_milli:
            return self.fraction_milli / MILLI
        if self.mig is not None:
            return mig_milli(self.mig) / MILLI
        return 0.0

    @property
    def whole(self) -> int:
        """Whole GPUs this pod takes when every GPU request is rounded up to whole GPUs."""
        if self.gpus:
            return self.gpus
        return 1 if (self.fraction_milli or self.mig is not None) else 0

    @property
    def milli(self) -> int:
        """GPU demand in milli-GPU (MIG instances by compute slices of 7), as the core counts it."""
        if self.gpus:
            return self.gpus * MILLI
        if self.mig is not None:
            return mig_milli(self.mig)
        return self.fraction_milli


def mig_milli(profile: str) -> int:
    return mig.parse_profile(profile).compute * MILLI // 7


@dataclass(slots=True)
class Job:
    """One workload as submitted. Immutable in practice; configurations keep their own state."""

    id: int
    name: str
    team: str
    klass: str
    tier: str
    submit: float
    pods: int
    request: Request
    pools: tuple[str, ...]
    work: float
    startup: float
    activity: float
    expected: float
    checkpoint: float | None = None
    stateless: bool = False
    active: tuple[float, ...] = ()  # sessions: [start0, end0, start1, end1, ...] in progress seconds
    start_progress: float = 0.0
    deadline: float | None = None  # replay: the pod is deleted at this time, whatever happened
    continuation_of: int | None = None
    base_name: str = ""  # the name its team reuses for reruns of the same work ("": unknown)

    @property
    def is_session(self) -> bool:
        return bool(self.active)

    @property
    def counts_wait(self) -> bool:
        """Whether a run measures this job's first wait: submitted in the measured window (not in
        the warm-up), and not a reaped session's resumption."""
        return self.submit >= 0 and self.continuation_of is None

    def active_between(self, p0: float, p1: float) -> float:
        """Seconds of computing between progress ``p0`` and ``p1``."""
        if p1 <= p0:
            return 0.0
        if not self.active:
            return p1 - p0
        total = 0.0
        spans = self.active
        i = max(0, bisect_right(spans, p0) - 1)
        i -= i % 2
        while i < len(spans):
            a, b = spans[i], spans[i + 1]
            if a >= p1:
                break
            total += max(0.0, min(b, p1) - max(a, p0))
            i += 2
        return total

    def active_spans(self, p0: float, p1: float) -> list[tuple[float, float]]:
        """Computing stretches (in progress seconds) between ``p0`` and ``p1``."""
        if p1 <= p0:
            return []
        if not self.active:
            return [(p0, p1)]
        out = []
        spans = self.active
        for i in range(0, len(spans), 2):
            a, b = max(spans[i], p0), min(spans[i + 1], p1)
            if a < b:
                out.append((a, b))
        return out

    def idle_gap_after(self, progress: float, threshold: float) -> tuple[float, float] | None:
        """The first idle stretch at or after ``progress`` longer than ``threshold``:
        ``(reap progress, progress when activity resumes)``; resumes == work for the final tail."""
        spans = self.active
        if not spans:
            return None
        gaps = [(spans[i + 1], spans[i + 2]) for i in range(0, len(spans) - 2, 2)]
        gaps.append((spans[-1], self.work))
        for g0, g1 in gaps:
            if g1 <= progress:
                continue
            begin = max(g0, progress)
            if g1 - begin > threshold:
                return begin + threshold, g1
        return None


@dataclass(frozen=True, slots=True)
class NodeEvent:
    time: float
    node: str
    up: bool


@dataclass(frozen=True, slots=True)
class Workloads:
    jobs: tuple[Job, ...]
    node_events: tuple[NodeEvent, ...]
    start: float  # simulation start (negative: warm-up before the measured window)
    horizon: float  # end of the measured window [0, horizon]


def class_rate(scenario: Scenario, wc: WorkloadClass) -> float:
    """Arrivals per second of a class: given, or derived from its share of the offered GPU time.

    offered GPU time = offeredLoad x cluster GPUs; a class with share s arrives at
    s x offered / (mean whole GPUs per job x mean time a job holds them).
    """
    if wc.arrivals_per_day is not None:
        return wc.arrivals_per_day.mean / 86400.0
    assert wc.gpu_time_share is not None
    assert scenario.offered_load is not None
    weights = sum(s.weight for s in wc.shapes)
    gpus = sum(s.weight * s.pods.mean * _whole_per_pod(s) for s in wc.shapes) / weights
    hold = wc.startup.mean + wc.duration.mean + (wc.session.tail.mean if wc.session else 0.0)
    return scenario.offered_load.mean * scenario.gpus * wc.gpu_time_share.mean / (gpus * hold)


def _whole_per_pod(shape: Shape) -> float:
    return shape.gpus.mean if shape.gpus is not None else 1.0


def expected_run(wc: WorkloadClass) -> float:
    """What an ETA may know about a run: the class mean (startup + duration + idle tail)."""
    return wc.startup.mean + wc.duration.mean + (wc.session.tail.mean if wc.session else 0.0)


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([seed, zlib.crc32(name.encode())]))


def _session(rng: np.random.Generator, length: float, wc: WorkloadClass) -> tuple[tuple[float, ...], float]:
    """Active stretches of one session of ``length`` working seconds, and its total length."""
    assert wc.session is not None
    spans: list[float] = []
    t = 0.0
    while t < length:
        active = float(wc.session.active.sample(rng, 1)[0])
        end = min(t + max(active, 1.0), length)
        spans += [t, end]
        t = end + float(wc.session.idle.sample(rng, 1)[0])
    tail = float(wc.session.tail.sample(rng, 1)[0])
    return tuple(spans), spans[-1] + tail


def _requests(shape: Shape, gpus: float) -> Request:
    if shape.fraction is not None:
        return Request(fraction_milli=max(1, round(shape.fraction * MILLI)))
    if shape.mig is not None:
        return Request(mig=shape.mig)
    return Request(gpus=int(gpus))


def generate(scenario: Scenario) -> Workloads:
    """Draw every job and node failure of a scenario (deterministic for a given seed)."""
    start, horizon = -scenario.warmup, scenario.horizon
    drafts: list[tuple[float, int, int, Job]] = []
    teams = scenario.teams
    team_p = np.asarray([t.demand for t in teams], dtype=float)
    team_p /= team_p.sum()
    for ci, wc in enumerate(scenario.classes):
        rng = _rng(scenario.seed, wc.name)
        rate = class_rate(scenario, wc)
        n = int(rng.poisson(rate * (horizon - start)))
        times = np.sort(rng.uniform(start, horizon, n))
        shape_p = np.asarray([s.weight for s in wc.shapes], dtype=float)
        shape_idx = rng.choice(len(wc.shapes), size=n, p=shape_p / shape_p.sum())
        team_idx = rng.choice(len(teams), size=n, p=team_p)
        durations = wc.duration.sample(rng, n)
        startups = wc.startup.sample(rng, n)
        busy = wc.busy.sample(rng, n)
        pods = [s.pods.sample(rng, n) for s in wc.shapes]
        gpus = [s.gpus.sample(rng, n) if s.gpus is not None else np.ones(n) for s in wc.shapes]
        expected = expected_run(wc)
        checkpoint = wc.checkpoint.mean if wc.checkpoint is not None else None
        # A job's size as one number: its shape, pods and GPUs per pod.
        rows = np.arange(n)
        sizes = (
            shape_idx * 1e6
            + np.asarray(pods, dtype=np.float64).reshape(len(wc.shapes), n)[shape_idx, rows] * 1e3
            + np.asarray(gpus, dtype=np.float64).reshape(len(wc.shapes), n)[shape_idx, rows]
        )
        names = base_names(
            _rng(scenario.seed, f"{wc.name}/names"),
            wc.name,
            teams=len(teams),
            team_idx=team_idx,
            sizes=sizes,
            durations=durations,
        )
        for i in range(n):
            si = int(shape_idx[i])
            shape = wc.shapes[si]
            request = _requests(shape, gpus[si][i])
            work = max(1.0, float(durations[i]))
            active: tuple[float, ...] = ()
            if wc.session is not None:
                active, work = _session(rng, work, wc)
            per_pod = float(busy[i]) * (request.gpus if request.gpus else 1.0)
            job = Job(
                id=-1,
                name="",
                team=teams[int(team_idx[i])].name,
                klass=wc.name,
                tier=wc.tier,
                submit=float(times[i]),
                pods=int(pods[si][i]),
                request=request,
                pools=shape.pools,
                work=work,
                startup=float(startups[i]),
                activity=per_pod,
                expected=expected,
                checkpoint=checkpoint,
                stateless=wc.stateless,
                active=active,
                base_name=names[i],
            )
            drafts.append((job.submit, ci, i, job))
    drafts.sort(key=lambda d: (d[0], d[1], d[2]))
    jobs = []
    for number, (_, _, _, job) in enumerate(drafts):
        job.id = number
        job.name = f"{job.klass}-{number:06d}"
        jobs.append(job)
    return Workloads(tuple(jobs), tuple(node_failures(scenario)), start, horizon)


def _letters(k: int) -> str:
    """``k`` as three letters: 0 -> ``aaa``, 1 -> ``aab``, ... (a name suffix no generator adds)."""
    return "".join(chr(ord("a") + (k // 26**p) % 26) for p in (2, 1, 0))


def base_names(  # noqa: PLR0913 - the class's draws the names are conditioned on
    rng: np.random.Generator,
    klass: str,
    *,
    teams: int,
    team_idx: np.ndarray,
    sizes: np.ndarray,
    durations: np.ndarray,
) -> list[str]:
    """The name each of a class's jobs was submitted under, given its team, size and runtime.

    Per team, the class has about one name per :data:`RUNS_PER_NAME` of its jobs, used with Zipf
    popularity (:data:`NAME_ZIPF`). Each name has a typical log runtime, drawn around the class's
    with the spread the class has between names (its whole spread less :data:`NAME_SIGMA`, the
    spread within a name), and a size of its own, drawn as the class's sizes fall, that
    :data:`SHAPE_LOYALTY` of its runs keep. Each job then takes a name drawn from how likely each
    name was to give its size and runtime (a Gumbel draw per job and name): the jobs and their
    runtimes stay exactly as drawn, and the runs of a name spread as the model says (exactly, in
    the limit of many names). Deterministic for a given ``rng``.
    """
    n = len(durations)
    out = [""] * n
    if n == 0:
        return out
    logd = np.log(np.maximum(np.asarray(durations, dtype=np.float64), 1.0))
    spread = float(np.std(logd))
    within = min(NAME_SIGMA, spread)
    between = math.sqrt(max(spread**2 - within**2, 0.0))
    center = float(np.mean(logd))
    for team in range(teams):
        members = np.flatnonzero(team_idx == team)
        if len(members) == 0:
            continue
        k = max(1, round(len(members) / RUNS_PER_NAME))
        popularity = 1.0 / np.arange(1, k + 1, dtype=np.float64) ** NAME_ZIPF
        log_popularity = np.log(popularity / popularity.sum())
        typical = center + between * rng.standard_normal(k)
        codes, inverse, counts = np.unique(sizes[members], return_inverse=True, return_counts=True)
        share = counts / len(members)
        own = rng.choice(len(codes), size=k, p=share)
        for start in range(0, len(members), _NAME_ROWS):
            rows = members[start : start + _NAME_ROWS]
            which = inverse[start : start + _NAME_ROWS]
            logits = np.broadcast_to(log_popularity, (len(rows), k)).copy()
            if within > 0:
                logits -= 0.5 * ((logd[rows][:, None] - typical[None, :]) / within) ** 2
            elsewhere = (1.0 - SHAPE_LOYALTY) * share[which][:, None]
            logits += np.log(np.where(which[:, None] == own[None, :], SHAPE_LOYALTY + elsewhere, elsewhere))
            chosen = np.argmax(logits + rng.gumbel(size=logits.shape), axis=1)
            for row, name in zip(rows.tolist(), chosen.tolist(), strict=True):
                out[row] = f"{klass}-{_letters(name)}"
    return out


def node_failures(scenario: Scenario) -> list[NodeEvent]:
    """Per node: exponential times between failures, fixed repair time; sorted by time."""
    mtbf, repair = scenario.failures.mtbf, scenario.failures.repair
    if mtbf is None:
        return []
    rng = _rng(scenario.seed, "node-failures")
    start, horizon = -scenario.warmup, scenario.horizon
    events: list[NodeEvent] = []
    for pool in scenario.pools:
        for node in pool.node_names():
            t = start + float(rng.exponential(mtbf))
            while t < horizon:
                events.append(NodeEvent(t, node, up=False))
                back = t + repair
                if back < horizon:
                    events.append(NodeEvent(back, node, up=True))
                t = back + float(rng.exponential(mtbf))
    events.sort(key=lambda e: (e.time, e.node, e.up))
    return events


def offered_gpus(scenario: Scenario) -> dict[str, float]:
    """Mean whole GPUs each class asks for at any time (rate x GPUs x hold time): a sanity view."""
    out = {}
    for wc in scenario.classes:
        weights = sum(s.weight for s in wc.shapes)
        gpus = sum(s.weight * s.pods.mean * _whole_per_pod(s) for s in wc.shapes) / weights
        out[wc.name] = class_rate(scenario, wc) * gpus * expected_run(wc)
    return out
