"""The pure half of a controller pass: observed state + plan -> writes, without any API server."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

from gpuplane.core.plan import PodPlacement, PodSetDecision
from gpuplane.core.session import AdmissionDecision, DeviceConfig, PendingDecision, Plan, PreemptionDecision
from gpuplane.k8s.bind_writes import (
    GangPlan,
    NodeView,
    binding_writes,
    fit_devices,
    gang_plan,
    release_writes,
    waiting,
    workload_create_writes,
)
from gpuplane.k8s.plan_writes import (
    Verb,
    admission_writes,
    eviction_writes,
    pending_writes,
    preemption_writes,
)
from gpuplane.model import labels as keys
from gpuplane.model.karpenter import DO_NOT_DISRUPT
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from gpuplane.model.topology import assigned_domains, topology_assignment
from manifests import Manifest, job, node, pod_spec, resource_flavor, workload

NOW = "2026-01-01T00:00:05.000000Z"
NS = "team"


def _observed(*names: str, gpu: int = 2) -> dict[str, dict[str, Any]]:
    out = {}
    for name in names:
        body = workload(name, NS).queue("lq").podset(count=2, cpu="1", gpu=gpu).to_dict()
        body["metadata"]["resourceVersion"] = "7"
        out[f"{NS}/{name}"] = body
    return out


def _admission(name: str, checks: tuple[str, ...] = ()) -> AdmissionDecision:
    placement = (PodPlacement("node-a", ("0", "1")), PodPlacement("node-b", ("4", "5")))
    pod_set = PodSetDecision("main", 2, {"cpu": "h100", "nvidia.com/gpu": "h100"}, placement)
    return AdmissionDecision(f"{NS}/{name}", "cq", (pod_set,), checks=checks)


def _conditions(body: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in body["status"]["conditions"]}


def test_an_admission_becomes_the_admitted_workload_with_its_planned_devices() -> None:
    observed = _observed("a")
    before = copy.deepcopy(observed)
    (write,) = admission_writes(observed.get, Plan(admitted=(_admission("a"),)), NOW)
    assert observed == before, "the observed state is only read"
    assert (write.verb, write.workload, write.recorded) == (Verb.ADMIT, f"{NS}/a", None)
    admission = write.body["status"]["admission"]
    assert admission["clusterQueue"] == "cq"
    (assignment,) = admission["podSetAssignments"]
    assert assignment["count"] == 2
    assert assignment["resourceUsage"] == {"cpu": "2", "nvidia.com/gpu": "4"}
    hosts = assigned_domains(assignment["topologyAssignment"])
    assert sorted((values[-1], count) for values, count in hosts) == [("node-a", 1), ("node-b", 1)]
    planned = json.loads(write.body["metadata"]["annotations"][PLACEMENT_ANNOTATION])
    assert planned == {"main": [["node-a", "0,1"], ["node-b", "4,5"]]}
    assert _conditions(write.body) == {
        "QuotaReserved": ("True", "QuotaReserved"),
        "Admitted": ("True", "Admitted"),
    }
    assert write.body["metadata"]["resourceVersion"] == "7", "a stale view fails on the server (409)"


def test_a_reservation_with_checks_has_no_placement_and_no_admitted_condition() -> None:
    observed = _observed("a")
    (write,) = admission_writes(observed.get, Plan(admitted=(_admission("a", checks=("prov",)),)), NOW)
    assert PLACEMENT_ANNOTATION not in write.body["metadata"].get("annotations", {})
    assert "topologyAssignment" not in write.body["status"]["admission"]["podSetAssignments"][0]
    assert _conditions(write.body) == {"QuotaReserved": ("True", "QuotaReserved")}
    assert [c["name"] for c in write.body["status"]["admissionChecks"]] == ["prov"]


def test_admissions_of_workloads_gone_or_already_reserved_are_not_written() -> None:
    observed = _observed("held")
    held = _admission("held", checks=("prov",))
    (reserved,) = admission_writes(observed.get, Plan(admitted=(held,)), NOW)
    observed[f"{NS}/held"] = reserved.body  # reserved, its check still Pending
    assert admission_writes(observed.get, Plan(admitted=(_admission("gone"), held)), NOW) == []


def test_preemption_marks_victims_or_only_reports_them_in_a_dry_run() -> None:
    observed = _observed("victim", "evicted")
    plan = Plan(
        preempted=(
            PreemptionDecision(f"{NS}/victim", "cq", f"{NS}/urgent", "InClusterQueue"),
            PreemptionDecision(f"{NS}/evicted", "cq", f"{NS}/urgent", "InClusterQueue"),
            PreemptionDecision(f"{NS}/gone", "cq", f"{NS}/urgent", "InClusterQueue"),
        )
    )
    observed[f"{NS}/evicted"]["status"] = {
        "conditions": [{"type": "Evicted", "status": "True", "reason": "Preempted"}]
    }
    (write,) = preemption_writes(observed.get, plan, NOW, dry_run=False)
    assert (write.verb, write.workload) == (Verb.EVICT, f"{NS}/victim")
    assert _conditions(write.body) == {
        "Evicted": ("True", "Preempted"),
        "Preempted": ("True", "InClusterQueue"),
    }
    assert write.message == f"Preempted to accommodate {NS}/urgent (InClusterQueue)"
    (dry,) = preemption_writes(observed.get, plan, NOW, dry_run=True)
    assert (dry.verb, dry.body, dry.message) == (
        Verb.WOULD_PREEMPT,
        observed[f"{NS}/victim"],
        f"dry run: {write.message}",
    )


def test_evicted_workloads_are_stopped_while_active_then_requeued() -> None:
    observed = _observed("running", "stopped", "admitted", "queued")
    evicted = [{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "for urgent"}]
    for name in ("running", "stopped", "admitted"):
        observed[f"{NS}/{name}"]["status"] = {
            "admission": {"clusterQueue": "cq", "podSetAssignments": []},
            "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}]
            + (evicted if name != "admitted" else []),
        }
    observed[f"{NS}/queued"]["status"] = {"conditions": evicted}  # its quota already given back
    keys = sorted([*observed, f"{NS}/gone"])

    def active(wl: dict[str, Any]) -> bool:
        return bool(wl["metadata"]["name"] == "running")

    writes = eviction_writes(observed.get, keys, active, NOW)
    assert [(w.verb, w.workload) for w in writes] == [
        (Verb.STOP, f"{NS}/running"),
        (Verb.REQUEUE, f"{NS}/stopped"),
    ]
    stop, requeue = writes
    assert stop.body == observed[f"{NS}/running"], "a stop writes the job and pods, not the Workload"
    assert "admission" not in requeue.body["status"]
    assert _conditions(requeue.body) == {
        "QuotaReserved": ("False", "Preempted"),
        "Admitted": ("False", "Preempted"),
        "Evicted": ("True", "Preempted"),
    }
    assert "admission" in observed[f"{NS}/stopped"]["status"], "the observed object is left alone"
    only_requeues = eviction_writes(observed.get, keys, active, NOW, stop_jobs=False)
    assert [(w.verb, w.workload) for w in only_requeues] == [(Verb.REQUEUE, f"{NS}/stopped")]


def test_pending_workloads_get_the_cores_reason_once() -> None:
    observed = _observed("waits", "shown", "noted", "admitted")
    decisions = tuple(
        PendingDecision(f"{NS}/{name}", "cq", f"{NS}/lq", i, i, "InsufficientQuota", "no room")
        for i, name in enumerate(("waits", "shown", "noted", "admitted", "gone"), start=1)
    )
    shown = {"type": "QuotaReserved", "status": "False", "reason": "InsufficientQuota", "message": "no room"}
    observed[f"{NS}/shown"]["status"] = {"conditions": [shown]}
    observed[f"{NS}/admitted"]["status"] = {"admission": {"clusterQueue": "cq", "podSetAssignments": []}}
    written = {f"{NS}/noted": ("InsufficientQuota", "no room")}
    (write,) = pending_writes(observed.get, Plan(pending=decisions), NOW, written)
    assert (write.verb, write.workload, write.pending) == (Verb.PENDING, f"{NS}/waits", decisions[0])
    (cond,) = write.body["status"]["conditions"]
    assert (cond["type"], cond["status"], cond["reason"], cond["message"]) == (
        "QuotaReserved",
        "False",
        "InsufficientQuota",
        "no room",
    )


# --- after the plan: Workloads, releases, bindings (k8s/bind_writes.py) ---------------------------

GPU = "nvidia.com/gpu"


def _job(name: str, *, suspended: bool = True, uid: str = "") -> dict[str, Any]:
    body = job(name, NS).queue("lq").parallelism(2).completions(2).set("spec.suspend", suspended)
    return body.set("metadata.uid", uid or f"uid-{name}").to_dict()


def manifest_pod(name: str, ns: str) -> Manifest:
    return Manifest("v1", "Pod", name, ns).set("spec", pod_spec().container(cpu="1").to_dict())


def _gated_pod(name: str, group: str | None = None, *, gate: bool = True) -> dict[str, Any]:
    body = manifest_pod(name, NS).label(keys.QUEUE_NAME_LABEL, "lq")
    if group:
        body = body.label(keys.POD_GROUP_LABEL, group).annotate(keys.POD_GROUP_COUNT, "2")
    if gate:
        body = body.set("spec.schedulingGates", [{"name": keys.ADMISSION_GATE}])
    return body.to_dict()


def test_queued_jobs_and_gated_pod_groups_without_a_workload_get_one() -> None:
    candidates = [
        ("Job", f"{NS}/queued", _job("queued")),
        ("Job", f"{NS}/running", _job("running", suspended=False)),
        ("Job", f"{NS}/owned", _job("owned")),
        ("Job", f"{NS}/gone", None),
    ]
    groups = [
        ((NS, "g"), [_gated_pod("g-0", "g"), _gated_pod("g-1", "g"), _gated_pod("other", "h")]),
        ((NS, "free"), [_gated_pod("free", gate=False)]),
    ]
    made = workload_create_writes(candidates, groups, lambda uid: uid == "uid-owned", {})
    assert [w.verb for w in made.writes] == [Verb.CREATE, Verb.CREATE]
    job_wl, group_wl = (w.body for w in made.writes)
    assert job_wl["metadata"]["ownerReferences"][0]["name"] == "queued"
    assert (job_wl["spec"]["queueName"], job_wl["spec"]["podSets"][0]["count"]) == ("lq", 2)
    assert made.writes[0].workload == f"{NS}/{job_wl['metadata']['name']}"
    assert group_wl["metadata"]["labels"][keys.JOB_UID_LABEL] == "g"
    assert group_wl["spec"]["podSets"][0]["count"] == 2
    assert made.settled_jobs == {("Job", f"{NS}/running"), ("Job", f"{NS}/owned"), ("Job", f"{NS}/gone")}
    assert made.settled_groups == {(NS, "free")}, "a pod group none of whose pods is gated needs none"
    owned = workload_create_writes([], groups[:1], lambda uid: uid == "g", {})
    assert (owned.writes, owned.settled_groups) == ((), {(NS, "g")})


def test_a_pass_builds_no_more_workloads_than_its_limit() -> None:
    # Two queued jobs and a running one between them, then a gated pod group: with a limit of
    # one, only the first queued job gets its Workload; nothing after it is looked at, so
    # neither the running job nor the group is settled (they stay candidates for a later pass).
    candidates = [
        ("Job", f"{NS}/first", _job("first")),
        ("Job", f"{NS}/running", _job("running", suspended=False)),
        ("Job", f"{NS}/second", _job("second")),
    ]
    looked_at = []

    def groups() -> Iterator[tuple[tuple[str, str], list[dict[str, Any]]]]:
        looked_at.append("g")
        yield (NS, "g"), [_gated_pod("g-0", "g"), _gated_pod("g-1", "g")]

    made = workload_create_writes(candidates, groups(), lambda uid: uid == "none", {}, limit=1)
    assert [w.body["metadata"]["ownerReferences"][0]["name"] for w in made.writes] == ["first"]
    assert (made.settled_jobs, made.settled_groups, looked_at) == (frozenset(), frozenset(), [])
    # With room for three, the running job is settled and the group gets its Workload.
    made = workload_create_writes(candidates, groups(), lambda uid: uid == "none", {}, limit=3)
    assert len(made.writes) == 3
    assert made.settled_jobs == {("Job", f"{NS}/running")}
    assert made.writes[-1].body["metadata"]["labels"][keys.JOB_UID_LABEL] == "g"


def _admitted(
    name: str, nodes: dict[str, int], *, placed: object = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    count = sum(nodes.values())
    body = workload(name, NS).queue("lq").podset(count=count, cpu="1", gpu=2).to_dict()
    admission = {
        "clusterQueue": "cq",
        "podSetAssignments": [
            {
                "name": "main",
                "count": count,
                "flavors": {"cpu": "h100", GPU: "h100"},
                "topologyAssignment": topology_assignment(
                    [keys.HOSTNAME_LABEL],
                    [((n,), c) for n, c in sorted(nodes.items())],
                    "kueue.x-k8s.io/v1beta2",
                ),
            }
        ],
    }
    if placed is not None:
        body["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: json.dumps({"main": placed})}
    body["status"] = {"admission": admission}
    return body, admission


def test_an_admitted_job_is_released_with_its_flavors_labels_and_queue_labels() -> None:
    wl, admission = _admitted("wl", {"node-a": 2})
    flavors = {"h100": resource_flavor("h100").set("spec.nodeLabels", {"gpu": "h100"}).to_dict()}
    observed = _job("train")
    (write,) = release_writes(wl, admission, ("Job", observed), [], flavors)
    assert (write.verb, write.workload, write.kind) == (Verb.RELEASE, f"{NS}/wl", "Job")
    assert write.body["spec"]["suspend"] is False
    template = write.body["spec"]["template"]
    assert template["spec"]["nodeSelector"] == {"gpu": "h100"}
    labels = template["metadata"]["labels"]
    assert (labels[keys.WORKLOAD_LABEL], labels[keys.PODSET_LABEL]) == ("wl", "main")
    assert (labels[keys.CLUSTER_QUEUE_LABEL], labels[keys.LOCAL_QUEUE_LABEL]) == ("cq", "lq")
    assert observed["spec"]["suspend"] is True, "the observed job is only read"
    assert release_writes(wl, admission, ("Job", write.body), [], flavors) == [], "released already"


def test_an_admitted_pod_group_has_its_gates_lifted() -> None:
    wl, admission = _admitted("grp", {"node-a": 2})
    pods = [_gated_pod("g-0", "g"), _gated_pod("g-1", "g", gate=False)]
    (write,) = release_writes(wl, admission, None, pods, {})
    assert (write.verb, write.kind, write.body["metadata"]["name"]) == (Verb.RELEASE, "Pod", "g-0")
    assert write.body["spec"]["schedulingGates"] == []
    assert write.body["spec"]["schedulerName"] == keys.SCHEDULER_NAME
    assert write.body["metadata"]["labels"][keys.WORKLOAD_LABEL] == "grp"
    assert pods[0]["spec"]["schedulingGates"], "the observed pod is only read"


def _pod(name: str, wl: str, *, node: str = "", devices: str = "", phase: str = "") -> dict[str, Any]:
    body = manifest_pod(name, NS).label(keys.WORKLOAD_LABEL, wl).label(keys.PODSET_LABEL, "main")
    body = body.set("spec.schedulerName", keys.SCHEDULER_NAME).set("metadata.uid", f"uid-{name}")
    body = body.set("spec.containers", pod_spec().container(cpu="1", **{GPU: "2"}).to_dict()["containers"])
    if node:
        body = body.set("spec.nodeName", node)
    if devices:
        body = body.annotate(keys.DEVICES_ANNOTATION, devices)
    if phase:
        body = body.set("status.phase", phase)
    return body.to_dict()


def _views(pods: list[dict[str, Any]], plans: dict[str, list[str]] | None = None) -> Any:
    nodes = {
        n: node(n).allocatable(cpu="64", memory="512Gi", **{GPU: "8"}).to_dict() for n in ("node-a", "node-b")
    }

    def view(name: str) -> NodeView | None:
        if name not in nodes:
            return None
        here = tuple(p for p in pods if p["spec"].get("nodeName") == name)
        return NodeView(nodes[name], here, dict(plans or {}))

    return view


def test_a_gang_waits_until_all_its_pods_exist_and_each_is_told_once() -> None:
    wl, admission = _admitted("wl", {"node-a": 2})
    pods = [_pod("p-0", "wl"), _pod("p-1", "wl")]
    waits = gang_plan(wl, admission, pods[:1])
    assert waits.pods == ()
    ((pod, message),) = waits.waits
    assert pod["metadata"]["name"] == "p-0"
    assert "1 of 2 pods exist" in message
    assert gang_plan(wl, admission, pods[:1], lambda p: p["metadata"]["name"] == "p-0").waits == ()
    bound = [_pod("p-0", "wl", node="node-a", devices="0,1"), _pod("p-1", "wl", node="node-a", devices="2,3")]
    assert gang_plan(wl, admission, bound) == GangPlan(f"{NS}/wl"), "nothing to do when all are bound"
    assert not waiting(bound)
    assert waiting(pods)


def test_a_gang_binds_its_planned_devices_and_a_bound_pod_fills_its_own_slot() -> None:
    placed = [["node-a", "0,1"], ["node-a", "2,3"], ["node-b", "4,5"]]
    wl, admission = _admitted("wl", {"node-a": 2, "node-b": 1}, placed=placed)
    first = _pod("p-0", "wl", node="node-a", devices="2,3")  # bound before a restart
    pods = [first, _pod("p-1", "wl"), _pod("p-2", "wl")]
    plan = gang_plan(wl, admission, pods)
    assert (plan.gang, plan.nodes) == (True, {"node-a", "node-b"})
    assert [(p["metadata"]["name"], slot) for p, slot in plan.pods] == [
        ("p-1", ("node-a", "0,1")),
        ("p-2", ("node-b", "4,5")),
    ]
    binds = binding_writes(plan, _views(pods), DeviceConfig())
    assert [(b.pod, b.node, b.replanned) for b in binds] == [
        (f"{NS}/p-1", "node-a", False),
        (f"{NS}/p-2", "node-b", False),
    ]
    for bind, devices in zip(binds, ("0,1", "4,5"), strict=True):
        assert bind.binding is not None
        assert bind.bound is not None
        assert bind.binding["target"]["name"] == bind.node
        assert bind.binding["metadata"]["annotations"][keys.DEVICES_ANNOTATION] == devices
        assert bind.binding["metadata"]["annotations"][DO_NOT_DISRUPT] == "true"
        assert bind.bound["spec"]["nodeName"] == bind.node
        assert bind.bound["metadata"]["annotations"][keys.DEVICES_ANNOTATION] == devices
    assert "nodeName" not in pods[1]["spec"], "the observed pod is only read"


def test_a_planned_slot_taken_is_fitted_again_around_other_plans_and_the_gangs_own_slots() -> None:
    placed = [["node-a", "0,1"], ["node-a", "2,3"]]
    wl, admission = _admitted("wl", {"node-a": 2}, placed=placed)
    pods = [_pod("p-0", "wl"), _pod("p-1", "wl")]
    stranger = _pod("x", "other", node="node-a", devices="0,1")  # took p-0's planned devices
    plans = {f"{NS}/later": ["4,5"], f"{NS}/wl": ["0,1", "2,3"]}  # another plan not bound yet
    binds = binding_writes(gang_plan(wl, admission, pods), _views([stranger, *pods], plans), DeviceConfig())
    devices = [b.binding["metadata"]["annotations"][keys.DEVICES_ANNOTATION] for b in binds if b.binding]
    assert [b.replanned for b in binds] == [True, False]
    # p-0 avoids the stranger's 0,1, its own gang's slot 2,3 and the later plan's 4,5; p-1 keeps 2,3.
    assert devices == ["6,7", "2,3"]


def test_each_pod_of_a_gang_is_fitted_beside_those_chosen_before_it() -> None:
    wl, admission = _admitted("wl", {"node-a": 2}, placed=[["node-a", "0,1"], ["node-a", "2,3"]])
    pods = [_pod("p-0", "wl"), _pod("p-1", "wl")]
    strangers = [_pod(f"x-{i}", "other", node="node-a", devices=d) for i, d in enumerate(("0,1", "2,3"))]
    binds = binding_writes(gang_plan(wl, admission, pods), _views([*strangers, *pods]), DeviceConfig())
    devices = [b.binding["metadata"]["annotations"][keys.DEVICES_ANNOTATION] for b in binds if b.binding]
    assert [b.replanned for b in binds] == [True, True]
    assert devices == ["4,5", "6,7"], "the second pod's fit sees the first one's devices taken"


def test_a_pod_that_ended_holds_nothing_and_a_full_node_makes_the_pod_wait() -> None:
    wl, admission = _admitted("wl", {"node-a": 1}, placed=[["node-a", "0,1"]])
    ended = _pod("done", "old", node="node-a", devices="0,1", phase="Succeeded")
    (bind,) = binding_writes(gang_plan(wl, admission, [_pod("p-0", "wl")]), _views([ended]), DeviceConfig())
    assert bind.binding is not None
    assert (bind.replanned, bind.binding["metadata"]["annotations"]) == (
        False,
        {keys.DEVICES_ANNOTATION: "0,1"},
    )
    full = [_pod(f"f-{i}", "big", node="node-a", devices=f"{2 * i},{2 * i + 1}") for i in range(4)]
    (wait,) = binding_writes(gang_plan(wl, admission, [_pod("p-0", "wl")]), _views(full), DeviceConfig())
    assert (wait.binding, wait.bound, wait.replanned) == (None, None, True), "no room now: a later pass"


def test_a_pod_bound_without_a_record_is_guessed_after_the_plans_and_the_own_plan_is_free() -> None:
    view = _views([_pod("x", "other", node="node-a")], {f"{NS}/later": ["0,1"]})("node-a")
    assert view is not None
    # The plan holds 0,1 first; the unrecorded pod's best guess takes 2,3; the pod gets 4,5.
    assert fit_devices(_pod("p", "wl"), view, None, DeviceConfig()) == (True, "4,5", False)
    # For a pod of that plan's own Workload the plan holds nothing: the guess takes 0,1.
    assert fit_devices(_pod("p", "later"), view, None, DeviceConfig(), owner=f"{NS}/later") == (
        True,
        "2,3",
        False,
    )


def test_a_pod_replaced_in_the_cache_is_read_anew_and_an_unchanged_one_gives_the_same_answer() -> None:
    # The binding step remembers what it parsed per observed object: the informer cache replaces
    # a pod that changes, so a new object must be read again, never answered from the old one.
    def fit(beside: dict[str, Any]) -> tuple[bool, str | None, bool]:
        return fit_devices(_pod("p", "wl"), _views([beside])("node-a"), None, DeviceConfig())

    small = _pod("x", "other", node="node-a")
    assert fit(small) == (True, "2,3", False)
    assert fit(small) == (True, "2,3", False)
    bigger = copy.deepcopy(small)
    bigger["spec"]["containers"][0]["resources"] = {"limits": {GPU: "4"}, "requests": {GPU: "4", "cpu": "1"}}
    assert fit(bigger) == (True, "4,5", False), "the new object is read, not the old one's answer"
