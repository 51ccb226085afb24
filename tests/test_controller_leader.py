"""Two controller replicas with Lease leader election: only the leader acts, and a standby takes over
within the lease duration when the leader dies.

The replicas share an injected clock where the test steps time itself (the lease is judged by the
replicas' clock, not the server's), and the wall clock where the test measures a real failover.
Checks on who wrote what read the double's request log by user agent (each replica has its own); they
are skipped against a real cluster, the rest still runs.
"""

from __future__ import annotations

import threading
import time

import pytest

from apiserver.fixtures import Cluster
from apiserver.server import ApiServerDouble
from controller_harness import RunningController, Scene, wait_until
from gpuplane.k8s import api as k8s

pytestmark = pytest.mark.timeout(60)

LEASE = 2.0  # seconds
MARGIN = 1.0  # seconds a takeover may take beyond the lease: a few reconcile passes and a kubectl run


class SteppedClock:
    """A clock that moves only when the test says so (seconds since the epoch, as time.time)."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds


def writes_by(apiserver: Cluster, replica: RunningController) -> list[str]:
    """What ``replica`` wrote, other than its Lease, as "verb resource/subresource"."""
    if not isinstance(apiserver, ApiServerDouble):
        return []
    return [
        f"{e.request.verb} {e.request.resource}/{e.request.subresource}"
        for e in apiserver.requests
        if e.request.user_agent.startswith(replica.user_agent)
        and e.request.is_write
        and e.request.resource != "leases"
    ]


def lease(scene: Scene) -> dict[str, object]:
    spec: dict[str, object] = scene.api.get(k8s.LEASES, "gpuplane-controller", scene.namespace)["spec"]
    return spec


def two_replicas(
    scene: Scene, clock: SteppedClock | None = None
) -> tuple[RunningController, RunningController]:
    """Replica a, then replica b once a leads; b has done a few passes as a follower."""
    options = {"lease_duration": LEASE, "dry_run": False} | ({"clock": clock} if clock else {})
    a = scene.controller(identity="replica-a", **options)
    wait_until(lambda: a.controller.elector.is_leader, 10, "replica-a leads")
    b = scene.controller(identity="replica-b", **options)
    b.wait_passes(5)
    return a, b


def test_only_the_leader_acts_and_a_standby_takes_over_once_the_lease_expires(
    scene: Scene, apiserver: Cluster
) -> None:
    scene.setup(nodes=2)
    scene.job_controller()
    clock = SteppedClock()
    a, b = two_replicas(scene, clock)
    scene.submit(scene.job("before", pods=2, gpus=2))
    wait_until(lambda: scene.bound("before", 2), 20, "the leader binds the first job")
    b.wait_passes(3)
    assert not b.controller.elector.is_leader
    assert writes_by(apiserver, b) == [], "the follower wrote something besides its Lease"
    if isinstance(apiserver, ApiServerDouble):
        assert "create pods/binding" in writes_by(apiserver, a)

    a.kill()  # abrupt: no lease release
    clock.advance(LEASE - 0.1)
    b.wait_passes(5)
    assert not b.controller.elector.is_leader, "took over before the lease ran out"
    assert lease(scene)["holderIdentity"] == "replica-a"

    clock.advance(0.2)
    b.wait_passes(2)
    assert b.controller.elector.is_leader, "no takeover once the lease ran out"
    spec = lease(scene)
    assert (spec["holderIdentity"], spec["leaseTransitions"]) == ("replica-b", 1)
    scene.submit(scene.job("after", pods=1, gpus=4))
    wait_until(lambda: scene.bound("after", 1), 20, "the new leader binds")
    if isinstance(apiserver, ApiServerDouble):
        binders = {
            e.request.user_agent
            for e in apiserver.requests.find(subresource="binding", status=201)
            if e.request.name.startswith("after-")
        }
        assert binders == {b.user_agent}


def test_failover_within_the_lease_duration_on_the_wall_clock(scene: Scene) -> None:
    scene.setup(nodes=2)
    scene.job_controller()
    a, b = two_replicas(scene)
    scene.submit(scene.job("before", gpus=2))
    wait_until(lambda: scene.bound("before", 1), 20, "the leader binds the first job")

    killed = time.monotonic()
    a.kill()
    scene.submit(scene.job("after", gpus=2))  # waits for a leader
    wait_until(lambda: b.controller.elector.is_leader, LEASE + MARGIN, "the standby leads")
    took_over = time.monotonic() - killed
    wait_until(lambda: scene.admitted("after"), LEASE + MARGIN - took_over, "the standby admits")
    admitting = time.monotonic() - killed
    assert LEASE / 2 <= took_over <= admitting <= LEASE + MARGIN, f"{took_over:.2f}s, {admitting:.2f}s"
    wait_until(lambda: scene.bound("after", 1), 20, "and binds")


def test_a_clean_shutdown_hands_over_at_once(scene: Scene) -> None:
    scene.setup(nodes=1)
    clock = SteppedClock()  # never advanced: only the release lets b in
    a, b = two_replicas(scene, clock)
    a.stop()
    b.wait_passes(2)
    assert b.controller.elector.is_leader
    assert lease(scene)["holderIdentity"] == "replica-b"
