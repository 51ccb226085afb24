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

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import manifests
from calls import count_calls
from gpuplane.cli.schedule import default_now, plan_document
from gpuplane.core.config import config_from_kueue
from gpuplane.core.flavors import FIT, PREEMPT
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.quota import AdmittedWorkload, QuotaTree
from gpuplane.core.scheduler import Scheduler, schedule
from gpuplane.core.scheduling.state import Entry
from gpuplane.core.scheduling.waker import Waker
from gpuplane.core.session import Session
from gpuplane.core.workloads import PendingWorkload
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


def build(qs: list[QueueSpec], ws: list[WorkloadSpec], fair: bool, memory: bool = False) -> list[Manifest]:
    """The queues in cohort ``c`` and the workloads; with ``memory``, every workload also asks
    1Gi of memory, of which each queue has plenty (a second resource that always fits)."""
    objects: list[Manifest] = [namespace("default"), resource_flavor("default")]
    if fair:
        config = Manifest("config.kueue.x-k8s.io/v1beta2", "Configuration", None).set(
            "fairSharing", {"enable": True}
        )
        config.body.pop("metadata")
        objects.append(config)
    for i, q in enumerate(qs):
        quotas = {"cpu": str(q.nominal)} | ({"memory": "1Ti"} if memory else {})
        cq = cluster_queue(f"q{i}").cohort("c").flavor("default", **quotas)
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
            .podset(cpu=str(w.cpu), **({"memory": "1Gi"} if memory else {}))
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


@dataclass(frozen=True)
class Removal:
    queue: int
    amount: int


@settings(max_examples=80, deadline=None)
@given(
    qs=queues,
    nested=st.booleans(),
    used=st.lists(st.integers(0, 12), min_size=4, max_size=4),
    removals=st.lists(st.builds(Removal, queue=st.integers(0, 3), amount=st.integers(1, 6)), max_size=5),
)
def test_removing_usage_raises_headroom_by_at_most_what_is_removed(
    qs: list[QueueSpec], nested: bool, used: list[int], removals: list[Removal]
) -> None:
    """The bound the preemption search's necessary condition rests on: taking x of a resource
    away from any queues, anywhere in the cohort tree, raises every queue's headroom by x at
    most (lending and borrowing limits only hold it back). And a queue's own usage falls by
    exactly what is taken from it (the bound of a search that may not borrow)."""
    objects = build(qs, [], fair=False)
    if nested:  # the last queue sits in a child cohort with a quota of its own
        own = [{"name": "default", "resources": [{"name": "cpu", "nominalQuota": "3"}]}]
        sub = manifests.cohort("sub", parent="c").set(
            "spec.resourceGroups", [{"coveredResources": ["cpu"], "flavors": own}]
        )
        objects += [manifests.cohort("c"), sub]
        for m in objects:
            if m.body["kind"] == "ClusterQueue" and m.body["metadata"]["name"] == f"q{len(qs) - 1}":
                m.body["spec"]["cohortName"] = "sub"
    tree = QuotaTree(load_state([("state.yaml", documents(*objects))]))
    fr = ("default", "cpu")
    nodes = [tree.queues[f"q{i}"] for i in range(len(qs))]
    for node, amount in zip(nodes, used, strict=False):
        node.add_usage(fr, amount * 1000)
    before = [node.available(fr) for node in nodes]
    usage_before = [node.usage.get(fr, 0) for node in nodes]
    taken = 0
    taken_from = [0] * len(nodes)
    for r in removals:
        node = nodes[r.queue % len(nodes)]
        amount = min(r.amount * 1000, node.usage.get(fr, 0))
        node.remove_usage(fr, amount)
        taken += amount
        taken_from[r.queue % len(nodes)] += amount
    after = [node.available(fr) for node in nodes]
    for b, a in zip(before, after, strict=True):
        assert b <= a <= b + taken
    for node, was, gone in zip(nodes, usage_before, taken_from, strict=True):
        assert node.usage.get(fr, 0) == was - gone


class _Forgetful(set[tuple[str, str, tuple[str, str], int]]):
    """A preemptor's record of searches that found no room, which never recalls one."""

    def __contains__(self, item: object) -> bool:
        return False


def searches(objects: list[Manifest], *, recall: bool) -> tuple[dict[str, Any], int]:
    """The plan, and how many preemption searches got as far as their necessary condition;
    without ``recall``, a search that found no room is run again when asked again."""
    original_clear = Preemptor.clear_cache

    def clear(self: Preemptor) -> None:
        original_clear(self)
        if not recall:
            self._no_room = _Forgetful()

    with pytest.MonkeyPatch.context() as patch:
        calls = count_calls(patch, Preemptor, "could_fit")
        patch.setattr(Preemptor, "clear_cache", clear)
        # The flavor assignment's memoised search may answer the assignment's outright; left
        # out here, so that what is counted is the record of searches that found no room.
        patch.setattr(Preemptor, "_alone", lambda _self, _ctx: None)
        plan = run(objects, cycles=None)
    return plan, calls["count"]


def test_a_search_that_found_no_room_for_a_flavor_is_not_run_again_for_the_assignment() -> None:
    # q0 (nominal 2) runs a workload of 4 CPUs at priority 5, borrowing 2 of q1's; q1 (nominal 4)
    # may reclaim only from lower priorities, and its workload of priority 0 needs its 4 CPUs
    # where 2 are free. The flavor assignment's search for cpu finds no room (nothing it may
    # take), and the whole assignment's search (cpu and memory, cpu needing preemption) is
    # answered from it.
    qs = [
        QueueSpec(2, None, None, "Never", "LowerPriority"),
        QueueSpec(4, None, None, "Never", "LowerPriority"),
    ]
    objects = build(qs, [WorkloadSpec(1, 4, 0)], fair=False, memory=True)
    running = workload("running").queue("q0").priority(5).created("2026-01-01T00:00:00Z")
    running.podset(cpu="4", memory="1Gi").admitted(
        "q0",
        {
            "name": "main",
            "count": 1,
            "flavors": {"cpu": "default", "memory": "default"},
            "resourceUsage": {"cpu": "4", "memory": "1Gi"},
        },
    )
    reserved = {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}
    admitted = {"type": "Admitted", "status": "True", "reason": "Admitted"}
    running.body["status"]["conditions"] = [
        {**c, "lastTransitionTime": "2026-01-01T00:00:00Z"} for c in (reserved, admitted)
    ]
    objects.append(running)
    recalled, fewer = searches(objects, recall=True)
    again, more = searches(objects, recall=False)
    assert recalled == again
    assert recalled["admitted"] == []
    assert [p["workload"] for p in recalled["pending"]] == ["default/w0"]
    assert fewer == 1  # one nomination of w0: one search ...
    assert more == 2  # ... where there were two


@settings(max_examples=40, deadline=None)
@given(qs=queues, ws=workloads)
def test_recalling_searches_that_found_no_room_changes_no_plan(
    qs: list[QueueSpec], ws: list[WorkloadSpec]
) -> None:
    objects = build(qs, ws, fair=False, memory=True)
    recalled, fewer = searches(objects, recall=True)
    again, more = searches(objects, recall=False)
    assert recalled == again
    assert fewer <= more


def could_be_admitted_alone(scheduler: Scheduler, pending: PendingWorkload) -> bool:
    """Whether a nomination of ``pending`` now, with no other work in the cycle, fits or finds
    victims (the queues here have one flavor, so no flavor scan is under way). What it leaves
    remembered is dropped afterwards."""
    nominated = scheduler.nominate(pending)
    scheduler.preemptor.clear_cache()
    scheduler.state_version += 1
    if not isinstance(nominated, Entry):
        return False
    mode = nominated.assignment.mode()
    return mode == FIT or (mode == PREEMPT and bool(nominated.targets))


@settings(max_examples=60, deadline=None)
@given(qs=queues, ws=workloads, ends=st.lists(st.integers(0, 50), min_size=1, max_size=4))
def test_work_a_release_leaves_parked_could_not_be_admitted_even_alone(
    qs: list[QueueSpec], ws: list[WorkloadSpec], ends: list[int]
) -> None:
    """A finish wakes a workload parked for quota only where the freed quota could take it
    (``Waker.still_short``). Each one it leaves parked is nominated right then, alone: it must
    neither fit nor find victims."""
    state = load_state([("state.yaml", documents(*build(qs, ws, fair=False)))])
    now = default_now(state)
    session = Session(state, config_from_kueue(state.configuration), now)
    session.drain(now)
    scheduler = session._scheduler
    kept: list[PendingWorkload] = []
    original = Waker.still_short

    def spy(self: Waker, pending: PendingWorkload, freed: frozenset[str], verdicts: Any) -> bool:
        short: bool = original(self, pending, freed, verdicts)
        if short:
            kept.append(pending)
        return short

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Waker, "still_short", spy)
        for step, pick in enumerate(ends, start=1):
            admitted = sorted(scheduler.admitted)
            if not admitted:
                break
            kept.clear()
            assert session.finish(admitted[pick % len(admitted)], now + step)
            for pending in kept:
                assert not could_be_admitted_alone(scheduler, pending), pending.key
            session.drain(now + step)


@settings(max_examples=60, deadline=None)
@given(
    qs=queues,
    held=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 6), st.integers(0, 4)), max_size=8),
    gone=st.lists(st.booleans(), min_size=8, max_size=8),
)
def test_taking_out_only_a_resources_usage_reads_as_taking_out_the_workloads(
    qs: list[QueueSpec], held: list[tuple[int, int, int]], gone: list[bool]
) -> None:
    """What the classical preemption search and the decider's overlap check rest on: with only
    the workloads' usage of some flavor-resources taken out (``without_usage_of``), every queue
    and cohort reads the same usage and headroom of those as with the whole workloads gone
    (``without``); the other resources stay, and on exit the tree is as it was."""
    tree = QuotaTree(load_state([("state.yaml", documents(*build(qs, [], fair=False, memory=True)))]))
    cpu, memory = ("default", "cpu"), ("default", "memory")
    admitted = []
    for i, (queue, cores, gib) in enumerate(held):
        usage = {cpu: cores * 1000, memory: gib * 2**30}
        wl = AdmittedWorkload(f"default/w{i}", f"q{queue % len(qs)}", usage, frozenset(usage))
        tree.add_workload(wl)
        admitted.append(wl)
    nodes = [*tree.queues.values(), *{id(a): a for q in tree.queues.values() for a in q.ancestors()}.values()]
    removed = [wl for wl, out in zip(admitted, gone, strict=False) if out]

    def seen(fr: tuple[str, str]) -> list[tuple[int, int]]:
        return [(node.usage.get(fr, 0), node.raw_available(fr)) for node in nodes]

    before = [dict(node.usage) for node in nodes]
    with tree.without(removed):
        whole = seen(cpu)
    with tree.without_usage_of(removed, {cpu}):
        assert seen(cpu) == whole
        assert [node.usage.get(memory, 0) for node in nodes] == [b.get(memory, 0) for b in before]
        assert set(tree.admitted) == {wl.key for wl in admitted}  # the books are not touched
    assert [dict(node.usage) for node in nodes] == before
