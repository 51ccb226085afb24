"""The cluster's objects as ``gpuplane schedule`` reads them, from an informer cache or a live list.

:func:`state_objects` picks, from objects by kind, what the core decides on: queues, flavors,
cohorts, priority classes, topologies, Nodes and Namespaces, Kueue's Configuration (from its
ConfigMap, :mod:`gpuplane.k8s.kueue_config`), the DRA objects; every Workload not finished; the pods
bound to a node and not terminated (they hold devices); and, with ``unqueued_jobs``, each queued
batch Job that has no Workload yet (the loader derives the Workload the controller would create).

:func:`read_cluster` lists those kinds from an API server with GET requests only, so a dry run
(``gpuplane schedule --kubeconfig``, ``gpuplane dump``) changes nothing in the cluster.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError, KubeApi, Resource, load_api_client
from gpuplane.k8s.informer import without_managed_fields
from gpuplane.k8s.kueue_config import (
    CONFIG_KIND,
    DEFAULT_SOURCE,
    KueueConfigError,
    KueueConfigSource,
    read_configuration,
)
from gpuplane.model import labels as keys
from gpuplane.model.conditions import condition_true
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects

log = logging.getLogger(__name__)

Items = Callable[[str], list[dict[str, Any]]]
FORBIDDEN = 403  # the credentials may not read it

# What a decision reads, in the order a state file lists it.
READ = (
    k8s.NAMESPACES,
    k8s.NODES,
    k8s.RESOURCE_FLAVORS,
    k8s.COHORTS,
    k8s.CLUSTER_QUEUES,
    k8s.LOCAL_QUEUES,
    k8s.PRIORITY_CLASSES,
    k8s.TOPOLOGIES,
    k8s.ADMISSION_CHECKS,
    k8s.NODE_POOLS,
    k8s.DEVICE_CLASSES,
    k8s.RESOURCE_SLICES,
    k8s.RESOURCE_CLAIM_TEMPLATES,
    k8s.RESOURCE_CLAIMS,
    k8s.DEVICE_TAINT_RULES,
    k8s.WORKLOADS,
    k8s.JOBS,
    k8s.PODS,
)
# Dynamic Resource Allocation (resource.k8s.io/v1): a cluster that does not serve it lists none;
# the controller watches them too (gpuplane.k8s.dra_claims.DRA_RESOURCES).
DRA_READ = (
    k8s.DEVICE_CLASSES,
    k8s.RESOURCE_SLICES,
    k8s.RESOURCE_CLAIM_TEMPLATES,
    k8s.RESOURCE_CLAIMS,
    k8s.DEVICE_TAINT_RULES,
)
# What `gpuplane doctor` checks: the nodes and the queueing objects, in the same order.
CHECKED = tuple(
    res
    for res in READ
    if res not in (k8s.PRIORITY_CLASSES, k8s.ADMISSION_CHECKS, k8s.JOBS, k8s.PODS, *DRA_READ)
)
# What the controller (and the console on a live cluster) watches to keep its view of the cluster;
# the job kinds it integrates come on top.
STATE_RESOURCES = (
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
    k8s.ADMISSION_CHECKS,
)
_PLAIN_KINDS: tuple[str, ...] = ("Namespace", "Node", "ResourceFlavor", "Cohort", "ClusterQueue")
_PLAIN_KINDS += ("LocalQueue", "WorkloadPriorityClass", "Topology", "AdmissionCheck", "NodePool")
_PLAIN_KINDS += tuple(res.kind for res in DRA_READ)
# Kueue's Configuration, read from its ConfigMap (gpuplane.k8s.kueue_config): at most one.
_PLAIN_KINDS += (CONFIG_KIND,)
_VERSIONS = {res.kind: res.api_version for res in READ}


def typed(obj: dict[str, Any], kind: str) -> dict[str, Any]:
    """``obj`` as a state-file document: its ``kind``, and its ``apiVersion`` where a list left it out."""
    return {**obj, "kind": kind, "apiVersion": obj.get("apiVersion") or _VERSIONS[kind]}


def state_objects(items: Items, *, unqueued_jobs: bool = False) -> list[dict[str, Any]]:
    """The objects of a cluster state (kind and apiVersion set on each) from ``items(kind)``."""
    objects = [typed(obj, kind) for kind in _PLAIN_KINDS for obj in items(kind)]
    workloads = [wl for wl in items("Workload") if not condition_true(wl, "Finished")]
    objects += [typed(wl, "Workload") for wl in workloads]
    if unqueued_jobs:
        owned = {
            (wl.get("metadata", {}).get("labels") or {}).get(keys.JOB_UID_LABEL) for wl in items("Workload")
        }
        for job in items("Job"):
            meta = job.get("metadata", {})
            queued = keys.QUEUE_NAME_LABEL in (meta.get("labels") or {})
            if queued and jobs.is_suspended("Job", job) and meta.get("uid") not in owned:
                objects.append(typed(job, "Job"))
    objects += [
        typed(pod, "Pod")
        for pod in items("Pod")
        if (pod.get("spec") or {}).get("nodeName")
        and (pod.get("status") or {}).get("phase") in (None, "Pending", "Running")
    ]
    return objects


def read_cluster(
    api: KubeApi,
    *,
    namespace: str | None = None,
    unreadable: list[str] | None = None,
    kueue_config: KueueConfigSource = DEFAULT_SOURCE,
    problems: list[InputError] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Every object of the kinds in :data:`READ`, by kind, listed once (a kind that is not served,
    e.g. a Kueue CRD that is not installed, is empty), and Kueue's Configuration from the ConfigMap
    ``kueue_config`` names (kind :data:`CONFIG_KIND`: none when there is no such ConfigMap; a
    malformed one is left out, its error appended to ``problems``, else logged). Only GET requests.

    With ``unreadable`` (a list to fill), credentials that may not list a kind cluster-wide (403) do
    not fail the read: a namespaced kind is listed in ``namespace`` alone, the Namespace object is
    read by name, and what still cannot be read counts as empty (a Namespace as one without labels)
    and is named in ``unreadable`` (``nodes``, ``pods in team-a``). Without it a 403 is raised.
    """
    listed: dict[str, list[dict[str, Any]]] = {}
    for res in READ:
        try:
            listed[res.kind] = _list(api, res)
        except ApiError as err:
            if err.status != FORBIDDEN or unreadable is None:
                raise
            listed[res.kind] = _readable_part(api, res, namespace, unreadable)
    listed[CONFIG_KIND] = _kueue_configuration(api, kueue_config, problems)
    return listed


def _kueue_configuration(
    api: KubeApi, source: KueueConfigSource, problems: list[InputError] | None
) -> list[dict[str, Any]]:
    try:
        doc = read_configuration(api, source)
    except KueueConfigError as err:
        if problems is None:
            log.warning("ignoring Kueue's configuration: %s", err)
        else:
            problems.append(err)
        return []
    return [] if doc is None else [doc]


def _readable_part(
    api: KubeApi, res: Resource, namespace: str | None, unreadable: list[str]
) -> list[dict[str, Any]]:
    """What of ``res`` a namespace-scoped user may read, after a cluster-wide list was refused."""
    try:
        if res.namespaced and namespace:
            return list(api.list(res, namespace).get("items", []))
        if res is k8s.NAMESPACES and namespace:
            return [api.get(res, namespace)]
    except ApiError as err:
        if err.status not in (FORBIDDEN, 404):
            raise
    if res is k8s.NAMESPACES and namespace:
        unreadable.append(f"namespace {namespace} (its labels)")
        return [{"metadata": {"name": namespace}}]
    unreadable.append(f"{res.plural} in {namespace}" if res.namespaced and namespace else res.plural)
    return []


def _list(api: KubeApi, res: Resource) -> list[dict[str, Any]]:
    try:
        return list(api.list(res).get("items", []))
    except ApiError as err:
        if err.not_found:
            return []
        raise


def live_objects(api: KubeApi, left_out: list[InputError] | None = None) -> list[dict[str, Any]]:
    """The cluster state as the API server holds it now (:func:`read_cluster`, then
    :func:`state_objects` with the queued Jobs that have no Workload yet), without managedFields.

    An object the loader refuses (a LocalQueue whose ClusterQueue is gone, say, in a namespace being
    deleted) is left out, and so is what only it made valid, so the objects always make a state that
    ``gpuplane schedule -f`` accepts; the problems are appended to ``left_out``.
    """
    configuration: list[InputError] = []
    listed = read_cluster(api, problems=configuration)
    if left_out is not None:
        left_out += configuration
    objects = state_objects(lambda kind: listed.get(kind, []), unqueued_jobs=True)
    for obj in objects:
        without_managed_fields(obj)
    while True:
        skipped: list[InputError] = []
        state_from_objects(objects, skipped=skipped)
        refused = {problem.document for problem in skipped if problem.document is not None}
        if left_out is not None:
            left_out += skipped
        if not refused:
            return objects
        objects = [obj for i, obj in enumerate(objects) if i not in refused]


def read_live(
    kubeconfig: str | None, context: str | None, left_out: list[InputError]
) -> list[dict[str, Any]]:
    """:func:`live_objects` of the cluster ``kubeconfig`` and ``context`` name, through a client made
    for this one read and closed after it. A cluster that cannot be reached or read raises what the
    client raised."""
    api = KubeApi(load_api_client(kubeconfig, context))
    try:
        return live_objects(api, left_out)
    finally:
        api.api_client.close()  # type: ignore[no-untyped-call]  # the client ships no annotations here
