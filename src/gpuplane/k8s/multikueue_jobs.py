"""MultiKueue's job kinds: what differs between a batch Job and a JobSet when the manager carries one
to a worker (:mod:`gpuplane.k8s.multikueue_flow` does the rest, the same for every kind).

For each kind an adapter says:

- which API resource its objects live in (:data:`REMOTE_OWNER_RESOURCES` lists them all: what a
  manager reads back from each worker, by its origin label);
- how the worker's copy is built from the manager's object: the same name, namespace, labels,
  annotations and spec, plus the label ``kueue.x-k8s.io/prebuilt-workload-name`` and the origin
  label, with ``spec.managedBy`` removed (the worker's own controller takes the copy over) and
  nothing the server or a controller set (uid, resourceVersion, status, a Job's selector and the
  template labels the Job controller adds);
- when the worker's copy has ended, and what the manager's object shows meanwhile: the worker's
  status, whole (Kueue copies it whole for both kinds), but never a running status on a suspended
  object, and a finished status only once the worker's Workload has finished too (then the local
  Workload finishes from the worker's, "From <worker>: ...", not from its job's copied status);
- what an evicted (suspended) object of the kind says once it runs nowhere: a Job no active pods,
  a JobSet no active or ready Jobs.

Only batch Jobs and JobSets are carried: they are the kinds Kueue's MultiKueue started with. Other
kinds keep running on a single cluster only.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations
from gpuplane.model import labels as keys

# Job template labels the Job controller sets; a copy made with them would not validate.
JOB_CONTROLLER_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)


class JobKind:
    """One job kind as MultiKueue carries it (owns only its kind's name and API resource)."""

    def __init__(self, kind: str, resource: k8s.Resource) -> None:
        self.kind = kind
        self.resource = resource

    def remote_copy(self, local: Mapping[str, Any], workload: str, origin: str) -> dict[str, Any]:
        """The object to create on a worker for ``local``, whose Workload there is ``workload``."""
        meta = local.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        labels[keys.PREBUILT_WORKLOAD_LABEL] = workload
        labels[keys.MULTIKUEUE_ORIGIN_LABEL] = origin
        annotations = dict(meta.get("annotations") or {})
        annotations[keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION] = str(meta.get("uid", ""))
        spec = copy.deepcopy(local.get("spec") or {})
        spec.pop("managedBy", None)
        self.clear_controller_fields(spec)
        return {
            "apiVersion": self.resource.api_version,
            "kind": self.kind,
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
            },
            "spec": spec,
        }

    def clear_controller_fields(self, spec: dict[str, Any]) -> None:
        """Remove from ``spec`` (in place) what the server or a controller set on the manager."""

    def finished(self, obj: Mapping[str, Any]) -> bool:
        """Whether the object has ended, as its own controller reports it."""
        return integrations.outcome(self.kind, dict(obj)) is not None

    def synced_status(
        self, local: Mapping[str, Any], remote: Mapping[str, Any], *, final: bool
    ) -> dict[str, Any] | None:
        """The status the manager's object should show, from its worker copy's; None to leave it.

        While the local object runs (unsuspended) it shows the worker's status; a suspended one
        shows it only once the worker's copy has ended (``final``: its Workload finished there). A
        finished status is shown only then, whether suspended or not."""
        suspended = bool((local.get("spec") or {}).get("suspend"))
        if suspended and not (final and self.finished(remote)):
            return None
        if self.finished(remote) and not final:
            return None  # the local Workload finishes from the worker's first ("From <worker>: ...")
        status = copy.deepcopy(dict(remote.get("status") or {}))
        return None if status == (local.get("status") or {}) else status

    def stopped_status(self, local: Mapping[str, Any]) -> dict[str, Any] | None:  # noqa: ARG002 - a kind with nothing to reset
        """The status of a suspended local object that runs nowhere now; None when it says so already
        (or is not suspended)."""
        return None


class BatchJobKind(JobKind):
    """A batch Job (owns nothing beyond :class:`JobKind`): its selector and the Job controller's
    template labels are left out of the copy; stopped, it counts no active or ready pods."""

    def clear_controller_fields(self, spec: dict[str, Any]) -> None:
        spec.pop("selector", None)
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        for label in JOB_CONTROLLER_LABELS:
            template_labels.pop(label, None)

    def stopped_status(self, local: Mapping[str, Any]) -> dict[str, Any] | None:
        if not (local.get("spec") or {}).get("suspend"):
            return None
        status = dict(local.get("status") or {})
        if not status.get("active") and not status.get("ready"):
            return None
        status["active"] = 0
        status.pop("ready", None)
        return status


class JobSetKind(JobKind):
    """A JobSet (owns nothing beyond :class:`JobKind`): nothing in its spec is set by a controller
    (its child Jobs get their selectors and labels when the JobSet controller makes them); stopped,
    none of its replicated jobs counts active or ready Jobs."""

    def stopped_status(self, local: Mapping[str, Any]) -> dict[str, Any] | None:
        if not (local.get("spec") or {}).get("suspend"):
            return None
        status = copy.deepcopy(dict(local.get("status") or {}))
        jobs = status.get("replicatedJobsStatus") or []
        if not any(j.get("active") or j.get("ready") for j in jobs):
            return None
        for j in jobs:
            j["active"] = 0
            j["ready"] = 0
        return status


KINDS: dict[str, JobKind] = {
    "Job": BatchJobKind("Job", k8s.JOBS),
    "JobSet": JobSetKind("JobSet", k8s.JOBSETS),
}

# What a manager lists on each worker (by its origin label) besides the Workloads.
REMOTE_OWNER_RESOURCES: tuple[k8s.Resource, ...] = tuple(kind.resource for kind in KINDS.values())


def owner_of(wl: Mapping[str, Any]) -> tuple[JobKind, str] | None:
    """The job kind and name of the Workload's owner, among the kinds MultiKueue carries; None for
    a Workload owned by none of them (a plain pod group, another kind)."""
    for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
        kind = KINDS.get(str(ref.get("kind", "")))
        if kind is None or not ref.get("name"):
            continue
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if ref.get("apiVersion") and group != kind.resource.group:
            continue  # the same kind name in another API group
        return kind, str(ref["name"])
    return None
