"""gpuplane's mutating admission webhook for Pods.

* A pod of an admitted job (it carries the ``gpuplane.dev/workload`` label stamped on
  the job's templates) gets ``schedulerName: gpuplane``, so gpuplane binds it.
* A plain pod, or a member of a pod group, with the ``kueue.x-k8s.io/queue-name``
  label gets gpuplane's scheduling gate as well, so it waits until its workload is
  admitted.

:func:`review` is a pure function from an AdmissionReview to its response;
:func:`serve` runs it behind HTTPS.
"""

from __future__ import annotations

import base64
import json
import ssl
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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


def review(body: dict[str, Any]) -> dict[str, Any]:
    """Answer an admission.k8s.io/v1 AdmissionReview."""
    request = body.get("request", {}) or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    obj = request.get("object") or {}
    if request.get("kind", {}).get("kind") == "Pod" and request.get("operation", "CREATE") == "CREATE":
        ops = pod_patch(obj)
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
            answer = review(json.loads(self.rfile.read(length) or b"{}"))
            status = 200
        except (ValueError, AttributeError):
            answer, status = {"error": "not an AdmissionReview"}, 400
        data = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

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
    ) -> None:
        super().__init__(address, _Handler)
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


def serve(
    port: int,
    cert: str | None = None,
    key: str | None = None,
    host: str = "0.0.0.0",
    handshake_timeout: float = HANDSHAKE_TIMEOUT,
) -> WebhookServer:
    """The webhook server bound to ``host:port`` (HTTPS when a certificate is given), not yet
    serving: call ``serve_forever()`` (and ``shutdown()`` from another thread)."""
    tls = None
    if cert and key:
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(cert, key)
    return WebhookServer((host, port), tls, handshake_timeout)
