"""`gpuplane reaper`: warn about, then reclaim, GPUs that interactive sessions leave idle."""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Annotated, Any

import typer

from gpuplane.insight import idle


class Output(StrEnum):
    TABLE = "table"
    JSON = "json"


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _duration(option: str, text: str) -> float:
    try:
        return idle.parse_duration(text)
    except ValueError as err:
        raise _fail(f"{option}: {err}") from None


def register(app: typer.Typer) -> None:
    @app.command("reaper")
    def reaper_command(
        prometheus: Annotated[str, typer.Option(help="Prometheus base URL, e.g. http://prometheus:9090.")],
        kubeconfig: Annotated[
            str | None, typer.Option(help="kubeconfig file; in-cluster configuration when omitted.")
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        enforce: Annotated[
            bool, typer.Option(help="Act: warn and reclaim. Without it, a dry run that writes nothing.")
        ] = False,
        once: Annotated[bool, typer.Option(help="Run one pass, print the decisions and exit.")] = False,
        output: Annotated[Output, typer.Option(help="Format of the decisions.")] = Output.TABLE,
        window: Annotated[
            str, typer.Option(help="Idle for this long (e.g. 90s, 2h) before a warning.")
        ] = "2h",
        grace: Annotated[str, typer.Option(help="Time from the warning to the reclaim.")] = "30m",
        threshold: Annotated[
            float,
            typer.Option(help="Activity (0..1) below which a GPU is idle; DCGM's noise floor is ~0.01."),
        ] = 0.01,
        power_watts: Annotated[
            float | None, typer.Option(help="Also count drawing this many watts as activity.")
        ] = None,
        notify_url: Annotated[
            str | None,
            typer.Option(
                envvar="GPUPLANE_NOTIFY_URL",
                help="Slack-compatible incoming webhook for warnings (keep it in a Secret).",
            ),
        ] = None,
        namespace: Annotated[
            list[str] | None, typer.Option(help="Only pods in this namespace (repeatable); default: all.")
        ] = None,
        at: Annotated[
            str | None,
            typer.Option(help="Evaluate as of this RFC 3339 time instead of now (replays history)."),
        ] = None,
        interval: Annotated[str, typer.Option(help="Time between passes.")] = "1m",
        metrics_port: Annotated[
            int | None, typer.Option(help="Serve the reaper's Prometheus metrics on this port.")
        ] = None,
    ) -> None:
        """Find idle sessions on real GPU utilization; warn, then reclaim them (dry run by default)."""
        from prometheus_client import start_http_server  # noqa: PLC0415 - imported when the command runs
        from urllib3.exceptions import HTTPError  # noqa: PLC0415

        from gpuplane.kube.client import ApiError, load_api_client  # noqa: PLC0415
        from gpuplane.reaper.cluster import ClusterApi  # noqa: PLC0415
        from gpuplane.reaper.loop import Reaper, ReaperConfig  # noqa: PLC0415
        from gpuplane.reaper.metrics import ReaperMetrics  # noqa: PLC0415
        from gpuplane.reaper.notify import SlackNotifier  # noqa: PLC0415
        from gpuplane.reaper.prometheus import PrometheusClient, PrometheusError  # noqa: PLC0415

        logging.basicConfig(level=os.environ.get("GPUPLANE_LOG", "WARNING" if once else "INFO"))
        logging.getLogger("urllib3").setLevel(logging.ERROR)  # its retries end in one error line here
        settings = _settings(window, grace, threshold, power_watts)
        every = _duration("--interval", interval)
        fixed = _fixed_time(at)
        if not prometheus.startswith(("http://", "https://")):
            raise _fail(f"--prometheus: {prometheus!r} is not an http(s) URL")
        try:
            api = ClusterApi(load_api_client(kubeconfig, context), watch=not once)
        except Exception as err:
            raise _fail(f"cannot reach the Kubernetes API: {err}") from None
        notifier = SlackNotifier(notify_url) if notify_url else None
        metrics = ReaperMetrics()
        if metrics_port is not None:
            start_http_server(metrics_port, registry=metrics.registry)
        reaper = Reaper(
            api,
            PrometheusClient(prometheus),
            ReaperConfig(defaults=settings, enforce=enforce, namespaces=tuple(namespace or ())),
            notify=notifier.send if notifier else None,
            metrics=metrics,
        )

        def clock() -> float:
            return fixed if fixed is not None else time.time()

        try:
            if once:
                try:
                    _print([r.as_json() for r in reaper.run_once(clock())], output)
                except PrometheusError as err:
                    raise _fail(str(err)) from None
                except (ApiError, HTTPError) as err:
                    raise _fail(f"the Kubernetes API failed: {str(err).splitlines()[0]}") from None
                return
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            signal.signal(signal.SIGINT, lambda *_: stop.set())
            reaper.run(stop.is_set, clock, stop.wait, every)
        finally:
            api.close()
            if notifier is not None:
                notifier.close(drain=30.0)


def start_in_controller(
    kubeconfig: str | None,
    context: str | None,
    prometheus: str,
    *,
    enforce: bool,
    acting: Callable[[], bool],
    stop: threading.Event,
) -> threading.Thread:
    """The reaper inside ``gpuplane controller`` (``--reaper-prometheus``): the default settings,
    the webhook URL from GPUPLANE_NOTIFY_URL, a pass a minute in a thread, only while ``acting()``
    (the controller holds the leader Lease, so two replicas never warn twice)."""
    from gpuplane.kube.client import load_api_client  # noqa: PLC0415 - imported when the reaper starts
    from gpuplane.reaper.cluster import ClusterApi  # noqa: PLC0415
    from gpuplane.reaper.loop import Reaper, ReaperConfig  # noqa: PLC0415
    from gpuplane.reaper.notify import SlackNotifier  # noqa: PLC0415
    from gpuplane.reaper.prometheus import PrometheusClient  # noqa: PLC0415

    if not prometheus.startswith(("http://", "https://")):
        raise ValueError(f"--reaper-prometheus: {prometheus!r} is not an http(s) URL")
    api = ClusterApi(load_api_client(kubeconfig, context), watch=True)
    url = os.environ.get("GPUPLANE_NOTIFY_URL")
    notifier = SlackNotifier(url) if url else None
    reaper = Reaper(
        api,
        PrometheusClient(prometheus),
        ReaperConfig(enforce=enforce),
        notify=notifier.send if notifier else None,
    )

    def passes() -> None:
        try:
            while not stop.is_set():
                if acting():
                    try:
                        reaper.run_once(time.time())
                    except Exception:
                        logging.getLogger(__name__).exception("reaper pass failed")
                stop.wait(60.0)
        finally:
            api.close()
            if notifier is not None:
                notifier.close(drain=10.0)

    thread = threading.Thread(target=passes, name="reaper", daemon=True)
    thread.start()
    return thread


def _settings(window: str, grace: str, threshold: float, power_watts: float | None) -> idle.IdleSettings:
    if not 0.0 <= threshold <= 1.0:
        raise _fail(f"--threshold: {threshold:g} is not a ratio in 0..1")
    settings = idle.IdleSettings(
        window=_duration("--window", window),
        grace=_duration("--grace", grace),
        threshold=threshold,
        power_watts=power_watts,
    )
    if settings.window <= 0:
        raise _fail("--window: must be longer than 0s")
    return settings


def _fixed_time(at: str | None) -> float | None:
    """The instant of ``--at``, or None to run on the clock."""
    if at is None:
        return None
    fixed = idle.parse_time(at)
    if fixed is None:
        raise _fail(f"--at: {at!r} is not an RFC 3339 time with a zone")
    return fixed


def _print(rows: list[dict[str, Any]], output: Output) -> None:
    if output is Output.JSON:
        typer.echo(json.dumps(rows, indent=2))
        return
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    table = Table("namespace/pod", "owner", "GPUs", "idle", "action", "reclaim at", "reason")
    for row in rows:
        seconds = row["idleSeconds"]
        table.add_row(
            f"{row['namespace']}/{row['pod']}",
            f"{row['owner']['kind']}/{row['owner']['name']}",
            str(row["gpus"]),
            "-" if seconds is None else idle.format_duration(seconds),
            row["action"],
            row["reclaimAt"] or "-",
            row["message"],
        )
    Console(width=160).print(table)
