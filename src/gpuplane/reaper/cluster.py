"""The reaper's view of the cluster: pods holding accelerators, their owners, queues, and the writes.

Reads and writes go through the official client's ``DynamicClient`` as plain dicts. A kind the
server does not serve (no Notebook CRD, no Kueue) reads as absent, never as an error. Every write is
idempotent: applying the same decision twice leaves the same objects.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import dynamic
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from gpuplane.insight import idle
from gpuplane.model import labels as keys

log = logging.getLogger(__name__)

QUEUE_LABEL = keys.QUEUE_NAME_LABEL
JOB_UID_LABEL = keys.JOB_UID_LABEL
KUEUE_V1BETA2 = "kueue.x-k8s.io/v1beta2"
NOTEBOOK_API = "kubeflow.org/v1"
NOTEBOOK_STOPPED = "kubeflow-resource-stopped"
REPLICAS_ANNOTATION = keys.REPLICAS_BEFORE_RECLAIM_ANNOTATION
JUPYTERHUB_COMPONENT = "singleuser-server"  # zero-to-jupyterhub's label component=singleuser-server
COMPONENT = "gpuplane-reaper"
MERGE_PATCH = "application/merge-patch+json"

# Resource names counted as GPUs: whole devices and MIG instances (each instance is one device).
ACCELERATOR_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "amd.com/gpu", "habana.ai/", "google.com/tpu")


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """Accelerator devices the pod holds: the sum over its containers of matching limits (or requests)."""
    total = 0
    for container in pod.get("spec", {}).get("containers") or []:
        resources = container.get("resources") or {}
        amounts = resources.get("limits") or resources.get("requests") or {}
        for name, value in amounts.items():
            if name.startswith(ACCELERATOR_PREFIXES):
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
    """Dict-in, dict-out access to the kinds the reaper reads and writes."""

    def __init__(self, api_client: ApiClient) -> None:
        self.client = dynamic.DynamicClient(api_client)  # type: ignore[no-untyped-call]
        self._served: dict[tuple[str, str], Any] = {}

    def _resource(self, api_version: str, kind: str) -> Any:
        key = (api_version, kind)
        if key not in self._served:
            try:
                self._served[key] = self.client.resources.get(api_version=api_version, kind=kind)
            except ResourceNotFoundError:
                return None  # asked again next time: the CRD may be installed later
        return self._served[key]

    def list_objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        res = self._resource(api_version, kind)
        if res is None:
            return []
        found = res.get(namespace=namespace) if namespace else res.get()
        items: list[dict[str, Any]] = found.to_dict().get("items") or []
        return items

    def get(
        self, api_version: str, kind: str, name: str, namespace: str | None = None
    ) -> dict[str, Any] | None:
        res = self._resource(api_version, kind)
        if res is None:
            return None
        try:
            found: dict[str, Any] = res.get(name=name, namespace=namespace).to_dict()
        except ApiException as err:
            if err.status == 404:
                return None
            raise
        return found

    def merge_patch(self, obj: Mapping[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
        res = self._resource(str(obj.get("apiVersion")), str(obj.get("kind")))
        m = meta(obj)
        patched: dict[str, Any] = res.patch(
            body=dict(body), name=m["name"], namespace=m.get("namespace"), content_type=MERGE_PATCH
        ).to_dict()
        return patched

    def replace_status(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        res = self._resource(str(obj.get("apiVersion")), str(obj.get("kind")))
        replaced: dict[str, Any] = res.status.replace(body=dict(obj)).to_dict()
        return replaced

    def delete(self, obj: Mapping[str, Any], grace_seconds: int | None = None) -> None:
        res = self._resource(str(obj.get("apiVersion")), str(obj.get("kind")))
        m = meta(obj)
        body = {"gracePeriodSeconds": grace_seconds} if grace_seconds is not None else None
        try:
            res.delete(name=m["name"], namespace=m.get("namespace"), body=body)
        except ApiException as err:
            if err.status != 404:
                raise

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
        self._resource("v1", "Event").create(body=body, namespace=namespace)

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
            if pod_gpus(pod) > 0:
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
            except ApiException as err:
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
