"""`gpuplane why --kubeconfig` on a MultiKueue manager: the Fleet section (one line per worker:
health, GPUs used/quota, pending/admitted) and ``"fleet"`` in JSON, read from the MultiKueueClusters'
``Active`` condition and the summary annotation the controller writes; nothing more where the cluster
has none, the credentials may not list them (403) or the CRD is not served (404).

On the API-server double, with Kueue's CRDs from ``deploy/crds``."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from typer.testing import CliRunner

from apiserver.server import ApiServerDouble
from controller_harness import install_crds
from gpuplane.cli.app import build_app
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.k8s.multikueue_fleet import SUMMARY_ANNOTATION
from gpuplane.model.objects import Workload
from gpuplane.web.fleet import fleet_worker, placement_of, read_fleet
from web_fleet_scene import BIG as BIG_LOST
from web_fleet_scene import SMALL
from why_cases import base, holder

pytestmark = pytest.mark.timeout(120)


def worker_cluster(name: str, summary: dict[str, Any] | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if summary is not None:
        meta["annotations"] = {SUMMARY_ANNOTATION: json.dumps(summary)}
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "MultiKueueCluster",
        "metadata": meta,
        "spec": {
            "clusterSource": {"kubeConfig": {"locationType": "Secret", "location": f"{name}-kubeconfig"}}
        },
    }


def set_active(api: KubeApi, name: str, status: str, reason: str, message: str) -> None:
    obj = api.get(k8s.MULTIKUEUE_CLUSTERS, name)
    obj["status"] = {
        "conditions": [
            {
                "type": "Active",
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": "2026-03-01T09:00:00Z",
            }
        ]
    }
    api.replace(k8s.MULTIKUEUE_CLUSTERS, obj, sub="status")


@pytest.fixture
def manager(double: ApiServerDouble) -> tuple[ApiServerDouble, KubeApi]:
    """A manager with one admitted workload ``default/big`` (8 GPUs), dispatched to worker ``small``."""
    api = KubeApi(load_api_client(str(double.kubeconfig_path)), qps=None)
    install_crds(api)
    resources = {
        "ResourceFlavor": k8s.RESOURCE_FLAVORS,
        "ClusterQueue": k8s.CLUSTER_QUEUES,
        "LocalQueue": k8s.LOCAL_QUEUES,
    }
    for item in base():
        doc = item.to_dict()
        if doc["kind"] == "Namespace":
            continue  # the double has "default"
        api.create(resources[doc["kind"]], doc, doc["metadata"].get("namespace"))
    wl = holder("big", 8).to_dict()
    status = wl.pop("status")
    created = api.create(k8s.WORKLOADS, wl, "default")
    created["status"] = {**status, "clusterName": "small"}
    api.replace(k8s.WORKLOADS, created, sub="status")
    return double, api


def row(text: str, worker: str) -> str:
    """The Fleet table's line of ``worker`` (its cells, without the table's rules)."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.replace("\u2502", "|").split("|") if c.strip()]
        if cells[:1] == [worker]:
            return " ".join(cells)
    raise AssertionError(f"no line for {worker} in:\n{text}")


def why(double: ApiServerDouble, *extra: str) -> Any:
    result = CliRunner().invoke(
        build_app(), ["why", "big", "-n", "default", "--kubeconfig", str(double.kubeconfig_path), *extra]
    )
    assert result.exit_code == 0, result.output
    return result


def test_a_manager_shows_each_worker_and_where_the_workload_runs(
    manager: tuple[ApiServerDouble, KubeApi],
) -> None:
    double, api = manager
    api.create(k8s.MULTIKUEUE_CLUSTERS, worker_cluster("small", SMALL))
    api.create(k8s.MULTIKUEUE_CLUSTERS, worker_cluster("big", BIG_LOST))
    api.create(k8s.MULTIKUEUE_CLUSTERS, worker_cluster("new", None))  # no summary written yet
    set_active(api, "small", "True", "Active", "Connected")
    set_active(api, "big", "False", "ClientConnectionFailed", "connection refused")

    doc = json.loads(why(double, "-o", "json").stdout)
    fleet = {w["cluster"]: w for w in doc["fleet"]}
    assert list(fleet) == ["big", "new", "small"]
    assert fleet["small"] == {**SMALL, "message": "Connected"}
    assert fleet["big"]["active"] is False
    assert fleet["big"]["message"] == "connection refused"
    assert fleet["new"] == {
        "cluster": "new",
        "active": False,
        "message": "no Active condition yet",
        "quota": {},
        "usage": {},
        "pendingWorkloads": 0,
        "admittedWorkloads": 0,
    }
    assert doc["runsOn"] == "small"

    text = why(double).stdout
    assert "Fleet (MultiKueue workers)" in text
    lines = {name: row(text, name) for name in ("small", "big")}
    assert "Active" in lines["small"]
    assert "12/16" in lines["small"]
    assert "3/2" in lines["small"]
    assert "Inactive: connection refused" in lines["big"]
    assert lines["big"].split()[-2:] == ["-", "0/0"]  # GPUs not known; pending/admitted
    assert "default/big runs on: small" in text


def test_a_cluster_without_multikueue_clusters_prints_nothing_more(
    manager: tuple[ApiServerDouble, KubeApi],
) -> None:
    double, _ = manager
    assert "fleet" not in json.loads(why(double, "-o", "json").stdout)
    assert "Fleet" not in why(double).stdout


@pytest.mark.parametrize("code", [403, 404], ids=["forbidden", "crd-not-installed"])
def test_credentials_that_may_not_list_them_or_no_crd_print_nothing_more(
    manager: tuple[ApiServerDouble, KubeApi], code: int
) -> None:
    double, api = manager
    api.create(k8s.MULTIKUEUE_CLUSTERS, worker_cluster("small", SMALL))
    double.faults.fail(code, verbs=["list"], resource="multikueueclusters")
    assert read_fleet(api) == ()
    result = why(double, "-o", "json")
    assert "fleet" not in json.loads(result.stdout)
    assert "Fleet" not in why(double).stdout


def test_a_server_error_is_a_note_and_the_answer_stands(manager: tuple[ApiServerDouble, KubeApi]) -> None:
    double, api = manager
    api.create(k8s.MULTIKUEUE_CLUSTERS, worker_cluster("small", SMALL))
    double.faults.fail(500, verbs=["list"], resource="multikueueclusters")
    result = why(double, "-o", "json")
    assert json.loads(result.stdout)["workload"] == "default/big"
    assert "note: the MultiKueue fleet cannot be read" in result.stderr


def test_a_summary_that_does_not_parse_leaves_the_health() -> None:
    obj = worker_cluster("w", None)
    obj["metadata"]["annotations"] = {SUMMARY_ANNOTATION: "{not json"}
    obj["status"] = {
        "conditions": [{"type": "Active", "status": "True", "reason": "Active", "message": "ok"}]
    }
    worker = fleet_worker(obj)
    assert worker.summary is None
    assert worker.health == "Active"
    assert worker.gpus(["nvidia.com/gpu"]) is None
    assert worker.resources() == ()


def test_placement_of_a_workload() -> None:
    plain = Workload("ns", "w", "uid", 0.0, 0, ())
    assert placement_of(plain) == ""
    assert placement_of(replace(plain, nominated_clusters=("a", "b"))) == "nominated: a, b"
    assert placement_of(replace(plain, cluster_name="a", nominated_clusters=("a",))) == "a"
