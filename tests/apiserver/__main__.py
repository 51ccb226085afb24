"""Run a double by hand: ``cd tests && python -m apiserver --kubeconfig /tmp/double.kubeconfig``.

Serves until interrupted, so kubectl (``KUBECONFIG=/tmp/double.kubeconfig kubectl get ns``), a client
under development, or the e2e mode of the tests (``GPUPLANE_E2E_KUBECONFIG``) can talk to it.
"""

from __future__ import annotations

import argparse
import contextlib
import threading
from pathlib import Path

from .server import ApiServerDouble


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m apiserver", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="where to write the kubeconfig")
    args = parser.parse_args()
    with ApiServerDouble() as double:
        double.write_kubeconfig(args.kubeconfig)
        print(f"serving {double.url}; kubeconfig at {args.kubeconfig}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
