"""The pure half of a controller pass: observed Workloads + plan -> writes, without any API server."""

from __future__ import annotations

import copy
import json
from typing import Any

from gpuplane.core.session import (
    PLACEMENT_ANNOTATION,
    AdmissionDecision,
    PendingDecision,
    Plan,
    PodPlacement,
    PodSetDecision,
    PreemptionDecision,
)
from gpuplane.k8s.plan_writes import (
    Verb,
    admission_writes,
    eviction_writes,
    pending_writes,
    preemption_writes,
)
from gpuplane.model.topology import assigned_domains
from manifests import workload

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
