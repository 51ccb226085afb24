"""Server-side printing: ``meta.k8s.io/v1 Table`` answers for clients that ask (``kubectl get``).

Columns follow what a real server prints for each kind, reduced to the common ones; custom resources get
their CRD's ``additionalPrinterColumns`` (simple ``.a.b`` JSON paths) and an Age column. Ages are
measured on the double's virtual clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from .resources import ResourceType
from .store import parse_timestamp

Obj = Mapping[str, Any]
Column = tuple[str, str, int, Callable[[Obj, datetime], Any]]  # name, type, priority, cell


def age(obj: Obj, now: datetime) -> str:
    created = (obj.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return "<unknown>"
    seconds = max(0, int((now - parse_timestamp(created)).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _name(obj: Obj, _now: datetime) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _path(path: str) -> Callable[[Obj, datetime], Any]:
    parts = [p for p in path.strip().lstrip(".").split(".") if p]

    def cell(obj: Obj, _now: datetime) -> Any:
        node: Any = obj
        for part in parts:
            node = node.get(part) if isinstance(node, Mapping) else None
        return node if isinstance(node, str | int | float | bool) else ("" if node is None else str(node))

    return cell


def _pod_ready(pod: Obj, _now: datetime) -> str:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    return f"{ready}/{len((pod.get('spec') or {}).get('containers') or [])}"


def _pod_status(pod: Obj, _now: datetime) -> str:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    return str(status.get("reason") or status.get("phase") or "Pending")


def _pod_restarts(pod: Obj, _now: datetime) -> int:
    return sum(
        int(s.get("restartCount", 0)) for s in (pod.get("status") or {}).get("containerStatuses") or []
    )


def _node_status(node: Obj, _now: datetime) -> str:
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    state = (
        "Ready" if ready is not None and ready.get("status") == "True" else "NotReady" if ready else "Unknown"
    )
    if (node.get("spec") or {}).get("unschedulable"):
        state += ",SchedulingDisabled"
    return state


def _node_roles(node: Obj, _now: datetime) -> str:
    labels = (node.get("metadata") or {}).get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/"))
    return ",".join(roles) or "<none>"


def _job_status(job: Obj, _now: datetime) -> str:
    conditions = (job.get("status") or {}).get("conditions") or []
    for kind in ("Complete", "Failed", "Suspended"):
        if any(c.get("type") == kind and c.get("status") == "True" for c in conditions):
            return kind
    return "Running" if (job.get("status") or {}).get("active") else "Pending"


def _job_completions(job: Obj, _now: datetime) -> str:
    wanted = (job.get("spec") or {}).get("completions")
    done = (job.get("status") or {}).get("succeeded", 0)
    return f"{done}/{wanted if wanted is not None else 1}"


_AGE: Column = ("Age", "string", 0, age)
_COLUMNS: dict[str, list[Column]] = {
    "Pod": [
        ("Name", "string", 0, _name),
        ("Ready", "string", 0, _pod_ready),
        ("Status", "string", 0, _pod_status),
        ("Restarts", "integer", 0, _pod_restarts),
        _AGE,
        ("IP", "string", 1, _path("status.podIP")),
        ("Node", "string", 1, _path("spec.nodeName")),
    ],
    "Node": [
        ("Name", "string", 0, _name),
        ("Status", "string", 0, _node_status),
        ("Roles", "string", 0, _node_roles),
        _AGE,
        ("Version", "string", 0, _path("status.nodeInfo.kubeletVersion")),
    ],
    "Namespace": [("Name", "string", 0, _name), ("Status", "string", 0, _path("status.phase")), _AGE],
    "Job": [
        ("Name", "string", 0, _name),
        ("Status", "string", 0, _job_status),
        ("Completions", "string", 0, _job_completions),
        _AGE,
    ],
}


def _columns(rt: ResourceType) -> list[Column]:
    if rt.kind in _COLUMNS:
        return _COLUMNS[rt.kind]
    columns: list[Column] = [("Name", "string", 0, _name)]
    columns.extend(
        (
            str(spec["name"]),
            str(spec.get("type", "string")),
            int(spec.get("priority", 0)),
            _path(str(spec["jsonPath"])),
        )
        for spec in rt.printer_columns
        if spec.get("name") and spec.get("jsonPath")
    )
    if not any(c[0] == "Age" for c in columns):
        columns.append(_AGE)
    return columns


def table(
    rt: ResourceType, objects: Sequence[Obj], now: datetime, *, include: str, list_meta: Mapping[str, Any]
) -> dict[str, Any]:
    """A Table of ``objects``; ``include`` is the includeObject parameter (None, Metadata or Object)."""
    columns = _columns(rt)
    rows = []
    for obj in objects:
        row: dict[str, Any] = {"cells": [cell(obj, now) for _, _, _, cell in columns]}
        if include == "Object":
            row["object"] = obj
        elif include != "None":
            row["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj.get("metadata", {}),
            }
        rows.append(row)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": dict(list_meta),
        "columnDefinitions": [
            {
                "name": name,
                "type": kind,
                "format": "name" if name == "Name" else "",
                "description": name,
                "priority": priority,
            }
            for name, kind, priority, _ in columns
        ],
        "rows": rows,
    }
