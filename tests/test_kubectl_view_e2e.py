"""What a kubectl user sees of gpuplane's work: queue status and columns, Events on bound pods.

Runs against the API-server double, and unchanged against a real control plane with
``GPUPLANE_E2E_KUBECONFIG`` (scripts/test.sh runs it there too).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from typing import Any

import pytest

from apiserver.fixtures import Kubectl
from controller_harness import Scene, wait_until
from gpuplane.k8s import api as k8s

pytestmark = pytest.mark.timeout(60)


def _counts(obj: dict[str, Any]) -> tuple[int, int, int]:
    status = obj.get("status") or {}
    return (
        status.get("pendingWorkloads", -1),
        status.get("reservingWorkloads", -1),
        status.get("admittedWorkloads", -1),
    )


def _columns(kubectl: Kubectl, *args: str) -> dict[str, str]:
    """The header and the one row of ``kubectl get``, as column name -> value."""
    header, row = kubectl("get", *args).stdout.splitlines()[:2]
    # Column names may hold one space ("PENDING WORKLOADS"); columns are two spaces apart or more.
    names, cuts, i = [], [], 0
    while i < len(header):
        if header[i] == " ":
            i += 1
            continue
        end = header.find("  ", i)
        end = len(header) if end < 0 else end
        names.append(header[i:end])
        cuts.append(i)
        i = end
    bounds = [*cuts, max(len(row), len(header)) + 1]
    return {name: row[bounds[n] : bounds[n + 1]].strip() for n, name in enumerate(names)}


def test_queue_status_counts_and_kubectl_columns(scene: Scene, kubectl: Kubectl) -> None:
    cq = scene.setup(nodes=1)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("fits", gpus=6))
    wait_until(lambda: scene.bound("fits", 1), 20, "the first job bound")
    scene.submit(scene.job("waits", gpus=4))  # 4 more GPUs do not fit in 8

    def cq_status() -> dict[str, Any]:
        return scene.api.get(k8s.CLUSTER_QUEUES, cq)

    wait_until(
        lambda: _counts(cq_status()) == (1, 1, 1),
        20,
        "ClusterQueue counts 1 pending, 1 reserving, 1 admitted",
    )
    status = cq_status()["status"]
    (usage,) = status["flavorsUsage"]
    gpu = {r["name"]: r for r in usage["resources"]}["nvidia.com/gpu"]
    assert (usage["name"], gpu["total"], gpu["borrowed"]) == (scene.flavor, "6", "0")
    active = next(c for c in status["conditions"] if c["type"] == "Active")
    assert (active["status"], active["reason"]) == ("True", "Ready")

    lq = lambda: scene.api.get(k8s.LOCAL_QUEUES, "queue", scene.namespace)  # noqa: E731
    wait_until(lambda: _counts(lq()) == (1, 1, 1), 20, "LocalQueue counts")
    (lq_usage,) = lq()["status"]["flavorsUsage"]
    assert {r["name"]: r["total"] for r in lq_usage["resources"]}["nvidia.com/gpu"] == "6"

    cols = _columns(kubectl, "clusterqueue", cq)
    assert (cols["PENDING WORKLOADS"], cols["ADMITTED WORKLOADS"]) == ("1", "1")
    assert "COHORT" in cols
    cols = _columns(kubectl, "localqueue", "queue", "-n", scene.namespace)
    assert (cols["CLUSTERQUEUE"], cols["PENDING WORKLOADS"], cols["ADMITTED WORKLOADS"]) == (cq, "1", "1")


def test_a_cluster_queue_with_a_missing_flavor_is_inactive(scene: Scene) -> None:
    scene.setup(nodes=1)
    name = f"{scene.prefix}-broken"
    body = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": {},
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": f"{scene.prefix}-nowhere",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}],
                        }
                    ],
                }
            ],
        },
    }
    scene._create(k8s.CLUSTER_QUEUES, body)
    scene.controller(leader_election=False)

    def active() -> dict[str, Any] | None:
        conditions = (scene.api.get(k8s.CLUSTER_QUEUES, name).get("status") or {}).get("conditions") or []
        return next((c for c in conditions if c["type"] == "Active"), None)

    cond = wait_until(active, 20, "the Active condition written")
    assert (cond["status"], cond["reason"]) == ("False", "FlavorNotFound")
    assert f"{scene.prefix}-nowhere" in cond["message"]


def test_each_bound_pod_gets_a_scheduled_event(scene: Scene) -> None:
    scene.setup(nodes=1)
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("pair", pods=2, gpus=2))
    wait_until(lambda: scene.bound("pair", 2), 20, "both pods bound")
    pods = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in scene.pods("pair")}

    def scheduled() -> dict[str, str]:
        return {
            e["involvedObject"]["name"]: e["message"]
            for e in scene.events("Scheduled")
            if e["involvedObject"].get("kind") == "Pod"
        }

    wait_until(lambda: len(scheduled()) == 2, 20, "a Scheduled Event per pod")
    events = scheduled()
    for pod, node in pods.items():
        assert events[pod] == f"Successfully assigned {scene.namespace}/{pod} to {node}"


def _json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_info_logs_name_each_workload_and_leadership(scene: Scene, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="gpuplane")
    scene.setup(nodes=1)
    scene.job_controller()
    run = scene.controller()  # with leader election, in the scene's namespace
    scene.submit(scene.job("pair", pods=2, gpus=2))
    wait_until(lambda: scene.bound("pair", 2), 20, "both pods bound")
    key = f"{scene.namespace}/{scene.workloads()['pair']['metadata']['name']}"
    wait_until(
        lambda: (
            {"admitted", "binding"}
            <= {getattr(r, "event", "") for r in caplog.records if getattr(r, "workload", "") == key}
        ),
        10,
        "admission and binding logged",
    )
    mine = [r for r in caplog.records if getattr(r, "workload", "") == key]
    assert [r.levelname for r in mine] == ["INFO"] * len(mine)
    assert [r.event for r in mine].count("binding") == 1, "one line per gang"  # type: ignore[attr-defined]
    binding = next(r for r in mine if r.event == "binding")  # type: ignore[attr-defined]
    assert key in binding.getMessage()
    assert "2 pods" in binding.getMessage()
    run.stop()
    events = [
        getattr(r, "event", "")
        for r in caplog.records
        if getattr(r, "lease", "") == f"{scene.namespace}/gpuplane-controller"
    ]
    assert events[:1] == ["leadership_acquired"]
    assert events[-1] == "leadership_released"


def test_controller_logs_one_json_object_per_line(scene: Scene) -> None:
    scene.setup(nodes=1)
    scene.submit(scene.job("one", gpus=1))
    command = [
        sys.executable, "-m", "gpuplane", "controller", "--kubeconfig", scene.kubeconfig, "--once",
        "--lease-namespace", scene.namespace, "--identity", "json-test", "--log-format", "json",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.strip().splitlines()
    records = _json_lines(done.stderr)
    assert len(records) == len(lines), "every line is a JSON object"
    assert all({"time", "level", "logger", "message"} <= r.keys() for r in records)
    events = {(r.get("event"), r.get("workload", r.get("identity"))) for r in records}
    key = f"{scene.namespace}/{scene.workloads()['one']['metadata']['name']}"
    assert ("leadership_acquired", "json-test") in events
    assert ("admitted", key) in events
