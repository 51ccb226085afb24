"""Informers: list, then watch, into an incremental local cache.

Each :class:`Informer` keeps a copy of one resource. It lists once (remembering the
list's resourceVersion), then watches from there with bookmarks, so a reconnect
resumes where it stopped. ``410 Gone`` (the server no longer has that history) means
relist. Other errors back off exponentially before retrying. All objects are plain
dicts, exactly as the API server sent them.

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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuplane.k8s.api import ApiError, KubeApi, Resource

log = logging.getLogger(__name__)


def object_key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def rv_of(obj: dict[str, Any]) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion", "0"))
    except ValueError:
        return 0


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

    def take_changes(self) -> dict[str, set[str]]:
        """The keys changed since the last call, by kind."""
        with self.lock:
            touched, self.touched = self.touched, {}
            return touched

    def _touch(self, kind: str, key: str) -> None:
        self.touched.setdefault(kind, set()).add(key)

    def replace_all(self, kind: str, items: list[dict[str, Any]]) -> None:
        with self.lock:
            old = self.objects.get(kind, {})
            new = {object_key(o): o for o in items}
            # A relist (after 410 Gone) notes only what differs from the copy it replaces.
            for key in old.keys() | new.keys():
                before, after = old.get(key), new.get(key)
                if (
                    before is None
                    or after is None
                    or rv_of(before) != rv_of(after)
                    or (not rv_of(after) and before != after)
                ):
                    self._touch(kind, key)
            self.objects[kind] = new
            self.changed.set()

    def upsert(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            key = object_key(obj)
            self.objects.setdefault(kind, {})[key] = obj
            shadow = self.assumed.get((kind, key))
            if shadow is not None and rv_of(obj) >= rv_of(shadow):
                del self.assumed[(kind, key)]
            self._touch(kind, key)
            self.changed.set()

    def remove(self, kind: str, obj: dict[str, Any]) -> None:
        with self.lock:
            key = object_key(obj)
            self.objects.setdefault(kind, {}).pop(key, None)
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
    """Keeps ``cache`` in sync with one resource until stopped."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        cache: Cache,
        *,
        watch_timeout: int = 30,
        max_backoff: float = 5.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self.resource = resource
        self.cache = cache
        self.watch_timeout = watch_timeout
        self.max_backoff = max_backoff
        self.sleep = sleep
        self.resource_version = ""
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.relists = 0
        self.errors = 0
        self._thread: threading.Thread | None = None

    @property
    def kind(self) -> str:
        return self.resource.kind

    def list(self) -> None:
        result = self.api.list(self.resource)
        self.cache.replace_all(self.kind, list(result.get("items", [])))
        self.resource_version = str(result.get("metadata", {}).get("resourceVersion", ""))
        self.relists += 1
        self.synced.set()

    def watch_once(self) -> int:
        """Consume one watch stream; returns how many events it applied."""
        applied = 0
        for event in self.api.watch(self.resource, self.resource_version, self.watch_timeout):
            if self.stopped.is_set():
                break
            kind = event.get("type")
            obj = event.get("object", {})
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise ApiError(410, "Gone", str(obj.get("message", "")))
                raise ApiError(
                    int(obj.get("code", 500)), str(obj.get("reason", "")), str(obj.get("message", ""))
                )
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
                self.errors += 1
                log.debug("informer %s stream: %s", self.kind, err)
                self.sleep(backoff * (1 + random.random()))
                backoff = min(self.max_backoff, backoff * 2)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.kind}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
