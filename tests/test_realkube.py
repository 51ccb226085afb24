"""The project's real control plane (scripts/kube-up.sh) behaves as the end-to-end tests need it to."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from realkube import RealKube

pytestmark = pytest.mark.slow


def _wait(predicate, timeout: float = 60.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.25)


def test_server_is_v1_36_with_a_verified_certificate(real_kube: RealKube) -> None:
    api = real_kube.client()
    try:
        assert api.configuration.verify_ssl
        info = client.VersionApi(api).get_code()
    finally:
        api.close()
    assert (info.major, info.minor) == ("1", "36")
    assert real_kube.server.startswith("https://127.0.0.1:")


def test_fake_nodes_stay_untainted_and_the_job_controller_creates_pods(real_kube: RealKube) -> None:
    ns = real_kube.namespace("realkube")
    node = f"{ns}-n1"
    real_kube.kubectl("create", "-f", "-", input=f"apiVersion: v1\nkind: Node\nmetadata: {{name: {node}}}\n")
    try:
        real_kube.kubectl("-n", ns, "create", "job", "j", "--image=busybox", "--", "true")
        api = real_kube.client()
        try:
            core = client.CoreV1Api(api)
            pods = _wait(lambda: core.list_namespaced_pod(ns, label_selector="job-name=j").items)
            assert pods[0].metadata.owner_references[0].kind == "Job"
            time.sleep(2)  # the node-lifecycle controller is off: no not-ready taint appears
            assert not core.read_node(node).spec.taints
        finally:
            api.close()
    finally:
        real_kube.kubectl("delete", "node", node, "--wait=false")


def test_token_users_have_no_rights_until_granted(real_kube: RealKube) -> None:
    ns = real_kube.namespace("rbac")
    alice = real_kube.user_kubeconfig("alice")
    denied = real_kube.kubectl("-n", ns, "get", "pods", kubeconfig=alice, check=False)
    assert denied.returncode != 0
    assert 'User "alice" cannot list resource "pods"' in denied.stderr
    real_kube.kubectl(
        "-n", ns, "create", "rolebinding", "team-a-view", "--clusterrole=view", "--group=team-a"
    )
    allowed = _wait(
        lambda: real_kube.kubectl("-n", ns, "get", "pods", kubeconfig=alice, check=False).returncode == 0
    )
    assert allowed
    bob = real_kube.kubectl("-n", ns, "get", "pods", kubeconfig=real_kube.user_kubeconfig("bob"), check=False)
    assert bob.returncode != 0
