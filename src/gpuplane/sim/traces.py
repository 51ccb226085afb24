"""Readers for Alibaba's openb GPU trace (cluster-trace-gpu-v2023) and the FGD protocol's data files.

Nodes (``openb_node_list_*.csv``): ``sn,cpu_milli,memory_mib,gpu,model``.
Pods (``openb_pod_list_*.csv``): ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and, except in the
``multigpu*`` lists, ``gpu_spec`` (``A|B``: allowed GPU models; empty: any) and columns that are
not used here (qos, phase, times).

Pod conversion follows the FGD simulator's: a pod with ``num_gpu > 0`` asks ``num_gpu`` GPUs of
``gpu_milli`` milli-GPU each (values above 1000 count as 1000) on one of the ``gpu_spec`` models
(empty parts dropped); a pod with ``num_gpu == 0``, or with a non-positive ``gpu_milli``, asks no
GPU and has no model constraint.

Every reader raises :class:`TraceError` (a ``ValueError``) naming the file, line and column for
input it cannot read.
"""

from __future__ import annotations

import csv
import gzip
import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpuplane.core.pod_engine import MILLI_PER_GPU, GpuRequest, NodeSpec

# The FGD simulator registers every node with room for 1001 pods.
OPENB_MAX_PODS = 1001

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
ARRIVAL_COLUMNS = ("seed", "position", "source_pod")
NODE_RANK_COLUMNS = ("seed", "node_sn", "sim_node_name")


class TraceError(ValueError):
    """A trace or data file that cannot be read; the message names the file and the place."""


@dataclass(frozen=True, slots=True)
class TracePod:
    """One pod of a pod list: its name and what it asks."""

    name: str
    request: GpuRequest


def _rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """(line number, row) of a CSV file (gzip if the name ends in ``.gz``) with ``required`` columns."""
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as problem:
        raise TraceError(f"{path}: cannot read: {problem}") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(
            f"{path}: line 1: missing column(s) {', '.join(missing)} (header: {','.join(header)})"
        )
    for row in reader:
        yield reader.line_num, row


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    value = (row.get(column) or "").strip()
    try:
        return int(value)
    except ValueError:
        raise TraceError(f"{path}: line {line}: column {column}: not an integer: {value!r}") from None


def read_nodes(path: Path, max_pods: int = OPENB_MAX_PODS) -> list[NodeSpec]:
    """Nodes of an openb node list, in file order."""
    nodes = []
    seen: set[str] = set()
    for line, row in _rows(path, NODE_COLUMNS):
        name = row["sn"].strip()
        if not name or name in seen:
            raise TraceError(f"{path}: line {line}: column sn: empty or duplicate node name {name!r}")
        seen.add(name)
        values = {c: _int(path, line, row, c) for c in ("cpu_milli", "memory_mib", "gpu")}
        if min(values.values()) < 0:
            raise TraceError(f"{path}: line {line}: negative capacity")
        nodes.append(
            NodeSpec(
                name=name,
                cpu=values["cpu_milli"],
                memory=values["memory_mib"],
                gpus=values["gpu"],
                model=(row.get("model") or "").strip(),
                max_pods=max_pods,
            )
        )
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def pod_request(cpu: int, memory: int, num_gpu: int, gpu_milli: int, gpu_spec: str) -> GpuRequest:
    """The request of one trace pod (conversion rules in the module docstring)."""
    milli = min(gpu_milli, MILLI_PER_GPU) if gpu_milli > 0 else 0
    if num_gpu <= 0 or milli == 0:
        return GpuRequest(cpu=cpu, memory=memory)
    models = tuple(part for part in gpu_spec.split("|") if part)
    return GpuRequest(cpu=cpu, memory=memory, gpus=num_gpu, gpu_milli=milli, models=models)


def read_pods(path: Path) -> list[TracePod]:
    """Pods of an openb pod list, in file order."""
    pods = []
    seen: set[str] = set()
    for line, row in _rows(path, POD_COLUMNS):
        name = row["name"].strip()
        if not name or name in seen:
            raise TraceError(f"{path}: line {line}: column name: empty or duplicate pod name {name!r}")
        seen.add(name)
        values = {c: _int(path, line, row, c) for c in POD_COLUMNS[1:]}
        if values["cpu_milli"] < 0 or values["memory_mib"] < 0 or values["num_gpu"] < 0:
            raise TraceError(f"{path}: line {line}: negative request")
        request = pod_request(
            values["cpu_milli"],
            values["memory_mib"],
            values["num_gpu"],
            values["gpu_milli"],
            (row.get("gpu_spec") or "").strip(),
        )
        pods.append(TracePod(name, request))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def read_arrivals(path: Path, seed: int) -> list[str]:
    """Source pod names of one seed's arrival sequence, by position."""
    by_position: dict[int, str] = {}
    for line, row in _rows(path, ARRIVAL_COLUMNS):
        if _int(path, line, row, "seed") != seed:
            continue
        position = _int(path, line, row, "position")
        if position in by_position:
            raise TraceError(f"{path}: line {line}: duplicate position {position} for seed {seed}")
        by_position[position] = row["source_pod"].strip()
    if not by_position:
        raise TraceError(f"{path}: no arrivals for seed {seed}")
    if sorted(by_position) != list(range(len(by_position))):
        raise TraceError(f"{path}: positions of seed {seed} are not 0..{len(by_position) - 1}")
    return [by_position[p] for p in range(len(by_position))]


def read_node_names(path: Path, seed: int) -> dict[str, str]:
    """Simulator node name per node ``sn`` for one seed (ties go to the smallest name)."""
    names: dict[str, str] = {}
    for line, row in _rows(path, NODE_RANK_COLUMNS):
        if _int(path, line, row, "seed") != seed:
            continue
        names[row["node_sn"].strip()] = row["sim_node_name"].strip()
    if not names:
        raise TraceError(f"{path}: no node ranks for seed {seed}")
    return names
