"""gpuplane as deployed: each component under its own ServiceAccount from deploy/, on a real API server.

The accounts, roles and bindings of deploy/ (and deploy/reaper/) are applied to the real control
plane (the Deployments are not: there are no kubelets); each component then runs as a process on
loopback with a kubeconfig that holds a token of its own ServiceAccount (``kubectl create token``)
and nothing else:

* the controller, leader-elected as deployed, admits a queued Job and binds its pods;
* the webhook, as deployed, has no token at all (it never calls the API): the harness's registered
  webhook already runs so, and it suspended the Job at creation here;
* the reaper, its informer loop and a one-pass run, sees the Job's GPU pods.

Last, the API server's audit log (scripts/kube-up.sh) is compared with what deploy/ grants each
account: a request refused (403) fails, and so does a granted pair that no scenario used unless
its role documents why it is kept (:mod:`rbac_audit`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

import rbac_audit
from apiserver.fixtures import RealCluster
from controller_harness import POOL_LABEL, Scene, Webhooks, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.model.labels import INTERACTIVE_ANNOTATION, QUEUE_NAME_LABEL, SESSION_LABEL
from manifests import GPU
from realkube import RealKube
from test_provisioning_realkube import provisioned_queue, requests, set_conditions

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parent.parent
ACCOUNTS = ("gpuplane-controller", "gpuplane-reaper", "gpuplane-web")
VISIBILITY = "visibility.kueue.x-k8s.io"
APPLIED_KINDS = {"Namespace", "ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


class Deployed:
    """deploy/'s accounts and rights on the cluster (owns the token kubeconfigs it wrote)."""

    def __init__(self, kube: RealKube, directory: Path) -> None:
        self.kube = kube
        self.directory = directory
        self.audit = kube.kubeconfig.parent / "audit.log"
        self.audit_offset = self.audit.stat().st_size if self.audit.exists() else 0  # earlier runs' requests
        # The aggregation layer's client CA (scripts/kube-up.sh writes it beside the kubeconfig).
        self.front_proxy_ca = kube.kubeconfig.parent / "front-proxy-ca.crt"
        if not self.front_proxy_ca.exists():
            pytest.skip(f"no {self.front_proxy_ca}: the visibility API needs the aggregation layer's CA")
        objects = [d for d in rbac_audit.documents() if d["kind"] in APPLIED_KINDS]
        kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))

    def kubeconfig(self, account: str) -> Path:
        """A kubeconfig with a token of ServiceAccount ``account`` and nothing else."""
        token = self.kube.kubectl(
            "-n", rbac_audit.NAMESPACE, "create", "token", account, "--duration", "1h"
        ).stdout.strip()
        admin = yaml.safe_load(self.kube.kubeconfig.read_text())
        context = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
        cluster = dict(next(c for c in admin["clusters"] if c["name"] == context["cluster"])["cluster"])
        if "certificate-authority" in cluster:  # relative to the admin kubeconfig's folder
            cluster["certificate-authority"] = str(
                (self.kube.kubeconfig.parent / cluster["certificate-authority"]).resolve()
            )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": cluster}],
            "users": [{"name": account, "user": {"token": token}}],
            "contexts": [{"name": account, "context": {"cluster": "c", "user": account}}],
            "current-context": account,
        }
        path = self.directory / f"{account}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path


@pytest.fixture(scope="module")
def deployed(real_kube: RealKube, tmp_path_factory: pytest.TempPathFactory) -> Deployed:
    return Deployed(real_kube, tmp_path_factory.mktemp("deployed"))


@pytest.fixture
def real_scene(real_kube: RealKube, webhooks: Webhooks) -> Iterator[Scene]:
    webhooks.ensure(str(real_kube.kubeconfig))
    yield from make_scene(RealCluster(real_kube.kubeconfig), real_kube.kubectl)


def gpuplane(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(
        [sys.executable, "-m", "gpuplane", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM, then its output."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
    try:
        return process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.communicate()


def refusals(log: str) -> list[str]:
    """The log lines that tell of a refused request: an HTTP 403 or "forbidden" (not a timestamp's
    milliseconds that happen to read 403)."""
    return [
        line
        for line in log.splitlines()
        if re.search(r"(?<![,.\d])403(?!\d)", line) or "forbidden" in line.lower()
    ]


class IdlePrometheus:
    """A Prometheus on loopback (owns its HTTP server and the pods it knows): every metric of each pod
    in :attr:`idle` reads 0 every 15 s over the whole range asked for (the GPU idle all along);
    other pods have no samples, so the reaper keeps them."""

    def __init__(self) -> None:
        self.idle: list[tuple[str, str, int]] = []  # (namespace, pod, GPUs)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query)
                expr, now = query["query"][0], float(query["time"][0])
                seconds = int(expr.rsplit("[", 1)[1].rstrip("s]"))
                times = [now - seconds + 15 * i for i in range(1, seconds // 15 + 1)]
                result = [
                    {
                        "metric": {
                            "namespace": ns,
                            "pod": pod,
                            "gpu": str(g),
                            "UUID": f"GPU-{pod}-{g}",
                        },
                        "values": [[t, "0"] for t in times],
                    }
                    for ns, pod, gpus in list(outer.idle)
                    for g in range(gpus)
                ]
                body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *_args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _controller(deployed: Deployed, *extra: str) -> subprocess.Popen[str]:
    """``gpuplane controller`` as deployed (leader-elected, a dry run), with only its account's token."""
    return gpuplane(
        *("controller", "--kubeconfig", str(deployed.kubeconfig("gpuplane-controller"))),
        *("--leader-elect", "--identity", "deployed-e2e", "--lease-namespace", rbac_audit.NAMESPACE),
        *("--dry-run", "--interval", "0.5", "--runtime-history-write-interval", "1"),
        *extra,
    )


def test_controller_and_reaper_run_under_their_own_accounts(deployed: Deployed, real_scene: Scene) -> None:
    scene = real_scene
    scene.setup(nodes=1)
    # A Lease left by an earlier run on this cluster would spare the controller its create.
    scene.kubectl("-n", rbac_audit.NAMESPACE, "delete", "lease", "gpuplane-controller", "--ignore-not-found")
    visibility_port = _free_port()
    controller = _controller(
        deployed,
        *("--visibility-port", str(visibility_port)),
        *("--visibility-client-ca", str(deployed.front_proxy_ca)),
    )
    prometheus = IdlePrometheus()
    reaper = None
    try:
        scene.submit(scene.job("train", pods=2, gpus=2))
        wait_until(lambda: scene.admitted("train"), 120, "the Job admitted by the controller")
        wait_until(lambda: scene.bound("train", 2), 60, "the Job's pods bound by the controller")
        # A queued plain pod: the webhook gates it at creation, the controller lifts the gate and binds.
        plain = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "plain", "labels": {QUEUE_NAME_LABEL: "queue"}},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "x", "resources": {"limits": {GPU: "1"}}}],
            },
        }
        scene.kubectl("-n", scene.namespace, "apply", "-f", "-", input=json.dumps(plain))
        wait_until(lambda: _running(scene, f"{QUEUE_NAME_LABEL}=queue"), 60, "the plain pod bound")

        _console(deployed, scene)
        _visibility(scene, visibility_port)

        reaper_config = str(deployed.kubeconfig("gpuplane-reaper"))
        once = subprocess.run(
            [
                *(sys.executable, "-m", "gpuplane", "reaper", "--once", "--output", "json"),
                *("--kubeconfig", reaper_config, "--prometheus", prometheus.url),
                *("--namespace", scene.namespace),
            ],
            check=False,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert once.returncode == 0, once.stderr
        reports = json.loads(once.stdout)
        assert sorted((r["owner"]["kind"], r["gpus"]) for r in reports) == [
            ("Job", 2),
            ("Job", 2),
            ("Pod", 1),
        ]

        # The reap: idle sessions of three kinds, reclaimed each its own way by the reaper's loop.
        node = scene.api.list(k8s.NODES, labelSelector=f"{POOL_LABEL}={scene.prefix}")["items"][0]
        _sessions(scene, node["metadata"]["name"])
        scene.kubectl(
            "-n", scene.namespace, "annotate", "localqueue", "queue", f"{INTERACTIVE_ANNOTATION}=true"
        )
        wait_until(lambda: _running(scene, "app=desk"), 60, "the Deployment's pod bound by kube-scheduler")
        prometheus.idle = [
            (scene.namespace, p["metadata"]["name"], _gpus(p))
            for p in scene.api.list(k8s.PODS, scene.namespace)["items"]
        ]
        reaper = gpuplane(
            "reaper",
            "--kubeconfig",
            reaper_config,
            "--prometheus",
            prometheus.url,
            "--interval",
            "1s",
            "--enforce",
            "--window",
            "60s",
            "--grace",
            "0s",
            "--namespace",
            scene.namespace,
        )
        wait_until(lambda: not _running(scene, "kind=bare"), 60, "the bare session pod deleted")
        wait_until(lambda: _replicas(scene) == 0, 60, "the session Deployment scaled to 0")
        wait_until(lambda: _reclaimed(scene, "Job", "train"), 60, "the interactive Job's Workload evicted")
        wait_until(lambda: not _running(scene, "job-name=train"), 60, "the evicted Job's pods gone")
    finally:
        _, controller_log = finish(controller)
        reaper_log = finish(reaper)[1] if reaper is not None else ""
        prometheus.close()
    assert not refusals(controller_log), controller_log[-4000:]
    assert not refusals(reaper_log), reaper_log[-4000:]
    assert "reaper pass failed" not in reaper_log, reaper_log[-4000:]


def _console(deployed: Deployed, scene: Scene) -> None:
    """The web console under its own account: a viewer allowed to list Workloads in the scene's
    namespace sees the Job's Workload and not the Nodes; an account with no rights sees neither;
    no token, nothing (the console checks tokens with TokenReview, rights with SubjectAccessReview)."""
    for name in ("viewer", "nobody"):
        scene.kubectl("-n", scene.namespace, "create", "serviceaccount", name)
    scene.kubectl(
        "-n",
        scene.namespace,
        "create",
        "role",
        "viewer",
        "--verb=list",
        "--resource=workloads.kueue.x-k8s.io",
    )
    scene.kubectl(
        "-n",
        scene.namespace,
        "create",
        "rolebinding",
        "viewer",
        "--role=viewer",
        f"--serviceaccount={scene.namespace}:viewer",
    )
    token = {
        name: scene.kubectl("-n", scene.namespace, "create", "token", name).stdout.strip()
        for name in ("viewer", "nobody")
    }
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    console = gpuplane(
        "web", "--kubeconfig", str(deployed.kubeconfig("gpuplane-web")), "--listen", f"127.0.0.1:{port}"
    )
    page = f"/workloads/{scene.namespace}/{scene.workloads()['train']['metadata']['name']}"
    try:
        wait_until(lambda: _status(url + "/healthz", None) == 200, 60, "the console serving")
        wait_until(lambda: _status(url + page, token["viewer"]) == 200, 30, "the viewer sees the Workload")
        assert _status(url + "/nodes", token["viewer"]) == 403
        assert _status(url + page, token["nobody"]) in (403, 404)
        assert _status(url + page, None) == 401
    finally:
        log = finish(console)[1]
    assert not refusals(log), log[-4000:]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _visibility(scene: Scene, port: int) -> None:
    """Kueue's visibility API, served by the controller under its own account, through the real API
    server's aggregator: the controller asks the API server (SubjectAccessReview) whether the caller
    may read the queue's pending workloads."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "gpuplane-visibility", "namespace": scene.namespace},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"port": port, "name": "https"}],
        },
    }
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"v1beta2.{VISIBILITY}"},
        "spec": {
            "group": VISIBILITY,
            "version": "v1beta2",
            "groupPriorityMinimum": 100,
            "versionPriority": 200,
            "insecureSkipTLSVerify": True,  # the controller's certificate is self-signed here
            "service": {"name": "gpuplane-visibility", "namespace": scene.namespace, "port": port},
        },
    }
    scene.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": [service, api_service]}),
    )
    path = f"/apis/{VISIBILITY}/v1beta2/namespaces/{scene.namespace}/localqueues/queue/pendingworkloads"
    try:
        got = wait_until(
            lambda: (r := scene.kubectl("get", "--raw", path, check=False)).returncode == 0 and r,
            90,
            "the visibility API answering through the aggregator",
        )
        assert json.loads(got.stdout)["kind"] == "PendingWorkloadsSummary", got.stdout
    finally:
        scene.kubectl("delete", "apiservice", f"v1beta2.{VISIBILITY}", "--wait=false", check=False)


def _status(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return 0


def _sessions(scene: Scene, node: str) -> None:
    gpu = {"limits": {GPU: "1"}, "requests": {"cpu": "10m"}}
    labels = {SESSION_LABEL: "true", "kind": "bare"}
    scene.api.create(
        k8s.PODS,
        {
            "metadata": {"name": "bare", "labels": labels},
            "spec": {
                "nodeName": node,
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "c", "image": "x", "resources": gpu}],
            },
        },
        scene.namespace,
    )
    template = {
        "metadata": {"labels": {"app": "desk", SESSION_LABEL: "true"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "nodeSelector": {POOL_LABEL: scene.prefix},
            "containers": [{"name": "c", "image": "x", "resources": gpu}],
        },
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "desk"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "desk"}}, "template": template},
    }
    scene.kubectl("-n", scene.namespace, "apply", "-f", "-", input=json.dumps(deployment))


def _gpus(pod: dict[str, Any]) -> int:
    limits = [(c.get("resources") or {}).get("limits") or {} for c in pod["spec"]["containers"]]
    return sum(int(limit.get(GPU, 0)) for limit in limits)


def _running(scene: Scene, selector: str) -> bool:
    pods = scene.api.list(k8s.PODS, scene.namespace, labelSelector=selector)["items"]
    return any(p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp") for p in pods)


def _replicas(scene: Scene) -> int:
    out = scene.kubectl("-n", scene.namespace, "get", "deployment", "desk", "-o", "json").stdout
    return int(json.loads(out)["spec"]["replicas"])


def _reclaimed(scene: Scene, kind: str, name: str) -> bool:
    """Whether the reaper recorded a reclaim of ``kind``/``name`` (the controller, still running,
    may already have readmitted an evicted Workload, so its condition is not waited for)."""
    events: list[dict[str, Any]] = scene.events("IdleReclaimed")
    return any(e["involvedObject"]["kind"] == kind and e["involvedObject"]["name"] == name for e in events)


def test_a_provisioning_request_under_the_controllers_account(deployed: Deployed, real_scene: Scene) -> None:
    """A gang with quota and no Nodes, in a queue with a ProvisioningRequest admission check: the
    controller reads the check's parameters, makes one ProvisioningRequest with a PodTemplate, and,
    once the test (playing the autoscaler) says Provisioned and adds the Nodes, binds the gang."""
    scene = real_scene
    provisioned_queue(scene, quota_gpus=8)
    # The runtime history's ConfigMap, left by an earlier run on this cluster, would spare its create.
    history = ("-n", rbac_audit.NAMESPACE, "get", "configmap", "gpuplane-runtime-history")
    scene.kubectl(*history[:2], "delete", *history[3:], "--ignore-not-found")
    controller = _controller(deployed)
    try:
        scene.submit(scene.job("grow", pods=2, gpus=4))
        made = wait_until(lambda: requests(scene), 60, "a ProvisioningRequest for the gang")
        assert len(made) == 1, made
        set_conditions(scene, made[0]["metadata"]["name"], Provisioned="True")
        scene.add_nodes(1)
        wait_until(lambda: scene.bound("grow", 2), 60, "the gang bound once provisioned")
        # Two runs finish (the test plays the kubelet): the controller writes the runtime history,
        # then adds the second run to it.
        _succeed(scene, "grow")
        first = wait_until(lambda: _version(scene, history), 60, "the runtime history written")
        scene.submit(scene.job("again", pods=1, gpus=1))
        wait_until(lambda: requests(scene)[1:], 60, "a ProvisioningRequest for the second Job")
        for request in requests(scene):
            set_conditions(scene, request["metadata"]["name"], Provisioned="True")
        wait_until(lambda: scene.bound("again", 1), 60, "the second Job bound")
        _succeed(scene, "again")
        wait_until(lambda: _version(scene, history) not in ("", first), 60, "the runtime history updated")
    finally:
        log = finish(controller)[1]
    assert not refusals(log), log[-4000:]


def _succeed(scene: Scene, job: str) -> None:
    """Every pod of ``job`` ends Succeeded, as a kubelet would report it."""
    for pod in scene.pods(job):
        name = pod["metadata"]["name"]
        ended = {"status": {"phase": "Succeeded"}}
        scene.kubectl(
            *("-n", scene.namespace, "patch", "pod", name, "--subresource=status", "--type=merge"),
            *("-p", json.dumps(ended)),
        )


def _version(scene: Scene, history: tuple[str, ...]) -> str:
    got = scene.kubectl(*history, "-o", "jsonpath={.metadata.resourceVersion}", check=False)
    return got.stdout.strip() if got.returncode == 0 else ""


def test_every_grant_was_used_or_is_documented(real_kube: RealKube, deployed: Deployed) -> None:
    """Runs after the scenarios above (file order): the audit log holds their requests."""
    del real_kube
    audit = deployed.audit
    if not audit.exists() or not audit.stat().st_size:
        pytest.skip(f"no audit log at {audit} (scripts/kube-up.sh writes one unless GPUPLANE_KUBE_AUDIT=0)")
    with audit.open("rb") as log:
        log.seek(deployed.audit_offset)
        calls = rbac_audit.used(log.read().decode().splitlines())
    grants = rbac_audit.granted(rbac_audit.documents())
    problems = []
    for name in ACCOUNTS:
        user = rbac_audit.account(name)
        pairs, documented = grants[user]
        made = calls.get(user, {})
        assert made, f"{name} made no request: the scenarios did not run under it"
        refused = rbac_audit.forbidden(made)
        if refused:
            problems.append(f"{name} was refused: {rbac_audit.format_pairs(refused)}")
        unused = rbac_audit.unused(pairs, documented, made)
        if unused:
            problems.append(f"{name} was granted and never used: {rbac_audit.format_pairs(unused)}")
        # A documented right that a scenario happened to use (the controller deletes a gone pod's
        # Workload when it is quicker than the garbage collector) is no problem: it is kept anyway.
    assert not problems, "\n".join(problems)
