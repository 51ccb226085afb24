"""Kueue's MultiKueue objects, as a manager cluster holds them.

- A ``MultiKueueCluster`` (cluster-scoped) names how to reach one worker: a kubeconfig in a
  Secret of the controller's namespace (key ``kubeconfig``) or at a path on the controller's disk.
  ``v1beta2`` puts it under ``spec.clusterSource.kubeConfig``, ``v1beta1`` under
  ``spec.kubeConfig``; both read the same.
- A ``MultiKueueConfig`` (cluster-scoped) lists the workers that a MultiKueue AdmissionCheck
  dispatches to, most preferred first (the Incremental dispatcher follows that order).
- An ``AdmissionCheck`` with ``controllerName: kueue.x-k8s.io/multikueue`` names its config in
  ``spec.parameters`` (``kind: MultiKueueConfig``).

The parsers raise :class:`~gpuplane.model.errors.InputError` naming the object and the field, so
one malformed object is reported and the others keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuplane.model.errors import InputError
from gpuplane.model.labels import MULTIKUEUE_CONTROLLER

__all__ = [
    "KUBECONFIG_SECRET_KEY",
    "MULTIKUEUE_CONTROLLER",
    "LocationType",
    "MultiKueueConfig",
    "WorkerCluster",
    "config_of_check",
    "parse_config",
    "parse_worker_cluster",
]

KUBECONFIG_SECRET_KEY = "kubeconfig"


class LocationType(StrEnum):
    """Where a worker's kubeconfig is: a Secret of the controller's namespace, or a file path."""

    SECRET = "Secret"
    PATH = "Path"


@dataclass(frozen=True, slots=True)
class WorkerCluster:
    """One ``MultiKueueCluster``: its name and where its kubeconfig is."""

    name: str
    location: str
    location_type: LocationType = LocationType.SECRET


@dataclass(frozen=True, slots=True)
class MultiKueueConfig:
    """One ``MultiKueueConfig``: the workers it dispatches to, most preferred first."""

    name: str
    clusters: tuple[str, ...]


def _name(obj: Mapping[str, Any], kind: str) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not isinstance(name, str) or not name:
        raise InputError("metadata.name is missing", obj=kind, field="metadata.name")
    return name


def parse_worker_cluster(obj: Mapping[str, Any]) -> WorkerCluster:
    """A ``MultiKueueCluster`` of either served version."""
    name = _name(obj, "MultiKueueCluster")
    label = f"MultiKueueCluster/{name}"
    spec = obj.get("spec") or {}
    source = spec.get("clusterSource") or {}
    kubeconfig = source.get("kubeConfig") if isinstance(source, Mapping) else None
    where = "spec.clusterSource.kubeConfig"
    if kubeconfig is None and "kubeConfig" in spec:
        kubeconfig, where = spec.get("kubeConfig"), "spec.kubeConfig"
    if isinstance(source, Mapping) and source.get("clusterProfileRef") and kubeconfig is None:
        raise InputError(
            "clusterProfileRef is not supported; give a kubeConfig (a Secret or a Path)",
            obj=label,
            field="spec.clusterSource.clusterProfileRef",
        )
    if not isinstance(kubeconfig, Mapping):
        raise InputError("no kubeConfig: say where the worker's kubeconfig is", obj=label, field=where)
    location = kubeconfig.get("location")
    if not isinstance(location, str) or not location:
        raise InputError("location is missing", obj=label, field=f"{where}.location")
    raw_type = kubeconfig.get("locationType") or LocationType.SECRET.value
    try:
        location_type = LocationType(raw_type)
    except ValueError:
        raise InputError(
            f"locationType {raw_type!r} is neither Secret nor Path", obj=label, field=f"{where}.locationType"
        ) from None
    return WorkerCluster(name, location, location_type)


def parse_config(obj: Mapping[str, Any]) -> MultiKueueConfig:
    """A ``MultiKueueConfig``: its workers in order, each named once."""
    name = _name(obj, "MultiKueueConfig")
    clusters = (obj.get("spec") or {}).get("clusters") or []
    if not isinstance(clusters, list) or not all(isinstance(c, str) and c for c in clusters):
        raise InputError(
            "clusters must be a list of MultiKueueCluster names",
            obj=f"MultiKueueConfig/{name}",
            field="spec.clusters",
        )
    if len(set(clusters)) != len(clusters):
        raise InputError("a cluster is listed twice", obj=f"MultiKueueConfig/{name}", field="spec.clusters")
    return MultiKueueConfig(name, tuple(clusters))


def config_of_check(check: Mapping[str, Any]) -> str | None:
    """The MultiKueueConfig an AdmissionCheck names, or None when it is not a MultiKueue check.

    A MultiKueue check without MultiKueueConfig parameters is an error naming the check."""
    spec = check.get("spec") or {}
    if spec.get("controllerName") != MULTIKUEUE_CONTROLLER:
        return None
    name = _name(check, "AdmissionCheck")
    params = spec.get("parameters") or {}
    if params.get("kind") != "MultiKueueConfig" or not params.get("name"):
        raise InputError(
            "a MultiKueue check needs parameters of kind MultiKueueConfig with a name",
            obj=f"AdmissionCheck/{name}",
            field="spec.parameters",
        )
    return str(params["name"])
