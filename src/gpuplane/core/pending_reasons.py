"""The pending reasons a session reports, and who has read which.

The scheduler keeps each queued workload's reason (``Scheduler.status``). A session wraps that
mapping in a :class:`ReasonLog`, which notes every write, and reads it through
:class:`ReasonReader`: the reasons that changed since the driver last asked (the controller), and
the cheap reads the simulator needs after every event (:meth:`ReasonReader.watch`,
:meth:`ReasonReader.reason_of`, :meth:`ReasonReader.waiting_for`). Those are the session's fast
paths, reached as ``Session.reasons``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from gpuplane.core.lifecycle import Reason
from gpuplane.core.plan import PendingDecision
from gpuplane.core.scheduler import Scheduler, Status


class ReasonLog(dict[str, Status]):
    """The scheduler's reasons by workload, noting which keys were written.

    ``written``: the keys written since the driver last asked for changes (not collected without
    ``keep_written``: a session that keeps no history never asks); ``everything``: a write of
    unknown keys happened (a clear or bulk update); ``writes``: every write counted; ``watchers``:
    sets that each get every key written."""

    __slots__ = ("everything", "keep_written", "watchers", "writes", "written")

    def __init__(self, items: Mapping[str, Status], keep_written: bool = True) -> None:
        super().__init__(items)
        self.written: set[str] = set()
        self.keep_written = keep_written
        self.everything = True
        self.writes = 0
        self.watchers: list[set[str]] = []

    def _wrote(self, key: str) -> None:
        if self.keep_written:
            self.written.add(key)
        self.writes += 1
        for watcher in self.watchers:
            watcher.add(key)

    def _wrote_all(self) -> None:
        self.everything = True
        self.writes += 1
        for watcher in self.watchers:
            watcher.update(self)

    def __setitem__(self, key: str, value: Status) -> None:
        self._wrote(key)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        self._wrote(key)
        super().__delitem__(key)

    def pop(self, key: str, *default: Any) -> Any:
        self._wrote(key)
        return super().pop(key, *default)

    def clear(self) -> None:
        self._wrote_all()
        super().clear()

    def update(self, *args: Any, **kwargs: Any) -> None:
        super().update(*args, **kwargs)
        self._wrote_all()

    def setdefault(self, key: str, default: Any = None) -> Any:
        self._wrote(key)
        return super().setdefault(key, default)


class ReasonReader:
    """Reads of the scheduler's pending reasons. Owns the :class:`ReasonLog` it installs on the
    scheduler and the (reason, message) last reported per ClusterQueue and workload."""

    def __init__(self, scheduler: Scheduler, keep_written: bool) -> None:
        self._scheduler = scheduler
        self._log = ReasonLog(scheduler.status, keep_written=keep_written)
        scheduler.status = self._log
        self._keep_written = keep_written
        # The (reason, message) last reported, by ClusterQueue ("": the workloads queued in none)
        # and workload.
        self._reported: dict[str, dict[str, tuple[str, str]]] = {}

    def changes(self) -> tuple[PendingDecision, ...]:
        """The pending workloads whose reason or message changed since the last call (all of them
        on the first). Only the ClusterQueues where a reason was written since (or whose queue
        moved: every move writes one) are looked at."""
        scheduler = self._scheduler
        status = scheduler.status
        dirty = self._dirty_queues()
        out: list[PendingDecision] = []
        for cq_name, queue in scheduler.queues.items():
            if dirty is not None and cq_name not in dirty:
                continue
            before = self._reported.get(cq_name, {})
            now: dict[str, tuple[str, str]] = {}
            lq_positions: dict[str, int] = {}
            for position, pending in enumerate(queue, start=1):
                lq_name = pending.local_queue
                lq_positions[lq_name] = lq_positions.get(lq_name, 0) + 1
                got = status.get(pending.key)
                reason, message = (got.reason, got.message) if got is not None else (Reason.QUEUED, "")
                if reason == Reason.QUEUED and not message:
                    message = f"queued at position {position} in ClusterQueue {cq_name}; not attempted yet"
                now[pending.key] = (reason, message)
                if before.get(pending.key) != (reason, message):
                    out.append(
                        PendingDecision(
                            pending.key, cq_name, lq_name, position, lq_positions[lq_name], reason, message
                        )
                    )
            self._reported[cq_name] = now
        before = self._reported.get("", {})
        now = {}
        for key in sorted(scheduler.unqueued):  # not queued anywhere: few, looked at every time
            queue_name, lq_key, got = scheduler.unqueued[key]
            now[key] = (got.reason, got.message)
            if before.get(key) != now[key]:
                out.append(PendingDecision(key, queue_name, lq_key, None, None, got.reason, got.message))
        self._reported[""] = now
        return tuple(out)

    def _dirty_queues(self) -> set[str] | None:
        """The ClusterQueues of the workloads whose reason was written since the last call
        (``None``: every one)."""
        log = self._log
        if self._scheduler.status is not log or log.everything or not self._keep_written:
            log.everything = False
            log.written.clear()
            return None
        scheduler = self._scheduler
        dirty: set[str] = set()
        for key in log.written:
            wl = scheduler.workloads.get(key)
            lq = scheduler.state.local_queues.get(f"{wl.namespace}/{wl.queue_name}") if wl else None
            if lq is None:
                continue  # not queued in any ClusterQueue: among the unqueued, looked at every time
            dirty.add(lq.cluster_queue)
        log.written.clear()
        return dirty

    def waiting_for(self, reasons: Collection[str]) -> list[str]:
        """Queued workloads whose last attempt failed for one of ``reasons``, in queue order
        (ClusterQueues by name, then position). Cheaper than ``Session.pending``: no messages; the
        same while :attr:`writes` is."""
        status = self._scheduler.status
        out = []
        for queue in self._scheduler.queues.values():
            for queued in queue:
                got = status.get(queued.key)
                if got is not None and got.reason in reasons:
                    out.append(queued.key)
        return out

    def watch(self) -> set[str]:
        """A set that, from now on, gets the key of every workload whose pending reason is
        written; it starts with every workload queued now. Every change to the queues writes a
        reason (see :attr:`writes`), so a driver that keeps a figure over the queued workloads
        (the simulator's quota-blocked demand) reads :meth:`reason_of` for the keys in it, clears
        it, and keeps the rest of its figure: work proportional to what changed, not to the
        backlog."""
        watcher = set(self._log)
        self._log.watchers.append(watcher)
        return watcher

    def reason_of(self, key: str) -> str | None:
        """The pending reason of a workload queued in a ClusterQueue; ``None`` for one that is
        not (admitted, finished, withdrawn or never queued)."""
        got = self._scheduler.status.get(key)
        return got.reason if got is not None else None

    @property
    def writes(self) -> int:
        """How many times the pending reasons were written so far. Every change to the queues (a
        workload queued, requeued, admitted or withdrawn) writes one, so :meth:`waiting_for`
        answers the same while this number stays the same."""
        return self._log.writes
