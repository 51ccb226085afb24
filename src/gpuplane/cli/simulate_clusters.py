"""`gpuplane simulate --clusters N`: N clusters behind one MultiKueue manager, three dispatchers.

Thin edge: read the scenario, run :func:`gpuplane.sim.multicluster_run.run_fleet`, print the
one-sentence result first, then a table (or the JSON document with ``--output json``). Bad input
is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from gpuplane.sim.experiment import scenario_input
from gpuplane.sim.multicluster import MultiClusterSettings, split_cluster
from gpuplane.sim.multicluster_run import parse_dispatchers, run_fleet, table_rows
from gpuplane.sim.parallel import default_jobs
from gpuplane.sim.scenario import ScenarioError, builtin_scenario, load_scenario


@dataclass(frozen=True, slots=True)
class FleetOptions:
    """What ``gpuplane simulate --clusters`` reads: the fleet, the dispatchers, the scenario."""

    clusters: int | None
    dispatchers: str | None = None
    scenario: Path | None = None
    days: float | None = None
    load: float | None = None
    jobs: int | None = None
    excluded: tuple[str, ...] = ()  # options given that --clusters does not take


def run_clusters(options: FleetOptions, *, seed: int | None, output: str) -> int:
    """Run every dispatcher over the fleet and print the result; returns the exit status."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if options.excluded:
            raise ValueError(f"--clusters does not combine with {options.excluded[0]}")
        if options.clusters is None:
            raise ValueError("--dispatchers needs --clusters")
        dispatchers = parse_dispatchers(options.dispatchers)
        settings = MultiClusterSettings(options.clusters, dispatchers[0])
        if options.days is not None and not options.days > 0:
            raise ValueError(f"--days must be positive, got {options.days:g}")
        if options.load is not None and not options.load > 0:
            raise ValueError(f"--load must be positive, got {options.load:g}")
        if options.jobs is not None and options.jobs < 1:
            raise ValueError(f"--jobs must be at least 1, got {options.jobs}")
        if options.scenario is not None and not options.scenario.is_file():
            raise ValueError(f"--scenario: {options.scenario}: no such file")
        scenario = load_scenario(options.scenario) if options.scenario else builtin_scenario()
        if seed is not None:
            scenario = scenario.with_seed(seed)
        if options.days is not None:
            scenario = scenario.with_days(options.days)
        if options.load is not None:
            scenario = scenario.with_load(options.load)
        sim = scenario_input(scenario)
        split_cluster(sim.cluster, settings.clusters)  # a fleet the scenario's nodes can make
    except (ValueError, ScenarioError, OSError) as problem:
        err.print(f"error: {problem}", markup=False)
        return 2
    document = run_fleet(sim, settings, dispatchers, jobs=options.jobs or default_jobs())
    if output == "json":
        sys.stdout.write(json.dumps(document) + "\n")
        return 0
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)
    console.print(document["headline"], markup=False)
    console.print(fleet_table(document))
    return 0


def fleet_table(document: dict[str, Any]) -> Table:
    workers = ", ".join(f"{w['name']} {w['gpus']} GPUs" for w in document["workers"])
    title = (
        f"gpuplane simulate --clusters {document['clusters']}: {document['scenario']}, "
        f"{document['days']:g} days, {document['workloads']:,} workloads; {workers}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("measure")
    for name in document["dispatchers"]:
        table.add_column(name, justify="right")
    for label, cells in table_rows(document):
        table.add_row(label, *cells)
    return table
