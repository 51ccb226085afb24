"""The controller's ResourceClaim writes without an API server: what a pod's claims get at bind time,
in which order they are written, and how an ended pod's claim is released (upstream semantics).

The end-to-end run is tests/test_dra_e2e.py (a real control plane only: the double serves no
``resource.k8s.io``); there kube-controller-manager often releases a claim first, so the
controller's own release path is checked here.
"""

from __future__ import annotations

from typing import Any

from gpuplane.k8s.api import ApiError, Resource
from gpuplane.k8s.dra_claims import PROTECTION, ClaimWrites, allocation_status, pod_claims
from gpuplane.k8s.informer import Cache
from gpuplane.k8s.worklist import Worklist
from gpuplane.k8s.writing import Counters, Tools
from gpuplane.model.dra import AllocatedDevice

DRIVER = "gpu.example.com"
NS = "team"


class FakeApi:
    """Answers replace() with the body and a newer resourceVersion; records every call."""

    def __init__(self, refuse: set[str] | None = None) -> None:
        self.calls: list[tuple[str, str | None, dict[str, Any]]] = []
        self.refuse = refuse or set()
        self.version = 100

    def replace(self, res: Resource, body: dict[str, Any], sub: str | None = None) -> dict[str, Any]:
        self.calls.append((res.plural, sub, body))
        if (sub or "") in self.refuse:
            raise ApiError(409, "Conflict", "changed meanwhile")
        self.version += 1
        return {**body, "metadata": {**body["metadata"], "resourceVersion": str(self.version)}}


def writes(api: FakeApi, cache: Cache) -> ClaimWrites:
    tools = Tools(
        api,  # type: ignore[arg-type]  # the fake answers the one call the writes make
        cache,
        Worklist(()),
        Counters(),
        lambda: 0.0,
        lambda fns: [fn() for fn in fns],  # type: ignore[arg-type,func-returns-value]
        lambda *_: None,
        lambda _why: None,
    )
    return ClaimWrites(tools, served=True)


def node(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {}},
    }


def gpu_slice(node_name: str, count: int) -> dict[str, Any]:
    return {
        "metadata": {"name": f"{node_name}-gpus"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node_name,
            "pool": {"name": node_name, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}"} for i in range(count)],
        },
    }


def claim(name: str, count: int, **status: Any) -> dict[str, Any]:
    request = {"name": "gpus", "exactly": {"deviceClassName": "gpu", "count": count}}
    return {
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "5"},
        "spec": {"devices": {"requests": [request]}},
        "status": status,
    }


def pod(name: str, claim_name: str | None, *, phase: str = "Pending") -> dict[str, Any]:
    statuses = [{"name": "gpus", "resourceClaimName": claim_name}] if claim_name else []
    return {
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}"},
        "spec": {
            "schedulerName": "gpuplane",
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight"}],
        },
        "status": {"phase": phase, "resourceClaimStatuses": statuses},
    }


def cluster(*objects: tuple[str, dict[str, Any]]) -> Cache:
    cache = Cache()
    base = [
        ("Node", node("n0")),
        ("Node", node("n1")),
        ("ResourceSlice", gpu_slice("n0", 8)),
        ("ResourceSlice", gpu_slice("n1", 8)),
        ("DeviceClass", {"metadata": {"name": "gpu"}, "spec": {}}),
    ]
    for kind, obj in [*base, *objects]:
        cache.upsert(kind, obj)
    return cache


def test_a_pods_claim_names_come_from_the_spec_or_the_status() -> None:
    shared = {"spec": {"resourceClaims": [{"name": "a", "resourceClaimName": "shared"}, {"name": "b"}]}}
    assert pod_claims(shared) == [("a", "shared"), ("b", None)]
    assert pod_claims(pod("p", "p-gpus-x")) == [("gpus", "p-gpus-x")]
    assert pod_claims({"spec": {}}) == []


def test_the_allocation_names_each_device_and_the_node() -> None:
    status = allocation_status([AllocatedDevice("gpus", DRIVER, "n0", "gpu-3")], "n0")
    assert status["devices"]["results"] == [
        {"request": "gpus", "driver": DRIVER, "pool": "n0", "device": "gpu-3"}
    ]
    term = status["nodeSelector"]["nodeSelectorTerms"][0]
    assert term == {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n0"]}]}


def test_claims_are_allocated_on_the_pods_node_finalizer_first_then_status() -> None:
    api = FakeApi()
    cache = cluster(
        ("ResourceClaim", claim("a-gpus", 8)),
        ("ResourceClaim", claim("b-gpus", 8)),
        ("Pod", pod("a", "a-gpus")),
        ("Pod", pod("b", "b-gpus")),
    )
    claims = writes(api, cache)
    before = claims.for_gang([(f"{NS}/a", "n0"), (f"{NS}/b", "n1")])
    assert before is not None
    assert set(before) == {f"{NS}/a", f"{NS}/b"}
    assert before[f"{NS}/a"]()
    assert before[f"{NS}/b"]()
    assert [(plural, sub) for plural, sub, _ in api.calls] == [
        ("resourceclaims", None),
        ("resourceclaims", "status"),
    ] * 2
    finalizer, status = api.calls[0][2], api.calls[1][2]
    assert finalizer["metadata"]["finalizers"] == [PROTECTION]
    results = status["status"]["allocation"]["devices"]["results"]
    assert sorted(r["device"] for r in results) == [f"gpu-{i}" for i in range(8)]
    assert {r["pool"] for r in results} == {"n0"}
    assert status["status"]["reservedFor"] == [{"resource": "pods", "name": "a", "uid": "uid-a"}]


def test_held_devices_are_never_handed_out_again_and_a_gang_waits_whole() -> None:
    # n0's GPUs are held by a claim allocated before (read back after a restart).
    held = claim(
        "old",
        8,
        allocation=allocation_status(
            [AllocatedDevice("gpus", DRIVER, "n0", f"gpu-{i}") for i in range(8)], "n0"
        ),
    )
    api = FakeApi()
    cache = cluster(
        ("ResourceClaim", held),
        ("ResourceClaim", claim("a-gpus", 8)),
        ("ResourceClaim", claim("b-gpus", 1)),
        ("Pod", pod("a", "a-gpus")),
        ("Pod", pod("b", "b-gpus")),
    )
    claims = writes(api, cache)
    assert claims.for_gang([(f"{NS}/b", "n1"), (f"{NS}/a", "n0")]) is None
    assert api.calls == [], "nothing of a gang that waits is written"
    assert not cache.assumed, "nothing of a gang that waits is assumed"
    assert claims.for_gang([(f"{NS}/a", "n1")]) is not None
    # A claim not made yet (kube-controller-manager has not got to it) waits too.
    cache.upsert("Pod", pod("c", None))
    assert claims.for_gang([(f"{NS}/c", "n1")]) is None


def test_a_refused_claim_write_leaves_the_pod_unbound_and_nothing_assumed() -> None:
    api = FakeApi(refuse={"status"})
    cache = cluster(("ResourceClaim", claim("a-gpus", 1)), ("Pod", pod("a", "a-gpus")))
    claims = writes(api, cache)
    before = claims.for_gang([(f"{NS}/a", "n0")])
    assert before is not None
    assert before[f"{NS}/a"]() is False
    assert not cache.assumed
    assert claims.tools.counters.write_failures == 1


def test_an_ended_pod_leaves_reserved_for_and_an_unreserved_claim_is_deallocated() -> None:
    allocation = allocation_status([AllocatedDevice("gpus", DRIVER, "n0", "gpu-0")], "n0")
    ref = {"resource": "pods", "name": "done", "uid": "uid-done"}
    other = {"resource": "pods", "name": "running", "uid": "uid-running"}
    shared = claim("shared", 1, allocation=allocation, reservedFor=[ref, other])
    own = claim("own", 1, allocation=allocation, reservedFor=[ref])
    own["metadata"]["finalizers"] = [PROTECTION]
    api = FakeApi()
    cache = cluster(
        ("ResourceClaim", shared),
        ("ResourceClaim", own),
        ("Pod", pod("done", "own", phase="Succeeded")),
        ("Pod", pod("running", "shared", phase="Running")),
    )
    writes(api, cache).release_ended()
    by_claim: dict[str, list[tuple[str | None, dict[str, Any]]]] = {}
    for _, sub, body in api.calls:
        by_claim.setdefault(body["metadata"]["name"], []).append((sub, body))
    ((sub, body),) = by_claim["shared"]
    assert sub == "status"
    assert body["status"]["reservedFor"] == [other]
    assert body["status"]["allocation"] == allocation, "a claim still in use keeps its allocation"
    (status, meta) = by_claim["own"]
    assert status[0] == "status"
    assert "allocation" not in status[1]["status"]
    assert not status[1]["status"].get("reservedFor")
    assert meta[0] is None
    assert PROTECTION not in meta[1]["metadata"].get("finalizers", [])
    # A pod that is not gpuplane's is left to its own scheduler.
    api.calls.clear()
    stranger = pod("done", "own", phase="Succeeded")
    stranger["spec"]["schedulerName"] = "default-scheduler"
    cache.upsert("Pod", stranger)
    writes(api, cache).release_ended()
    assert all(body["metadata"]["name"] != "own" for _, _, body in api.calls)


def test_a_claim_written_before_a_restart_is_not_written_again_and_keeps_its_devices() -> None:
    # The claim was allocated and reserved for the pod, then the controller stopped before the Binding.
    ref = {"resource": "pods", "name": "a", "uid": "uid-a"}
    devices = [AllocatedDevice("gpus", DRIVER, "n0", f"gpu-{i}") for i in range(2)]
    done = claim("a-gpus", 2, allocation=allocation_status(devices, "n0"), reservedFor=[ref])
    api = FakeApi()
    cache = cluster(("ResourceClaim", done), ("Pod", pod("a", "a-gpus")))
    claims = writes(api, cache)
    assert claims.for_gang([(f"{NS}/a", "n0")]) == {}, "nothing to write: the Binding follows at once"
    assert api.calls == []
    # Planned on a node its devices are not reachable from: the pod waits, nothing else is written.
    claims.release_ended()  # a new pass
    assert claims.for_gang([(f"{NS}/a", "n1")]) is None
    assert api.calls == []
