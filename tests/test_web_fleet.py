"""The console on a MultiKueue manager, without a browser: the Fleet panel (each worker's health,
quota and usage per resource, GPUs used/quota, pending and admitted workloads), the worker cluster
each workload runs on, who may see the panel, and how the fleet reaches the snapshot (the hub, and
the cluster source's own informer on the API-server double).

The browser test is ``test_web_fleet_browser.py``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from apiserver.server import ApiServerDouble
from controller_harness import install_crds
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.web import pages
from gpuplane.web.app import create_app
from gpuplane.web.auth import KubeAuthenticator, Viewer
from gpuplane.web.fleet import fleet_of
from gpuplane.web.sources import FileSource, KubeSource, Pacing, SnapshotHub
from manifests import documents
from web_fleet_scene import SMALL, fleet_objects, manager_yaml
from why_cases import base, pending

VIEWERS = {
    "admin": Viewer("admin"),
    "team": Viewer("team", (), frozenset({"default"}), sees_nodes=False, sees_fleet=False),
}


class Tokens:
    """Viewers by token, as an authenticator (what RBAC would have decided)."""

    def authenticate(self, token: str) -> Viewer | None:
        return VIEWERS.get(token)


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "manager.yaml"
    path.write_text(manager_yaml())
    return path


@pytest.fixture
def hub(state_file: Path) -> SnapshotHub:
    hub = SnapshotHub()
    FileSource([state_file], hub).load()
    return hub


@pytest.fixture
def client(hub: SnapshotHub) -> Iterator[TestClient]:
    with TestClient(create_app(hub, Tokens())) as test_client:
        yield test_client


def page(client: TestClient, path: str, token: str = "admin") -> str:
    response = client.get(path, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, (path, response.text[:300])
    return str(response.text)


def test_the_fleet_panel_lists_each_worker(hub: SnapshotHub, client: TestClient) -> None:
    hub.publish_fleet(fleet_of(fleet_objects()))
    snap = hub.current()
    assert snap is not None
    rows = {r.worker.name: r for r in pages.fleet(snap, VIEWERS["admin"])}
    assert list(rows) == ["big", "small"]
    small, big = rows["small"], rows["big"]
    assert (small.worker.health, small.gpus, small.worker.pending, small.worker.admitted) == (
        "Active",
        "12/16",
        3,
        2,
    )
    assert [(r.resource, r.used, r.quota) for r in small.worker.resources()] == [
        ("cpu", "4", "64"),
        ("nvidia.com/gpu", "12", "16"),
    ]
    assert (big.worker.health, big.gpus) == ("Inactive: connection refused", "-")

    html = page(client, "/")
    assert 'data-test="fleet"' in html
    assert 'data-worker="small"' in html
    assert "nvidia.com/gpu 12/16" in html
    assert "Inactive: connection refused" in html


def test_no_fleet_no_panel(client: TestClient) -> None:
    assert 'data-test="fleet"' not in page(client, "/")


def test_a_viewer_who_may_not_list_them_sees_no_panel_not_an_error(
    hub: SnapshotHub, client: TestClient
) -> None:
    hub.publish_fleet(fleet_of(fleet_objects()))
    html = page(client, "/", "team")
    assert 'data-test="fleet"' not in html
    assert "small" in html  # the workloads of the viewer's namespace still say where they run
    snap = hub.current()
    assert snap is not None
    assert pages.fleet(snap, VIEWERS["team"]) == []


def test_each_workload_shows_the_worker_it_runs_on(client: TestClient) -> None:
    html = page(client, "/")
    assert '<td data-test="runs-on">small</td>' in html
    assert '<td data-test="runs-on">nominated: small, big</td>' in html
    one = page(client, "/workloads/default/runs")
    assert '<span class="num" data-test="runs-on">small</span>' in one
    assert 'data-test="runs-on"' not in page(client, "/workloads/default/w")


def test_the_pending_list_shows_the_nominations(tmp_path: Path) -> None:
    """A workload still waiting on the manager while nominated shows the nominations in its
    LocalQueue's list; one that MultiKueue does not handle shows none."""
    state = tmp_path / "state.yaml"
    nominated = pending(gpu=4, cpu="1").set("status.nominatedClusterNames", ["big"])
    state.write_text(documents(*base(gpu_quota=2), nominated))
    hub = SnapshotHub()
    FileSource([state], hub).load()
    snap = hub.current()
    assert snap is not None
    assert [r.workload for r in snap.pending] == ["default/w"]
    assert pages.queues(snap, VIEWERS["admin"])["placements"] == {"default/w": "nominated: big"}
    with TestClient(create_app(hub, Tokens())) as client:
        html = page(client, "/queues")
    assert '<td data-test="runs-on">nominated: big</td>' in html
    assert pages.placements(snap, Viewer("other", (), frozenset({"elsewhere"}))) == {}


def test_the_hub_swaps_the_fleet_in_without_losing_the_explanations(hub: SnapshotHub) -> None:
    before = hub.current()
    assert before is not None
    assert before.explanations is not None  # a state file's snapshot is published explained
    fleet = fleet_of(fleet_objects())
    hub.publish_fleet(fleet)
    after = hub.current()
    assert after is not None
    assert after.version == before.version + 1
    assert after.fleet == fleet
    assert after.plan is before.plan
    assert after.explanations is before.explanations
    hub.publish_fleet(fleet)  # the same fleet again: no new version
    assert hub.version == after.version
    # An explanation of the plan still current is published, with the fleet swapped in meanwhile.
    assert hub.publish_if_current(before, before)
    latest = hub.current()
    assert latest is not None
    assert latest.fleet == fleet
    # A new plan keeps the fleet too.
    rebuilt = hub.publish(before)
    assert rebuilt.fleet == fleet


class ReviewApi:
    """A stand-in for TokenReview and SubjectAccessReview: one user, the grants given."""

    def __init__(self, grants: set[str]) -> None:
        self.grants = grants

    def create(self, res: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        del namespace
        if res.kind == "TokenReview":
            return {"status": {"authenticated": True, "user": {"username": "u", "groups": []}}}
        return {"status": {"allowed": body["spec"]["resourceAttributes"]["resource"] in self.grants}}


@pytest.mark.parametrize(
    ("grants", "sees"), [({"workloads", "multikueueclusters"}, True), ({"workloads"}, False)]
)
def test_rbac_on_multikueue_clusters_decides_the_panel(grants: set[str], sees: bool) -> None:
    auth = KubeAuthenticator(ReviewApi(grants), list)  # type: ignore[arg-type]
    viewer = auth.authenticate("t")
    assert viewer is not None
    assert viewer.sees_fleet is sees


# --- the cluster source on the API-server double ----------------------------------------------------


@pytest.fixture
def manager_api(double: ApiServerDouble) -> KubeApi:
    api = KubeApi(load_api_client(str(double.kubeconfig_path)), qps=None)
    install_crds(api)
    return api


def _until(predicate: Any, timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


@pytest.mark.timeout(90)
def test_the_cluster_source_follows_the_multikueue_clusters(manager_api: KubeApi) -> None:
    for obj in fleet_objects():
        status = obj.pop("status")
        created = manager_api.create(k8s.MULTIKUEUE_CLUSTERS, obj)
        manager_api.replace(k8s.MULTIKUEUE_CLUSTERS, {**created, "status": status}, sub="status")
    hub = SnapshotHub()
    source = KubeSource(manager_api, hub, pacing=Pacing(settle=0.05, min_interval=0.1))
    source.start()
    try:
        snap = _until(lambda: (s := hub.current()) is not None and len(s.fleet) == 2 and s)
        assert [w.name for w in snap.fleet] == ["big", "small"]
        # The controller writes a new summary: the fleet follows without a new plan.
        plan = snap.plan
        small = manager_api.get(k8s.MULTIKUEUE_CLUSTERS, "small")
        newer = {**SMALL, "usage": {"cpu": "4", "nvidia.com/gpu": "16"}}
        small["metadata"]["annotations"]["gpuplane.dev/worker-summary"] = json.dumps(newer)
        manager_api.replace(k8s.MULTIKUEUE_CLUSTERS, small)
        later = _until(
            lambda: (
                (s := hub.current()) is not None
                and any(
                    w.summary is not None and w.summary.usage.get("nvidia.com/gpu") == "16" for w in s.fleet
                )
                and s
            )
        )
        assert later.plan is plan
    finally:
        source.stop()


@pytest.mark.timeout(90)
def test_a_console_that_may_not_list_them_starts_at_once_and_shows_none(
    double: ApiServerDouble, manager_api: KubeApi
) -> None:
    for obj in fleet_objects():
        obj.pop("status")
        manager_api.create(k8s.MULTIKUEUE_CLUSTERS, obj)
    double.faults.fail(403, verbs=["list", "watch"], resource="multikueueclusters")
    hub = SnapshotHub()
    source = KubeSource(manager_api, hub)
    began = time.monotonic()
    source.start(wait=20)
    try:
        assert time.monotonic() - began < 10  # nothing waits for the fleet
        snap = hub.current()
        assert snap is not None
        assert snap.fleet == ()
    finally:
        source.stop()
