"""`gpuplane report chargeback`: GPU-hours allocated, busy and idle per group, and their cost.

Reads the recording rules' series (``deploy/prometheus/rules.yaml``) through Prometheus's HTTP
query API, or a simulation summary (``gpuplane simulate --output json``), and prints
:mod:`gpuplane.insight.chargeback`'s report as a table, CSV, JSON or HTML. GPU-hours are the
integral of the per-pod series over the window, sampled every ``--step`` (a subquery), so a pod
that ran for part of the window is charged for that part only.
"""

from __future__ import annotations

import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpuplane.insight.chargeback import (
    COLUMNS,
    Chargeback,
    Prices,
    PricesError,
    build,
    from_simulation,
    load_prices,
    table_rows,
    to_csv,
    to_html,
    to_json_text,
)
from gpuplane.model.errors import InputError
from gpuplane.model.fields import timestamp

ALLOCATED = "gpuplane:pod_gpus_allocated:sum"
BUSY = "gpuplane:pod_gpus_busy:sum"
_DURATION = re.compile(r"^(\d+)([smhdw])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_LABEL = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
GROUPS = {"namespace": "namespace", "queue": "cluster_queue", "localqueue": "local_queue"}
NO_GROUP = "(none)"


class ReportFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"
    html = "html"


class ReportError(Exception):
    """Bad input or an unreachable source: one line for stderr."""


def duration_seconds(text: str, what: str) -> int:
    match = _DURATION.match(text.strip())
    if match is None or int(match.group(1)) == 0:
        raise ReportError(f"{what}: expected a duration such as 90m, 24h or 7d, got {text!r}")
    return int(match.group(1)) * _SECONDS[match.group(2)]


def group_label(group_by: str) -> str:
    if group_by in GROUPS:
        return GROUPS[group_by]
    kind, _, label = group_by.partition(":")
    if kind != "label" or not _LABEL.match(label):
        raise ReportError(f"--group-by: expected namespace, queue or label:NAME, got {group_by!r}")
    return label


def _query(url: str, expr: str, at: float) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}"})
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{query}", timeout=60) as response:
            body = json.loads(response.read())
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:200]
        raise ReportError(f"Prometheus at {url} refused the query ({err.code}): {detail}") from None
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise ReportError(f"cannot query Prometheus at {url}: {err}") from None
    if body.get("status") != "success":
        raise ReportError(f"Prometheus at {url} answered {body.get('error', body)!r}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def gpu_hours(
    url: str, series: str, label: str | None, window: int, step: int, at: float
) -> dict[str, float]:
    """GPU-hours of ``series`` over ``window`` seconds before ``at``, per value of ``label``."""
    inner = f"sum by ({label}) ({series})" if label else f"sum({series})"
    # The window is (at - window, at]: one second short, so that Prometheus 2 (closed ranges) and 3
    # (left-open) take the same samples, one per step.
    expr = f"sum_over_time(({inner})[{window - 1}s:{step}s]) * {step} / 3600"
    out: dict[str, float] = {}
    for item in _query(url, expr, at):
        key = item["metric"].get(label, "") if label else "cluster"
        out[key or NO_GROUP] = out.get(key or NO_GROUP, 0.0) + float(item["value"][1])
    return out


def chargeback_from_prometheus(
    url: str, since: str, group_by: str, prices: Prices, step: str, at: float
) -> Chargeback:
    window = duration_seconds(since, "--since")
    step_seconds = duration_seconds(step, "--step")
    label = group_label(group_by)
    allocated = gpu_hours(url, ALLOCATED, label, window, step_seconds, at)
    busy = gpu_hours(url, BUSY, label, window, step_seconds, at)
    cluster = gpu_hours(url, ALLOCATED, None, window, step_seconds, at).get("cluster", 0.0)
    return build(allocated, busy, cluster_allocated=cluster, prices=prices, group_by=group_by, window=since)


def _print(reports: dict[str, Chargeback], output: ReportFormat) -> None:
    if output is ReportFormat.html:
        sys.stdout.write(to_html(reports))
        return
    if output is ReportFormat.json:
        if len(reports) == 1:
            sys.stdout.write(to_json_text(next(iter(reports.values()))))
        else:
            sys.stdout.write(json.dumps({k: r.to_json() for k, r in reports.items()}, indent=1) + "\n")
        return
    if output is ReportFormat.csv:
        for name, report in reports.items():
            if len(reports) > 1:
                sys.stdout.write(f"# {name}\n")
            sys.stdout.write(to_csv(report))
        return
    console = Console(highlight=False)
    for name, report in reports.items():
        currency = f", prices in {report.currency}" if report.currency else ""
        table = Table(title=f"Chargeback: {name}, by {report.group_by}{currency}", title_justify="left")
        for col in COLUMNS:
            table.add_column(col, justify="left" if col == "group" else "right")
        for row in table_rows(report):
            table.add_row(*row)
        console.print(table)
        verdict = "reconciles" if report.reconciles else "does NOT reconcile"
        console.print(
            f"cluster total {report.cluster_allocated_gpu_hours:.2f} GPU-h allocated; sum over groups "
            f"{report.total.allocated_gpu_hours:.2f}: {verdict}"
        )


def run_chargeback(
    prometheus: str | None,
    simulation: Path | None,
    since: str,
    prices_file: Path | None,
    group_by: str,
    output: ReportFormat,
    step: str,
    at: str | None,
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        if bool(prometheus) == bool(simulation):
            raise ReportError("give either --prometheus URL or --simulation SUMMARY.json")
        prices = load_prices(prices_file.read_text()) if prices_file is not None else Prices()
        if simulation is not None:
            try:
                summary = json.loads(simulation.read_text())
            except ValueError as problem:
                raise ReportError(f"{simulation}: not JSON: {problem}") from None
            if not isinstance(summary, dict):
                raise ReportError(f"{simulation}: expected the JSON of gpuplane simulate --output json")
            reports = from_simulation(summary, prices)
            if not reports:
                raise ReportError(f"{simulation}: no configuration with per-team numbers")
        else:
            assert prometheus is not None
            when = time.time() if at is None else timestamp(at, "--at")
            reports = {since: chargeback_from_prometheus(prometheus, since, group_by, prices, step, when)}
    except (ReportError, PricesError, InputError, OSError) as problem:
        where = f"{prices_file}: " if isinstance(problem, PricesError) else ""
        err.print(f"error: {where}{problem}", markup=False)
        return 2
    _print(reports, output)
    return 0


def register(app: typer.Typer) -> None:
    """Add ``report`` (with ``chargeback``) to ``app``."""
    report = typer.Typer(no_args_is_help=True, help="Reports over metrics and simulations.")
    app.add_typer(report, name="report")

    @report.command("chargeback")
    def chargeback_command(
        prometheus: Annotated[
            str | None, typer.Option(help="Prometheus base URL holding gpuplane's recording rules.")
        ] = None,
        simulation: Annotated[
            Path | None, typer.Option(help="A simulation summary (gpuplane simulate --output json) instead.")
        ] = None,
        since: Annotated[str, typer.Option(help="Window before --at: 90m, 24h, 7d, 2w.")] = "7d",
        prices: Annotated[
            Path | None, typer.Option(help="Prices per allocated GPU-hour: {gpuHour, currency, groups}.")
        ] = None,
        group_by: Annotated[
            str, typer.Option(help="namespace, queue, localqueue or label:NAME (e.g. label:team).")
        ] = "label:team",
        output: Annotated[
            ReportFormat, typer.Option("--output", "-o", help="table, csv, json or html.")
        ] = ReportFormat.table,
        step: Annotated[str, typer.Option(help="Sampling step of the integral.")] = "1m",
        at: Annotated[str | None, typer.Option(help="End of the window (RFC 3339); default: now.")] = None,
    ) -> None:
        """GPU-hours allocated, busy and idle per group, and their cost; totals reconcile."""
        try:
            code = run_chargeback(prometheus, simulation, since, prices, group_by, output, step, at)
        except Exception as bug:  # the one place a bug becomes a single line, never a traceback
            typer.echo(f"internal error: {type(bug).__name__}: {bug}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(code)
