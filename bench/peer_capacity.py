"""gpuplane's capacity against the peers: the auto sweep on the built-in week, timed as a user runs it.

Runs ``gpuplane simulate --sweep auto --compare kueue,kueue-timeslicing,volcano --output json`` in a
child process (the command a user types; one worker process per CPU) and reports:

* the wall time of the whole command and the CPU seconds of it and its workers, against the
  target of 15 minutes on 2 cores, and the share of the workers' time its runs took (the rest
  waited);
* each configuration's bisected capacity at the wait target, its ratio to gpuplane's, the runs it
  took (and how many stopped early, once sure to miss the target) and their summed run time;
* the strongest peer, gpuplane's multiple of its capacity against the goal of 2x, and where that is
  short, the feature that lifts the peer over its base (``peerGaps``);
* the GPUs each configuration needs to match gpuplane (simulated).

Usage::

    python3 bench/peer_capacity.py [--scenario FILE] [--days D] [--wait-target 1h] [--jobs N]
                                   [--out DIR] [--output json]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuplane.sim.parallel import default_jobs

PEERS = "kueue,kueue-timeslicing,volcano"
TARGET_SECONDS = 15 * 60
GOAL = 2.0


def sweep_command(args: argparse.Namespace) -> list[str]:
    command = [sys.executable, "-m", "gpuplane", "simulate", "--sweep", "auto", "--compare", PEERS]
    command += ["--output", "json"]
    for flag, value in (
        ("--scenario", args.scenario),
        ("--days", args.days),
        ("--wait-target", args.wait_target),
        ("--jobs", args.jobs),
        ("--report", args.out),
    ):
        if value is not None:
            command += [flag, str(value)]
    return command


def summary(document: dict[str, Any], wall: float, cpu: float, workers: int) -> dict[str, Any]:
    """The benchmark's figures from the sweep's JSON, the command's wall and CPU seconds and its
    worker processes: ``runShareOfWorkerTime`` is the time of every run the sweep kept (its
    search and its GPUs to match) over the workers' time (wall x workers); the rest went to
    waiting (the parent, a stopped run, nothing left to start) and to starting up. It does not
    depend on how fast the machine runs that day, as the wall time does."""
    capacity = document["capacityAtWaitTarget"]
    runs = {
        name: {
            "runs": len(points),
            "cut": sum(1 for p in points if p.get("cut")),
            "runSeconds": round(sum(p.get("wallSeconds") or 0.0 for p in points), 1),
        }
        for name, points in document["autoSweep"].items()
    }
    peer = document.get("strongestPeer")
    multiple = None
    if peer is not None and capacity.get(peer) and capacity.get("gpuplane"):
        multiple = round(capacity["gpuplane"] / capacity[peer], 3)
    matches = document.get("gpusToMatch", {})
    run_seconds = sum(
        p.get("wallSeconds") or 0.0 for points in document["autoSweep"].values() for p in points
    )
    run_seconds += sum(
        r.get("wallSeconds") or 0.0 for match in matches.values() for r in match.get("runs", [])
    )
    return {
        "scenario": document["scenario"],
        "gpus": document["gpus"],
        "days": document["days"],
        "waitTargetSeconds": document["waitTargetSeconds"],
        "wallSeconds": round(wall, 1),
        "cpuSeconds": round(cpu, 1),
        "targetSeconds": TARGET_SECONDS,
        "withinTarget": wall <= TARGET_SECONDS,
        "capacityAtWaitTarget": capacity,
        "capacityBound": document["capacityBound"],
        "capacityRatioToGpuplane": document.get("capacityRatioToGpuplane"),
        "strongestPeer": peer,
        "gpuplaneMultipleOfStrongestPeer": multiple,
        "meetsGoal": multiple is not None and multiple >= GOAL,
        "peerGaps": document.get("peerGaps", {}),
        "gpusToMatch": {name: match.get("gpus") for name, match in matches.items()},
        "gpusToMatchLoad": document.get("gpusToMatchLoad"),
        "runs": runs,
        "matchRuns": {name: len(match.get("runs", [])) for name, match in matches.items()},
        "matchRunSeconds": {
            name: round(sum(r.get("wallSeconds") or 0.0 for r in match.get("runs", [])), 1)
            for name, match in matches.items()
        },
        "phaseSeconds": {phase: part["wallSeconds"] for phase, part in document.get("phases", {}).items()},
        "workers": workers,
        "runShareOfWorkerTime": round(run_seconds / (wall * workers), 3) if wall > 0 else None,
        "headline": document.get("headline", ""),
    }


def table(result: dict[str, Any]) -> Table:
    out = Table(
        title=(
            f"peer-capacity: {result['scenario']}, {result['gpus']:,} GPUs, {result['days']:g} days, "
            f"{result['wallSeconds']:,.0f} s wall ({result['cpuSeconds']:,.0f} s CPU; runs "
            f"{result['runShareOfWorkerTime']:.0%} of {result['workers']} workers' time)"
        ),
        title_justify="left",
    )
    for column in ("configuration", "capacity", "ratio", "runs (cut)", "run seconds", "GPUs to match"):
        out.add_column(column, justify="left" if column == "configuration" else "right")
    ratio = result["capacityRatioToGpuplane"] or {}
    for name, value in result["capacityAtWaitTarget"].items():
        runs = result["runs"].get(name, {})
        gpus = result["gpusToMatch"].get(name)
        out.add_row(
            name,
            "-" if value is None else f"{value:.2f}",
            "-" if ratio.get(name) is None else f"{ratio[name]:.2f}",
            f"{runs.get('runs', 0)} ({runs.get('cut', 0)})",
            f"{runs.get('runSeconds', 0.0):,.0f}",
            "-" if gpus is None else f"{gpus:,}",
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", type=Path, default=None, help="default: the built-in scenario")
    parser.add_argument("--days", type=float, default=None)
    parser.add_argument("--wait-target", default=None, help="1h (default), 30min, 7200")
    parser.add_argument("--jobs", type=int, default=None, help="processes side by side (default: CPUs)")
    parser.add_argument("--out", type=Path, default=None, help="write the sweep's report and JSON here")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(sweep_command(args), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return done.returncode
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    document = json.loads(done.stdout)
    result = summary(document, wall, cpu, args.jobs or default_jobs())
    if args.out is not None:
        (args.out / "peer-capacity.json").write_text(
            json.dumps(result | {"sweep": document}, indent=1) + "\n"
        )
    if args.output == "json":
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    console = Console()
    console.print(table(result))
    console.print(result["headline"])
    verdict = "PASS" if result["withinTarget"] else "FAIL"
    console.print(f"wall {result['wallSeconds']:,.0f} s; target <= {TARGET_SECONDS} s: {verdict}")
    goal = "met" if result["meetsGoal"] else "not met"
    console.print(
        f"gpuplane / strongest peer: {result['gpuplaneMultipleOfStrongestPeer']}x; goal {GOAL:g}x {goal}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
