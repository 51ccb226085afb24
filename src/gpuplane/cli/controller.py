"""`gpuplane controller`: run the controller against a cluster."""

from __future__ import annotations

import os
import signal
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gpuplane.cli.logs import LogFormat
from gpuplane.cli.logs import configure as configure_logging
from gpuplane.kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS

if TYPE_CHECKING:
    from gpuplane.k8s.multikueue import MultiKueueSettings


def register(app: typer.Typer) -> None:
    register_webhook(app)

    @app.command("controller")
    def controller_command(
        kubeconfig: Annotated[
            str | None, typer.Option(help="kubeconfig file; in-cluster configuration when omitted.")
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        dry_run: Annotated[
            bool,
            typer.Option("--dry-run/--no-dry-run", help="Only report would-be preemptions (the default)."),
        ] = True,
        leader_elect: Annotated[bool, typer.Option(help="Use a Lease so only one replica acts.")] = True,
        identity: Annotated[
            str | None, typer.Option(help="Leader-election identity (default: hostname).")
        ] = None,
        lease_namespace: Annotated[
            str, typer.Option(help="Namespace of the leader Lease.")
        ] = "gpuplane-system",
        min_runtime: Annotated[
            float, typer.Option(help="Seconds a workload runs before it may be preempted.")
        ] = 0.0,
        interval: Annotated[float, typer.Option(help="Seconds between reconcile passes when idle.")] = 2.0,
        qps: Annotated[
            float, typer.Option(min=0.1, help="Client requests per second to the API server, sustained.")
        ] = DEFAULT_QPS,
        burst: Annotated[int, typer.Option(min=1, help="Client requests allowed at once above --qps.")] = (
            DEFAULT_BURST
        ),
        write_workers: Annotated[
            int, typer.Option(min=1, help="Independent writes (bindings, statuses) sent at once.")
        ] = 16,
        once: Annotated[bool, typer.Option(help="Run one reconcile pass and exit.")] = False,
        metrics_port: Annotated[
            int | None, typer.Option(help="Serve Prometheus metrics on this port (/metrics).")
        ] = None,
        visibility_port: Annotated[
            int | None, typer.Option(help="Serve the visibility API (HTTPS) on this port.")
        ] = None,
        visibility_client_ca: Annotated[
            Path | None, typer.Option(help="The API server's front-proxy CA, for the visibility API.")
        ] = None,
        write_eta: Annotated[
            bool, typer.Option(help="Annotate pending Workloads with their ETA (gpuplane.dev/eta).")
        ] = True,
        runtime_history_size: Annotated[
            int,
            typer.Option(
                min=0,
                help="Runtimes of finished Workloads kept for the ETA, in the ConfigMap "
                "gpuplane-runtime-history of --lease-namespace (the oldest go first; 0: none kept).",
            ),
        ] = 5000,
        runtime_history_retention: Annotated[
            float, typer.Option(min=0.001, help="Days a finished Workload's runtime is kept for the ETA.")
        ] = 30.0,
        runtime_history_write_interval: Annotated[
            float,
            typer.Option(min=0.0, help="Seconds between writes of the runtime history (and one at exit)."),
        ] = 60.0,
        runtime_history_prometheus: Annotated[
            str | None,
            typer.Option(
                help="Prometheus URL whose kube-state-metrics Job metrics seed a runtime history that "
                "starts empty (kube_job_status_start_time, kube_job_status_completion_time)."
            ),
        ] = None,
        kueue_config_namespace: Annotated[
            str, typer.Option(help="Namespace of Kueue's ConfigMap (its Configuration: deviceClassMappings).")
        ] = "kueue-system",
        kueue_config_name: Annotated[
            str,
            typer.Option(
                help="Name of Kueue's ConfigMap, read for its key controller_manager_config.yaml "
                "('' : not read; none there: Kueue's defaults)."
            ),
        ] = "kueue-manager-config",
        log_format: Annotated[
            LogFormat, typer.Option(help="Log lines as plain text, or one JSON object per line.")
        ] = LogFormat.TEXT,
        reaper_prometheus: Annotated[
            str | None,
            typer.Option(
                help="Also run the idle reaper in this process (on the leader, a pass a minute, "
                "default settings), reading DCGM metrics from this Prometheus URL."
            ),
        ] = None,
        reaper_enforce: Annotated[
            bool, typer.Option(help="The in-process reaper acts (warns, reclaims); else a dry run.")
        ] = False,
        multikueue: Annotated[
            bool,
            typer.Option(
                help="Run MultiKueue on this (manager) cluster: Workloads in ClusterQueues with a "
                "kueue.x-k8s.io/multikueue AdmissionCheck are dispatched to the workers it names."
            ),
        ] = False,
        multikueue_dispatcher: Annotated[
            str,
            typer.Option(
                help="AllAtOnce or Incremental (Kueue's), or gpuplane: ask each worker where the "
                "gang fits now or starts soonest, and nominate that one."
            ),
        ] = "gpuplane",
        multikueue_origin: Annotated[
            str, typer.Option(help="The origin label value on this manager's copies on workers.")
        ] = "multikueue",
        multikueue_worker_lost_timeout: Annotated[
            float,
            typer.Option(min=0.0, help="Seconds a worker may be unreachable before its workloads requeue."),
        ] = 900.0,
        multikueue_gc_interval: Annotated[
            float, typer.Option(min=0.1, help="Seconds between collections of orphaned copies on workers.")
        ] = 60.0,
        multikueue_worker_qps: Annotated[
            float, typer.Option(min=0.1, help="Client requests per second to each worker's API server.")
        ] = 100.0,
        multikueue_worker_burst: Annotated[
            int, typer.Option(min=1, help="Client requests allowed at once above the worker QPS.")
        ] = 200,
    ) -> None:
        """Admit, place, bind and preempt in a cluster, as the core decides."""
        from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415 - imports the client lazily
        from gpuplane.k8s.controller import Controller, ControllerConfig  # noqa: PLC0415
        from gpuplane.k8s.kueue_config import KueueConfigSource  # noqa: PLC0415

        configure_logging(os.environ.get("GPUPLANE_LOG", "INFO"), log_format)
        mk_settings = (
            _multikueue_settings(
                multikueue_dispatcher,
                origin=multikueue_origin,
                namespace=lease_namespace,
                worker_lost_timeout=multikueue_worker_lost_timeout,
                gc_interval=multikueue_gc_interval,
                worker_qps=multikueue_worker_qps,
                worker_burst=multikueue_worker_burst,
            )
            if multikueue
            else None
        )
        try:
            api = KubeApi(load_api_client(kubeconfig, context), qps=qps, burst=burst)
        except Exception as err:
            typer.echo(f"error: cannot configure the Kubernetes client: {err}", err=True)
            raise typer.Exit(2) from None
        controller = Controller(
            api,
            ControllerConfig(
                dry_run_preemption=dry_run,
                leader_election=leader_elect,
                identity=identity or socket.gethostname(),
                lease_namespace=lease_namespace,
                min_runtime_seconds=min_runtime,
                write_workers=write_workers,
                runtime_history_size=runtime_history_size,
                runtime_history_retention_seconds=runtime_history_retention * 86400.0,
                runtime_history_flush_seconds=runtime_history_write_interval,
                runtime_history_prometheus=runtime_history_prometheus,
                kueue_config=KueueConfigSource(kueue_config_namespace, kueue_config_name),
                multikueue=mk_settings,
            ),
        )
        from gpuplane.cli.insight import InsightOptions, attach  # noqa: PLC0415

        try:
            insight = attach(
                controller,
                InsightOptions(metrics_port, visibility_port, visibility_client_ca, write_eta=write_eta),
            )
        except (ValueError, OSError) as err:
            typer.echo(f"error: {err}", err=True)
            raise typer.Exit(2) from None
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        controller.start()
        if reaper_prometheus is not None:
            from gpuplane.cli.reaper import start_in_controller  # noqa: PLC0415

            try:
                start_in_controller(
                    kubeconfig,
                    context,
                    reaper_prometheus,
                    enforce=reaper_enforce,
                    acting=lambda: not leader_elect or controller.elector.is_leader,
                    stop=stop,
                )
            except ValueError as err:
                controller.stop()
                insight.close()
                typer.echo(f"error: {err}", err=True)
                raise typer.Exit(2) from None
        try:
            if once:
                controller.reconcile()
            else:
                controller.run(stop.is_set, interval)
        finally:
            controller.stop()
            insight.close()


def register_webhook(app: typer.Typer) -> None:
    @app.command("webhook")
    def webhook_command(
        port: Annotated[int, typer.Option(help="Port to listen on.")] = 9443,
        host: Annotated[str, typer.Option(help="Address to listen on.")] = "0.0.0.0",
        cert: Annotated[str | None, typer.Option(help="TLS certificate file (PEM).")] = None,
        key: Annotated[str | None, typer.Option(help="TLS private key file (PEM).")] = None,
        handshake_timeout: Annotated[
            float, typer.Option(min=0.1, help="Seconds a client has to finish the TLS handshake.")
        ] = 10.0,
        manage_jobs_without_queue_name: Annotated[
            bool,
            typer.Option(
                "--manage-jobs-without-queue-name",
                help="Suspend jobs that name no queue too, and queue them in the LocalQueue 'default' "
                "(Kueue's manageJobsWithoutQueueName).",
            ),
        ] = False,
    ) -> None:
        """Serve the mutating webhook: suspends queued jobs at creation, hands gpuplane's pods to gpuplane."""
        from gpuplane.k8s.webhook import WebhookSettings, serve  # noqa: PLC0415

        settings = WebhookSettings(manage_jobs_without_queue_name=manage_jobs_without_queue_name)
        try:
            server = serve(port, cert, key, host=host, handshake_timeout=handshake_timeout, settings=settings)
        except (OSError, ValueError) as err:
            typer.echo(f"error: cannot serve the webhook on {host}:{port}: {err}", err=True)
            raise typer.Exit(2) from None
        signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
        server.serve_forever()


def _multikueue_settings(dispatcher: str, **settings: Any) -> MultiKueueSettings:
    """The manager's MultiKueue settings from the command line; exit 2 on an unknown dispatcher."""
    from gpuplane.insight.dispatch import parse_policy  # noqa: PLC0415
    from gpuplane.k8s.multikueue import MultiKueueSettings  # noqa: PLC0415

    try:
        policy = parse_policy(dispatcher)
    except ValueError as err:
        typer.echo(f"error: --multikueue-dispatcher: {err}", err=True)
        raise typer.Exit(2) from None
    return MultiKueueSettings(dispatcher=policy, **settings)
