"""Karpenter-aware capacity: NodePools read from the input, which flavors they can provide, what they
can still bring, disrupted nodes left alone, and the doctor's two NodePool checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.karpenter import can_label, provides, remaining
from gpuplane.core.scheduler import schedule
from gpuplane.insight.doctor import diagnose
from gpuplane.model.errors import InputError
from gpuplane.model.karpenter import NodePool
from gpuplane.model.loader import load_state
from gpuplane.model.objects import Node, ResourceFlavor, SelectorRequirement
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    local_queue,
    namespace,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

POOL = "karpenter.sh/nodepool"


def node_pool(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    requirements: list[dict[str, Any]] | None = None,
    gpus: int | None = None,
) -> Manifest:
    pool = Manifest("karpenter.sh/v1", "NodePool", name).set(
        "spec.template",
        {
            "metadata": {"labels": labels or {}},
            "spec": {
                "requirements": requirements or [],
                "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": "default"},
            },
        },
    )
    return pool if gpus is None else pool.set("spec.limits", {"nvidia.com/gpu": gpus})


def flavor(name: str, instance_type: str) -> Manifest:
    return resource_flavor(name).set("spec.nodeLabels", {"node.kubernetes.io/instance-type": instance_type})


H100 = {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["p5.48xlarge"]}
SPOT = {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot", "on-demand"]}


@pytest.mark.parametrize(
    ("pool", "key", "value", "want"),
    [
        (NodePool("p", labels={"team": "a"}), "team", "a", True),
        (NodePool("p", labels={"team": "a"}), "team", "b", False),
        (NodePool("p", requirements=(SelectorRequirement("t", "In", ("x", "y")),)), "t", "y", True),
        (NodePool("p", requirements=(SelectorRequirement("t", "In", ("x",)),)), "t", "y", False),
        (NodePool("p", requirements=(SelectorRequirement("t", "NotIn", ("x",)),)), "t", "y", True),
        (NodePool("p", requirements=(SelectorRequirement("t", "Exists"),)), "t", "y", True),
        (NodePool("p", requirements=(SelectorRequirement("t", "DoesNotExist"),)), "t", "y", False),
        (NodePool("p"), "t", "y", False),
    ],
    ids=[
        "label",
        "label-other-value",
        "in",
        "not-in-list",
        "notin",
        "exists",
        "does-not-exist",
        "unmentioned",
    ],
)
def test_can_label(pool: NodePool, key: str, value: str, want: bool) -> None:
    assert can_label(pool, key, value) is want


def test_remaining_is_the_limit_less_the_pools_nodes() -> None:
    pool = NodePool("gpu", limits={"nvidia.com/gpu": 32})
    nodes = [
        Node("a", {"nvidia.com/gpu": 8}, labels={POOL: "gpu"}),
        Node("b", {"nvidia.com/gpu": 8}, labels={POOL: "gpu"}),
        Node("c", {"nvidia.com/gpu": 8}, labels={POOL: "other"}),
    ]
    assert remaining(pool, nodes) == {"nvidia.com/gpu": 16}
    assert provides(pool, ResourceFlavor("any"))


def state_text(*extra: Manifest) -> str:
    return documents(
        namespace("default"),
        flavor("h100", "p5.48xlarge"),
        cluster_queue("gpu").flavor("h100", gpu=64),
        local_queue("gpu", "default", "gpu"),
        *extra,
    )


def test_doctor_reports_pools_without_flavor_and_flavors_without_pool() -> None:
    state = load_state(
        [
            (
                "s.yaml",
                state_text(
                    node_pool("h100", requirements=[H100, SPOT]),
                    node_pool("cpu-only", labels={"workload": "web"}),
                    flavor("a100", "p4d.24xlarge"),
                ),
            )
        ]
    )
    found = {(f.check, f.objects) for f in diagnose(state)}
    assert ("nodepool-without-flavor", ("NodePool/cpu-only",)) in found
    assert ("flavor-without-nodepool", ("ResourceFlavor/a100",)) in found
    assert not any("h100" in o for _, objects in found for o in objects)
    without_karpenter = load_state([("s.yaml", state_text(flavor("a100", "p4d.24xlarge")))])
    assert not [f for f in diagnose(without_karpenter) if "nodepool" in f.check]


def test_doctor_command_prints_the_nodepool_findings(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        state_text(node_pool("h100", requirements=[H100]), node_pool("cpu-only", labels={"workload": "web"}))
    )
    run = subprocess.run(
        [sys.executable, "-m", "gpuplane", "doctor", "-f", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr  # warnings only
    assert "[warning] nodepool-without-flavor: NodePool/cpu-only" in run.stdout
    assert "flavor-matches-no-node" not in run.stdout, "no h100 node yet, but its NodePool can launch them"


def gpu_node(name: str, *taints: dict[str, str]) -> Manifest:
    built = (
        node(name)
        .allocatable(cpu="64", memory="512Gi", gpu=8, pods=110)
        .label("kubernetes.io/hostname", name)
        .label("node.kubernetes.io/instance-type", "p5.48xlarge")
        .label(POOL, "h100")
    )
    for t in taints:
        built.taint(t["key"], None, t["effect"])
    return built


def decide(text: str) -> dict[str, Any]:
    state = load_state([("s.yaml", text)])
    return plan_document(
        schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=None), 0, 0
    )


def test_no_gang_starts_on_a_disrupted_node_even_tolerating_everything() -> None:
    tolerant = pod_spec().container(gpu=8).toleration(operator="Exists")
    doc = decide(
        state_text(
            gpu_node("old", {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}),
            gpu_node("new"),
            workload("w").queue("gpu").podset(count=1, spec=tolerant),
        )
    )
    [admitted] = doc["admitted"]
    assert [p["node"] for p in admitted["podSets"][0]["placement"]] == ["new"]


def test_a_pending_gang_is_told_what_the_node_pools_can_still_bring() -> None:
    doc = decide(
        state_text(
            gpu_node("n0"),
            node_pool("h100", requirements=[H100], gpus=24),
            workload("w").queue("gpu").podset(count=3, gpu=8),
        )
    )
    [pending] = doc["pending"]
    assert "NodePools can still bring: h100 (16 nvidia.com/gpu)" in pending["message"]


def test_a_bad_node_pool_is_located() -> None:
    with pytest.raises(InputError) as err:
        load_state(
            [
                (
                    "s.yaml",
                    state_text(
                        node_pool("p").set(
                            "spec.template.spec.requirements", [{"key": "k", "operator": "Near"}]
                        )
                    ),
                )
            ]
        )
    assert err.value.field == "spec.template.spec.requirements[0].operator"
    with pytest.raises(InputError, match=r"expected karpenter\.sh/v1"):
        load_state([("s.yaml", state_text(node_pool("p").set("apiVersion", "karpenter.sh/v1beta1")))])


def test_a_pending_gang_is_told_about_the_warm_buffer() -> None:
    warm = flavor("h100", "p5.48xlarge").annotate("gpuplane.dev/warm-nodes", "2")
    text = documents(
        namespace("default"),
        warm,
        cluster_queue("gpu").flavor("h100", gpu=64),
        local_queue("gpu", "default", "gpu"),
        gpu_node("n0"),
        workload("w").queue("gpu").podset(count=3, gpu=8),
    )
    [pending] = decide(text)["pending"]
    assert "warm buffer of flavor h100: 2 node(s)" in pending["message"]
    with pytest.raises(InputError) as err:
        load_state([("s.yaml", text.replace("'2'", "two").replace('"2"', "two"))])
    assert err.value.field == "metadata.annotations.gpuplane.dev/warm-nodes"
