"""Read a cluster's state once from the API server, for the commands that explain it.

``read_state(api)`` lists every object the core decides on and returns the same frozen
:class:`~gpuplane.model.objects.ClusterState` the loader builds from files. Unlike the
controller's snapshot it keeps finished Workloads (their runtimes teach the ETA) and every
pod (``gpuplane why pod/NAME`` looks pending pods up). A kind whose CRD is not installed
counts as empty; an object the loader refuses is skipped and reported in ``skipped``.
"""

from __future__ import annotations

from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects
from gpuplane.model.objects import ClusterState

READ_RESOURCES = (
    k8s.NAMESPACES,
    k8s.NODES,
    k8s.PODS,
    k8s.CLUSTER_QUEUES,
    k8s.LOCAL_QUEUES,
    k8s.RESOURCE_FLAVORS,
    k8s.COHORTS,
    k8s.WORKLOADS,
    k8s.PRIORITY_CLASSES,
    k8s.TOPOLOGIES,
)


def read_objects(api: KubeApi) -> list[dict[str, Any]]:
    """Every object of :data:`READ_RESOURCES`, with ``kind`` and ``apiVersion`` filled in."""
    objects: list[dict[str, Any]] = []
    for res in READ_RESOURCES:
        try:
            listed = api.list(res)
        except ApiError as err:
            if err.not_found:  # the CRD is not installed: no such objects
                continue
            raise
        objects.extend(
            {**item, "kind": res.kind, "apiVersion": item.get("apiVersion") or res.api_version}
            for item in listed.get("items", [])
        )
    return objects


def read_state(api: KubeApi, skipped: list[InputError] | None = None) -> ClusterState:
    """The cluster's state as the core sees it (see the module docstring).

    A live cluster always holds some object the loader refuses (a LocalQueue whose ClusterQueue
    was just deleted): it is left out, as the controller leaves it out, and added to ``skipped``.
    """
    return state_from_objects(read_objects(api), source="cluster", skipped=[] if skipped is None else skipped)
