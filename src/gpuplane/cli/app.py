"""The `gpuplane` command: one typer app that each command module registers itself on.

A command module exposes ``register(app)``; adding a command means adding its module to
``_COMMAND_MODULES`` below, not editing this file's functions.
"""

from __future__ import annotations

from typing import Annotated

import typer

from gpuplane import __version__
from gpuplane.cli import (
    capacity,
    controller,
    doctor,
    dump,
    reaper,
    report,
    schedule,
    simulate,
    visibility,
    web,
    why,
)

# Modules whose ``register(app)`` adds their commands, in the order they appear in --help.
_COMMAND_MODULES = (
    schedule,
    simulate,
    capacity,
    controller,
    reaper,
    doctor,
    why,
    report,
    visibility,
    web,
    dump,
)


def build_app() -> typer.Typer:
    """Return a fresh app with every command registered (a new object per call, no shared state)."""
    app = typer.Typer(
        name="gpuplane",
        no_args_is_help=True,
        add_completion=False,
    )

    # A callback keeps typer in multi-command mode even while only one command exists,
    # so `gpuplane version` never collapses into plain `gpuplane`.
    @app.callback(invoke_without_command=True)
    def _root(
        ctx: typer.Context,
        show_version: Annotated[
            bool, typer.Option("--version", is_eager=True, help="Print the gpuplane version and exit.")
        ] = False,
    ) -> None:
        """Scheduling control plane for GPUs and other accelerators on Kubernetes."""
        if show_version:
            typer.echo(f"gpuplane {__version__}")
            raise typer.Exit
        if ctx.invoked_subcommand is None:
            typer.echo(ctx.get_help())
            raise typer.Exit

    @app.command()
    def version() -> None:
        """Print the gpuplane version."""
        typer.echo(f"gpuplane {__version__}")

    for module in _COMMAND_MODULES:
        module.register(app)
    return app


app = build_app()


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
