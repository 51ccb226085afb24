"""The ETA error no predictor can avoid: the saturated week followed many times from each prediction.

The simulator's ``etaRelativeErrorP50`` compares the ETA given to each workload left pending at
its arrival with the wait it had. Part of that error is the predictor's; the rest comes from what
no one can know at that instant: how long the running jobs will still run, and how long the work
queued and still to come will run. This benchmark measures that rest.

The built-in week runs at ``--load`` (1.5) under one configuration. At every ``--every``-th
prediction (a workload pending after the pass at its arrival), the simulation forks
(``os.fork``: the whole state copied, the scheduler included) ``--futures`` times. In each fork
every runtime not known yet is drawn again from its class's distribution: what is left of each
running job (given how long it has computed), and the whole run of each queued or future job.
Arrivals, their shapes, node failures and the scheduler stay exactly as they were, so the forks
know more than any predictor could (every future arrival). Each fork runs until the workload
starts and reports its wait. With ``--knows name`` each runtime is drawn instead from its job
name's own runs in the scenario (per team and name with at least three runs: the lognormal of
their work; other jobs from their class): the floor of a predictor that knows every name's
runtime distribution, as the runtime predictor by features tries to learn it.

Per followed workload, the best single ETA for its futures is the one with the lowest median
relative error over them (a search over the futures' own waits). Compared with the wait the
workload really had (its own runtimes were drawn from the same distributions, so that wait is one
more future), over workloads that waited more than 5 minutes:

* **floor p50**: the p50 of that best ETA's relative error, the error a predictor knowing the true
  runtime distributions and every future arrival would still make, with a 90 % interval
  (bootstrap over the workloads);
* **floor from futures**: the same with each future taken as the truth in turn and the best ETA
  of the others (more samples, and no dependence on the one wait that happened);
* **gpuplane's p50** on the same workloads, the ETA the simulator gives (``gpuplane why``'s).

The JSON (``--out``) also holds the share of workloads within the target either way, and every
followed workload's ETA, wait and futures.

Usage::

    python3 bench/run.py eta-floor [-- --load 1.5 --configuration gpuplane --every 3 --futures 12
                                       --knows class|name]

POSIX only (``os.fork``).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import statistics
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from gpuplane.sim.engine import COMPLETE, Engine, Model
from gpuplane.sim.experiment import build_model, scenario_input
from gpuplane.sim.metrics import ETA_RELATIVE_MIN_WAIT
from gpuplane.sim.parallel import default_jobs
from gpuplane.sim.runs import JobRun
from gpuplane.sim.scenario import Param, Scenario, builtin_scenario
from gpuplane.sim.workloads import Job, Workloads

TARGET = 0.25  # the target for etaRelativeErrorP50
NAME_RUNS = 3  # runs of a name in the scenario before --knows name draws from them
WAIT_BYTES = struct.calcsize("d")
NO_START = math.inf  # a future in which the workload had not started by the horizon
_NORMAL = statistics.NormalDist()


def conditional_draw(param: Param, done: float, rng: np.random.Generator) -> float:
    """A runtime from ``param``'s distribution given that it is longer than ``done`` seconds.

    Lognormal: by the inverse of its distribution function over the part above ``done``. Other
    kinds: drawn until one is longer (at most 1,000 draws; else ``done`` plus one second).
    """
    if param.kind == "lognormal" and param.b > param.a > 0:
        mu = math.log(param.a)
        sigma = math.sqrt(2 * math.log(param.b / param.a))
        below = _NORMAL.cdf((math.log(done) - mu) / sigma) if done > 0 else 0.0
        level = below + (1.0 - below) * float(rng.random())
        if level >= 1.0 - 1e-12:
            return done + 1.0
        return max(1.0, done, math.exp(mu + sigma * _NORMAL.inv_cdf(level)))
    for _ in range(1000):
        value = max(1.0, float(param.sample(rng, 1)[0]))
        if value > done:
            return value
    return done + 1.0


def name_runtimes(jobs: Iterable[Job]) -> dict[tuple[str, str], Param]:
    """Per team and job name with at least :data:`NAME_RUNS` runs in the whole scenario, the
    lognormal of those runs' work (the mean and spread of their logs): what a predictor that knew
    every name's own runtime distribution would draw from."""
    logs: dict[tuple[str, str], list[float]] = {}
    for job in jobs:
        if job.base_name and not job.is_session and job.deadline is None:
            logs.setdefault((job.team, job.base_name), []).append(math.log(max(job.work, 1.0)))
    out = {}
    for key, values in logs.items():
        if len(values) >= NAME_RUNS:
            mu, sigma = statistics.fmean(values), max(statistics.pstdev(values), 0.01)
            out[key] = Param("lognormal", math.exp(mu), math.exp(mu + sigma**2 / 2), source="name")
    return out


@dataclass(slots=True)
class Followed:
    """One followed prediction: the workload, its submit, the ETA given, and its futures' waits."""

    job: int
    klass: str
    submit: float
    predicted: float
    futures: list[float]
    wait: float | None = None  # the wait it really had (None: never started in the run)


class FollowingEngine(Engine):
    """The engine, forking at every ``every``-th prediction to follow the workload's futures."""

    def __init__(
        self,
        model: Model,
        workloads: Workloads,
        gpus: int,
        reaper_idle: float,
        *,
        scenario: Scenario,
        every: int,
        futures: int,
        jobs: int,
        knows: str = "class",
        on_follow: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(model, workloads, gpus, reaper_idle)
        self.durations = {wc.name: wc.duration for wc in scenario.classes if wc.session is None}
        self.by_name = name_runtimes(workloads.jobs) if knows == "name" else {}
        self.seed = scenario.seed
        self.every = every
        self.futures = futures
        self.parallel = jobs
        self.seen = 0
        self.followed: dict[int, Followed] = {}
        self.watch: int | None = None  # in a fork: the workload it follows
        self.report_fd = -1
        self.on_follow = on_follow

    # --- the parent -----------------------------------------------------------------------------

    def predict_pending(self, now: float, *, tried: bool) -> None:
        arrived = list(self.arrived)
        super().predict_pending(now, tried=tried)
        if self.watch is not None:
            return
        for run in arrived:
            if run.predicted is None or run.first_start is not None or run.done:
                continue
            self.seen += 1
            if self.seen % self.every:
                continue
            waits = self._futures(run, now)
            if waits is None:
                return  # in a fork: on with the run, following ``run``
            job = run.job
            self.followed[job.id] = Followed(job.id, job.klass, job.submit, run.predicted - job.submit, waits)
            if self.on_follow is not None:
                self.on_follow(now)

    def _futures(self, run: JobRun, now: float) -> list[float] | None:
        """Follow ``run`` into each future in a child process, ``parallel`` at a time: the waits, in
        the order of the futures. In a child, the state is made its future and None is returned,
        for the run loop to go on there."""
        waits: dict[int, float] = {}
        running: dict[int, tuple[int, int]] = {}  # pid -> (future, read end)
        for k in range(self.futures):
            while len(running) >= self.parallel:
                self._collect(running, waits, run)
            read_fd, write_fd = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                for _, other in running.values():
                    os.close(other)
                self.watch, self.report_fd = run.job.id, write_fd
                self.forecast.capacity = None  # no predictions in a future
                self._redraw(now, np.random.default_rng([self.seed, run.job.id, k]))
                return None
            os.close(write_fd)
            running[pid] = (k, read_fd)
        while running:
            self._collect(running, waits, run)
        return [waits[k] for k in range(self.futures)]

    @staticmethod
    def _collect(running: dict[int, tuple[int, int]], waits: dict[int, float], run: JobRun) -> None:
        """Wait for the oldest child of ``running`` and read its wait (by its pid: the process may
        have other children, which are not this benchmark's to reap)."""
        pid = next(iter(running))
        os.waitpid(pid, 0)
        k, read_fd = running.pop(pid)
        with os.fdopen(read_fd, "rb") as pipe:
            data = pipe.read()
        if len(data) != WAIT_BYTES:
            raise RuntimeError(f"future {k} of job {run.job.id} ended without a wait")
        (waits[k],) = struct.unpack("d", data)

    # --- a fork ---------------------------------------------------------------------------------

    def _redraw(self, now: float, rng: np.random.Generator) -> None:
        """Draw again every runtime not known at ``now``: what is left of each running job, and the
        run of each job not running (queued, preempted or still to arrive), given its progress.
        Sessions (their idle stretches are drawn with the run) and replayed deletions keep theirs."""
        moved: dict[int, float] = {}
        for job in self.jobs.values():
            param = self.durations.get(job.klass)
            if param is None or job.deadline is not None or job.is_session:
                continue
            param = self.by_name.get((job.team, job.base_name), param)
            run = self.runs.get(job.id)
            if run is not None and run.done:
                continue
            done = 0.0
            if run is not None:
                done = run.progress
                if run.running_since is not None:
                    done += max(0.0, now - run.running_since - job.startup)
            job.work = conditional_draw(param, done, rng)
            if run is not None and run.running_since is not None:
                moved[job.id] = run.running_since + job.startup + (job.work - run.progress)
        self.events[:] = [e for e in self.events if not (e[1] == COMPLETE and e[3] in moved)]
        heapq.heapify(self.events)
        for job_id, end in moved.items():
            self.push(end, COMPLETE, job_id, self.runs[job_id].gen)

    def follow(self) -> list[Followed]:
        """Run, and return every followed prediction with the wait the workload really had. Only
        the parent returns: a fork reports its wait and exits, whatever happens in it."""
        try:
            self.run()
        finally:
            if self.watch is not None:  # a fork that left the run loop some other way
                os._exit(1)
        followed = list(self.followed.values())
        for f in followed:
            started = self.runs[f.job].first_start
            f.wait = None if started is None else started - f.submit
        return followed

    def _report(self, wait: float) -> None:
        os.write(self.report_fd, struct.pack("d", wait))
        os._exit(0)

    def start(self, run: JobRun, pool: str, now: float) -> None:
        if self.watch is not None and run.job.id == self.watch and run.first_start is None:
            self._report(now - run.job.submit)
        super().start(run, pool, now)

    def finish(self, horizon: float) -> None:
        if self.watch is not None:
            self._report(NO_START)
        super().finish(horizon)


def best_eta(waits: list[float]) -> float:
    """The single ETA (a wait) with the lowest median relative error over ``waits`` (a future
    that never started counts an error of 1 whatever the ETA); searched over the finite waits
    and a geometric grid between them."""
    finite = sorted(w for w in waits if math.isfinite(w) and w > 0)
    if not finite:
        return NO_START
    grid = set(finite)
    low, high = finite[0], finite[-1]
    steps = 200
    grid |= {low * (high / low) ** (i / steps) for i in range(steps + 1)}
    return min(grid, key=lambda eta: (spread(eta, waits), eta))


def spread(eta: float, waits: list[float]) -> float:
    """The median relative error of ``eta`` over ``waits``."""
    return statistics.median(relative_error(eta, w) for w in waits)


def relative_error(eta: float, wait: float) -> float:
    if not math.isfinite(wait):
        return 1.0
    return abs(eta - wait) / wait if wait > 0 else 0.0


def cross_validated(followed: list[Followed]) -> list[float]:
    """Each finite future of each workload taken as the truth in turn, with the best ETA of the
    workload's other futures: the floor again, from the futures alone."""
    out = []
    for f in followed:
        for j, truth in enumerate(f.futures):
            if math.isfinite(truth):
                out.append(relative_error(best_eta(f.futures[:j] + f.futures[j + 1 :]), truth))
    return out


def bootstrap_median(values: list[float], rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """A 90 % interval of the median of ``values``, by resampling them (seeded)."""
    data = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    medians = np.median(rng.choice(data, size=(rounds, len(data))), axis=1)
    return float(np.quantile(medians, 0.05)), float(np.quantile(medians, 0.95))


def summary(followed: list[Followed]) -> dict[str, Any]:
    """Over the followed workloads that waited more than 5 minutes: the floor (with a 90 %
    interval), the floor from the futures alone, gpuplane's error, and the futures' spread."""
    counted = [f for f in followed if f.wait is not None and f.wait > ETA_RELATIVE_MIN_WAIT]
    if not counted:
        return {"workloads": 0}
    best = [best_eta(f.futures) for f in counted]
    floor = [relative_error(eta, f.wait or 0.0) for eta, f in zip(best, counted, strict=True)]
    predicted = [relative_error(f.predicted, f.wait or 0.0) for f in counted]
    low, high = bootstrap_median(floor)
    futures_floor = cross_validated(counted)
    return {
        "workloads": len(counted),
        "floorP50": round(statistics.median(floor), 4),
        "floorP50Interval90": [round(low, 4), round(high, 4)],
        "floorFromFuturesP50": round(statistics.median(futures_floor), 4) if futures_floor else None,
        "predictedP50": round(statistics.median(predicted), 4),
        "withinTargetShare": {
            "floor": round(sum(e <= TARGET for e in floor) / len(floor), 4),
            "predicted": round(sum(e <= TARGET for e in predicted) / len(predicted), 4),
        },
        "futuresSpreadP50": round(
            statistics.median(spread(eta, f.futures) for eta, f in zip(best, counted, strict=True)), 4
        ),
        "medianWaitHours": round(statistics.median(f.wait or 0.0 for f in counted) / 3600, 2),
    }


def table_of(rows: dict[str, dict[str, Any]], title: str) -> Table:
    """The summary rows as a table."""
    table = Table(title=title)
    table.add_column("class", no_wrap=True)
    for column in (
        "waited > 5 min",
        "median wait h",
        "floor p50 (90 % interval)",
        "floor from futures",
        "gpuplane ETA p50",
    ):
        table.add_column(column, justify="right")
    for name, row in rows.items():
        if not row["workloads"]:
            continue
        low, high = row["floorP50Interval90"]
        table.add_row(
            name,
            f"{row['workloads']:,}",
            f"{row['medianWaitHours']}",
            f"{row['floorP50']:.3f} ({low:.2f}-{high:.2f})",
            f"{row['floorFromFuturesP50']:.3f}" if row["floorFromFuturesP50"] is not None else "-",
            f"{row['predictedP50']:.3f}",
        )
    return table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=float, default=1.5)
    parser.add_argument("--configuration", default="gpuplane", help="stock or gpuplane (default)")
    parser.add_argument("--every", type=int, default=3, help="follow every N-th prediction (default 3)")
    parser.add_argument(
        "--futures", type=int, default=12, help="futures per followed prediction (default 12)"
    )
    parser.add_argument(
        "--jobs", type=int, default=default_jobs(), help="futures run at once (default: the CPUs)"
    )
    parser.add_argument(
        "--knows",
        choices=("class", "name"),
        default="class",
        help="what the futures draw runtimes from: the class's distribution (default), or each job "
        "name's own runs",
    )
    parser.add_argument("--out", type=Path, help="write eta-floor.json here")
    args = parser.parse_args(argv)
    if min(args.every, args.futures, args.jobs) < 1:
        parser.error("--every, --futures and --jobs must be at least 1")
    console = Console()
    scenario = builtin_scenario().with_load(args.load)
    sim = scenario_input(scenario)
    model = build_model(args.configuration, sim)
    started = time.perf_counter()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{args.configuration} at load {args.load:g}", total=1.0)
        span = sim.workloads.horizon - sim.workloads.start

        def advanced(now: float) -> None:
            progress.update(task, completed=(now - sim.workloads.start) / span)

        engine = FollowingEngine(
            model,
            sim.workloads,
            sim.cluster.gpus,
            sim.reaper_idle,
            scenario=scenario,
            every=args.every,
            futures=args.futures,
            jobs=args.jobs,
            knows=args.knows,
            on_follow=advanced,
        )
        followed = engine.follow()
    elapsed = time.perf_counter() - started
    by_class: dict[str, list[Followed]] = {}
    for f in followed:
        by_class.setdefault(f.klass, []).append(f)
    rows = {"all": summary(followed)} | {k: summary(v) for k, v in sorted(by_class.items())}
    title = (
        f"ETA floor: {args.configuration} at load {args.load:g}, every {args.every}th prediction "
        f"followed into {args.futures} futures, runtimes drawn by {args.knows} ({elapsed:.0f} s)"
    )
    console.print(table_of(rows, title))
    floor = rows["all"].get("floorP50")
    if isinstance(floor, float):
        verdict = "reachable" if floor <= TARGET else "out of reach for any predictor"
        console.print(f"floor p50 {floor:.3f} against the target {TARGET:.2f}: {verdict}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        document = {
            "load": args.load,
            "configuration": args.configuration,
            "every": args.every,
            "futures": args.futures,
            "knows": args.knows,
            "summary": rows,
            "followed": [
                {
                    "job": f.job,
                    "class": f.klass,
                    "predicted": f.predicted,
                    "wait": f.wait,
                    "futures": f.futures,
                }
                for f in followed
            ],
        }
        (args.out / "eta-floor.json").write_text(json.dumps(document, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
