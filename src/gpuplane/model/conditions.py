"""Workload status conditions: Kueue's condition types, and building and merging condition lists.

Every driver that writes a Workload condition builds it with :func:`condition` and merges it with
:func:`with_conditions`, so the spellings and the shape live in one place. Which conditions are
True in each state of a workload's life is the core's (``gpuplane.core.lifecycle.CONDITIONS``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from enum import StrEnum
from typing import Any


class ConditionType(StrEnum):
    """Kueue's Workload condition types (``status.conditions[].type``)."""

    QUOTA_RESERVED = "QuotaReserved"
    ADMITTED = "Admitted"
    PODS_READY = "PodsReady"
    EVICTED = "Evicted"
    PREEMPTED = "Preempted"
    REQUEUED = "Requeued"
    FINISHED = "Finished"


def condition(
    ctype: ConditionType, reason: str, now: str, message: str = "", *, status: bool = True
) -> dict[str, str]:
    """One Workload condition as the API writes it (``status.conditions[]``).

    ``reason`` is a ``gpuplane.core.lifecycle.Reason`` member (or a reason the core reported, which
    is one); ``now`` is the ``lastTransitionTime`` already formatted by the driver, whose clock it is.
    """
    return {
        "type": ctype,
        "status": "True" if status else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def with_conditions(
    conditions: Iterable[Mapping[str, Any]], *new: Mapping[str, Any], drop: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """``conditions`` without those of the types in ``new`` or ``drop``, then ``new`` appended.

    The order of the kept conditions is unchanged; the input is not modified. As Kubernetes does
    when it sets a condition, a new condition whose status equals the one it replaces keeps that
    one's ``lastTransitionTime``: only a change of status is a transition (a new reason or message
    is not).
    """
    old = {c.get("type"): c for c in conditions}
    replaced = {c["type"] for c in new} | set(drop)
    kept = [dict(c) for c in conditions if c.get("type") not in replaced]
    return kept + [_keep_transition_time(dict(c), old.get(c["type"])) for c in new]


def _keep_transition_time(condition: dict[str, Any], before: Mapping[str, Any] | None) -> dict[str, Any]:
    if before is None or before.get("status") != condition.get("status"):
        return condition  # new, or a change of status: a transition now
    if before.get("lastTransitionTime"):
        condition["lastTransitionTime"] = before["lastTransitionTime"]
    return condition


def condition_true(obj: Mapping[str, Any], ctype: str) -> bool:
    """Whether the object's ``status.conditions`` has ``ctype`` with status ``"True"``."""
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )
