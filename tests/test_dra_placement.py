"""Placement of pods whose devices come from ResourceClaims, on state files (issue 32, item 3)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from dra_states import CLUSTER, admitted, claim, devices, pending, schedule, template, workload

ONE_GPU = "[{name: gpu, exactly: {deviceClassName: gpu.example.com}}]"
GPU_CLAIM = "[{name: gpu, resourceClaimTemplateName: %s}]"


ALL_H100 = (
    "[{name: gpus, exactly: {deviceClassName: gpu.example.com, allocationMode: All, selectors: "
    '[{cel: {expression: \'device.attributes["gpu.example.com"].productName == "H100"\'}}]}}]'
)


def selected(cls: str, cel: str, extra: str = "", name: str = "gpu") -> str:
    """One request of class ``cls`` with one CEL selector (and more fields in ``extra``)."""
    selectors = f"selectors: [{{cel: {{expression: '{cel}'}}}}]"
    return f"[{{name: {name}, exactly: {{deviceClassName: {cls}, {selectors}{extra}}}}}]"


def gpus(count: int) -> str:
    return f"[{{name: gpus, exactly: {{deviceClassName: gpu.example.com, count: {count}}}}}]"


def test_exact_count_gives_each_pod_its_own_devices_in_the_output_contract() -> None:
    doc = schedule(template("two", gpus(2)), workload("train", 3, GPU_CLAIM % "two"))
    placement = admitted(doc, "train")
    assert placement is not None
    assert len(placement) == 3
    first = placement[0]
    assert set(first) == {"node", "devices", "claims"}
    assert first["claims"]["gpu"][0] == {
        "request": "gpus",
        "driver": "gpu.example.com",
        "pool": "n1",
        "device": "gpu-0",
    }
    taken = [(p["node"], d) for p in placement for d in devices(p)]
    assert len(taken) == len(set(taken)) == 6


def test_the_cli_prints_the_claims_beside_node_and_devices(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(
        CLUSTER.read_text()
        + "\n---\n"
        + template("one", ONE_GPU)
        + "\n---\n"
        + workload("a", 1, GPU_CLAIM % "one")
    )
    out = subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", "schedule", "-f", str(state), "--output", "json"],
        capture_output=True,
        check=True,
        timeout=120,
    )
    (pod,) = json.loads(out.stdout)["admitted"][0]["podSets"][0]["placement"]
    assert pod["claims"] == {
        "gpu": [{"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": "gpu-0"}]
    }


def test_all_mode_takes_every_matching_device_of_one_node() -> None:
    doc = schedule(template("all", ALL_H100), workload("a", 2, GPU_CLAIM % "all"))
    placement = admitted(doc, "a")
    assert placement is not None
    assert {p["node"] for p in placement} == {"n1", "n2"}
    assert all(len(devices(p)) == 8 for p in placement)
    # A third pod asking for all H100s of a node finds none whole.
    doc = schedule(template("all", ALL_H100), workload("a", 3, GPU_CLAIM % "all"))
    assert admitted(doc, "a") is None


def test_first_available_is_tried_in_order() -> None:
    first = (
        "[{name: gpu, firstAvailable: ["
        "{name: big, deviceClassName: gpu.example.com, count: 8},"
        "{name: small, deviceClassName: gpu.example.com, count: 1}]}]"
    )
    doc = schedule(template("fa", first), workload("a", 3, GPU_CLAIM % "fa"))
    placement = admitted(doc, "a")
    assert placement is not None
    requests = [[d["request"] for d in p["claims"]["gpu"]] for p in placement]
    assert requests == [["gpu/big"] * 8, ["gpu/big"] * 8, ["gpu/small"]]


def test_match_attribute_keeps_a_claim_on_one_nvlink_domain() -> None:
    match = "[{matchAttribute: nvlink.example.com/domain}]"
    doc = schedule(
        template("one", ONE_GPU),
        workload("first", 1, GPU_CLAIM % "one"),
        template("four", gpus(4), match),
        workload("four", 1, GPU_CLAIM % "four", at=1),
    )
    (pod,) = admitted(doc, "four") or []
    # gpu-0 is taken, so domain n1-nvl0 holds 3: the four come from one domain (n1-nvl1).
    assert devices(pod) == ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    doc = schedule(template("five", gpus(5), match), workload("five", 1, GPU_CLAIM % "five"))
    assert admitted(doc, "five") is None
    assert "claims" in pending(doc, "five")["message"]


def test_distinct_attribute_spreads_a_claim_over_domains() -> None:
    doc = schedule(
        template("two", gpus(2), "[{distinctAttribute: nvlink.example.com/domain}]"),
        workload("a", 1, GPU_CLAIM % "two"),
    )
    (pod,) = admitted(doc, "a") or []
    assert devices(pod) == ["gpu-0", "gpu-4"]


def _mig(profile: str, count: int = 1) -> str:
    cel = f'device.attributes["gpu.example.com"].profile == "{profile}"'
    return selected("mig.example.com", cel, f", count: {count}", name="mig")


A100 = 'device.attributes["gpu.example.com"].productName == "A100"'


def test_partitions_consume_the_counters_of_their_gpu_and_never_overlap() -> None:
    doc = schedule(
        template("3g", _mig("3g.20gb")), workload("a", 3, "[{name: gpu, resourceClaimTemplateName: 3g}]")
    )
    assert admitted(doc, "a") is None  # two 3g partitions use all eight slices
    doc = schedule(
        template("3g", _mig("3g.20gb")),
        workload("a", 1, "[{name: gpu, resourceClaimTemplateName: 3g}]"),
        template("1g", _mig("1g.5gb")),
        workload("b", 5, "[{name: gpu, resourceClaimTemplateName: 1g}]", at=1),
    )
    (pod,) = admitted(doc, "a") or []
    assert devices(pod) == ["gpu-0-mig-3g-0"]
    assert admitted(doc, "b") is None  # slices 0-3 are the 3g's: four 1g fit, not five
    doc = schedule(
        template("3g", _mig("3g.20gb")),
        workload("a", 1, "[{name: gpu, resourceClaimTemplateName: 3g}]"),
        template("1g", _mig("1g.5gb")),
        workload("b", 3, "[{name: gpu, resourceClaimTemplateName: 1g}]", at=1),
        template("a100", selected("gpu.example.com", A100)),
        workload("whole", 1, GPU_CLAIM % "a100", at=2),
    )
    placed = admitted(doc, "b") or []
    assert sorted(d for p in placed for d in devices(p)) == [
        "gpu-0-mig-1g-4",
        "gpu-0-mig-1g-5",
        "gpu-0-mig-1g-6",
    ]
    assert admitted(doc, "whole") is None  # the whole GPU overlaps every partition


def test_consumable_capacity_shares_one_device() -> None:
    share = "[{name: gpu, exactly: {deviceClassName: shared.example.com}}]"
    doc = schedule(template("share", share), workload("a", 6, GPU_CLAIM % "share"))
    placement = admitted(doc, "a")
    assert placement is not None
    assert {(p["node"], devices(p)[0]) for p in placement} == {("n4", "gpu-0")}
    doc = schedule(template("share", share), workload("a", 7, GPU_CLAIM % "share"))
    assert admitted(doc, "a") is None  # 7 x 4Gi (the policy's default) > 24Gi
    big = (
        "[{name: gpu, exactly: {deviceClassName: shared.example.com, capacity: {requests: {memory: 12Gi}}}}]"
    )
    doc = schedule(template("big", big), workload("a", 2, GPU_CLAIM % "big"))
    assert admitted(doc, "a") is not None
    doc = schedule(template("big", big), workload("a", 3, GPU_CLAIM % "big"))
    assert admitted(doc, "a") is None
    too_big = (
        "[{name: gpu, exactly: {deviceClassName: shared.example.com, capacity: {requests: {memory: 30Gi}}}}]"
    )
    doc = schedule(template("huge", too_big), workload("a", 1, GPU_CLAIM % "huge"))
    assert admitted(doc, "a") is None


TAINTED = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n5-gpu.example.com}
spec:
  driver: gpu.example.com
  pool: {name: n5, generation: 1, resourceSliceCount: 1}
  nodeName: n5
  devices:
  - name: gpu-0
    attributes: {type: {string: gpu}, productName: {string: B200}}
    taints: [{key: example.com/unhealthy, value: ecc, effect: NoSchedule}]
"""
B200 = 'device.attributes["gpu.example.com"].productName == "B200"'


def test_a_tainted_device_goes_only_to_a_request_that_tolerates_it() -> None:
    plain = selected("gpu.example.com", B200)
    tolerance = ", tolerations: [{key: example.com/unhealthy, operator: Exists, effect: NoSchedule}]"
    tolerant = selected("gpu.example.com", B200, tolerance)
    doc = schedule(TAINTED, template("plain", plain), workload("a", 1, GPU_CLAIM % "plain"))
    assert admitted(doc, "a") is None
    doc = schedule(TAINTED, template("tolerant", tolerant), workload("a", 1, GPU_CLAIM % "tolerant"))
    (pod,) = admitted(doc, "a") or []
    assert (pod["node"], devices(pod)) == ("n5", ["gpu-0"])
    told = TAINTED.replace("effect: NoSchedule", "effect: None")
    doc = schedule(told, template("plain", plain), workload("a", 1, GPU_CLAIM % "plain"))
    assert admitted(doc, "a") is not None  # a taint with effect None only informs


def test_a_shared_claim_is_allocated_once_for_all_its_pods() -> None:
    doc = schedule(
        claim("shared", gpus(2)),
        workload("a", 3, "[{name: gpu, resourceClaimName: shared}]"),
        template("eight", gpus(8)),
        workload("b", 1, GPU_CLAIM % "eight", at=1),
    )
    placement = admitted(doc, "a")
    assert placement is not None
    assert {(p["node"], tuple(devices(p))) for p in placement} == {("n1", ("gpu-0", "gpu-1"))}
    (pod,) = admitted(doc, "b") or []
    assert pod["node"] == "n2"  # n1 has 6 free: the claim took two devices, not six


def test_an_allocated_claim_in_the_input_holds_its_devices_and_draws_its_pods() -> None:
    status = """status:
  allocation:
    devices:
      results:
      - {request: gpus, driver: gpu.example.com, pool: n2, device: gpu-3}"""
    doc = schedule(
        claim("mine", gpus(1), status),
        workload("a", 2, "[{name: gpu, resourceClaimName: mine}]"),
        template("all", ALL_H100),
        workload("b", 2, GPU_CLAIM % "all", at=1),
    )
    placement = admitted(doc, "a")
    assert placement is not None
    assert {p["node"] for p in placement} == {"n2"}
    assert admitted(doc, "b") is None  # gpu-3 of n2 is held: no second node has all its GPUs free


def test_a_gang_is_placed_whole_or_holds_nothing() -> None:
    doc = schedule(
        template("eight", gpus(8)),
        workload("big", 3, GPU_CLAIM % "eight"),
        template("two", gpus(2)),
        workload("small", 8, GPU_CLAIM % "two", at=1),
    )
    assert admitted(doc, "big") is None
    assert "3 pods" in pending(doc, "big")["message"]
    assert len(admitted(doc, "small") or []) == 8


def test_tightest_node_first_keeps_whole_nodes_free() -> None:
    doc = schedule(
        template("six", gpus(6)),
        workload("a", 1, GPU_CLAIM % "six"),
        template("two", gpus(2)),
        workload("b", 1, GPU_CLAIM % "two", at=1),
        template("eight", gpus(8)),
        workload("c", 1, GPU_CLAIM % "eight", at=2),
    )
    assert [p["node"] for p in admitted(doc, "a") or []] == ["n1"]
    assert [p["node"] for p in admitted(doc, "b") or []] == ["n1"]
    assert [p["node"] for p in admitted(doc, "c") or []] == ["n2"]


def test_a_required_topology_keeps_the_gang_in_one_rack() -> None:
    annotations = "{kueue.x-k8s.io/podset-required-topology: example.com/rack}"
    doc = schedule(
        template("six", gpus(6)),
        workload("a", 1, GPU_CLAIM % "six"),
        template("four", gpus(4)),
        workload("gang", 2, GPU_CLAIM % "four", at=1, annotations=annotations),
    )
    # Rack r1 (n1, n3) has 2 GPUs left on n1: the gang goes to rack r2, both pods on n2.
    assert [p["node"] for p in admitted(doc, "gang") or []] == ["n2", "n2"]


def test_extended_resources_and_claims_schedule_in_one_run() -> None:
    doc = schedule(
        workload("ext", 1, "[]", gpus=8),
        template("one", ONE_GPU),
        workload("dra", 1, GPU_CLAIM % "one", at=1),
    )
    (ext,) = admitted(doc, "ext") or []
    assert (ext["node"], len(ext["devices"]), "claims" in ext) == ("n5", 8, False)
    (dra,) = admitted(doc, "dra") or []
    assert dra["node"] == "n1"
    assert devices(dra) == ["gpu-0"]


def test_a_cel_error_is_a_pending_reason_naming_the_class_and_expression() -> None:
    broken = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: broken.example.com}
spec:
  selectors:
  - cel: {expression: 'device.attributes["gpu.example.com"].nosuch > 1'}
"""
    bad_request = "[{name: gpu, exactly: {deviceClassName: broken.example.com}}]"
    doc = schedule(
        broken,
        template("bad", bad_request),
        workload("bad", 1, GPU_CLAIM % "bad"),
        template("one", ONE_GPU),
        workload("good", 1, GPU_CLAIM % "one", at=1),
    )
    why = pending(doc, "bad")
    assert why["reason"] == "Misconfigured"
    assert "DeviceClass broken.example.com" in why["message"]
    assert 'device.attributes["gpu.example.com"].nosuch > 1' in why["message"]
    assert admitted(doc, "good") is not None


def test_a_missing_class_or_template_is_a_pending_reason_naming_it() -> None:
    doc = schedule(
        template("nocls", "[{name: gpu, exactly: {deviceClassName: nosuch.example.com}}]"),
        workload("a", 1, GPU_CLAIM % "nocls"),
        workload("b", 1, GPU_CLAIM % "nosuch"),
    )
    assert "DeviceClass nosuch.example.com not found" in pending(doc, "a")["message"]
    assert "ResourceClaimTemplate team/nosuch not found" in pending(doc, "b")["message"]
