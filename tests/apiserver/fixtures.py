"""Pytest fixtures for the API-server double (registered in ``tests/conftest.py``).

- ``apiserver``: a double started for the test (``module_apiserver``: one per module), with ``url``,
  ``kubeconfig_path``, ``store``, ``faults`` and ``requests``.
- ``double``: the double itself (skips against a real cluster); ``faults``, ``store``: its hooks and
  storage.
- ``kube_client``: an official-client ``ApiClient`` configured from the kubeconfig.
- ``kubectl``: runs the real ``kubectl`` against it (skips only when the binary is not installed).
- ``rest``: a bare HTTP client (:class:`.rest.Rest`) for exact status codes and raw watch streams.

With ``GPUPLANE_E2E_KUBECONFIG`` set, ``apiserver`` is that real cluster instead: ``kube_client`` and
``kubectl`` use its kubeconfig, and anything that needs the double itself (``store``, ``faults``,
``requests``, ``rest``, the virtual clock) skips the test.

Bound pods are deleted gracefully on the double's virtual clock: ``kubectl delete pod`` of a bound pod
waits for the grace period, so pass ``--wait=false`` (and ``apiserver.advance(seconds)``) or
``--grace-period=0 --force``.

Example::

    def test_binds(apiserver, kube_client, kubectl):
        kubectl("apply", "-f", "pod.yaml")
        client.CoreV1Api(kube_client).create_namespaced_binding("default", binding, _preload_content=False)
        assert apiserver.requests.bindings() == [("default", "p", "n1")]
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from .faults import Faults, RequestLog
from .rest import Rest
from .server import ApiServerDouble
from .store import Store

E2E_KUBECONFIG = "GPUPLANE_E2E_KUBECONFIG"
KUBECTL_TIMEOUT = 30  # seconds for one kubectl run


class Cluster(Protocol):
    """What tests get from ``apiserver``: the double, or a real cluster that skips double-only parts."""

    @property
    def url(self) -> str: ...

    @property
    def kubeconfig_path(self) -> Path | None: ...

    @property
    def store(self) -> Store: ...

    @property
    def faults(self) -> Faults: ...

    @property
    def requests(self) -> RequestLog: ...

    def advance(self, seconds: float) -> None: ...


class RealCluster:
    """A cluster named by ``GPUPLANE_E2E_KUBECONFIG``. Only its kubeconfig is usable."""

    SKIP = "needs the API-server double; GPUPLANE_E2E_KUBECONFIG points the tests at a real cluster"

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig_path: Path | None = kubeconfig

    @property
    def url(self) -> str:
        config = yaml.safe_load(Path(str(self.kubeconfig_path)).read_text())
        context = next(c for c in config["contexts"] if c["name"] == config["current-context"])["context"]
        cluster = next(c for c in config["clusters"] if c["name"] == context["cluster"])["cluster"]
        return str(cluster["server"])

    @property
    def store(self) -> Store:
        pytest.skip(self.SKIP)

    @property
    def faults(self) -> Faults:
        pytest.skip(self.SKIP)

    @property
    def requests(self) -> RequestLog:
        pytest.skip(self.SKIP)

    def advance(self, seconds: float) -> None:  # noqa: ARG002 (same signature as the double's)
        pytest.skip(self.SKIP)


def _real_cluster() -> RealCluster | None:
    path = os.environ.get(E2E_KUBECONFIG)
    return RealCluster(Path(path)) if path else None


def _run_double(directory: Path) -> Iterator[Cluster]:
    real = _real_cluster()
    if real is not None:
        yield real
        return
    double = ApiServerDouble().start(kubeconfig=directory / "kubeconfig")
    try:
        yield double
    finally:
        double.stop()
    if double.server_errors:
        pytest.fail(f"the API-server double failed while serving: {double.server_errors!r}")


@pytest.fixture
def apiserver(tmp_path: Path) -> Iterator[Cluster]:
    """A fresh double for this test (or the real e2e cluster)."""
    yield from _run_double(tmp_path)


@pytest.fixture(scope="module")
def module_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One double shared by a module's tests (or the real e2e cluster)."""
    yield from _run_double(tmp_path_factory.mktemp("apiserver"))


@pytest.fixture
def double(apiserver: Cluster) -> ApiServerDouble:
    """The double itself; the test is skipped when GPUPLANE_E2E_KUBECONFIG selects a real cluster.

    Tests of the double's own behaviour use it (``pytestmark = pytest.mark.usefixtures("double")``) so
    they never write to a real cluster.
    """
    if not isinstance(apiserver, ApiServerDouble):
        pytest.skip(RealCluster.SKIP)
    return apiserver


@pytest.fixture
def faults(apiserver: Cluster) -> Faults:
    return apiserver.faults


@pytest.fixture
def store(apiserver: Cluster) -> Store:
    return apiserver.store


@pytest.fixture
def rest(double: ApiServerDouble) -> Rest:
    return Rest(double.url)


@pytest.fixture
def kube_client(apiserver: Cluster) -> Iterator[k8s_client.ApiClient]:
    """An official-client ApiClient for ``apiserver``; closed after the test."""
    api: k8s_client.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(apiserver.kubeconfig_path)
    )
    try:
        yield api
    finally:
        api.close()  # type: ignore[no-untyped-call]


Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def kubectl(apiserver: Cluster, tmp_path: Path) -> Kubectl:
    """``kubectl(*args, input=None, check=True)`` runs the real kubectl against ``apiserver``.

    With ``check`` (the default) a non-zero exit fails the test with kubectl's stderr.
    """
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (scripts/test.sh installs the Debian package `kubectl`)")
    home = tmp_path / "kubectl-home"

    def run(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_kubectl(Path(str(apiserver.kubeconfig_path)), home, args, input=input, check=check)

    return run


def run_kubectl(
    kubeconfig: Path,
    home: Path,
    args: Sequence[str],
    *,
    input: str | None = None,
    check: bool = True,
    timeout: float = KUBECTL_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """Run the real kubectl with ``kubeconfig``, a private ``home`` (and cache) and no proxy for
    loopback; with ``check`` a non-zero exit fails the test with kubectl's stderr."""
    binary = shutil.which("kubectl")
    if binary is None:
        pytest.fail("kubectl is not installed (scripts/test.sh installs the Debian package `kubectl`)")
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "KUBECONFIG": str(kubeconfig),
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    result = subprocess.run(
        [binary, "--kubeconfig", str(kubeconfig), "--cache-dir", str(home / "cache"), *args],
        input=input,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        check=False,
    )
    if check and result.returncode != 0:
        pytest.fail(f"kubectl {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
    return result


def manifest(*documents: Any) -> str:
    """YAML for ``kubectl apply -f -``: one or more objects as a multi-document stream."""
    return yaml.safe_dump_all(list(documents), sort_keys=False)
