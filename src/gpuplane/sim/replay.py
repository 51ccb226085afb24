"""Trace replay: a published job or pod list instead of generated workloads.

Formats (``--trace-format``; detected from the CSV header when not given):

``openb``
    Alibaba's openb pod list (cluster-trace-gpu-v2023, e.g. ``openb_pod_list_default.csv``) with
    its node list ``openb_node_list_all_node.csv`` from the same folder. Every pod exists from
    ``creation_time`` until ``deletion_time`` (to the end of the trace when empty): it is submitted
    at its creation, runs once placed, and is deleted at its deletion time whether it ran or not.
    Requests follow the FGD simulator's reading (:func:`gpuplane.sim.traces.pod_request`):
    ``num_gpu`` GPUs of ``gpu_milli`` each (a fraction when below 1000), on one of the
    ``gpu_spec`` models, plus ``cpu_milli`` and ``memory_mib``. A pool per GPU model (``cpu`` for
    nodes without GPUs); one team; the workload class is the pod's ``qos``, and ``BE``
    (best effort) pods form the backfill tier.

``helios``
    The job-log schema of Helios and Acme (``submit_time``, ``duration``, ``gpu_num``,
    ``node_num``, ``vc``). Submission times may be numbers (seconds) or timestamps.

a mapping file (YAML)
    Any other CSV: name its columns::

        columns:
          submit: submit_time      # seconds or a timestamp (required)
          duration: duration       # seconds of work (required)
          gpus: gpu_num            # GPUs of the whole job (required)
          pods: node_num           # pods of a gang (optional, default 1)
          team: vc                 # optional; one team when absent
          class: type              # optional; one class "trace" when absent

For ``helios`` and mapping files the cluster (pools, failures, policies) comes from the scenario
(``--scenario``, else the built-in one). Teams are the trace's teams; each team's floor is its
share of the trace's GPU time [derived]. A job's pods split its GPUs evenly (rounded up); jobs
without GPUs, or too big for any node, are skipped and counted.

Trace files are read where they are (``../shared/traces`` in this repository); nothing is
copied. No trace here records SM activity, so a replayed pod is taken to keep the GPU share it
asked for busy (``busy = 1``, assumed): the busy share then measures what rounding requests up to
whole GPUs costs, not how idle the workloads are.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from gpuplane.sim.cluster import ClusterSpec, NodeSpec, cluster_from_scenario
from gpuplane.sim.experiment import SimInput
from gpuplane.sim.scenario import Scenario, Team
from gpuplane.sim.traces import TraceError, pod_request, read_nodes
from gpuplane.sim.workloads import MILLI, Job, Request, Workloads

FORMATS = ("openb", "helios")
OPENB_NODES = "openb_node_list_all_node.csv"
OPENB_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
HELIOS_COLUMNS = {
    "submit": "submit_time",
    "duration": "duration",
    "gpus": "gpu_num",
    "pods": "node_num",
    "team": "vc",
}
REPLAY_BUSY = 1.0  # assumed: no trace records SM activity
CPU_POOL = "cpu"
EVICTION_GRACE = 30.0  # domain-facts §5: terminationGracePeriodSeconds defaults to 30
NEVER = 1e18  # replayed workloads have no sessions and no gangs to time out


def _read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as problem:
        raise TraceError(f"{path}: cannot read: {problem}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = list(reader)
    header = list(reader.fieldnames or [])
    if not header:
        raise TraceError(f"{path}: empty file")
    return header, rows


def detect_format(header: list[str]) -> str | None:
    if all(c in header for c in OPENB_COLUMNS):
        return "openb"
    if all(c in header for c in ("submit_time", "duration", "gpu_num")):
        return "helios"
    return None


def replay_input(
    path: Path, trace_format: str | None, scenario: Scenario, days: float | None = None
) -> SimInput:
    """Read a trace into the workloads and cluster one experiment runs on."""
    header, rows = _read_csv(path)
    if trace_format in (None, ""):
        trace_format = detect_format(header)
        if trace_format is None:
            raise TraceError(
                f"{path}: line 1: cannot tell the trace format from the header "
                f"({','.join(header)}); pass --trace-format openb|helios|MAPPING.yaml"
            )
    if trace_format == "openb":
        return _openb(path, header, rows, days)
    columns = HELIOS_COLUMNS if trace_format == "helios" else _mapping(Path(trace_format))
    return _job_log(path, (header, rows), columns, scenario=scenario, days=days)


# ---------------------------------------------------------------------------
# openb
# ---------------------------------------------------------------------------


def _int(path: Path, line: int, row: Mapping[str, str], column: str, default: int | None = None) -> int:
    value = (row.get(column) or "").strip()
    if not value and default is not None:
        return default
    try:
        return int(float(value))
    except ValueError:
        raise TraceError(f"{path}: line {line}: column {column}: not a number: {value!r}") from None


def _openb(path: Path, header: list[str], rows: list[dict[str, str]], days: float | None) -> SimInput:
    missing = [c for c in OPENB_COLUMNS if c not in header]
    if missing:
        raise TraceError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
    node_path = path.with_name(OPENB_NODES)
    if not node_path.exists():
        raise TraceError(f"{path}: the openb node list {OPENB_NODES} is not in the same folder")
    nodes = read_nodes(node_path)
    models = sorted({n.model for n in nodes if n.gpus and n.model})
    pools = (CPU_POOL, *models) if any(not n.gpus for n in nodes) else tuple(models)
    specs = tuple(
        NodeSpec(
            name=n.name,
            pool=n.model if n.gpus and n.model else CPU_POOL,
            gpus=n.gpus,
            model=n.model,
            cpu_milli=n.cpu,
            memory_mib=n.memory,
        )
        for n in nodes
    )
    gpu_pools = tuple(m for m in models)
    end = 0
    drafts = []
    for line, row in enumerate(rows, start=2):
        created = _int(path, line, row, "creation_time")
        deleted = _int(path, line, row, "deletion_time", default=-1)
        request = pod_request(
            _int(path, line, row, "cpu_milli"),
            _int(path, line, row, "memory_mib"),
            _int(path, line, row, "num_gpu"),
            _int(path, line, row, "gpu_milli", default=0),
            (row.get("gpu_spec") or "").strip(),
        )
        if created < 0 or (deleted >= 0 and deleted < created):
            raise TraceError(f"{path}: line {line}: deletion_time before creation_time")
        unknown = [m for m in request.models if m not in models]
        if unknown:
            raise TraceError(f"{path}: line {line}: column gpu_spec: no node has GPU model {unknown[0]!r}")
        end = max(end, created, deleted)
        drafts.append(
            (row["name"].strip(), created, deleted, request, (row.get("qos") or "").strip() or "none")
        )
    if not drafts:
        raise TraceError(f"{path}: no pods")
    horizon = float(end) if days is None else days * 86400.0
    lifetimes: dict[str, list[float]] = {}
    for _, created, deleted, _, qos in drafts:
        lifetimes.setdefault(qos, []).append((deleted if deleted >= 0 else end) - created)
    expected = {qos: sum(v) / len(v) for qos, v in lifetimes.items()}
    jobs: list[Job] = []
    for name, created, deleted, request, qos in sorted(drafts, key=lambda d: (d[1], d[0])):
        if created >= horizon:
            continue
        if request.gpus == 0:
            req = Request(cpu_milli=request.cpu, memory_mib=request.memory)
            job_pools = pools
        elif request.gpu_milli < MILLI:
            req = Request(fraction_milli=request.gpu_milli, cpu_milli=request.cpu, memory_mib=request.memory)
            job_pools = request.models or gpu_pools
        else:
            req = Request(gpus=request.gpus, cpu_milli=request.cpu, memory_mib=request.memory)
            job_pools = request.models or gpu_pools
        stop = float(deleted) if deleted >= 0 else float(end)
        jobs.append(
            Job(
                id=len(jobs),
                name=name,
                team="openb",
                klass=qos,
                tier="backfill" if qos == "BE" else "normal",
                submit=float(created),
                pods=1,
                request=req,
                pools=tuple(job_pools),
                work=max(1.0, stop - created),
                startup=0.0,
                activity=REPLAY_BUSY * req.share,
                expected=expected[qos],
                deadline=stop if stop > created else created + 1.0,
            )
        )
    cluster = ClusterSpec(nodes=specs, pools=pools, teams=(Team("openb", 1.0, 1.0),))
    return SimInput(
        name=path.name,
        cluster=cluster,
        workloads=Workloads(tuple(jobs), (), 0.0, horizon),
        reaper_idle=NEVER,
        deadlock_timeout=NEVER,
        eviction_grace=EVICTION_GRACE,
        days=round(horizon / 86400.0, 3),
        notes={"trace": {"format": "openb", "pods": len(jobs), "nodes": len(specs)}},
    )


# ---------------------------------------------------------------------------
# job logs (Helios, Acme, mapped CSVs)
# ---------------------------------------------------------------------------


def _mapping(path: Path) -> dict[str, str]:
    if path.suffix not in (".yaml", ".yml", ".json"):
        raise TraceError(f"unknown trace format {str(path)!r}: use openb, helios or a mapping file (.yaml)")
    try:
        doc: Any = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as problem:
        raise TraceError(f"{path}: cannot read the column mapping: {problem}") from None
    columns = doc.get("columns") if isinstance(doc, dict) else None
    if not isinstance(columns, dict) or not all(isinstance(v, str) for v in columns.values()):
        raise TraceError(f"{path}: columns: expected a mapping of field to CSV column name")
    unknown = sorted(set(columns) - {"submit", "duration", "gpus", "pods", "team", "class"})
    if unknown:
        raise TraceError(f"{path}: columns.{unknown[0]}: unknown field")
    for needed in ("submit", "duration", "gpus"):
        if needed not in columns:
            raise TraceError(f"{path}: columns.{needed}: missing")
    return {str(k): str(v) for k, v in columns.items()}


def _seconds(path: Path, line: int, column: str, value: str) -> float:
    value = value.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise TraceError(
            f"{path}: line {line}: column {column}: not seconds or a timestamp: {value!r}"
        ) from None


def _job_log(
    path: Path,
    table: tuple[list[str], list[dict[str, str]]],
    columns: Mapping[str, str],
    *,
    scenario: Scenario,
    days: float | None,
) -> SimInput:
    """A job log (Helios, or a mapped one): ``table`` is its header and rows."""
    header, rows = table
    missing = [c for f, c in columns.items() if f in ("submit", "duration", "gpus") and c not in header]
    if missing:
        raise TraceError(f"{path}: line 1: missing column(s) {', '.join(missing)}")
    base = cluster_from_scenario(scenario)
    whole_pools = [p for p in base.pools if all(n.mig_layout is None for n in base.nodes if n.pool == p)]
    widest = {p: max(n.gpus for n in base.nodes if n.pool == p) for p in whole_pools}
    parsed = []
    skipped = 0
    for line, row in enumerate(rows, start=2):
        gpus = _int(path, line, row, columns["gpus"])
        pods = max(1, _int(path, line, row, columns["pods"], default=1)) if "pods" in columns else 1
        per_pod = math.ceil(gpus / pods) if gpus > 0 else 0
        pools = tuple(p for p in whole_pools if widest[p] >= per_pod)
        if gpus <= 0 or not pools:
            skipped += 1
            continue
        submit = _seconds(path, line, columns["submit"], row.get(columns["submit"], ""))
        duration = _seconds(path, line, columns["duration"], row.get(columns["duration"], ""))
        team = (row.get(columns.get("team", ""), "") or "").strip() or "trace"
        klass = (row.get(columns.get("class", ""), "") or "").strip() or "trace"
        parsed.append((submit, max(1.0, duration), pods, per_pod, pools, team, klass))
    if not parsed:
        raise TraceError(f"{path}: no job with GPUs that fits a node of the cluster")
    origin = min(p[0] for p in parsed)
    horizon = max(p[0] for p in parsed) - origin if days is None else days * 86400.0
    horizon = max(horizon, 1.0)
    gpu_time: dict[str, float] = {}
    mean_duration: dict[str, list[float]] = {}
    for _, duration, pods, per_pod, _, team, klass in parsed:
        gpu_time[team] = gpu_time.get(team, 0.0) + duration * pods * per_pod
        mean_duration.setdefault(klass, []).append(duration)
    expected = {k: sum(v) / len(v) for k, v in mean_duration.items()}
    teams = tuple(Team(t, gpu_time[t], gpu_time[t]) for t in sorted(gpu_time))
    jobs: list[Job] = []
    for submit, duration, pods, per_pod, pools, team, klass in sorted(parsed, key=lambda p: p[0]):
        at = submit - origin
        if at >= horizon:
            continue
        jobs.append(
            Job(
                id=len(jobs),
                name=f"job-{len(jobs):06d}",
                team=team,
                klass=klass,
                tier="normal",
                submit=at,
                pods=pods,
                request=Request(gpus=per_pod),
                pools=pools,
                work=duration,
                startup=0.0,
                activity=REPLAY_BUSY * per_pod,
                expected=expected[klass],
            )
        )
    cluster = ClusterSpec(
        nodes=base.nodes,
        pools=base.pools,
        teams=teams,
        normal_priority=base.normal_priority,
        backfill_priority=base.backfill_priority,
    )
    return SimInput(
        name=path.name,
        cluster=cluster,
        workloads=Workloads(tuple(jobs), (), 0.0, horizon),
        reaper_idle=scenario.policies.reaper_idle.mean,
        deadlock_timeout=scenario.policies.deadlock_timeout.mean,
        eviction_grace=scenario.policies.eviction_grace.mean,
        days=round(horizon / 86400.0, 3),
        notes={
            "trace": {"format": "job log", "jobs": len(jobs), "skipped": skipped, "cluster": scenario.name}
        },
    )
