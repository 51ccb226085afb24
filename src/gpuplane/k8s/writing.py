"""What the controller's write paths share: counters, the writer and Event threads, and lookups.

A pass of :class:`gpuplane.k8s.controller.Controller` carries the plan out through a few write
paths (:mod:`gpuplane.k8s.creating`, :mod:`gpuplane.k8s.admitting`, :mod:`gpuplane.k8s.evicting`,
:mod:`gpuplane.k8s.finishing`, :mod:`gpuplane.k8s.binding`, :mod:`gpuplane.k8s.reporting`). Each one
gets a :class:`Tools`: the client, the informer cache, the worklist, the counters, the clock, a way
to run independent writes at once and a way to record an Event. A test builds one with a fake API
object, runs the writes inline and collects the Events.

The controller's log lines keep the controller's logger name, whichever write path logs them.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.informer import Cache
from gpuplane.k8s.leader import micro_time
from gpuplane.k8s.worklist import Worklist
from gpuplane.model import labels as keys

log = logging.getLogger("gpuplane.k8s.controller")

Event = Callable[[dict[str, Any], str, str, str], None]  # (object, type, reason, message)
Each = Callable[[Iterable[Callable[[], None]]], None]


@dataclass
class Counters:
    """What the controller did; safe to update from the writer threads through :meth:`add`."""

    admitted: int = 0
    bound: int = 0
    preempted: int = 0
    released: int = 0  # evicted workloads whose quota was given back
    finished: int = 0  # workloads marked Finished because their job ended
    would_preempt: int = 0
    write_failures: int = 0
    workloads_created: int = 0
    extra: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str, amount: int = 1) -> None:
        """Add to the counter ``name`` (a field, or else an entry of :attr:`extra`)."""
        with self.lock:
            if name in _COUNTER_FIELDS:
                setattr(self, name, getattr(self, name) + amount)
            else:
                self.extra[name] = self.extra.get(name, 0) + amount


_COUNTER_FIELDS = frozenset(
    (
        "admitted",
        "bound",
        "preempted",
        "released",
        "finished",
        "would_preempt",
        "write_failures",
        "workloads_created",
    )
)


def seconds_time(micro: str) -> str:
    """A Kubernetes MicroTime as a Time: cut to whole seconds."""
    return micro[:19] + "Z"


class WritePool:
    """The writer threads (owns the pool): independent writes of one step go out at once."""

    def __init__(self, workers: int) -> None:
        self._pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="gpuplane-write")

    def each(self, writes: Iterable[Callable[[], None]]) -> None:
        """Run independent writes at once on the writer threads and wait for all of them.

        Each write handles its own API errors; anything else it raises (a bug, a broken
        connection) is raised here once every write has ended, so no write outlives its pass.
        """
        futures = [self._pool.submit(write) for write in writes]
        failure: BaseException | None = None
        for future in futures:
            error = future.exception()
            if error is not None and failure is None:
                failure = error
        if failure is not None:
            raise failure

    def close(self) -> None:
        """End the threads (idempotent); writes in flight finish first."""
        self._pool.shutdown(wait=True)


class Events:
    """Records Events in the background (owns the Event threads); failures are only counted."""

    def __init__(self, api: KubeApi, clock: Callable[[], float], counters: Counters) -> None:
        self.api = api
        self.clock = clock
        self.counters = counters
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuplane-event")

    def record(self, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        """Record an Event about ``obj`` in the background: Events are best effort, and no step of a
        pass waits for them (they would double the round trips on the way to a binding)."""
        meta = obj.get("metadata", {})
        ns = meta.get("namespace") or "default"
        now = micro_time(self.clock())
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{meta.get('name', 'object')}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", ""),
                "kind": obj.get("kind", ""),
                "name": meta.get("name", ""),
                "namespace": ns,
                "uid": meta.get("uid", ""),
            },
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "firstTimestamp": seconds_time(now),
            "lastTimestamp": seconds_time(now),
            "count": 1,
            "source": {"component": "gpuplane-controller"},
        }
        with contextlib.suppress(RuntimeError):  # shut down: the controller is stopping
            self._pool.submit(self._send, body, ns)

    def _send(self, body: dict[str, Any], namespace: str) -> None:
        try:
            self.api.create(k8s.EVENTS, body, namespace)
        except ApiError:
            self.counters.add("event_failures")

    def close(self) -> None:
        """End the threads (idempotent); Events in flight are sent first."""
        self._pool.shutdown(wait=True)


@dataclass(frozen=True)
class Tools:
    """What every write path uses (owns no state of its own): the client, the informer cache, the
    worklist, the counters, the clock, how to run independent writes at once (:meth:`WritePool.each`),
    how to record an Event (:meth:`Events.record`), and how to tell the scheduling session that the
    cluster may not show what it holds."""

    api: KubeApi
    cache: Cache
    work: Worklist
    counters: Counters
    clock: Callable[[], float]
    each: Each
    event: Event
    invalidate: Callable[[str], None]

    def now(self) -> str:
        """The clock as a Kubernetes MicroTime."""
        return micro_time(self.clock())

    def now_seconds(self) -> str:
        """The clock as a Kubernetes Time (whole seconds)."""
        return seconds_time(self.now())


def owner_job(cache: Cache, wl: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """The workload's job of a known kind as cached now (``None``: none, or another one by that name)."""
    for ref in wl.get("metadata", {}).get("ownerReferences", []) or []:
        kind = ref.get("kind")
        if kind in jobs.INTEGRATIONS:
            job = cache.get(kind, f"{wl['metadata']['namespace']}/{ref['name']}")
            if job is not None and job.get("metadata", {}).get("uid") == ref.get("uid"):
                return kind, job
    return None


def pods_of(cache: Cache, work: Worklist, wl: dict[str, Any]) -> list[dict[str, Any]]:
    """The workload's pods as cached now: by its workload label, or for plain pods and pod
    groups (no owner) by group label or pod name."""
    ns, name = wl["metadata"]["namespace"], wl["metadata"]["name"]
    uid = (wl["metadata"].get("labels") or {}).get(keys.JOB_UID_LABEL)
    by = work.pods_by
    pod_keys = set(by.get((ns, "workload", name), ()))
    if uid and not wl["metadata"].get("ownerReferences"):
        pod_keys |= by.get((ns, "group", uid), set()) | by.get((ns, "name", uid), set())
    out = []
    for key in sorted(pod_keys):
        pod = cache.get("Pod", key)
        if pod is not None:
            out.append(pod)
    return out


def log_workload(what: str, key: str, detail: str) -> None:
    """One INFO line about a step in a workload's life (admitted, binding, evicted, requeued,
    finished, deleted), naming its key; with ``--log-format json`` the fields come apart."""
    log.info("workload %s %s: %s", key, what, detail, extra={"event": what, "workload": key})


def condition(obj: dict[str, Any], ctype: str) -> bool:
    """Whether the object has the condition ``ctype`` with status True."""
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in obj.get("status", {}).get("conditions", []) or []
    )
