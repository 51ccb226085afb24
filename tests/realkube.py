"""Pytest plugin: a real Kubernetes control plane for the tests (registered in ``tests/conftest.py``).

``real_kube`` (session scope) is a real kube-apiserver with etcd, kube-controller-manager and
kube-scheduler on loopback, started once per pytest session by ``scripts/kube-up.sh`` and stopped at the
end. With ``GPUPLANE_E2E_KUBECONFIG`` set, that cluster is used instead and nothing is started (the
token users below are then unavailable, and tests that need them skip).

There are no kubelets. Nodes are objects the tests create; pods bound to them never run and never finish
terminating, so delete them with grace period 0 (or delete their namespace). Tests never delete CRDs:
several tests share one API server.

If the control plane cannot start (no etcd, no binaries) the tests that need it are skipped, except in CI
(``CI=true``), where that is a failure: CI installs everything they need.

Example::

    def test_lists_nodes(real_kube):
        ns = real_kube.namespace("why")
        real_kube.kubectl("-n", ns, "create", "configmap", "c")
        core = client.CoreV1Api(real_kube.client())
"""

from __future__ import annotations

import itertools
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from apiserver.fixtures import run_kubectl

ROOT = Path(__file__).resolve().parent.parent
E2E_KUBECONFIG = "GPUPLANE_E2E_KUBECONFIG"
KUBECTL_TIMEOUT = 60  # seconds for one kubectl run
START_TIMEOUT = 240  # seconds for kube-up.sh, including the one-time unpacking of the binaries
USERS = ("alice", "bob", "carol")


class RealKube:
    """A running real control plane: its kubeconfig, CA files, clients, kubectl and token users."""

    def __init__(self, kubeconfig: Path, directory: Path | None) -> None:
        self.kubeconfig = kubeconfig
        self.directory = directory  # None for a cluster given by GPUPLANE_E2E_KUBECONFIG
        self._namespaces: list[str] = []
        self._counter = itertools.count(1)
        config = yaml.safe_load(kubeconfig.read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        self._cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]

    @property
    def server(self) -> str:
        return str(self._cluster["server"])

    @property
    def ca_file(self) -> Path:
        return self._own("ca.crt")

    @property
    def front_proxy_ca_file(self) -> Path:
        """The CA that signs the API server's aggregation (front-proxy) client certificate."""
        return self._own("front-proxy-ca.crt")

    def _own(self, name: str) -> Path:
        if self.directory is None:
            pytest.skip(f"{name} exists only for the project's own control plane (scripts/kube-up.sh)")
        return self.directory / name

    def client(self) -> k8s_client.ApiClient:
        """A new official-client ApiClient with admin rights; the caller closes it."""
        api: k8s_client.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )
        return api

    def user_kubeconfig(self, name: str) -> Path:
        """The kubeconfig of token user ``name`` (alice: group team-a, bob: team-b, carol: none)."""
        if name not in USERS:
            raise ValueError(f"unknown user {name!r}; the control plane defines {', '.join(USERS)}")
        return self._own(f"users/{name}.kubeconfig")

    def token(self, name: str) -> str:
        """The bearer token of user ``name`` (or ``admin``)."""
        for line in self._own("tokens.csv").read_text().splitlines():
            fields = line.split(",")
            if fields[1] == name:
                return fields[0]
        raise ValueError(f"no token for {name!r}")

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run the real kubectl against this cluster; with ``check`` a non-zero exit fails the test."""
        home = (self.directory or Path("/tmp")) / "kubectl-home"
        config = kubeconfig or self.kubeconfig
        return run_kubectl(config, home, args, input=input, check=check, timeout=KUBECTL_TIMEOUT)

    def namespace(self, prefix: str) -> str:
        """Create a fresh namespace ``PREFIX-N`` and return its name; deleted when the session ends."""
        name = f"{prefix}-{os.getpid()}-{next(self._counter)}"
        self.kubectl("create", "namespace", name)
        self._namespaces.append(name)
        return name

    def cleanup(self) -> None:
        """Delete the namespaces this session created, with their pods at grace period 0."""
        for name in self._namespaces:
            self.kubectl(
                "-n",
                name,
                "delete",
                "pods",
                "--all",
                "--grace-period=0",
                "--force",
                "--wait=false",
                check=False,
            )
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)
        self._namespaces.clear()


def _start(directory: Path) -> Path:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kube-up.sh"), str(directory)],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    if result.returncode != 0:
        message = f"the control plane did not start (scripts/kube-up.sh):\n{result.stderr[-3000:]}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return directory / "kubeconfig"


@pytest.fixture(scope="session")
def real_kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealKube]:
    """A real control plane for the whole session (or the cluster of ``GPUPLANE_E2E_KUBECONFIG``)."""
    given = os.environ.get(E2E_KUBECONFIG)
    if given:
        # A control plane of scripts/kube-up.sh keeps its tokens and CAs beside the kubeconfig.
        path = Path(given)
        kube = RealKube(path, path.parent if (path.parent / "tokens.csv").exists() else None)
        yield kube
        kube.cleanup()
        return
    directory = tmp_path_factory.mktemp("kube")
    kube = RealKube(_start(directory), directory)
    try:
        yield kube
    finally:
        kube.cleanup()
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "kube-down.sh"), str(directory)],
            capture_output=True,
            timeout=60,
            check=False,
        )
