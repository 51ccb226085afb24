"""A helper for the benchmark scripts (not a benchmark): a process that runs for a ``with`` block."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def running(args: list[str], log: Path, timeout: float = 20.0) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``args`` with its output in ``log`` for the block; then terminate it, and kill it if it
    has not ended ``timeout`` seconds later."""
    with log.open("wb") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
