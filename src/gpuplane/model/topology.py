"""A pod set's topology assignment (``status.admission.podSetAssignments[].topologyAssignment``).

Kueue's two served versions write it in two shapes:

* ``v1beta1``: ``levels`` and ``domains``, one ``{"values": [...], "count": n}`` per domain;
* ``v1beta2``: ``levels`` and ``slices``; a slice covers ``domainCount`` domains, and gives for each
  level either one ``universal`` value for all of them or ``individual`` values (``roots``, with an
  optional common ``prefix`` and ``suffix``), and the pods per domain as ``podCounts`` (``universal``
  or ``individual``).

:func:`topology_assignment` writes the shape of the Workload's API version, and
:func:`assigned_domains` reads either, so a driver never cares which one it meets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Domain = tuple[tuple[str, ...], int]  # values from the highest level to the lowest, and pod count


def topology_assignment(levels: Sequence[str], domains: Sequence[Domain], api_version: str) -> dict[str, Any]:
    """The ``topologyAssignment`` object for ``domains``, in the shape of ``api_version``."""
    if not api_version.endswith("/v1beta2"):
        return {
            "levels": list(levels),
            "domains": [{"values": list(values), "count": count} for values, count in domains],
        }
    if not domains:
        return {"levels": list(levels), "slices": []}
    per_level: list[dict[str, Any]] = []
    for level in range(len(levels)):
        values = [d[0][level] for d in domains]
        if len(set(values)) == 1:
            per_level.append({"universal": values[0]})
        else:
            per_level.append({"individual": {"roots": values}})
    counts = [count for _, count in domains]
    pod_counts: dict[str, Any] = {"universal": counts[0]} if len(set(counts)) == 1 else {"individual": counts}
    return {
        "levels": list(levels),
        "slices": [{"domainCount": len(domains), "valuesPerLevel": per_level, "podCounts": pod_counts}],
    }


def assigned_domains(assignment: Mapping[str, Any]) -> list[Domain]:
    """Every domain of a ``topologyAssignment`` of either shape, with its pod count."""
    out: list[Domain] = [
        (tuple(str(v) for v in domain.get("values") or []), int(domain.get("count", 0)))
        for domain in assignment.get("domains") or []
    ]
    for piece in assignment.get("slices") or []:
        size = int(piece.get("domainCount", 0))
        columns: list[list[str]] = []
        for level in piece.get("valuesPerLevel") or []:
            if "universal" in level:
                columns.append([str(level["universal"])] * size)
                continue
            individual = level.get("individual") or {}
            prefix, suffix = individual.get("prefix") or "", individual.get("suffix") or ""
            columns.append([f"{prefix}{root}{suffix}" for root in individual.get("roots") or []])
        counts = piece.get("podCounts") or {}
        if "universal" in counts:
            per_domain = [int(counts["universal"])] * size
        else:
            per_domain = [int(c) for c in counts.get("individual") or []]
        for i in range(size):
            values = tuple(column[i] for column in columns if i < len(column))
            out.append((values, per_domain[i] if i < len(per_domain) else 0))
    return out
