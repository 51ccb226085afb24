"""The MultiKueue fleet as a manager cluster shows it: one line per worker, for the console's Fleet
panel and ``gpuplane why``'s Fleet section.

Everything comes from the manager's ``MultiKueueCluster`` objects (``kueue.x-k8s.io``,
cluster-scoped): the ``Active`` condition says whether the manager reaches the worker, and the
annotation ``gpuplane.dev/worker-summary`` that gpuplane's controller (``--multikueue``) refreshes
says the worker's quota, usage and workload counts (kueue #9988). A worker whose annotation is
missing (a manager run by Kueue itself, or not yet written) still shows its health.

Where a manager Workload runs: ``status.clusterName``, or the workers it is nominated to
(``status.nominatedClusterNames``) while it is being dispatched (:func:`placement_of`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.k8s.api import MULTIKUEUE_CLUSTERS, ApiError, KubeApi
from gpuplane.k8s.multikueue_fleet import SUMMARY_ANNOTATION
from gpuplane.k8s.multikueue_workers import WorkerSummary
from gpuplane.model.objects import Workload
from gpuplane.model.quantity import QuantityError, base_units_per_unit, parse_resource_quantity

# Answers that mean "no fleet here": the credentials may not list MultiKueueClusters (403), or
# the CRD is not installed (404).
NO_FLEET = frozenset((403, 404))


@dataclass(frozen=True, slots=True)
class ResourceLine:
    """One resource of a worker: what its admitted workloads use of its nominal quota."""

    resource: str
    used: str  # as the summary spells it; "0" when unused
    quota: str  # "-" when the worker has no quota of it


@dataclass(frozen=True, slots=True)
class FleetWorker:
    """One worker cluster (owns its name, its health as last written on the manager, and its
    summary: ``None`` when the controller has written none, or one that does not parse)."""

    name: str
    active: bool
    message: str
    summary: WorkerSummary | None

    @property
    def health(self) -> str:
        """``Active``, or ``Inactive: why``."""
        if self.active:
            return "Active"
        return f"Inactive: {self.message}" if self.message else "Inactive"

    @property
    def pending(self) -> int | None:
        return None if self.summary is None else self.summary.pending_workloads

    @property
    def admitted(self) -> int | None:
        return None if self.summary is None else self.summary.admitted_workloads

    def resources(self) -> tuple[ResourceLine, ...]:
        """Quota and usage per resource, in name order."""
        if self.summary is None:
            return ()
        quota, usage = self.summary.quota, self.summary.usage
        return tuple(
            ResourceLine(name, usage.get(name, "0"), quota.get(name, "-"))
            for name in sorted(set(quota) | set(usage))
        )

    def gpus(self, gpu_resources: Iterable[str]) -> tuple[float, float] | None:
        """GPUs used and nominal, summed over ``gpu_resources`` (whole-GPU resource names); ``None``
        without a summary, or with one that knows no quota (a worker not reached)."""
        if self.summary is None or not (self.summary.quota or self.summary.usage):
            return None
        names = set(gpu_resources)
        return _total(self.summary.usage, names), _total(self.summary.quota, names)

    def to_json(self) -> dict[str, Any]:
        """The worker's summary (``WorkerSummary.to_json``), its health from the Active condition."""
        base = (
            self.summary.to_json()
            if self.summary is not None
            else WorkerSummary(self.name, self.active, self.message, {}, {}, 0, 0).to_json()
        )
        return {**base, "cluster": self.name, "active": self.active, "message": self.message}


def _total(amounts: Mapping[str, str], names: set[str]) -> float:
    total = 0.0
    for name, text in amounts.items():
        if name not in names:
            continue
        try:
            total += parse_resource_quantity(name, text) / base_units_per_unit(name)
        except (QuantityError, ValueError):
            continue
    return total


def fleet_worker(obj: Mapping[str, Any]) -> FleetWorker:
    """One MultiKueueCluster object as the fleet shows it."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    summary: WorkerSummary | None = None
    text = (meta.get("annotations") or {}).get(SUMMARY_ANNOTATION)
    if text:
        try:
            data = json.loads(text)
            summary = WorkerSummary.from_json(data) if isinstance(data, dict) else None
        except (ValueError, TypeError, AttributeError):
            summary = None
    conditions = (obj.get("status") or {}).get("conditions") or []
    active = next((c for c in conditions if isinstance(c, dict) and c.get("type") == "Active"), None)
    if active is not None:
        up = active.get("status") == "True"
        message = str(active.get("message") or active.get("reason") or "")
    elif summary is not None:
        up, message = summary.active, summary.message
    else:
        up, message = False, "no Active condition yet"
    return FleetWorker(name, up, message, summary)


def fleet_of(objects: Sequence[Mapping[str, Any]]) -> tuple[FleetWorker, ...]:
    """The workers of these MultiKueueCluster objects, in name order."""
    return tuple(sorted((fleet_worker(o) for o in objects), key=lambda w: w.name))


def read_fleet(api: KubeApi) -> tuple[FleetWorker, ...]:
    """List the MultiKueueClusters; none (no error) when these credentials may not list them or the
    kind is not served. Other failures raise :class:`ApiError`."""
    try:
        items = api.list(MULTIKUEUE_CLUSTERS).get("items") or []
    except ApiError as err:
        if err.status in NO_FLEET:
            return ()
        raise
    return fleet_of(items)


def placement_of(wl: Workload) -> str:
    """Where a manager's Workload runs: its worker, ``nominated: a, b`` while it is being dispatched,
    or ``""`` for a workload MultiKueue does not handle."""
    if wl.cluster_name:
        return wl.cluster_name
    if wl.nominated_clusters:
        return "nominated: " + ", ".join(wl.nominated_clusters)
    return ""


def count(value: float) -> str:
    """A GPU count: integers plain, fractions to two decimals."""
    return str(round(value)) if abs(value - round(value)) < 1e-9 else f"{value:.2f}"
