"""The controller against the API-server double: broken references and one bad workload.

In a live cluster a LocalQueue is often created before its ClusterQueue, a ClusterQueue before its
ResourceFlavor, and a user can submit to a LocalQueue that does not exist. One such object, or one
workload with a request that overflows int64, must never stop the controller from admitting the
rest. The bad workload carries ``QuotaReserved=False`` with a reason and message naming its problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.fixtures import Cluster, Kubectl
from controller_harness import Scene, make_scene, wait_until
from gpuplane.k8s import api as k8s
from manifests import cluster_queue, local_queue, workload

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def scene(apiserver: Cluster, kubectl: Kubectl) -> Iterator[Scene]:
    yield from make_scene(apiserver, kubectl)


def quota_reserved(scene: Scene, name: str) -> dict[str, Any] | None:
    """The QuotaReserved condition of the Workload of job (or Workload) ``name``."""
    wl = scene.workloads().get(name)
    conditions = ((wl or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "QuotaReserved"), None)


def waits_with(scene: Scene, name: str, reason: str, text: str) -> bool:
    cond = quota_reserved(scene, name)
    return bool(cond and cond["status"] == "False" and cond["reason"] == reason and text in cond["message"])


def test_dangling_references_and_an_overflowing_request_never_stop_the_rest(scene: Scene) -> None:
    scene.setup(nodes=1)
    ns = scene.namespace
    missing_cq = f"{scene.prefix}-not-yet"
    ghost_cq = f"{scene.prefix}-ghost"
    scene.api.create(k8s.LOCAL_QUEUES, local_queue("orphan", ns, missing_cq).to_dict(), ns)
    ghost = cluster_queue(ghost_cq).flavor(f"{scene.prefix}-no-such-flavor", cpu="8")
    scene.api.create(k8s.CLUSTER_QUEUES, ghost.to_dict())
    scene.api.create(k8s.LOCAL_QUEUES, local_queue("ghost", ns, ghost_cq).to_dict(), ns)
    huge = scene.job("huge", gpus=1)
    container = huge.body["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["requests"]["cpu"] = "9223372036854776"
    no_local_queue = workload("no-local-queue", ns).queue("nowhere").podset(cpu="1").to_dict()
    scene.api.create(k8s.WORKLOADS, no_local_queue, ns)
    scene.job_controller()
    scene.controller(leader_election=False)

    scene.submit(
        scene.job("good", gpus=2),
        scene.job("orphaned", gpus=1).set("metadata.labels", {"kueue.x-k8s.io/queue-name": "orphan"}),
        scene.job("haunted", gpus=1).set("metadata.labels", {"kueue.x-k8s.io/queue-name": "ghost"}),
        huge,
    )

    wait_until(lambda: scene.bound("good", 1), 20, "the healthy job bound")
    wait_until(
        lambda: waits_with(scene, "orphaned", "Misconfigured", f"ClusterQueue {missing_cq} doesn't exist"),
        10,
        "the job of a LocalQueue without ClusterQueue marked Misconfigured",
    )
    wait_until(
        lambda: waits_with(scene, "haunted", "Suspended", f"ClusterQueue {ghost_cq} is inactive"),
        10,
        "the job of a ClusterQueue with a missing flavor marked Suspended",
    )
    wait_until(
        lambda: waits_with(scene, "no-local-queue", "Misconfigured", "LocalQueue nowhere doesn't exist"),
        10,
        "the Workload without LocalQueue marked Misconfigured",
    )
    wait_until(
        lambda: waits_with(scene, "huge", "ExceedsMaxQuota", "insufficient quota for cpu"),
        10,
        "the overflowing job marked ExceedsMaxQuota",
    )
    assert not any(scene.admitted(name) for name in ("orphaned", "haunted", "huge", "no-local-queue"))


def test_one_invalid_workload_is_misconfigured_and_the_rest_is_admitted(scene: Scene) -> None:
    scene.setup(nodes=1)
    ns = scene.namespace
    bad = workload("bad", ns).queue("queue").podset(count=2, min_count=3, cpu="1").to_dict()
    scene.api.create(k8s.WORKLOADS, bad, ns)
    scene.job_controller()
    scene.controller(leader_election=False)

    scene.submit(scene.job("good", gpus=1))

    wait_until(lambda: scene.bound("good", 1), 20, "the healthy job bound")
    wait_until(
        lambda: waits_with(scene, "bad", "Misconfigured", "minCount must be between 0 and count (2)"),
        10,
        "the invalid Workload marked Misconfigured with its field",
    )
