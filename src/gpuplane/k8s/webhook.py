"""gpuplane's mutating admission webhook for Pods and jobs.

* A pod of an admitted job (it carries the ``gpuplane.dev/workload`` label stamped on
  the job's templates) gets ``schedulerName: gpuplane``, so gpuplane binds it.
* A plain pod, or a member of a pod group, with the ``kueue.x-k8s.io/queue-name``
  label gets gpuplane's scheduling gate as well, so it waits until its workload is
  admitted.
* A job of an integrated kind with a suspend field (batch Job, JobSet, PyTorchJob,
  TrainJob, RayJob) that names a queue (label, or Kueue's older annotation) is suspended
  at creation, as Kueue's job webhook does: the Job controller makes no pod until gpuplane
  admits the job's Workload and releases it. Without this, a job created unsuspended runs
  at once under kube-scheduler and never gets a Workload. A job whose controlling owner is
  itself an integrated kind (a JobSet's Jobs) is left alone: its owner is what waits.
  With ``manageJobsWithoutQueueName`` (:class:`WebhookSettings`) a job with no queue
  name is suspended too and labelled with the LocalQueue ``default``, where its Workload
  waits (Kueue does the same when that LocalQueue exists; this webhook never reads the
  API, so it cannot look: where there is none, the Workload stays pending until one is made).

:func:`review` is a pure function from an AdmissionReview to its response;
:func:`serve` runs it behind HTTPS.
"""

from __future__ import annotations

import base64
import json
import ssl
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from gpuplane.k8s.integrations import INTEGRATIONS
from gpuplane.k8s.replies import reply_json
from gpuplane.model.jobs import queue_name
from gpuplane.model.labels import ADMISSION_GATE as GATE
from gpuplane.model.labels import QUEUE_NAME_LABEL as QUEUE_LABEL
from gpuplane.model.labels import SCHEDULER_NAME, WORKLOAD_LABEL


def pod_patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """JSON patch operations for one pod (empty when it is not gpuplane's)."""
    meta = pod.get("metadata", {}) or {}
    labels = meta.get("labels", {}) or {}
    spec = pod.get("spec", {}) or {}
    owned = any(ref.get("controller") for ref in meta.get("ownerReferences", []) or [])
    ops: list[dict[str, Any]] = []
    managed = WORKLOAD_LABEL in labels or (QUEUE_LABEL in labels and not owned)
    if not managed:
        return ops
    if spec.get("schedulerName") != SCHEDULER_NAME:
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": SCHEDULER_NAME})
    if QUEUE_LABEL in labels and not owned and WORKLOAD_LABEL not in labels:
        gates = spec.get("schedulingGates") or []
        if not any(g.get("name") == GATE for g in gates):
            if gates:
                ops.append({"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}})
            else:
                ops.append({"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]})
    return ops


DEFAULT_LOCAL_QUEUE = "default"  # Kueue's default LocalQueue name, for jobs that name none


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """The webhook's configuration, read once at start (names as in Kueue's Configuration).

    ``manage_jobs_without_queue_name``: suspend jobs that name no queue as well, and put them in
    the namespace's LocalQueue :data:`DEFAULT_LOCAL_QUEUE`.
    """

    manage_jobs_without_queue_name: bool = False


def _pointer(path: tuple[str | int, ...]) -> str:
    """The JSON pointer (RFC 6901) of a path of keys."""
    return "".join("/" + str(step).replace("~", "~0").replace("/", "~1") for step in path)


def _set_true(obj: dict[str, Any], path: tuple[str | int, ...]) -> list[dict[str, Any]]:
    """JSON patch operations that make ``path`` true in ``obj``, creating the objects on the way
    (a PyTorchJob without ``spec.runPolicy``); none when it is true already."""
    node: Any = obj
    for depth, step in enumerate(path[:-1]):
        child = node.get(step) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            value: Any = True
            for inner in reversed(path[depth + 1 :]):
                value = {inner: value}
            return [{"op": "add", "path": _pointer(path[: depth + 1]), "value": value}]
        node = child
    if node.get(path[-1]) is True:
        return []
    return [{"op": "add", "path": _pointer(path), "value": True}]


def _owned_by_integration(meta: dict[str, Any]) -> bool:
    """Whether the object's controlling owner is a job kind gpuplane queues (Kueue skips these
    children: their owner's Workload covers them)."""
    for ref in meta.get("ownerReferences", []) or []:
        if not ref.get("controller"):
            continue
        integration = INTEGRATIONS.get(str(ref.get("kind", "")))
        group = str(ref.get("apiVersion", "")).rpartition("/")[0]
        if integration is not None and integration.resource.group == group:
            return True
    return False


def job_patch(
    kind: str, obj: dict[str, Any], settings: WebhookSettings | None = None
) -> list[dict[str, Any]]:
    """JSON patch operations for a job of ``kind`` at creation (empty when it is not gpuplane's):
    its suspend field set to true when it names a queue, or names none under
    ``manage_jobs_without_queue_name`` (then it is labelled with the default LocalQueue too)."""
    settings = settings or WebhookSettings()
    integration = INTEGRATIONS.get(kind)
    if integration is None or integration.suspend is None:
        return []  # no such kind, or its pods wait behind the scheduling gate instead
    meta = obj.get("metadata", {}) or {}
    if _owned_by_integration(meta):
        return []
    labels = meta.get("labels") or {}
    ops: list[dict[str, Any]] = []
    if not queue_name(labels, meta.get("annotations") or {}):
        if not settings.manage_jobs_without_queue_name:
            return []
        if labels:
            path = _pointer(("metadata", "labels", QUEUE_LABEL))
            ops.append({"op": "add", "path": path, "value": DEFAULT_LOCAL_QUEUE})
        else:
            ops.append({"op": "add", "path": "/metadata/labels", "value": {QUEUE_LABEL: DEFAULT_LOCAL_QUEUE}})
    return ops + _set_true(obj, integration.suspend)


def admission_patch(request: dict[str, Any], settings: WebhookSettings | None = None) -> list[dict[str, Any]]:
    """The JSON patch for one AdmissionReview request: pods and integrated job kinds at CREATE."""
    if request.get("operation", "CREATE") != "CREATE":
        return []
    obj = request.get("object") or {}
    kind = request.get("kind", {}) or {}
    if kind.get("kind") == "Pod" and not kind.get("group"):
        return pod_patch(obj)
    integration = INTEGRATIONS.get(str(kind.get("kind", "")))
    if integration is None or integration.resource.group != kind.get("group", integration.resource.group):
        return []
    return job_patch(str(kind["kind"]), obj, settings)


def review(body: dict[str, Any], settings: WebhookSettings | None = None) -> dict[str, Any]:
    """Answer an admission.k8s.io/v1 AdmissionReview."""
    request = body.get("request", {}) or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    ops = admission_patch(request, settings)
    if ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(ops).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


HANDSHAKE_TIMEOUT = 10.0  # seconds a client has to finish the TLS handshake
REQUEST_TIMEOUT = 30.0  # seconds a connection may sit idle while a request is read or answered


class _Handler(BaseHTTPRequestHandler):
    timeout = REQUEST_TIMEOUT  # applied to the connection by StreamRequestHandler.setup

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        try:
            settings = getattr(self.server, "settings", None)
            answer = review(json.loads(self.rfile.read(length) or b"{}"), settings)
            status = 200
        except (ValueError, AttributeError):
            answer, status = {"error": "not an AdmissionReview"}, 400
        reply_json(self, status, answer)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


class WebhookServer(ThreadingHTTPServer):
    """The webhook's HTTP(S) server.

    With a TLS context, the handshake runs in the connection's own thread (not in ``accept``, which
    would let one silent client stall every other), and a client that has not finished it within
    ``handshake_timeout`` seconds is dropped.
    """

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        tls: ssl.SSLContext | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        settings: WebhookSettings | None = None,
    ) -> None:
        super().__init__(address, _Handler)
        self.settings = settings or WebhookSettings()
        self.tls = tls
        self.handshake_timeout = handshake_timeout

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(self.handshake_timeout)
        try:
            connection = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ssl.SSLError):  # timed out, or not TLS: drop this client only
            return
        try:
            super().finish_request(connection, client_address)
        finally:
            # wrap_socket took the connection over from ``request``: close it here.
            self.shutdown_request(connection)


def serve(  # noqa: PLR0913 - after the address, keyword-only options of `gpuplane webhook`
    port: int,
    cert: str | None = None,
    key: str | None = None,
    *,
    host: str = "0.0.0.0",
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
    settings: WebhookSettings | None = None,
) -> WebhookServer:
    """The webhook server bound to ``host:port`` (HTTPS when a certificate is given), not yet
    serving: call ``serve_forever()`` (and ``shutdown()`` from another thread)."""
    tls = None
    if cert and key:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
    return WebhookServer((host, port), tls, handshake_timeout, settings)
