"""The controller and its read-only commands on a real API server (the ``real_kube`` control plane, or
the cluster of ``GPUPLANE_E2E_KUBECONFIG``), checked with the real kubectl:

- ``kubectl describe workload`` tells why a workload waits (reason, position, message), and
  ``kubectl describe pod`` that a pod waits for the rest of its gang;
- ``gpuplane schedule --kubeconfig`` and ``gpuplane dump`` decide on the live cluster and change no
  object (every resourceVersion stays as it was);
- a kubeconfig with ``insecure-skip-tls-verify`` works (pytest turns warnings into errors).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from apiserver.fixtures import RealCluster
from controller_harness import Scene, Webhooks, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, Resource, load_api_client
from realkube import RealKube

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def real_scene(real_kube: RealKube, webhooks: Webhooks) -> Iterator[Scene]:
    webhooks.ensure(str(real_kube.kubeconfig))
    yield from make_scene(RealCluster(real_kube.kubeconfig), real_kube.kubectl)


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == ctype), {})


def gpuplane(*args: str) -> subprocess.CompletedProcess[str]:
    """The ``gpuplane`` command line, run as a user runs it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "gpuplane", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


# --- kubectl describe tells the story --------------------------------------------------------------


def test_kubectl_describe_shows_why_a_workload_waits_and_that_a_pod_waits_for_its_gang(
    real_scene: Scene,
) -> None:
    scene = real_scene
    scene.setup(nodes=2, quota_gpus=8)
    jc = scene.job_controller()
    jc.pod_limit = 3  # the namespace holds three pods: the gang's fourth cannot be created yet
    scene.controller(leader_election=False)
    scene.submit(scene.job("gang", pods=4, gpus=2))
    wait_until(lambda: scene.admitted("gang"), 20, "the gang admitted")
    scene.submit(scene.job("waits", gpus=8))  # the gang holds all the quota
    wait_until(lambda: condition(scene.workloads().get("waits") or {}, "QuotaReserved"), 20, "waits pending")
    wait_until(lambda: len(scene.events("WaitingForGang")) >= 3, 20, "an Event on each waiting pod")

    waits = scene.workloads()["waits"]
    pending = condition(waits, "QuotaReserved")
    assert pending["status"] == "False"
    described = scene.kubectl(
        "describe", "workloads.kueue.x-k8s.io", waits["metadata"]["name"], "-n", scene.namespace
    ).stdout
    assert "QuotaReserved" in described
    assert pending["reason"] in described
    assert pending["message"].split(".")[0] in " ".join(described.split())
    events = described[described.index("Events:") :]
    assert "Pending" in events
    assert "position 1 in ClusterQueue" in " ".join(events.split())

    pod = next(p for p in scene.pods("gang") if not p["spec"].get("nodeName"))
    described = scene.kubectl("describe", "pod", pod["metadata"]["name"], "-n", scene.namespace).stdout
    events = " ".join(described[described.index("Events:") :].split())
    assert "WaitingForGang" in events
    assert re.search(r"Waiting for the whole gang of Workload \S+: [1-3] of 4 pods exist", events), events

    jc.pod_limit = None
    wait_until(lambda: scene.bound("gang", 4), 60, "the whole gang bound once its last pod exists")


# --- read-only commands on the live cluster -----------------------------------------------------------


def versions(scene: Scene) -> dict[tuple[str, str], str]:
    """The resourceVersion of every object of the scene (its namespace's objects of the kinds a
    decision reads, and its cluster-scoped objects)."""
    out: dict[tuple[str, str], str] = {}
    kinds: list[Resource] = [k8s.PODS, k8s.JOBS, k8s.WORKLOADS, k8s.LOCAL_QUEUES, k8s.EVENTS]
    kinds += [k8s.NODES, k8s.RESOURCE_FLAVORS, k8s.CLUSTER_QUEUES, k8s.PRIORITY_CLASSES, k8s.NAMESPACES]
    for res in kinds:
        for obj in scene.list(res):
            meta = obj["metadata"]
            mine = res.namespaced or meta["name"].startswith(scene.prefix)
            if mine:
                out[(res.kind, meta["name"])] = meta["resourceVersion"]
    return out


def test_schedule_kubeconfig_and_dump_decide_on_the_live_cluster_and_write_nothing(
    real_scene: Scene, real_kube: RealKube, tmp_path: Path
) -> None:
    scene = real_scene
    scene.setup(nodes=1)
    scene.job_controller()
    run = scene.controller(leader_election=False)
    scene.submit(scene.job("runs", gpus=6))
    wait_until(lambda: scene.bound("runs", 1), 20, "runs bound")
    run.stop()  # from here on, nothing of gpuplane's writes
    scene.submit(scene.job("fits", gpus=2), scene.job("waits", gpus=4))  # queued, no Workload yet
    wait_until(lambda: len(scene.jobs()) == 3, 10, "the jobs stored")
    before = versions(scene)
    assert len(before) > 10

    kubeconfig = str(real_kube.kubeconfig)
    live = gpuplane("schedule", "--kubeconfig", kubeconfig, "-o", "json")
    assert live.returncode == 0, live.stderr
    plan = json.loads(live.stdout)
    ours = f"{scene.namespace}/"
    admitted = [a for a in plan["admitted"] if a["workload"].startswith(ours)]
    pending = [p for p in plan["pending"] if p["workload"].startswith(ours)]
    assert len(admitted) == 1, "the 2-GPU job fits beside the running one"
    assert admitted[0]["podSets"][0]["placement"][0]["node"] == f"{scene.prefix}-n0"
    assert len(pending) == 1, "the 4-GPU job does not"

    dumped = gpuplane("dump", "--kubeconfig", kubeconfig)
    assert dumped.returncode == 0, dumped.stderr
    state = tmp_path / "state.yaml"
    state.write_text(dumped.stdout)
    kinds = {doc["kind"] for doc in yaml.safe_load_all(dumped.stdout)}
    assert {
        "Namespace",
        "Node",
        "ClusterQueue",
        "LocalQueue",
        "ResourceFlavor",
        "Workload",
        "Job",
        "Pod",
    } <= kinds
    from_file = gpuplane("schedule", "-f", str(state), "-o", "json")
    assert from_file.returncode == 0, from_file.stderr
    replayed = json.loads(from_file.stdout)
    assert [a["workload"] for a in replayed["admitted"] if a["workload"].startswith(ours)] == [
        a["workload"] for a in admitted
    ]
    assert [(p["workload"], p["reason"]) for p in replayed["pending"] if p["workload"].startswith(ours)] == [
        (p["workload"], p["reason"]) for p in pending
    ]

    assert versions(scene) == before, "no object changed"


def test_schedule_kubeconfig_refuses_what_it_cannot_read_in_one_line(tmp_path: Path) -> None:
    missing = gpuplane("schedule", "--kubeconfig", str(tmp_path / "nope"), "-o", "json")
    assert missing.returncode == 2
    assert missing.stderr.startswith("error: ")
    assert len(missing.stderr.strip().splitlines()) == 1
    both = gpuplane("schedule", "-f", "x.yaml", "--kubeconfig", str(tmp_path / "nope"))
    assert both.returncode == 2
    assert "either" in both.stderr
    dumped = gpuplane("dump", "--kubeconfig", str(tmp_path / "nope"))
    assert dumped.returncode == 2
    assert dumped.stderr.startswith("error: cannot read the cluster")


# --- an insecure kubeconfig -------------------------------------------------------------------------


def test_a_kubeconfig_that_skips_tls_verification_works(real_kube: RealKube, tmp_path: Path) -> None:
    config = yaml.safe_load(real_kube.kubeconfig.read_text())
    for entry in config["clusters"]:
        entry["cluster"].pop("certificate-authority-data", None)
        entry["cluster"].pop("certificate-authority", None)
        entry["cluster"]["insecure-skip-tls-verify"] = True
    insecure = tmp_path / "insecure.kubeconfig"
    insecure.write_text(yaml.safe_dump(config))
    api = KubeApi(load_api_client(str(insecure)))
    try:
        names = {ns["metadata"]["name"] for ns in api.list(k8s.NAMESPACES)["items"]}
    finally:
        api.api_client.close()  # type: ignore[no-untyped-call]
    assert "default" in names
