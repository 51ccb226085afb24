"""Chargeback: GPU-hours allocated, busy and idle per group, and what they cost.

Pure: the numbers come in (from Prometheus's recording rules, or from a simulation summary), a
:class:`Chargeback` comes out, and renderers turn it into a table's rows, CSV, JSON or HTML.

Invariants the report keeps and states:

* per group, ``allocated = busy + idle`` (idle is defined as the difference; busy is capped at
  allocated, since a group cannot be busier than what it holds);
* the sum of the groups equals the cluster's total allocated GPU-hours, which the source
  reports separately (:attr:`Chargeback.reconciles`).

Prices are per allocated GPU-hour (what holding a GPU costs, busy or not), with an optional price
per group; busy and idle cost split the allocated cost in proportion.
"""

from __future__ import annotations

import csv
import html
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

TOLERANCE = 1e-6  # GPU-hours: sums of floats from Prometheus agree to this


class PricesError(ValueError):
    """A prices file that cannot be read (the message says what is wrong)."""


@dataclass(frozen=True, slots=True)
class Prices:
    """``gpu_hour`` for every group unless ``by_group`` names it."""

    gpu_hour: float = 0.0
    currency: str = ""
    by_group: Mapping[str, float] = field(default_factory=dict)

    def for_group(self, group: str) -> float:
        return self.by_group.get(group, self.gpu_hour)


def load_prices(text: str) -> Prices:
    """Read a prices file: ``{gpuHour: 2.5, currency: USD, groups: {team-a: 3.0}}`` (YAML or JSON)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PricesError(f"not YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise PricesError("expected a mapping with gpuHour (and optionally currency, groups)")
    unknown = sorted(set(doc) - {"gpuHour", "currency", "groups"})
    if unknown:
        raise PricesError(f"unknown field(s) {', '.join(unknown)}; expected gpuHour, currency, groups")

    def price(value: object, where: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise PricesError(f"{where}: expected a non-negative number, got {value!r}")
        return float(value)

    groups = doc.get("groups") or {}
    if not isinstance(groups, dict):
        raise PricesError("groups: expected a mapping of group name to price per GPU-hour")
    currency = doc.get("currency", "")
    if not isinstance(currency, str):
        raise PricesError("currency: expected a string")
    return Prices(
        gpu_hour=price(doc.get("gpuHour", 0.0), "gpuHour"),
        currency=currency,
        by_group={str(k): price(v, f"groups.{k}") for k, v in groups.items()},
    )


@dataclass(frozen=True, slots=True)
class ChargebackRow:
    group: str
    allocated_gpu_hours: float
    busy_gpu_hours: float
    idle_gpu_hours: float
    price_per_gpu_hour: float
    allocated_cost: float
    busy_cost: float
    idle_cost: float

    def to_json(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "allocatedGpuHours": round(self.allocated_gpu_hours, 6),
            "busyGpuHours": round(self.busy_gpu_hours, 6),
            "idleGpuHours": round(self.idle_gpu_hours, 6),
            "busyShare": round(self.busy_gpu_hours / self.allocated_gpu_hours, 6)
            if self.allocated_gpu_hours
            else None,
            "pricePerGpuHour": self.price_per_gpu_hour,
            "allocatedCost": round(self.allocated_cost, 6),
            "busyCost": round(self.busy_cost, 6),
            "idleCost": round(self.idle_cost, 6),
        }


def _row(group: str, allocated: float, busy: float, price: float) -> ChargebackRow:
    allocated = max(0.0, allocated)
    busy = min(max(0.0, busy), allocated)
    idle = allocated - busy
    cost = allocated * price
    return ChargebackRow(group, allocated, busy, idle, price, cost, busy * price, idle * price)


@dataclass(frozen=True, slots=True)
class Chargeback:
    """One report: rows per group (most allocated first), their total, and the cluster's own total."""

    group_by: str
    window: str
    currency: str
    rows: tuple[ChargebackRow, ...]
    total: ChargebackRow
    cluster_allocated_gpu_hours: float
    tolerance: float = TOLERANCE  # GPU-hours the group sum may differ from the cluster total

    @property
    def reconciles(self) -> bool:
        """Sum over groups equals the cluster total, and allocated = busy + idle in every row."""
        rows_ok = all(
            abs(r.allocated_gpu_hours - r.busy_gpu_hours - r.idle_gpu_hours) <= TOLERANCE for r in self.rows
        )
        return rows_ok and abs(
            self.total.allocated_gpu_hours - self.cluster_allocated_gpu_hours
        ) <= TOLERANCE * max(1.0, self.cluster_allocated_gpu_hours)

    def to_json(self) -> dict[str, Any]:
        return {
            "groupBy": self.group_by,
            "window": self.window,
            "currency": self.currency,
            "groups": [r.to_json() for r in self.rows],
            "total": self.total.to_json(),
            "clusterAllocatedGpuHours": round(self.cluster_allocated_gpu_hours, 6),
            "reconciles": self.reconciles,
        }


def build(  # noqa: PLR0913  two tallies, then keyword-only report options
    allocated: Mapping[str, float],
    busy: Mapping[str, float],
    *,
    cluster_allocated: float,
    prices: Prices | None = None,
    group_by: str = "team",
    window: str = "",
    tolerance: float = TOLERANCE,
) -> Chargeback:
    """A report from GPU-hours per group. A group busy but never allocated is kept (with 0 allocated)."""
    prices = prices or Prices()
    groups = sorted(set(allocated) | set(busy), key=lambda g: (-allocated.get(g, 0.0), g))
    rows = tuple(_row(g, allocated.get(g, 0.0), busy.get(g, 0.0), prices.for_group(g)) for g in groups)
    total = ChargebackRow(
        "total",
        sum(r.allocated_gpu_hours for r in rows),
        sum(r.busy_gpu_hours for r in rows),
        sum(r.idle_gpu_hours for r in rows),
        prices.gpu_hour,
        sum(r.allocated_cost for r in rows),
        sum(r.busy_cost for r in rows),
        sum(r.idle_cost for r in rows),
    )
    return Chargeback(group_by, window, prices.currency, rows, total, cluster_allocated, tolerance)


def from_simulation(summary: Mapping[str, Any], prices: Prices | None = None) -> dict[str, Chargeback]:
    """One report per configuration of a simulation summary (``gpuplane simulate --output json``).

    Reads each configuration's ``teams.<team>.allocatedGpuHours``/``busyGpuHours`` and its own
    ``allocatedGpuHours`` as the cluster total. The summary rounds every number to 0.01 GPU-h, so
    the sum over teams may differ from the total by up to 0.005 GPU-h per team.
    """
    configurations = summary.get("configurations")
    if not isinstance(configurations, Mapping):
        configurations = {"simulation": summary}
    out: dict[str, Chargeback] = {}
    for name, doc in configurations.items():
        if not isinstance(doc, Mapping) or not isinstance(doc.get("teams"), Mapping):
            continue
        teams: Mapping[str, Any] = doc["teams"]
        out[str(name)] = build(
            {t: float(v.get("allocatedGpuHours") or 0.0) for t, v in teams.items()},
            {t: float(v.get("busyGpuHours") or 0.0) for t, v in teams.items()},
            cluster_allocated=float(doc.get("allocatedGpuHours") or 0.0),
            prices=prices,
            group_by="team",
            window="simulation",
            tolerance=0.005 * (len(teams) + 1) / max(1.0, float(doc.get("allocatedGpuHours") or 0.0)),
        )
    return out


# ---------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------

COLUMNS = (
    "group",
    "allocated GPU-h",
    "busy GPU-h",
    "idle GPU-h",
    "busy %",
    "price/GPU-h",
    "allocated cost",
    "idle cost",
)


def table_rows(report: Chargeback) -> list[list[str]]:
    """Rows (groups, then the total) as strings for a table, in :data:`COLUMNS` order."""
    out = []
    for r in (*report.rows, report.total):
        share = f"{100 * r.busy_gpu_hours / r.allocated_gpu_hours:.1f}" if r.allocated_gpu_hours else "-"
        out.append(
            [
                r.group,
                f"{r.allocated_gpu_hours:.2f}",
                f"{r.busy_gpu_hours:.2f}",
                f"{r.idle_gpu_hours:.2f}",
                share,
                f"{r.price_per_gpu_hour:g}",
                f"{r.allocated_cost:.2f}",
                f"{r.idle_cost:.2f}",
            ]
        )
    return out


def to_csv(report: Chargeback) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    fields = list(report.total.to_json())
    writer.writerow(fields)
    for r in (*report.rows, report.total):
        doc = r.to_json()
        writer.writerow(["" if doc[k] is None else doc[k] for k in fields])
    return buffer.getvalue()


def to_html(reports: Mapping[str, Chargeback] | Sequence[Chargeback], title: str = "GPU chargeback") -> str:
    items = list(reports.items()) if isinstance(reports, Mapping) else [(r.window, r) for r in reports]
    sections = []
    for name, report in items:
        head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>"
            for row in table_rows(report)
        )
        note = "reconciles" if report.reconciles else "DOES NOT reconcile"
        sections.append(
            f"<h2>{html.escape(name)}</h2><p>by {html.escape(report.group_by)}; cluster total "
            f"{report.cluster_allocated_gpu_hours:.2f} GPU-h allocated ({note})"
            f"{'; prices in ' + html.escape(report.currency) if report.currency else ''}</p>"
            f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
        )
    return (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        "<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}td:first-child{text-align:left}</style>"
        f"</head><body><h1>{html.escape(title)}</h1>{''.join(sections)}</body></html>\n"
    )


def to_json_text(report: Chargeback) -> str:
    return json.dumps(report.to_json(), indent=1) + "\n"
