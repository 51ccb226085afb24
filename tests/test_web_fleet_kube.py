"""The console's Fleet panel on the real control plane: MultiKueueClusters from the real CRD (their
``Active`` condition written through the status subresource), followed by the console's informer, and
the real API server's RBAC deciding who sees the panel (a TokenReview, then SubjectAccessReviews).

carol may list MultiKueueClusters (a ClusterRole this module grants) and nothing else: she sees the
panel and no workload. alice is granted nothing here: her overview has no panel, and no error."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.testclient import TestClient

from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.web.app import create_app
from gpuplane.web.auth import KubeAuthenticator
from gpuplane.web.sources import KubeSource, Pacing, SnapshotHub
from realkube import RealKube
from web_fleet_scene import fleet_objects

pytestmark = pytest.mark.slow

CRDS = Path(__file__).resolve().parent.parent / "deploy" / "crds"
KIND = "multikueueclusters.kueue.x-k8s.io"


@pytest.fixture(scope="module")
def fleet(real_kube: RealKube) -> Iterator[dict[str, Any]]:
    for user in ("alice", "carol"):
        real_kube.token(user)  # skips on a cluster given by GPUPLANE_E2E_KUBECONFIG (no token users)
    real_kube.kubectl("apply", "-f", str(CRDS))
    real_kube.kubectl("wait", "--for=condition=established", "--timeout=60s", "-f", str(CRDS))
    prefix = f"fleet{os.getpid()}-"
    names = []
    for obj in fleet_objects():
        status = obj.pop("status")
        obj["metadata"]["name"] = name = prefix + obj["metadata"]["name"]
        names.append(name)
        real_kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj))
        real_kube.kubectl(
            "patch",
            KIND,
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": status}),
        )
    role = f"{prefix}fleet-reader"
    rbac = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {"apiGroups": ["kueue.x-k8s.io"], "resources": ["multikueueclusters"], "verbs": ["list"]}
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "name": "carol", "apiGroup": "rbac.authorization.k8s.io"}],
        },
    ]
    real_kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(rbac))
    api = KubeApi(load_api_client(str(real_kube.kubeconfig)))
    hub = SnapshotHub()
    source = KubeSource(api, hub, pacing=Pacing(settle=0.05, min_interval=0.2), watch_timeout=5)
    source.start()
    try:
        yield {"kube": real_kube, "names": names, "hub": hub, "source": source, "api": api}
    finally:
        source.stop()
        for kind in ("clusterrolebinding", "clusterrole"):
            real_kube.kubectl("delete", kind, role, "--wait=false", check=False)
        for name in names:
            real_kube.kubectl("delete", KIND, name, "--wait=false", check=False)


def overview(fleet: dict[str, Any], token: str) -> str:
    auth = KubeAuthenticator(fleet["api"], fleet["source"].namespaces)
    with TestClient(create_app(fleet["hub"], auth)) as client:
        response = client.get("/", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200, response.text[:300]
    return str(response.text)


def test_the_console_follows_the_real_multikueue_clusters(fleet: dict[str, Any]) -> None:
    small, big = fleet["names"]
    deadline = time.monotonic() + 30
    mine: dict[str, Any] = {}
    while time.monotonic() < deadline:
        snap = fleet["hub"].current()
        mine = {w.name: w for w in (snap.fleet if snap is not None else ()) if w.name in (small, big)}
        if len(mine) == 2 and mine[small].active:
            break
        time.sleep(0.1)
    assert mine[small].health == "Active"
    assert mine[small].gpus(["nvidia.com/gpu"]) == (12.0, 16.0)
    assert mine[big].health == "Inactive: connection refused"

    html = overview(fleet, fleet["kube"].token("carol"))
    assert 'data-test="fleet"' in html
    assert f'data-worker="{small}"' in html
    assert "nvidia.com/gpu 12/16" in html


def test_a_viewer_rbac_does_not_let_list_them_sees_no_panel(fleet: dict[str, Any]) -> None:
    html = overview(fleet, fleet["kube"].token("alice"))
    assert 'data-test="fleet"' not in html
    assert fleet["names"][0] not in html
