"""A job's whole life through the controller: admitted, bound, run by the kubelet, finished, gone.

Pods run through :class:`fake_kubelet.FakeKubelet` (Pending -> Running -> Succeeded or Failed after
the time their annotations give); on the double the harness's Job controller, on a real control
plane kube-controller-manager's, then marks each Job ``Complete`` or ``Failed``. The controller must
finish the job's Workload (``Finished``, reason ``Succeeded`` or ``Failed``) and give its quota and
devices back, so the jobs queued behind it start. Run unchanged on a real API server with
``GPUPLANE_E2E_KUBECONFIG``.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller_harness import Scene, wait_until
from fake_kubelet import RUN_SECONDS, run_annotations
from manifests import Manifest

pytestmark = pytest.mark.timeout(90)


def finished(wl: dict[str, Any] | None) -> dict[str, Any] | None:
    """The Workload's Finished condition when it is True."""
    for c in (wl or {}).get("status", {}).get("conditions") or []:
        if c["type"] == "Finished" and c["status"] == "True":
            return dict(c)
    return None


def running_job(
    scene: Scene, name: str, seconds: float, *, pods: int = 1, gpus: int = 4, **run: Any
) -> Manifest:
    """A queued Job whose pods run ``seconds`` (virtual) and end as ``run`` says (exit code,
    checkpoint period)."""
    built = scene.job(name, pods=pods, gpus=gpus, annotations=run_annotations(seconds, **run))
    built.set("spec.backoffLimit", 0)
    return built


def test_a_finished_job_gives_its_quota_back_and_the_job_behind_it_starts(scene: Scene) -> None:
    # The reported case: an 8-GPU ClusterQueue, three 4-GPU Jobs; two are admitted and run, the third
    # waits until one of them has finished.
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    kubelet = scene.kubelet()
    run = scene.controller(leader_election=False)
    scene.submit(
        running_job(scene, "first", 1), running_job(scene, "second", 600), running_job(scene, "third", 1)
    )

    wait_until(lambda: scene.bound("first", 1) and scene.bound("second", 1), 30, "two jobs bound")
    assert not scene.admitted("third"), "8 GPUs hold two 4-GPU jobs, not three"

    wait_until(lambda: finished(scene.workloads().get("first")), 30, "the first job's Workload finished")
    condition = finished(scene.workloads()["first"])
    assert condition is not None
    assert condition["reason"] == "Succeeded"
    assert scene.jobs()["first"]["status"].get("succeeded") == 1
    wait_until(lambda: scene.bound("third", 1), 30, "the third job admitted and bound into the freed GPUs")
    assert not finished(scene.workloads()["second"]), "the second job still runs"
    wait_until(lambda: finished(scene.workloads().get("third")), 30, "the third job finished too")
    # The controller counts a finish, and writes its Event, once the status write has returned: a
    # reader of the Workload may see the write first.
    wait_until(lambda: run.controller.counters.finished >= 2, 10, "both finishes counted")
    assert kubelet.ended[f"{scene.namespace}/{scene.pods('first')[0]['metadata']['name']}"][0] == "Succeeded"

    def finish_events() -> list[dict[str, Any]]:
        return [e for e in scene.events("Finished") if e["involvedObject"]["kind"] == "Workload"]

    wait_until(lambda: len(finish_events()) >= 2, 10, "a Finished Event per Workload")


def test_a_failed_job_finishes_its_workload_as_failed_and_frees_its_gpus(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.kubelet()
    scene.controller(leader_election=False)
    scene.submit(running_job(scene, "crash", 1, gpus=8, exit_code=3), running_job(scene, "next", 1, gpus=8))

    wait_until(lambda: finished(scene.workloads().get("crash")), 30, "the failed job's Workload finished")
    condition = finished(scene.workloads()["crash"])
    assert condition is not None
    assert condition["reason"] == "Failed", condition
    wait_until(lambda: finished(scene.workloads().get("next")), 30, "the next job ran in the freed GPUs")
    assert finished(scene.workloads()["next"])["reason"] == "Succeeded"  # type: ignore[index]


def test_a_whole_gang_finishes_once_every_pod_has_succeeded(scene: Scene) -> None:
    scene.setup(nodes=2, gpus_per_node=8)
    scene.job_controller()
    scene.kubelet()
    scene.controller(leader_election=False)
    scene.submit(running_job(scene, "gang", 1, pods=2, gpus=8), running_job(scene, "then", 1, pods=2, gpus=8))

    wait_until(lambda: finished(scene.workloads().get("gang")), 30, "the gang's Workload finished")
    assert scene.jobs()["gang"]["status"].get("succeeded") == 2
    wait_until(lambda: finished(scene.workloads().get("then")), 30, "the gang behind it ran and finished")
    nodes = {p["spec"]["nodeName"] for p in scene.pods("then")}
    assert len(nodes) == 2, "each 8-GPU pod on its own node"


def test_deleting_a_job_deletes_its_workload_and_frees_its_quota(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.kubelet()
    scene.controller(leader_election=False)
    scene.submit(running_job(scene, "forever", 3600, gpus=8), running_job(scene, "waiting", 1, gpus=8))
    wait_until(lambda: scene.bound("forever", 1), 30, "the long job bound")
    assert not scene.admitted("waiting")

    scene.kubectl("delete", "job", "forever", "-n", scene.namespace, "--wait=false")
    # The controller deletes the Workload of a job that is gone (on a real cluster the garbage
    # collector may do it first); no test stand-in deletes it here.
    wait_until(lambda: "forever" not in scene.workloads(), 30, "the deleted job's Workload gone")
    wait_until(lambda: finished(scene.workloads().get("waiting")), 40, "the waiting job ran and finished")


def test_a_restarted_controller_finishes_what_ended_while_it_was_down(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    run = scene.controller(leader_election=False)
    scene.submit(running_job(scene, "short", 1, gpus=8), running_job(scene, "waits", 1, gpus=8))
    wait_until(lambda: scene.bound("short", 1), 30, "the first job bound")
    run.stop()

    scene.kubelet()  # the job runs and ends while no controller runs
    wait_until(
        lambda: (scene.jobs()["short"].get("status") or {}).get("succeeded") == 1, 30, "the job completed"
    )
    assert not finished(scene.workloads()["short"]), "nothing finished it yet"
    scene.controller(leader_election=False)
    wait_until(lambda: finished(scene.workloads().get("short")), 30, "finished by the new controller")
    wait_until(lambda: finished(scene.workloads().get("waits")), 30, "and the queued job ran after it")


def test_a_preempted_job_restarts_from_its_checkpoint_and_finishes(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8, preemption={"withinClusterQueue": "LowerPriority"})
    low, high = scene.priority_class("low", 10), scene.priority_class("high", 1000)
    scene.job_controller()
    kubelet = scene.kubelet(speedup=20)  # 20 virtual seconds a second
    scene.controller(leader_election=False, dry_run=False)
    trainer = running_job(scene, "trainer", 200, gpus=8, checkpoint=20).priority_class(low)
    scene.submit(trainer)
    wait_until(lambda: kubelet.started, 30, "the trainer running")
    wait_until(lambda: any(v >= 3 for v in _run_for(kubelet)), 30, "three seconds of wall time run")

    scene.submit(running_job(scene, "urgent", 20, gpus=8).priority_class(high))
    wait_until(lambda: finished(scene.workloads().get("urgent")), 40, "the urgent job preempted and ran")
    saved = dict(kubelet.kept)
    assert saved, "the trainer's saved work is kept"
    assert all(v >= 40 and v % 20 == 0 for v in saved.values()), f"whole checkpoints kept: {saved}"
    wait_until(lambda: finished(scene.workloads().get("trainer")), 40, "the trainer resumed and finished")
    assert finished(scene.workloads()["trainer"])["reason"] == "Succeeded"  # type: ignore[index]
    starts = [k for k in kubelet.started if k.startswith(f"{scene.namespace}/trainer-")]
    assert len(starts) == 2, f"the trainer ran twice: {starts}"


def _run_for(kubelet: Any) -> list[float]:
    """Wall seconds each running pod has run so far."""
    now = kubelet.clock()
    return [now - r.started for r in list(kubelet.running.values())]


def test_pods_of_a_running_job_that_will_not_run_again_give_their_gpus_back(scene: Scene) -> None:
    # An Indexed Job of three completions, two at a time, 4 GPUs a pod, in an 8-GPU queue: once
    # indexes 0 and 1 have succeeded only index 2 is left to run, so one pod's 4 GPUs are
    # reclaimable (Kueue's reclaimablePods) and the 4-GPU job queued behind runs beside it.
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.kubelet()
    scene.controller(leader_election=False)
    trio = scene.job("trio", pods=2, gpus=4, annotations={RUN_SECONDS: "3,3,600"})
    trio.set("spec.completions", 3).set("spec.completionMode", "Indexed").set("spec.backoffLimit", 0)
    scene.submit(trio, running_job(scene, "waiter", 1, gpus=4))

    wait_until(lambda: scene.bound("trio", 2), 30, "two pods of the trio bound")
    assert not scene.admitted("waiter")
    wait_until(
        lambda: finished(scene.workloads().get("waiter")), 40, "the small job ran beside the trio's last pod"
    )
    trio_wl = scene.workloads()["trio"]
    assert not finished(trio_wl), "the trio still runs its last index"
    assert trio_wl["status"].get("reclaimablePods") == [{"name": "main", "count": 1}]
    wait_until(
        lambda: [p for p in scene.pods("trio") if (p.get("status") or {}).get("phase") == "Running"],
        20,
        "the trio's last pod bound and running beside the waiter's",
    )
