"""Serve a metrics registry on ``/metrics`` over HTTP (prometheus-client's own server)."""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


def serve_metrics(
    registry: CollectorRegistry, port: int, host: str = "0.0.0.0"
) -> tuple[WSGIServer, threading.Thread]:
    """Start serving ``registry`` in a daemon thread; returns the server (``server_port``) and thread."""
    return start_http_server(port, addr=host, registry=registry)
