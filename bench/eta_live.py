"""The live ETA after 50 finished runs of a job name, against the class fallback, on a real control plane.

Runs tests/test_eta_live_e2e.py (see its docstring) at the issue's size: 50 runs of each of three
job names through the real controller, the Job controller and the fake kubelet, then 10 trials in
which a run of the long name holds the node and a probe waits behind it. The probe's ETA is taken
as ``gpuplane why`` takes it, from the history the controller learned (the holder's name) and from
the same runs without names (the queue's history), and measured against the probe's real start.
CI runs it small (12 runs, 3 trials); ``--double`` runs it on the API-server double.

Usage::

    python3 bench/run.py eta-live                       # 50 runs per name, 10 trials, real plane
    python3 bench/eta_live.py --runs 20 --trials 5 --output json

Prints ``{"nameHistory": {"relativeErrorP50"}, "classFallback": {"relativeErrorP50"}, ...}`` with
``--output json``; the exit status is the test's (0: the name's history beat the class).
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
    r"eta-live: runs per name (?P<runs>\d+), trials (?P<trials>\d+), relative error p50 name history "
    r"(?P<name>[\d.]+), class fallback (?P<klass>[\d.]+), by trial name (?P<by_name>\[.*?\]) "
    r"class (?P<by_class>\[.*?\])"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="finished runs of each job name")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--kubeconfig", help="a running cluster (default: start the project's own)")
    parser.add_argument("--double", action="store_true", help="run on the API-server double instead")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    console = Console(stderr=args.output == "json")
    sizes = {"ETA_LIVE_RUNS": str(args.runs), "ETA_LIVE_TRIALS": str(args.trials)}
    result, seconds = run_test_module(
        "tests/test_eta_live_e2e.py", sizes, kubeconfig=args.kubeconfig, double=args.double, console=console
    )
    summary: dict[str, object] = {
        "backend": "double" if args.double else "real",
        "seconds": round(seconds, 1),
        "passed": result.returncode == 0,
    }
    found = RESULT.search(result.stdout)
    if found:
        summary |= {
            "runsPerName": int(found["runs"]),
            "trials": int(found["trials"]),
            "nameHistory": {
                "relativeErrorP50": float(found["name"]),
                "byTrial": json.loads(found["by_name"]),
            },
            "classFallback": {
                "relativeErrorP50": float(found["klass"]),
                "byTrial": json.loads(found["by_class"]),
            },
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
