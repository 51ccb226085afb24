"""FGD (USENIX ATC'23) placement benchmark on Alibaba's openb trace: speed and fidelity.

Usage::

    python3 bench/fgd_placement.py                 # seed 42 of every policy on the default list
    python3 bench/fgd_placement.py --sweep         # policies x seeds 42..51 x the 17 published lists
    python3 bench/fgd_placement.py --sweep --policies gpuplane,fgd --lists default,cpu250 --jobs 2

Without ``--sweep`` it runs one protocol run (``gpuplane.sim.fgd.run_fgd_protocol`` with the
published arrival and node-rank files) per policy, and reports wall seconds, absolute and as a ratio
to the BestFit run of the same invocation, next to the allocation at 130 % arrived demand and
whether all 131 allocation columns equal the published ones. The target is < 10 s per run.

With ``--sweep`` it runs every (policy, list, seed) and writes, under ``--out``:

- ``fgd-sweep.csv``: one row per run: column 130, the published value, how many of the 131
  allocation and fragmentation columns equal the published ones;
- ``fgd-sweep.json``: per list and policy, the mean of column 130 over the seeds, ours and
  published, and gpuplane's margin over FGD's published mean.

Trace and data files are read from ``../shared`` (next to the repository), never copied.
The exit status is 0 unless a run fails; quality numbers inform, they do not gate.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "src"))

from gpuplane.sim.fgd import FgdTraces, run_fgd_protocol  # noqa: E402 (needs the checkout's src on the path)

SHARED = REPO.parent / "shared"
TRACES = SHARED / "traces" / "alibaba-openb-gpu-v2023" / "csv"
BENCH_DATA = SHARED / "bench"
PUBLISHED = SHARED / "traces" / "fgd-atc23-expected-results"

LISTS = (
    "default",
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpushare100",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
)
SEEDS = tuple(range(42, 52))
# Our policy name -> the published result folder.
PUBLISHED_NAMES = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "gpuclustering": "03-GpuClustering",
    "gpupacking": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}
POLICIES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "gpuplane")
BASELINE = "bestfit"
TARGET_SECONDS = 10.0
COLUMNS = tuple(str(k) for k in range(131))

Published = dict[tuple[str, str, int], dict[str, str]]


@dataclass(frozen=True, slots=True)
class Outcome:
    """One run, compared with the published values where there are any."""

    policy: str
    trace: str
    seed: int
    col130: float | None
    published130: float | None
    allocation_equal: int | None
    fragmentation_equal: int | None
    failed: int
    wall_seconds: float


@cache
def load_published(name: str) -> Published:
    """Rows of a published ``analysis_*_discrete.csv`` by (list, policy folder, seed)."""
    rows: Published = {}
    path = PUBLISHED / name
    if not path.exists():
        return rows
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            rows[(row["workload"].removeprefix("openb_pod_list_"), row["sc_policy"], int(row["seed"]))] = row
    return rows


def equal_columns(ours: dict[str, float | None], theirs: dict[str, str] | None) -> int | None:
    """How many of the 131 columns are equal (both empty counts as equal)."""
    if theirs is None:
        return None
    same = 0
    for k in COLUMNS:
        mine, published = ours.get(k), (theirs.get(k) or "").strip()
        if (mine is None and not published) or (mine is not None and published and mine == float(published)):
            same += 1
    return same


def run_one(policy: str, trace: str, seed: int) -> Outcome:
    """One protocol run with the published arrival order and node ranks, compared with the paper's."""
    traces = FgdTraces(
        TRACES / "openb_node_list_gpu_node.csv",
        TRACES / f"openb_pod_list_{trace}.csv",
        arrivals=BENCH_DATA / f"fgd-openb-{trace}-arrivals.csv.gz",
        node_rank=BENCH_DATA / f"fgd-openb-{trace}-node-rank.csv.gz",
    )
    run = run_fgd_protocol(traces, policy, seed)
    key = (trace, PUBLISHED_NAMES.get(policy, ""), seed)
    published = load_published("analysis_allo_discrete.csv").get(key)
    published130 = (published or {}).get("130") or ""
    return Outcome(
        policy=policy,
        trace=trace,
        seed=seed,
        col130=run.allocation_pct["130"],
        published130=float(published130) if published130 else None,
        allocation_equal=equal_columns(run.allocation_pct, published),
        fragmentation_equal=equal_columns(
            run.fragmentation_pct, load_published("analysis_frag_discrete.csv").get(key)
        ),
        failed=run.failed,
        wall_seconds=run.wall_seconds,
    )


def speed(console: Console, seed: int) -> int:
    """Seed ``seed`` of every policy on the default list, one after the other."""
    results = {}
    for policy in POLICIES:
        started = time.perf_counter()
        result = run_one(policy, "default", seed)
        results[policy] = (result, time.perf_counter() - started)
    baseline = results[BASELINE][1]
    table = Table(title=f"FGD protocol, default list, seed {seed} (target < {TARGET_SECONDS:.0f} s per run)")
    for column in ("policy", "wall s", f"x {BASELINE}", "col 130", "published", "alloc cols equal", "failed"):
        table.add_column(
            column, justify="left" if column == "policy" else "right", no_wrap=column == "policy"
        )
    for policy, (result, wall) in results.items():
        table.add_row(
            policy,
            f"{wall:.2f}",
            f"{wall / baseline:.2f}",
            f"{result.col130:.2f}" if result.col130 is not None else "-",
            f"{result.published130:.2f}" if result.published130 is not None else "-",
            "-" if result.allocation_equal is None else f"{result.allocation_equal}/131",
            str(result.failed),
        )
    console.print(table)
    slow = [p for p, (_, wall) in results.items() if wall >= TARGET_SECONDS]
    console.print("all runs under target" if not slow else f"[red]over target: {', '.join(slow)}[/red]")
    return 0


def sweep(
    console: Console,
    *,
    policies: Sequence[str],
    traces: Sequence[str],
    seeds: Sequence[int],
    jobs: int,
    out: Path,
) -> int:
    tasks = [(p, t, s) for p in policies for t in traces for s in seeds]
    outcomes: list[Outcome] = []
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_one, *task) for task in tasks]
        for done, future in enumerate(futures, 1):
            outcomes.append(future.result())
            if done % 10 == 0 or done == len(tasks):
                console.print(
                    f"{done}/{len(tasks)} runs, {time.perf_counter() - started:.0f} s", highlight=False
                )
    out.mkdir(parents=True, exist_ok=True)
    with (out / "fgd-sweep.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "list",
                "policy",
                "seed",
                "col130",
                "published130",
                "alloc_cols_equal",
                "frag_cols_equal",
                "failed",
                "wall_s",
            ]
        )
        for o in outcomes:
            writer.writerow(
                [
                    o.trace,
                    o.policy,
                    o.seed,
                    o.col130,
                    o.published130,
                    o.allocation_equal,
                    o.fragmentation_equal,
                    o.failed,
                    o.wall_seconds,
                ]
            )
    summary = summarize(outcomes, load_published("analysis_allo_discrete.csv"), seeds)
    (out / "fgd-sweep.json").write_text(json.dumps(summary, indent=1) + "\n")
    print_summary(console, summary, policies)
    console.print(f"wrote {out / 'fgd-sweep.csv'} and {out / 'fgd-sweep.json'}")
    return 0


def published_mean(allo: Published, trace: str, folder: str, seeds: Sequence[int]) -> float | None:
    values = [float(allo[(trace, folder, s)]["130"]) for s in seeds if (trace, folder, s) in allo]
    return sum(values) / len(values) if len(values) == len(seeds) else None


def summarize(outcomes: Sequence[Outcome], allo: Published, seeds: Sequence[int]) -> dict[str, object]:
    by_key: dict[tuple[str, str], list[Outcome]] = defaultdict(list)
    for o in outcomes:
        by_key[(o.trace, o.policy)].append(o)
    rows = []
    for (trace, policy), runs in sorted(by_key.items()):
        values = [o.col130 for o in runs if o.col130 is not None]
        equal = [o.allocation_equal for o in runs if o.allocation_equal is not None]
        rows.append(
            {
                "list": trace,
                "policy": policy,
                "seeds": len(runs),
                "meanCol130": sum(values) / len(values) if values else None,
                "publishedMeanCol130": published_mean(allo, trace, PUBLISHED_NAMES.get(policy, ""), seeds),
                "publishedFgdMeanCol130": published_mean(allo, trace, PUBLISHED_NAMES["fgd"], seeds),
                "runsWithAll131AllocColumnsEqual": sum(1 for e in equal if e == len(COLUMNS))
                if equal
                else None,
                "meanWallSeconds": round(sum(o.wall_seconds for o in runs) / len(runs), 3),
            }
        )
    return {"seeds": list(seeds), "rows": rows}


def print_summary(console: Console, summary: dict[str, object], policies: Sequence[str]) -> None:
    rows = summary["rows"]
    assert isinstance(rows, list)
    table = Table(
        title="mean allocation at 130 % arrived demand (ours / published), runs with 131/131 columns"
    )
    table.add_column("list")
    for policy in policies:
        table.add_column(policy, justify="right")
    table.add_column("gpuplane - FGD", justify="right")
    by_list: dict[str, dict[str, dict[str, object]]] = defaultdict(dict)
    for row in rows:
        by_list[row["list"]][row["policy"]] = row
    for trace, cells in by_list.items():
        line = []
        for policy in policies:
            row = cells.get(policy)
            if row is None:
                line.append("")
                continue
            text = f"{row['meanCol130']:.2f}"
            if row["publishedMeanCol130"] is not None:
                exact = f"{row['runsWithAll131AllocColumnsEqual']}/{row['seeds']}"
                text += f" / {row['publishedMeanCol130']:.2f} ({exact})"
            line.append(text)
        ours, fgd = cells.get("gpuplane"), next(iter(cells.values()))["publishedFgdMeanCol130"]
        margin = "" if ours is None or fgd is None else f"{ours['meanCol130'] - fgd:+.2f}"
        table.add_row(trace, *line, margin)
    console.print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fgd_placement.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sweep", action="store_true", help="run policies x lists x seeds, write CSV and JSON"
    )
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma-separated policy names")
    parser.add_argument("--lists", default=",".join(LISTS), help="comma-separated openb pod lists")
    parser.add_argument("--seeds", default="42-51", help="seed range A-B or comma-separated seeds")
    parser.add_argument("--seed", type=int, default=42, help="the seed of the speed run (without --sweep)")
    parser.add_argument("--jobs", type=int, default=2, help="worker processes for --sweep")
    parser.add_argument(
        "--out", type=Path, default=REPO / "reports" / "fgd-placement", help="folder for the sweep's files"
    )
    args = parser.parse_args(argv)
    console = Console()
    if not TRACES.is_dir():
        console.print(f"[red]trace folder not found: {TRACES}[/red]")
        return 1
    if not args.sweep:
        return speed(console, args.seed)
    if "-" in args.seeds:
        low, high = (int(x) for x in args.seeds.split("-"))
        seeds = list(range(low, high + 1))
    else:
        seeds = [int(x) for x in args.seeds.split(",")]
    policies = [p for p in args.policies.split(",") if p]
    traces = [t for t in args.lists.split(",") if t]
    return sweep(console, policies=policies, traces=traces, seeds=seeds, jobs=args.jobs, out=args.out)


if __name__ == "__main__":
    sys.exit(main())
