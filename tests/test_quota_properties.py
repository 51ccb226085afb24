"""Property tests: whatever the queues and workloads, quota is never exceeded.

The invariants are checked independently of the engine's accounting, from the
admitted workloads' requests alone, on a flat cohort:

* each ClusterQueue uses at most ``nominal + borrowingLimit`` (when a limit is set);
* what the queues use beyond the quota they keep to themselves (``nominal -
  lendingLimit``) fits in what they lend to the cohort, so lending limits hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.model.loader import load_state
from manifests import Manifest, cluster_queue, documents, local_queue, namespace, resource_flavor, workload


@dataclass(frozen=True)
class QueueSpec:
    nominal: int
    borrowing_limit: int | None
    lending_limit: int | None
    within: str
    reclaim: str


@dataclass(frozen=True)
class WorkloadSpec:
    queue: int
    cpu: int
    priority: int


queues = st.lists(
    st.builds(
        QueueSpec,
        nominal=st.integers(0, 10),
        borrowing_limit=st.none() | st.integers(0, 10),
        lending_limit=st.none() | st.integers(0, 10),
        within=st.sampled_from(["Never", "LowerPriority", "LowerOrNewerEqualPriority"]),
        reclaim=st.sampled_from(["Never", "LowerPriority", "Any"]),
    ),
    min_size=1,
    max_size=4,
)


def build(qs: list[QueueSpec], ws: list[WorkloadSpec], fair: bool) -> list[Manifest]:
    objects: list[Manifest] = [namespace("default"), resource_flavor("default")]
    if fair:
        config = Manifest("config.kueue.x-k8s.io/v1beta2", "Configuration", None).set(
            "fairSharing", {"enable": True}
        )
        config.body.pop("metadata")
        objects.append(config)
    for i, q in enumerate(qs):
        cq = cluster_queue(f"q{i}").cohort("c").flavor("default", cpu=str(q.nominal))
        res = "spec.resourceGroups[0].flavors[0].resources[0]"
        if q.borrowing_limit is not None:
            cq.set(f"{res}.borrowingLimit", str(q.borrowing_limit))
        if q.lending_limit is not None:
            cq.set(f"{res}.lendingLimit", str(min(q.lending_limit, q.nominal)))
        cq.set("spec.preemption", {"withinClusterQueue": q.within, "reclaimWithinCohort": q.reclaim})
        objects += [cq, local_queue(f"q{i}", "default", f"q{i}")]
    for j, w in enumerate(ws):
        objects.append(
            workload(f"w{j}")
            .queue(f"q{w.queue % len(qs)}")
            .priority(w.priority)
            .created(f"2026-01-01T00:00:{j:02d}Z")
            .podset(cpu=str(w.cpu))
        )
    return objects


def run(objects: list[Manifest], cycles: int | None) -> dict[str, Any]:
    state = load_state([("state.yaml", documents(*objects))])
    plan = schedule(state, config_from_kueue(state.configuration), default_now(state), cycles=cycles)
    return plan_document(plan, 0.0, 0.0)


def check_invariants(qs: list[QueueSpec], ws: list[WorkloadSpec], doc: dict[str, Any]) -> None:
    usage = [0] * len(qs)
    for a in doc["admitted"]:
        j = int(a["workload"].split("/w")[1])
        i = int(a["clusterQueue"][1:])
        assert i == ws[j].queue % len(qs)
        usage[i] += ws[j].cpu * a["podSets"][0]["count"]
    kept = []
    for i, q in enumerate(qs):
        lending = None if q.lending_limit is None else min(q.lending_limit, q.nominal)
        if q.borrowing_limit is not None:
            assert usage[i] <= q.nominal + q.borrowing_limit, f"q{i} exceeds nominal + borrowingLimit"
        kept.append(0 if lending is None else q.nominal - lending)
    beyond_kept = sum(max(0, u - k) for u, k in zip(usage, kept, strict=True))
    lendable = sum(q.nominal - k for q, k in zip(qs, kept, strict=True))
    assert beyond_kept <= lendable, "the cohort lends more than its queues allow"


workloads = st.lists(
    st.builds(WorkloadSpec, queue=st.integers(0, 3), cpu=st.integers(1, 8), priority=st.integers(0, 3)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None)
@given(qs=queues, ws=workloads, fair=st.booleans())
def test_quota_is_never_exceeded_after_draining(
    qs: list[QueueSpec], ws: list[WorkloadSpec], fair: bool
) -> None:
    check_invariants(qs, ws, run(build(qs, ws, fair), cycles=None))


@settings(max_examples=40, deadline=None)
@given(qs=queues, ws=workloads, fair=st.booleans())
def test_quota_is_never_exceeded_after_one_cycle(
    qs: list[QueueSpec], ws: list[WorkloadSpec], fair: bool
) -> None:
    check_invariants(qs, ws, run(build(qs, ws, fair), cycles=1))


@settings(max_examples=25, deadline=None)
@given(qs=queues, ws=workloads, fair=st.booleans())
def test_same_input_same_plan(qs: list[QueueSpec], ws: list[WorkloadSpec], fair: bool) -> None:
    objects = build(qs, ws, fair)
    assert run(objects, cycles=None) == run(objects, cycles=None)
