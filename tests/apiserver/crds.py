"""CustomResourceDefinition manifests for the kinds tests install: Kueue's API and the job frameworks.

These are small CRDs written for the double, not copies of the projects' own: each keeps the real group,
versions, kind, plural, scope and status subresource, with a schema that checks the object's shape
(``spec`` and ``status`` are objects) and keeps any fields inside them. Tests that need stricter schemas
pass their own ``schema``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

KUEUE_GROUP = "kueue.x-k8s.io"

OPEN_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
    },
}


def custom_resource_definition(
    group: str,
    kind: str,
    *,
    versions: Sequence[str] = ("v1",),
    storage: str | None = None,
    plural: str | None = None,
    namespaced: bool = True,
    status: bool = True,
    short_names: Iterable[str] = (),
    categories: Iterable[str] = (),
    schema: Mapping[str, Any] | None = None,
    printer_columns: Iterable[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """An ``apiextensions.k8s.io/v1`` CRD serving ``kind`` at every version in ``versions``.

    ``plural`` defaults to the lowercased kind plus "s"; ``storage`` to the first version.
    """
    plural = plural or f"{kind.lower()}s"
    storage = storage or versions[0]
    subresources: dict[str, Any] = {"status": {}} if status else {}
    names: dict[str, Any] = {
        "kind": kind,
        "listKind": f"{kind}List",
        "plural": plural,
        "singular": kind.lower(),
    }
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": version == storage,
                    "schema": {"openAPIV3Schema": copy.deepcopy(dict(schema or OPEN_SCHEMA))},
                    "subresources": copy.deepcopy(subresources),
                    "additionalPrinterColumns": [dict(c) for c in printer_columns],
                }
                for version in versions
            ],
        },
    }


# kind, plural, namespaced, status subresource, short names
_KUEUE_KINDS = (
    ("ClusterQueue", "clusterqueues", False, True, ("cq",)),
    ("LocalQueue", "localqueues", True, True, ("queue", "queues", "lq")),
    ("ResourceFlavor", "resourceflavors", False, False, ("flavor", "flavors", "rf")),
    ("Workload", "workloads", True, True, ("wl",)),
    ("Cohort", "cohorts", False, True, ()),
    ("WorkloadPriorityClass", "workloadpriorityclasses", False, False, ()),
    ("Topology", "topologies", False, False, ()),
)


def kueue_crds(versions: Sequence[str] = ("v1beta2",)) -> list[dict[str, Any]]:
    """Kueue's API: ClusterQueue, LocalQueue, ResourceFlavor, Workload, Cohort, WorkloadPriorityClass and
    Topology."""
    return [
        custom_resource_definition(
            KUEUE_GROUP,
            kind,
            versions=versions,
            storage=versions[-1],
            plural=plural,
            namespaced=namespaced,
            status=status,
            short_names=short,
            categories=("kueue",),
        )
        for kind, plural, namespaced, status, short in _KUEUE_KINDS
    ]


def job_framework_crds() -> list[dict[str, Any]]:
    """JobSet, Kubeflow PyTorchJob and TrainJob, KubeRay RayJob and LeaderWorkerSet."""
    return [
        custom_resource_definition("jobset.x-k8s.io", "JobSet", versions=("v1alpha2",)),
        custom_resource_definition("kubeflow.org", "PyTorchJob", versions=("v1",)),
        custom_resource_definition("trainer.kubeflow.org", "TrainJob", versions=("v1alpha1",)),
        custom_resource_definition("ray.io", "RayJob", versions=("v1",)),
        custom_resource_definition(
            "leaderworkerset.x-k8s.io", "LeaderWorkerSet", versions=("v1",), short_names=("lws",)
        ),
    ]
