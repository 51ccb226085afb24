"""Claims charged against ClusterQueue quota as Kueue charges them (issue 32, item 4)."""

from __future__ import annotations

import pytest

from dra_states import CLUSTER, admitted, pending, schedule, template, workload
from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_state

MAPPINGS = """
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
resources:
  deviceClassMappings:
  - name: example.com/gpus
    deviceClassNames: [gpu.example.com, shared.example.com]
"""
GPU_CLAIM = "[{name: gpu, resourceClaimTemplateName: %s}]"


def cluster(gpu_quota: int = 4) -> str:
    """The DRA test cluster, its ClusterQueue also covering example.com/gpus."""
    text = CLUSTER.read_text()
    text = text.replace(
        "coveredResources: [cpu, nvidia.com/gpu]", "coveredResources: [cpu, nvidia.com/gpu, example.com/gpus]"
    )
    return text.replace(
        "      - {name: nvidia.com/gpu, nominalQuota: 100}",
        "      - {name: nvidia.com/gpu, nominalQuota: 100}\n"
        f"      - {{name: example.com/gpus, nominalQuota: {gpu_quota}}}",
    )


def gpus(count: int, cls: str = "gpu.example.com") -> str:
    return f"[{{name: gpus, exactly: {{deviceClassName: {cls}, count: {count}}}}}]"


def test_claims_are_charged_under_the_mapped_resource() -> None:
    doc = schedule(
        MAPPINGS,
        template("two", gpus(2)),
        workload("a", 2, GPU_CLAIM % "two"),
        template("one", gpus(1)),
        workload("b", 1, GPU_CLAIM % "one", at=1),
        cluster=cluster(4),
    )
    assert admitted(doc, "a") is not None
    waiting = pending(doc, "b")
    assert waiting["reason"] == "WaitingForQuota"
    assert "example.com/gpus" in waiting["message"]


def test_a_class_without_a_mapping_is_inadmissible_with_kueues_reason() -> None:
    doc = schedule(
        MAPPINGS,
        template("mig", gpus(1, "mig.example.com")),
        workload("a", 1, GPU_CLAIM % "mig"),
        template("one", gpus(1)),
        workload("b", 1, GPU_CLAIM % "one", at=1),
        cluster=cluster(),
    )
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert (
        'spec.podSets[0].template.spec.resourceClaims[0].resourceClaimTemplateName: Not found: "DeviceClass '
        'mig.example.com is not mapped in DRA configuration for podset main"'
    ) in why["message"]
    assert admitted(doc, "b") is not None


def test_allocation_mode_all_cannot_be_charged_and_is_inadmissible() -> None:
    every = "[{name: gpus, exactly: {deviceClassName: gpu.example.com, allocationMode: All}}]"
    doc = schedule(MAPPINGS, template("all", every), workload("a", 1, GPU_CLAIM % "all"), cluster=cluster())
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert "AllocationMode 'All' is not supported" in why["message"]


def test_first_available_is_charged_its_largest_entry() -> None:
    first = (
        "[{name: gpu, firstAvailable: [{name: big, deviceClassName: gpu.example.com, count: 3},"
        " {name: small, deviceClassName: gpu.example.com, count: 1}]}]"
    )
    doc = schedule(MAPPINGS, template("fa", first), workload("a", 2, GPU_CLAIM % "fa"), cluster=cluster(5))
    assert pending(doc, "a")["reason"] == "ExceedsMaxQuota"  # 2 x 3 > 5
    doc = schedule(MAPPINGS, template("fa", first), workload("a", 2, GPU_CLAIM % "fa"), cluster=cluster(6))
    assert admitted(doc, "a") is not None


def test_the_extended_resource_path_shares_the_same_quota() -> None:
    backed = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: node-gpus.example.com}
spec:
  extendedResourceName: nvidia.com/gpu
"""
    mappings = MAPPINGS.replace(
        "[gpu.example.com, shared.example.com]", "[gpu.example.com, node-gpus.example.com]"
    )
    doc = schedule(
        mappings,
        backed,
        workload("ext", 1, "[]", gpus=2),
        template("two", gpus(2)),
        workload("dra", 1, GPU_CLAIM % "two", at=1),
        template("one", gpus(1)),
        workload("late", 1, GPU_CLAIM % "one", at=2),
        cluster=cluster(4),
    )
    assert admitted(doc, "ext") is not None
    assert admitted(doc, "dra") is not None
    assert pending(doc, "late")["reason"] == "WaitingForQuota"  # 2 (extended) + 2 (claim) of 4


def test_without_mappings_claims_are_placed_and_charged_nothing() -> None:
    doc = schedule(template("two", gpus(2)), workload("a", 4, GPU_CLAIM % "two"))
    assert len(admitted(doc, "a") or []) == 4


def test_a_malformed_mapping_is_one_located_error() -> None:
    bad = MAPPINGS.replace("deviceClassNames: [gpu.example.com, shared.example.com]", "deviceClassNames: []")
    with pytest.raises(InputError, match=r"resources\.deviceClassMappings"):
        load_state([("state.yaml", bad)])


LOW = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata: {name: low, namespace: team, creationTimestamp: "2026-01-01T00:00:00Z"}
spec:
  queueName: q
  priority: 0
  podSets:
  - name: main
    count: 1
    template:
      spec:
        resourceClaims: [{name: gpu, resourceClaimTemplateName: eight}]
        containers: [{name: c, resources: {requests: {cpu: "1"}}}]
status:
  admission:
    clusterQueue: q
    podSetAssignments:
    - name: main
      count: 1
      flavors: {cpu: default, example.com/gpus: default}
      resourceUsage: {cpu: "1", example.com/gpus: "8"}
  conditions:
  - {type: QuotaReserved, status: "True", reason: QuotaReserved, lastTransitionTime: "2026-01-01T00:00:00Z"}
  - {type: Admitted, status: "True", reason: Admitted, lastTransitionTime: "2026-01-01T00:00:00Z"}
---
apiVersion: v1
kind: Pod
metadata: {name: low-0, namespace: team, labels: {kueue.x-k8s.io/workload-name: low}}
spec:
  nodeName: n1
  resourceClaims: [{name: gpu, resourceClaimName: low-0-gpu}]
  containers: [{name: c, resources: {requests: {cpu: "1"}}}]
status: {phase: Running}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: low-0-gpu, namespace: team}
spec:
  devices:
    requests: [{name: gpus, exactly: {deviceClassName: gpu.example.com, count: 8}}]
status:
  allocation:
    devices:
      results:
RESULTS
  reservedFor: [{resource: pods, name: low-0, uid: "1"}]
""".replace(
    "RESULTS",
    "\n".join(
        f"      - {{request: gpus, driver: gpu.example.com, pool: n1, device: gpu-{i}}}" for i in range(8)
    ),
)


def test_preemption_frees_the_devices_the_victims_claims_hold() -> None:
    nvlink = 'device.attributes["nvlink.example.com"]'
    on_n1 = f'"domain" in {nvlink} && {nvlink}.domain.startsWith("n1-")'
    eight_on_n1 = (
        "[{name: gpus, exactly: {deviceClassName: gpu.example.com, count: 8,"
        f" selectors: [{{cel: {{expression: '{on_n1}'}}}}]}}}}]"
    )
    high = workload("high", 1, GPU_CLAIM % "n1", at=5).replace(
        "  queueName: q", "  queueName: q\n  priority: 100"
    )
    preempting = cluster(8).replace(
        "namespaceSelector: {}", "namespaceSelector: {}\n  preemption: {withinClusterQueue: LowerPriority}"
    )
    doc = schedule(
        MAPPINGS, template("eight", gpus(8)), LOW, template("n1", eight_on_n1), high, cluster=preempting
    )
    assert [p["workload"] for p in doc["preempted"]] == ["team/low"], doc["pending"]
    # Without the quota to take, and low's devices held, high has no place on n1.
    doc = schedule(
        MAPPINGS, template("eight", gpus(8)), LOW, template("n1", eight_on_n1), high, cluster=cluster(16)
    )
    assert admitted(doc, "high") is None
    assert "claims" in pending(doc, "high")["message"]


BACKED = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: backed.example.com}
spec:
  extendedResourceName: example.com/gpu
  selectors:
  - cel:
      expression: >-
        device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].type == "gpu"
"""


def extended(name: str, count: int, pods: int = 1, at: int = 0) -> str:
    """A workload whose pods request ``count`` of example.com/gpu, which no node advertises."""
    return workload(name, pods, "[]", at=at).replace(
        'requests: {cpu: "1"}}', f"requests: {{cpu: \"1\"}}, limits: {{example.com/gpu: '{count}'}}}}"
    )


def test_an_extended_resource_no_node_advertises_is_allocated_from_its_device_class() -> None:
    covering = cluster().replace("example.com/gpus]", "example.com/gpus, example.com/gpu]")
    covering = covering.replace(
        "      - {name: nvidia.com/gpu, nominalQuota: 100}\n",
        "      - {name: nvidia.com/gpu, nominalQuota: 100}\n"
        "      - {name: example.com/gpu, nominalQuota: 10}\n",
    )
    doc = schedule(BACKED, extended("a", 3, pods=2), extended("b", 8, at=1), cluster=covering)
    placement = admitted(doc, "a")
    assert placement is not None
    for pod in placement:
        assert [d["request"] for d in pod["claims"]["example.com/gpu"]] == ["example.com/gpu"] * 3
    # 6 of example.com/gpu charged: 8 more do not fit the quota of 10, though n2 has 8 free.
    assert pending(doc, "b")["reason"] == "WaitingForQuota"


def test_a_mapped_extended_resource_shares_the_quota_of_claims() -> None:
    mappings = MAPPINGS.replace(
        "[gpu.example.com, shared.example.com]", "[gpu.example.com, backed.example.com]"
    )
    doc = schedule(
        mappings,
        BACKED,
        extended("a", 2),
        template("two", gpus(2)),
        workload("b", 1, GPU_CLAIM % "two", at=1),
        extended("c", 1, at=2),
        cluster=cluster(4),
    )
    (pod,) = admitted(doc, "a") or []
    assert len(pod["claims"]["example.com/gpu"]) == 2
    assert admitted(doc, "b") is not None
    assert pending(doc, "c")["reason"] == "WaitingForQuota"


RECORD = """'{"main":[["n1",""]]}'"""  # the placement record: its pod on n1, no extended devices


def test_an_admitted_workload_holding_its_recorded_plan_holds_its_claims_too() -> None:
    planned = (
        LOW.split("---")[0]
        .replace("name: low,", "name: planned,")
        .replace(
            'creationTimestamp: "2026-01-01T00:00:00Z"}',
            'creationTimestamp: "2026-01-01T00:00:00Z", annotations: {gpuplane.dev/placement: '
            + RECORD
            + "}}",
        )
    )
    nvlink = 'device.attributes["nvlink.example.com"]'
    on_n1 = f'"domain" in {nvlink} && {nvlink}.domain.startsWith("n1-")'
    one_on_n1 = (
        "[{name: gpus, exactly: {deviceClassName: gpu.example.com, count: 1,"
        f" selectors: [{{cel: {{expression: '{on_n1}'}}}}]}}}}]"
    )
    doc = schedule(
        MAPPINGS,
        template("eight", gpus(8)),
        planned,
        template("n1", one_on_n1),
        workload("later", 1, GPU_CLAIM % "n1", at=5),
        cluster=cluster(16),
    )
    assert admitted(doc, "later") is None  # n1's eight GPUs are the planned workload's
    assert "claims" in pending(doc, "later")["message"]
