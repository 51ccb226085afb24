"""`gpuplane visibility`: serve Kueue's visibility API (with ETA and reason) as an aggregated API.

Thin edge: a Kubernetes client for reading the cluster and for SubjectAccessReviews, a view that
is recomputed at most every ``--refresh`` seconds, and the HTTPS server of
:mod:`gpuplane.k8s.visibility`. The controller serves the same API from its own passes with
``gpuplane controller --visibility-port``.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add the ``visibility`` command to ``app``."""

    @app.command("visibility")
    def visibility_command(
        client_ca: Annotated[
            Path,
            typer.Option(
                help="The API server's request-header (front-proxy) CA, to trust its identity headers."
            ),
        ],
        kubeconfig: Annotated[
            str | None, typer.Option(help="kubeconfig file; in-cluster configuration when omitted.")
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        port: Annotated[int, typer.Option(help="HTTPS port.")] = 8443,
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
        tls_cert: Annotated[Path | None, typer.Option(help="Serving certificate (PEM).")] = None,
        tls_key: Annotated[Path | None, typer.Option(help="Serving key (PEM).")] = None,
        hostname: Annotated[
            list[str] | None,
            typer.Option(help="Names for a self-signed certificate when none is given (repeat)."),
        ] = None,
        refresh: Annotated[float, typer.Option(help="Seconds a computed view is reused.")] = 2.0,
    ) -> None:
        """Serve visibility.kueue.x-k8s.io v1beta1/v1beta2 pendingworkloads, with ETA and reason."""
        from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415 - the client loads lazily
        from gpuplane.k8s.state import read_runtime_history, read_state  # noqa: PLC0415
        from gpuplane.k8s.visibility import (  # noqa: PLC0415
            Authorizer,
            CachedSource,
            VisibilityApp,
            self_signed,
            serve,
            view_of_state,
        )

        logging.basicConfig(level=os.environ.get("GPUPLANE_LOG", "INFO"))
        if (tls_cert is None) != (tls_key is None):
            typer.echo("error: give both --tls-cert and --tls-key, or neither", err=True)
            raise typer.Exit(2)
        if not client_ca.is_file():
            typer.echo(f"error: --client-ca {client_ca}: no such file", err=True)
            raise typer.Exit(2)
        try:
            api = KubeApi(load_api_client(kubeconfig, context))
        except Exception as err:
            typer.echo(f"error: cannot configure the Kubernetes client: {err}", err=True)
            raise typer.Exit(2) from None
        if tls_cert is None or tls_key is None:
            tls_cert, tls_key = self_signed(hostname or ["localhost", "127.0.0.1"])
        source = CachedSource(
            lambda: view_of_state(read_state(api), time.time(), history=read_runtime_history(api)),
            ttl=refresh,
        )
        server = serve(
            VisibilityApp(source, Authorizer(api)),
            port=port,
            cert=str(tls_cert),
            key=str(tls_key),
            client_ca=str(client_ca),
            host=host,
        )
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        typer.echo(f"serving on port {server.server_port}", err=True)
        server.serve_forever()
