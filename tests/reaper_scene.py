"""Helpers for the reaper's end-to-end tests on the real control plane.

- :func:`install_notebook_crd`: a minimal ``kubeflow.org/v1`` Notebook CRD (created once, never deleted).
- :class:`GpuScene`: one test's namespace, a fake GPU Node, and owners (Notebook -> StatefulSet,
  StatefulSet, Job) whose pods the real controllers create and the scene binds to the Node (no
  kubelet: they stay Pending on it, which is all the reaper reads).
- :func:`history`: OpenMetrics text of dcgm-exporter series for backfilling Prometheus.
- :class:`SlackReceiver`: a loopback HTTP server standing in for a Slack incoming webhook; it records
  the bodies it accepts and can be told to answer 429 (with Retry-After) or to hang.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from realkube import RealKube

NOTEBOOK_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "notebooks.kubeflow.org"},
    "spec": {
        "group": "kubeflow.org",
        "names": {
            "kind": "Notebook",
            "plural": "notebooks",
            "singular": "notebook",
            "listKind": "NotebookList",
        },
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "schema": {
                    "openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
                },
                "subresources": {"status": {}},
            }
        ],
    },
}
POLL = 0.1
REAPER_MANIFEST = Path(__file__).resolve().parent.parent / "deploy" / "reaper" / "reaper.yaml"


def wait_until(predicate: Callable[[], Any], timeout: float = 30.0, message: str = "") -> Any:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {message or predicate!r}")
        pause.wait(POLL)


def install_notebook_crd(kube: RealKube) -> None:
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(NOTEBOOK_CRD))
    kube.kubectl("wait", "--for=condition=Established", "crd/notebooks.kubeflow.org", "--timeout=60s")


@contextlib.contextmanager
def reaper_user(kube: RealKube, suffix: str) -> Iterator[Path]:
    """The kubeconfig of token user ``alice`` holding exactly the reaper's ClusterRole from
    ``deploy/reaper/reaper.yaml`` (under a name of its own); both are deleted afterwards."""
    role = next(d for d in yaml.safe_load_all(REAPER_MANIFEST.read_text()) if d["kind"] == "ClusterRole")
    name = f"gpuplane-reaper-{suffix}"
    role["metadata"]["name"] = name
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "alice"}],
    }
    kubeconfig = kube.user_kubeconfig("alice")
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([role, binding]))
    try:
        yield kubeconfig
    finally:
        kube.kubectl("delete", "clusterrolebinding", name, "--wait=false", check=False)
        kube.kubectl("delete", "clusterrole", name, "--wait=false", check=False)


def gpu_template(labels: dict[str, str], gpus: int = 1) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels},
        "spec": {
            # No scheduler picks these pods up; the scene binds them itself.
            "schedulerName": "reaper-test-none",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "busybox",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


@dataclass
class GpuScene:
    kube: RealKube
    namespace: str
    node: str = ""
    api: client.ApiClient = field(init=False)

    def __post_init__(self) -> None:
        self.api = self.kube.client()
        self.node = self.node or f"{self.namespace}-gpu"
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": self.node},
                "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"}},
            }
        )

    def close(self) -> None:
        self.kube.kubectl("delete", "node", self.node, "--wait=false", check=False)
        self.api.close()

    def apply(self, *objects: dict[str, Any]) -> None:
        self.kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def get(self, kind: str, name: str) -> dict[str, Any]:
        out = self.kube.kubectl("-n", self.namespace, "get", kind, name, "-o", "json")
        found: dict[str, Any] = json.loads(out.stdout)
        return found

    def uid(self, kind: str, name: str) -> str:
        return str(self.get(kind, name)["metadata"]["uid"])

    def notebook(self, name: str, annotations: dict[str, str] | None = None) -> str:
        """A Notebook owning a one-replica StatefulSet (as Kubeflow's controller would make it)."""
        self.apply(
            {
                "apiVersion": "kubeflow.org/v1",
                "kind": "Notebook",
                "metadata": {"name": name, "namespace": self.namespace, "annotations": annotations or {}},
                "spec": {"template": gpu_template({"notebook-name": name})},
            }
        )
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "Notebook", "name": name}
        return self.statefulset(name, owner={**owner, "uid": self.uid("notebook", name)})

    def statefulset(
        self,
        name: str,
        *,
        owner: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        replicas: int = 1,
    ) -> str:
        meta: dict[str, Any] = {"name": name, "namespace": self.namespace, "labels": labels or {}}
        if owner is not None:
            meta["ownerReferences"] = [{**owner, "controller": True, "blockOwnerDeletion": True}]
        self.apply(
            {
                "apiVersion": "apps/v1",
                "kind": "StatefulSet",
                "metadata": meta,
                "spec": {
                    "replicas": replicas,
                    "podManagementPolicy": "Parallel",
                    "serviceName": name,
                    "selector": {"matchLabels": {"app": name}},
                    "template": gpu_template({"app": name}),
                },
            }
        )
        return ",".join(self.bind_all(f"app={name}", replicas))

    def bare_pod(self, name: str, labels: dict[str, str]) -> str:
        """A pod no controller owns, bound to the Node at creation (as JupyterHub's spawner makes one)."""
        template = gpu_template(labels)
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.namespace, **template["metadata"]},
                "spec": {**template["spec"], "nodeName": self.node},
            }
        )
        return name

    def job(self, name: str, labels: dict[str, str] | None = None, suspend: bool = False) -> str:
        self.apply(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": name, "namespace": self.namespace, "labels": labels or {}},
                "spec": {
                    "suspend": suspend,
                    "template": {
                        **gpu_template({"app": name}),
                        "spec": {**gpu_template({})["spec"], "restartPolicy": "Never"},
                    },
                },
            }
        )
        return "" if suspend else self.bind_one(f"job-name={name}")

    def pods(self, selector: str) -> list[client.V1Pod]:
        core = client.CoreV1Api(self.api)
        pods: list[client.V1Pod] = core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def bind_one(self, selector: str) -> str:
        """Wait for the controller to create the one pod matching ``selector``, bind it to the Node."""
        return self.bind_all(selector, 1)[0]

    def bind_all(self, selector: str, count: int) -> list[str]:
        """Wait for the controller to create ``count`` pods matching ``selector``; bind them to the Node."""
        pods = wait_until(
            lambda: (found := self.pods(selector)) and len(found) >= count and found,
            message=f"pods {selector}",
        )
        names = []
        for pod in sorted(pods, key=lambda p: str(p.metadata.name)):
            name = str(pod.metadata.name)
            names.append(name)
            if pod.spec.node_name:
                continue
            body = client.V1Binding(
                metadata=client.V1ObjectMeta(name=name),
                target=client.V1ObjectReference(api_version="v1", kind="Node", name=self.node),
            )
            with contextlib.suppress(ValueError):  # the client mis-parses the bind's empty answer
                client.CoreV1Api(self.api).create_namespaced_pod_binding(name, self.namespace, body)
        return names

    def events(self, reason: str) -> list[client.CoreV1Event]:
        core = client.CoreV1Api(self.api)
        items: list[client.CoreV1Event] = core.list_namespaced_event(self.namespace).items
        return [e for e in items if e.reason == reason]

    def versions(self) -> dict[str, str]:
        """resourceVersion of every object the reaper could write, by kind/name."""
        out = {}
        for kind in ("pods", "statefulsets", "notebooks", "jobs", "events"):
            listed = json.loads(self.kube.kubectl("-n", self.namespace, "get", kind, "-o", "json").stdout)
            for obj in listed["items"]:
                out[f"{kind}/{obj['metadata']['name']}"] = obj["metadata"]["resourceVersion"]
        return out


# --- dcgm-exporter history ---------------------------------------------------------------------------


def dcgm_labels(namespace: str, pod: str, gpu: int, node: str) -> str:
    labels = {
        "gpu": str(gpu),
        "UUID": f"GPU-{node}-{gpu:02d}",
        "Hostname": node,
        "container": "main",
        "namespace": namespace,
        "pod": pod,
    }
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def history(
    series: dict[tuple[str, str], Callable[[float], float]],
    *,
    namespace: str,
    node: str,
    start: float,
    end: float,
    step: float = 60.0,
    gpus: dict[str, int] | None = None,
) -> str:
    """OpenMetrics text: for each (metric, pod), ``value(t)`` every ``step`` seconds in [start, end]."""
    by_metric: dict[str, list[str]] = {}
    index = {pod: i for i, pod in enumerate(sorted({pod for _, pod in series}))}
    for (metric, pod), value in sorted(series.items()):
        lines = by_metric.setdefault(metric, [])
        for g in range((gpus or {}).get(pod, 1)):
            labels = dcgm_labels(namespace, pod, index[pod] * 8 + g, node)
            t = start
            while t <= end:
                lines.append(f"{metric}{{{labels}}} {value(t):g} {t:.0f}")
                t += step
    out = []
    for metric, lines in by_metric.items():
        out.append(f"# TYPE {metric} gauge")
        out += lines
    return "\n".join(out) + "\n# EOF\n"


# --- a Slack stand-in --------------------------------------------------------------------------------


@dataclass
class SlackReceiver:
    """Records accepted bodies. ``script`` lists answers for the next requests: ``429`` (with
    ``Retry-After: 1``), ``500``, ``hang`` (block until :meth:`release` or 10 s, then 200) or ``200``;
    once it is used up, every request gets 200."""

    script: list[str] = field(default_factory=list)
    bodies: list[dict[str, Any]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._released = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver._lock:
                    answer = receiver.script.pop(0) if receiver.script else "200"
                    receiver.answers.append(answer)
                if answer == "hang":
                    receiver._released.wait(10)
                    return  # close without answering: the sender times out
                code = int(answer)
                self.send_response(code)
                if code == 429:
                    self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                if code == 200:
                    with receiver._lock:
                        receiver.bodies.append(json.loads(data))

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/services/T000/B000/XXXX"

    def release(self) -> None:
        self._released.set()

    def close(self) -> None:
        self.release()
        self._server.shutdown()
        self._server.server_close()


@contextlib.contextmanager
def slack(script: list[str] | None = None) -> Iterator[SlackReceiver]:
    receiver = SlackReceiver(list(script or []))
    try:
        yield receiver
    finally:
        receiver.close()


def ignore_missing(call: Callable[[], Any]) -> None:
    try:
        call()
    except ApiException as err:
        if err.status != 404:
            raise
