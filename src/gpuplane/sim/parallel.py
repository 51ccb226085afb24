"""Configurations side by side: one worker process per CPU.

Every configuration of an experiment, and every (load, configuration) pair of a sweep, replays
workloads drawn once, and no run reads another's state, so they can run at the same time. A run
is deterministic, so its results do not depend on which process ran it or in what order: the
document is the same as from one process, only the wall time is shorter (about the longest run
when there are as many CPUs as runs).

::

    parent: draw each input once -> pickle it once -> hand out tasks, longest expected first
    worker: unpickle the input (kept for the next task on the same input) -> run -> (ledger, summary)
    progress: each worker sends (label, fraction) on a queue; a thread in the parent reports it

``jobs`` 1 runs everything in the calling process, in order, as before.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

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
    if jobs == 1 or len(tasks) == 1:
        return [runner(t.name, inputs[t.source], labelled(progress, t.label)) for t in tasks]
    blobs: dict[int, bytes] = {}  # each input pickled once, when its first task is handed out
    context = multiprocessing.get_context("spawn")  # no fork under the parent's threads
    reports: Any = context.Queue()
    listener = _Listener(reports, progress)
    order = sorted(range(len(tasks)), key=lambda i: -tasks[i].weight)
    results: list[RunResult | None] = [None] * len(tasks)
    pool = ProcessPoolExecutor(
        max_workers=min(jobs, len(tasks)), mp_context=context, initializer=_start_worker, initargs=(reports,)
    )
    try:
        futures: dict[int, Future[RunResult]] = {}
        for i in order:
            source = tasks[i].source
            if source not in blobs:
                blobs[source] = pickle.dumps(inputs[source], protocol=pickle.HIGHEST_PROTOCOL)
            futures[i] = pool.submit(_work, runner, tasks[i], blobs[source], progress is not None)
        for i in order:
            results[i] = futures[i].result()
    except BrokenProcessPool as broken:
        pool.shutdown(wait=False, cancel_futures=True)
        message = (
            "a simulation worker process stopped unexpectedly (killed, or out of memory?); "
            "--jobs 1 runs everything in one process"
        )
        raise RuntimeError(message) from broken
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)
        listener.stop()
    return [r for r in results if r is not None]


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
_kept: tuple[int, Any] | None = None  # the last input unpickled, by source number


def _start_worker(reports: Any) -> None:
    global _reports  # noqa: PLW0603 - one queue per worker process, set once at its start
    _reports = reports


def _work(runner: Runner, task: Task, blob: bytes, report: bool) -> RunResult:
    global _kept  # noqa: PLW0603 - a sweep's runs on one input reuse it in the same worker
    if _kept is None or _kept[0] != task.source:
        _kept = (task.source, pickle.loads(blob))  # our own bytes, from the parent process
    callback = None
    if report and _reports is not None:
        reports = _reports

        def callback(fraction: float) -> None:
            reports.put((task.label, fraction))

    return runner(task.name, _kept[1], callback)
