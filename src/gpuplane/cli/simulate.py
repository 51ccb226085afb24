"""`gpuplane simulate`: replay a placement benchmark and print its summary.

Thin edge: parse options, call the driver in :mod:`gpuplane.sim`, print. Bad input is one line on
stderr and exit status 2; nothing else ever prints a traceback.

``--protocol fgd`` runs the FGD (ATC'23) placement protocol on an openb node list and pod list
(:func:`gpuplane.sim.fgd.run_fgd_protocol`). Without ``--protocol`` it runs the scenario simulator
(:mod:`gpuplane.cli.simulate_scenario`): one run, or a load sweep with ``--sweep``. ``--clusters N``
runs N clusters behind one MultiKueue manager under each dispatcher instead
(:mod:`gpuplane.cli.simulate_clusters`).
"""

from __future__ import annotations

import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from gpuplane.cli.simulate_clusters import FleetOptions, run_clusters
from gpuplane.cli.simulate_scenario import ScenarioOptions, run_scenario
from gpuplane.core.session import POLICIES
from gpuplane.sim.fgd import FgdRun, FgdTraces, ProgressCallback, run_fgd_protocol
from gpuplane.sim.traces import TraceError

DEFAULT_POLICY = "gpuplane"


class OutputFormat(StrEnum):
    json = "json"
    table = "table"


class Protocol(StrEnum):
    fgd = "fgd"


def print_summary(run: FgdRun, console: Console) -> None:
    """A short table: allocation at 50 / 100 / 130 % arrived demand, failures, wall time."""
    table = Table(title=f"FGD protocol: policy {run.policy}, seed {run.seed}", title_justify="left")
    table.add_column("measure")
    table.add_column("value", justify="right")

    def pct(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f} %"

    table.add_row("GPUs", str(run.gpus_total))
    for column in ("50", "100", "130"):
        table.add_row(f"allocation at {column} % arrived", pct(run.allocation_pct[column]))
    table.add_row("fragmentation at 130 % arrived", pct(run.fragmentation_pct["130"]))
    table.add_row("pods arrived", str(run.arrived))
    table.add_row("pods failed", str(run.failed))
    table.add_row("wall time", f"{run.wall_seconds:.2f} s")
    console.print(table)


def run_simulate(
    protocol: Protocol | None,
    *,
    nodes: Path | None,
    pods: Path | None,
    policy: str,
    seed: int,
    arrivals: Path | None,
    node_rank: Path | None,
    output: OutputFormat,
    scenario_options: ScenarioOptions | None = None,
    fleet: FleetOptions | None = None,
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if fleet is not None:
        return run_clusters(fleet, seed=seed, output=output.value)
    if protocol is None:
        return run_scenario(scenario_options or ScenarioOptions(), seed=seed, output=output.value)
    if nodes is None or pods is None:
        err.print("error: --protocol fgd needs --nodes and --pods", markup=False)
        return 2
    show_progress = output is OutputFormat.table and sys.stdout.isatty()
    try:
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=err,
            disable=not show_progress,
            transient=True,
        ) as bar:
            task = bar.add_task(f"{policy} seed {seed}", total=None)

            def advance(done: int, total: int) -> None:
                bar.update(task, completed=done, total=total)

            callback: ProgressCallback | None = advance if show_progress else None
            run = run_fgd_protocol(
                FgdTraces(nodes, pods, arrivals, node_rank), policy, seed, progress=callback
            )
    except TraceError as problem:
        err.print(f"error: {problem}", markup=False)
        return 2
    except KeyError as problem:
        err.print(f"error: {problem.args[0]}", markup=False)
        return 2
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(run.document()) + "\n")
    else:
        print_summary(run, Console(highlight=False))
    return 0


def register(app: typer.Typer) -> None:
    """Add the ``simulate`` command to ``app``."""

    @app.command("simulate")
    def simulate_command(
        *,
        protocol: Annotated[
            Protocol | None,
            typer.Option(help="Run a published benchmark protocol instead of the built-in scenario."),
        ] = None,
        nodes: Annotated[
            Path | None, typer.Option(help="Node list CSV (sn,cpu_milli,memory_mib,gpu,model).")
        ] = None,
        pods: Annotated[
            Path | None,
            typer.Option(help="Pod list CSV (name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec])."),
        ] = None,
        policy: Annotated[
            str, typer.Option(help=f"Placement policy: {', '.join(POLICIES)}.")
        ] = DEFAULT_POLICY,
        seed: Annotated[int, typer.Option(help="Seed of the arrival order, node ranks and randomness.")] = 42,
        arrivals: Annotated[
            Path | None,
            typer.Option(help="Arrival order file (seed,position,source_pod; .csv or .csv.gz)."),
        ] = None,
        node_rank: Annotated[
            Path | None,
            typer.Option(help="Tie-break node names file (seed,node_sn,sim_node_name; .csv or .csv.gz)."),
        ] = None,
        output: Annotated[
            OutputFormat, typer.Option("--output", "-o", help="json or table.")
        ] = OutputFormat.table,
        scenario: Annotated[
            Path | None, typer.Option(help="Scenario file (YAML); default: the built-in scenario.")
        ] = None,
        trace: Annotated[
            Path | None, typer.Option(help="Replay a trace (CSV) instead of a scenario.")
        ] = None,
        trace_format: Annotated[
            str | None, typer.Option(help="Trace format: openb, helios, or a column mapping file (YAML).")
        ] = None,
        compare: Annotated[
            list[str] | None,
            typer.Option(help="More configurations to run beside stock and gpuplane (repeat, or a,b,c)."),
        ] = None,
        days: Annotated[float | None, typer.Option(help="Measured virtual days (scenario or trace).")] = None,
        report: Annotated[
            Path | None, typer.Option(help="Write an HTML report with plots into this folder.")
        ] = None,
        load: Annotated[
            float | None,
            typer.Option(help="Offered load (fraction of installed GPUs) instead of the scenario's own."),
        ] = None,
        sweep: Annotated[
            str | None,
            typer.Option(
                help="Run every configuration at each offered load, e.g. 0.6,0.8,1.0,1.2,1.4,1.6; or auto: "
                "extend until each misses the wait target, then bisect its capacity to 0.05."
            ),
        ] = None,
        wait_target: Annotated[
            str | None,
            typer.Option(help="p95 wait that capacity is measured at (--sweep): 1h (default), 30min, 7200."),
        ] = None,
        jobs: Annotated[
            int | None,
            typer.Option(help="Runs at once, one process each (configurations, sweep loads); default: CPUs."),
        ] = None,
        clusters: Annotated[
            int | None,
            typer.Option(help="N clusters behind one MultiKueue manager: compare its dispatchers."),
        ] = None,
        dispatchers: Annotated[
            str | None,
            typer.Option(help="With --clusters: AllAtOnce,Incremental,gpuplane (default: all three)."),
        ] = None,
    ) -> None:
        """Replay a placement benchmark (--protocol fgd) and print allocation and fragmentation."""
        fleet = None  # --clusters: the fleet simulator instead
        if clusters is not None or dispatchers is not None:
            given: dict[str, object] = {"--protocol": protocol, "--trace": trace, "--compare": compare}
            given |= {"--report": report, "--sweep": sweep, "--wait-target": wait_target}
            excluded = tuple(name for name, value in given.items() if value)
            fleet = FleetOptions(clusters, dispatchers, scenario, days, load, jobs, excluded)
        try:
            code = run_simulate(
                protocol,
                nodes=nodes,
                pods=pods,
                policy=policy,
                seed=seed,
                arrivals=arrivals,
                node_rank=node_rank,
                output=output,
                fleet=fleet,
                scenario_options=ScenarioOptions(
                    scenario,
                    trace,
                    trace_format,
                    tuple(compare or ()),
                    days,
                    report,
                    load,
                    sweep,
                    wait_target,
                    jobs,
                ),
            )
        except Exception as bug:  # the one place a bug becomes a single line, never a traceback
            typer.echo(f"internal error: {type(bug).__name__}: {bug}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(code)
