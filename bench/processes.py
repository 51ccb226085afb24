"""Helpers for the benchmark scripts (not a benchmark): a process that runs for a ``with`` block, and
the CPU time that processes spend over a stretch of a run."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Mapping
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


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU seconds the process has used (``/proc/PID/stat``), or ``None`` when it is
    gone or not readable."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Fields after the command name (which may hold spaces and parentheses): state is field 3,
    # utime 14 and stime 15.
    fields = text.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def control_plane_pids(directory: Path) -> dict[str, int]:
    """The processes ``scripts/kube-up.sh DIR`` started, by name, from ``DIR/pids`` (lines
    ``PID NAME``); empty when the file is not there."""
    try:
        lines = (directory / "pids").read_text().splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        parts = line.split()
        if len(parts) == 2 and parts[0].isdigit():
            out[parts[1]] = int(parts[0])
    return out


class CpuMeter:
    """The CPU seconds that named processes spend from the moment each is added (owns the pids and
    their readings at that moment)."""

    def __init__(self, pids: Mapping[str, int] | None = None) -> None:
        self.pids: dict[str, int] = {}
        self.start: dict[str, float] = {}
        for name, pid in (pids or {}).items():
            self.add(name, pid)

    def add(self, name: str, pid: int) -> None:
        """Count ``pid``'s CPU as ``name``'s from now on (not at all when it cannot be read)."""
        now = cpu_seconds(pid)
        if now is not None:
            self.pids[name] = pid
            self.start[name] = now

    def spent(self) -> dict[str, float]:
        """CPU seconds per name since it was added (names whose process is gone are left out)."""
        out = {}
        for name, pid in self.pids.items():
            now = cpu_seconds(pid)
            if now is not None:
                out[name] = now - self.start[name]
        return out

    def per_pod(self, pods: int) -> dict[str, float]:
        """Milliseconds of CPU per pod, by name, since each was added."""
        if pods <= 0:
            raise ValueError(f"pods must be positive, not {pods}")
        return {name: round(1000 * spent / pods, 2) for name, spent in self.spent().items()}
