"""`gpuplane dump`: write a live cluster's state as a file that `gpuplane schedule -f` reads.

Thin edge: list the kinds a decision reads (:func:`gpuplane.k8s.clusterstate.live_objects`, GET
requests only), and print them as one multi-document YAML stream (or a JSON ``kind: List``). A
cluster that cannot be read is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from typing import Annotated

import typer
import yaml


class DumpFormat(StrEnum):
    yaml = "yaml"
    json = "json"


def register(app: typer.Typer) -> None:
    """Add the ``dump`` command to ``app``."""

    @app.command("dump")
    def dump_command(
        kubeconfig: Annotated[
            str | None, typer.Option(help="kubeconfig file; in-cluster configuration when omitted.")
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        output: Annotated[DumpFormat, typer.Option("--output", "-o", help="yaml or json.")] = DumpFormat.yaml,
    ) -> None:
        """Print the cluster's state (queues, flavors, nodes, workloads, queued jobs, bound pods) as a
        state file for `gpuplane schedule -f`. Reads only; writes nothing to the cluster."""
        from gpuplane.k8s.clusterstate import read_live  # noqa: PLC0415 - imports the client lazily
        from gpuplane.model.errors import InputError  # noqa: PLC0415

        left_out: list[InputError] = []
        try:
            objects = read_live(kubeconfig, context, left_out)
        except Exception as err:  # unreadable kubeconfig, unreachable server, refused request
            typer.echo(f"error: cannot read the cluster: {type(err).__name__}: {err}", err=True)
            raise typer.Exit(2) from None
        for problem in left_out:
            typer.echo(f"warning: left out an invalid object: {problem}", err=True)
        if output is DumpFormat.json:
            document = {"apiVersion": "v1", "kind": "List", "items": objects}
            sys.stdout.write(json.dumps(document, indent=1) + "\n")
        else:
            sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
