"""The controller end to end: jobs submitted with the real kubectl, admitted, released and bound.

Each test runs a controller replica (through the official client) and the reduced Job controller of
:mod:`controller_harness` against the ``apiserver`` fixture. With ``GPUPLANE_E2E_KUBECONFIG`` they run
unchanged against a real API server without kubelets (envtest); the checks that read the double's
request log are skipped there, the rest still run.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from apiserver.fixtures import Cluster, manifest
from apiserver.server import ApiServerDouble
from controller_harness import (
    JobController,
    Scene,
    bound_pods,
    device_clashes,
    devices_overlap,
    quota_violations,
    wait_until,
)
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.model.labels import ADMISSION_GATE as GATE
from gpuplane.model.labels import (
    DEVICES_ANNOTATION,
    PLACEMENT_ANNOTATION,
    PODSET_LABEL,
    SCHEDULER_NAME,
    WORKLOAD_LABEL,
)
from gpuplane.model.records import recorded_placement
from gpuplane.model.topology import assigned_domains
from manifests import GPU, Manifest, pod_spec

pytestmark = pytest.mark.timeout(60)


def double_of(cluster: Cluster) -> ApiServerDouble | None:
    """The double behind ``cluster``, or None against a real API server (no request log there)."""
    return cluster if isinstance(cluster, ApiServerDouble) else None


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), None)


# --- (a) admission, release and binding to the planned nodes and devices --------------------------


JOBS = [  # name, pods, GPUs per pod: 16 GPUs on two 8-GPU nodes, all of them used
    ("pair", 2, 3),
    ("whole", 1, 8),
    ("small", 2, 1),
]


def test_jobs_are_admitted_released_and_bound_to_planned_nodes_and_devices(
    scene: Scene, apiserver: Cluster
) -> None:
    cq = scene.setup(nodes=2)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(*(scene.job(name, pods=pods, gpus=gpus) for name, pods, gpus in JOBS))

    wait_until(
        lambda: all(scene.bound(name, pods) for name, pods, _ in JOBS),
        20,
        "every pod of every job bound",
    )
    workloads, jobs, pods = scene.workloads(), scene.jobs(), scene.pods()
    assert sorted(workloads) == sorted(name for name, _, _ in JOBS), "one Workload per job"
    for name, count, gpus in JOBS:
        wl = workloads[name]
        status = wl["status"]
        assert status["admission"]["clusterQueue"] == cq
        assert {c["type"] for c in status["conditions"] if c["status"] == "True"} >= {
            "QuotaReserved",
            "Admitted",
        }
        (assignment,) = status["admission"]["podSetAssignments"]
        assert (assignment["count"], assignment["flavors"][GPU]) == (count, scene.flavor)
        assert assignment["resourceUsage"][GPU] == str(count * gpus)
        planned = Counter({v[-1]: c for v, c in assigned_domains(assignment["topologyAssignment"])})

        job = jobs[name]
        assert job["spec"]["suspend"] is False, "released"
        template = job["spec"]["template"]
        assert template["metadata"]["labels"][WORKLOAD_LABEL] == wl["metadata"]["name"]
        assert template["metadata"]["labels"][PODSET_LABEL] == "main"
        assert template["spec"]["nodeSelector"]["gpuplane.dev/e2e-pool"] == scene.prefix

        mine = [p for p in pods if p["metadata"]["labels"]["job-name"] == name]
        assert Counter(p["spec"]["nodeName"] for p in mine) == planned, "bound where the admission planned"
        for pod in mine:
            assert pod["spec"]["schedulerName"] == SCHEDULER_NAME
            devices = pod["metadata"]["annotations"][DEVICES_ANNOTATION].split(",")
            assert len(devices) == gpus
            assert set(devices) <= {str(i) for i in range(8)}
    assert devices_overlap(pods) == [], "no device given to two pods"

    double = double_of(apiserver)
    if double is not None:
        binds = double.requests.bindings()
        assert sorted(binds) == sorted((scene.namespace, n, node) for n, node in bound_pods(pods).items())
        assert len(binds) == len(set(binds)), "each pod bound once"
    else:
        # The controller's cache keeps no managedFields and writes the Jobs back without them:
        # the server keeps whose fields were whose, the submitter's beside the controller's.
        for name, _, _ in JOBS:
            managers = {m["manager"] for m in jobs[name]["metadata"].get("managedFields") or []}
            assert any(m.startswith("kubectl") for m in managers), f"{name}: field managers: {managers}"
            assert "gpuplane-controller" in managers, f"{name}: field managers: {managers}"


def test_a_job_that_does_not_fit_now_is_admitted_when_capacity_frees(scene: Scene) -> None:
    scene.setup(nodes=1)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("first", gpus=8))
    wait_until(lambda: scene.bound("first", 1), 20, "first bound")
    scene.submit(scene.job("second", gpus=8))
    wait_until(
        lambda: condition(scene.workloads().get("second") or {}, "QuotaReserved"), 20, "second pending"
    )
    assert not scene.pods("second")

    scene.delete_job("first")
    wait_until(lambda: scene.bound("second", 1), 20, "second bound once first is gone")


def test_a_pass_looks_only_at_what_may_need_work(scene: Scene) -> None:
    """Once its job is released and its pods bound, an admitted Workload leaves the controller's
    worklist, as does a job once it has its Workload; a job that arrives later is still created a
    Workload, admitted, released and bound."""
    scene.setup(nodes=1)
    scene.job_controller()
    run = scene.controller(leader_election=False)
    scene.submit(*(scene.job(f"j{i}", gpus=1) for i in range(3)))
    wait_until(lambda: all(scene.bound(f"j{i}", 1) for i in range(3)), 20, "all bound")
    work = run.controller.work

    def ours_left() -> bool:
        try:  # the controller's thread changes these sets meanwhile: look again on a clash
            keys = list(work.to_bind) + [key for _, key in list(work.to_create)]
        except RuntimeError:
            return True
        return any(key.startswith(f"{scene.namespace}/") for key in keys)

    wait_until(lambda: not ours_left(), 20, "the scene's objects leave the worklist")
    scene.submit(scene.job("late", gpus=1))
    wait_until(lambda: scene.bound("late", 1), 20, "late bound")
    wait_until(lambda: not ours_left(), 20, "the late job's objects leave the worklist")


def test_devices_already_recorded_are_never_given_again(scene: Scene) -> None:
    """A pod keeps the devices recorded on it; a newcomer gets the ones that are really free."""
    scene.setup(nodes=1)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("first", gpus=4))
    wait_until(lambda: scene.bound("first", 1), 20, "first bound")
    scene.submit(scene.job("second", gpus=4))
    wait_until(lambda: scene.bound("second", 1), 20, "second bound")
    assert devices_overlap(scene.pods()) == [], "second was given devices that first holds"
    held = job_devices(scene.pods())
    # Which half of the node the first job gets is not what this test is about (on a real control
    # plane it has been either); what matters is that the two halves are disjoint and that the
    # third job gets exactly what the first gave back.
    assert sorted(held) == ["first", "second"]
    assert sorted(held["first"].split(",") + held["second"].split(","), key=int) == [str(d) for d in range(8)]
    scene.delete_job("first")
    scene.submit(scene.job("third", gpus=4))
    wait_until(lambda: scene.bound("third", 1), 20, "third bound in first's place")
    pods = scene.pods()
    assert devices_overlap(pods) == []
    assert job_devices(pods) == {"second": held["second"], "third": held["first"]}


def job_devices(pods: list[dict[str, Any]]) -> dict[str, str]:
    """The devices recorded on each job's pod, by job name (one pod per job; "": none recorded)."""
    return {
        p["metadata"]["labels"]["job-name"]: (p["metadata"].get("annotations") or {}).get(
            DEVICES_ANNOTATION, ""
        )
        for p in pods
    }


def test_devices_planned_for_a_pod_not_bound_yet_are_never_given_to_another(
    scene: Scene, double: ApiServerDouble
) -> None:
    """A plan holds its devices from the moment it is made. Here "second"'s planned devices are
    taken by a pod bound by someone else before its pod arrives, so its pod is fitted again at bind
    time; the devices of "first"'s plan, whose pod does not exist yet, are not free for that fit."""
    del double  # the reduced Job controller of the double holds one job's pods back
    scene.setup(nodes=1)
    jobs = scene.job_controller()
    assert isinstance(jobs, JobController)
    jobs.held |= {"first", "second"}  # admitted and released, but their pods come later
    run = scene.controller(leader_election=False)
    scene.submit(scene.job("first", gpus=4))
    wait_until(lambda: scene.admitted("first"), 20, "first admitted")
    scene.submit(scene.job("second", gpus=4))
    wait_until(lambda: scene.admitted("second"), 20, "second admitted")
    node = f"{scene.prefix}-n0"
    plans = {
        name: recorded_placement(wl["metadata"]["annotations"][PLACEMENT_ANNOTATION])
        for name, wl in scene.workloads().items()
    }
    assert plans == {"first": {"main": [(node, "0,1,2,3")]}, "second": {"main": [(node, "4,5,6,7")]}}

    # Someone else binds a pod to second's planned devices.
    other = (
        Manifest("v1", "Pod", "other", scene.namespace)
        .annotate(DEVICES_ANNOTATION, "4,5,6,7")
        .set("spec", pod_spec().container(limits={GPU: 4}, cpu="100m", gpu=4).to_dict())
        .set("spec.nodeName", node)
        .to_dict()
    )
    scene.api.create(k8s.PODS, other, scene.namespace)
    wait_until(lambda: run.controller.cache.get("Pod", f"{scene.namespace}/other") is not None, 20, "seen")
    waits = run.controller.counters.extra.get("device_waits", 0)
    jobs.held.discard("second")
    wait_until(
        lambda: run.controller.counters.extra.get("device_waits", 0) > waits or scene.bound("second", 1),
        20,
        "second's pod waits for devices, or is bound",
    )
    taken = job_devices(scene.pods("second"))
    assert not scene.bound("second", 1), f"second took devices of first's plan: {taken}"

    jobs.held.discard("first")
    wait_until(lambda: scene.bound("first", 1), 20, "first bound")
    assert job_devices(scene.pods("first")) == {"first": "0,1,2,3"}, "first keeps its planned devices"
    scene.api.delete(k8s.PODS, "other", scene.namespace, gracePeriodSeconds=0)
    wait_until(lambda: scene.bound("second", 1), 20, "second bound once the devices are free")
    pods = scene.pods()
    assert devices_overlap(pods) == []
    assert job_devices(pods) == {"first": "0,1,2,3", "second": "4,5,6,7"}


def test_the_devices_of_a_pod_that_ended_are_free_at_bind_time(scene: Scene) -> None:
    """A pod that ended holds no devices: once its Workload is finished, the next plan's devices
    are bound though the ended pod is still there (nothing deletes it)."""
    scene.setup(nodes=1)
    scene.job_controller()
    run = scene.controller(leader_election=False)
    scene.submit(scene.job("first", gpus=8))
    wait_until(lambda: scene.bound("first", 1), 20, "first bound")
    (pod,) = scene.pods("first")
    pod["status"] = {**(pod.get("status") or {}), "phase": "Succeeded"}
    scene.api.replace(k8s.PODS, pod, sub="status")
    wl = scene.workloads()["first"]  # finished, as Kueue marks it once its job completes
    finished = {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "done"}
    finished["lastTransitionTime"] = "2026-01-01T00:00:00Z"
    wl["status"]["conditions"] = [*wl["status"].get("conditions", []), finished]
    scene.api.replace(k8s.WORKLOADS, wl, sub="status")
    scene.submit(scene.job("second", gpus=8))
    wait_until(lambda: scene.bound("second", 1), 20, "second bound beside the ended pod")
    assert job_devices(scene.pods()) == {"first": "0,1,2,3,4,5,6,7", "second": "0,1,2,3,4,5,6,7"}
    assert run.controller.counters.extra.get("replanned_devices", 0) == 0


# --- (b) preemption ----------------------------------------------------------------------------------


def preemption_scene(scene: Scene, *, dry_run: bool) -> set[str]:
    """A low-priority job holding the only node, then a high-priority one that needs it; returns the
    names of the victim's pods."""
    scene.setup(nodes=1, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = scene.priority_class("low", 10), scene.priority_class("high", 1000)
    scene.job_controller()
    scene.controller(leader_election=False, dry_run=dry_run)
    scene.submit(scene.job("victim", pods=2, gpus=4, priority_class=low))
    wait_until(lambda: scene.bound("victim", 2), 20, "victim bound")
    victim_pods = {p["metadata"]["name"] for p in scene.pods("victim")}
    scene.submit(scene.job("urgent", pods=1, gpus=8, priority_class=high))
    return victim_pods


def test_preemption_evicts_the_victim_suspends_its_job_and_requeues_it(
    scene: Scene, apiserver: Cluster
) -> None:
    victim_pods = preemption_scene(scene, dry_run=False)

    wait_until(lambda: scene.bound("urgent", 1), 20, "urgent admitted and bound")
    workloads = scene.workloads()
    victim = workloads["victim"]
    assert not victim["status"].get("admission"), "admission cleared"
    evicted, preempted = condition(victim, "Evicted") or {}, condition(victim, "Preempted") or {}
    assert (evicted.get("status"), evicted.get("reason")) == ("True", "Preempted")
    assert (preempted.get("status"), preempted.get("reason")) == ("True", "InClusterQueue")
    assert scene.jobs()["victim"]["spec"]["suspend"] is True, "victim's job suspended again"
    assert not {p["metadata"]["name"] for p in scene.pods("victim")} & victim_pods, "victim's pods gone"
    wait_until(
        lambda: (
            (condition(scene.workloads()["victim"], "QuotaReserved") or {}).get("reason")
            not in (None, "Preempted")
        ),
        20,
        "victim requeued: pending with the core's reason",
    )
    assert len(scene.workloads()) == 2, "the victim keeps its one Workload"

    double = double_of(apiserver)
    if double is not None:
        # The job is suspended before its pods are evicted, so its controller starts no replacement
        # pods for the controller to evict again; the job controller's own deletions may beat some
        # evictions (a 404, ignored), so only the original pods are ever evicted.
        evictions = double.requests.find(verb="create", resource="pods", subresource="eviction")
        evicted = {e.request.name for e in evictions if e.status == 201}
        assert evicted <= victim_pods
        created = {
            (e.request.body or {}).get("metadata", {}).get("name")
            for e in double.requests.find(verb="create", resource="pods", status=201)
            if not e.request.subresource
        }
        assert {n for n in created if n and n.startswith("victim-")} == victim_pods, "no replacements"
        assert all(e.request.body["deleteOptions"]["gracePeriodSeconds"] == 0 for e in evictions)


def test_the_job_controller_starts_no_pod_for_a_job_stopped_between_its_lists(
    scene: Scene, double: ApiServerDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The double's reduced Job controller reads pods before Jobs: a Job suspended and emptied
    between its two lists, as the controller stops a preempted job, gets no replacement pods (read
    the other way round, the Job still looked running and its pods already gone)."""
    scene.setup(nodes=1)
    scene.submit(scene.job("stopped", pods=2))
    job = scene.jobs()["stopped"]
    scene.api.replace(k8s.JOBS, {**job, "spec": {**job["spec"], "suspend": False}})
    api = KubeApi(load_api_client(scene.kubeconfig), qps=None)
    jobs = JobController(api, scene.namespace)
    try:
        jobs.sync()
        started = {p["metadata"]["name"] for p in scene.pods("stopped")}
        assert len(started) == 2
        lists = 0
        listed = api.list

        def list_then_stop(res: k8s.Resource, namespace: str | None = None) -> dict[str, Any]:
            nonlocal lists
            answer = listed(res, namespace)
            lists += 1
            if lists == 1:  # between the pass's two lists: the job suspended, then its pods evicted
                running = scene.jobs()["stopped"]
                scene.api.replace(k8s.JOBS, {**running, "spec": {**running["spec"], "suspend": True}})
                for name in started:
                    scene.api.delete(k8s.PODS, name, scene.namespace, gracePeriodSeconds=0)
            return answer

        monkeypatch.setattr(api, "list", list_then_stop)
        jobs.sync()
        assert lists == 2
        assert scene.pods("stopped") == [], "no replacement for a suspended job's evicted pods"
        assert not double.requests.find(verb="create", resource="pods", status=201)[2:]
    finally:
        api.api_client.close()  # type: ignore[no-untyped-call]


def test_preemption_waits_for_the_victims_pods_to_terminate(scene: Scene, double: ApiServerDouble) -> None:
    """One victim is enough: while its pods terminate, no second workload is preempted for the room
    they still hold, and the preemptor is admitted once they are gone."""
    scene.setup(nodes=1, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = scene.priority_class("low", 10), scene.priority_class("high", 1000)
    scene.job_controller()
    run = scene.controller(leader_election=False, dry_run=False)
    scene.submit(*(scene.job(name, gpus=4, priority_class=low, grace=30) for name in ("older", "newer")))
    wait_until(lambda: scene.bound("older", 1) and scene.bound("newer", 1), 20, "both bound")
    scene.submit(scene.job("urgent", gpus=4, priority_class=high))

    def evicted() -> set[str]:
        return {
            e.request.name.rsplit("-", 1)[0] for e in double.requests.find(subresource="eviction", status=201)
        }

    wait_until(evicted, 20, "an eviction")
    run.wait_passes(10)
    assert len(evicted()) == 1, f"evicted {sorted(evicted())} for one 4-GPU job"
    assert not scene.pods("urgent")

    double.advance(30)  # the victim's pods are gone once their grace period ends
    wait_until(lambda: scene.bound("urgent", 1), 20, "urgent bound in the victim's place")
    run.wait_passes(5)
    assert len(evicted()) == 1
    assert devices_overlap(scene.pods()) == []


def test_dry_run_preemption_only_records_would_preempt(scene: Scene, apiserver: Cluster) -> None:
    preemption_scene(scene, dry_run=True)
    wait_until(lambda: scene.events("WouldPreempt"), 20, "a WouldPreempt event")
    event = scene.events("WouldPreempt")[0]
    victim = scene.workloads()["victim"]
    assert event["involvedObject"]["name"] == victim["metadata"]["name"]
    assert event["type"] == "Warning"
    assert "urgent" in event["message"]

    assert victim["status"]["admission"], "the victim keeps its admission"
    assert scene.bound("victim", 2), "and its pods"
    assert scene.jobs()["victim"]["spec"]["suspend"] is False
    assert not scene.admitted("urgent")
    assert not scene.pods("urgent")
    double = double_of(apiserver)
    if double is not None:
        assert double.requests.find(subresource="eviction") == []


# --- (c) gangs ------------------------------------------------------------------------------------


def test_a_gang_is_bound_only_once_all_its_pods_exist(scene: Scene, apiserver: Cluster) -> None:
    scene.setup(nodes=2)
    jc = scene.job_controller()
    jc.pod_limit = 3  # the Job controller is slow: the fourth pod comes later
    run = scene.controller(leader_election=False)
    scene.submit(scene.job("gang", pods=4, gpus=4))

    wait_until(lambda: len(scene.pods("gang")) == 3, 20, "three of four pods created")
    run.wait_passes(5)
    assert bound_pods(scene.pods("gang")) == {}, "no pod of an incomplete gang is bound"

    jc.pod_limit = None
    wait_until(lambda: scene.bound("gang", 4), 20, "the whole gang bound")
    double = double_of(apiserver)
    if double is not None:
        log = list(double.requests)
        created = [
            i
            for i, e in enumerate(log)
            if e.request.verb == "create"
            and e.request.resource == "pods"
            and not e.request.subresource
            and e.request.name.startswith("gang-")
        ]
        bound = [i for i, e in enumerate(log) if e.request.subresource == "binding" and e.status == 201]
        assert (len(created), len(bound)) == (4, 4)
        assert max(created) < min(bound), "the first binding comes after the last pod"


def test_a_gang_that_does_not_fit_has_no_pod_bound(scene: Scene, apiserver: Cluster) -> None:
    scene.setup(nodes=2, quota_gpus=64)  # quota for it, but no two nodes hold three 8-GPU pods
    scene.job_controller()
    scene.controller(leader_election=False)
    group = [
        scene.admit(
            Manifest("v1", "Pod", f"group-{i}", scene.namespace)
            .label("kueue.x-k8s.io/queue-name", "queue")
            .label("kueue.x-k8s.io/pod-group-name", "group")
            .annotate("kueue.x-k8s.io/pod-group-total-count", "3")
            .set("spec", pod_spec().container(limits={GPU: 8}, cpu="100m", gpu=8).to_dict())
            .set("spec.restartPolicy", "Never")
            .to_dict()
        )
        for i in range(3)
    ]
    scene.kubectl("apply", "-f", "-", input=manifest(*group))
    scene.submit(scene.job("too-big", pods=3, gpus=8), scene.job("fits", pods=1, gpus=2))

    wait_until(lambda: scene.bound("fits", 1), 20, "the job that fits is bound")
    wait_until(
        lambda: (
            all(
                condition(wl, "QuotaReserved") and not wl["status"].get("admission")
                for name, wl in scene.workloads().items()
                if name != "fits"
            )
            and len(scene.workloads()) == 3
        ),
        20,
        "both gangs pending",
    )
    pods = scene.pods()
    assert set(bound_pods(pods)) == {p["metadata"]["name"] for p in scene.pods("fits")}
    gated = [p for p in pods if p["metadata"]["name"].startswith("group-")]
    assert len(gated) == 3
    assert all(GATE in {g["name"] for g in p["spec"].get("schedulingGates") or []} for p in gated)
    assert scene.pods("too-big") == [], "a pending job stays suspended: no pods"
    double = double_of(apiserver)
    if double is not None:
        assert {pod for _, pod, _ in double.requests.bindings()} == {
            p["metadata"]["name"] for p in scene.pods("fits")
        }


# --- (d) pending workloads carry the core's reason ----------------------------------------------


@pytest.mark.parametrize(
    ("quota_gpus", "pods", "gpus"),
    [
        pytest.param(8, 2, 8, id="over-quota"),
        pytest.param(64, 1, 16, id="no-node-holds-a-pod"),
    ],
)
def test_pending_workloads_get_quota_reserved_false_with_the_cores_reason(
    scene: Scene, quota_gpus: int, pods: int, gpus: int
) -> None:
    scene.setup(nodes=2, quota_gpus=quota_gpus)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("waits", pods=pods, gpus=gpus), scene.job("runs", pods=1, gpus=4))
    wait_until(lambda: scene.bound("runs", 1), 20, "the job that fits is bound")

    def matches_core() -> bool:
        wl = scene.workloads()["waits"]
        got = condition(wl, "QuotaReserved")
        plan = scene.core_plan()
        want = next(p for p in plan.pending if p.workload.endswith(wl["metadata"]["name"]))
        return bool(got) and (got["status"], got["reason"], got["message"]) == (
            "False",
            want.reason,
            want.message or want.reason,
        )

    wait_until(matches_core, 20, "QuotaReserved=False with the core's reason and message")
    assert scene.pods("waits") == []


def test_a_requeued_victim_shows_again_why_it_waits(scene: Scene) -> None:
    """Pending, admitted, preempted, pending again for the same reason: the condition says so."""
    scene.setup(nodes=1, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = scene.priority_class("low", 10), scene.priority_class("high", 1000)
    scene.job_controller()
    scene.controller(leader_election=False, dry_run=False)
    scene.submit(scene.job("holder", gpus=8, priority_class=low))
    wait_until(lambda: scene.bound("holder", 1), 20, "holder bound")
    scene.submit(scene.job("victim", gpus=8, priority_class=low))
    wait_until(
        lambda: condition(scene.workloads().get("victim") or {}, "QuotaReserved"), 20, "victim pending"
    )
    waiting = condition(scene.workloads()["victim"], "QuotaReserved")

    scene.delete_job("holder")
    wait_until(lambda: scene.bound("victim", 1), 20, "victim admitted once holder is gone")
    scene.submit(scene.job("urgent", gpus=8, priority_class=high))
    wait_until(lambda: scene.bound("urgent", 1), 20, "urgent admitted in the victim's place")

    def waits_again() -> bool:
        got = condition(scene.workloads()["victim"], "QuotaReserved") or {}
        return (got.get("status"), got.get("reason")) == ("False", waiting and waiting["reason"])

    wait_until(waits_again, 20, "the victim's condition gives the reason it waits, not 'Preempted'")


def test_quota_is_never_exceeded(scene: Scene) -> None:
    cq = scene.setup(nodes=2, quota_gpus=10)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(*(scene.job(f"j{i}", gpus=3) for i in range(6)))
    wait_until(lambda: sum(scene.admitted(f"j{i}") for i in range(6)) == 3, 20, "three of six admitted")
    queues = [q for q in scene.list(k8s.CLUSTER_QUEUES) if q["metadata"]["name"] == cq]
    assert quota_violations(scene.list(k8s.WORKLOADS), queues) == []
    assert scene.core_plan().admitted == (), "nothing left that the core would admit"


# --- (e) fractional and MIG devices survive a controller restart -------------------------------------


MIG = "nvidia.com/mig-3g.40gb"
FRACTION = "gpuplane.dev/gpu-fraction"


def test_fractional_and_mig_devices_are_read_back_after_a_restart_and_never_given_twice(
    scene: Scene,
) -> None:
    """Devices recorded on bound pods, in an order a fresh first fit would not choose, are what a
    restarted controller counts: the newcomers get what is really free."""
    scene.setup(nodes=1, gpus_per_node=2, quota={MIG: 2, FRACTION: 2})
    scene.add_nodes(1, gpus=0, devices={MIG: 2})
    scene.job_controller()
    first = scene.controller(leader_election=False)

    def submit(name: str, **options: Any) -> None:
        scene.submit(scene.job(name, **options))
        wait_until(lambda: scene.bound(name, 1), 20, f"{name} bound")

    submit("half", gpus=0, annotations={FRACTION: "0.5"})  # GPU 0: 500m
    submit("most", gpus=0, annotations={FRACTION: "0.75"})  # does not fit GPU 0 any more: GPU 1
    submit("mig-first", gpus=0, devices={MIG: 1})  # instance at slot 0
    submit("mig-second", gpus=0, devices={MIG: 1})  # instance at slot 4
    for name in ("half", "mig-first"):  # free GPU 0 and the instance at slot 0
        scene.delete_job(name)
    first.stop()

    scene.controller(leader_election=False, identity="gpuplane-1")
    submit("quarter", gpus=0, annotations={FRACTION: "0.5"})
    submit("mig-third", gpus=0, devices={MIG: 1})

    pods = scene.pods()
    recorded = {
        p["metadata"]["labels"]["job-name"]: (p["metadata"].get("annotations") or {}).get(
            DEVICES_ANNOTATION, ""
        )
        for p in pods
    }
    assert device_clashes(pods) == [], recorded
    most_gpu = recorded["most"].split(":")[0]
    assert recorded["quarter"].split(":")[0] != most_gpu, "the GPU that holds 750m cannot take 500m more"
    assert recorded["mig-third"] != recorded["mig-second"], "the instance in use is not handed out again"


# --- (f) the plan's devices are the devices bound ----------------------------------------------------


def planned_devices(wl: dict[str, Any]) -> list[tuple[str, str]]:
    """The ``(node, devices)`` of every pod of the Workload's recorded plan, sorted."""
    plan = recorded_placement((wl["metadata"].get("annotations") or {}).get(PLACEMENT_ANNOTATION))
    assert plan is not None, f"no plan recorded on Workload {wl['metadata']['name']}"
    return sorted(slot for slots in plan.values() for slot in slots)


def bound_devices(pods: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((p["spec"]["nodeName"], p["metadata"]["annotations"][DEVICES_ANNOTATION]) for p in pods)


def test_the_devices_bound_are_the_devices_the_plan_chose_also_after_a_restart(scene: Scene) -> None:
    """Admission records every pod's node and devices on the Workload; the controller binds exactly
    those, also when a restarted replica binds what the one before it admitted."""
    placed = {"pair": 2, "half": 1, "third": 1, "one": 1}
    scene.setup(nodes=2, gpus_per_node=4, quota={FRACTION: 1})
    first = scene.controller(leader_election=False)
    scene.submit(
        scene.job("pair", pods=2, gpus=3),
        scene.job("half", gpus=0, annotations={FRACTION: "0.5"}),
        scene.job("third", gpus=0, annotations={FRACTION: "0.3"}),
    )
    wait_until(lambda: all(scene.admitted(n) for n in ("pair", "half", "third")), 20, "all admitted")
    plans = {name: planned_devices(wl) for name, wl in scene.workloads().items()}
    first.stop()  # no pod existed yet on the double (no job controller ran): nothing was bound

    scene.job_controller()
    scene.controller(leader_election=False, identity="gpuplane-1")
    scene.submit(scene.job("one", gpus=1))  # admitted and bound by the new replica alone
    wait_until(lambda: all(scene.bound(n, c) for n, c in placed.items()), 20, "every pod bound")
    plans["one"] = planned_devices(scene.workloads()["one"])
    for name in placed:
        assert bound_devices(scene.pods(name)) == plans[name], name
    assert device_clashes(scene.pods()) == []
