"""The controller under faults: cut watches, 410 Gone, 409 conflicts, 500s, slow answers, and a
controller killed and restarted at random points, with the invariants checked throughout:

- no pod is bound twice (the request log has at most one successful binding per pod);
- no workload is lost (every submitted job has exactly one Workload) or admitted twice (no admission
  is written over one that was not cleared by an eviction);
- no quota is exceeded (admitted usage per ClusterQueue, sampled while the test runs and at the end);
- no device is given to two pods, and pods are bound where their admission planned;

and, once the faults stop, the controller converges: every admitted workload is fully bound, and the
core would admit or preempt nothing more.

These tests need the double's fault hooks and request log, so they skip against a real cluster.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from apiserver.errors import ApiError as InjectedError
from apiserver.faults import Request
from apiserver.fixtures import Cluster, Kubectl
from apiserver.server import ApiServerDouble
from controller_harness import (
    CONTROLLER_AGENT,
    QuotaSampler,
    RunningController,
    Scene,
    admission_episodes,
    devices_overlap,
    double_bindings,
    make_scene,
    quota_violations,
    wait_until,
)
from gpuplane.model.topology import assigned_domains
from manifests import Manifest

pytestmark = pytest.mark.timeout(120)

SEED = 20260101
WORKLOADS = "workloads.kueue.x-k8s.io"
CLUSTER_QUEUES = "clusterqueues.kueue.x-k8s.io"


@pytest.fixture
def scene(apiserver: Cluster, kubectl: Kubectl, double: ApiServerDouble) -> Iterator[Scene]:
    del double  # requested so that these tests skip against a real cluster
    yield from make_scene(apiserver, kubectl)


def stored_quota_state(double: ApiServerDouble) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    return double.store.objects(WORKLOADS), double.store.objects(CLUSTER_QUEUES)


def random_jobs(scene: Scene, rng: np.random.Generator, count: int, priorities: list[str]) -> list[Manifest]:
    return [
        scene.job(
            f"j{i:02d}",
            pods=int(rng.integers(1, 4)),
            gpus=int(rng.choice([1, 2, 4])),
            priority_class=priorities[int(rng.integers(len(priorities)))],
        )
        for i in range(count)
    ]


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def converged(scene: Scene) -> bool:
    """Every job has its Workload, every admitted one is fully bound, none is still on its way out
    (evicted, holding its quota until its job stops), and the core has nothing left."""
    jobs, workloads, pods = scene.jobs(), scene.workloads(), live(scene.pods())
    if set(workloads) != set(jobs):
        return False
    for name, wl in workloads.items():
        admission = (wl.get("status") or {}).get("admission")
        if not admission:
            continue
        evicted = any(
            c["type"] == "Evicted" and c["status"] == "True" for c in wl["status"].get("conditions") or []
        )
        if evicted:
            return False
        want = sum(a["count"] for a in admission["podSetAssignments"])
        mine = [p for p in pods if p["metadata"]["labels"].get("job-name") == name]
        if len(mine) != want or not all(p["spec"].get("nodeName") for p in mine):
            return False
    plan = scene.core_plan()
    return not plan.admitted and not plan.preempted


def settled(scene: Scene, run: RunningController) -> bool:
    """Converged now, and again after the controller's next pass."""
    if not converged(scene):
        return False
    run.wait_passes(1, timeout=10)
    return converged(scene)


def assert_invariants(scene: Scene, double: ApiServerDouble) -> None:
    log = list(double.requests)
    assert double_bindings(log) == [], "a pod was bound twice"
    _, twice = admission_episodes(log)
    assert twice == [], "a workload was admitted twice"

    jobs = scene.jobs()
    owners = Counter(
        ref["uid"]
        for wl in double.store.objects(WORKLOADS)
        for ref in wl["metadata"].get("ownerReferences") or []
    )
    assert {name: owners[j["metadata"]["uid"]] for name, j in jobs.items()} == dict.fromkeys(jobs, 1), (
        "every job has exactly one Workload"
    )
    assert quota_violations(*stored_quota_state(double)) == []

    pods = live(scene.pods())
    assert devices_overlap(pods) == []
    for name, wl in scene.workloads().items():
        admission = (wl.get("status") or {}).get("admission")
        if not admission:
            continue
        (assignment,) = admission["podSetAssignments"]
        planned = Counter({v[-1]: c for v, c in assigned_domains(assignment["topologyAssignment"])})
        placed = Counter(
            p["spec"].get("nodeName") for p in pods if p["metadata"]["labels"].get("job-name") == name
        )
        assert placed == planned, f"{name} is bound where its admission planned"


def cluster_with_priorities(scene: Scene) -> list[str]:
    """Three 8-GPU nodes, 16 GPUs of quota (quota binds first), preemption of lower priorities."""
    scene.setup(nodes=3, quota_gpus=16, preemption={"withinClusterQueue": "LowerPriority"})
    return [scene.priority_class(name, value) for name, value in (("low", 10), ("mid", 100), ("high", 1000))]


def test_invariants_hold_through_cut_watches_gone_conflicts_errors_and_slow_answers(
    scene: Scene, double: ApiServerDouble
) -> None:
    rng = np.random.default_rng(SEED)
    priorities = cluster_with_priorities(scene)
    faults = double.faults
    rules = [
        faults.cut_watches(after=5, abrupt=True, times=20),  # the first twenty: the connection drops
        faults.cut_watches(after=3),  # then every watch stream ends after three events
        faults.expire(times=5, verbs=("watch",)),  # 410 Gone where a watch resumes
        faults.conflict(times=15, resource="workloads", verbs=("update",)),
        faults.conflict(times=5, resource="jobs", verbs=("update",)),
        faults.conflict(times=5, resource="pods/binding", verbs=("create",)),
        faults.fail(500, resource="pods", verbs=("create", "patch"), probability=0.1, seed=1),
        faults.fail(
            500,
            resource=("workloads", "events", "leases"),
            verbs=("create", "update"),
            probability=0.1,
            seed=2,
        ),
        faults.fail(500, resource="jobs", verbs=("update",), probability=0.1, seed=3),
        faults.delay(0.02, verbs=("create", "update", "patch")),  # slow writes
    ]
    flaky_reads = np.random.default_rng(SEED + 1)

    # The controller's first watches find their history gone. (The expire rule above may spend its
    # budget on the job controller's watches, and a compaction sends 410 only to a watch that
    # resumes from before it, which depends on timing; these make the relist certain.)
    gone_watches = [3]

    def controller_reads_fail(request: Request) -> InjectedError | None:
        controller = request.user_agent.startswith(CONTROLLER_AGENT)
        if controller and request.verb == "watch" and gone_watches[0] > 0:
            gone_watches[0] -= 1
            return InjectedError(410, "The resourceVersion for the provided watch is too old.", "Expired")
        if controller and request.verb in ("get", "list") and flaky_reads.random() < 0.1:
            return InjectedError(500, "injected fault", "InternalError")
        return None

    faults.intercept(controller_reads_fail)
    scene.job_controller()
    run = scene.controller(dry_run=False)
    jobs = random_jobs(scene, rng, 24, priorities)
    with QuotaSampler(lambda: stored_quota_state(double)) as sampler:
        for batch in range(4):
            scene.submit(*jobs[batch * 6 : (batch + 1) * 6])
            wait_until(lambda n=(batch + 1) * 6: len(scene.workloads()) >= n, 30, "workloads of the batch")
            double.store.compact()  # every watch that resumes from before now gets 410 Gone
            run.wait_passes(5, timeout=30)
        faults.clear()
        # Settled: converged, and still so after one more controller pass (a state read between
        # a write and the pass that follows it is not the end state).
        wait_until(lambda: settled(scene, run), 60, "convergence once the faults stop")
    assert sampler.samples > 10
    assert sampler.problems == [], "quota exceeded at a sampled point"
    assert_invariants(scene, double)

    assert all(rule.fired for rule in rules), [r for r in rules if not r.fired]
    informers = run.controller.informers
    # Lists after an informer's first: a kind the double does not serve (resource.k8s.io) never lists.
    assert sum(max(0, i.relists - 1) for i in informers) > 0, "410 Gone made informers relist"
    assert run.controller.counters.write_failures > 0
    assert sum(bool((wl.get("status") or {}).get("admission")) for wl in scene.workloads().values()) >= 3


RESTARTS = 60


def test_invariants_hold_while_the_controller_is_killed_and_restarted_at_random_points(
    scene: Scene, double: ApiServerDouble
) -> None:
    rng = np.random.default_rng(SEED)
    priorities = cluster_with_priorities(scene)
    scene.job_controller()
    jobs = random_jobs(scene, rng, 30, priorities)
    kills = Counter[str]()
    with QuotaSampler(lambda: stored_quota_state(double)) as sampler:
        for i in range(RESTARTS):
            if i % 4 == 0 and jobs:
                scene.submit(*jobs[:2])
                jobs = jobs[2:]
            if rng.random() < 0.5:
                # Die at the Nth API call of this replica (informers included): before the request
                # is sent, or after the server answered it but before the answer was read.
                run = scene.controller(
                    dry_run=False, kill_after=int(rng.integers(1, 70)), after_send=bool(rng.random() < 0.5)
                )
                wait_until(run.api.killed.is_set, 30, "the replica's fatal call")
                kills["at a call"] += 1
            else:
                # Die after a few passes, wherever the replica is then.
                run = scene.controller(dry_run=False)
                run.wait_passes(int(rng.integers(1, 6)), timeout=30)
                kills["after passes"] += 1
            run.kill()
            sampler.sample()
        if jobs:
            scene.submit(*jobs)
        final = scene.controller(dry_run=False)
        wait_until(lambda: converged(scene), 60, "convergence after the last restart")
        final.stop()
    assert sum(kills.values()) == RESTARTS >= 50
    assert min(kills.values()) >= 10
    assert sampler.problems == [], "quota exceeded at a sampled point"
    assert_invariants(scene, double)
    episodes, _ = admission_episodes(double.requests)
    assert sum(episodes.values()) >= 5
    assert double.requests.find(subresource="eviction", status=201), "preemptions happened on the way"


def test_no_decision_before_the_caches_are_synced(scene: Scene, double: ApiServerDouble) -> None:
    """A replica whose Workload list keeps failing must not admit: it cannot see what is admitted."""
    scene.setup(nodes=2, quota_gpus=8)  # room on the nodes for two 8-GPU jobs, quota for one
    scene.job_controller()
    first = scene.controller(leader_election=False)
    scene.submit(scene.job("first", gpus=8))
    wait_until(lambda: [p for p in scene.pods("first") if p["spec"].get("nodeName")], 20, "first bound")
    first.stop()

    refusal = double.faults.fail(500, verbs=("list",), resource="workloads")
    scene.submit(scene.job("second", gpus=8))
    run = scene.controller(leader_election=False, loop=False)
    unsynced = [i for i in run.controller.informers if i.kind == "Workload"]
    wait_until(
        lambda: (
            all(i.synced.is_set() for i in run.controller.informers if i not in unsynced)
            and run.controller.cache.get("Job", f"{scene.namespace}/second")
        ),
        20,
        "every other cache synced",
    )
    for _ in range(3):
        run.controller.reconcile()
    assert quota_violations(*stored_quota_state(double)) == []
    assert [wl["metadata"]["ownerReferences"][0]["name"] for wl in double.store.objects(WORKLOADS)] == [
        "first"
    ]

    double.faults.remove(refusal)
    wait_until(unsynced[0].synced.is_set, 20, "the Workload cache synced")
    for _ in range(3):
        run.controller.reconcile()
    assert quota_violations(*stored_quota_state(double)) == []
    assert len(double.store.objects(WORKLOADS)) == 2, "now the second job gets its Workload"
