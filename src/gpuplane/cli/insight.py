"""What the controller serves besides scheduling: metrics, the visibility API, ETAs on Workloads.

:func:`attach` adds one observer to a :class:`~gpuplane.k8s.controller.Controller`: after each
pass it explains the plan once (:func:`gpuplane.k8s.visibility.view_of`) and hands that to the
Prometheus metrics, the visibility API's latest view and the ETA writer, whichever are on.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from gpuplane.core.plan import Plan
from gpuplane.exporter.metrics import SchedulerMetrics
from gpuplane.exporter.server import serve_metrics
from gpuplane.k8s.controller import Controller
from gpuplane.k8s.eta_writer import EtaWriter
from gpuplane.k8s.visibility import Authorizer, LatestView, VisibilityApp, self_signed, serve, view_of
from gpuplane.model.objects import ClusterState


@dataclass(frozen=True)
class InsightOptions:
    metrics_port: int | None = None
    visibility_port: int | None = None
    visibility_client_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    write_eta: bool = True
    host: str = "0.0.0.0"


@dataclass
class Attached:
    """What :func:`attach` started; :meth:`close` stops the servers."""

    metrics: SchedulerMetrics | None
    metrics_server: WSGIServer | None
    visibility_server: ThreadingHTTPServer | None
    eta_writer: EtaWriter | None

    def close(self) -> None:
        for server in (self.metrics_server, self.visibility_server):
            if server is not None:
                server.shutdown()
                server.server_close()


def attach(controller: Controller, options: InsightOptions) -> Attached:
    """Start what ``options`` ask for and observe ``controller``'s passes."""
    if options.visibility_port is not None and options.visibility_client_ca is None:
        raise ValueError("the visibility API needs the API server's front-proxy CA (--visibility-client-ca)")
    metrics = SchedulerMetrics() if options.metrics_port is not None else None
    latest = LatestView() if options.visibility_port is not None else None
    writer = (
        EtaWriter(controller.api, lambda key: controller.cache.get("Workload", key))
        if options.write_eta
        else None
    )

    def observe(state: ClusterState, plan: Plan, now: float, seconds: float) -> None:
        view = view_of(state, plan, now)
        if metrics is not None:
            metrics.observe(state, plan, now, seconds, view.explanations)
        if latest is not None:
            latest.set(view)
        if writer is not None:
            writer.write(view.explanations, now)

    controller.observers.append(observe)
    metrics_server = None
    if metrics is not None and options.metrics_port is not None:
        metrics_server, _ = serve_metrics(metrics.registry, options.metrics_port, options.host)
    visibility_server = None
    if (
        latest is not None
        and options.visibility_port is not None
        and options.visibility_client_ca is not None
    ):
        cert, key = options.tls_cert, options.tls_key
        if cert is None or key is None:
            cert, key = self_signed(["gpuplane-visibility.gpuplane-system.svc", "localhost", "127.0.0.1"])
        visibility_server = serve(
            VisibilityApp(latest, Authorizer(controller.api)),
            port=options.visibility_port,
            cert=str(cert),
            key=str(key),
            client_ca=str(options.visibility_client_ca),
            host=options.host,
        )
        threading.Thread(target=visibility_server.serve_forever, daemon=True).start()
    return Attached(metrics, metrics_server, visibility_server, writer)
