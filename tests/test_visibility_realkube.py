"""Kueue's visibility API from gpuplane, through an APIService on the real control plane.

The test process serves the aggregated API (``gpuplane.k8s.visibility``) on loopback; a Service of
type ExternalName ``localhost`` and two APIServices (v1beta1, v1beta2) route the real API server to
it. Real ``kubectl get --raw`` reads both paths; positions must be the ones ``gpuplane schedule``
prints (minus one: Kueue counts from 0); RBAC on the ``pendingworkloads`` subresources decides who
may read, through the API server's SubjectAccessReview.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpuplane.k8s.api import KubeApi
from gpuplane.k8s.state import read_objects, read_state
from gpuplane.k8s.visibility import Authorizer, CachedSource, VisibilityApp, self_signed, serve, view_of_state
from manifests import Manifest, cluster_queue, documents, local_queue, node, resource_flavor, workload
from realkube import RealKube

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
GROUP = "visibility.kueue.x-k8s.io"
SERVICE = "gpuplane-visibility"


@dataclass
class Visible:
    kube: RealKube
    ns: str
    cq: str


def _wait(predicate, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.25)


def cluster(ns: str, cq: str) -> list[Manifest]:
    """One node of 8 GPUs only this namespace's flavor selects; a ClusterQueue of 2 GPUs; five
    workloads of 2 GPUs in two LocalQueues: one is admitted, four wait in a known order."""
    pool = {"gpuplane.test/pool": ns}
    flavor = resource_flavor(f"{ns}-gpu").set("spec.nodeLabels", pool)
    items: list[Manifest] = [
        node(f"{ns}-n1")
        .allocatable(gpu=8, cpu="64", memory="256Gi", pods=110)
        .label("gpuplane.test/pool", ns),
        flavor,
        cluster_queue(cq).flavor(f"{ns}-gpu", gpu=2, cpu="64"),
        local_queue("first", ns, cq),
        local_queue("second", ns, cq),
    ]
    for i, (name, lq, priority) in enumerate(
        (
            ("w-a", "first", 0),
            ("w-b", "second", 0),
            ("w-c", "first", 5),
            ("w-d", "second", 0),
            ("w-e", "first", 0),
        )
    ):
        items.append(
            workload(name, ns)
            .queue(lq)
            .priority(priority)
            .created(f"2026-03-01T10:00:0{i}Z")
            .podset(gpu=2, cpu="1")
        )
    return items


@pytest.fixture
def visible(real_kube: RealKube, tmp_path: Path) -> Iterator[Visible]:
    real_kube.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    ns = real_kube.namespace("vis")
    cq = f"{ns}-cq"
    real_kube.kubectl("apply", "-f", "-", input=documents(*cluster(ns, cq)))
    client = real_kube.client()
    api = KubeApi(client)
    cert, key = self_signed([f"{SERVICE}.{ns}.svc", "localhost", "127.0.0.1"], tmp_path)
    source = CachedSource(lambda: view_of_state(read_state(api), time.time()), ttl=0.5)
    server = serve(
        VisibilityApp(source, Authorizer(api, ttl=0.0)),
        port=0,
        cert=str(cert),
        key=str(key),
        client_ca=str(real_kube.front_proxy_ca_file),
        host="127.0.0.1",
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_port
    bundle = base64.b64encode(cert.read_bytes()).decode()
    services = [
        f"""apiVersion: v1
kind: Service
metadata: {{name: {SERVICE}, namespace: {ns}}}
spec: {{type: ExternalName, externalName: localhost, ports: [{{port: {port}, name: https}}]}}
"""
    ]
    for version, priority in (("v1beta2", 200), ("v1beta1", 100)):
        services.append(
            f"""apiVersion: apiregistration.k8s.io/v1
kind: APIService
metadata: {{name: {version}.{GROUP}}}
spec:
  group: {GROUP}
  version: {version}
  groupPriorityMinimum: 100
  versionPriority: {priority}
  caBundle: {bundle}
  service: {{name: {SERVICE}, namespace: {ns}, port: {port}}}
"""
        )
    real_kube.kubectl("apply", "-f", "-", input="---\n".join(services))
    try:
        for version in ("v1beta2", "v1beta1"):
            _wait(lambda v=version: _available(real_kube, f"{v}.{GROUP}"), timeout=90)
        yield Visible(real_kube, ns, cq)
    finally:
        real_kube.kubectl(
            "delete", "apiservice", f"v1beta2.{GROUP}", f"v1beta1.{GROUP}", "--wait=false", check=False
        )
        real_kube.kubectl("delete", "node", f"{ns}-n1", "--wait=false", check=False)
        real_kube.kubectl("-n", ns, "delete", "workloads,localqueues", "--all", "--wait=false", check=False)
        real_kube.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)
        real_kube.kubectl("delete", "resourceflavor", f"{ns}-gpu", "--wait=false", check=False)
        server.shutdown()
        server.server_close()
        client.close()


def _available(kube: RealKube, name: str) -> bool:
    got = kube.kubectl("get", "apiservice", name, "-o", "json", check=False)
    if got.returncode != 0:
        return False
    conditions = json.loads(got.stdout).get("status", {}).get("conditions", [])
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def raw(kube: RealKube, path: str, kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    return kube.kubectl("get", "--raw", path, check=False, kubeconfig=kubeconfig)


def schedule_positions(kube: RealKube, ns: str, tmp_path: Path) -> dict[str, tuple[int, int]]:
    """``gpuplane schedule`` on the cluster's objects: workload -> (position, local queue position)."""
    client = kube.client()
    try:
        objects = read_objects(KubeApi(client))
    finally:
        client.close()
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    run = subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", "schedule", "-f", str(state), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return {
        p["workload"]: (p["position"], p["localQueuePosition"])
        for p in json.loads(run.stdout)["pending"]
        if p["workload"].startswith(f"{ns}/")
    }


def items(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["kind"] == "PendingWorkloadsSummary"
    return list(doc["items"])


def test_both_paths_give_the_positions_gpuplane_schedule_prints(visible: Visible, tmp_path: Path) -> None:
    kube, ns, cq = visible.kube, visible.ns, visible.cq
    want = schedule_positions(kube, ns, tmp_path)
    assert len(want) == 4  # one of five fits the 2-GPU quota
    for version in ("v1beta2", "v1beta1"):
        by_cq = items(raw(kube, f"/apis/{GROUP}/{version}/clusterqueues/{cq}/pendingworkloads"))
        assert [i["positionInClusterQueue"] for i in by_cq] == [0, 1, 2, 3]
        for item in by_cq:
            key = f"{item['metadata']['namespace']}/{item['metadata']['name']}"
            assert (item["positionInClusterQueue"] + 1, item["positionInLocalQueue"] + 1) == want[key]
            assert item["reason"]
            assert set(item["eta"]) == {"seconds", "low", "high", "basis"}
        # w-c has the highest priority: it is the one admitted; the rest wait in creation order
        assert [i["metadata"]["name"] for i in by_cq] == ["w-a", "w-b", "w-d", "w-e"]
        for lq in ("first", "second"):
            by_lq = items(
                raw(kube, f"/apis/{GROUP}/{version}/namespaces/{ns}/localqueues/{lq}/pendingworkloads")
            )
            assert [i["positionInLocalQueue"] for i in by_lq] == list(range(len(by_lq)))
            assert {i["localQueueName"] for i in by_lq} == {lq}
            for item in by_lq:
                key = f"{ns}/{item['metadata']['name']}"
                assert item["positionInClusterQueue"] + 1 == want[key][0]
    page = items(raw(kube, f"/apis/{GROUP}/v1beta2/clusterqueues/{cq}/pendingworkloads?limit=2&offset=1"))
    assert [i["positionInClusterQueue"] for i in page] == [1, 2]


def test_rbac_on_the_pendingworkloads_subresources_decides(visible: Visible) -> None:
    kube, ns, cq = visible.kube, visible.ns, visible.cq
    alice, bob = kube.user_kubeconfig("alice"), kube.user_kubeconfig("bob")
    path = f"/apis/{GROUP}/v1beta2/namespaces/{ns}/localqueues/first/pendingworkloads"
    denied = raw(kube, path, alice)
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    # The Role as a manifest: `kubectl create role --resource=...` checks the resource against
    # discovery, which once did not list the aggregated group yet although both APIServices were
    # Available; a manifest needs no discovery.
    role = f"""apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {{name: queue-viewer, namespace: {ns}}}
rules:
- apiGroups: [{GROUP}]
  resources: [localqueues/pendingworkloads]
  verbs: [get]
"""
    kube.kubectl("apply", "-f", "-", input=role)
    kube.kubectl("-n", ns, "create", "rolebinding", "team-a-queues", "--role=queue-viewer", "--group=team-a")
    allowed = _wait(lambda: raw(kube, path, alice).returncode == 0)
    assert allowed
    assert items(raw(kube, path, alice))
    assert raw(kube, path, bob).returncode != 0
    # the ClusterQueue path needs its own (cluster-scoped) grant
    assert raw(kube, f"/apis/{GROUP}/v1beta2/clusterqueues/{cq}/pendingworkloads", alice).returncode != 0
