"""Who a GPU pod is to the reaper: a session or batch work, the owner a reclaim acts on, and how.

A pod is a **session** when any of these holds:

- a Kubeflow ``Notebook`` (``kubeflow.org/v1``) owns it (through its StatefulSet);
- it is a JupyterHub single-user server (label ``component=singleuser-server``);
- the pod or one of its owners is labelled ``gpuplane.dev/session=true``;
- its workload's queue (LocalQueue, or that queue's ClusterQueue) is marked
  ``gpuplane.dev/interactive: "true"`` (label or annotation).

Everything else is batch: never reclaimed, only checked for a data stall.

How a session is reclaimed, by its topmost known owner::

    Notebook ................ annotation kubeflow-resource-stopped (Kubeflow's controller stops it)
    StatefulSet/Deployment .. scale to 0, replicas remembered in gpuplane.dev/replicas-before-reclaim
    Job with a Workload ..... Workload condition Evicted=True: the queue suspends and requeues the job
    bare pod ................ delete (only a pod no controller owns: an owner would recreate it)
    anything else ........... none: warned and reported, never acted on
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuplane.insight import idle
from gpuplane.reaper.cluster import (
    JUPYTERHUB_COMPONENT,
    NOTEBOOK_API,
    NOTEBOOK_STOPPED,
    QUEUE_LABEL,
    ClusterApi,
    Owner,
    annotations_of,
    labels_of,
    meta,
    pod_gpus,
)


class Method(StrEnum):
    STOP_NOTEBOOK = "stop-notebook"
    SCALE_TO_ZERO = "scale-to-zero"
    EVICT_WORKLOAD = "evict-workload"
    DELETE_POD = "delete-pod"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class Subject:
    pod: Mapping[str, Any]
    owner: Owner  # what a warning is annotated on and a reclaim acts on
    method: Method
    klass: idle.WorkloadClass
    notes: Mapping[str, str]  # pod annotations overridden by the owners'
    settings: idle.IdleSettings
    gpus: int
    workload: Mapping[str, Any] | None = None  # the Kueue Workload, for a job
    problems: tuple[str, ...] = ()

    @property
    def holder(self) -> Mapping[str, Any]:
        """The object that carries the warning's annotation and Events: the owner, or the pod itself
        when the owner could not be read."""
        return self.pod if self.owner.stub or self.method is Method.NONE else self.owner.obj

    @property
    def reclaiming(self) -> bool:
        """Whether a reclaim was already asked for and the owner's controller has not finished it."""
        owner = self.owner.obj
        if self.method is Method.STOP_NOTEBOOK:
            return NOTEBOOK_STOPPED in annotations_of(owner)
        if self.method is Method.SCALE_TO_ZERO:
            return bool(owner.get("spec", {}).get("replicas") == 0)
        if self.method is Method.EVICT_WORKLOAD and self.workload is not None:
            conditions = (self.workload.get("status") or {}).get("conditions") or []
            return any(c.get("type") == "Evicted" and c.get("status") == "True" for c in conditions)
        return False

    @property
    def owner_key(self) -> tuple[str, str, str]:
        """Pods with the same key are decided together (their owner is one thing to warn or reclaim)."""
        if self.holder is self.pod:
            return ("Pod", self.namespace, self.name)
        return (self.owner.kind, self.namespace, self.owner.name)

    @property
    def namespace(self) -> str:
        return str(meta(self.pod).get("namespace", ""))

    @property
    def name(self) -> str:
        return str(meta(self.pod).get("name", ""))


def _owner(obj: Mapping[str, Any]) -> Owner:
    m = meta(obj)
    return Owner(str(obj.get("kind")), str(obj.get("apiVersion")), m["name"], m.get("namespace", ""), obj)


def describe(api: ClusterApi, pod: Mapping[str, Any], defaults: idle.IdleSettings) -> Subject:
    """Classify one pod and find its owner, method and settings (reads only)."""
    chain = api.owner_chain(pod)
    objects = [pod, *chain]
    notes: dict[str, str] = {}
    for obj in objects:
        notes.update(annotations_of(obj))
    marked = any(idle.is_true(labels_of(obj).get(idle.SESSION_LABEL)) for obj in objects)
    notebook = next((o for o in chain if o["kind"] == "Notebook" and o["apiVersion"] == NOTEBOOK_API), None)
    hub = labels_of(pod).get("component") == JUPYTERHUB_COMPONENT
    queue = next(
        (labels_of(obj).get(QUEUE_LABEL) for obj in reversed(objects) if labels_of(obj).get(QUEUE_LABEL)),
        None,
    )
    settings, problems, interactive = defaults, [], False
    for layer in api.queue_annotations(str(meta(pod).get("namespace", "")), queue):
        settings, found = idle.settings_with(settings, layer)
        problems += found
        interactive = interactive or idle.is_true(layer.get(idle.INTERACTIVE_ANNOTATION))
    session = notebook is not None or hub or marked or interactive
    klass = idle.WorkloadClass.SESSION if session else idle.WorkloadClass.BATCH

    workload = None
    top_obj = chain[-1] if chain else pod
    dangling = next((r for r in meta(top_obj).get("ownerReferences") or [] if r.get("controller")), None)
    if dangling is not None and notebook is None:
        # A controller the reaper cannot read (not served, or not allowed): it would undo any reclaim.
        stub = {
            "apiVersion": dangling.get("apiVersion"),
            "kind": dangling.get("kind"),
            "metadata": {"name": dangling.get("name"), "namespace": meta(pod).get("namespace")},
        }
        owner = Owner(
            str(stub["kind"]), str(stub["apiVersion"]), str(dangling.get("name")), "", stub, stub=True
        )
        return Subject(
            pod,
            owner,
            Method.NONE,
            klass,
            notes,
            settings,
            pod_gpus(pod, api.accelerators),
            None,
            tuple(problems),
        )
    if notebook is not None:
        owner, method = _owner(notebook), Method.STOP_NOTEBOOK
    else:
        top = chain[-1] if chain else None
        kind = top["kind"] if top else "Pod"
        if top is None:
            owner, method = _owner(pod), Method.DELETE_POD
        elif kind in ("StatefulSet", "Deployment") and top["apiVersion"] == "apps/v1":
            owner, method = _owner(top), Method.SCALE_TO_ZERO
        elif kind == "Job" and top["apiVersion"] == "batch/v1":
            workload = api.workload_of(top)
            owner = _owner(top)
            method = Method.EVICT_WORKLOAD if workload is not None else Method.NONE
        else:
            owner, method = _owner(top), Method.NONE
    return Subject(
        pod, owner, method, klass, notes, settings, pod_gpus(pod, api.accelerators), workload, tuple(problems)
    )
