"""`gpuplane schedule`: decide on cluster state files and print the plan.

Thin edge: read files, build the configuration, drain a ``core.session.Session``, print. Bad
input is one line on stderr and exit status 2; nothing else ever prints a traceback.
"""

from __future__ import annotations

import json
import sys
import time
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpuplane.core.session import Plan, Session, config_from_kueue
from gpuplane.model.errors import InputError
from gpuplane.model.fields import timestamp
from gpuplane.model.loader import load_files, state_from_objects
from gpuplane.model.objects import ClusterState


class OutputFormat(StrEnum):
    json = "json"
    table = "table"


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def default_now(state: ClusterState) -> float:
    """The latest timestamp in the input, so that output depends on the input only."""
    latest = 0.0
    for wl in state.workloads:
        latest = max(latest, wl.creation, *(c.last_transition for c in wl.conditions))
    return latest


def plan_document(plan: Plan, parse_seconds: float, schedule_seconds: float) -> dict[str, Any]:
    """The JSON document of DESIGN.md for a plan."""
    admitted = []
    for a in plan.admitted:
        pod_sets = []
        for ps in a.pod_sets:
            item: dict[str, Any] = {"name": ps.name, "count": ps.count, "flavors": dict(ps.flavors)}
            if ps.placement is not None:
                item["placement"] = [p.to_json() for p in ps.placement]
            pod_sets.append(item)
        entry: dict[str, Any] = {"workload": a.workload, "clusterQueue": a.cluster_queue, "podSets": pod_sets}
        if a.checks:
            entry["admissionChecks"] = [{"name": name, "state": "Pending"} for name in a.checks]
        admitted.append(entry)
    document: dict[str, Any] = {
        "admitted": admitted,
        "preempted": [
            {
                "workload": p.workload,
                "clusterQueue": p.cluster_queue,
                "preemptor": p.preemptor,
                "reason": p.reason,
            }
            for p in plan.preempted
        ],
        "pending": [
            {
                "workload": p.workload,
                "clusterQueue": p.cluster_queue,
                "localQueue": p.local_queue,
                "position": p.position,
                "localQueuePosition": p.local_position,
                "reason": p.reason,
                "message": p.message,
            }
            for p in plan.pending
        ],
        "stats": {
            "cycles": plan.cycles,
            "parseSeconds": round(parse_seconds, 4),
            "scheduleSeconds": round(schedule_seconds, 4),
        },
    }
    document.update(check_documents(plan))
    return document


def check_documents(plan: Plan) -> dict[str, Any]:
    """Admission-check parts of the decision document, present only when there are any:
    ``reserved`` (quota held while checks are pending) and ``checkEvictions`` (reservations a
    Retry or Rejected check ended)."""
    out: dict[str, Any] = {}
    if plan.reserved:
        out["reserved"] = [
            {
                "workload": r.workload,
                "clusterQueue": r.cluster_queue,
                "admissionChecks": [{"name": n, "state": str(st)} for n, st in r.checks.items()],
                "placeable": r.placeable,
                "message": r.message,
            }
            for r in plan.reserved
        ]
    if plan.check_evictions:
        out["checkEvictions"] = [
            {
                "workload": e.workload,
                "clusterQueue": e.cluster_queue,
                "check": e.check,
                "state": str(e.state),
                "message": e.message,
            }
            for e in plan.check_evictions
        ]
    return out


def print_table(plan: Plan, console: Console) -> None:
    console.print(_admitted_table(plan))
    preempted = Table(title=f"Preempted ({len(plan.preempted)})", title_justify="left")
    for col in ("workload", "cluster queue", "preemptor", "reason"):
        preempted.add_column(col)
    for victim in plan.preempted:
        preempted.add_row(victim.workload, victim.cluster_queue, victim.preemptor, victim.reason)
    console.print(preempted)
    pending = Table(title=f"Pending ({len(plan.pending)})", title_justify="left")
    for col in ("workload", "cluster queue", "position", "reason", "message"):
        pending.add_column(col, overflow="fold")
    for p in plan.pending:
        pending.add_row(
            p.workload,
            p.cluster_queue or "-",
            "-" if p.position is None else str(p.position),
            p.reason,
            p.message,
        )
    console.print(pending)
    if plan.reserved:
        reserved = Table(title=f"Waiting for admission checks ({len(plan.reserved)})", title_justify="left")
        for col in ("workload", "cluster queue", "checks", "message"):
            reserved.add_column(col, overflow="fold")
        for r in plan.reserved:
            checks = ", ".join(f"{n}={st}" for n, st in r.checks.items())
            reserved.add_row(r.workload, r.cluster_queue, checks, r.message)
        console.print(reserved)
    console.print(f"cycles: {plan.cycles}")


def _admitted_table(plan: Plan) -> Table:
    """The admissions, with the nodes of each (when placed) and the checks still pending."""
    admitted = Table(title=f"Admitted ({len(plan.admitted)})", title_justify="left")
    placed = any(ps.placement is not None for a in plan.admitted for ps in a.pod_sets)
    checked = any(a.checks for a in plan.admitted)
    columns = ("workload", "cluster queue", "pod sets", "flavors", *(("nodes",) if placed else ()))
    for col in (*columns, *(("pending checks",) if checked else ())):
        admitted.add_column(col)
    for a in plan.admitted:
        sets = ", ".join(f"{ps.name} x{ps.count}" for ps in a.pod_sets)
        flavors = "; ".join(", ".join(f"{r}={f}" for r, f in ps.flavors.items()) for ps in a.pod_sets)
        row = [a.workload, a.cluster_queue, sets, flavors]
        if placed:
            per_node: dict[str, int] = {}
            for ps in a.pod_sets:
                for where in ps.placement or ():
                    per_node[where.node] = per_node.get(where.node, 0) + 1
            row.append(", ".join(f"{n} x{c}" for n, c in sorted(per_node.items())))
        if checked:
            row.append(", ".join(a.checks) or "-")
        admitted.add_row(*row)
    return admitted


def live_state(kubeconfig: str, context: str | None, warnings: list[str]) -> ClusterState:
    """The cluster's state read from its API server (GET requests only: nothing is written).

    Raises :class:`InputError` when the cluster cannot be reached; an object the loader refuses is
    left out with a warning, as the controller leaves it out.
    """
    from gpuplane.k8s.clusterstate import read_live  # noqa: PLC0415 - imports the client lazily

    left_out: list[InputError] = []
    try:
        objects = read_live(kubeconfig, context, left_out)
    except Exception as err:  # unreadable kubeconfig, unreachable server, refused request
        raise InputError(f"cannot read the cluster: {type(err).__name__}: {err}", source=kubeconfig) from None
    warnings += [f"ignoring invalid object: {problem}" for problem in left_out]
    return state_from_objects(objects, source=kubeconfig)


def run_schedule(
    files: list[str],
    cycles: int | None,
    output: OutputFormat,
    strict: bool,
    now: str | None,
    kubeconfig: str | None = None,
    context: str | None = None,
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        started = time.perf_counter()
        warnings: list[str] = []
        if kubeconfig is not None:
            state = live_state(kubeconfig, context, warnings)
            default = time.time()  # a live cluster is decided on now
        else:
            state = load_files(files, read=_read, strict=strict, warnings=warnings)
            default = default_now(state)
        parse_seconds = time.perf_counter() - started
        at = default if now is None else timestamp(now, "--now")
    except InputError as problem:
        err.print(f"error: {problem}", markup=False)
        return 2
    for warning in warnings:
        err.print(f"warning: {warning}", markup=False)
    config = config_from_kueue(state.configuration)
    started = time.perf_counter()
    try:
        # One session, drained once: to a fixed point, or exactly ``cycles`` cycles.
        session = Session(state, config, at, track_reasons=False)
        plan = session.drain(at, max_cycles=cycles, until_quiet=cycles is None)
    except InputError as problem:  # found while building node inventories (e.g. a MIG layout)
        origin = state.locate(problem.obj)
        if origin is not None:
            problem = problem.located(source=origin[0], document=origin[1])
        err.print(f"error: {problem}", markup=False)
        return 2
    schedule_seconds = time.perf_counter() - started
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(plan_document(plan, parse_seconds, schedule_seconds), indent=1) + "\n")
    else:
        print_table(plan, Console(highlight=False))
    return 0


def register(app: typer.Typer) -> None:
    """Add the ``schedule`` command to ``app``."""

    @app.command("schedule")
    def schedule_command(
        file: Annotated[
            list[str] | None,
            typer.Option(
                "--file",
                "-f",
                help="Cluster state: YAML (multi-document or kind: List) or JSON; - for stdin.",
            ),
        ] = None,
        kubeconfig: Annotated[
            str | None,
            typer.Option(help="Read the state from this cluster instead (read only: nothing is written)."),
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context (with --kubeconfig).")] = None,
        cycles: Annotated[
            int | None,
            typer.Option(
                min=1, help="Run exactly this many cycles with Kueue's semantics (default: to a fixed point)."
            ),
        ] = None,
        output: Annotated[
            OutputFormat, typer.Option("--output", "-o", help="json or table.")
        ] = OutputFormat.table,
        strict: Annotated[
            bool,
            typer.Option(
                help="Also refuse what a real API server refuses (e.g. borrowingLimit without a cohort)."
            ),
        ] = False,
        now: Annotated[
            str | None,
            typer.Option(help="The current time (RFC 3339); default: the latest time in the input."),
        ] = None,
    ) -> None:
        """Decide admissions, preemptions and pending reasons for cluster state files, or for a live
        cluster (--kubeconfig) as a dry run."""
        if bool(file) == (kubeconfig is not None):
            typer.echo("error: give either -f/--file or --kubeconfig (one of them)", err=True)
            raise typer.Exit(2)
        if context is not None and kubeconfig is None:
            typer.echo("error: --context needs --kubeconfig", err=True)
            raise typer.Exit(2)
        try:
            code = run_schedule(file or [], cycles, output, strict, now, kubeconfig, context)
        except Exception as bug:  # the one place a bug becomes a single line, never a traceback
            typer.echo(f"internal error: {type(bug).__name__}: {bug}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(code)
