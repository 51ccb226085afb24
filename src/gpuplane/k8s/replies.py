"""How the HTTPS endpoints gpuplane serves to the API server (the admission webhook, the visibility
API) answer a request: one JSON body, its length, and the status."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


def reply_json(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    """Send ``body`` as the JSON answer to the request ``handler`` is serving."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)
