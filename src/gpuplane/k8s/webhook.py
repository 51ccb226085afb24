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

from gpuplane.k8s.integrations import GATE, QUEUE_LABEL, SCHEDULER_NAME, WORKLOAD_LABEL


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


class _Handler(BaseHTTPRequestHandler):
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


def serve(
    port: int, cert: str | None = None, key: str | None = None, host: str = "0.0.0.0"
) -> ThreadingHTTPServer:
    """Start the webhook server (HTTPS when a certificate is given); returns it running."""
    server = ThreadingHTTPServer((host, port), _Handler)
    if cert and key:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        server.socket = context.wrap_socket(server.socket, server_side=True)
    return server
