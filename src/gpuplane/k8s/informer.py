"""Informers: list, then watch, into an incremental local cache.

Each :class:`Informer` keeps a copy of one resource. It lists once (remembering the
list's resourceVersion), then watches from there with bookmarks, so a reconnect
resumes where it stopped. ``410 Gone`` (the server no longer has that history) means
relist. Other errors back off exponentially before retrying. All objects are plain
dicts, exactly as the API server sent them.

The watch stream is read by the official client's :class:`kubernetes.watch.Watch`
(through :meth:`KubeApi.watch`); this module keeps the resume, relist and back-off
policy, which the client leaves to its caller: with a timeout it does not retry, and a
``410`` is raised for the caller to relist. :meth:`Informer.stop` cuts the open watch
(its socket is shut down, whether the stream is being opened or read), ends a back-off
at once and waits for the informer's thread: a stopped informer holds no connection.

The :class:`Cache` holds every informer's objects behind one lock and supports the
scheduler's *assume*: a locally recorded write that shadows the informer's copy until
the watch delivers the written version (or the assumption is forgotten). It also notes which
keys changed (a relist: those that differ from the copy it replaces) until
:meth:`Cache.take_changes`, so a reader can look at only what changed since it last looked.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kubernetes import watch as k8s_watch

from gpuplane.k8s.api import ApiError, KubeApi, Resource
from gpuplane.kube.client import WatchStop

log = logging.getLogger(__name__)


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


TOMBSTONES = 100_000  # deleted objects remembered at most (each a few dozen bytes)
# How long a deleted object is remembered. A late event of it can only be a write's answer that was
# in flight when the deletion was seen (a watch delivers one object's events in order), and no
# request outlives the client's timeout (30 s): five minutes is ample.
TOMBSTONE_SECONDS = 300.0


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def rv_of(obj: dict[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


# Kinds whose status only the controller writes and nothing it decides on reads (the queues'
# counts, see :mod:`gpuplane.k8s.queue_status`): a change of nothing but their status is recorded
# without being noted, so writing it neither starts a pass nor rebuilds the scheduling session.
STATUS_ONLY_KINDS = frozenset(("ClusterQueue", "LocalQueue"))
_VOLATILE_METADATA = ("resourceVersion", "managedFields")


def _only_status_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether two versions of an object differ in nothing but ``status`` (and the metadata
    that every write changes)."""
    if before.keys() - {"status"} != after.keys() - {"status"}:
        return False
    for name in before.keys() - {"status", "metadata"}:
        if before[name] != after[name]:
            return False
    meta_before, meta_after = before.get("metadata") or {}, after.get("metadata") or {}
    strip = set(_VOLATILE_METADATA)
    return {k: v for k, v in meta_before.items() if k not in strip} == {
        k: v for k, v in meta_after.items() if k not in strip
    }


def without_managed_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` without its ``managedFields``, in place: no reader needs them, and an object written
    back without them keeps the server's (an update that carries none leaves them as they are).
    The cache trims every object it keeps, so every copy, write and comparison of a cached object
    skips them (as client-go's informers of kube-scheduler and kube-controller-manager trim them)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


@dataclass
class Cache:
    """Objects by resource kind and key, plus assumed writes."""

    lock: threading.RLock = field(default_factory=threading.RLock)
    objects: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    assumed: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    changed: threading.Event = field(default_factory=threading.Event)
    # Keys upserted, removed, assumed or forgotten, or changed by a relist, by kind, since the
    # last take_changes().
    touched: dict[str, set[str]] = field(default_factory=dict)
    # Deleted objects, (kind, key) -> (uid, resourceVersion at deletion, when): an event of the same
    # object that arrives late (an older version, delivered after the deletion was recorded) must not
    # bring it back. A relist of the kind clears them; they expire after TOMBSTONE_SECONDS (by
    # ``clock``), and the oldest go beyond TOMBSTONES.
    tombstones: dict[tuple[str, str], tuple[str, int, float]] = field(default_factory=dict)
    clock: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    def take_changes(self) -> dict[str, set[str]]:
        """The keys changed since the last call, by kind."""
        with self.lock:
            touched, self.touched = self.touched, {}
            return touched

    def _touch(self, kind: str, key: str) -> None:
        self.touched.setdefault(kind, set()).add(key)

    def replace_all(self, kind: str, items: list[dict[str, Any]], resource_version: str = "") -> None:
        """The objects of a list served at ``resource_version``.

        A cached copy newer than the list (a write's answer, recorded by :meth:`upsert` while the
        list was on its way) is kept: the watch from the list's version delivers it again.
        """
        with self.lock:
            old = self.objects.get(kind, {})
            listed = {object_key(o): without_managed_fields(o) for o in items}
            try:
                at = int(resource_version)
            except ValueError:
                at = 0
            if at:
                listed.update({key: o for key, o in old.items() if rv_of(o) > at})
            # A relist (after 410 Gone) notes only what differs from the copy it replaces.
            for key in old.keys() | listed.keys():
                before, after = old.get(key), listed.get(key)
                if (
                    before is None
                    or after is None
                    or rv_of(before) != rv_of(after)
                    or (not rv_of(after) and before != after)
                ):
                    self._touch(kind, key)
            self.objects[kind] = listed
            for tomb in [t for t in self.tombstones if t[0] == kind]:
                del self.tombstones[tomb]  # the list says what exists now
            self.changed.set()

    def upsert(self, kind: str, obj: dict[str, Any]) -> None:
        """Record ``obj``, unless the cache holds a newer copy of it.

        A write's answer is recorded at once, and the watch delivers the object's earlier versions
        after it (the placement patch before the status write, say): those must not roll it back.
        """
        without_managed_fields(obj)
        with self.lock:
            key = object_key(obj)
            current = self.objects.setdefault(kind, {}).get(key)
            if current is not None and 0 < rv_of(obj) < rv_of(current):
                return
            tomb = self.tombstones.get((kind, key))
            if tomb is not None:
                uid, deleted_at, when = tomb
                if _uid(obj) == uid and rv_of(obj) <= deleted_at and self.clock() - when < TOMBSTONE_SECONDS:
                    return  # a late event of an object already deleted
                del self.tombstones[(kind, key)]
            self.objects[kind][key] = obj
            shadow = self.assumed.get((kind, key))
            if shadow is not None and rv_of(obj) >= rv_of(shadow):
                del self.assumed[(kind, key)]
            if kind in STATUS_ONLY_KINDS and current is not None and _only_status_changed(current, obj):
                return  # the controller's own queue status: no reader needs to hear of it
            self._touch(kind, key)
            self.changed.set()

    def remove(self, kind: str, obj: dict[str, Any]) -> None:
        """Drop a deleted object, and keep its tombstone (see :attr:`tombstones`)."""
        with self.lock:
            key = object_key(obj)
            known = self.objects.setdefault(kind, {}).pop(key, None)
            now = self.clock()
            self.tombstones.pop((kind, key), None)  # the newest last: the oldest go first
            self.tombstones[(kind, key)] = (_uid(obj), max(rv_of(obj), rv_of(known) if known else 0), now)
            for tomb, (_, _, at) in list(self.tombstones.items()):
                if len(self.tombstones) <= TOMBSTONES and now - at < TOMBSTONE_SECONDS:
                    break
                del self.tombstones[tomb]
            self.assumed.pop((kind, key), None)
            self._touch(kind, key)
            self.changed.set()

    def assume(self, kind: str, obj: dict[str, Any]) -> None:
        """Record a write before (or while) it reaches the server."""
        with self.lock:
            self.assumed[(kind, object_key(obj))] = obj
            self._touch(kind, object_key(obj))
            self.changed.set()

    def forget(self, kind: str, key: str) -> None:
        """Drop an assumption after a failed write (safe to call twice)."""
        with self.lock:
            if self.assumed.pop((kind, key), None) is not None:
                self._touch(kind, key)

    def items(self, kind: str) -> list[dict[str, Any]]:
        with self.lock:
            merged = dict(self.objects.get(kind, {}))
            for (k, key), obj in self.assumed.items():
                if k == kind:
                    merged[key] = obj
            return [merged[k] for k in sorted(merged)]

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        with self.lock:
            return self.assumed.get((kind, key)) or self.objects.get(kind, {}).get(key)


class Informer:
    """Keeps ``cache`` in sync with one resource (the objects ``label_selector`` selects, all by
    default) until stopped."""

    def __init__(  # noqa: PLR0913 - keyword-only: the watch's timeout, back-off and sleep
        self,
        api: KubeApi,
        resource: Resource,
        cache: Cache,
        *,
        watch_timeout: int = 30,
        max_backoff: float = 5.0,
        sleep: Callable[[float], object] | None = None,
        label_selector: str = "",
    ) -> None:
        self.api = api
        self.label_selector = label_selector
        self.resource = resource
        self.cache = cache
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.resource_version = ""
        self.synced = threading.Event()
        self.stopped = threading.Event()
        # Back-off pauses; the default ends at once when the informer stops.
        self.sleep: Callable[[float], object] = sleep or self.stopped.wait
        self.relists = 0
        self.errors = 0
        self._thread: threading.Thread | None = None
        self._watcher: k8s_watch.Watch | None = None
        self._watch_stop: WatchStop | None = None
        self._stop_lock = threading.Lock()

    @property
    def kind(self) -> str:
        return self.resource.kind

    def list(self) -> None:
        query = {"labelSelector": self.label_selector} if self.label_selector else {}
        result = self.api.list(self.resource, **query)
        self.resource_version = str(result.get("metadata", {}).get("resourceVersion", ""))
        self.cache.replace_all(self.kind, list(result.get("items", [])), self.resource_version)
        self.relists += 1
        self.synced.set()

    def watch_once(self) -> int:
        """Consume one watch stream; returns how many events it applied.

        An ERROR event (``410 Gone`` among them) raises :class:`ApiError`.
        """
        applied = 0
        stop = WatchStop()
        with self._stop_lock:  # a stop() from now on cuts this stream, open or not
            if self.stopped.is_set():
                return applied
            watcher = self._watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]  # no annotations
            self._watch_stop = stop
        events = self.api.watch(
            self.resource,
            self.resource_version,
            self.watch_timeout,
            watcher=watcher,
            stop=stop,
            label_selector=self.label_selector,
        )
        try:
            for event in events:
                if self.stopped.is_set():
                    break
                kind = event.get("type")
                obj = event.get("object", {})
                rv = obj.get("metadata", {}).get("resourceVersion")
                if rv:
                    self.resource_version = str(rv)
                if kind == "BOOKMARK":
                    continue
                if kind == "DELETED":
                    self.cache.remove(self.kind, obj)
                else:
                    self.cache.upsert(self.kind, obj)
                applied += 1
        finally:
            events.close()  # closes the response even when the loop ended early
            with self._stop_lock:
                self._watcher = None
                self._watch_stop = None
        return applied

    def run(self) -> None:
        backoff = 0.05
        while not self.stopped.is_set():
            try:
                if not self.synced.is_set() or not self.resource_version:
                    try:
                        self.list()
                    except ApiError as err:
                        if not err.not_found:
                            raise
                        # The kind is not served (its CRD is not installed): nothing to watch yet.
                        self.cache.replace_all(self.kind, [])
                        self.synced.set()
                        self.resource_version = ""
                        self.sleep(self.max_backoff)
                        continue
                self.watch_once()
                backoff = 0.05
            except ApiError as err:
                if err.gone:
                    self.synced.clear()  # history expired: relist
                    continue
                self.errors += 1
                log.debug("informer %s: %s", self.kind, err)
                self.sleep(backoff * (1 + random.random()))
                backoff = min(self.max_backoff, backoff * 2)
            except Exception as err:
                if self.stopped.is_set():
                    break  # stop() cut the stream
                self.errors += 1
                log.debug("informer %s stream: %s", self.kind, err)
                self.sleep(backoff * (1 + random.random()))
                backoff = min(self.max_backoff, backoff * 2)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self, wait: float = 5.0) -> None:
        """End the informer: it neither lists nor watches again, its open watch (or the one being
        opened) is cut at once, and so is a back-off. Waits up to ``wait`` seconds for its thread
        (a list in flight is answered first), so that no connection of it outlives the stop."""
        with self._stop_lock:
            self.stopped.set()
            watcher, stop = self._watcher, self._watch_stop
        if stop is not None:
            stop.stop()
        if watcher is not None:
            watcher.stop()  # type: ignore[no-untyped-call]  # the client ships no annotations here
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(wait)
