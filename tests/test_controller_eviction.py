"""Kueue's eviction semantics in the controller: a preempted workload keeps its admission and quota,
marked Evicted and Preempted, until its job is no longer active; only then is the quota given back.

The double holds a batch Job "active" (``status.active`` is what kube-controller-manager reports;
the reduced Job controller of the harness never writes it) and lets evicted pods terminate on its
virtual clock, so these tests skip against a real cluster. The end-to-end preemption tests in
``test_controller_e2e.py`` cover the real Job controller.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.fixtures import Cluster, Kubectl, manifest
from apiserver.server import ApiServerDouble
from controller_harness import Scene, make_scene, quota_violations, wait_until
from gpuplane.k8s import api as k8s
from manifests import GPU, Manifest, pod_spec

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def scene(apiserver: Cluster, kubectl: Kubectl, double: ApiServerDouble) -> Iterator[Scene]:
    del double  # requested so that these tests skip against a real cluster
    yield from make_scene(apiserver, kubectl)


def condition(obj: dict[str, Any], ctype: str) -> tuple[str, str] | None:
    found = next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)
    return None if found is None else (found["status"], found["reason"])


def holds_quota_while_evicted(wl: dict[str, Any]) -> bool:
    return (
        bool(wl["status"].get("admission"))
        and condition(wl, "QuotaReserved") == ("True", "QuotaReserved")
        and condition(wl, "Evicted") == ("True", "Preempted")
        and condition(wl, "Preempted") == ("True", "InClusterQueue")
    )


def test_a_preempted_job_keeps_its_quota_until_it_is_no_longer_active(scene: Scene) -> None:
    cq = scene.setup(nodes=1, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = scene.priority_class("low", 10), scene.priority_class("high", 1000)
    scene.job_controller()
    run = scene.controller(leader_election=False, dry_run=False)
    scene.submit(scene.job("victim", pods=2, gpus=4, priority_class=low))
    wait_until(lambda: scene.bound("victim", 2), 20, "victim bound")
    job = scene.jobs()["victim"]
    job["status"] = {"active": 2}  # what the Job controller reports while the pods run
    scene.api.replace(k8s.JOBS, job, sub="status")

    scene.submit(scene.job("urgent", gpus=8, priority_class=high))
    wait_until(lambda: condition(scene.workloads()["victim"], "Evicted"), 20, "the victim evicted")
    wait_until(lambda: scene.jobs()["victim"]["spec"]["suspend"], 20, "the victim's job suspended")
    wait_until(lambda: not scene.pods("victim"), 20, "the victim's pods gone")
    run.wait_passes(5)

    victim = scene.workloads()["victim"]
    assert holds_quota_while_evicted(victim), victim["status"]
    assert not scene.admitted("urgent"), "no admission into quota the victim still holds"
    assert not scene.pods("urgent")
    queues = [q for q in scene.list(k8s.CLUSTER_QUEUES) if q["metadata"]["name"] == cq]
    assert quota_violations(scene.list(k8s.WORKLOADS), queues) == []
    assert run.controller.counters.preempted == 1, "evicted once, not again on every pass"

    job = scene.jobs()["victim"]
    job["status"] = {"active": 0}  # the Job controller saw its pods go
    scene.api.replace(k8s.JOBS, job, sub="status")
    wait_until(lambda: scene.bound("urgent", 1), 20, "urgent admitted and bound")
    victim = scene.workloads()["victim"]
    assert not victim["status"].get("admission"), "the quota given back"
    assert (condition(victim, "QuotaReserved") or ("", ""))[0] == "False"
    assert condition(victim, "Evicted") == ("True", "Preempted"), "still marked evicted while it waits"
    assert run.controller.counters.released == 1


def test_preempted_plain_pods_keep_their_quota_until_they_have_terminated(
    scene: Scene, double: ApiServerDouble
) -> None:
    scene.setup(nodes=1, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = scene.priority_class("low", 10), scene.priority_class("high", 1000)
    scene.job_controller()
    run = scene.controller(leader_election=False, dry_run=False)
    group = [
        scene.admit(
            Manifest("v1", "Pod", f"group-{i}", scene.namespace)
            .label("kueue.x-k8s.io/queue-name", "queue")
            .label("kueue.x-k8s.io/pod-group-name", "group")
            .label("kueue.x-k8s.io/priority-class", low)
            .annotate("kueue.x-k8s.io/pod-group-total-count", "2")
            .set("spec", pod_spec().container(limits={GPU: 4}, cpu="100m", gpu=4).to_dict())
            .set("spec.restartPolicy", "Never")
            .set("spec.terminationGracePeriodSeconds", 30)
            .to_dict()
        )
        for i in range(2)
    ]
    scene.kubectl("apply", "-f", "-", input=manifest(*group))
    wait_until(
        lambda: all(p["spec"].get("nodeName") for p in scene.pods()) and len(scene.pods()) == 2,
        20,
        "the pod group bound",
    )
    (victim_name,) = scene.workloads()
    scene.submit(scene.job("urgent", gpus=8, priority_class=high))
    wait_until(
        lambda: all(
            p["metadata"].get("deletionTimestamp")
            for p in scene.pods()
            if p["metadata"]["name"].startswith("group-")
        ),
        20,
        "the group's pods evicted, terminating for their grace period",
    )
    run.wait_passes(5)
    assert holds_quota_while_evicted(scene.workloads()[victim_name])
    assert not scene.admitted("urgent")

    double.advance(30)  # the grace period ends: the pods are gone
    wait_until(lambda: scene.bound("urgent", 1), 20, "urgent bound once the pods have terminated")
    assert not scene.workloads()[victim_name]["status"].get("admission")
