"""The plan records which devices each claim got, and the bind allocates those devices (issue 32): the
placement record carries them, a pod's claims get its planned devices while they still fit, and
only when they are taken are others chosen (counted as replanned)."""

from __future__ import annotations

import json
from typing import Any

from dra_states import admitted, schedule, template, workload
from gpuplane.core.plan import AdmissionDecision, PodPlacement, PodSetDecision, placement_annotation
from gpuplane.k8s.informer import Cache
from gpuplane.model import labels as keys
from gpuplane.model.dra import AllocatedDevice
from gpuplane.model.records import placement_record, recorded_claims, recorded_placement
from test_dra_claims import DRIVER, NS, FakeApi, allocation_status, claim, cluster, pod, writes

PLANNED = (
    (
        "gpus",
        (AllocatedDevice("gpus", DRIVER, "n1", "gpu-5"), AllocatedDevice("gpus", DRIVER, "n1", "gpu-6")),
    ),
)


def test_the_record_keeps_each_claims_devices_and_reads_back_as_before() -> None:
    text = placement_record({"main": [("n1", "", PLANNED), ("n0", "0,1")]})
    assert json.loads(text) == {
        "main": [
            ["n1", "", {"gpus": [["gpus", DRIVER, "n1", "gpu-5"], ["gpus", DRIVER, "n1", "gpu-6"]]}],
            ["n0", "0,1"],
        ]
    }
    assert recorded_placement(text) == {"main": [("n1", ""), ("n0", "0,1")]}
    assert recorded_claims(text) == {"main": [("n1", dict(PLANNED))]}
    assert recorded_claims('{"main": [["n1", "", {"gpus": [["only", "three", "parts"]]}]]}') == {}
    assert recorded_claims("not json") == {}


def test_the_admissions_annotation_records_the_planned_claims() -> None:
    decision = AdmissionDecision(
        "team/a", "q", (PodSetDecision("main", 1, {}, (PodPlacement("n1", (), 1, PLANNED),)),)
    )
    text = placement_annotation(decision)
    assert recorded_claims(text) == {"main": [("n1", dict(PLANNED))]}


def test_schedule_plans_claims_that_the_record_keeps() -> None:
    doc = schedule(
        template("two", "[{name: gpus, exactly: {deviceClassName: gpu.example.com, count: 2}}]"),
        workload("a", 2, "[{name: gpu, resourceClaimTemplateName: two}]"),
    )
    placement = admitted(doc, "a")
    assert placement is not None
    assert all(len(p["claims"]["gpu"]) == 2 for p in placement)


def _workload(record: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": NS, "annotations": {keys.PLACEMENT_ANNOTATION: record}},
        "spec": {"podSets": [{"name": "main", "count": 2}]},
    }


def _ours(p: dict[str, Any]) -> dict[str, Any]:
    p["metadata"]["labels"] = {keys.WORKLOAD_LABEL: "w", keys.PODSET_LABEL: "main"}
    return p


def _devices(api: FakeApi, name: str) -> list[str]:
    for _, sub, body in api.calls:
        if sub == "status" and body["metadata"]["name"] == name:
            return sorted(r["device"] for r in body["status"]["allocation"]["devices"]["results"])
    raise AssertionError(f"no status written for {name}")


def _claim_plan(*devices: str) -> dict[str, list[list[str]]]:
    return {"gpus": [["gpus", DRIVER, "n1", d] for d in devices]}


def test_the_bind_allocates_the_planned_devices() -> None:
    record = json.dumps(
        {"main": [["n1", "", _claim_plan("gpu-5", "gpu-6")], ["n1", "", _claim_plan("gpu-2", "gpu-7")]]}
    )
    api = FakeApi()
    cache = cluster(
        ("Workload", _workload(record)),
        ("ResourceClaim", claim("a-gpus", 2)),
        ("ResourceClaim", claim("b-gpus", 2)),
        ("Pod", _ours(pod("a", "a-gpus"))),
        ("Pod", _ours(pod("b", "b-gpus"))),
    )
    claims = writes(api, cache)
    before = claims.for_gang([(f"{NS}/a", "n1"), (f"{NS}/b", "n1")])
    assert before is not None
    assert before[f"{NS}/a"]()
    assert before[f"{NS}/b"]()
    # Each pod gets one of the planned sets, not the first free GPUs (gpu-0, gpu-1, ...).
    assert sorted([_devices(api, "a-gpus"), _devices(api, "b-gpus")]) == [
        ["gpu-2", "gpu-7"],
        ["gpu-5", "gpu-6"],
    ]
    assert claims.tools.counters.extra.get("replanned_devices", 0) == 0


def test_planned_devices_taken_meanwhile_are_chosen_again_and_counted() -> None:
    record = json.dumps({"main": [["n1", "", _claim_plan("gpu-5", "gpu-6")]]})
    held = claim(
        "other", 1, allocation=allocation_status([AllocatedDevice("gpus", DRIVER, "n1", "gpu-5")], "n1")
    )
    api = FakeApi()
    cache = cluster(
        ("Workload", _workload(record)),
        ("ResourceClaim", held),
        ("ResourceClaim", claim("a-gpus", 2)),
        ("Pod", _ours(pod("a", "a-gpus"))),
    )
    claims = writes(api, cache)
    before = claims.for_gang([(f"{NS}/a", "n1")])
    assert before is not None
    assert before[f"{NS}/a"]()
    got = _devices(api, "a-gpus")
    assert "gpu-5" not in got
    assert len(got) == 2
    assert claims.tools.counters.extra.get("replanned_devices", 0) == 1


def test_a_pod_without_a_recorded_plan_gets_devices_as_before() -> None:
    api = FakeApi()
    cache: Cache = cluster(("ResourceClaim", claim("a-gpus", 2)), ("Pod", pod("a", "a-gpus")))
    claims = writes(api, cache)
    before = claims.for_gang([(f"{NS}/a", "n0")])
    assert before is not None
    assert before[f"{NS}/a"]()
    assert _devices(api, "a-gpus") == ["gpu-0", "gpu-1"]
    assert claims.tools.counters.extra.get("replanned_devices", 0) == 0


ADMITTED = """
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata:
  name: planned
  namespace: team
  creationTimestamp: "2026-01-01T00:00:00Z"
  annotations: {gpuplane.dev/placement: '%s'}
spec:
  queueName: q
  podSets:
  - name: main
    count: 1
    template:
      spec:
        resourceClaims: [{name: gpu, resourceClaimTemplateName: four}]
        containers: [{name: c, resources: {requests: {cpu: "1"}}}]
status:
  admission:
    clusterQueue: q
    podSetAssignments:
    - {name: main, count: 1, flavors: {cpu: default}, resourceUsage: {cpu: "1"}}
  conditions:
  - {type: QuotaReserved, status: "True", reason: QuotaReserved, lastTransitionTime: "2026-01-01T00:00:00Z"}
  - {type: Admitted, status: "True", reason: Admitted, lastTransitionTime: "2026-01-01T00:00:00Z"}
"""


def test_a_rebuilt_session_holds_the_claim_devices_an_admitted_workload_was_planned() -> None:
    """An admitted workload whose pods are not bound yet holds the devices its record planned for
    its claims (gpu-4 to gpu-7 of n1), not the first free ones: the next workload is planned beside
    them, so the bind of each gets the devices planned."""
    later_gpus = ["gpu-4", "gpu-5", "gpu-6", "gpu-7"]
    planned = {"gpu": [["gpus", "gpu.example.com", "n1", d] for d in later_gpus]}
    record = json.dumps({"main": [["n1", "", planned]]})
    four = "[{name: gpus, exactly: {deviceClassName: gpu.example.com, count: 4}}]"
    doc = schedule(
        template("four", four),
        ADMITTED % record,
        workload("next", 1, "[{name: gpu, resourceClaimTemplateName: four}]", at=5),
    )
    (pod,) = admitted(doc, "next") or []
    assert pod["node"] == "n1"  # the tightest node: 4 of its 8 GPUs are planned
    assert sorted(d["device"] for d in pod["claims"]["gpu"]) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
