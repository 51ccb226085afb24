"""Each page's data for one viewer: the snapshot, filtered to the namespaces the viewer sees.

Functions here are pure (snapshot and viewer in, a dict for the template out), so the pages'
numbers can be tested without a server. Workloads, pending rows and device holders of other
namespaces are dropped, never greyed out; cluster-wide capacity (GPUs installed, free) is shown
to every authenticated viewer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from markupsafe import Markup

from gpuplane.core.session import SchedulerConfig
from gpuplane.model.gpu_share import FRACTION_RESOURCE, MILLI
from gpuplane.model.objects import ClusterQueue, Workload
from gpuplane.model.quantity import base_units_per_unit, format_quantity
from gpuplane.web import charts
from gpuplane.web.auth import Viewer
from gpuplane.web.fleet import FleetWorker, count, placement_of
from gpuplane.web.prometheus import GpuHistory
from gpuplane.web.snapshot import ConsoleSnapshot, Holder, NodeCell, PendingRow


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100) of ``values``; ``None`` when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]


def duration(seconds: float | None) -> str:
    """Short human duration: ``45s``, ``12m``, ``3h20m``, ``2d4h``."""
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600}h"


def gpus(value: float) -> str:
    """GPU-equivalents as shown everywhere: integers plain, fractions to two decimals."""
    if abs(value - round(value)) < 1e-9:
        return str(round(value))
    return f"{value:.2f}"


def timestamp(seconds: float) -> str:
    """UTC time as RFC 3339, to the second."""
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def measure(value: object, key: str) -> str:
    """A simulation summary value: shares as percent, seconds as durations, numbers grouped."""
    if value is None:
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if key.endswith("Share"):
        return f"{100 * value:.1f} %"
    if key.endswith("Seconds"):
        return duration(float(value))
    return f"{value:,.6g}" if isinstance(value, float) else f"{value:,}"


def eta_range(snap: ConsoleSnapshot, workload: str) -> str:
    """The ETA column: ``low-high`` from now, as ``gpuplane why`` estimates it."""
    if snap.explanations is None:
        return "..."  # still being computed for this version
    found = snap.explanations.get(workload)
    if found is None:
        return "-"
    eta = found.eta
    if eta.seconds is None or eta.low is None or eta.high is None:
        return "not by itself"
    return f"{duration(eta.low)}-{duration(eta.high)}"


def visible_pending(snap: ConsoleSnapshot, viewer: Viewer) -> list[PendingRow]:
    return [r for r in snap.pending if viewer.sees(r.namespace)]


def _team_of(wl: Workload, snap: ConsoleSnapshot) -> str:
    admitted = snap.admitted_by_key.get(wl.key)
    if admitted is not None:
        return admitted.cluster_queue
    if wl.admission is not None:
        return wl.admission.cluster_queue
    row = snap.pending_by_key.get(wl.key)
    return (row.cluster_queue if row else None) or "-"


def _nominal_gpus(cq: ClusterQueue, gpu_resources: Iterable[str]) -> float:
    """Nominal GPUs of ``cq``: its quota of ``gpu_resources`` plus its quota for GPU shares
    (``gpuplane.dev/gpu-fraction``, in whole GPUs)."""
    names = set(gpu_resources)
    total = 0.0
    for group in cq.resource_groups:
        for flavor in group.flavors:
            for name, quota in flavor.resources.items():
                if name in names:
                    total += quota.nominal
                elif name == FRACTION_RESOURCE:
                    total += quota.nominal / base_units_per_unit(name)
    return total


@dataclass(frozen=True, slots=True)
class FleetRow:
    """One worker on the Fleet panel: the worker, and its GPUs used/quota as shown."""

    worker: FleetWorker
    gpus: str  # "12/16", or "-" without a summary


def fleet(snap: ConsoleSnapshot, viewer: Viewer) -> list[FleetRow]:
    """The Fleet panel of a MultiKueue manager: one row per worker; none for a cluster without
    MultiKueueClusters, or for a viewer who may not list them."""
    if not viewer.sees_fleet:
        return []
    names = (snap.config or SchedulerConfig()).devices.whole_resources
    rows = []
    for worker in snap.fleet:
        used = worker.gpus(names)
        rows.append(FleetRow(worker, "-" if used is None else f"{count(used[0])}/{count(used[1])}"))
    return rows


def placements(snap: ConsoleSnapshot, viewer: Viewer) -> dict[str, str]:
    """Where each visible workload of a MultiKueue manager runs (its worker, or ``nominated: a, b``
    while it is dispatched), by key; empty on a cluster that dispatches nothing."""
    out = {}
    for wl in snap.state.workloads:
        where = placement_of(wl)
        if where and viewer.sees(wl.namespace):
            out[wl.key] = where
    return out


def overview(snap: ConsoleSnapshot, viewer: Viewer, history: GpuHistory | None) -> dict[str, Any]:
    rows = visible_pending(snap, viewer)
    by_reason: dict[str, list[float]] = {}
    for r in rows:
        by_reason.setdefault(r.reason, []).append(r.gpus)
    reasons = sorted(((k, len(v), sum(v)) for k, v in by_reason.items()), key=lambda t: (-t[2], -t[1], t[0]))
    waits = [r.waiting_seconds for r in rows]
    teams: dict[str, dict[str, float]] = {}
    gpu_names = (snap.config or SchedulerConfig()).devices.whole_resources  # the configured accelerators
    # A viewer limited to some namespaces sees the teams their LocalQueues feed, not every team.
    feeds = {lq.cluster_queue for lq in snap.state.local_queues.values() if viewer.sees(lq.namespace)}
    for name, cq in snap.state.cluster_queues.items():
        if viewer.namespaces is None or name in feeds:
            teams[name] = {
                "nominal": _nominal_gpus(cq, gpu_names),
                "allocated": 0.0,
                "pending": 0.0,
                "waiting": 0,
            }
    holders: list[tuple[str, str, float]] = []
    for wl in snap.state.workloads:
        if not viewer.sees(wl.namespace):
            continue
        team = _team_of(wl, snap)
        entry = teams.setdefault(team, {"nominal": 0.0, "allocated": 0.0, "pending": 0.0, "waiting": 0})
        held = snap.held_gpus.get(wl.key)
        if held is not None:
            entry["allocated"] += held
            if held:
                holders.append((wl.key, team, held))
        elif wl.key in snap.pending_by_key:
            entry["pending"] += snap.pending_by_key[wl.key].gpus
            entry["waiting"] += 1
    holders.sort(key=lambda h: (-h[2], h[0]))
    context: dict[str, Any] = {
        "installed": snap.installed_gpus,
        "allocated": sum(h for _, _, h in holders) if viewer.namespaces is not None else snap.allocated_gpus,
        "free": snap.free_gpus,
        "pending_count": len(rows),
        "pending_gpus": sum(r.gpus for r in rows),
        "reasons": reasons,
        "reason_chart": charts.hbars([(k, g) for k, _, g in reasons], " GPUs"),
        "waits": {q: percentile(waits, q) for q in (50, 90, 99)},
        "max_wait": max(waits) if waits else None,
        "teams": sorted(teams.items()),
        "top_holders": holders[:10],
        "history": None,
        "history_chart": None,
        "team_history_chart": None,
        "idle_holders": [],
        "namespaces_busy": [],
        "fleet": fleet(snap, viewer),
        "placements": placements(snap, viewer),
    }
    if history is not None:
        context["history"] = history
        context["history_chart"] = charts.time_chart(history.series, "GPUs")
        shown = [(ns, alloc, busy) for ns, alloc, busy in history.by_namespace if viewer.sees(ns)]
        context["team_history_chart"] = (
            charts.time_chart([s for _, alloc, busy in shown for s in (alloc, busy)], "GPUs per namespace")
            if shown
            else None
        )
        context["idle_holders"] = [h for h in history.idle_holders if viewer.sees(h.namespace)][:10]
        context["namespaces_busy"] = sorted(
            (ns, history.allocated_by_namespace.get(ns, 0.0), history.busy_by_namespace.get(ns, 0.0))
            for ns in set(history.allocated_by_namespace) | set(history.busy_by_namespace)
            if viewer.sees(ns)
        )
    return context


@dataclass(frozen=True, slots=True)
class QuotaLine:
    flavor: str
    resource: str
    nominal: int
    used: int
    borrowed: int
    lent: int
    borrowing_limit: int | None
    lending_limit: int | None
    bar: Markup

    def show(self, value: int | None) -> str:
        if value is None:
            return "-"
        return format_quantity(self.resource, value)


@dataclass(frozen=True, slots=True)
class QueueBox:
    name: str
    kind: str  # Cohort | ClusterQueue
    lines: tuple[QuotaLine, ...]
    children: tuple[QueueBox, ...]
    pending: int
    admitted: int


def _lines(snap: ConsoleSnapshot, cq: ClusterQueue, lent: Mapping[tuple[str, str], int]) -> list[QuotaLine]:
    usage = snap.queue_usage.get(cq.name, {})
    out = []
    for group in cq.resource_groups:
        for flavor in group.flavors:
            for resource, quota in flavor.resources.items():
                used = usage.get((flavor.name, resource), 0)
                borrowed = max(0, used - quota.nominal)
                gave = lent.get((flavor.name, resource), 0)
                scale = max(quota.nominal + (quota.borrowing_limit or 0), used, quota.nominal, 1)
                if quota.borrowing_limit is None and cq.cohort:
                    scale = max(scale, quota.nominal + borrowed)
                out.append(
                    QuotaLine(
                        flavor.name,
                        resource,
                        quota.nominal,
                        used,
                        borrowed,
                        gave,
                        quota.borrowing_limit,
                        quota.lending_limit,
                        charts.quota_bar(quota.nominal, used, borrowed, gave, scale),
                    )
                )
    return out


def _lent(snap: ConsoleSnapshot, members: list[ClusterQueue]) -> dict[str, dict[tuple[str, str], int]]:
    """Who lent what, inside one cohort tree: members' borrowing is charged to lenders in name order.

    Kueue pools lent quota without recording a lender; this split is the console's own, and
    sums to exactly what the members borrow.
    """
    borrowed: dict[tuple[str, str], int] = {}
    spare: dict[str, dict[tuple[str, str], int]] = {}
    for cq in members:
        usage = snap.queue_usage.get(cq.name, {})
        for group in cq.resource_groups:
            for flavor in group.flavors:
                for resource, quota in flavor.resources.items():
                    fr = (flavor.name, resource)
                    used = usage.get(fr, 0)
                    borrowed[fr] = borrowed.get(fr, 0) + max(0, used - quota.nominal)
                    free = max(0, quota.nominal - used)
                    if quota.lending_limit is not None:
                        free = min(free, quota.lending_limit)
                    spare.setdefault(cq.name, {})[fr] = free
    out: dict[str, dict[tuple[str, str], int]] = {}
    for cq in sorted(members, key=lambda q: q.name):
        for fr, free in spare.get(cq.name, {}).items():
            take = min(free, borrowed.get(fr, 0))
            if take:
                out.setdefault(cq.name, {})[fr] = take
                borrowed[fr] -= take
    return out


def queues(snap: ConsoleSnapshot, viewer: Viewer) -> dict[str, Any]:
    state = snap.state
    parents: dict[str, str | None] = {name: c.parent for name, c in state.cohorts.items()}
    for cq in state.cluster_queues.values():
        if cq.cohort and cq.cohort not in parents:
            parents[cq.cohort] = None

    def root_of(cohort: str) -> str:
        seen = set()
        while parents.get(cohort) and cohort not in seen:
            seen.add(cohort)
            cohort = parents[cohort] or cohort
        return cohort

    trees: dict[str, list[ClusterQueue]] = {}
    for cq in state.cluster_queues.values():
        trees.setdefault(root_of(cq.cohort) if cq.cohort else f"cq:{cq.name}", []).append(cq)
    lent: dict[str, dict[tuple[str, str], int]] = {}
    for members in trees.values():
        lent.update(_lent(snap, members))
    rows = visible_pending(snap, viewer)
    pending_per_cq: dict[str, int] = {}
    for r in rows:
        if r.cluster_queue:
            pending_per_cq[r.cluster_queue] = pending_per_cq.get(r.cluster_queue, 0) + 1
    admitted_per_cq: dict[str, int] = {}
    for wl in state.workloads:
        if wl.key in snap.held_gpus and viewer.sees(wl.namespace):
            team = _team_of(wl, snap)
            admitted_per_cq[team] = admitted_per_cq.get(team, 0) + 1

    def cq_box(cq: ClusterQueue) -> QueueBox:
        return QueueBox(
            cq.name,
            "ClusterQueue",
            tuple(_lines(snap, cq, lent.get(cq.name, {}))),
            (),
            pending_per_cq.get(cq.name, 0),
            admitted_per_cq.get(cq.name, 0),
        )

    def cohort_box(name: str) -> QueueBox:
        kids = [cohort_box(c) for c in sorted(n for n, p in parents.items() if p == name and n != name)]
        kids += [
            cq_box(q) for q in sorted(state.cluster_queues.values(), key=lambda q: q.name) if q.cohort == name
        ]
        return QueueBox(
            name, "Cohort", (), tuple(kids), sum(k.pending for k in kids), sum(k.admitted for k in kids)
        )

    roots = [cohort_box(n) for n in sorted(n for n, p in parents.items() if not p)]
    roots += [cq_box(q) for q in sorted(state.cluster_queues.values(), key=lambda q: q.name) if not q.cohort]
    local: dict[str, list[PendingRow]] = {}
    for r in rows:
        local.setdefault(r.local_queue or f"{r.namespace}/-", []).append(r)
    for lq in state.local_queues.values():
        if viewer.sees(lq.namespace):
            local.setdefault(lq.key, [])
    local_queues = []
    for key in sorted(local):
        spec = state.local_queues.get(key)
        ordered = sorted(local[key], key=lambda r: (r.local_position or 1 << 30, r.workload))
        local_queues.append((key, spec.cluster_queue if spec else "-", ordered))
    etas = {r.workload: eta_range(snap, r.workload) for r in rows}
    return {
        "roots": roots,
        "local_queues": local_queues,
        "pending_count": len(rows),
        "etas": etas,
        "placements": placements(snap, viewer),
    }


def workload(snap: ConsoleSnapshot, key: str, viewer: Viewer) -> dict[str, Any] | None:
    """Everything about one workload (the caller checked the viewer may see its namespace).

    Blockers in namespaces the viewer may not see keep their kind and detail, not their name.
    """
    wl = snap.workload(key)
    if wl is None:
        return None
    pending = snap.pending_by_key.get(key)
    admitted = snap.admitted_by_key.get(key)
    preempted = next((p for p in snap.plan.preempted if p.workload == key), None)
    pods = sorted(
        (p for p in snap.state.pods if p.namespace == wl.namespace and _pod_of(p.template.labels, wl)),
        key=lambda p: p.name,
    )
    devices: list[tuple[str, int, str, Holder]] = []
    for node in snap.nodes:
        for d in node.devices:
            devices += [(node.name, d.index, d.model, h) for h in d.holders if h.owner == key]
    placements = [
        (ps.name, where.node, where.count, ", ".join(where.devices))
        for ps in (admitted.pod_sets if admitted is not None else ())
        for where in ps.placement or ()
    ]
    events = snap.events.get(key, ())
    pod_events = [e for p in pods for e in snap.events.get(p.key, ())]
    history = sorted(
        [
            (c.last_transition, c.type, c.status, c.reason, c.message)
            for c in wl.conditions
            if c.last_transition
        ]
        + [(wl.creation, "Created", True, "", "")]
        + [(e.time, e.reason, True, e.type, e.message) for e in events],
        key=lambda h: h[0],
    )
    requests = [
        (
            ps.name,
            ps.count,
            ps.min_count,
            ", ".join(
                f"{name}={format_quantity(name, q)}"
                for name, q in sorted(ps.template.requests.items())
                if name != "pods"
            ),
        )
        for ps in wl.pod_sets
    ]
    explanation = snap.explanations.get(key) if snap.explanations is not None else None
    blockers = [
        (
            b.kind,
            b.name if b.kind not in ("Workload", "Pod") or viewer.sees_owner(b.name) else None,
            b.detail,
        )
        for b in (explanation.blockers if explanation is not None else ())
    ]
    return {
        "wl": wl,
        "explanation": explanation,
        "blockers": blockers,
        "explaining": snap.explanations is None and pending is not None,
        "eta": eta_range(snap, key) if pending is not None else "",
        "gpus": snap.workload_gpus.get(key, 0.0),
        "pending": pending,
        "admitted": admitted,
        "preempted": preempted,
        "cluster_queue": _team_of(wl, snap),
        "runs_on": placement_of(wl),
        "state": _state(wl, pending, admitted, preempted is not None),
        "requests": requests,
        "pods": pods,
        "devices": devices,
        "placements": placements,
        "conditions": wl.conditions,
        "events": sorted([*events, *pod_events], key=lambda e: e.time),
        "history": history,
    }


def _pod_of(labels: Mapping[str, str], wl: Workload) -> bool:
    return (
        labels.get("kueue.x-k8s.io/workload-name") == wl.name
        or labels.get("gpuplane.dev/workload") == wl.name
    )


def _state(wl: Workload, pending: PendingRow | None, admitted: object, preempted: bool) -> str:
    if wl.finished:
        return "Finished"
    if preempted:
        return "Preempted"
    if admitted is not None:
        return "Admitted (this plan)"
    if wl.admission is not None:
        return "Admitted"
    if pending is not None:
        return "Pending"
    return "Unknown"


def nodes(snap: ConsoleSnapshot, viewer: Viewer) -> dict[str, Any]:
    groups: dict[tuple[str, ...], list[NodeCell]] = {}
    for node in snap.nodes:
        groups.setdefault(node.domain, []).append(node)
    installed = snap.installed_gpus
    stranded = sum(n.stranded_milli for n in snap.nodes) / MILLI
    return {
        "levels": snap.topology_levels,
        "groups": sorted(groups.items()),
        "installed": installed,
        "free": snap.free_gpus,
        "stranded": stranded,
        "node_count": len(snap.nodes),
        "sees": viewer.sees_owner,
    }


@dataclass(frozen=True, slots=True)
class Report:
    """One simulation report folder, as ``gpuplane simulate --report DIR`` writes it."""

    index: int
    path: Path
    document: dict[str, Any] | None
    plots: tuple[str, ...]

    @property
    def title(self) -> str:
        if self.document:
            return str(self.document.get("scenario", self.path.name))
        return self.path.name


def load_reports(folders: Iterable[Path]) -> list[Report]:
    out = []
    for i, folder in enumerate(folders):
        doc = None
        summary = folder / "summary.json"
        if summary.is_file():
            try:
                loaded = json.loads(summary.read_text(encoding="utf-8"))
                doc = loaded if isinstance(loaded, dict) else None
            except (OSError, ValueError):
                doc = None
        plots = tuple(sorted(p.name for p in folder.glob("*.png")))
        out.append(Report(i, folder, doc, plots))
    return out


SUMMARY_MEASURES = (
    ("gpuAllocatedShare", "allocated share of installed GPUs"),
    ("gpuBusyShare", "busy share of allocated GPUs"),
    ("allocatedGpuHours", "allocated GPU-hours"),
    ("busyGpuHours", "busy GPU-hours"),
    ("idleGpuHours", "idle GPU-hours"),
    ("waitP50Seconds", "wait p50"),
    ("waitP95Seconds", "wait p95"),
    ("preemptions", "preemptions"),
    ("completed", "completed"),
)


def report(rep: Report) -> dict[str, Any]:
    doc = rep.document or {}
    configs: dict[str, Any] = doc.get("configurations", {})
    summary = [
        (label, key, [cfg.get(key) for cfg in configs.values()])
        for key, label in SUMMARY_MEASURES
        if any(key in cfg for cfg in configs.values())
    ]
    teams = {}
    for name, cfg in configs.items():
        per_team = cfg.get("teams", {})
        total = sum(t.get("allocatedGpuHours") or 0 for t in per_team.values()) or 1
        teams[name] = [
            (
                team,
                t.get("allocatedGpuHours"),
                t.get("busyGpuHours"),
                t.get("idleGpuHours"),
                t.get("gpuBusyShare"),
                t.get("waitP50Seconds"),
                t.get("waitP95Seconds"),
                (t.get("allocatedGpuHours") or 0) / total,
            )
            for team, t in sorted(per_team.items())
        ]
    return {"rep": rep, "doc": doc, "configs": list(configs), "summary": summary, "teams": teams}
