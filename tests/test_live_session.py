"""The controller's long-lived scheduling session, fed from an informer cache's changes (no API server)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.core.session import Plan, SchedulerConfig, Session
from gpuplane.k8s.informer import Cache
from gpuplane.k8s.live_session import LiveSession
from gpuplane.model import labels as keys
from manifests import cluster_queue, local_queue, node, pod_spec, resource_flavor, workload

NS = "team"


def _wl(name: str, gpu: int = 1, created: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    return workload(name, NS).queue("lq").created(created).podset(cpu="1", gpu=gpu).to_dict()


def _node(name: str, **labels: str) -> dict[str, Any]:
    built = node(name).allocatable(cpu="64", memory="512Gi", pods="110", gpu=8)
    built.label("kubernetes.io/hostname", name)
    for key, value in labels.items():
        built.label(key, value)
    return built.to_dict()


def _cache(gpus: int = 16, nodes: int = 2) -> Cache:
    cache = Cache()
    cache.replace_all("ResourceFlavor", [resource_flavor("h100").to_dict()])
    cache.replace_all("ClusterQueue", [cluster_queue("cq").flavor("h100", cpu="1000", gpu=gpus).to_dict()])
    cache.replace_all("LocalQueue", [local_queue("lq", NS, "cq").to_dict()])
    cache.replace_all("Node", [_node(f"node-{i}") for i in range(nodes)])
    for kind in ("Workload", "Pod", "Namespace", "WorkloadPriorityClass"):
        cache.replace_all(kind, [])
    return cache


class Driver:
    """What the controller does with a LiveSession each pass, without the writes."""

    def __init__(self, cache: Cache, resync_seconds: float = 300.0) -> None:
        self.cache = cache
        self.live = LiveSession(lambda _state: SchedulerConfig(), resync_seconds)
        self.now = 1000.0

    def sync(self, advance: float = 1.0) -> Session:
        self.now += advance
        changes = self.cache.take_changes()
        return self.live.sync(self.cache.items, self.cache.get, changes, self.now)

    def drain(self) -> Plan:
        return self.sync().drain(self.now)

    def admit_in_cache(self, plan: Plan) -> None:
        """Write each admission into the cache, as the controller's write and its watch event do."""
        for decision in plan.admitted:
            wl = self.cache.get("Workload", decision.workload)
            assert wl is not None
            assignments = [
                {"name": ps.name, "count": ps.count, "flavors": dict(ps.flavors)} for ps in decision.pod_sets
            ]
            status = {"admission": {"clusterQueue": decision.cluster_queue, "podSetAssignments": assignments}}
            conditions = [
                {"type": t, "status": "True", "reason": t, "lastTransitionTime": "2026-01-01T00:00:01Z"}
                for t in ("QuotaReserved", "Admitted")
            ]
            status["conditions"] = conditions
            self.cache.upsert("Workload", {**wl, "status": status})


def test_the_first_pass_builds_the_session_and_later_ones_keep_it() -> None:
    driver = Driver(_cache())
    first = driver.sync()
    assert (driver.live.rebuilds, driver.live.fed) == (1, 0)
    assert driver.sync() is first
    assert driver.sync() is first
    assert (driver.live.rebuilds, driver.live.fed) == (1, 2)


def test_a_new_workload_is_submitted_to_the_kept_session_and_admitted() -> None:
    cache = _cache()
    driver = Driver(cache)
    session = driver.sync()
    cache.upsert("Workload", _wl("a", gpu=4))
    plan = driver.drain()
    assert driver.sync() is session
    assert [d.workload for d in plan.admitted] == [f"{NS}/a"]
    assert driver.live.rebuilds == 1
    assert session.holds(f"{NS}/a")


def test_admissions_written_back_are_fed_as_updates_not_rebuilds() -> None:
    cache = _cache()
    cache.upsert("Workload", _wl("a", gpu=4))
    driver = Driver(cache)
    driver.admit_in_cache(driver.drain())
    driver.sync()
    assert driver.live.rebuilds == 1
    assert driver.live.last_rebuild_reason == "first pass"


def test_a_pending_workload_whose_status_alone_changed_is_not_queued_again() -> None:
    cache = _cache(gpus=8)
    cache.upsert("Workload", _wl("big", gpu=16))  # more than the quota: pending for good
    driver = Driver(cache)
    assert driver.drain().admitted == ()
    parsed: list[str] = []
    parse = driver.live._parse  # counting the parses is the point
    driver.live._parse = lambda kind, objs: parsed.extend(kind for _ in objs) or parse(kind, objs)  # type: ignore[method-assign]
    wl = cache.get("Workload", f"{NS}/big")
    assert wl is not None
    condition = {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "no quota"}
    cache.upsert("Workload", {**wl, "status": {"conditions": [condition]}})
    driver.drain()
    assert parsed == []
    assert driver.live.rebuilds == 1


def test_finishing_frees_quota_without_a_rebuild_and_lets_the_next_one_in() -> None:
    cache = _cache(gpus=8)
    cache.upsert("Workload", _wl("first", gpu=8, created="2026-01-01T00:00:00Z"))
    cache.upsert("Workload", _wl("second", gpu=8, created="2026-01-01T00:01:00Z"))
    driver = Driver(cache)
    plan = driver.drain()
    assert [d.workload for d in plan.admitted] == [f"{NS}/first"]
    driver.admit_in_cache(plan)
    assert driver.drain().admitted == ()  # parked: no quota left
    done = cache.get("Workload", f"{NS}/first")
    assert done is not None
    finished = {"type": "Finished", "status": "True", "reason": "Succeeded"}
    cache.upsert("Workload", {**done, "status": {**done["status"], "conditions": [finished]}})
    plan = driver.drain()
    assert [d.workload for d in plan.admitted] == [f"{NS}/second"]
    assert driver.live.rebuilds == 1


def test_a_pending_workload_deleted_is_withdrawn() -> None:
    cache = _cache(gpus=8)
    cache.upsert("Workload", _wl("big", gpu=16))
    driver = Driver(cache)
    session = driver.sync()
    assert [p.workload for p in session.pending()] == [f"{NS}/big"]
    wl = cache.get("Workload", f"{NS}/big")
    assert wl is not None
    cache.remove("Workload", wl)
    assert driver.sync().pending() == ()
    assert driver.live.rebuilds == 1


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ("queue", "queues, flavors or namespaces changed: ClusterQueue"),
        ("node-added", "node added: node-9"),
        ("node-resized", "node resized: node-0"),
        ("foreign-pod", "pod holds devices outside an admitted workload: team/other"),
        ("admitted-elsewhere", "the cluster shows an admission: team/b"),
        ("relist", "queues, flavors or namespaces changed: ClusterQueue"),
    ],
)
def test_changes_the_session_cannot_take_as_events_rebuild_it(change: str, reason: str) -> None:
    cache = _cache()
    cache.upsert("Workload", _wl("a", gpu=16))
    cache.upsert("Workload", _wl("b", gpu=1))
    driver = Driver(cache)
    first = driver.sync()
    if change == "queue":
        cache.upsert("ClusterQueue", cluster_queue("cq").flavor("h100", cpu="1000", gpu=32).to_dict())
    elif change == "node-added":
        cache.upsert("Node", _node("node-9"))
    elif change == "node-resized":
        cache.upsert("Node", node("node-0").allocatable(cpu="64", gpu=4).to_dict())
    elif change == "foreign-pod":
        pod = {
            "metadata": {"name": "other", "namespace": NS},
            "spec": {**pod_spec().container(gpu=1).to_dict()},
        }
        pod["spec"]["nodeName"] = "node-0"
        cache.upsert("Pod", pod)
    elif change == "admitted-elsewhere":
        other = LiveSession(lambda _state: SchedulerConfig())  # another scheduler admits it
        elsewhere = other.sync(cache.items, cache.get, {}, driver.now).drain(driver.now)
        driver.admit_in_cache(elsewhere)
    else:  # a relist that finds a ClusterQueue changed
        cache.replace_all("ClusterQueue", [cluster_queue("cq").flavor("h100", cpu="1", gpu=16).to_dict()])
    assert driver.sync() is not first
    assert driver.live.rebuilds == 2
    assert driver.live.last_rebuild_reason == reason
    assert driver.live.rebuild_reasons == {"first pass": 1, reason.partition(":")[0]: 1}


def test_a_node_label_change_is_fed_and_a_pod_of_a_held_workload_is_not_a_rebuild() -> None:
    cache = _cache()
    cache.upsert("Workload", _wl("a", gpu=1))
    driver = Driver(cache)
    plan = driver.drain()
    driver.admit_in_cache(plan)
    cache.upsert("Node", _node("node-1", zone="b"))
    placement = plan.admitted[0].pod_sets[0].placement
    assert placement is not None
    pod = {
        "metadata": {"name": "a-0", "namespace": NS, "labels": {keys.WORKLOAD_LABEL: "a"}},
        "spec": {**pod_spec().container(cpu="1", gpu=1).to_dict(), "nodeName": placement[0].node},
        "status": {"phase": "Running"},
    }
    cache.upsert("Pod", pod)
    session = driver.sync()
    assert driver.live.rebuilds == 1
    assert [p.key for p in driver.live.state().pods] == [f"{NS}/a-0"]
    assert session.holds(f"{NS}/a")


def test_time_going_back_and_the_resync_period_rebuild() -> None:
    driver = Driver(_cache(), resync_seconds=60)
    driver.sync()
    driver.sync(advance=-5)
    assert driver.live.last_rebuild_reason == "the clock went back"
    driver.sync(advance=30)
    assert driver.live.rebuilds == 2
    driver.sync(advance=31)
    assert (driver.live.rebuilds, driver.live.last_rebuild_reason) == (3, "periodic resync")


def test_an_invalidated_session_is_rebuilt_once() -> None:
    driver = Driver(_cache())
    driver.sync()
    driver.live.invalidate("the last pass preempted")
    driver.live.invalidate("a write failed")
    driver.sync()
    driver.sync()
    assert driver.live.rebuilds == 2
    assert driver.live.last_rebuild_reason == "the last pass preempted"


def test_the_fed_session_decides_as_a_fresh_one_would() -> None:
    cache = _cache(gpus=24, nodes=3)
    driver = Driver(cache)
    driver.sync()
    admitted: list[str] = []
    for i in range(12):
        cache.upsert("Workload", _wl(f"w{i:02d}", gpu=1 + i % 4, created=f"2026-01-01T00:{i:02d}:00Z"))
        if i % 3 == 2:
            plan = driver.drain()
            admitted += [d.workload for d in plan.admitted]
            driver.admit_in_cache(plan)
    fed = driver.drain()
    admitted += [d.workload for d in fed.admitted]
    assert driver.live.rebuilds == 1
    fresh = Driver(cache)
    fresh.now = driver.now
    assert fresh.drain().admitted == ()  # nothing left that fits: the fed session admitted the same
    assert sorted(p.workload for p in fresh.sync().pending()) == sorted(p.workload for p in fed.pending)
    assert sorted(fresh.live.session.usage()[0].used.items()) == sorted(  # type: ignore[union-attr]
        driver.live.session.usage()[0].used.items()  # type: ignore[union-attr]
    )
    assert len(admitted) == len(set(admitted)) > 0


def test_parked_reasons_are_looked_at_again_once_the_cluster_settles_after_an_admission() -> None:
    cache = _cache(gpus=64)
    cache.upsert("Workload", _wl("huge", gpu=16, created="2026-01-01T00:00:00Z"))  # no node holds it
    cache.upsert("Workload", _wl("small", gpu=4, created="2026-01-01T00:01:00Z"))
    driver = Driver(cache)
    plan = driver.drain()
    assert [d.workload for d in plan.admitted] == [f"{NS}/small"]
    stale = next(p for p in plan.pending if p.workload == f"{NS}/huge")
    driver.live.settle = True  # what the controller sets after a pass that admitted something
    driver.admit_in_cache(plan)
    assert next(p for p in driver.drain().pending if p.workload == f"{NS}/huge") == stale  # changes: parked
    now = next(p for p in driver.drain().pending if p.workload == f"{NS}/huge")  # a quiet pass
    fresh = Driver(cache)
    fresh.now = driver.now
    assert now.message != stale.message
    assert (now.reason, now.message) == next(
        (p.reason, p.message) for p in fresh.drain().pending if p.workload == f"{NS}/huge"
    )
    assert driver.live.rebuilds == 1


def test_pending_changes_reports_each_reason_once_until_it_changes() -> None:
    cache = _cache(gpus=8)
    cache.upsert("Workload", _wl("big", gpu=16, created="2026-01-01T00:00:00Z"))
    cache.upsert("Workload", _wl("fits", gpu=8, created="2026-01-01T00:01:00Z"))
    driver = Driver(cache)
    session = driver.sync()
    assert session.pending_changes() == session.pending()  # the first call: every one
    assert session.pending_changes() == ()
    session.drain(driver.now)
    changed = session.pending_changes()
    assert [p.workload for p in changed] == [f"{NS}/big"]  # tried now; "fits" is admitted
    assert changed == session.pending()
    assert session.pending_changes() == ()
    cache.upsert("Workload", _wl("late", gpu=1, created="2026-01-01T00:02:00Z"))
    assert [p.workload for p in driver.sync().pending_changes()] == [f"{NS}/late"]


def test_a_relist_feeds_only_what_differs_from_the_copy_it_replaced() -> None:
    cache = _cache()
    cache.upsert(
        "Workload", {**_wl("a", gpu=1), "metadata": {**_wl("a")["metadata"], "resourceVersion": "5"}}
    )
    driver = Driver(cache)
    session = driver.sync()
    listed = [
        *cache.items("Workload"),
        {**_wl("b", gpu=1), "metadata": {**_wl("b")["metadata"], "resourceVersion": "9"}},
    ]
    cache.replace_all("Workload", listed)
    cache.replace_all("Node", cache.items("Node"))  # the same nodes: nothing to feed
    changes = cache.take_changes()
    assert changes == {"Workload": {f"{NS}/b"}}
    assert driver.live.sync(cache.items, cache.get, changes, driver.now + 1) is session
    assert sorted(p.workload for p in session.pending()) == [f"{NS}/a", f"{NS}/b"]
    assert driver.live.rebuilds == 1


def test_the_reasons_pending_changes_reports_add_up_to_every_pending_reason() -> None:
    cache = _cache(gpus=16)
    cache.upsert("ClusterQueue", cluster_queue("small").flavor("h100", cpu="1000", gpu=2).to_dict())
    cache.upsert("LocalQueue", local_queue("small", NS, "small").to_dict())
    driver = Driver(cache)
    shown: dict[str, tuple[str, str]] = {}
    seen: set[str] = set()  # ever pending

    def check() -> None:
        session = driver.sync()
        session.drain(driver.now)
        shown.update((p.workload, (p.reason, p.message)) for p in session.pending_changes())
        pending = session.pending()
        seen.update(p.workload for p in pending)
        assert {p.workload: (p.reason, p.message) for p in pending} == {
            p.workload: shown[p.workload] for p in pending
        }

    for i in range(8):
        body = _wl(f"w{i}", gpu=1 + (i * 5) % 9, created=f"2026-01-01T00:{i:02d}:00Z")
        if i % 2:
            body["spec"]["queueName"] = "small"
        cache.upsert("Workload", body)
        check()
    plan_holder = driver.live.session
    assert plan_holder is not None
    admitted = [d.workload for d in plan_holder.admitted()]
    for key in admitted[:2]:  # two finish: room for others, new reasons for the rest
        done = cache.get("Workload", key)
        assert done is not None
        finished = {"type": "Finished", "status": "True", "reason": "Succeeded"}
        cache.upsert("Workload", {**done, "status": {"conditions": [finished]}})
        check()
    gone = cache.get("Workload", f"{NS}/w7")
    assert gone is not None
    cache.remove("Workload", gone)
    check()
    assert driver.live.rebuilds == 1
    assert len(seen) >= 3


def test_a_node_the_core_refuses_is_left_out_and_the_rest_schedules() -> None:
    # A device count no node has (a broken device plugin) would hang the core; the controller's
    # session leaves that Node out, keeps the error for its log, and schedules on the others.
    cache = _cache(nodes=1)
    huge = _node("huge")
    huge["status"]["allocatable"]["nvidia.com/gpu"] = "9999999999999999999999999999999999999Ei"
    cache.upsert("Node", huge)
    cache.upsert("Workload", _wl("w", gpu=8))
    driver = Driver(cache)
    plan = driver.drain()
    assert [d.workload for d in plan.admitted] == [f"{NS}/w"]
    (pod_set,) = plan.admitted[0].pod_sets
    assert {p.node for p in pod_set.placement or ()} == {"node-0"}
    assert [err.obj for err in driver.live.skipped] == ["Node/huge"]
    assert "not schedulable" in str(driver.live.skipped[0])
