"""What the controller serves besides scheduling: metrics, the visibility API, ETAs on Workloads.

:func:`attach` adds one observer to a :class:`~gpuplane.k8s.controller.Controller`. After each
pass it records the pass's events in the metrics (cheap, in the pass), and hands the pass to a
worker thread that explains the plan once (:func:`gpuplane.k8s.visibility.view_of`) for the
gauges, the visibility API's latest view and the ETA writer, whichever are on. The worker takes
the latest pass only: when explaining is slower than passes, passes are skipped, never queued, and
scheduling never waits for it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from gpuplane.core.session import Plan
from gpuplane.exporter.metrics import SchedulerMetrics
from gpuplane.exporter.multikueue_metrics import MultiKueueMetrics
from gpuplane.exporter.server import serve_metrics
from gpuplane.k8s.controller import Controller
from gpuplane.k8s.eta_writer import EtaWriter
from gpuplane.k8s.visibility import Authorizer, LatestView, VisibilityApp, self_signed, serve, view_of
from gpuplane.model.objects import ClusterState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class InsightOptions:
    metrics_port: int | None = None
    visibility_port: int | None = None
    visibility_client_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    write_eta: bool = True
    host: str = "0.0.0.0"


Pass = tuple[ClusterState, Plan, float]


class LatestWorker:
    """Runs ``work`` on the latest submitted pass in a daemon thread (older ones are dropped)."""

    def __init__(self, work: Callable[[ClusterState, Plan, float], None]) -> None:
        self.work = work
        self._next: Pass | None = None
        self._stopped = False
        self._busy = False
        self._ready = threading.Condition()
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpuplane-insight")
        self._thread.start()

    def submit(self, state: ClusterState, plan: Plan, now: float) -> None:
        with self._ready:
            self._next = (state, plan, now)
            self._ready.notify_all()

    def stop(self) -> None:
        with self._ready:
            self._stopped = True
            self._ready.notify_all()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            with self._ready:
                while self._next is None and not self._stopped:
                    self._ready.wait()
                if self._stopped:
                    return
                job, self._next = self._next, None
                self._busy = True
            assert job is not None
            try:
                self.work(*job)
            except Exception:  # a failed explanation never stops the next one
                log.exception("insight worker failed")
            with self._ready:
                self._busy = False
                self._ready.notify_all()

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Until every submitted pass is done (for tests and shutdown); False on timeout."""
        with self._ready:
            return self._ready.wait_for(lambda: self._next is None and not self._busy, timeout)


@dataclass
class Attached:
    """What :func:`attach` started; :meth:`close` stops the servers and the worker."""

    metrics: SchedulerMetrics | None
    metrics_server: WSGIServer | None
    visibility_server: ThreadingHTTPServer | None
    eta_writer: EtaWriter | None
    worker: LatestWorker

    def close(self) -> None:
        self.worker.stop()
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

    def explain(state: ClusterState, plan: Plan, now: float) -> None:
        view = view_of(state, plan, now, history=controller.runtime_history.samples())
        if metrics is not None:
            metrics.record_view(state, plan, now, view.explanations)
        if latest is not None:
            latest.set(view)
        if writer is not None:
            writer.write(view.explanations, now)

    worker = LatestWorker(explain)

    def observe(state: ClusterState, plan: Plan, now: float, seconds: float) -> None:
        if metrics is not None:
            metrics.record_pass(state, plan, now, seconds)
        if metrics is not None or latest is not None or writer is not None:
            worker.submit(state, plan, now)

    controller.observers.append(observe)
    metrics_server = None
    if metrics is not None and controller.multikueue is not None:
        multikueue = controller.multikueue
        metrics.registry.register(MultiKueueMetrics(multikueue.snapshot))
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
    return Attached(metrics, metrics_server, visibility_server, writer, worker)
