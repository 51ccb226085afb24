"""`gpuplane simulate-capacity`: autoscaling and spot in the simulator, three configurations.

Thin edge: options to a :class:`~gpuplane.sim.capacity.CapacityScenario`, one run per
configuration (:func:`gpuplane.sim.capacity.compare`), a table or JSON. Bad input is one line on
stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, fields
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpuplane.sim.capacity import CONFIGURATIONS, CapacityResult, CapacityScenario, compare

_COLUMNS = (
    ("GPU-h paid", "gpu_hours_paid"),
    ("spot GPU-h", "spot_gpu_hours"),
    ("on-demand GPU-h", "on_demand_gpu_hours"),
    ("wait p95 (min)", "wait_p95_minutes"),
    ("wait mean (min)", "wait_mean_minutes"),
    ("partial-gang GPU-h", "partial_gang_gpu_hours"),
    ("interruptions", "interruptions"),
    ("lost work (h)", "lost_work_hours"),
    ("finished", "finished"),
)


def print_table(scenario: CapacityScenario, results: list[CapacityResult], console: Console) -> None:
    table = Table(
        title=(
            f"Autoscaling and spot: {scenario.hours:g} h, "
            f"NodePool limit {scenario.nodepool_limit_nodes} nodes, "
            f"cold start {scenario.cold_start:g} s, {scenario.spot_interruptions_per_node_hour:g} "
            f"interruptions per spot node-hour, seed {scenario.seed}"
        ),
        title_justify="left",
    )
    table.add_column("configuration")
    for title, _ in _COLUMNS:
        table.add_column(title, justify="right")
    for r in results:
        table.add_row(r.configuration, *(str(getattr(r, attr)) for _, attr in _COLUMNS))
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add the ``simulate-capacity`` command to ``app``."""

    @app.command("simulate-capacity")
    def simulate_capacity_command(
        *,
        hours: Annotated[float, typer.Option(help="Virtual hours simulated.")] = 72.0,
        seed: Annotated[int, typer.Option(help="Seed of arrivals, sizes, durations and interruptions.")] = 7,
        nodepool_limit: Annotated[int, typer.Option(help="NodePool limit, in nodes.")] = 24,
        node_ready: Annotated[float, typer.Option(help="Seconds from launch to a Ready GPU node.")] = 270.0,
        image_pull: Annotated[
            float, typer.Option(help="Seconds to pull the job image on a new node.")
        ] = 100.0,
        spot_rate: Annotated[float, typer.Option(help="Spot interruptions per spot node-hour.")] = 0.03,
        warm_nodes: Annotated[int, typer.Option(help="Warm buffer of the gpuplane configuration.")] = 2,
        output: Annotated[str, typer.Option("--output", "-o", help="json or table.")] = "table",
    ) -> None:
        """Nodes that come and go: stock (per-pod autoscaling) against gpuplane (whole-gang
        provisioning, warm buffer, checkpoint grace on spot) and gpuplane without the buffer."""
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        problems = [
            f"--{name.replace('_', '-')} must be positive"
            for name, value in (("hours", hours), ("nodepool_limit", nodepool_limit))
            if value <= 0
        ]
        problems += [
            f"--{name.replace('_', '-')} must not be negative"
            for name, value in (
                ("node_ready", node_ready),
                ("image_pull", image_pull),
                ("spot_rate", spot_rate),
                ("warm_nodes", warm_nodes),
            )
            if value < 0
        ]
        if output not in ("json", "table"):
            problems.append(f"--output must be json or table, not {output!r}")
        if problems:
            err.print(f"gpuplane simulate-capacity: {problems[0]}")
            raise typer.Exit(2)
        scenario = CapacityScenario(
            hours=hours,
            seed=seed,
            nodepool_limit_nodes=nodepool_limit,
            node_ready_seconds=node_ready,
            image_pull_seconds=image_pull,
            spot_interruptions_per_node_hour=spot_rate,
            warm_nodes=warm_nodes,
        )
        results = compare(scenario, CONFIGURATIONS)
        if output == "json":
            doc = {
                "scenario": {f.name: getattr(scenario, f.name) for f in fields(scenario)},
                "results": [asdict(r) for r in results],
            }
            sys.stdout.write(json.dumps(doc, indent=2) + "\n")
            return
        print_table(scenario, results, Console())
