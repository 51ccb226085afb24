"""The fixtures other tests build on; with GPUPLANE_E2E_KUBECONFIG they read from that cluster."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from kubernetes import client

from apiserver.fixtures import E2E_KUBECONFIG, Cluster, Kubectl, RealCluster


def test_kube_client_reaches_the_cluster(kube_client: client.ApiClient) -> None:
    names = {ns.metadata.name for ns in client.CoreV1Api(kube_client).list_namespace().items}
    assert {"default", "kube-system"} <= names


def test_kubectl_reaches_the_cluster(apiserver: Cluster, kubectl: Kubectl) -> None:
    version = json.loads(kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["major"] == "1"
    assert "namespace/default" in kubectl("get", "namespaces", "-o", "name").stdout.split()
    assert apiserver.url.startswith(("http://", "https://"))


def test_kubeconfig_points_at_the_url(apiserver: Cluster) -> None:
    assert apiserver.kubeconfig_path is not None
    assert RealCluster(apiserver.kubeconfig_path).url == apiserver.url


@pytest.mark.skipif(bool(os.environ.get(E2E_KUBECONFIG)), reason="checks the double-only parts")
def test_real_cluster_mode_skips_what_needs_the_double(tmp_path: Path) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        "clusters: [{name: k, cluster: {server: 'https://10.0.0.1:6443'}}]\nusers: [{name: u, user: {}}]\n"
    )
    real = RealCluster(config)
    assert real.url == "https://10.0.0.1:6443"
    for part in ("store", "faults", "requests"):
        with pytest.raises(pytest.skip.Exception):
            getattr(real, part)
