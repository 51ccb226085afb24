"""The reaper and the queue together on the real control plane: an idle session Job in an interactive
queue is reclaimed through its Workload (Kueue's ``Evicted`` condition), never by flipping the Job's
``suspend`` itself, and the controller suspends it, requeues it and later resumes it through its queue.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from apiserver.fixtures import RealCluster
from controller_harness import CRD_DIR, Scene
from gpuplane.insight import idle
from gpuplane.k8s.api import load_api_client
from gpuplane.k8s.controller import Controller
from gpuplane.reaper.cluster import ClusterApi
from gpuplane.reaper.loop import IDLE_REASON, Reaper, ReaperConfig
from gpuplane.reaper.prometheus import PrometheusClient
from prometheus import PrometheusFactory
from realkube import RealKube
from reaper_scene import history, reaper_user, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

GRACE = 300.0


@pytest.fixture
def scene(real_kube: RealKube) -> Iterator[Scene]:
    if not hasattr(Controller, "_stop_evicted"):
        pytest.skip("needs the controller's Kueue eviction (it stops the job of a Workload marked Evicted)")
    # Kueue's CRDs where missing; never deleted (other tests share the API server).
    real_kube.kubectl("apply", "-f", str(CRD_DIR))

    def kubectl(*args: str, input: str | None = None, check: bool = True) -> Any:
        return real_kube.kubectl(*args, input=input, check=check)

    built = Scene(RealCluster(real_kube.kubeconfig), kubectl)
    try:
        yield built
    finally:
        built.cleanup()


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == ctype), None)


def live_pods(scene: Scene, job: str) -> list[dict[str, Any]]:
    return [p for p in scene.pods(job) if not p["metadata"].get("deletionTimestamp")]


@pytest.fixture
def reaper_kubeconfig(scene: Scene, real_kube: RealKube) -> Iterator[Path]:
    """A user holding only the reaper's ClusterRole (deploy/reaper/reaper.yaml), as the reaper runs."""
    with reaper_user(real_kube, scene.namespace) as kubeconfig:
        yield kubeconfig


def test_idle_session_job_is_suspended_through_its_workload_and_resumes_through_its_queue(
    scene: Scene, prometheus_factory: PrometheusFactory, reaper_kubeconfig: Path
) -> None:
    scene.setup(nodes=1)
    scene.kubectl(
        "-n", scene.namespace, "annotate", "localqueue", "queue", f"{idle.INTERACTIVE_ANNOTATION}=true"
    )
    scene.submit(scene.job("desk", gpus=1))
    scene.controller(dry_run=False)
    wait_until(lambda: scene.bound("desk", 1), timeout=60, message="the session's pod bound")
    first = live_pods(scene, "desk")[0]
    now = float(int(time.time()))
    backfill = history(
        {(idle.GR_ENGINE_ACTIVE, first["metadata"]["name"]): lambda _t: 0.0},
        namespace=scene.namespace,
        node=first["spec"]["nodeName"],
        start=now - 3 * 3600,
        end=now,
    )
    prom = prometheus_factory(backfill=backfill)
    reaper = Reaper(
        ClusterApi(load_api_client(str(reaper_kubeconfig))),
        PrometheusClient(prom.url),
        ReaperConfig(defaults=idle.IdleSettings(grace=GRACE), enforce=True, namespaces=(scene.namespace,)),
    )

    (warned,) = reaper.run_once(now)
    assert (warned.decision.action, warned.subject.klass) == (idle.Action.WARN, idle.WorkloadClass.SESSION)
    assert (warned.subject.owner.kind, warned.subject.owner.name) == ("Job", "desk")
    job = scene.jobs()["desk"]
    assert idle.RECLAIM_AT_ANNOTATION in job["metadata"]["annotations"]

    (reclaimed,) = reaper.run_once(now + GRACE)
    assert reclaimed.decision.action is idle.Action.RECLAIM
    # The reaper wrote only the Workload's condition (and Events); the Job's suspend is the queue's.
    assert {e["involvedObject"]["kind"] for e in scene.events(IDLE_REASON)} >= {"Job", "Pod"}
    wait_until(
        lambda: first["metadata"]["name"] not in {p["metadata"]["name"] for p in live_pods(scene, "desk")},
        timeout=60,
        message="the idle pod stopped",
    )
    # Requeued and admitted again: the job resumes with a new pod, bound through its queue.
    wait_until(
        lambda: scene.bound("desk", 1) and not scene.jobs()["desk"]["spec"].get("suspend"),
        timeout=60,
        message="the session resumed",
    )
    workload = scene.workloads()["desk"]
    assert (workload.get("status") or {}).get("admission")
    admitted = condition(workload, "Admitted")
    assert admitted is not None
    assert admitted["status"] == "True"
