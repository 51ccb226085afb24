"""`gpuplane web`: the read-only web console, on a cluster or on state files.

Thin edge: check the options, build a snapshot source and an authenticator, serve the app
with uvicorn. Bad options or bad input are one line on stderr and exit status 2.
"""

from __future__ import annotations

import ipaddress
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from gpuplane.model.errors import InputError

if TYPE_CHECKING:  # the web stack is imported only when the console starts
    from gpuplane.web.auth import Authenticator
    from gpuplane.web.sources import FileSource, KubeSource, SnapshotHub


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for IPv6) -> (host, port); raises ValueError."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"--listen must be HOST:PORT, got {text!r}")
    host = host.removeprefix("[").removesuffix("]") or "127.0.0.1"
    return host, int(port_text)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def register(app: typer.Typer) -> None:
    """Add the ``web`` command to ``app``."""

    @app.command("web")
    def web_command(
        kubeconfig: Annotated[
            str | None, typer.Option(help="kubeconfig of the cluster to show (live, through watches).")
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        file: Annotated[
            list[Path] | None,
            typer.Option(
                "--file",
                "-f",
                help="Cluster state file to show instead of a cluster (reloaded when it changes), "
                "or a `gpuplane simulate --report` folder.",
            ),
        ] = None,
        report: Annotated[
            list[Path] | None, typer.Option(help="A `gpuplane simulate --report` folder to browse.")
        ] = None,
        prometheus: Annotated[
            str | None, typer.Option(help="Prometheus URL with dcgm-exporter metrics (GPU history).")
        ] = None,
        listen: Annotated[str, typer.Option(help="HOST:PORT to serve on.")] = "127.0.0.1:8080",
        token_file: Annotated[
            Path | None,
            typer.Option(help="Static tokens (kube-apiserver token-file CSV) for state-file mode."),
        ] = None,
        no_auth: Annotated[
            bool, typer.Option("--no-auth", help="Serve without authentication (loopback only).")
        ] = False,
    ) -> None:
        """Serve the read-only web console: overview, queues, workloads, nodes, reports."""
        code = run_web(kubeconfig, context, file or [], report or [], prometheus, listen, token_file, no_auth)
        raise typer.Exit(code)


def _fail(message: str) -> int:
    typer.echo(f"error: {message}", err=True)
    return 2


def _usage_problem(
    kubeconfig: str | None,
    files: list[Path],
    state_files: list[Path],
    report_dirs: list[Path],
    *,
    no_auth: bool,
    host: str,
) -> str | None:
    """What is wrong with the options, if anything: one line for the user."""
    for folder in report_dirs:
        if not folder.is_dir():
            return f"{folder}: not a report folder"
    if kubeconfig is None and not files:
        return "give --kubeconfig K for a cluster, or -f STATE for a state file or report folder"
    if kubeconfig is not None and state_files:
        return "--kubeconfig and -f STATE are two modes; give one of them"
    if no_auth and not _loopback(host):
        return "--no-auth is only allowed on a loopback address"
    return None


def _kube_mode(
    kubeconfig: str, context: str | None, hub: SnapshotHub, no_auth: bool
) -> tuple[KubeSource, Authenticator] | str:
    """Informers on a cluster, and its TokenReview (unless ``no_auth``); or why not."""
    from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415
    from gpuplane.web.auth import AllowAll, KubeAuthenticator  # noqa: PLC0415
    from gpuplane.web.sources import KubeSource  # noqa: PLC0415

    try:
        api = KubeApi(load_api_client(kubeconfig, context))
    except Exception as err:
        return f"cannot configure the Kubernetes client: {err}"
    kube = KubeSource(api, hub)
    return kube, AllowAll() if no_auth else KubeAuthenticator(api, kube.namespaces)


def _file_mode(
    state_files: list[Path], token_file: Path | None, hub: SnapshotHub, no_auth: bool
) -> tuple[FileSource, Authenticator] | str:
    """State files, and the viewers of a token file (unless ``no_auth``); or why not."""
    from gpuplane.web.auth import AllowAll, TokenFileAuthenticator  # noqa: PLC0415
    from gpuplane.web.sources import FileSource  # noqa: PLC0415

    if token_file is None and not no_auth:
        return "state-file mode needs --token-file FILE (or --no-auth on loopback)"
    try:
        authenticator = AllowAll() if token_file is None else TokenFileAuthenticator(token_file)
    except (OSError, ValueError) as err:
        return f"--token-file: {err}"
    source = FileSource(state_files, hub)
    try:
        source.load()
    except InputError as problem:
        return str(problem)
    return source, authenticator


def run_web(
    kubeconfig: str | None,
    context: str | None,
    files: list[Path],
    reports: list[Path],
    prometheus: str | None,
    listen: str,
    token_file: Path | None,
    no_auth: bool,
) -> int:
    # Imported here so that `gpuplane --help` does not pay for the web stack.
    import uvicorn  # noqa: PLC0415

    from gpuplane.web.app import create_app  # noqa: PLC0415
    from gpuplane.web.prometheus import HistoryCache, PrometheusClient  # noqa: PLC0415
    from gpuplane.web.sources import SnapshotHub  # noqa: PLC0415

    try:
        host, port = parse_listen(listen)
    except ValueError as err:
        return _fail(str(err))
    state_files = [p for p in files if not p.is_dir()]
    report_dirs = [*reports, *(p for p in files if p.is_dir())]
    problem = _usage_problem(kubeconfig, files, state_files, report_dirs, no_auth=no_auth, host=host)
    if problem is not None:
        return _fail(problem)
    logging.basicConfig(level=os.environ.get("GPUPLANE_LOG", "WARNING"))
    hub = SnapshotHub()
    chosen: tuple[FileSource | KubeSource, Authenticator] | str
    if kubeconfig is not None:
        chosen = _kube_mode(kubeconfig, context, hub, no_auth)
    else:
        chosen = _file_mode(state_files, token_file, hub, no_auth)
    if isinstance(chosen, str):
        return _fail(chosen)
    source, authenticator = chosen
    history = HistoryCache(PrometheusClient(prometheus)) if prometheus else None
    app = create_app(hub, authenticator, history=history, reports=report_dirs)
    source.start()
    typer.echo(f"gpuplane console on http://{listen}/", err=True)
    server = uvicorn.Server(
        uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=2)
    )
    try:
        server.run()
    finally:
        source.stop()
    return 0
