"""Kueue-shaped scale benchmark: schedule 50,000 pending Workloads across 1,000 ClusterQueues.

The cluster state follows the shape of Kueue's own scheduler performance tests
(``test/performance/scheduler`` in kubernetes-sigs/kueue): cohorts of ClusterQueues with
one ``default`` flavor covering ``cpu`` (nominalQuota 20, borrowingLimit 100,
``reclaimWithinCohort: Any``, ``withinClusterQueue: LowerPriority``) and three workload
classes, small / medium / large. Kueue's configurations use other counts (at the time of
writing, its baseline has 5 cohorts x 6 queues with 350/100/50 workloads per queue, its
large-scale one 20 x 100 with 20/7/3); this benchmark fixes 10 x 100 queues with 35/11/4,
i.e. 50,000 workloads, all pending at once, and drains them to a fixed point with
``gpuplane schedule``.

Usage::

    python3 bench/kueue_scale.py [--out DIR] [--cohorts 10] [--queues-per-cohort 100]
                                 [--format json|yaml] [--keep]

Every measured process is a fresh child running the checkout's code (``src`` first on
``PYTHONPATH``) with this interpreter:

- decode floor: ``json.load`` of the file (the C YAML loader for ``--format yaml``);
- parse baseline: ``gpuplane.model.loader.load_files`` on the file, timed inside the child;
- the run: ``gpuplane schedule -f FILE --output json`` through the console script's entry
  point, timed from outside (wall) and by its own ``stats``.

Peak memory is the child's own ``ru_maxrss`` from ``os.wait4``, so the children never
blur each other's numbers. Ratios are reported next to the absolute times. The targets
(schedule <= 5 s, parse <= 10 s, peak RSS <= 1 GiB) are checked and shown as PASS/FAIL;
they inform and never change the exit status, which is 1 only when a child fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import yaml
from rich.console import Console
from rich.table import Table

NAME = "kueue-scale"
KUEUE_API = "kueue.x-k8s.io/v1beta2"
FLAVOR = "default"
NOMINAL_CPU = 20
BORROWING_LIMIT_CPU = 100
# Creation times start here and advance one second per workload, in generation order.
FIRST_CREATION = datetime(2024, 1, 1, tzinfo=UTC)

SRC_DIR = Path(__file__).resolve().parent.parent / "src"

# Targets for the default shape (10 x 100 queues, 50,000 workloads).
SCHEDULE_TARGET_S = 5.0
PARSE_TARGET_S = 10.0
PEAK_RSS_TARGET_MIB = 1024.0


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """One class of identical workloads, created ``per_queue`` times in every ClusterQueue."""

    name: str
    per_queue: int
    cpu: int
    priority: int


WORKLOAD_CLASSES = (
    WorkloadClass("small", per_queue=35, cpu=1, priority=50),
    WorkloadClass("medium", per_queue=11, cpu=5, priority=100),
    WorkloadClass("large", per_queue=4, cpu=20, priority=200),
)


# ---------------------------------------------------------------------------
# Generator
# ---------------------------------------------------------------------------


def _width(count: int) -> int:
    """Digits needed to number ``0..count-1`` with zero padding, so names sort in order."""
    return len(str(max(count - 1, 0)))


def cohort_name(cohort: int, cohorts: int) -> str:
    return f"cohort-{cohort:0{_width(cohorts)}d}"


def cluster_queue_name(cohort: int, queue: int, cohorts: int, queues_per_cohort: int) -> str:
    return f"cq-{cohort:0{_width(cohorts)}d}-{queue:0{_width(queues_per_cohort)}d}"


def creation_slots(classes: Sequence[WorkloadClass] = WORKLOAD_CLASSES) -> list[tuple[WorkloadClass, int]]:
    """The order in which one ClusterQueue's workloads are created: ``(class, index)`` pairs.

    Each class is spread evenly over the sequence (its k-th workload sits at fraction
    ``(k + 0.5) / per_queue``), the way Kueue's generator creates the classes side by side
    at different intervals. Ties go to the class listed first, so the order is fixed.
    """
    keyed = [
        ((k + 0.5) / cls.per_queue, position, k, cls)
        for position, cls in enumerate(classes)
        for k in range(cls.per_queue)
    ]
    keyed.sort(key=lambda item: item[:3])
    return [(cls, k) for _, _, k, cls in keyed]


def _cluster_queue(name: str, cohort: str) -> dict[str, Any]:
    return {
        "apiVersion": KUEUE_API,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "cohortName": cohort,
            "namespaceSelector": {},
            "preemption": {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"},
            "resourceGroups": [
                {
                    "coveredResources": ["cpu"],
                    "flavors": [
                        {
                            "name": FLAVOR,
                            "resources": [
                                {
                                    "name": "cpu",
                                    "nominalQuota": str(NOMINAL_CPU),
                                    "borrowingLimit": str(BORROWING_LIMIT_CPU),
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    }


def _workload(name: str, namespace: str, queue: str, cls: WorkloadClass, sequence: int) -> dict[str, Any]:
    created = FIRST_CREATION + timedelta(seconds=sequence)
    return {
        "apiVersion": KUEUE_API,
        "kind": "Workload",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # A fixed, valid UUID per workload keeps runs reproducible.
            "uid": f"00000000-0000-4000-8000-{sequence:012d}",
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "spec": {
            "queueName": queue,
            "priority": cls.priority,
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "main",
                                    "image": "registry.k8s.io/pause:3.10",
                                    "resources": {"requests": {"cpu": str(cls.cpu)}},
                                }
                            ]
                        }
                    },
                }
            ],
        },
    }


def generate_objects(cohorts: int = 10, queues_per_cohort: int = 100) -> list[dict[str, Any]]:
    """All objects of the benchmark's cluster state, as plain JSON-compatible dicts.

    Order: one Namespace per cohort (named like the cohort), the ResourceFlavor, the
    ClusterQueues, one LocalQueue per ClusterQueue (same name, in its cohort's namespace),
    then the Workloads in creation order: slot by slot of :func:`creation_slots`, and
    within a slot ClusterQueue by ClusterQueue. Creation timestamps rise by one second per
    workload. No two objects share a nested dict, so a YAML dump has no anchors. The result
    depends only on the arguments.
    """
    if cohorts < 1 or queues_per_cohort < 1:
        raise ValueError("cohorts and queues_per_cohort must be at least 1")
    namespaces = [cohort_name(c, cohorts) for c in range(cohorts)]
    queues = [
        (namespaces[c], cluster_queue_name(c, q, cohorts, queues_per_cohort))
        for c in range(cohorts)
        for q in range(queues_per_cohort)
    ]
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in namespaces
    ]
    objects.append(
        {"apiVersion": KUEUE_API, "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}, "spec": {}}
    )
    objects += [_cluster_queue(cq, ns) for ns, cq in queues]
    objects += [
        {
            "apiVersion": KUEUE_API,
            "kind": "LocalQueue",
            "metadata": {"name": cq, "namespace": ns},
            "spec": {"clusterQueue": cq},
        }
        for ns, cq in queues
    ]
    index_width = _width(max(cls.per_queue for cls in WORKLOAD_CLASSES))
    sequence = 0
    for cls, k in creation_slots():
        for ns, cq in queues:
            name = f"{cq}-{cls.name}-{k:0{index_width}d}"
            objects.append(_workload(name, ns, cq, cls, sequence))
            sequence += 1
    return objects


def write_state(objects: Sequence[dict[str, Any]], path: Path, fmt: str) -> None:
    """Write ``objects`` as a compact JSON ``kind: List`` or as multi-document YAML."""
    with path.open("w", encoding="utf-8") as out:
        if fmt == "json":
            # json.dumps uses the C encoder; json.dump streams through the pure-Python one.
            out.write(
                json.dumps(
                    {"apiVersion": "v1", "kind": "List", "items": list(objects)}, separators=(",", ":")
                )
            )
        elif fmt == "yaml":
            dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
            yaml.dump_all(objects, out, Dumper=dumper, sort_keys=False, default_flow_style=False)
        else:
            raise ValueError(f"unknown format {fmt!r}; expected json or yaml")


# ---------------------------------------------------------------------------
# Measuring children
# ---------------------------------------------------------------------------

# Run in a child: time the pure decode of the file (the floor under any parser).
_DECODE_FLOOR = """
import json, sys, time
path, fmt = sys.argv[1], sys.argv[2]
if fmt == "yaml":
    import yaml
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
start = time.perf_counter()
with open(path, "rb") as fh:
    if fmt == "json":
        json.load(fh)
    else:
        list(yaml.load_all(fh, Loader=loader))
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

# Run in a child: time gpuplane's loader alone (imports are outside the timed part).
_PARSE_BASELINE = """
import json, sys, time
from gpuplane.model.loader import load_files
start = time.perf_counter()
load_files([sys.argv[1]])
print(json.dumps({"seconds": time.perf_counter() - start}))
"""

# The `gpuplane` console script's entry point, run with this interpreter.
_GPUPLANE = "import sys; from gpuplane.cli.app import main; sys.argv[0] = 'gpuplane'; main()"


@dataclass(frozen=True, slots=True)
class ChildRun:
    """What one child process did: exit status, output, wall time and its own peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    wall_seconds: float
    peak_rss_mib: float


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH", "")) if p)
    return env


def _read(stream: IO[bytes]) -> str:
    stream.seek(0)
    return stream.read().decode("utf-8", errors="replace")


def run_child(args: Sequence[str]) -> ChildRun:
    """Run ``args``, wait for it with ``os.wait4`` and return its own resource usage.

    Output goes to anonymous temporary files, not pipes, so a large JSON answer can
    neither deadlock nor be held twice in this process while the child runs.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(list(args), stdout=out, stderr=err, env=_child_env())
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        wall = time.perf_counter() - start
        # os.wait4 reaped the child; tell Popen so it does not wait for it again.
        proc.returncode = os.waitstatus_to_exitcode(status)
        # ru_maxrss is in KiB on Linux and in bytes on macOS.
        rss_bytes = usage.ru_maxrss if sys.platform == "darwin" else usage.ru_maxrss * 1024
        return ChildRun(proc.returncode, _read(out), _read(err), wall, rss_bytes / 2**20)


def _seconds(run: ChildRun) -> float:
    return float(json.loads(run.stdout)["seconds"])


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def _ratio(value: float, base: float) -> float | None:
    return value / base if base > 0 else None


def _target(name: str, value: float, limit: float, unit: str) -> dict[str, Any]:
    return {"name": name, "value": value, "limit": limit, "unit": unit, "pass": value <= limit}


def build_results(
    *,
    cohorts: int,
    queues_per_cohort: int,
    fmt: str,
    workloads: int,
    file_bytes: int,
    generate_seconds: float,
    decode: ChildRun,
    parse: ChildRun,
    schedule: ChildRun,
) -> dict[str, Any]:
    """Combine the three child runs into the JSON-ready result document."""
    answer = json.loads(schedule.stdout)
    stats = answer.get("stats", {})
    decode_s, parse_baseline_s = _seconds(decode), _seconds(parse)
    parse_s = float(stats.get("parseSeconds", 0.0))
    schedule_s = float(stats.get("scheduleSeconds", 0.0))
    return {
        "benchmark": NAME,
        "shape": {
            "cohorts": cohorts,
            "clusterQueues": cohorts * queues_per_cohort,
            "workloads": workloads,
            "format": fmt,
            "fileBytes": file_bytes,
            "generateSeconds": generate_seconds,
        },
        "baseline": {
            "decodeSeconds": decode_s,
            "decodePeakRssMiB": decode.peak_rss_mib,
            "parseSeconds": parse_baseline_s,
            "parsePeakRssMiB": parse.peak_rss_mib,
        },
        "run": {
            "cycles": stats.get("cycles"),
            "parseSeconds": parse_s,
            "scheduleSeconds": schedule_s,
            "wallSeconds": schedule.wall_seconds,
            "peakRssMiB": schedule.peak_rss_mib,
            "admitted": len(answer.get("admitted", [])),
            "preempted": len(answer.get("preempted", [])),
            "pending": len(answer.get("pending", [])),
        },
        "ratios": {
            "scheduleOverParseBaseline": _ratio(schedule_s, parse_baseline_s),
            "parseOverParseBaseline": _ratio(parse_s, parse_baseline_s),
            "parseBaselineOverDecode": _ratio(parse_baseline_s, decode_s),
            "wallOverParseBaseline": _ratio(schedule.wall_seconds, parse_baseline_s),
            "peakRssOverParseBaseline": _ratio(schedule.peak_rss_mib, parse.peak_rss_mib),
        },
        "targets": [
            _target("schedule", schedule_s, SCHEDULE_TARGET_S, "s"),
            _target("parse", parse_s, PARSE_TARGET_S, "s"),
            _target("peak memory", schedule.peak_rss_mib, PEAK_RSS_TARGET_MIB, "MiB"),
        ],
    }


def _x(ratio: float | None, base: str) -> str:
    return "" if ratio is None else f"{ratio:.2f}x {base}"


def render(results: dict[str, Any], console: Console) -> None:
    """Print the results as one table: absolute numbers, ratios and target verdicts."""
    shape, base, run, ratios = results["shape"], results["baseline"], results["run"], results["ratios"]
    verdicts = {t["name"]: t for t in results["targets"]}

    def verdict(name: str) -> tuple[str, str]:
        t = verdicts[name]
        mark = "[green]PASS[/green]" if t["pass"] else "[red]FAIL[/red]"
        return f"<= {t['limit']:g} {t['unit']}", mark

    decoder = "json.load" if shape["format"] == "json" else "yaml.load_all (C loader)"
    table = Table(
        title=f"{NAME}: Kueue-shaped, drained to a fixed point",
        caption=f"baseline: load_files alone (own process); floor: {decoder} alone",
    )
    table.add_column("measure")
    table.add_column("value", justify="right")
    table.add_column("ratio", justify="right")
    table.add_column("target", justify="right")
    table.add_column("result", justify="center")
    table.add_row("workloads", f"{shape['workloads']:,}")
    table.add_row("ClusterQueues", f"{shape['clusterQueues']:,}")
    table.add_row("cohorts", f"{shape['cohorts']:,}")
    table.add_row("state file", f"{shape['fileBytes'] / 2**20:.1f} MiB {shape['format']}")
    table.add_row("floor", f"{base['decodeSeconds']:.3f} s")
    table.add_row("baseline", f"{base['parseSeconds']:.3f} s", _x(ratios["parseBaselineOverDecode"], "floor"))
    table.add_row("baseline RSS", f"{base['parsePeakRssMiB']:.0f} MiB")
    table.add_row("cycles", str(run["cycles"]))
    table.add_row(
        "parse",
        f"{run['parseSeconds']:.3f} s",
        _x(ratios["parseOverParseBaseline"], "baseline"),
        *verdict("parse"),
    )
    table.add_row(
        "schedule",
        f"{run['scheduleSeconds']:.3f} s",
        _x(ratios["scheduleOverParseBaseline"], "baseline"),
        *verdict("schedule"),
    )
    table.add_row("wall", f"{run['wallSeconds']:.3f} s", _x(ratios["wallOverParseBaseline"], "baseline"))
    table.add_row(
        "peak RSS",
        f"{run['peakRssMiB']:.0f} MiB",
        _x(ratios["peakRssOverParseBaseline"], "baseline"),
        *verdict("peak memory"),
    )
    for outcome in ("admitted", "preempted", "pending"):
        table.add_row(outcome, f"{run[outcome]:,}")
    console.print(table)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kueue_scale.py", description=__doc__.split("\n\n", 1)[0])
    parser.add_argument(
        "--out", type=Path, help="write DIR/kueue-scale.json (and, with --keep, the state file)"
    )
    parser.add_argument("--cohorts", type=_positive, default=10, help="number of cohorts (default 10)")
    parser.add_argument(
        "--queues-per-cohort", type=_positive, default=100, help="ClusterQueues per cohort (default 100)"
    )
    parser.add_argument("--format", choices=("json", "yaml"), default="json", help="state file format")
    parser.add_argument("--keep", action="store_true", help="keep the generated state file")
    return parser.parse_args(argv)


def _fail(console: Console, what: str, run: ChildRun) -> int:
    console.print(f"[red]{what} failed with exit status {run.returncode}[/red]")
    sys.stderr.write(run.stderr)
    return 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
    if args.keep:
        work = args.out if args.out is not None else Path(tempfile.mkdtemp(prefix=f"{NAME}-"))
    else:
        work = Path(tempfile.mkdtemp(prefix=f"{NAME}-"))
    try:
        state = work / f"{NAME}-state.{args.format}"
        with console.status("generating cluster state"):
            start = time.perf_counter()
            objects = generate_objects(args.cohorts, args.queues_per_cohort)
            workloads = sum(1 for o in objects if o["kind"] == "Workload")
            write_state(objects, state, args.format)
            del objects
            generate_seconds = time.perf_counter() - start
        console.print(f"generated {workloads:,} workloads in {generate_seconds:.1f} s")

        python = sys.executable
        with console.status("measuring the decode floor"):
            decode = run_child([python, "-c", _DECODE_FLOOR, str(state), args.format])
        if decode.returncode != 0:
            return _fail(console, "decode floor", decode)
        with console.status("measuring the parse baseline"):
            parse = run_child([python, "-c", _PARSE_BASELINE, str(state)])
        if parse.returncode != 0:
            return _fail(console, "parse baseline", parse)
        with console.status("running gpuplane schedule"):
            schedule = run_child([python, "-c", _GPUPLANE, "schedule", "-f", str(state), "--output", "json"])
        if schedule.returncode != 0:
            return _fail(console, "gpuplane schedule", schedule)

        try:
            results = build_results(
                cohorts=args.cohorts,
                queues_per_cohort=args.queues_per_cohort,
                fmt=args.format,
                workloads=workloads,
                file_bytes=state.stat().st_size,
                generate_seconds=generate_seconds,
                decode=decode,
                parse=parse,
                schedule=schedule,
            )
        except (ValueError, KeyError, TypeError) as err:
            console.print(f"[red]unexpected output from a child: {err!r}[/red]")
            sys.stderr.write(schedule.stdout[:2000])
            return 1
        render(results, console)
        if args.out is not None:
            target = args.out / f"{NAME}.json"
            target.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
            console.print(f"results written to {target}")
        if args.keep:
            console.print(f"state file kept at {state}")
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
