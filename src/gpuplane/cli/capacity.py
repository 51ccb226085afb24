"""`gpuplane simulate-capacity`: autoscaling, spot and prices in the simulator.

Thin edge: options to a :class:`~gpuplane.sim.capacity_scenario.CapacityScenario`, one run per
configuration (:func:`gpuplane.sim.capacity_report.capacity_document`), a table or JSON. Bad input
is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpuplane.sim.capacity import ALL_CONFIGURATIONS, CONFIGURATIONS
from gpuplane.sim.capacity_report import capacity_document
from gpuplane.sim.capacity_scenario import CapacityScenario

_COLUMNS = (
    ("GPU-h paid", "gpu_hours_paid"),
    ("spot GPU-h", "spot_gpu_hours"),
    ("on-demand GPU-h", "on_demand_gpu_hours"),
    ("GPU-$", "gpu_dollars"),
    ("wait p95 (min)", "wait_p95_minutes"),
    ("wait mean (min)", "wait_mean_minutes"),
    ("partial-gang GPU-h", "partial_gang_gpu_hours"),
    ("buffer idle GPU-h", "buffer_gpu_hours"),
    ("interruptions", "interruptions"),
    ("lost work (h)", "lost_work_hours"),
    ("finished", "finished"),
)


def print_tables(scenario: CapacityScenario, document: dict[str, Any], console: Console) -> None:
    table = Table(
        title=(
            f"Autoscaling and spot: {scenario.hours:g} h, h100 NodePool limit "
            f"{scenario.nodepool_limit_nodes} nodes, cold start {scenario.cold_start:g} s, "
            f"{scenario.spot_interruptions_per_node_hour:g} interruptions per spot node-hour, "
            f"on-demand/spot price {scenario.price_ratio:g}, seed {scenario.seed}"
        ),
        title_justify="left",
    )
    table.add_column("configuration")
    for title, _ in _COLUMNS:
        table.add_column(title, justify="right")
    for r in document["results"]:
        table.add_row(r["configuration"], *(f"{r[attr]:,}" for _, attr in _COLUMNS))
    console.print(table)
    buffers = document["warmBuffer"]
    if buffers:
        cost = Table(title="What each buffer costs against the wait it saves", title_justify="left")
        for title in (
            "configuration",
            "against",
            "extra GPU-h",
            "extra GPU-$",
            "idle GPU-h",
            "p95 saved (min)",
        ):
            cost.add_column(title, justify="left" if title in ("configuration", "against") else "right")
        cost.add_column("mean saved (min)", justify="right")
        for name, row in buffers.items():
            cost.add_row(
                name,
                row["comparedWith"],
                f"{row['extraGpuHours']:,}",
                f"{row['extraDollars']:,}",
                f"{row['bufferIdleGpuHours']:,}",
                f"{row['waitP95SavedMinutes']:,}",
                f"{row['waitMeanSavedMinutes']:,}",
            )
        console.print(cost)
    line = f"Default (costs least at equal p95 wait): {document['defaultConfiguration']}"
    against = document.get("defaultAgainstStock")
    if against is not None:
        share = against["dollarsSavedShare"]
        line += f"; {against['dollarsSaved']:,} GPU-$ fewer than stock" + (
            f" ({100 * share:.1f} %)" if share is not None else ""
        )
        line += ", p95 wait no worse" if against["waitP95NoWorse"] else ", at a worse p95 wait"
    console.print(line + ".", markup=False)


def _configurations(compare: list[str] | None) -> tuple[str, ...]:
    names = list(CONFIGURATIONS)
    for item in compare or ():
        names += [n.strip() for n in item.split(",") if n.strip()]
    unknown = [n for n in names if n not in ALL_CONFIGURATIONS]
    if unknown:
        raise ValueError(
            f"--compare: unknown configuration {unknown[0]!r} (known: {', '.join(ALL_CONFIGURATIONS)})"
        )
    return tuple(dict.fromkeys(names))


def register(app: typer.Typer) -> None:
    """Add the ``simulate-capacity`` command to ``app``."""

    @app.command("simulate-capacity")
    def simulate_capacity_command(
        *,
        hours: Annotated[float, typer.Option(help="Virtual hours simulated.")] = 72.0,
        seed: Annotated[int, typer.Option(help="Seed of arrivals, sizes, durations and interruptions.")] = 7,
        nodepool_limit: Annotated[int, typer.Option(help="The h100 NodePool's limit, in nodes.")] = 12,
        node_ready: Annotated[float, typer.Option(help="Seconds from launch to a Ready GPU node.")] = 270.0,
        image_pull: Annotated[
            float, typer.Option(help="Seconds to pull the job image on a new node.")
        ] = 100.0,
        spot_rate: Annotated[float, typer.Option(help="Spot interruptions per spot node-hour.")] = 0.03,
        warm_nodes: Annotated[
            int, typer.Option(help="Static buffer of gpuplane-static-buffer, in h100 nodes.")
        ] = 2,
        price_ratio: Annotated[
            float, typer.Option(help="On-demand price / spot price (an assumption; default 3).")
        ] = 3.0,
        load: Annotated[float, typer.Option(help="Multiplies every class's arrival rate.")] = 1.0,
        compare: Annotated[
            list[str] | None,
            typer.Option(help="More configurations: stock-placeholders, gpuplane-static-buffer (a,b)."),
        ] = None,
        output: Annotated[str, typer.Option("--output", "-o", help="json or table.")] = "table",
    ) -> None:
        """Nodes that come and go, in pools of several sizes, for queues with quota: stock (per-pod
        autoscaling) against gpuplane (whole-gang provisioning, warm buffer sized from predicted
        arrivals, checkpoint grace on spot), with prices."""
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        problems = [
            f"--{name.replace('_', '-')} must be positive"
            for name, value in (
                ("hours", hours),
                ("nodepool_limit", nodepool_limit),
                ("price_ratio", price_ratio),
                ("load", load),
            )
            if not value > 0
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
        try:
            names = _configurations(compare)
        except ValueError as problem:
            problems.append(str(problem))
        if problems:
            err.print(f"gpuplane simulate-capacity: {problems[0]}", markup=False)
            raise typer.Exit(2)
        scenario = CapacityScenario(
            hours=hours,
            seed=seed,
            nodepool_limit_nodes=nodepool_limit,
            node_ready_seconds=node_ready,
            image_pull_seconds=image_pull,
            spot_interruptions_per_node_hour=spot_rate,
            warm_nodes=warm_nodes,
            price_ratio=price_ratio,
            load=load,
        )
        document = capacity_document(scenario, names)
        if output == "json":
            sys.stdout.write(json.dumps(document, indent=2) + "\n")
            return
        print_tables(scenario, document, Console(highlight=False, width=None if sys.stdout.isatty() else 220))
