"""Each of the controller's write paths on its own, against a fake API object (no API server).

The fake answers every call with the body it was sent (a new resourceVersion) and records it, or
raises the error a test asks for; writes run inline and Events are collected, so a test sees each
call the write path makes, in order.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast

import pytest

from gpuplane.core.plan import (
    AdmissionDecision,
    PendingDecision,
    Plan,
    PodPlacement,
    PodSetDecision,
    PreemptionDecision,
)
from gpuplane.core.session import DeviceConfig
from gpuplane.k8s import creating
from gpuplane.k8s.admitting import Admissions
from gpuplane.k8s.api import ApiError, KubeApi, Resource
from gpuplane.k8s.binding import Binder
from gpuplane.k8s.creating import WorkloadCreation
from gpuplane.k8s.evicting import Evictions
from gpuplane.k8s.finishing import Finishing
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.k8s.reporting import PendingReasons, QueueStatuses
from gpuplane.k8s.worklist import Worklist
from gpuplane.k8s.writing import Counters, Events, Tools, WritePool
from gpuplane.model import labels as keys
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from gpuplane.model.topology import topology_assignment
from manifests import GPU, Manifest, cluster_queue, job, pod_spec, workload

NS = "team"
NOW = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class FakeApi:
    """Stands for :class:`KubeApi`: records each call as (verb, what, body) and answers with the
    body sent, at a new resourceVersion; ``fail`` maps a verb to the error it raises instead."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, Any]]] = []
        self.fail: dict[str, ApiError] = {}
        self.version = 100
        self.lock = threading.Lock()

    def _answer(self, verb: str, what: str, body: Any) -> dict[str, Any]:
        with self.lock:
            self.calls.append((verb, what, copy.deepcopy(dict(body))))
            if verb in self.fail:
                raise self.fail[verb]
            self.version += 1
            out = copy.deepcopy(dict(body))
            out.setdefault("metadata", {})["resourceVersion"] = str(self.version)
            return out

    @staticmethod
    def _what(res: Resource, sub: str | None) -> str:
        return f"{res.plural}/{sub}" if sub else res.plural

    def create(self, res: Resource, body: Any, _namespace: str | None = None) -> dict[str, Any]:
        return self._answer("create", res.plural, body)

    def replace(self, res: Resource, body: Any, sub: str | None = None) -> dict[str, Any]:
        return self._answer("replace", self._what(res, sub), body)

    def patch(
        self, res: Resource, name: str, patch: Any, namespace: str | None = None, *, sub: str | None = None
    ) -> dict[str, Any]:
        """Answers with the patch as the object (named), which is all a write path reads back."""
        answer = self._answer("patch", self._what(res, sub), patch)
        answer["metadata"].update(name=name, **({"namespace": namespace} if namespace else {}))
        return answer

    def delete(
        self, res: Resource, name: str, _namespace: str | None = None, *, preconditions: Any = None
    ) -> dict[str, Any]:
        return self._answer("delete", res.plural, {"name": name, "preconditions": preconditions})

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        return self._answer(method, path, body or {})

    def verbs(self) -> list[tuple[str, str]]:
        return [(verb, what) for verb, what, _ in self.calls]


class Bench:
    """One write path's surroundings: the fake API, a cache and worklist holding ``objects``, the
    counters, the Events recorded as (object key, type, reason, message) and the invalidations."""

    def __init__(self, *objects: tuple[str, dict[str, Any]]) -> None:
        self.api, self.cache, self.work = FakeApi(), Cache(), Worklist(("Job",))
        self.counters = Counters()
        self.events: list[tuple[str, str, str, str]] = []
        self.invalidated: list[str] = []
        for kind, obj in objects:
            self.cache.upsert(kind, obj)
        self.work.sweep(self.cache.items)
        self.cache.take_changes()

    def catch_up(self) -> None:
        self.work.note(self.cache.take_changes(), self.cache.get)

    @property
    def tools(self) -> Tools:
        def each(writes: Iterable[Callable[[], None]]) -> None:
            for write in writes:
                write()

        def event(obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
            self.events.append((object_key(obj), kind, reason, message))

        api = cast(KubeApi, self.api)
        return Tools(
            api, self.cache, self.work, self.counters, lambda: NOW, each, event, self.invalidated.append
        )

    def reasons(self) -> list[str]:
        return [reason for _, _, reason, _ in self.events]


def _workload(name: str, *, count: int = 2, admitted_on: dict[str, int] | None = None) -> dict[str, Any]:
    body = workload(name, NS).queue("lq").podset(count=count, cpu="1", gpu=2).to_dict()
    body["metadata"].update(resourceVersion="7", uid=f"uid-{name}")
    if admitted_on is not None:
        assignment = topology_assignment(
            [keys.HOSTNAME_LABEL],
            [((n,), c) for n, c in sorted(admitted_on.items())],
            "kueue.x-k8s.io/v1beta2",
        )
        body["status"] = {
            "admission": {
                "clusterQueue": "cq",
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": count,
                        "flavors": {GPU: "h100"},
                        "topologyAssignment": assignment,
                    }
                ],
            }
        }
    return body


def _admission(name: str) -> AdmissionDecision:
    placement = (PodPlacement("node-a", ("0", "1")), PodPlacement("node-a", ("2", "3")))
    pod_set = PodSetDecision("main", 2, {"cpu": "h100", GPU: "h100"}, placement)
    return AdmissionDecision(f"{NS}/{name}", "cq", (pod_set,))


def _pod(name: str, wl: str) -> dict[str, Any]:
    body = Manifest("v1", "Pod", name, NS).set("spec", pod_spec().container(cpu="1", **{GPU: "2"}).to_dict())
    body = body.label(keys.WORKLOAD_LABEL, wl).label(keys.PODSET_LABEL, "main")
    body = body.set("spec.schedulerName", keys.SCHEDULER_NAME).set("metadata.uid", f"uid-{name}")
    return body.set("metadata.resourceVersion", "3").to_dict()


# --- workload creation --------------------------------------------------------------------------


def test_a_queued_job_gets_one_workload_and_a_conflict_is_no_failure() -> None:
    queued = job("train", NS).queue("lq").parallelism(2).completions(2).set("spec.suspend", True)
    bench = Bench(
        ("Job", queued.set("metadata.uid", "uid-train").set("metadata.resourceVersion", "1").to_dict())
    )
    creation = WorkloadCreation(bench.tools)
    creation.run()
    assert bench.api.calls == [], "assumed first: sent once the pass has decided"
    (assumed,) = bench.cache.items("Workload")
    assert assumed["metadata"]["creationTimestamp"] == "2026-01-01T00:00:00Z", "it queues from now"
    creation.flush()
    ((verb, what, body),) = bench.api.calls
    assert (verb, what) == ("create", "workloads")
    assert body["metadata"]["ownerReferences"][0]["name"] == "train"
    assert bench.counters.workloads_created == 1
    assert bench.cache.items("Workload"), "the created Workload is cached"
    assert bench.cache.assumed == {}, "the server's answer replaced the assumption"
    bench.catch_up()
    creation.run()
    creation.flush()
    assert len(bench.api.calls) == 1, "a job that has its Workload gets no other"

    again = Bench(("Job", queued.to_dict()))
    again.api.fail["create"] = ApiError(409, "Conflict")
    conflicted = WorkloadCreation(again.tools)
    conflicted.run()
    conflicted.flush()
    assert (again.counters.workloads_created, again.counters.write_failures) == (0, 0)
    assert again.cache.items("Workload") == [], "a create that failed leaves no assumption behind"


def test_a_pass_makes_at_most_its_share_of_new_workloads_the_oldest_jobs_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(creating, "PASS_CREATES", 2)
    stamps = {"c": "2026-01-01T00:00:01Z", "a": "2026-01-01T00:00:02Z", "b": "2026-01-01T00:00:03Z"}
    queued = [
        job(name, NS)
        .queue("lq")
        .set("spec.suspend", True)
        .set("metadata.uid", f"uid-{name}")
        .set("metadata.creationTimestamp", stamp)
        .to_dict()
        for name, stamp in stamps.items()
    ]
    bench = Bench(*(("Job", j) for j in queued))
    creation = WorkloadCreation(bench.tools)
    creation.run()
    owners = sorted(w["metadata"]["ownerReferences"][0]["name"] for w in bench.cache.items("Workload"))
    assert owners == ["a", "c"], "the two oldest jobs"
    creation.flush()
    bench.catch_up()
    creation.run()
    creation.flush()
    assert [body["metadata"]["ownerReferences"][0]["name"] for _, _, body in bench.api.calls] == [
        "c",
        "a",
        "b",
    ]


def test_a_workload_admitted_in_the_pass_that_made_it_is_created_with_its_placement() -> None:
    queued = job("a", NS).queue("lq").parallelism(2).completions(2).set("spec.suspend", True)
    bench = Bench(("Job", queued.set("metadata.uid", "uid-a").to_dict()))
    creation = WorkloadCreation(bench.tools)
    creation.run()
    (assumed,) = bench.cache.items("Workload")
    name = assumed["metadata"]["name"]
    Admissions(bench.tools, unsent=creation.take).write_admissions(Plan(admitted=(_admission(name),)))
    creation.flush()
    assert bench.api.verbs() == [("create", "workloads"), ("replace", "workloads/status")], "no patch"
    body = bench.api.calls[0][2]
    assert json.loads(body["metadata"]["annotations"][PLACEMENT_ANNOTATION])["main"][0] == ["node-a", "0,1"]
    assert "status" not in body
    status = bench.api.calls[1][2]
    assert status["metadata"]["resourceVersion"] == "101", "the status write follows the create's version"
    assert status["status"]["admission"]["clusterQueue"] == "cq"
    assert (bench.counters.workloads_created, bench.counters.admitted) == (1, 1)
    assert bench.cache.assumed == {}

    failing = Bench(("Job", queued.set("metadata.uid", "uid-a").to_dict()))
    failing.api.fail["replace"] = ApiError(500, "Internal")
    creation = WorkloadCreation(failing.tools)
    creation.run()
    Admissions(failing.tools, unsent=creation.take).write_admissions(Plan(admitted=(_admission(name),)))
    creation.flush()
    assert failing.api.verbs() == [("create", "workloads"), ("replace", "workloads/status")]
    (kept,) = failing.cache.items("Workload")
    assert kept["metadata"]["resourceVersion"] == "101", "the Workload created stays, as the server made it"
    assert not kept.get("status"), "without the admission that failed"
    assert (failing.counters.admitted, failing.counters.write_failures) == (0, 1)


# --- admissions ---------------------------------------------------------------------------------


def test_an_admission_patches_the_placement_first_then_writes_the_status() -> None:
    bench = Bench(("Workload", _workload("a")))
    Admissions(bench.tools).write_admissions(Plan(admitted=(_admission("a"),)))
    assert bench.api.verbs() == [("patch", "workloads"), ("replace", "workloads/status")]
    patch = bench.api.calls[0][2]
    assert patch["metadata"]["resourceVersion"] == "7", "the observed version is the precondition"
    assert json.loads(patch["metadata"]["annotations"][PLACEMENT_ANNOTATION])["main"][0] == ["node-a", "0,1"]
    status = bench.api.calls[1][2]
    assert status["metadata"]["resourceVersion"] == "101", "the status write follows the patch's version"
    assert status["status"]["admission"]["clusterQueue"] == "cq"
    assert bench.counters.admitted == 1
    assert bench.events == [(f"{NS}/a", "Normal", "QuotaReserved", "Admitted by ClusterQueue cq")]
    assert bench.cache.assumed == {}, "the server's answer replaced the assumption"
    assert bench.invalidated == []


def test_a_failed_admission_forgets_its_assumption_and_a_gone_workload_invalidates() -> None:
    bench = Bench(("Workload", _workload("a")))
    bench.api.fail["replace"] = ApiError(500, "Internal")
    Admissions(bench.tools).write_admissions(Plan(admitted=(_admission("a"), _admission("gone"))))
    assert bench.cache.assumed == {}
    assert not (bench.cache.get("Workload", f"{NS}/a") or {}).get("status", {}).get("admission")
    assert (bench.counters.admitted, bench.counters.write_failures) == (0, 1)
    assert bench.events == []
    assert bench.invalidated == ["an admission was not written"]


# --- evictions ----------------------------------------------------------------------------------


def test_a_dry_run_preemption_only_tells_and_a_real_one_marks_the_victim_evicted() -> None:
    victim = _workload("victim", admitted_on={"node-a": 2})
    plan = Plan(preempted=(PreemptionDecision(f"{NS}/victim", "cq", f"{NS}/urgent", "InClusterQueue"),))
    dry = Bench(("Workload", victim))
    Evictions(dry.tools, dry_run=True, forget_pending=lambda _key: None).preempt(plan)
    assert dry.api.calls == []
    assert dry.reasons() == ["WouldPreempt"]
    assert dry.counters.would_preempt == 1

    real = Bench(("Workload", victim))
    Evictions(real.tools, dry_run=False, forget_pending=lambda _key: None).preempt(plan)
    ((verb, what, body),) = real.api.calls
    assert (verb, what) == ("replace", "workloads/status")
    assert {c["type"] for c in body["status"]["conditions"] if c["status"] == "True"} >= {
        "Evicted",
        "Preempted",
    }
    assert body["status"]["admission"], "the victim keeps its admission until its job stops"
    assert (real.counters.preempted, real.reasons()) == (1, ["Preempted"])


def test_an_evicted_workload_whose_job_stopped_gives_its_quota_back() -> None:
    evicted = _workload("old", admitted_on={"node-a": 2})
    evicted["status"]["conditions"] = [{"type": "Evicted", "status": "True", "reason": "Preempted"}]
    bench = Bench(("Workload", evicted))
    forgotten: list[str] = []
    Evictions(bench.tools, dry_run=False, forget_pending=forgotten.append).stop_evicted()
    ((verb, what, body),) = bench.api.calls
    assert (verb, what) == ("replace", "workloads/status")
    assert not body["status"].get("admission"), "queued again"
    assert (bench.counters.released, forgotten) == (1, [f"{NS}/old"])


# --- finishing ----------------------------------------------------------------------------------


def test_the_workload_of_a_job_that_is_gone_is_deleted_by_uid() -> None:
    orphan = _workload("orphan")
    orphan["metadata"]["ownerReferences"] = [{"kind": "Job", "name": "gone", "uid": "uid-gone"}]
    bench = Bench(("Workload", orphan))
    finishing = Finishing(bench.tools, integrations=("Job",), forget_pending=lambda _key: None)
    finishing.run()
    ((verb, what, body),) = bench.api.calls
    assert (verb, what, body["preconditions"]) == ("delete", "workloads", {"uid": "uid-orphan"})
    assert bench.cache.get("Workload", f"{NS}/orphan") is None
    assert bench.counters.extra["orphans_deleted"] == 1

    failing = Bench(("Workload", orphan))
    failing.api.fail["delete"] = ApiError(500, "Internal")
    Finishing(failing.tools, integrations=("Job",), forget_pending=lambda _key: None).run()
    assert failing.counters.write_failures == 1
    assert failing.work.to_finish == {f"{NS}/orphan"}, "looked at again next pass"


# --- release and bind ---------------------------------------------------------------------------


def test_a_gang_is_told_once_that_it_waits_then_bound_whole() -> None:
    wl = _workload("wl", admitted_on={"node-a": 2})
    first = _pod("p-0", "wl")
    cleared: list[set[str]] = []
    bench = Bench(("Workload", wl), ("Pod", first))
    binder = Binder(bench.tools, devices=DeviceConfig(), clear_warm=lambda nodes: cleared.append(set(nodes)))
    binder.run()
    binder.run()
    assert bench.api.calls == []
    assert bench.reasons() == ["WaitingForGang"], "each waiting pod is told once"

    bench.cache.upsert("Pod", _pod("p-1", "wl"))
    bench.catch_up()
    binder.run()
    assert bench.api.verbs() == [
        ("POST", f"/api/v1/namespaces/{NS}/pods/p-0/binding"),
        ("POST", f"/api/v1/namespaces/{NS}/pods/p-1/binding"),
    ]
    assert all(body["target"]["name"] == "node-a" for _, _, body in bench.api.calls)
    assert bench.counters.bound == 2
    assert bench.reasons()[1:] == ["Scheduled", "Scheduled"]
    assert cleared == [{"node-a"}], "the warm buffer makes room on the gang's nodes"


# --- pending reasons and queue status -----------------------------------------------------------


def test_a_pending_reason_is_written_once_until_forgotten() -> None:
    bench = Bench(("Workload", _workload("w")))
    pending = PendingReasons(bench.tools)
    plan = Plan(pending=(PendingDecision(f"{NS}/w", "cq", f"{NS}/lq", 1, 1, "InsufficientQuota", "no room"),))
    pending.record(plan)
    pending.record(plan)
    assert bench.api.verbs() == [("replace", "workloads/status")]
    assert bench.events == [
        (f"{NS}/w", "Normal", "Pending", "InsufficientQuota (position 1 in ClusterQueue cq): no room")
    ]
    pending.forget(f"{NS}/w")
    assert pending.written == {}
    fresh = _workload("w")
    fresh["metadata"]["resourceVersion"] = "999"  # the condition was taken off meanwhile
    bench.cache.upsert("Workload", fresh)
    pending.record(plan)
    assert len(bench.api.calls) == 2, "a forgotten reason is written again"

    failing = Bench(("Workload", _workload("w")))
    failing.api.fail["replace"] = ApiError(500, "Internal")
    PendingReasons(failing.tools).record(plan)
    assert failing.invalidated == ["a pending condition was not written"]


def test_queue_status_is_derived_only_while_dirty_and_a_failed_write_leaves_it_dirty() -> None:
    cq = cluster_queue("cq").flavor("h100", **{GPU: 8}).set("metadata.resourceVersion", "5").to_dict()
    bench = Bench(("ClusterQueue", cq))
    queues = QueueStatuses(bench.tools)
    queues.write()
    assert bench.api.verbs() == [("patch", "clusterqueues/status")]
    assert not queues.dirty
    queues.write()
    assert len(bench.api.calls) == 1, "nothing is derived while nothing it depends on changed"

    failing = Bench(("ClusterQueue", cq))
    failing.api.fail["patch"] = ApiError(500, "Internal")
    queues = QueueStatuses(failing.tools)
    queues.write()
    assert queues.dirty
    assert failing.counters.extra["queue_status_failures"] == 1


# --- the threads --------------------------------------------------------------------------------


def test_the_write_pool_waits_for_every_write_and_raises_the_first_failure() -> None:
    pool = WritePool(4)
    done: list[int] = []

    def write(i: int) -> Callable[[], None]:
        def run() -> None:
            if i == 1:
                raise RuntimeError("broken")
            done.append(i)

        return run

    with pytest.raises(RuntimeError, match="broken"):
        pool.each(write(i) for i in range(4))
    assert sorted(done) == [0, 2, 3], "no write outlives the step"
    pool.close()


def test_events_are_sent_in_the_background_and_a_failure_is_only_counted() -> None:
    api, counters = FakeApi(), Counters()
    events = Events(cast(KubeApi, api), lambda: NOW, counters)
    events.record({**_pod("p", "wl"), "kind": "Pod"}, "Normal", "Scheduled", "bound")
    events.close()  # waits for the Events in flight
    ((_verb, what, body),) = api.calls
    assert what == "events"
    assert (body["involvedObject"]["kind"], body["involvedObject"]["name"]) == ("Pod", "p")
    assert (body["reason"], body["type"], body["firstTimestamp"]) == (
        "Scheduled",
        "Normal",
        "2026-01-01T00:00:00Z",
    )
    events.record(_pod("q", "wl"), "Normal", "Scheduled", "after close: dropped")
    assert len(api.calls) == 1

    failing = Events(cast(KubeApi, api), lambda: NOW, counters)
    api.fail["create"] = ApiError(500, "Internal")
    failing.record(_pod("r", "wl"), "Normal", "Scheduled", "lost")
    failing.close()
    assert counters.extra["event_failures"] == 1
