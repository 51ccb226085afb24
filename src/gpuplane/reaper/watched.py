"""The reaper's informer cache: each kind it reads is listed once, then kept current by a watch.

A kind is watched from the first time a pass reads it (pods, namespaces, queues, Workloads, and the
owner kinds met up pods' owner chains), so a pass reads memory and makes no API call per pod. A kind
the reaper may not list or watch (403), or that its server does not serve, is read directly
instead, as before. A write's answer goes into the cache at once, so the next pass sees it even
before its watch event arrives.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes import watch as k8s_watch

from gpuplane.kube.client import ApiError, KubeApi, Resource

log = logging.getLogger(__name__)

Key = tuple[str, str]  # (namespace or "", name)


def _key(obj: Mapping[str, Any]) -> Key:
    m = obj.get("metadata") or {}
    return (str(m.get("namespace") or ""), str(m.get("name") or ""))


def _version(obj: Mapping[str, Any]) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class WatchedKind:
    """One kind's objects by (namespace, name), kept current by list-then-watch in a thread (owns
    the objects, the resource version it watches from, and its thread)."""

    def __init__(
        self,
        api: KubeApi,
        resource: Resource,
        *,
        watch_timeout: int = 60,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.api = api
        self.resource = resource
        self.watch_timeout = watch_timeout
        self.sleep = sleep
        self.synced = threading.Event()
        self.stopped = threading.Event()
        self.lists = 0
        self._objects: dict[Key, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._version = ""
        self._watcher: k8s_watch.Watch | None = None
        self._thread: threading.Thread | None = None

    def relist(self) -> None:
        """Replace every object with a fresh list (raises :class:`ApiError`, 403 among them)."""
        result = self.api.list(self.resource)
        with self._lock:
            self._objects = {_key(o): o for o in result.get("items") or []}
            self._version = str((result.get("metadata") or {}).get("resourceVersion") or "")
        self.lists += 1
        self.synced.set()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"reaper-{self.resource.plural}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopped.set()
        watcher = self._watcher
        if watcher is not None:
            watcher.stop()  # type: ignore[no-untyped-call]  # the client ships no annotations here

    def items(self, namespace: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [o for (ns, _), o in self._objects.items() if namespace is None or ns == namespace]

    def get(self, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace or "", name))

    def put(self, obj: dict[str, Any]) -> None:
        """An object as the server answered a write: kept unless the cache has a newer version."""
        key = _key(obj)
        with self._lock:
            held = self._objects.get(key)
            if held is None or _version(held) <= _version(obj):
                self._objects[key] = obj

    def drop(self, obj: Mapping[str, Any]) -> None:
        with self._lock:
            self._objects.pop(_key(obj), None)

    def _watch_once(self) -> None:
        watcher = self._watcher = k8s_watch.Watch()  # type: ignore[no-untyped-call]  # no annotations
        if self.stopped.is_set():
            return
        events = self.api.watch(self.resource, self._version, self.watch_timeout, watcher=watcher)
        try:
            for event in events:
                obj = event.get("object") or {}
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self._version = str(version)
                if event.get("type") == "DELETED":
                    self.drop(obj)
                elif event.get("type") in ("ADDED", "MODIFIED"):
                    with self._lock:
                        self._objects[_key(obj)] = obj
        finally:
            events.close()
            self._watcher = None

    def _run(self) -> None:
        backoff = 0.1
        while not self.stopped.is_set():
            try:
                if not self._version:
                    self.relist()
                self._watch_once()
                backoff = 0.1
            except ApiError as err:
                if err.gone:
                    self._version = ""  # history expired: list again
                    continue
                log.debug("reaper watch of %s: %s", self.resource.plural, err)
                self.sleep(backoff * (1 + random.random()))
                backoff = min(10.0, backoff * 2)
            except Exception as err:
                if self.stopped.is_set():
                    break
                log.debug("reaper watch of %s: %s", self.resource.plural, err)
                self.sleep(backoff * (1 + random.random()))
                backoff = min(10.0, backoff * 2)


class WatchedKinds:
    """The reaper's watched kinds, by resource (owns one :class:`WatchedKind` per kind it could list,
    and the set of kinds it could not, which are read directly)."""

    def __init__(self, api: KubeApi, *, watch_timeout: int = 60) -> None:
        self.api = api
        self.watch_timeout = watch_timeout
        self._kinds: dict[Resource, WatchedKind] = {}
        self._direct: set[Resource] = set()
        self._lock = threading.Lock()

    def of(self, resource: Resource) -> WatchedKind | None:
        """The kind's cache, listed and watched from its first use; ``None``: read it directly."""
        with self._lock:
            if resource in self._direct:
                return None
            found = self._kinds.get(resource)
            if found is not None:
                return found
            kind = WatchedKind(self.api, resource, watch_timeout=self.watch_timeout)
            try:
                kind.relist()
            except ApiError as err:
                if err.status not in (403, 404):
                    raise
                log.info("reaper: cannot list %s (%s); reading it directly", resource.plural, err.status)
                self._direct.add(resource)
                return None
            kind.start()
            self._kinds[resource] = kind
            return kind

    def known(self, resource: Resource) -> WatchedKind | None:
        """The kind's cache if it is watched already (writes update it; they never start one)."""
        return self._kinds.get(resource)

    def close(self) -> None:
        for kind in self._kinds.values():
            kind.stop()
