"""The reaper's view of the cluster: pods holding accelerators, their owners, queues, and the writes.

Reads and writes go through the project's client wrapper (:class:`gpuplane.kube.client.KubeApi`)
as plain dicts; a kind is found by API discovery (its plural and scope), so any owner kind is read
the same way. A kind the server does not serve (no Notebook CRD, no Kueue) reads as absent, never as
an error. Every write is idempotent: applying the same decision twice leaves the same objects.

With ``watch=True`` (the long-running reaper) reads come from an informer cache
(:mod:`gpuplane.reaper.watched`): each kind is listed once and then watched, so a pass makes no API
call per pod; only the writes it decides on reach the server.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client import ApiClient

from gpuplane.core.session import DeviceConfig
from gpuplane.insight import idle
from gpuplane.kube.client import ApiError, KubeApi, Resource
from gpuplane.model import labels as keys
from gpuplane.reaper.watched import WatchedKinds

log = logging.getLogger(__name__)

QUEUE_LABEL = keys.QUEUE_NAME_LABEL
JOB_UID_LABEL = keys.JOB_UID_LABEL
KUEUE_V1BETA2 = "kueue.x-k8s.io/v1beta2"
NOTEBOOK_API = "kubeflow.org/v1"
NOTEBOOK_STOPPED = "kubeflow-resource-stopped"
REPLICAS_ANNOTATION = keys.REPLICAS_BEFORE_RECLAIM_ANNOTATION
JUPYTERHUB_COMPONENT = "singleuser-server"  # zero-to-jupyterhub's label component=singleuser-server
COMPONENT = "gpuplane-reaper"
ABSENT_RECHECK_SECONDS = 60.0  # a kind the server did not serve is looked up again after this

# Accelerators the scheduler's device configuration does not describe, which a pod may still hold
# (and leave idle): counted too.
OTHER_ACCELERATORS = ("habana.ai/", "google.com/tpu")


def accelerator_prefixes(
    devices: DeviceConfig, others: tuple[str, ...] = OTHER_ACCELERATORS
) -> tuple[str, ...]:
    """Resource-name prefixes counted as GPUs: the device configuration's whole devices (their shared
    replicas with them) and MIG instances (each instance is one device), and ``others``."""
    return (*devices.whole_resources, devices.mig_prefix, *others)


ACCELERATOR_PREFIXES = accelerator_prefixes(DeviceConfig())


def pod_gpus(pod: Mapping[str, Any], prefixes: tuple[str, ...] = ACCELERATOR_PREFIXES) -> int:
    """Accelerator devices the pod holds: the sum over its containers of the limits (or requests)
    whose resource name starts with one of ``prefixes``."""
    total = 0
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        amounts = resources.get("limits") or resources.get("requests") or {}
        for name, value in amounts.items():
            if name.startswith(prefixes):
                try:
                    total += int(str(value))
                except ValueError:
                    continue
    return total


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    found = obj.get("metadata")
    return found if isinstance(found, Mapping) else {}


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(meta(obj).get("annotations") or {})


def labels_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(meta(obj).get("labels") or {})


@dataclass(frozen=True, slots=True)
class Owner:
    """What a reclaim acts on: the topmost controller of a pod that the reaper knows (or the pod)."""

    kind: str
    api_version: str
    name: str
    namespace: str
    obj: Mapping[str, Any]
    stub: bool = False  # only its reference is known: the reaper could not read it


class ClusterApi:
    """Dict-in, dict-out access to the kinds the reaper reads and writes (owns the client and the
    kinds the server was found to serve, and with ``watch`` the informer cache it reads from;
    :attr:`accelerators`: the resource-name prefixes counted as GPUs). Building one asks the server
    which version of the core kinds it serves: a server that cannot be reached fails here, before
    the first pass."""

    def __init__(
        self,
        api_client: ApiClient,
        accelerators: tuple[str, ...] = ACCELERATOR_PREFIXES,
        *,
        watch: bool = False,
    ) -> None:
        self.api = KubeApi(api_client, qps=None)
        self.accelerators = accelerators
        self._served: dict[tuple[str, str], Resource] = {}
        self._absent: dict[tuple[str, str], float] = {}  # kinds not served, until when not to ask
        self._resource("v1", "Pod")
        self.watched = WatchedKinds(self.api) if watch else None

    def close(self) -> None:
        """Stop the watches (a reaper without them has nothing to stop)."""
        if self.watched is not None:
            self.watched.close()

    def _remember(self, res: Resource, obj: dict[str, Any]) -> dict[str, Any]:
        """A write's answer goes into the cache, if the kind is watched."""
        kind = self.watched.known(res) if self.watched is not None else None
        if kind is not None and obj.get("metadata"):
            kind.put(obj)
        return obj

    def _resource(self, api_version: str, kind: str) -> Resource | None:
        """The kind's resource as the server's discovery names it (``None``: not served)."""
        key = (api_version, kind)
        if key not in self._served:
            if time.monotonic() < self._absent.get(key, 0.0):
                return None
            group, _, version = api_version.rpartition("/")
            try:
                listing = self.api.request("GET", f"/apis/{api_version}" if group else f"/api/{version}")
            except ApiError as err:
                if err.not_found:  # asked again a minute later: the CRD may be installed by then
                    self._absent[key] = time.monotonic() + ABSENT_RECHECK_SECONDS
                    return None
                raise
            found = next(
                (r for r in listing.get("resources") or [] if r.get("kind") == kind and "/" not in r["name"]),
                None,
            )
            if found is None:
                self._absent[key] = time.monotonic() + ABSENT_RECHECK_SECONDS
                return None
            self._served[key] = Resource(group, version, found["name"], kind, bool(found.get("namespaced")))
        return self._served[key]

    def _served_resource(self, obj: Mapping[str, Any]) -> Resource:
        res = self._resource(str(obj.get("apiVersion")), str(obj.get("kind")))
        if res is None:
            raise ApiError(
                404, "NotFound", f"the server does not serve {obj.get('apiVersion')} {obj.get('kind')}"
            )
        return res

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        res = self._resource(api_version, kind)
        if res is None:
            return []
        cached = self.watched.of(res) if self.watched is not None else None
        if cached is not None:
            return cached.items(namespace)
        items: list[dict[str, Any]] = self.api.list(res, namespace).get("items") or []
        return items

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        res = self._resource(api_version, kind)
        if res is None:
            return None
        cached = self.watched.of(res) if self.watched is not None else None
        if cached is not None:
            return cached.get(name, namespace if res.namespaced else None)
        try:
            return self.api.get(res, name, namespace)
        except ApiError as err:
            if err.not_found:
                return None
            raise

    def merge_patch(self, obj: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
        m = meta(obj)
        res = self._served_resource(obj)
        return self._remember(res, self.api.patch(res, m["name"], dict(body), m.get("namespace")))

    def replace_status(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        res = self._served_resource(obj)
        return self._remember(res, self.api.replace(res, dict(obj), sub="status"))

    def delete(self, obj: Mapping[str, Any], grace_seconds: int | None = None) -> None:
        res = self._served_resource(obj)
        m = meta(obj)
        options = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else {}
        try:
            self.api.delete(res, m["name"], m.get("namespace"), **options)
        except ApiError as err:
            if not err.not_found:
                raise
        kind = self.watched.known(res) if self.watched is not None else None
        if kind is not None and grace_seconds == 0:
            kind.drop(obj)

    def event(self, obj: Mapping[str, Any], etype: str, reason: str, message: str, now: float) -> None:
        """A core/v1 Event about ``obj``, from the reaper."""
        m = meta(obj)
        stamp = idle.format_time(now)
        namespace = m.get("namespace") or "default"
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{m['name']}.", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion"),
                "kind": obj.get("kind"),
                "name": m["name"],
                "namespace": m.get("namespace"),
                "uid": m.get("uid"),
            },
            "type": etype,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        self.api.create(self._served_resource(body), body, namespace)

    # --- reading what a pod belongs to ------------------------------------------------------------

    def gpu_pods(self, namespaces: tuple[str, ...] = ()) -> list[dict[str, Any]]:
        """Pods bound to a node, not finished, not being deleted, holding at least one accelerator;
        in ``namespaces`` only, when given."""
        out = []
        listed = [p for ns in namespaces for p in self.list_objects("v1", "Pod", ns)] if namespaces else None
        for pod in listed if listed is not None else self.list_objects("v1", "Pod"):
            if not pod.get("spec", {}).get("nodeName") or meta(pod).get("deletionTimestamp"):
                continue
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                continue
            if pod_gpus(pod, self.accelerators) > 0:
                out.append({**pod, "apiVersion": "v1", "kind": "Pod"})
        return out

    def owner_chain(self, pod: Mapping[str, Any]) -> list[dict[str, Any]]:
        """The pod's controllers, nearest first (ReplicaSet, Deployment, StatefulSet, Notebook, Job...),
        as far up as the server serves their kinds."""
        chain: list[dict[str, Any]] = []
        current: Mapping[str, Any] = pod
        namespace = meta(pod).get("namespace")
        for _ in range(8):  # owner chains are short; a cycle must not loop
            ref = next(
                (r for r in meta(current).get("ownerReferences") or [] if r.get("controller")),
                None,
            )
            if ref is None:
                break
            try:
                found = self.get(ref["apiVersion"], ref["kind"], ref["name"], namespace)
            except ApiError as err:
                if err.status != 403:
                    raise
                break  # a kind the reaper may not read: it is the owner, and has no reclaim method
            if found is None or meta(found).get("uid") != ref.get("uid"):
                break
            found = {**found, "apiVersion": ref["apiVersion"], "kind": ref["kind"]}
            chain.append(found)
            current = found
        return chain

    def workload_of(self, job: Mapping[str, Any]) -> dict[str, Any] | None:
        """The Kueue Workload of a job: labelled with the job's uid, or owned by it."""
        m = meta(job)
        uid = m.get("uid")
        for wl in self.list_objects(KUEUE_V1BETA2, "Workload", m.get("namespace")):
            refs = meta(wl).get("ownerReferences") or []
            if labels_of(wl).get(JOB_UID_LABEL) == uid or any(r.get("uid") == uid for r in refs):
                return {**wl, "apiVersion": KUEUE_V1BETA2, "kind": "Workload"}
        return None

    def queue_annotations(self, namespace: str, queue: str | None) -> list[dict[str, str]]:
        """Annotations and labels of the namespace, the queue's ClusterQueue and the LocalQueue, in
        that order (later ones override)."""
        out = []
        ns = self.get("v1", "Namespace", namespace)
        if ns is not None:
            out.append({**labels_of(ns), **annotations_of(ns)})
        if queue:
            lq = self.get(KUEUE_V1BETA2, "LocalQueue", queue, namespace)
            if lq is not None:
                cq_name = lq.get("spec", {}).get("clusterQueue")
                cq = self.get(KUEUE_V1BETA2, "ClusterQueue", cq_name) if cq_name else None
                if cq is not None:
                    out.append({**labels_of(cq), **annotations_of(cq)})
                out.append({**labels_of(lq), **annotations_of(lq)})
        return out
