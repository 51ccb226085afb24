"""Kueue admission checks in the core: quota is reserved while checks are pending, the workload is
admitted when all are Ready, a Retry releases the quota and requeues, a Rejected one deactivates.

Each case is a small cluster state decided with ``gpuplane schedule``'s own document builder; the
last tests run the command itself on a state file.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_state
from manifests import (
    KUEUE,
    Manifest,
    cluster_queue,
    documents,
    local_queue,
    namespace,
    node,
    resource_flavor,
    workload,
)

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"
PROV = "kueue.x-k8s.io/provisioning-request"


def admission_check(name: str, controller: str = PROV, active: bool | None = None) -> Manifest:
    check = Manifest(KUEUE, "AdmissionCheck", name).set("spec.controllerName", controller)
    if active is not None:
        check.set("status.conditions", [{"type": "Active", "status": str(active), "reason": "R"}])
    return check


def gpu_queue(name: str = "gpu", checks: list[str] | None = None, gpus: int = 16) -> Manifest:
    cq = cluster_queue(name).flavor("h100", gpu=gpus)
    if checks is not None:
        cq.set("spec.admissionChecks", checks)
    return cq


def gang(name: str, pods: int = 2, gpus: int = 4, created: str = T0, queue: str = "gpu") -> Manifest:
    return workload(name).queue(queue).created(created).podset(count=pods, gpu=gpus)


def reserved(
    wl: Manifest,
    states: dict[str, str],
    *,
    cq: str = "gpu",
    flavor: str = "h100",
    admitted: bool = False,
) -> Manifest:
    """The gang with quota reserved in ``cq`` and these admission check states."""
    ps = wl.body["spec"]["podSets"][0]
    gpus = ps["template"]["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]
    wl.admitted(
        cq,
        {
            "name": "main",
            "count": ps["count"],
            "flavors": {"nvidia.com/gpu": flavor},
            "resourceUsage": {"nvidia.com/gpu": str(int(gpus) * ps["count"])},
        },
    )
    conditions = [
        {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "lastTransitionTime": T0}
    ]
    if admitted:
        conditions.append(
            {"type": "Admitted", "status": "True", "reason": "Admitted", "lastTransitionTime": T0}
        )
    wl.set("status.conditions", conditions)
    wl.set(
        "status.admissionChecks",
        [
            {"name": n, "state": s, "message": f"{n} says {s}", "lastTransitionTime": T0}
            for n, s in states.items()
        ],
    )
    return wl


def gpu_node(name: str, gpus: int = 8) -> Manifest:
    return (
        node(name)
        .allocatable(cpu="64", memory="512Gi", gpu=gpus, pods=110)
        .label("kubernetes.io/hostname", name)
    )


def base(*extra: Manifest, queues: tuple[Manifest, ...] | None = None) -> list[Manifest]:
    cqs = queues if queues is not None else (gpu_queue(checks=["prov"]),)
    objects: list[Manifest] = [namespace("default"), resource_flavor("h100"), admission_check("prov"), *cqs]
    objects += [local_queue(q.body["metadata"]["name"], "default", q.body["metadata"]["name"]) for q in cqs]
    return objects + list(extra)


def decide(objects: list[Manifest], cycles: int | None = 1) -> dict[str, Any]:
    state = load_state([("state.yaml", documents(*objects))])
    plan = schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=cycles)
    return plan_document(plan, 0.0, 0.0)


@dataclass
class Case:
    name: str
    objects: list[Manifest]
    want_admitted: set[str] = field(default_factory=set)  # admitted outright (no pending checks)
    want_reserving: dict[str, list[str]] = field(default_factory=dict)  # admitted with checks pending
    want_reserved: dict[str, dict[str, str]] = field(default_factory=dict)  # held from the input
    want_evicted: dict[str, str] = field(default_factory=dict)  # workload -> Retry | Rejected
    want_pending: dict[str, str] = field(default_factory=dict)  # workload -> reason
    want_placed: set[str] = field(default_factory=set)  # admitted with a placement on nodes
    cycles: int | None = 1


CASES = [
    Case(
        name="quota-reserved-checks-pending",
        objects=base(gang("train")),
        want_reserving={"default/train": ["prov"]},
    ),
    Case(
        name="no-checks-admits-outright",
        objects=base(gang("train"), queues=(gpu_queue(),)),
        want_admitted={"default/train"},
    ),
    Case(
        name="no-place-still-reserves-quota-for-provisioning",
        objects=base(gpu_node("n1", gpus=4), gang("train", pods=2, gpus=4)),
        want_reserving={"default/train": ["prov"]},
    ),
    Case(
        name="no-place-without-checks-waits",
        objects=base(gpu_node("n1", gpus=4), gang("train", pods=2, gpus=4), queues=(gpu_queue(),)),
        want_pending={"default/train": "ExceedsClusterCapacity"},
    ),
    Case(
        name="all-ready-and-nodes-exist-admits-placed",
        objects=base(gpu_node("n1"), reserved(gang("train"), {"prov": "Ready"})),
        want_admitted={"default/train"},
        want_placed={"default/train"},
    ),
    Case(
        name="all-ready-without-nodes-admits-on-quota",
        objects=base(reserved(gang("train"), {"prov": "Ready"})),
        want_admitted={"default/train"},
    ),
    Case(
        name="all-ready-but-no-room-keeps-quota",
        objects=base(gpu_node("n1", gpus=4), reserved(gang("train"), {"prov": "Ready"})),
        want_reserved={"default/train": {"prov": "Ready"}},
    ),
    Case(
        name="pending-check-holds-quota",
        objects=base(
            reserved(gang("first", pods=4), {"prov": "Pending"}),
            gang("second", pods=1, created=T1),
            queues=(gpu_queue(checks=["prov"], gpus=16),),
        ),
        want_reserved={"default/first": {"prov": "Pending"}},
        want_pending={"default/second": "WaitingForQuota"},
    ),
    Case(
        name="missing-state-counts-as-pending",
        objects=base(reserved(gang("train"), {})),
        want_reserved={"default/train": {"prov": "Pending"}},
    ),
    Case(
        name="retry-holds-quota-in-the-cycle-that-evicts",
        objects=base(
            reserved(gang("failed", pods=4, created=T1), {"prov": "Retry"}),
            gang("waiting", pods=4, created=T0),
        ),
        want_evicted={"default/failed": "Retry"},
        want_pending={"default/failed": "Queued", "default/waiting": "WaitingForQuota"},
    ),
    Case(
        name="retry-releases-quota-and-requeues",
        objects=base(
            reserved(gang("failed", pods=4, created=T1), {"prov": "Retry"}),
            gang("waiting", pods=4, created=T0),
        ),
        want_evicted={"default/failed": "Retry"},
        want_reserving={"default/waiting": ["prov"]},
        want_pending={"default/failed": "WaitingForQuota"},
        cycles=None,
    ),
    Case(
        # With reclaimWithinCohort Any a workload that finds no victim is parked on the cycle's
        # state alone, and the outcome is remembered for its shape: the release must outdate it.
        name="retry-release-outdates-what-the-cycle-remembered",
        objects=base(
            reserved(gang("failed", pods=4, created=T1), {"prov": "Retry"}),
            gang("waiting", pods=4, created=T0),
            queues=(
                gpu_queue(checks=["prov"]).set(
                    "spec.preemption", {"reclaimWithinCohort": "Any", "withinClusterQueue": "Never"}
                ),
            ),
        ),
        want_evicted={"default/failed": "Retry"},
        want_reserving={"default/waiting": ["prov"]},
        want_pending={"default/failed": "WaitingForQuota"},
        cycles=None,
    ),
    Case(
        name="retry-alone-is-reserved-again-next",
        objects=base(reserved(gang("failed"), {"prov": "Retry"})),
        want_evicted={"default/failed": "Retry"},
        want_reserving={"default/failed": ["prov"]},
        cycles=None,
    ),
    Case(
        name="rejected-deactivates",
        objects=base(reserved(gang("bad"), {"prov": "Rejected"})),
        want_evicted={"default/bad": "Rejected"},
        want_pending={"default/bad": "Deactivated"},
    ),
    Case(
        name="retry-after-admission-evicts",
        objects=base(reserved(gang("revoked"), {"prov": "Retry"}, admitted=True)),
        want_evicted={"default/revoked": "Retry"},
        want_reserving={"default/revoked": ["prov"]},
        cycles=None,
    ),
    Case(
        name="evicted-workload-keeps-its-quota-until-released",
        objects=base(
            reserved(gang("leaving", pods=4), {"prov": "Retry"}).set(
                "status.conditions[1]",
                {"type": "Evicted", "status": "True", "reason": "AdmissionCheck", "lastTransitionTime": T0},
            ),
            gang("next", pods=1, created=T1),
        ),
        want_pending={"default/next": "WaitingForQuota"},
        cycles=None,
    ),
    Case(
        name="check-added-after-admission-does-not-evict",
        objects=base(reserved(gang("old"), {}, admitted=True), gang("new", pods=2, created=T1)),
        want_reserving={"default/new": ["prov"]},
    ),
    Case(
        name="strategy-on-flavors-applies-to-that-flavor-only",
        objects=[
            namespace("default"),
            resource_flavor("spot"),
            resource_flavor("ondemand"),
            admission_check("prov"),
            cluster_queue("gpu")
            .flavor("spot", gpu=8)
            .flavor("ondemand", gpu=8)
            .set(
                "spec.admissionChecksStrategy", {"admissionChecks": [{"name": "prov", "onFlavors": ["spot"]}]}
            ),
            local_queue("gpu", "default", "gpu"),
            gang("a", pods=2, gpus=4, created=T0),
            gang("b", pods=2, gpus=4, created=T1),
        ],
        # One head per queue per cycle: a takes spot (checked); b comes in the next cycle.
        want_reserving={"default/a": ["prov"]},
    ),
    Case(
        name="missing-admission-check-makes-queue-inactive",
        objects=[
            namespace("default"),
            resource_flavor("h100"),
            gpu_queue(checks=["nope"]),
            local_queue("gpu", "default", "gpu"),
            gang("train"),
        ],
        want_pending={"default/train": "Suspended"},
    ),
    Case(
        name="foreign-check-without-active-makes-queue-inactive",
        objects=base(
            gang("train"),
            admission_check("policy", controller="example.com/policy"),
            queues=(gpu_queue(checks=["policy"]),),
        ),
        want_pending={"default/train": "Suspended"},
    ),
    Case(
        name="foreign-check-marked-active-is-used",
        objects=base(
            gang("train"),
            admission_check("policy", controller="example.com/policy", active=True),
            queues=(gpu_queue(checks=["policy", "prov"]),),
        ),
        want_reserving={"default/train": ["policy", "prov"]},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_admission_checks(case: Case) -> None:
    doc = decide(case.objects, case.cycles)
    admitted = {a["workload"]: a for a in doc["admitted"]}
    outright = {k for k, a in admitted.items() if "admissionChecks" not in a}
    reserving = {
        k: [c["name"] for c in a["admissionChecks"]] for k, a in admitted.items() if "admissionChecks" in a
    }
    assert outright == case.want_admitted
    assert reserving == case.want_reserving
    for a in admitted.values():
        for check in a.get("admissionChecks", []):
            assert check["state"] == "Pending"
    held = {
        r["workload"]: {c["name"]: c["state"] for c in r["admissionChecks"]} for r in doc.get("reserved", [])
    }
    assert held == case.want_reserved
    evicted = {e["workload"]: e["state"] for e in doc.get("checkEvictions", [])}
    assert evicted == case.want_evicted
    reasons = {p["workload"]: p["reason"] for p in doc["pending"]}
    for key, reason in case.want_pending.items():
        assert reasons.get(key) == reason, doc["pending"]
    placed = {k for k, a in admitted.items() if any("placement" in ps for ps in a["podSets"])}
    assert placed == case.want_placed


def test_retry_message_names_the_check_and_the_release() -> None:
    doc = decide(
        base(
            reserved(gang("failed", pods=4, created=T1), {"prov": "Retry"}),
            gang("waiting", pods=4, created=T0),
        ),
    )
    [eviction] = doc["checkEvictions"]
    assert eviction == {
        "workload": "default/failed",
        "clusterQueue": "gpu",
        "check": "prov",
        "state": "Retry",
        "message": "prov says Retry",
    }
    failed = next(p for p in doc["pending"] if p["workload"] == "default/failed")
    assert "quota released" in failed["message"]


def test_placeable_is_reported_for_a_reserved_gang() -> None:
    doc = decide(base(gpu_node("n1"), reserved(gang("train"), {"prov": "Pending"})))
    [held] = doc["reserved"]
    assert held["placeable"] is True
    doc = decide(base(gpu_node("n1", gpus=4), reserved(gang("train"), {"prov": "Pending"})))
    [held] = doc["reserved"]
    assert held["placeable"] is False
    assert "no place on the nodes yet" in held["message"]


@pytest.mark.parametrize(
    ("mutate", "want_field"),
    [
        (
            lambda cq: cq.set("spec.admissionChecks", ["prov"]).set(
                "spec.admissionChecksStrategy", {"admissionChecks": [{"name": "prov"}]}
            ),
            "spec.admissionChecksStrategy",
        ),
        (lambda cq: cq.set("spec.admissionChecks", ["prov", "prov"]), "spec.admissionChecks"),
        (lambda cq: cq.set("spec.admissionChecks", [3]), "spec.admissionChecks[0]"),
    ],
    ids=["both-forms", "named-twice", "not-a-string"],
)
def test_bad_check_references_are_located(mutate: Any, want_field: str) -> None:
    objects = base(gang("train"), queues=(mutate(cluster_queue("gpu").flavor("h100", gpu=8)),))
    with pytest.raises(InputError) as err:
        load_state([("state.yaml", documents(*objects))])
    assert err.value.field == want_field
    assert "ClusterQueue" in str(err.value)


def gpuplane(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_schedule_command_reports_reservations_and_evictions(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(
        documents(
            *base(
                gpu_node("n1"),
                reserved(gang("ready"), {"prov": "Ready"}),
                reserved(gang("failed", created=T1), {"prov": "Retry"}),
                reserved(gang("waiting", pods=1), {"prov": "Pending"}),
                queues=(gpu_queue(checks=["prov"], gpus=32),),
            )
        )
    )
    run = gpuplane("schedule", "-f", str(state), "--cycles", "1", "--output", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    admitted = {a["workload"]: a for a in doc["admitted"]}
    assert "admissionChecks" not in admitted["default/ready"]
    assert [p["node"] for p in admitted["default/ready"]["podSets"][0]["placement"]] == ["n1", "n1"]
    assert "default/failed" not in admitted, "it holds its quota in the cycle that evicts it"
    assert [r["workload"] for r in doc["reserved"]] == ["default/waiting"]
    assert [e["workload"] for e in doc["checkEvictions"]] == ["default/failed"]
    table = gpuplane("schedule", "-f", str(state), "--cycles", "1")
    assert table.returncode == 0, table.stderr
    assert "Waiting for admission checks (1)" in table.stdout
    assert "prov=Pending" in table.stdout


def test_schedule_command_refuses_a_bad_check_state(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(documents(*base(reserved(gang("train"), {"prov": "Maybe"}))))
    run = gpuplane("schedule", "-f", str(state))
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1
    assert "status.admissionChecks[0].state" in run.stderr


# --- MultiKueue on a manager: quota alone, never the manager's nodes ---------------------------------

MK = "kueue.x-k8s.io/multikueue"


def test_a_multikueue_check_admits_on_quota_alone_even_where_the_manager_has_nodes() -> None:
    objects = [
        namespace("default"),
        resource_flavor("h100"),
        admission_check("mk", MK, active=True),
        gpu_queue(checks=["mk"], gpus=32),
        local_queue("gpu", "default", "gpu"),
        gpu_node("manager-n0"),  # a node the manager happens to have: never the gang's place
        reserved(gang("train", pods=2, gpus=8), {"mk": "Ready"}),
        gang("next", pods=1, gpus=8, created=T1),
    ]
    plan = decide(objects)
    admitted = {a["workload"]: a for a in plan["admitted"]}
    assert set(admitted) == {"default/train", "default/next"}
    # 16 GPUs on an 8-GPU manager: admitted anyway, with no placement (the worker places it).
    for decision in admitted.values():
        assert all(ps.get("placement") is None for ps in decision["podSets"]), decision


def test_why_says_where_a_dispatched_workload_waits_and_where_it_runs() -> None:
    from gpuplane.insight.why import explain  # noqa: PLC0415

    waiting = reserved(gang("train"), {"mk": "Pending"})
    waiting.set(
        "status.admissionChecks[0].message", "nominated big: the gang fits there now; small: 8 GPUs short"
    )
    running = reserved(gang("done", created=T1), {"mk": "Ready"}, admitted=True).set(
        "status.clusterName", "big"
    )
    objects = [
        namespace("default"),
        resource_flavor("h100"),
        admission_check("mk", MK, active=True),
        gpu_queue(checks=["mk"]),
        local_queue("gpu", "default", "gpu"),
        waiting,
        running,
    ]
    state = load_state([("state.yaml", documents(*objects))])
    config = config_from_kueue(state.configuration)
    now = default_now(state)
    plan = schedule(state, config, now, cycles=1)
    first = explain(state, plan, now, "default/train", config)
    assert first.reason == "WaitingForAdmissionChecks"
    assert "mk Pending (nominated big: the gang fits there now; small: 8 GPUs short)" in first.message
    second = explain(state, plan, now, "default/done", config)
    assert second.reason == "Admitted"
    assert second.message.endswith("runs on worker cluster big (MultiKueue)")
