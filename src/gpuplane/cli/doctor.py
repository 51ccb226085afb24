"""`gpuplane doctor`: check a cluster (live or from files) and print what to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpuplane.insight import webhook_doctor
from gpuplane.insight.doctor import Finding, diagnose
from gpuplane.insight.dra_doctor import dra_findings
from gpuplane.insight.queue_doctor import queue_findings
from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_files, state_from_objects
from gpuplane.model.objects import ClusterState


def _live_state(kubeconfig: str | None, context: str | None, skipped: list[InputError]) -> ClusterState:
    """The cluster's nodes and queueing objects; one the loader refuses is left out and added to
    ``skipped`` (reported on its own: one bad object must not stop the checks of the rest)."""
    from gpuplane.k8s import api as k8s  # noqa: PLC0415 - the client is only needed for a live cluster
    from gpuplane.k8s.clusterstate import CHECKED  # noqa: PLC0415

    client = k8s.KubeApi(k8s.load_api_client(kubeconfig, context))
    objects = []
    for res in CHECKED:
        try:
            items = client.list(res).get("items", [])
        except k8s.ApiError as err:
            if err.not_found:
                continue
            raise
        objects += [{**o, "kind": res.kind, "apiVersion": res.api_version} for o in items]
    return state_from_objects(objects, source="cluster", skipped=skipped)


def _invalid_objects(skipped: list[InputError]) -> list[Finding]:
    """One finding per object the loader refused."""
    return [
        Finding(
            "error",
            "invalid-object",
            (problem.obj or "?",),
            f"{problem.field}: {problem.message}" if problem.field else problem.message,
            "correct the field named; gpuplane leaves the object out until then",
        )
        for problem in skipped
    ]


def _webhook_findings(kubeconfig: str | None, context: str | None, namespace: str) -> list[Finding]:
    """Whether gpuplane's webhook is registered and answers (:mod:`gpuplane.insight.webhook_doctor`)."""
    from gpuplane.k8s import api as k8s  # noqa: PLC0415 - the client is only needed for a live cluster
    from gpuplane.k8s.guardrails import probe_webhook, registered_webhooks  # noqa: PLC0415

    client = k8s.KubeApi(k8s.load_api_client(kubeconfig, context))
    try:
        configs = registered_webhooks(client)
    except k8s.ApiError as err:
        problem = f"cannot list MutatingWebhookConfigurations ({err.status} {err.reason})"
        return [
            Finding(
                "warning",
                "webhook-not-probed",
                ("MutatingWebhookConfiguration",),
                problem,
                "run doctor with rights to list them",
            )
        ]
    found = webhook_doctor.registration_findings(configs)
    if any(f.check == "webhook-not-registered" for f in found):
        return found
    return found + webhook_doctor.probe_findings(configs, probe_webhook(client, namespace))


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_command(
        file: Annotated[
            list[str] | None,
            typer.Option("--file", "-f", help="Check these state files instead of a cluster."),
        ] = None,
        kubeconfig: Annotated[str | None, typer.Option(help="kubeconfig of the cluster to check.")] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        probe_namespace: Annotated[
            str,
            typer.Option(help="Namespace of the dry-run pod and Job that check the webhook answers."),
        ] = "default",
    ) -> None:
        """Check GPU nodes, flavors, MIG and topology labels, DRA slices and DeviceClasses, queues
        (missing flavors, uncovered resources, unknown cohorts), and on a live cluster each object
        and gpuplane's webhook; one finding per line."""
        skipped: list[InputError] = []
        try:
            state = (
                load_files(file, read=lambda p: Path(p).read_bytes())
                if file
                else _live_state(kubeconfig, context, skipped)
            )
        except InputError as problem:
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(2) from None
        except Exception as err:  # a cluster that cannot be reached is one line, not a traceback
            typer.echo(f"error: cannot read the cluster: {type(err).__name__}: {err}", err=True)
            raise typer.Exit(2) from None
        findings = _invalid_objects(skipped) + diagnose(state) + dra_findings(state) + queue_findings(state)
        if not file:
            findings += _webhook_findings(kubeconfig, context, probe_namespace)
        for finding in findings:
            typer.echo(finding.line())
        if not findings:
            typer.echo("no problems found")
        raise typer.Exit(1 if any(f.severity == "error" for f in findings) else 0)
