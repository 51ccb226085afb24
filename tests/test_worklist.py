"""The controller's worklist: indexes and candidates kept from the informer cache's changes.

Each test changes a cache the way the informers and the controller's writes do, hands the worklist
the keys the cache noted, and checks what it holds against what a full sweep of the same cache
finds (the indexes) or against which objects a step has to look at (the candidates).
"""

from __future__ import annotations

from typing import Any

from gpuplane.k8s.informer import Cache
from gpuplane.k8s.worklist import Worklist
from gpuplane.model import labels as keys
from gpuplane.model.labels import PLACEMENT_ANNOTATION

NS = "team"


def pod(
    name: str, *, node: str = "", workload: str = "", group: str = "", gated: bool = False
) -> dict[str, Any]:
    labels = {}
    if workload:
        labels[keys.WORKLOAD_LABEL] = workload
    if group:
        labels[keys.POD_GROUP_LABEL] = group
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": keys.ADMISSION_GATE}]
    return {"metadata": {"name": name, "namespace": NS, "labels": labels}, "spec": spec}


def workload(
    name: str, *, uid: str = "", owner: str = "", admitted: bool = False, evicted: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "labels": {keys.JOB_UID_LABEL: uid} if uid else {}}
    if owner:
        meta["ownerReferences"] = [{"kind": "Job", "name": owner, "uid": uid}]
    status: dict[str, Any] = {}
    if admitted:
        status["admission"] = {"clusterQueue": "cq", "podSetAssignments": []}
    if evicted:
        status["conditions"] = [{"type": "Evicted", "status": "True", "reason": "Preempted"}]
    return {"metadata": meta, "spec": {}, "status": status}


def job(name: str, uid: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS, "uid": uid}, "spec": {"suspend": True}}


def caught_up(cache: Cache, work: Worklist) -> Worklist:
    work.note(cache.take_changes(), cache.get)
    return work


def swept(cache: Cache) -> Worklist:
    fresh = Worklist(("Job",))
    fresh.sweep(cache.items)
    return fresh


def test_the_pod_index_kept_from_changes_equals_a_full_sweep() -> None:
    cache = Cache()
    work = Worklist(("Job",))
    work.sweep(cache.items)
    cache.upsert("Pod", pod("a", workload="w1"))
    cache.upsert("Pod", pod("b", group="g", gated=True))
    cache.upsert("Pod", pod("c", node="n1", workload="w2"))
    caught_up(cache, work)
    cache.assume("Pod", pod("a", node="n2", workload="w1"))  # a binding assumed
    cache.remove("Pod", pod("c"))
    cache.upsert("Pod", pod("d", node="n1"))
    caught_up(cache, work)
    assert work.pods_by == swept(cache).pods_by
    assert work.pods_on == swept(cache).pods_on == {"n2": {f"{NS}/a"}, "n1": {f"{NS}/d"}}
    assert work.pod_keys("n1") == [f"{NS}/d"]


def test_evicted_workloads_holding_their_admission_are_tracked_until_they_give_it_back() -> None:
    cache = Cache()
    work = Worklist(("Job",))
    work.sweep(cache.items)
    cache.upsert("Workload", workload("w", admitted=True))
    caught_up(cache, work)
    assert work.evicted == set()
    cache.assume("Workload", workload("w", admitted=True, evicted=True))  # a preemption assumed
    caught_up(cache, work)
    assert work.evicted == {f"{NS}/w"}
    cache.upsert(
        "Workload",
        {**workload("w", evicted=True), "metadata": {**workload("w")["metadata"], "resourceVersion": "9"}},
    )
    caught_up(cache, work)
    assert work.evicted == set(), "its admission cleared: quota given back"


def test_a_changed_job_or_pod_makes_its_workload_a_candidate_again() -> None:
    cache = Cache()
    cache.upsert("Workload", workload("w", uid="u1", owner="j", admitted=True))
    cache.upsert("Workload", workload("p", uid="grp", admitted=True))
    cache.upsert("Workload", workload("other", uid="u9", admitted=True))
    cache.upsert("Job", job("j", "u1"))
    work = swept(cache)
    cache.take_changes()
    assert work.to_bind == {f"{NS}/w", f"{NS}/p", f"{NS}/other"}
    work.to_bind.clear()  # every one looked at and found settled
    cache.upsert("Job", job("j", "u1"))
    caught_up(cache, work)
    assert work.to_bind == {f"{NS}/w"}, "the job's owner reference and uid name its Workload"
    work.to_bind.clear()
    cache.upsert("Pod", pod("x", workload="w"))
    cache.upsert("Pod", pod("y", group="grp"))
    caught_up(cache, work)
    assert work.to_bind == {f"{NS}/w", f"{NS}/p"}, "the workload label, and a pod group's job-uid label"
    work.to_bind.clear()
    cache.remove("Pod", pod("x"))
    caught_up(cache, work)
    assert work.to_bind == {f"{NS}/w"}, "a removed pod names the Workload it was tied to"


def test_a_job_that_changed_stays_a_finishing_candidate_whatever_the_release_step_drops() -> None:
    # The release step drops settled Workloads from its own candidates; a job that completed in the
    # same pass must still be looked at by the finishing step (before, it shared that set and a
    # completion noted between the two steps was dropped for good).
    cache = Cache()
    cache.upsert("Workload", workload("w", uid="u1", owner="j", admitted=True))
    cache.upsert("Job", job("j", "u1"))
    work = swept(cache)
    cache.take_changes()
    assert work.to_finish == {f"{NS}/w"}, "every Workload after a sweep"
    work.to_finish.clear()
    work.to_bind.clear()
    cache.upsert("Job", job("j", "u1"))  # its status changed: Complete
    caught_up(cache, work)
    work.to_bind.discard(f"{NS}/w")  # released and bound: nothing to bind
    assert work.to_finish == {f"{NS}/w"}
    work.to_finish.clear()
    cache.upsert("Pod", pod("x", workload="w"))
    caught_up(cache, work)
    assert work.to_finish == {f"{NS}/w"}, "a pod of it changed: it may have ended"


def test_jobs_and_groups_become_candidates_for_a_workload_and_ownership_follows_the_workloads() -> None:
    cache = Cache()
    work = Worklist(("Job",))
    work.sweep(cache.items)
    cache.upsert("Job", job("j", "u1"))
    cache.upsert("Pod", pod("b", group="g", gated=True))
    caught_up(cache, work)
    assert work.to_create == {("Job", f"{NS}/j")}
    assert (NS, "g") in work.groups
    assert not work.owned("u1")
    cache.upsert("Workload", workload("w", uid="u1", owner="j"))
    caught_up(cache, work)
    assert work.owned("u1")
    assert not work.sweep_due
    cache.remove("Workload", workload("w"))
    caught_up(cache, work)
    assert not work.owned("u1")
    assert work.sweep_due, "a deleted Workload's job may need a new one: the next look sweeps"


def test_interrupted_nodes_placeholders_and_checkpoint_requests_follow_their_objects() -> None:
    cache = Cache()
    work = Worklist(("Job",))
    work.sweep(cache.items)
    cordoned = {"metadata": {"name": "n1"}, "spec": {"unschedulable": True}}
    cache.upsert("Node", cordoned)
    cache.upsert("Node", {"metadata": {"name": "n2"}, "spec": {}})
    warm = pod("warm-0", node="n2")
    warm["metadata"]["labels"][keys.WARM_BUFFER_LABEL] = "warm-0"
    cache.upsert("Pod", warm)
    asked = workload("w", admitted=True)
    asked["metadata"]["annotations"] = {keys.CHECKPOINT_REQUESTED_ANNOTATION: "2026-01-01T00:00:00Z"}
    cache.upsert("Workload", asked)
    caught_up(cache, work)
    assert work.signalled == {"n1": "cordoned"}
    assert work.placeholders == {f"{NS}/warm-0"}
    assert work.requested == {f"{NS}/w"}
    fresh = swept(cache)
    assert (fresh.signalled, fresh.placeholders, fresh.requested) == (
        work.signalled,
        work.placeholders,
        work.requested,
    )
    cache.upsert("Node", {"metadata": {"name": "n1"}, "spec": {}})  # uncordoned
    cache.remove("Pod", warm)
    cache.upsert("Workload", workload("w", admitted=True))  # the request cleared
    caught_up(cache, work)
    assert (work.signalled, work.placeholders, work.requested) == ({}, set(), set())


def test_the_plans_of_admitted_workloads_are_kept_by_node_until_evicted_or_finished() -> None:
    cache = Cache()
    work = Worklist(("Job",))
    work.sweep(cache.items)
    planned = workload("w", admitted=True)
    plan = '{"main": [["n1", "0,1"], ["n1", "2,3"], ["n2", "0"]]}'
    planned["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: plan}
    pending = workload("p")
    pending["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: plan}  # written before its admission
    cache.upsert("Workload", planned)
    cache.upsert("Workload", pending)
    caught_up(cache, work)
    assert work.plans_on("n1") == {f"{NS}/w": ["0,1", "2,3"]}
    assert work.plans_on("n2") == {f"{NS}/w": ["0"]}
    assert work.plans_on("n3") == {}
    assert swept(cache).plans_on("n1") == work.plans_on("n1")
    evicted = workload("w", admitted=True, evicted=True)
    evicted["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: plan}
    cache.upsert("Workload", evicted)
    caught_up(cache, work)
    assert work.plans_on("n1") == work.plans_on("n2") == {}, "an evicted workload's devices are let go"
    cache.upsert("Workload", planned)
    caught_up(cache, work)
    assert work.plans_on("n2") == {f"{NS}/w": ["0"]}
    cache.remove("Workload", planned)
    caught_up(cache, work)
    assert work.plans_on("n1") == work.plans_on("n2") == {}
