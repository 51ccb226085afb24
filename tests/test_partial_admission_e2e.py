"""Partial admission of a batch Job through the controller, as Kueue does it.

A Job with ``kueue.x-k8s.io/job-min-parallelism`` gets a Workload whose pod set has that
``minCount``. When the queue has no room for all its pods, the controller admits as many as fit
(at least the minimum), releases the Job with ``spec.parallelism`` set to the admitted count
(``spec.completions`` too when ``kueue.x-k8s.io/job-completions-equal-parallelism`` is true), and
binds the pods the Job controller then starts. Run unchanged on a real API server with
``GPUPLANE_E2E_KUBECONFIG``.
"""

from __future__ import annotations

from typing import Any

import pytest

from controller_harness import Scene, wait_until
from gpuplane.model.labels import COMPLETIONS_EQUAL_PARALLELISM, MIN_PARALLELISM

pytestmark = pytest.mark.timeout(90)


def assignment(wl: dict[str, Any]) -> dict[str, Any]:
    (psa,) = wl["status"]["admission"]["podSetAssignments"]
    return dict(psa)


def test_a_job_with_min_parallelism_runs_the_pods_that_fit(scene: Scene) -> None:
    # 8 GPUs; the Job asks for 4 pods of 4 GPUs and accepts 2.
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("partial", pods=4, gpus=4).annotate(MIN_PARALLELISM, "2"))

    wait_until(lambda: scene.bound("partial", 2), 30, "two pods of the partially admitted Job bound")
    wl = scene.workloads()["partial"]
    (pod_set,) = wl["spec"]["podSets"]
    assert (pod_set["count"], pod_set["minCount"]) == (4, 2)
    assert assignment(wl)["count"] == 2
    job = scene.jobs()["partial"]
    assert job["spec"]["suspend"] is False
    assert job["spec"]["parallelism"] == 2, "released with the admitted count"
    assert job["spec"]["completions"] == 4, "completions stay without the opt-in annotation"
    assert len(scene.pods("partial")) == 2


def test_completions_follow_the_admitted_parallelism_when_the_job_asks(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.controller(leader_election=False)
    built = (
        scene.job("indexed", pods=4, gpus=4)
        .annotate(MIN_PARALLELISM, "1")
        .annotate(COMPLETIONS_EQUAL_PARALLELISM, "true")
        .set("spec.completionMode", "Indexed")
    )
    scene.submit(built)

    wait_until(lambda: scene.bound("indexed", 2), 30, "two pods of the Indexed Job bound")
    assert assignment(scene.workloads()["indexed"])["count"] == 2
    spec = scene.jobs()["indexed"]["spec"]
    assert (spec["parallelism"], spec["completions"]) == (2, 2)


def test_a_job_that_fits_whole_runs_whole(scene: Scene) -> None:
    scene.setup(nodes=2, gpus_per_node=8)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("whole", pods=4, gpus=4).annotate(MIN_PARALLELISM, "2"))

    wait_until(lambda: scene.bound("whole", 4), 30, "all four pods bound")
    assert assignment(scene.workloads()["whole"])["count"] == 4
    assert scene.jobs()["whole"]["spec"]["parallelism"] == 4
