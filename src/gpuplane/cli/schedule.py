"""`gpuplane schedule`: run scheduling cycles over cluster state files (not implemented yet)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Add the ``schedule`` command to ``app`` (adds nothing yet)."""
