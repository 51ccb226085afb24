"""Crash safety at full size: tests/test_chaos_e2e.py with 1,000 jobs and 50 kills, on a real control plane.

The test (see its docstring) submits jobs of every kind gpuplane places, runs them to completion
through the fake kubelet while controller replicas are killed at random points (the leader among
them, under a standby) and the API server is restarted twice, and checks the invariants from the
API server's objects at every kill and at the end. CI runs it small (24 jobs, 12 kills); this runs
it at the issue's size on the project's control plane (``scripts/kube-up.sh``, or ``--kubeconfig``),
and ``--double`` on the API-server double instead.

Usage::

    python3 bench/run.py chaos                       # 1,000 jobs, 50 kills, real control plane
    python3 bench/chaos.py --jobs 200 --kills 20 --output json

Prints the kills, the API-server restarts and each leader fail-over time (seconds from the kill to
the standby's lead), and ``{"violations": 0, ...}`` with ``--output json``. The exit status is the
test's: 0 when every invariant held and every job completed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e_module import run_test_module  # a sibling script, found through the path above

ROOT = Path(__file__).resolve().parent.parent
RESULT = re.compile(
    r"chaos: (?P<jobs>\d+) jobs, kills (?P<kills>\{.*?\}), API server restarts (?P<restarts>\d+), "
    r"fail-over s (?P<failovers>\[.*?\])"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--kills", type=int, default=50)
    parser.add_argument("--kubeconfig", help="a running cluster (default: start the project's own)")
    parser.add_argument("--double", action="store_true", help="run on the API-server double instead")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    console = Console(stderr=args.output == "json")
    sizes = {"CHAOS_JOBS": str(args.jobs), "CHAOS_KILLS": str(args.kills)}
    result, seconds = run_test_module(
        "tests/test_chaos_e2e.py", sizes, kubeconfig=args.kubeconfig, double=args.double, console=console
    )
    found = RESULT.search(result.stdout)
    summary: dict[str, object] = {
        "backend": "double" if args.double else "real",
        "jobs": args.jobs,
        "violations": 0 if result.returncode == 0 else None,
        "seconds": round(seconds, 1),
        "passed": result.returncode == 0,
    }
    if found:
        failovers = json.loads(found["failovers"])
        summary |= {
            "kills": json.loads(found["kills"].replace("'", '"')),
            "apiServerRestarts": int(found["restarts"]),
            "failoverSeconds": {"max": max(failovers), "mean": round(sum(failovers) / len(failovers), 2)}
            if failovers
            else None,
        }
    if args.output == "json":
        print(json.dumps(summary))
    else:
        console.print(summary)
    if result.returncode != 0:
        console.print(result.stdout[-4000:], markup=False)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
