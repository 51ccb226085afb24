"""Spot in the core: serving stays off spot without an on-demand fallback; a workload whose node was
taken back is requeued at the head of its priority band; which node signals count as interruptions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.lifecycle import Reason
from gpuplane.core.scheduler import schedule
from gpuplane.core.spot import WORKLOAD_CLASS
from gpuplane.k8s.spot import interruption
from gpuplane.model.loader import load_state
from manifests import Manifest, cluster_queue, documents, local_queue, namespace, resource_flavor, workload

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:01:00Z"
T2 = "2026-01-01T00:02:00Z"


def flavor(name: str, capacity: str) -> Manifest:
    return resource_flavor(name).set("spec.nodeLabels", {"karpenter.sh/capacity-type": capacity})


def queue(*flavors: str) -> Manifest:
    cq = cluster_queue("gpu")
    for name in flavors:
        cq.flavor(name, gpu=8)
    return cq


def job(name: str, *, serving: bool = False, created: str = T0) -> Manifest:
    wl = workload(name).queue("gpu").created(created).podset(gpu=8)
    return wl.label(WORKLOAD_CLASS, "serving") if serving else wl


def decide(*objects: Manifest) -> dict[str, Any]:
    base = [
        namespace("default"),
        flavor("spot", "spot"),
        flavor("od", "on-demand"),
        local_queue("gpu", "default", "gpu"),
    ]
    state = load_state([("state.yaml", documents(*base, *objects))])
    plan = schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=None)
    return plan_document(plan, 0.0, 0.0)


@dataclass
class Case:
    name: str
    objects: list[Manifest]
    want_flavor: dict[str, str] = field(default_factory=dict)
    want_pending: dict[str, str] = field(default_factory=dict)


CASES = [
    Case(
        "serving-waits-on-spot-only",
        [queue("spot"), job("web", serving=True)],
        want_pending={"default/web": Reason.SPOT_WITHOUT_FALLBACK},
    ),
    Case("training-uses-spot-only", [queue("spot"), job("train")], want_flavor={"default/train": "spot"}),
    Case(
        "serving-with-fallback-may-use-spot",
        [queue("spot", "od"), job("web", serving=True)],
        want_flavor={"default/web": "spot"},
    ),
    Case(
        "serving-on-demand-only", [queue("od"), job("web", serving=True)], want_flavor={"default/web": "od"}
    ),
    Case(
        "serving-label-on-the-pod-template",
        [
            queue("spot"),
            workload("web")
            .queue("gpu")
            .podset(gpu=8)
            .set("spec.podSets[0].template.metadata.labels", {WORKLOAD_CLASS: "serving"}),
        ],
        want_pending={"default/web": Reason.SPOT_WITHOUT_FALLBACK},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_serving_and_spot(case: Case) -> None:
    doc = decide(*case.objects)
    flavors = {a["workload"]: a["podSets"][0]["flavors"]["nvidia.com/gpu"] for a in doc["admitted"]}
    assert flavors == case.want_flavor
    reasons = {p["workload"]: p["reason"] for p in doc["pending"]}
    for key, reason in case.want_pending.items():
        assert reasons[key] == reason
        message = next(p["message"] for p in doc["pending"] if p["workload"] == key)
        assert "on-demand fallback" in message


def test_an_interrupted_workload_is_requeued_at_the_head() -> None:
    interrupted = job("interrupted", created=T1).set(
        "status.conditions",
        [{"type": "Evicted", "status": "True", "reason": "NodeInterrupted", "lastTransitionTime": T2}],
    )
    preempted = job("preempted", created=T0).set(
        "status.conditions",
        [{"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": T1}],
    )
    doc = decide(
        queue("od").set("spec.resourceGroups[0].flavors[0].resources[0].nominalQuota", 0),
        job("older", created=T0),
        preempted,
        interrupted,
    )
    order = sorted((p for p in doc["pending"] if p["position"]), key=lambda p: p["position"])
    assert [p["workload"] for p in order] == ["default/interrupted", "default/older", "default/preempted"]


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (
            {"taints": [{"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]},
            "taint karpenter.sh/disrupted:NoSchedule",
        ),
        (
            {
                "taints": [
                    {"key": "aws-node-termination-handler/spot-itn", "value": "x", "effect": "NoSchedule"}
                ]
            },
            "taint aws-node-termination-handler/spot-itn:NoSchedule",
        ),
        (
            {"taints": [{"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}]},
            "taint node.kubernetes.io/unschedulable:NoSchedule",
        ),
        ({"unschedulable": True}, "cordoned"),
        ({"taints": [{"key": "karpenter.sh/disrupted", "effect": "PreferNoSchedule"}]}, None),
        ({"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}, None),
        ({}, None),
    ],
    ids=[
        "karpenter",
        "termination-handler",
        "unschedulable-taint",
        "cordon",
        "soft-taint",
        "other-taint",
        "none",
    ],
)
def test_interruption_signals(spec: dict[str, Any], want: str | None) -> None:
    assert interruption({"metadata": {"name": "n"}, "spec": spec}) == want
