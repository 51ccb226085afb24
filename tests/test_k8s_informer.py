"""Informers over the official client's watch: list, then watch into the cache; resume after a stream
ends; bookmarks; 410 Gone means relist; errors back off; stop() ends an open watch at once.

The first tests run on the API-server double and, with ``GPUPLANE_E2E_KUBECONFIG``, on a real cluster;
those that inject faults (expired history, refused watches, bookmarks on demand) need the double.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from apiserver.faults import Faults
from apiserver.store import Store
from controller_harness import wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s.informer import Cache, Informer

pytestmark = pytest.mark.timeout(60)

CONFIG_MAPS = k8s.Resource("", "v1", "configmaps", "ConfigMap")
_names = itertools.count(1)


class Running:
    """An informer on ConfigMaps in its own thread; the test ends it with ``stop()``."""

    def __init__(self, api: k8s.KubeApi, *, watch_timeout: int = 30) -> None:
        self.cache = Cache()
        self.informer = Informer(api, CONFIG_MAPS, self.cache, watch_timeout=watch_timeout)
        self.informer.sleep = self.informer.stopped.wait  # a back-off ends when the informer stops
        self.thread = threading.Thread(target=self.informer.run, daemon=True, name="test-informer")

    def start(self) -> Running:
        self.thread.start()
        assert self.informer.synced.wait(10), "the informer listed"
        return self

    def stop(self, within: float = 5.0) -> None:
        self.informer.stop()
        self.thread.join(within)
        assert not self.thread.is_alive(), f"the informer did not end within {within}s of stop()"

    def data(self, namespace: str, name: str) -> dict[str, str] | None:
        obj = self.cache.get("ConfigMap", f"{namespace}/{name}")
        return None if obj is None else dict(obj.get("data") or {})


def config_map(namespace: str, name: str, value: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": namespace}, "data": {"v": value}}


def put(api: k8s.KubeApi, namespace: str, name: str, value: str) -> str:
    """Create or replace a ConfigMap; returns the resourceVersion written."""
    try:
        current = api.get(CONFIG_MAPS, name, namespace)
    except k8s.ApiError as err:
        if not err.not_found:
            raise
        created = api.create(CONFIG_MAPS, config_map(namespace, name, value), namespace)
        return str(created["metadata"]["resourceVersion"])
    current["data"] = {"v": value}
    return str(api.replace(CONFIG_MAPS, current)["metadata"]["resourceVersion"])


def test_lists_then_watches_every_change_into_the_cache(api: k8s.KubeApi, namespace: str) -> None:
    put(api, namespace, "before", "1")
    running = Running(api).start()
    try:
        assert running.data(namespace, "before") == {"v": "1"}, "the list filled the cache"
        put(api, namespace, "after", "1")
        put(api, namespace, "before", "2")
        wait_until(lambda: running.data(namespace, "after") == {"v": "1"}, 10, "ADDED through the watch")
        wait_until(lambda: running.data(namespace, "before") == {"v": "2"}, 10, "MODIFIED")
        api.delete(CONFIG_MAPS, "after", namespace)
        wait_until(lambda: running.data(namespace, "after") is None, 10, "DELETED")
        assert running.informer.relists == 1
        assert running.informer.errors == 0
    finally:
        running.stop()


def test_a_new_stream_resumes_where_the_last_one_ended(api: k8s.KubeApi, namespace: str) -> None:
    running = Running(api, watch_timeout=1).start()  # the server ends each stream after a second
    try:
        written = ""
        for value in range(6):  # changes before, during and between streams
            written = put(api, namespace, "c", str(value))
            time.sleep(0.3)
        wait_until(lambda: running.data(namespace, "c") == {"v": "5"}, 10, "the last change")
        wait_until(lambda: int(running.informer.resource_version) >= int(written), 10, "the version")
        assert running.informer.relists == 1, "resumed from its resourceVersion, never relisted"
        assert running.informer.errors == 0
    finally:
        running.stop()


def test_stop_ends_an_open_watch_at_once(api: k8s.KubeApi, namespace: str) -> None:
    running = Running(api, watch_timeout=60).start()
    put(api, namespace, "seen", "1")  # the watch is open once this arrives
    wait_until(lambda: running.data(namespace, "seen") is not None, 10, "the watch delivers")
    started = time.monotonic()
    running.stop(within=5.0)
    assert time.monotonic() - started < 5.0
    assert running.informer.errors == 0, "a stop is not an error"


# --- faults (the double) ------------------------------------------------------------------------------


def test_bookmarks_advance_the_version_without_touching_the_cache(
    api: k8s.KubeApi, namespace: str, store: Store
) -> None:
    put(api, namespace, "a", "1")
    running = Running(api).start()
    try:
        put(api, namespace, "b", "1")  # in another namespace nothing would reach this watch
        wait_until(lambda: running.data(namespace, "b") is not None, 10, "the watch is open")
        api.create(k8s.NAMESPACES, {"metadata": {"name": f"{namespace}-other"}})  # moves the version on
        at = store.send_bookmarks()
        wait_until(lambda: running.informer.resource_version == str(at), 10, "the bookmark's version")
        assert running.informer.relists == 1
        names = {o["metadata"]["name"] for o in running.cache.items("ConfigMap")}
        assert names >= {"a", "b"}, "a bookmark removes nothing"
    finally:
        running.stop()


def test_410_gone_relists_and_misses_nothing(
    api: k8s.KubeApi, namespace: str, store: Store, faults: Faults
) -> None:
    running = Running(api, watch_timeout=1)
    running.informer.list()  # as if it had listed long ago
    put(api, namespace, "later", "1")
    store.compact()  # the history since that list is gone: the next watch answers 410
    running.start()
    try:
        wait_until(lambda: running.informer.relists == 2, 10, "a relist after 410 Gone")
        assert running.data(namespace, "later") == {"v": "1"}, "the relist brought the change"
        faults.expire(times=1, verbs=("watch",))  # once more, on a stream the informer is about to open
        put(api, namespace, "latest", "1")
        wait_until(lambda: running.informer.relists == 3, 10, "a relist after an ERROR 410 event")
        wait_until(lambda: running.data(namespace, "latest") == {"v": "1"}, 10, "the latest change")
        assert running.informer.errors == 0, "410 is a relist, not an error"
    finally:
        running.stop()


def test_a_refused_watch_backs_off_and_retries(api: k8s.KubeApi, namespace: str, faults: Faults) -> None:
    running = Running(api, watch_timeout=1).start()
    try:
        faults.fail(500, verbs=("watch",), resource="configmaps", times=2)
        wait_until(lambda: running.informer.errors == 2, 10, "two refused watches, counted")
        put(api, namespace, "through", "1")
        wait_until(lambda: running.data(namespace, "through") == {"v": "1"}, 10, "the third watch delivers")
        assert running.informer.relists == 1, "a refused watch resumes from the same version"
    finally:
        running.stop()


# --- the cache never goes back in time ---------------------------------------------------------------


def versioned(name: str, rv: int, **status: object) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}, "status": status}


def test_an_older_watch_event_does_not_roll_back_a_written_copy() -> None:
    cache = Cache()
    cache.upsert("Workload", versioned("w", 1))
    cache.upsert("Workload", versioned("w", 3, admission="cq"))  # the status write's answer
    cache.upsert("Workload", versioned("w", 2))  # the watch, late: the placement patch before it
    assert cache.get("Workload", "ns/w") == versioned("w", 3, admission="cq")
    cache.upsert("Workload", versioned("w", 3, admission="cq"))  # the watch catches up
    cache.upsert("Workload", versioned("w", 4))  # and goes on
    assert cache.get("Workload", "ns/w") == versioned("w", 4)


def test_the_cache_keeps_no_managed_fields() -> None:
    owned = [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]

    def with_fields(name: str, rv: int) -> dict[str, object]:
        obj = versioned(name, rv)
        obj["metadata"]["managedFields"] = owned  # type: ignore[index]
        return obj

    cache = Cache()
    cache.replace_all("Job", [with_fields("listed", 1)], "1")
    cache.upsert("Job", with_fields("watched", 2))
    for key in ("ns/listed", "ns/watched"):
        job = cache.get("Job", key)
        assert job is not None
        assert "managedFields" not in job["metadata"]
        assert job["metadata"]["resourceVersion"] in {"1", "2"}


def test_a_list_keeps_copies_newer_than_itself_and_drops_the_rest() -> None:
    cache = Cache()
    cache.replace_all("Workload", [versioned("a", 1), versioned("b", 2), versioned("gone", 2)], "5")
    cache.upsert("Workload", versioned("a", 7, admission="cq"))  # written while the next list was served
    cache.upsert("Workload", versioned("new", 8))  # created meanwhile
    cache.replace_all("Workload", [versioned("a", 4), versioned("b", 6)], "6")
    assert [o["metadata"]["resourceVersion"] for o in cache.items("Workload")] == ["7", "6", "8"]
    cache.replace_all("Workload", [versioned("b", 6)], "9")  # a and new deleted since: gone
    assert [o["metadata"]["name"] for o in cache.items("Workload")] == ["b"]


def with_uid(obj: dict[str, object], uid: str) -> dict[str, object]:
    meta = dict(obj["metadata"])  # type: ignore[call-overload]
    return {**obj, "metadata": {**meta, "uid": uid}}


def test_a_late_event_of_a_deleted_object_does_not_bring_it_back() -> None:
    cache = Cache()
    cache.upsert("Workload", with_uid(versioned("w", 3), "u1"))
    cache.remove("Workload", with_uid(versioned("w", 5), "u1"))  # DELETED, at version 5
    cache.upsert("Workload", with_uid(versioned("w", 4), "u1"))  # a late MODIFIED of the same object
    assert cache.get("Workload", "ns/w") is None, "the tombstone keeps it deleted"
    cache.upsert("Workload", with_uid(versioned("w", 9), "u2"))  # created again: another object
    assert cache.get("Workload", "ns/w") == with_uid(versioned("w", 9), "u2")
    cache.remove("Workload", with_uid(versioned("w", 10), "u2"))
    cache.replace_all("Workload", [with_uid(versioned("w", 8), "u2")], "11")  # a list is the truth
    assert cache.get("Workload", "ns/w") is not None
    assert not cache.tombstones
