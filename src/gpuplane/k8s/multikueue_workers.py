"""A MultiKueue manager's worker clusters: how each is reached, whether it is reachable, what it
holds of the manager's, and where a workload would fit there.

- :class:`WorkerLink` owns one worker's client (built from the kubeconfig its
  ``MultiKueueCluster`` names: a Secret of the controller's namespace, key ``kubeconfig``, or a path)
  and its connection state: connected, or lost since when. A worker counts as lost from the first
  failed request, not from when its workload was admitted.
- :func:`fit_views` answers the gpuplane dispatcher's question for a batch of workloads: on this
  worker, would each be admitted now (one scheduling pass over the worker's objects with the
  candidates added, in their order), and if not, when would it start (the ETA ``gpuplane why``
  gives). It reads the worker only; it writes nothing there.
"""

from __future__ import annotations

import base64
import binascii
import copy
import logging
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplane.core.session import config_from_kueue, schedule
from gpuplane.insight.dispatch import ClusterView
from gpuplane.insight.why import explain_all
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi, load_api_client
from gpuplane.k8s.clusterstate import read_cluster, typed
from gpuplane.k8s.multikueue_jobs import REMOTE_OWNER_RESOURCES
from gpuplane.k8s.multikueue_watch import WorkerWatch
from gpuplane.model import labels as keys
from gpuplane.model.conditions import condition_true
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects
from gpuplane.model.multikueue import KUBECONFIG_SECRET_KEY, LocationType, WorkerCluster
from gpuplane.model.quantity import format_quantity, parse_resource_quantity

log = logging.getLogger(__name__)

DEFAULT_WORKER_QPS = 100.0  # per worker: a dispatch is two creates and a few reads there
DEFAULT_WORKER_BURST = 200


@dataclass
class RemoteObjects:
    """What one worker holds of this manager's (by origin label): Workloads by key, and the jobs of
    each kind MultiKueue carries (:data:`~gpuplane.k8s.multikueue_jobs.REMOTE_OWNER_RESOURCES`),
    by kind, then key."""

    workloads: dict[str, dict[str, Any]]
    owners: dict[str, dict[str, dict[str, Any]]]


class WorkerLink:
    """One worker cluster's client and connection state (owns the client; the manager owns the
    links). ``lost_since``: the monotonic time of the first failure since the last success."""

    def __init__(  # noqa: PLR0913 - keyword-only: the rate limits, the clock and the watch's
        self,
        cluster: WorkerCluster,
        kubeconfig: str,
        *,
        qps: float = DEFAULT_WORKER_QPS,
        burst: int = DEFAULT_WORKER_BURST,
        clock: Callable[[], float],
        timeout: float = 5.0,
        origin: str = "multikueue",
        wake: threading.Event | None = None,
    ) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig
        self.clock = clock
        with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False) as handle:
            handle.write(kubeconfig)
            self._path = Path(handle.name)
        try:
            self.api = KubeApi(load_api_client(str(self._path)), timeout, qps=qps, burst=burst)
        finally:
            self._path.unlink(missing_ok=True)
        self.connected = False
        self.lost_since: float | None = clock()  # not reached yet
        self.message = "not contacted yet"
        # With ``wake`` (the manager's cache's change event), the worker is watched, not listed.
        self.watch = (
            WorkerWatch(self.api, origin, REMOTE_OWNER_RESOURCES, wake).start() if wake is not None else None
        )

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop()
        self.api.close()

    def observe(self, origin: str) -> RemoteObjects | None:
        """This manager's Workloads and jobs on the worker; None (and the link marked lost) when the
        worker does not answer. A watched worker answers a probe, and its objects come from the
        watch once it has listed (before that: None, the link not yet connected)."""
        if self.watch is not None:
            return self._watched()
        selector = f"{keys.MULTIKUEUE_ORIGIN_LABEL}={origin}"
        try:
            wls = self.api.list(k8s.WORKLOADS, labelSelector=selector).get("items") or []
            owners: dict[str, dict[str, dict[str, Any]]] = {}
            for res in REMOTE_OWNER_RESOURCES:
                try:
                    items = self.api.list(res, labelSelector=selector).get("items") or []
                except ApiError as err:
                    if not err.not_found:
                        raise
                    items = []  # the worker does not serve this kind (no JobSet CRD): it holds none
                owners[res.kind] = {_key(o): o for o in items}
        except (ApiError, OSError, ValueError) as err:
            self.lost(f"{type(err).__name__}: {err}".splitlines()[0][:300])
            return None
        except Exception as err:
            self.lost(f"{type(err).__name__}: {err}".splitlines()[0][:300])
            return None
        self.connected, self.lost_since, self.message = True, None, "connected"
        return RemoteObjects({_key(w): w for w in wls}, owners)

    def _watched(self) -> RemoteObjects | None:
        assert self.watch is not None
        try:
            self.api.request("GET", "/version")
        except Exception as err:
            self.lost(f"{type(err).__name__}: {err}".splitlines()[0][:300])
            return None
        if not self.watch.synced():
            self.connected, self.message = False, "reading the worker's objects"
            return None
        self.connected, self.lost_since, self.message = True, None, "connected"
        return RemoteObjects(*self.watch.copies())

    def lost(self, message: str) -> None:
        if self.connected or self.lost_since is None:
            self.lost_since = self.clock()
        self.connected = False
        self.message = message


def _key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def kubeconfig_text(cluster: WorkerCluster, secret: Mapping[str, Any] | None, namespace: str) -> str:
    """The kubeconfig text a MultiKueueCluster names: from its Secret (as read, None when missing)
    or its path. Raises InputError naming what is missing."""
    label = f"MultiKueueCluster/{cluster.name}"
    if cluster.location_type == LocationType.PATH:
        try:
            return Path(cluster.location).read_text()
        except OSError as err:
            raise InputError(f"cannot read the kubeconfig at {cluster.location}: {err}", obj=label) from None
    if secret is None:
        raise InputError(f"no Secret {namespace}/{cluster.location}", obj=label)
    data = (secret.get("data") or {}).get(KUBECONFIG_SECRET_KEY)
    if not data:
        raise InputError(
            f"Secret {namespace}/{cluster.location} has no key {KUBECONFIG_SECRET_KEY!r}", obj=label
        )
    try:
        return base64.b64decode(data).decode()
    except (binascii.Error, ValueError) as err:
        raise InputError(f"Secret {namespace}/{cluster.location}: {err}", obj=label) from None


def candidate_copy(wl: Mapping[str, Any]) -> dict[str, Any]:
    """A manager Workload as a fresh, queued Workload on a worker (no status, no uid)."""
    meta = wl.get("metadata") or {}
    return typed(
        {
            "metadata": {
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "labels": dict(meta.get("labels") or {}),
                "annotations": dict(meta.get("annotations") or {}),
                "creationTimestamp": meta.get("creationTimestamp"),
            },
            "spec": copy.deepcopy(wl.get("spec") or {}),
        },
        "Workload",
    )


def fit_views(
    link: WorkerLink,
    candidates: Sequence[Mapping[str, Any]],
    labels: Mapping[str, str],
    now: float,
    *,
    eta: bool = True,
) -> dict[str, ClusterView]:
    """Per candidate (``namespace/name``), how it would fare on ``link``'s worker now; with
    ``eta=False`` only whether it is admitted now (no predicted start for the others: the cheap
    question, asked first)."""
    name = link.cluster.name
    if not link.connected:
        return {_key(c): ClusterView(name, labels, active=False, note=link.message) for c in candidates}
    if link.watch is not None and link.watch.synced(state=True):
        objects = link.watch.objects()
    else:
        try:
            listed = read_cluster(link.api)
        except Exception as err:
            link.lost(f"{type(err).__name__}: {err}".splitlines()[0][:300])
            return {_key(c): ClusterView(name, labels, active=False, note=link.message) for c in candidates}
        objects = [typed(o, kind) for kind, items in listed.items() if kind != "Job" for o in items]
        objects = [o for o in objects if not (o["kind"] == "Workload" and condition_true(o, "Finished"))]
    present = {_key(o) for o in objects if o["kind"] == "Workload"}
    # A candidate whose copy already holds quota here is taken here (the plan admits only new ones).
    held = {_key(o) for o in objects if o["kind"] == "Workload" and condition_true(o, "QuotaReserved")}
    fresh = [candidate_copy(c) for c in candidates if _key(c) not in present]
    skipped: list[InputError] = []
    state = state_from_objects([*objects, *fresh], source=f"cluster {name}", skipped=skipped)
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, now, cycles=None)  # every candidate that fits now, in queue order
    admitted = {a.workload for a in plan.admitted}
    pending = {p.workload: p.message or p.reason for p in plan.pending}
    waits = {e.workload: e for e in explain_all(state, plan, now, config, diagnose=False)} if eta else {}
    refused = {f"{(e.obj or '').split('/', 1)[-1]}": e.message for e in skipped}
    out: dict[str, ClusterView] = {}
    for c in candidates:
        key = _key(c)
        if key in admitted or key in held:
            out[key] = ClusterView(name, labels, fits_now=True, start_in_seconds=0.0)
        elif key in waits:
            e = waits[key]
            out[key] = ClusterView(name, labels, start_in_seconds=e.eta.seconds, note=e.message or e.reason)
        elif key in refused or eta:
            out[key] = ClusterView(name, labels, note=refused.get(key) or "the worker cannot take it")
        else:
            said = pending.get(key, "")
            out[key] = ClusterView(
                name, labels, note=f"not admitted there now: {said}" if said else "not admitted there now"
            )
    return out


@dataclass(frozen=True)
class WorkerSummary:
    """What a manager shows of one worker (kueue #9988): reachable or not, and its ClusterQueues'
    nominal quota, admitted usage and workload counts, summed over its queues, per resource."""

    cluster: str
    active: bool
    message: str
    quota: Mapping[str, str]
    usage: Mapping[str, str]
    pending_workloads: int
    admitted_workloads: int

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "active": self.active,
            "message": self.message,
            "quota": dict(self.quota),
            "usage": dict(self.usage),
            "pendingWorkloads": self.pending_workloads,
            "admittedWorkloads": self.admitted_workloads,
        }

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> WorkerSummary:
        return WorkerSummary(
            str(data.get("cluster", "")),
            bool(data.get("active")),
            str(data.get("message", "")),
            {str(k): str(v) for k, v in (data.get("quota") or {}).items()},
            {str(k): str(v) for k, v in (data.get("usage") or {}).items()},
            int(data.get("pendingWorkloads") or 0),
            int(data.get("admittedWorkloads") or 0),
        )


def summarize(link: WorkerLink) -> WorkerSummary:
    """The worker's summary from its ClusterQueues (watched, or one list); an unreachable worker shows
    its error. A watched worker's Kueue Configuration is read again here too."""
    name = link.cluster.name
    if not link.connected:
        return WorkerSummary(name, False, link.message, {}, {}, 0, 0)
    try:
        if link.watch is not None and link.watch.synced(state=True):
            queues = link.watch.state.items("ClusterQueue")
            link.watch.refresh_kueue_config(link.api, link.clock())
        else:
            queues = link.api.list(k8s.CLUSTER_QUEUES).get("items") or []
    except Exception as err:
        link.lost(f"{type(err).__name__}: {err}".splitlines()[0][:300])
        return WorkerSummary(name, False, link.message, {}, {}, 0, 0)
    quota: dict[str, int] = {}
    usage: dict[str, int] = {}
    pending = admitted = 0
    for cq in queues:
        for group in (cq.get("spec") or {}).get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for res in flavor.get("resources") or []:
                    _add(quota, res.get("name"), res.get("nominalQuota"))
        status = cq.get("status") or {}
        for flavor in status.get("flavorsUsage") or []:
            for res in flavor.get("resources") or []:
                _add(usage, res.get("name"), res.get("total"))
        pending += int(status.get("pendingWorkloads") or 0)
        admitted += int(status.get("admittedWorkloads") or 0)
    return WorkerSummary(
        name,
        True,
        "connected",
        {r: format_quantity(r, v) for r, v in sorted(quota.items())},
        {r: format_quantity(r, v) for r, v in sorted(usage.items())},
        pending,
        admitted,
    )


def _add(totals: dict[str, int], resource: object, amount: object) -> None:
    if not isinstance(resource, str) or amount is None:
        return
    try:
        value = parse_resource_quantity(
            resource, amount if isinstance(amount, (str, int, float)) else str(amount)
        )
    except (InputError, ValueError):
        return
    totals[resource] = totals.get(resource, 0) + value
