"""One end-to-end test module run as a benchmark: at a size set through its environment, on the
project's control plane (``scripts/kube-up.sh``), a running cluster, or the API-server double.

``bench/chaos.py`` and ``bench/eta_live.py`` run their test this way and read the result line it prints.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from controller_vs_kube_scheduler import control_plane  # a sibling script, found through the caller's path
from rich.console import Console

ROOT = Path(__file__).resolve().parent.parent


def run_test_module(
    test: str, sizes: Mapping[str, str], *, kubeconfig: str | None, double: bool, console: Console
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run ``test`` (a path under the repository) with ``sizes`` in its environment; returns its
    process (output captured) and the seconds it took, control plane start included."""
    env = {**os.environ, **sizes}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", test]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False)

    started = time.monotonic()
    if double:
        env.pop("GPUPLANE_E2E_KUBECONFIG", None)
        result = run()
    else:
        with control_plane(kubeconfig, console) as config:
            env["GPUPLANE_E2E_KUBECONFIG"] = config
            result = run()
    return result, time.monotonic() - started
