"""Defects of the live path, each caught by a test: connections a stopped controller or informer
left open (the client sockets the garbage collector used to close, during whichever test ran then),
and tombstones of deleted objects kept for ever.

Connections are counted from the test's own process: its sockets whose peer is the double's port.
The garbage collector is off while a test counts, so a socket that nothing closed still counts.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
import urllib.parse
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import yaml

from apiserver.fixtures import Cluster, Kubectl
from apiserver.server import ApiServerDouble
from controller_harness import Scene, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s import informer as informer_module
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.k8s.controller import Controller, ControllerConfig
from gpuplane.k8s.informer import TOMBSTONE_SECONDS, Cache, Informer

pytestmark = pytest.mark.timeout(90)


@pytest.fixture
def scene(apiserver: Cluster, kubectl: Kubectl, double: ApiServerDouble) -> Iterator[Scene]:
    del double  # the double's port is this process's: its clients' sockets can be counted
    yield from make_scene(apiserver, kubectl)


def server_port(kubeconfig: str) -> int:
    with open(kubeconfig) as f:
        config = yaml.safe_load(f)
    return int(urllib.parse.urlparse(config["clusters"][0]["cluster"]["server"]).port or 0)


def client_sockets(port: int) -> int:
    """This process's open TCP sockets connected to ``port``."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:[") : -1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                if int(fields[2].rpartition(":")[2], 16) == port and fields[9] in inodes:
                    count += 1
    return count


@contextlib.contextmanager
def no_collector() -> Iterator[list[warnings.WarningMessage]]:
    """The garbage collector off (a socket nothing closed stays open and counted), and the
    ResourceWarnings of sockets it closes once it runs again, recorded."""
    gc.collect()
    gc.disable()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            yield caught
            gc.collect()
    finally:
        gc.enable()


def unclosed(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_a_stopped_controller_leaves_no_connection_open(scene: Scene) -> None:
    """Many starts and stops: once each controller has stopped and its client is closed, none of its
    connections is left (an informer of a kind not served used to sleep its back-off out, and a
    watch cut while being opened ran to the server's timeout, each holding a connection)."""
    scene.setup(nodes=1)
    port = server_port(scene.kubeconfig)
    with no_collector() as caught:
        before = client_sockets(port)
        for _ in range(8):
            api = KubeApi(load_api_client(scene.kubeconfig), qps=None)
            controller = Controller(api, ControllerConfig(leader_election=False))
            controller.start()
            controller.reconcile()
            controller.stop()
            api.close()
            assert client_sockets(port) == before, "a stopped controller still holds a connection"
    assert not unclosed(caught)


def test_replicas_killed_at_random_calls_leave_no_connection_open(scene: Scene) -> None:
    """The crash test's replicas, killed before their Nth request and restarted many times: the
    open connections do not grow with the kills (the crash test once ran out of file descriptors)."""
    scene.setup(nodes=1)
    scene.submit(scene.job("j", pods=2, gpus=1))
    port = server_port(scene.kubeconfig)
    rng = np.random.default_rng(31)
    with no_collector() as caught:
        before = client_sockets(port)
        for _ in range(12):
            run = scene.controller(kill_after=int(rng.integers(5, 120)), dry_run=False)
            wait_until(lambda run=run: run.api.killed.is_set() or run.passes >= 3, 30, "the fatal call")
            run.kill()
            assert client_sockets(port) == before, "a killed replica still holds a connection"
    assert not unclosed(caught)


class OpensAfterStop(KubeApi):
    """Lets ``informer.stop()`` run while the informer is opening its watch (the stop lands between
    the informer's last look at its flag and the stream's first read)."""

    informer: Informer

    def open_watch(self, res: Any, namespace: str | None = None, **kw: Any) -> Any:
        stopper = threading.Thread(target=self.informer.stop, daemon=True)
        stopper.start()
        wait_until(self.informer.stopped.is_set, 5, "the stop under way")
        return super().open_watch(res, namespace, **kw)


def test_a_stop_while_the_watch_is_being_opened_ends_the_informer_at_once(scene: Scene) -> None:
    port = server_port(scene.kubeconfig)
    with no_collector() as caught:
        before = client_sockets(port)
        api = OpensAfterStop(load_api_client(scene.kubeconfig), qps=None)
        informer = Informer(api, k8s.NODES, Cache(), watch_timeout=60)
        api.informer = informer
        informer.start()
        wait_until(informer.stopped.is_set, 10, "stopped")
        thread = informer._thread
        assert thread is not None
        thread.join(5)
        assert not thread.is_alive(), "the stream opened after the stop was read until its timeout"
        api.close()
        assert client_sockets(port) == before
    assert not unclosed(caught)


def deleted(name: str, rv: int, uid: str = "u") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": str(rv)}}


def test_tombstones_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deleted object is remembered while a late answer of a write may still come (it keeps the
    object deleted), then forgotten: the cache does not grow with every pod that ever ended."""
    now = [0.0]
    cache = Cache(clock=lambda: now[0])
    cache.upsert("Pod", deleted("a", 3))
    cache.remove("Pod", deleted("a", 5))
    now[0] = TOMBSTONE_SECONDS / 2
    cache.upsert("Pod", deleted("a", 4))  # a write's answer, late
    assert cache.get("Pod", "ns/a") is None, "still remembered as deleted"
    now[0] = TOMBSTONE_SECONDS + 1
    cache.remove("Pod", deleted("b", 7))
    assert list(cache.tombstones) == [("Pod", "ns/b")], "the old tombstone expired"
    monkeypatch.setattr(informer_module, "TOMBSTONES", 3)
    for i in range(6):
        cache.remove("Pod", deleted(f"c{i}", 10 + i))
    assert list(cache.tombstones) == [("Pod", "ns/c3"), ("Pod", "ns/c4"), ("Pod", "ns/c5")]
