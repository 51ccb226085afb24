"""Configurations side by side: one worker process per CPU.

Every configuration of an experiment, and every (load, configuration) pair of a sweep, replays
workloads drawn once, and no run reads another's state, so they can run at the same time. A run
is deterministic, so its results do not depend on which process ran it or in what order: the
document is the same as from one process, only the wall time is shorter (about the longest run
when there are as many CPUs as runs).

::

    parent: draw each input once -> pickle it once -> hand out tasks, longest expected first
            (or pickle how to draw it, a few kilobytes: see Drawn)
    worker: unpickle the input, drawing it if given how (kept for the next task on the same
            input) -> run -> (ledger, summary)
    progress: each worker sends (label, fraction) on a queue; a thread in the parent reports it

``jobs`` 1 runs everything in the calling process, in order, as before.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import threading
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from gpuplane.sim.metrics import Ledger

ProgressCallback = Callable[[str, float], None]
RunResult = tuple[Ledger, dict[str, Any]]
Runner = Callable[[str, Any, Callable[[float], None] | None], RunResult]


def default_jobs() -> int:
    """The CPUs this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - platforms without affinity
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class Task:
    """One run: configuration ``name`` on input number ``source``, reported as ``label``."""

    label: str
    name: str
    source: int
    weight: float = 1.0  # expected cost, only to start the longest runs first


WORKER_DIED = (
    "a simulation worker process stopped unexpectedly (killed, or out of memory?); "
    "--jobs 1 runs everything in one process"
)
MAX_POINTS = 4  # runs one search makes in a round, at most (see points_per_search)


def points_per_search(jobs: int, searching: int) -> int:
    """Runs each of ``searching`` searches makes in one round of runs side by side: one, or where
    there are more workers than searches, the workers shared among them (at most
    :data:`MAX_POINTS`), so that a round keeps every worker busy and a search takes fewer rounds
    (the rounds of the costliest search are its wall time)."""
    return max(1, min(MAX_POINTS, jobs // max(1, searching)))


def run_tasks(
    runner: Runner,
    inputs: Sequence[Any],
    tasks: Sequence[Task],
    jobs: int,
    progress: ProgressCallback | None = None,
) -> list[RunResult]:
    """``runner(name, input, progress)`` for every task; results in the order of ``tasks``.

    ``runner`` must be a module-level function (a worker imports it by name).
    """
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, got {jobs}")
    jobs = min(jobs, max(1, len(tasks)))
    # One at a time in the order given; side by side, the longest expected first.
    order = (
        list(range(len(tasks))) if jobs == 1 else sorted(range(len(tasks)), key=lambda i: -tasks[i].weight)
    )
    results: dict[Hashable, RunResult] = {}
    with Workers(runner, jobs, progress) as workers:
        for i in order:
            if not workers.free():
                _collect(workers, results)
            workers.start(i, tasks[i].name, tasks[i].label, inputs[tasks[i].source])
        while len(results) < len(tasks):
            _collect(workers, results)
    return [results[i] for i in range(len(tasks))]


def _collect(workers: Workers, results: dict[Hashable, RunResult]) -> None:
    done = workers.next_done()
    if done is not None:
        key, result = done
        results[key] = result


@runtime_checkable
class Drawn(Protocol):
    """An input given as how to draw it (:class:`~gpuplane.sim.experiment.ScenarioDraw`): the
    process that runs it draws it, once per input, instead of the parent drawing and pickling it."""

    def draw(self) -> Any: ...


def _ready(source: Any) -> Any:
    return source.draw() if isinstance(source, Drawn) else source


class RunCancelledError(Exception):
    """Raised inside a worker's run that :meth:`Workers.cancel` stopped."""


CANCEL_SLOTS = 4096  # runs a Workers can tell apart at once, to stop them (slot = serial mod this)


class Workers:
    """Worker processes kept for a whole search and handed one run at a time: :meth:`start` hands
    a run to a free worker, and :meth:`next_done` waits for the first run to finish, so that the
    search starts its next run at once instead of waiting, as a round of :func:`run_tasks` does,
    for the round's longest run while the other workers idle. A run whose result the search no
    longer needs is stopped (:meth:`cancel`): the worker's run checks a shared flag at each of its
    progress reports (about 200 a run) and ends there, which frees the worker. Its worker counts
    as free at once (:meth:`free`): the next run waits in the pool for it, instead of the search
    waiting in :meth:`next_done` for another run to end before it starts one.

    Each input is pickled once (the workers keep the last they read); one given as how to draw it
    (:class:`Drawn`) is drawn by the process that runs it. With ``jobs`` 1 nothing runs aside: a
    started run runs in the calling process when :meth:`next_done` asks for it, in the order
    started, so the search is the same every time.
    """

    def __init__(self, runner: Runner, jobs: int, progress: ProgressCallback | None = None) -> None:
        if jobs < 1:
            raise ValueError(f"jobs must be at least 1, got {jobs}")
        self.runner = runner
        self.jobs = jobs
        self.progress = progress
        self._blobs: dict[int, bytes] = {}  # by input number
        self._numbers: dict[int, int] = {}  # input number by id(input), the inputs kept alive below
        self._inputs: list[Any] = []
        self._waiting: list[tuple[Hashable, Task, Any]] = []  # jobs 1: started, not run yet
        self._running: dict[Future[RunResult], tuple[Hashable, int]] = {}
        self._cancelled: set[Future[RunResult]] = set()
        self._serial = 0
        self._kept: tuple[int, Any] | None = None  # jobs 1: the last input run, by number (as _work)
        self._pool: ProcessPoolExecutor | None = None
        self._listener: _Listener | None = None
        self._flags: Any = None
        if jobs > 1:
            context = multiprocessing.get_context("spawn")  # no fork under the parent's threads
            reports: Any = context.Queue()
            self._flags = context.RawArray("b", CANCEL_SLOTS)
            self._listener = _Listener(reports, progress)
            self._pool = ProcessPoolExecutor(
                max_workers=jobs,
                mp_context=context,
                initializer=_start_worker,
                initargs=(reports, self._flags),
            )

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def free(self) -> int:
        """Workers with no run to do. A stopped run does not count: it ends at its next progress
        report, and a run started meanwhile waits in the pool for that worker (so the search
        does not wait for the stopped run's end to start the next one)."""
        return self.jobs - (len(self._running) - len(self._cancelled)) - len(self._waiting)

    def running(self) -> list[Hashable]:
        """The keys of the runs started and not yet done, nor stopped."""
        keys = [key for key, _, _ in self._waiting]
        return keys + [key for f, (key, _) in self._running.items() if f not in self._cancelled]

    def start(self, key: Hashable, name: str, label: str, source: Any) -> None:
        """Run configuration ``name`` on the input ``source``, known as ``key`` (reported as ``label``)."""
        if self.free() < 1:
            raise RuntimeError("no free worker to start a run on")
        number = self._numbers.get(id(source))
        if number is None:
            number = self._numbers[id(source)] = len(self._inputs)
            self._inputs.append(source)
        task = Task(label, name, number)
        if self._pool is None:
            self._waiting.append((key, task, source))
            return
        if task.source not in self._blobs:
            self._blobs[task.source] = pickle.dumps(source, protocol=pickle.HIGHEST_PROTOCOL)
        serial = self._serial
        self._serial += 1
        self._flags[serial % CANCEL_SLOTS] = 0
        blob = self._blobs[task.source]
        future = self._pool.submit(_work, self.runner, task, blob, self.progress is not None, serial)
        self._running[future] = (key, serial)

    def cancel(self, key: Hashable) -> None:
        """Stop the run known as ``key``: its result will not be asked for."""
        self._waiting = [w for w in self._waiting if w[0] != key]
        for future, (k, serial) in self._running.items():
            if k == key and future not in self._cancelled:
                self._cancelled.add(future)
                if not future.cancel():
                    self._flags[serial % CANCEL_SLOTS] = 1

    def next_done(self) -> tuple[Hashable, RunResult] | None:
        """The key and result of the first started run to finish (with ``jobs`` 1: the first
        started, run now); None when no run is left but stopped ones, once those have ended."""
        if self._waiting:
            key, task, source = self._waiting.pop(0)
            if self._kept is None or self._kept[0] != task.source:
                self._kept = (task.source, _ready(source))
            return key, self.runner(task.name, self._kept[1], labelled(self.progress, task.label))
        while self._running:
            done, _ = wait(self._running, return_when=FIRST_COMPLETED)
            for future in sorted(done, key=lambda f: self._running[f][1]):  # in the order started
                key, _ = self._running.pop(future)
                if future in self._cancelled:
                    self._cancelled.discard(future)
                    continue
                try:
                    result = future.result()
                except BrokenProcessPool as broken:
                    self.close()
                    raise RuntimeError(WORKER_DIED) from broken
                return key, result
        return None

    def close(self) -> None:
        """Stop every run still going and the workers (waits for them to end)."""
        for key in self.running():
            self.cancel(key)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._listener is not None:
            self._listener.stop()
            self._listener = None


def labelled(progress: ProgressCallback | None, label: str) -> Callable[[float], None] | None:
    """One run's progress callback: ``progress`` with the run's label."""
    if progress is None:
        return None
    return lambda fraction: progress(label, fraction)


class _Listener:
    """Carries the workers' progress reports to ``progress`` in the parent."""

    def __init__(self, reports: Any, progress: ProgressCallback | None) -> None:
        self.reports = reports
        self.progress = progress
        self.thread = threading.Thread(target=self._loop, name="gpuplane-sim-progress", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            try:
                item = self.reports.get(timeout=0.2)
            except queue.Empty:
                continue
            except (EOFError, OSError):
                return
            if item is None:
                return
            if self.progress is not None:
                label, fraction = item
                self.progress(label, fraction)

    def stop(self) -> None:
        self.reports.put(None)
        self.thread.join(timeout=5)
        self.reports.close()


# --- in the worker -----------------------------------------------------------------------------

_reports: Any = None
_flags: Any = None  # Workers' stop flags, by run serial (mod CANCEL_SLOTS)
_kept: tuple[int, Any] | None = None  # the last input unpickled, by source number


def _start_worker(reports: Any, flags: Any = None) -> None:
    global _reports, _flags  # noqa: PLW0603 - one queue per worker process, set once at its start
    _reports = reports
    _flags = flags


def _work(runner: Runner, task: Task, blob: bytes, report: bool, serial: int = -1) -> RunResult:
    """One run in a worker. ``serial`` (a :class:`Workers` run) is the run's stop flag: checked at
    each progress report, it ends the run with :class:`RunCancelledError`."""
    global _kept  # noqa: PLW0603 - a sweep's runs on one input reuse it in the same worker
    if _kept is None or _kept[0] != task.source:
        _kept = (task.source, _ready(pickle.loads(blob)))  # our own bytes, from the parent process
    reports = _reports if report else None
    flags = _flags if serial >= 0 else None
    callback = None
    if reports is not None or flags is not None:

        def callback(fraction: float) -> None:
            if flags is not None and flags[serial % CANCEL_SLOTS]:
                raise RunCancelledError(task.label)
            if reports is not None:
                reports.put((task.label, fraction))

    return runner(task.name, _kept[1], callback)
