"""Pods of a running workload that ended and will not run again (Kueue's ``status.reclaimablePods``):
parsed, counted out of the workload's quota and devices by the core, and derived from a batch Job."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.k8s.integrations import reclaimable_pods
from gpuplane.model.errors import InputError
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from gpuplane.model.loader import state_from_objects
from manifests import GPU, Manifest, cluster_queue, local_queue, node, resource_flavor, workload

FLAVOR = "h100"


def _objects(reclaimable: list[dict[str, Any]] | None, *, nodes: bool) -> list[dict[str, Any]]:
    running = (
        workload("trio", "team")
        .queue("q")
        .created("2026-01-01T00:00:00Z")
        .podset("main", 2, **{GPU: 4})
        .admitted("cq", {"name": "main", "count": 2, "flavors": {GPU: FLAVOR}, "resourceUsage": {GPU: "8"}})
    )
    if reclaimable is not None:
        running.set("status.reclaimablePods", reclaimable)
    if nodes:  # the plan recorded at admission: both pods on n0, devices 0-3 and 4-7
        plan = '{"main": [["n0", "0,1,2,3"], ["n0", "4,5,6,7"]]}'
        running.body["metadata"]["annotations"] = {PLACEMENT_ANNOTATION: plan}
    waiting = (
        workload("waiter", "team").queue("q").created("2026-01-01T00:01:00Z").podset("main", 1, **{GPU: 4})
    )
    objects: list[Manifest] = [
        Manifest("v1", "Namespace", "team"),
        resource_flavor(FLAVOR),
        cluster_queue("cq").flavor(FLAVOR, **{GPU: 8}),
        local_queue("q", "team", "cq"),
        running,
        waiting,
    ]
    if nodes:
        objects.append(node("n0").allocatable(cpu="64", memory="512Gi", pods="110", gpu=8))
    return [o.to_dict() for o in objects]


def _admitted(objects: list[dict[str, Any]]) -> list[str]:
    state = state_from_objects(objects)
    plan = schedule(state, config_from_kueue(state.configuration), 1.8e9, cycles=None)
    return [d.workload for d in plan.admitted]


@pytest.mark.parametrize("nodes", [False, True], ids=["quota-only", "with-placement"])
def test_a_reclaimable_pod_gives_its_quota_and_devices_to_the_next_workload(nodes: bool) -> None:
    assert _admitted(_objects(None, nodes=nodes)) == [], "8 of 8 GPUs held: nothing fits"
    assert _admitted(_objects([{"name": "main", "count": 0}], nodes=nodes)) == []
    assert _admitted(_objects([{"name": "main", "count": 1}], nodes=nodes)) == ["team/waiter"]


def test_reclaimable_pods_are_parsed_and_checked() -> None:
    state = state_from_objects(_objects([{"name": "main", "count": 5}], nodes=False))
    trio = next(w for w in state.workloads if w.name == "trio")
    assert dict(trio.reclaimable) == {"main": 2}, "never more than the pod set's count"
    with pytest.raises(InputError, match=r"reclaimablePods\[0\]\.name"):
        state_from_objects(_objects([{"name": "other", "count": 1}], nodes=False))
    with pytest.raises(InputError, match=r"reclaimablePods\[0\]\.count"):
        state_from_objects(_objects([{"name": "main", "count": -1}], nodes=False))


def _job(parallelism: int | None, completions: int | None, succeeded: int) -> dict[str, Any]:
    spec: dict[str, Any] = {"template": {"spec": {"containers": [{"name": "c"}]}}}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    return {"metadata": {"name": "j", "namespace": "ns"}, "spec": spec, "status": {"succeeded": succeeded}}


@pytest.mark.parametrize(
    ("parallelism", "completions", "succeeded", "expected"),
    [
        (1, 3, 2, {}),  # one pod at a time: nothing to give back
        (2, 3, 0, {}),  # nothing succeeded yet
        (2, 3, 1, {}),  # two completions left, two pods still needed
        (2, 3, 2, {"main": 1}),  # one completion left: one of two pods will not run again
        (4, 4, 3, {"main": 3}),
        (4, None, 1, {"main": 1}),  # no completions: counted against the parallelism, as Kueue does
    ],
)
def test_a_batch_job_reports_the_pods_it_will_not_run_again(
    parallelism: int | None, completions: int | None, succeeded: int, expected: dict[str, int]
) -> None:
    assert reclaimable_pods("Job", _job(parallelism, completions, succeeded)) == expected
    assert reclaimable_pods("JobSet", _job(parallelism, completions, succeeded)) == {}
