"""ClusterQueue and LocalQueue status as Kueue writes it (gpuplane.k8s.queue_status), without a server."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from gpuplane.k8s.informer import Cache
from gpuplane.k8s.queue_status import (
    QueueObjects,
    QueueStatusWrite,
    cluster_queue_active,
    queue_status_writes,
)
from manifests import Manifest, cluster_queue, local_queue, resource_flavor, workload

NOW = "2025-01-01T00:00:00Z"
LATER = "2025-01-01T01:00:00Z"


def _admitted(name: str, gpus: int, *, admitted: bool = True, finished: bool = False) -> Manifest:
    built = (
        workload(name, "team-a")
        .queue("lq")
        .podset(count=gpus, gpu=1)
        .admitted(
            "cq",
            {
                "name": "main",
                "count": gpus,
                "flavors": {"nvidia.com/gpu": "h100"},
                "resourceUsage": {"nvidia.com/gpu": str(gpus)},
            },
        )
    )
    conditions = [{"type": "QuotaReserved", "status": "True"}]
    if admitted:
        conditions.append({"type": "Admitted", "status": "True"})
    if finished:
        conditions.append({"type": "Finished", "status": "True"})
    return built.set("status.conditions", conditions)


def _pending(name: str, *, active: bool = True) -> Manifest:
    built = workload(name, "team-a").queue("lq").podset(count=1, gpu=1)
    return built if active else built.set("spec.active", False)


def _writes(
    cqs: list[Manifest],
    lqs: list[Manifest],
    wls: list[Manifest],
    flavors: tuple[str, ...] = ("h100",),
    now: str = NOW,
) -> dict[str, QueueStatusWrite]:
    objects = QueueObjects(
        cluster_queues=[c.to_dict() for c in cqs],
        local_queues=[q.to_dict() for q in lqs],
        workloads=[w.to_dict() for w in wls],
        flavors=[resource_flavor(f).to_dict() for f in flavors],
    )
    writes = queue_status_writes(objects, now)
    return {f"{w.kind}/{w.key}": w for w in writes}


def _cq() -> Manifest:
    return cluster_queue("cq").flavor("h100", **{"nvidia.com/gpu": 8})


def _active(status: Mapping[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Active")


def test_counts_and_usage_of_both_queues() -> None:
    wls = [
        _admitted("a", 4),
        _admitted("b", 6, admitted=False),  # quota reserved, checks pending
        _admitted("done", 2, finished=True),  # finished: counts nowhere
        _pending("p1"),
        _pending("p2"),
        _pending("off", active=False),  # deactivated: not pending
    ]
    writes = _writes([_cq()], [local_queue("lq", "team-a", "cq")], wls)
    cq = writes["ClusterQueue/cq"].status
    assert (cq["pendingWorkloads"], cq["reservingWorkloads"], cq["admittedWorkloads"]) == (2, 2, 1)
    assert cq["flavorsReservation"] == [
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "10", "borrowed": "2"}]}
    ]
    assert cq["flavorsUsage"] == [
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "4", "borrowed": "0"}]}
    ]
    assert _active(cq) | {"lastTransitionTime": "x"} == {
        "type": "Active",
        "status": "True",
        "reason": "Ready",
        "message": "Can admit new workloads",
        "lastTransitionTime": "x",
    }
    lq = writes["LocalQueue/team-a/lq"].status
    assert (lq["pendingWorkloads"], lq["reservingWorkloads"], lq["admittedWorkloads"]) == (2, 2, 1)
    assert lq["flavorsReservation"] == [
        {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "10"}]}
    ]
    assert lq["flavorsUsage"] == [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "4"}]}]
    assert _active(lq)["reason"] == "Ready"


@pytest.mark.parametrize(
    ("cq", "flavors", "want_reason", "want_message"),
    [
        pytest.param(_cq(), ("h100",), "Ready", "Can admit new workloads", id="ready"),
        pytest.param(
            cluster_queue("cq")
            .flavor("h100", **{"nvidia.com/gpu": 8})
            .flavor("a100", **{"nvidia.com/gpu": 8}),
            ("h100",),
            "FlavorNotFound",
            "Can't admit new workloads: references missing ResourceFlavor(s): a100.",
            id="missing-flavor",
        ),
        pytest.param(
            _cq().set("spec.stopPolicy", "Hold"),
            (),
            "Stopped",
            "Can't admit new workloads: is stopped, references missing ResourceFlavor(s): h100.",
            id="stopped-first-then-every-reason",
        ),
        pytest.param(
            _cq().set("spec.admissionChecks", ["prov"]),
            ("h100",),
            "AdmissionCheckNotFound",
            "Can't admit new workloads: references missing AdmissionCheck(s): prov.",
            id="missing-check",
        ),
        pytest.param(
            _cq().set("metadata.deletionTimestamp", NOW),
            ("h100",),
            "Terminating",
            "Can't admit new workloads; clusterQueue is terminating",
            id="terminating",
        ),
    ],
)
def test_active_condition_reason(
    cq: Manifest, flavors: tuple[str, ...], want_reason: str, want_message: str
) -> None:
    by_name = {f: resource_flavor(f).to_dict() for f in flavors}
    active, reason, message = cluster_queue_active(cq.to_dict(), by_name, [], [])
    assert (active, reason, message) == (want_reason == "Ready", want_reason, want_message)


def test_topology_of_a_flavor_must_exist() -> None:
    flavor = resource_flavor("h100").set("spec.topologyName", "racks").to_dict()
    assert cluster_queue_active(_cq().to_dict(), {"h100": flavor}, [], [])[1] == "TopologyNotFound"
    assert cluster_queue_active(_cq().to_dict(), {"h100": flavor}, ["racks"], [])[1] == "Ready"


@pytest.mark.parametrize(
    ("lq", "cqs", "flavors", "want_reason"),
    [
        pytest.param(local_queue("lq", "team-a", "cq"), [_cq()], ("h100",), "Ready", id="ready"),
        pytest.param(
            local_queue("lq", "team-a", "gone"), [_cq()], ("h100",), "ClusterQueueDoesNotExist", id="no-cq"
        ),
        pytest.param(
            local_queue("lq", "team-a", "cq"), [_cq()], (), "ClusterQueueIsInactive", id="cq-inactive"
        ),
        pytest.param(
            local_queue("lq", "team-a", "cq").set("spec.stopPolicy", "Hold"),
            [_cq()],
            ("h100",),
            "Stopped",
            id="stopped",
        ),
    ],
)
def test_local_queue_active_follows_its_cluster_queue(
    lq: Manifest, cqs: list[Manifest], flavors: tuple[str, ...], want_reason: str
) -> None:
    status = _writes(cqs, [lq], [], flavors)["LocalQueue/team-a/lq"].status
    assert _active(status)["reason"] == want_reason
    assert _active(status)["status"] == ("True" if want_reason == "Ready" else "False")


def test_no_write_when_nothing_changed_and_transition_time_kept() -> None:
    cq, lq, wls = _cq(), local_queue("lq", "team-a", "cq"), [_admitted("a", 4), _pending("p")]
    first = _writes([cq], [lq], wls)
    assert set(first) == {"ClusterQueue/cq", "LocalQueue/team-a/lq"}
    # The server now shows what was written: a later pass writes nothing.
    cq.set("status", first["ClusterQueue/cq"].status)
    lq.set("status", first["LocalQueue/team-a/lq"].status)
    assert _writes([cq], [lq], wls, now=LATER) == {}
    # A new pending workload changes the counts; the Active condition keeps its time.
    again = _writes([cq], [lq], [*wls, _pending("q")], now=LATER)
    assert again["ClusterQueue/cq"].status["pendingWorkloads"] == 2
    assert _active(again["ClusterQueue/cq"].status)["lastTransitionTime"] == NOW
    # Losing its flavor flips Active, with a new transition time.
    lost = _writes([cq], [lq], wls, flavors=(), now=LATER)
    assert _active(lost["ClusterQueue/cq"].status) | {"message": ""} == {
        "type": "Active",
        "status": "False",
        "reason": "FlavorNotFound",
        "message": "",
        "lastTransitionTime": LATER,
    }


def test_a_status_write_of_a_queue_is_not_noted_as_a_change() -> None:
    cache = Cache()
    cq = _cq().to_dict() | {"metadata": {"name": "cq", "resourceVersion": "1"}}
    cache.upsert("ClusterQueue", cq)
    cache.take_changes()
    cache.changed.clear()
    cache.upsert(
        "ClusterQueue", {**cq, "metadata": {"name": "cq", "resourceVersion": "2"}, "status": {"x": 1}}
    )
    assert cache.take_changes() == {}
    assert not cache.changed.is_set()
    assert cache.get("ClusterQueue", "cq")["status"] == {"x": 1}  # type: ignore[index]
    cache.upsert("ClusterQueue", {**cq, "metadata": {"name": "cq", "resourceVersion": "3"}, "spec": {}})
    assert cache.take_changes() == {"ClusterQueue": {"cq"}}
