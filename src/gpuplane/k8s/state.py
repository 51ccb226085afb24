"""Read a cluster's state once from the API server, for the commands that explain it.

``read_state(api)`` lists every object the core decides on (the kinds of
:data:`gpuplane.k8s.clusterstate.READ`, with the same GET-only listing) and returns the same frozen
:class:`~gpuplane.model.objects.ClusterState` the loader builds from files. Unlike the
controller's snapshot it keeps finished Workloads (their runtimes teach the ETA) and every
pod (``gpuplane why pod/NAME`` looks pending pods up), and it derives no Workload from a Job. A kind
whose CRD is not installed counts as empty; an object the loader refuses is skipped and reported in
``skipped``. Credentials scoped to one namespace read what they may (``namespace``, ``unreadable``).

``read_runtime_history(api)`` reads what the controller learned from the Workloads it saw finish
(:mod:`gpuplane.k8s.runtime_store`), for the ETA of the commands that read a live cluster.
"""

from __future__ import annotations

import logging
from typing import Any

from gpuplane.insight.runtime_history import RuntimeSample
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.clusterstate import READ, read_cluster, typed
from gpuplane.k8s.kueue_config import CONFIG_KIND
from gpuplane.k8s.runtime_store import CONFIG_MAP_NAME, DATA_KEY, HistoryFormatError, decode
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects
from gpuplane.model.objects import ClusterState

log = logging.getLogger(__name__)

CONTROLLER_NAMESPACE = "gpuplane-system"  # where the controller keeps its Lease and its history

# Jobs are read only to derive the Workload of a queued one; here every Workload already exists.
READ_KINDS = tuple(res.kind for res in READ if res.kind != "Job")


def read_objects(
    api: KubeApi, *, namespace: str | None = None, unreadable: list[str] | None = None
) -> list[dict[str, Any]]:
    """Every object of :data:`READ_KINDS`, with ``kind`` and ``apiVersion`` filled in; with
    ``unreadable``, what the credentials may read (see :func:`read_cluster`)."""
    listed = read_cluster(api, namespace=namespace, unreadable=unreadable)
    return [typed(obj, kind) for kind in (*READ_KINDS, CONFIG_KIND) for obj in listed[kind]]


def read_state(
    api: KubeApi,
    skipped: list[InputError] | None = None,
    *,
    namespace: str | None = None,
    unreadable: list[str] | None = None,
) -> ClusterState:
    """The cluster's state as the core sees it (see the module docstring).

    A live cluster always holds some object the loader refuses (a LocalQueue whose ClusterQueue
    was just deleted): it is left out, as the controller leaves it out, and added to ``skipped``.
    """
    objects = read_objects(api, namespace=namespace, unreadable=unreadable)
    return state_from_objects(objects, source="cluster", skipped=[] if skipped is None else skipped)


def read_runtime_history(api: KubeApi, namespace: str = CONTROLLER_NAMESPACE) -> tuple[RuntimeSample, ...]:
    """The runtime history the controller keeps in ``namespace`` (its ConfigMap
    ``gpuplane-runtime-history``), oldest first. Empty when there is none, when these credentials
    may not read it, or when it cannot be read (logged at debug level: the ETA then learns from the
    finished Workloads it can see)."""
    try:
        obj = api.get(k8s.CONFIG_MAPS, CONFIG_MAP_NAME, namespace)
    except ApiError as err:
        log.debug("no runtime history from %s/%s: %s", namespace, CONFIG_MAP_NAME, err)
        return ()
    text = (obj.get("data") or {}).get(DATA_KEY)
    if text is None:
        return ()
    try:
        entries = decode(text)
    except HistoryFormatError as err:
        log.debug("runtime history %s/%s not readable: %s", namespace, CONFIG_MAP_NAME, err)
        return ()
    return tuple(sorted(entries.values(), key=lambda s: s.finished_at))
