"""The HTML report of a simulation: ``index.html``, its PNG plots and ``summary.json``, in one folder.

Plots: GPU allocation and busy share over time per configuration; queue-wait distributions;
allocated against busy GPU-hours per team; busy share per workload class. The page also lists
every scenario parameter with its source, so a reader can see which numbers are published
figures and which are assumptions. Figures are drawn with matplotlib's object API (no pyplot, no
global state), so writing a report never touches a display.
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from gpuplane.insight.chargeback import Chargeback, build, to_html
from gpuplane.sim.experiment import ExperimentResult
from gpuplane.sim.metrics import HOUR, Ledger, total
from gpuplane.sim.sweep import SweepResult, sweep_points

PLOTS = ("utilization.png", "waits.png", "teams.png", "classes.png")
SUMMARY = "summary.json"


def _utilization(ledgers: dict[str, Ledger], path: Path) -> None:
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    for i, (name, ledger) in enumerate(ledgers.items()):
        width = ledger.allocated_series.width
        gpus = max(ledger.gpus, 1)
        hours = np.arange(ledger.allocated_series.bins) * width / HOUR
        color = f"C{i}"
        ax.plot(
            hours,
            100 * ledger.allocated_series.values / (width * gpus),
            color=color,
            label=f"{name}: allocated",
        )
        ax.plot(
            hours,
            100 * ledger.busy_series.values / (width * gpus),
            color=color,
            ls="--",
            label=f"{name}: busy",
        )
    ax.set_xlabel("hours into the measured window")
    ax.set_ylabel("% of installed GPUs")
    ax.set_ylim(0, 100)
    ax.set_title("GPU allocation and busy (SM activity) over time")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _waits(ledgers: dict[str, Ledger], path: Path) -> None:
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    for i, (name, ledger) in enumerate(ledgers.items()):
        waits = np.sort(np.asarray(total(ledger.groups.values()).waits, dtype=float))
        if len(waits) == 0:
            continue
        share = np.arange(1, len(waits) + 1) / len(waits)
        ax.step(np.maximum(waits, 1.0), share, where="post", color=f"C{i}", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("queue wait (seconds, log scale; 0 shown at 1 s)")
    ax.set_ylabel("share of workloads")
    ax.set_title("Queue wait: cumulative distribution")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _bars(ledgers: dict[str, Ledger], path: Path, by_team: bool) -> None:
    index = 0 if by_team else 1
    groups = sorted({key[index] for ledger in ledgers.values() for key in ledger.groups})
    fig = Figure(figsize=(10, 4.5))
    ax = fig.subplots()
    width = 0.8 / max(len(ledgers), 1)
    x = np.arange(len(groups))
    for i, (name, ledger) in enumerate(ledgers.items()):
        stats = [total(s for k, s in ledger.groups.items() if k[index] == g) for g in groups]
        offset = x - 0.4 + width * (i + 0.5)
        if by_team:
            allocated = [s.allocated / HOUR for s in stats]
            busy = [s.busy / HOUR for s in stats]
            ax.bar(offset, allocated, width, color=f"C{i}", alpha=0.35, label=f"{name}: allocated")
            ax.bar(offset, busy, width, color=f"C{i}", label=f"{name}: busy")
        else:
            share = [100 * s.busy / s.allocated if s.allocated else 0.0 for s in stats]
            ax.bar(offset, share, width, color=f"C{i}", label=name)
    ax.set_xticks(x, groups, rotation=15)
    if by_team:
        ax.set_ylabel("GPU-hours")
        ax.set_title("Allocated and busy GPU-hours per team")
    else:
        ax.set_ylabel("busy / allocated (%)")
        ax.set_ylim(0, 100)
        ax.set_title("GPU busy share per workload class")
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}"
    return html.escape(str(value))


def _summary_html(document: dict[str, Any]) -> str:
    configs: dict[str, Any] = document["configurations"]
    keys = [k for k, v in next(iter(configs.values())).items() if not isinstance(v, dict)]
    head = "".join(f"<th>{html.escape(n)}</th>" for n in configs)
    rows = "".join(
        f"<tr><td>{html.escape(k)}</td>"
        + "".join(f"<td>{_cell(c.get(k))}</td>" for c in configs.values())
        + "</tr>"
        for k in keys
    )
    return f"<table><tr><th>measure</th>{head}</tr>{rows}</table>"


def _sources_html(sources: tuple[tuple[str, str, str], ...]) -> str:
    if not sources:
        return "<p>Replayed trace: the workloads come from the trace file.</p>"
    rows = "".join(
        f"<tr><td>{html.escape(path)}</td><td>{html.escape(value)}</td><td>{html.escape(source)}</td></tr>"
        for path, value, source in sources
    )
    return f"<table><tr><th>parameter</th><th>value</th><th>source</th></tr>{rows}</table>"


def chargeback(ledgers: dict[str, Ledger]) -> dict[str, Chargeback]:
    """Per configuration, GPU-hours allocated, busy and idle per team (``gpuplane report chargeback``)."""
    out = {}
    for name, ledger in ledgers.items():
        allocated: dict[str, float] = {}
        busy: dict[str, float] = {}
        for (team, _), stats in ledger.groups.items():
            allocated[team] = allocated.get(team, 0.0) + stats.allocated / HOUR
            busy[team] = busy.get(team, 0.0) + stats.busy / HOUR
        cluster = total(ledger.groups.values()).allocated / HOUR
        out[name] = build(allocated, busy, cluster_allocated=cluster, group_by="team", window="simulation")
    return out


def write_report(result: ExperimentResult, folder: Path) -> Path:
    """Write ``index.html`` and the PNG plots into ``folder`` (created if needed)."""
    folder.mkdir(parents=True, exist_ok=True)
    ledgers = result.ledgers
    _utilization(ledgers, folder / PLOTS[0])
    _waits(ledgers, folder / PLOTS[1])
    _bars(ledgers, folder / PLOTS[2], by_team=True)
    _bars(ledgers, folder / PLOTS[3], by_team=False)
    doc = result.document
    images = "".join(f'<p><img src="{name}" alt="{name}"></p>' for name in PLOTS)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpuplane simulate: {html.escape(doc["scenario"])}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
td + td {{ text-align: right; }}
</style></head><body>
<h1>gpuplane simulate: {html.escape(doc["scenario"])}</h1>
<p>{doc["gpus"]} GPUs, {doc["days"]:g} measured days, {doc["workloads"]:,} workloads, seed {doc["seed"]}.
Every configuration ran on the same arrivals and node failures.</p>
<h2>Summary</h2>
{_summary_html(doc)}
<h2>Plots</h2>
{images}
<h2>Parameters and their sources</h2>
{_sources_html(result.sim.sources)}
</body></html>
"""
    page = page.replace(
        "<h2>Plots</h2>", '<p><a href="chargeback.html">Chargeback per team</a></p>\n<h2>Plots</h2>'
    )
    (folder / "chargeback.html").write_text(
        to_html(chargeback(ledgers), "Chargeback per team"), encoding="utf-8"
    )
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    # The same numbers for programs (the web console's report pages read this file).
    (folder / SUMMARY).write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    return index


SWEEP_PLOTS = ("sweep-wait.png", "sweep-busy.png")
SWEEP_SERIES = "sweep-series.json"


def sweep_series(document: dict[str, Any], key: str) -> dict[str, list[tuple[float, float | None]]]:
    """Per configuration, (offered load, ``key``) at every load it ran: the grid's loads, or with
    ``--sweep auto`` every load of its search (``autoSweep``)."""
    if "autoSweep" in document:
        return {
            name: [(run["load"], run.get(key)) for run in runs]
            for name, runs in document["autoSweep"].items()
        }
    names = list(document["sweep"][0]["configurations"])
    return {
        name: [(point["load"], point["configurations"][name].get(key)) for point in document["sweep"]]
        for name in names
    }


def cut_loads(document: dict[str, Any], name: str) -> set[float]:
    """The loads at which ``name``'s run was cut (an auto sweep's: its p95 wait is a lower bound)."""
    return {run["load"] for run in document.get("autoSweep", {}).get(name, []) if run.get("cut")}


def _panels(names: list[str]) -> list[tuple[str, list[str]]]:
    """Stock, gpuplane and the peers in one panel; gpuplane and its ablations in another."""
    ablations = [n for n in names if n.startswith("gpuplane-")]
    others = [n for n in names if n not in ablations]
    panels = [("peers", others)]
    if ablations:
        panels.append(("ablations", [n for n in names if n == "gpuplane" or n in ablations]))
    return panels


def _sweep_curves(document: dict[str, Any], folder: Path) -> dict[str, Any]:
    """p95 wait and busy GPU-hours per installed GPU against offered load, per configuration, with
    the peers in one panel and the ablations beside them; returns what each line plotted."""
    target_hours = document["waitTargetSeconds"] / HOUR
    names = list(document["capacityAtWaitTarget"])
    colors = {name: f"C{i % 10}" for i, name in enumerate(names)}
    plotted: dict[str, Any] = {}
    for filename, key, label, scale in (
        (SWEEP_PLOTS[0], "waitP95Seconds", "p95 queue wait (hours)", 1 / HOUR),
        (SWEEP_PLOTS[1], "gpuBusyOfCapacity", "busy GPU-hours per installed GPU-hour (%)", 100.0),
    ):
        series = sweep_series(document, key)
        panels = _panels(names)
        fig = Figure(figsize=(7 * len(panels), 4.5))
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        lines: dict[str, dict[str, Any]] = {}
        for ax, (title, members) in zip(axes, panels, strict=True):
            for name in members:
                points = series[name]
                (line,) = ax.plot(
                    [load for load, _ in points],
                    [(value or 0.0) * scale for _, value in points],
                    marker="o",
                    color=colors[name],
                    label=name,
                )
                lines[name] = {
                    "load": [float(x) for x in line.get_xdata()],
                    "value": [float(y) for y in line.get_ydata()],
                }
                cut = cut_loads(document, name) if key == "waitP95Seconds" else []
                if cut:  # a run stopped once sure to miss: its p95 is a lower bound
                    at = [(load, (value or 0.0) * scale) for load, value in points if load in cut]
                    ax.scatter(
                        [load for load, _ in at],
                        [value for _, value in at],
                        marker="^",
                        s=70,
                        facecolors="none",
                        edgecolors=colors[name],
                        zorder=3,
                    )
                    lines[name]["cutLoads"] = [float(load) for load, _ in at]
                capacity = document["capacityAtWaitTarget"].get(name)
                if key == "waitP95Seconds" and capacity is not None:
                    ax.axvline(capacity, color=colors[name], ls=":", lw=1)
                    lines[name]["capacity"] = capacity
            if key == "waitP95Seconds":
                ax.axhline(target_hours, color="grey", ls="--", lw=1, label="wait target")
                if any(cut_loads(document, name) for name in members):
                    ax.scatter(
                        [], [], marker="^", facecolors="none", edgecolors="grey", label="cut: a lower bound"
                    )
                ax.set_yscale("symlog", linthresh=max(target_hours, 1e-3))
            ax.set_title(title)
            ax.set_xlabel("offered load (fraction of installed GPUs)")
            ax.set_ylabel(label)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(folder / filename, dpi=100)
        plotted[filename] = {"scale": scale, "lines": lines, "panels": dict(panels)}
    plotted["waitTargetHours"] = target_hours
    return plotted


def _match_gpus(match: dict[str, Any] | None) -> str:
    if match is None:
        return "-"
    gpus = match.get("gpus", match.get("stockGpus"))
    if gpus is None:
        return "-"
    scaled = "gpus" not in match
    return f"{'stock: ' if scaled else ''}{'≥ ' if match['bound'] == 'atLeast' else ''}{gpus:,}"


def _runs_html(document: dict[str, Any]) -> str:
    names = list(document["capacityAtWaitTarget"])
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    rows = "".join(
        f"<tr><td>{load:g}</td>"
        + "".join(
            "<td>-</td>"
            if c is None
            else f"<td>{'≥ ' if c.get('cut') else ''}{_hours(c.get('waitP95Seconds'))}</td>"
            for c in (configs[n] for n in names)
        )
        + "</tr>"
        for load, configs in sweep_points(document)
    )
    return f"<table><tr><th>offered load</th>{head}</tr>{rows}</table>"


def _hours(seconds: float | None) -> str:
    return f"{(seconds or 0.0) / HOUR:,.2f} h"


def write_sweep_report(result: SweepResult, folder: Path) -> Path:
    """Write ``index.html`` with the sweep's curves and capacity table into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = result.document
    plotted = _sweep_curves(doc, folder)
    # What each line of the plots shows, for programs and tests (read back, not recomputed).
    (folder / SWEEP_SERIES).write_text(json.dumps(plotted, indent=1) + "\n", encoding="utf-8")
    ratio = doc.get("capacityRatioToGpuplane", {})
    matches = doc.get("gpusToMatch", {})
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{_cell(value)}</td>"
        f"<td>{html.escape(doc['capacityBound'][name])}</td><td>{_cell(ratio.get(name, '-'))}</td>"
        f"<td>{_cell(_match_gpus(matches.get(name)))}</td></tr>"
        for name, value in doc["capacityAtWaitTarget"].items()
    )
    images = "".join(f'<p><img src="{name}" alt="{name}"></p>' for name in SWEEP_PLOTS)
    title = f"gpuplane simulate --sweep: {html.escape(doc['scenario'])}"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; max-width: 70em; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 0.2em 0.6em; text-align: left; }}
</style></head><body>
<h1>{title}</h1>
<p>{html.escape(doc.get("headline", ""))}</p>
<p>{doc["gpus"]} GPUs, {doc["days"]:g} measured days per load, seed {doc["seed"]}; loads
{", ".join(f"{load:g}" for load, _ in sweep_points(doc))}.</p>
<h2>Capacity at p95 wait &le; {doc["waitTargetSeconds"] / HOUR:g} h</h2>
<table><tr><th>configuration</th><th>offered load</th><th>bound</th><th>ratio to gpuplane</th>
<th>GPUs to match gpuplane</th></tr>{rows}</table>
<h2>Curves</h2>
{images}
<h2>Every run: p95 wait</h2>
<p>A wait marked &ge; is a lower bound: that run stopped once its p95 wait was sure to miss the
target, and its busy share covers the time up to that point.</p>
{_runs_html(doc)}
</body></html>
"""
    index = folder / "index.html"
    index.write_text(page, encoding="utf-8")
    return index
