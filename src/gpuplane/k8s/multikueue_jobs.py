"""MultiKueue's job kinds: what differs between a batch Job, a JobSet, a PyTorchJob, a TrainJob and a
RayJob when the manager carries one to a worker (:mod:`gpuplane.k8s.multikueue_flow` does the rest,
the same for every kind).

For each kind an adapter says:

- which API resource its objects live in (:data:`REMOTE_OWNER_RESOURCES` lists them all: what a
  manager reads back from each worker, by its origin label);
- how the worker's copy is built from the manager's object: the same name, namespace, labels,
  annotations and spec, plus the label ``kueue.x-k8s.io/prebuilt-workload-name`` and the origin
  label, with its ``managedBy`` removed (the worker's own controller takes the copy over) and
  nothing the server or a controller set (uid, resourceVersion, status, a Job's selector and the
  template labels the Job controller adds). ``managedBy`` is ``spec.managedBy`` for every kind but
  the PyTorchJob, which keeps it, as its suspend, in ``spec.runPolicy``;
- when the worker's copy has ended, and what the manager's object shows meanwhile: the worker's
  status, whole (Kueue copies it whole for every kind carried here), but never a running status on
  a suspended object, and a finished status only once the worker's Workload has finished too (then
  the local Workload finishes from the worker's, "From <worker>: ...", not from its job's copied
  status). When a copy has ended is :func:`gpuplane.k8s.integrations.outcome`, as on one cluster;
- what an evicted (suspended) object of the kind says once it runs nowhere: a Job no active pods,
  a JobSet no active or ready Jobs, a PyTorchJob no active replicas, a TrainJob no active or ready
  jobs, a RayJob the deployment status ``Suspended`` (unless it had ended).

A LeaderWorkerSet is not carried: Kueue carries one only in recent releases, and differently (one
Workload per replica, no prebuilt Workload, no status synced back); it runs on a single cluster only.
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


# Where a kind's managedBy lives, unless its adapter names another path.
MANAGED_BY_PATH = ("spec", "managedBy")


class JobKind:
    """One job kind as MultiKueue carries it (owns only its kind's name, API resource and the path of
    its ``managedBy`` field)."""

    def __init__(
        self, kind: str, resource: k8s.Resource, managed_by_path: tuple[str, ...] = MANAGED_BY_PATH
    ) -> None:
        if kind not in integrations.INTEGRATIONS:
            raise ValueError(f"MultiKueue cannot carry {kind!r}: gpuplane does not integrate that kind")
        if len(managed_by_path) < 2 or managed_by_path[0] != "spec":
            raise ValueError(f"managedBy of {kind} must be a field under spec, not {managed_by_path!r}")
        self.kind = kind
        self.resource = resource
        self.managed_by_path = managed_by_path

    def managed_by(self, obj: Mapping[str, Any]) -> str | None:
        """The controller that ``obj`` names in its ``managedBy`` field; None when it names none."""
        node: Any = obj
        for step in self.managed_by_path:
            node = node.get(step) if isinstance(node, Mapping) else None
        return None if node is None else str(node)

    def multikueue_managed(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is left to MultiKueue (its ``managedBy`` is Kueue's MultiKueue controller)."""
        return self.managed_by(obj) == keys.MULTIKUEUE_CONTROLLER

    def suspended(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` is suspended, where its kind keeps that (a PyTorchJob in its run policy)."""
        return integrations.is_suspended(self.kind, dict(obj))

    def remote_copy(self, local: Mapping[str, Any], workload: str, origin: str) -> dict[str, Any]:
        """The object to create on a worker for ``local``, whose Workload there is ``workload``."""
        meta = local.get("metadata") or {}
        labels = dict(meta.get("labels") or {})
        labels[keys.PREBUILT_WORKLOAD_LABEL] = workload
        labels[keys.MULTIKUEUE_ORIGIN_LABEL] = origin
        annotations = dict(meta.get("annotations") or {})
        annotations[keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION] = str(meta.get("uid", ""))
        spec = copy.deepcopy(local.get("spec") or {})
        parent: Any = spec
        for step in self.managed_by_path[1:-1]:
            parent = parent.get(step) if isinstance(parent, dict) else None
        if isinstance(parent, dict):
            parent.pop(self.managed_by_path[-1], None)
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
        suspended = self.suspended(local)
        if suspended and not (final and self.finished(remote)):
            return None
        if self.finished(remote) and not final:
            return None  # the local Workload finishes from the worker's first ("From <worker>: ...")
        status = copy.deepcopy(dict(remote.get("status") or {}))
        return None if status == (local.get("status") or {}) else status

    def stopped_status(self, local: Mapping[str, Any]) -> dict[str, Any] | None:
        """The status of a suspended local object that runs nowhere now; None when it says so already
        (or is not suspended)."""
        if not self.suspended(local):
            return None
        status = copy.deepcopy(dict(local.get("status") or {}))
        return status if self.stop(status) else None

    def stop(self, status: dict[str, Any]) -> bool:  # noqa: ARG002 - a kind with nothing to reset
        """Make ``status`` (in place) say that nothing of the object runs; False when it said so."""
        return False


class BatchJobKind(JobKind):
    """A batch Job (owns nothing beyond :class:`JobKind`): its selector and the Job controller's
    template labels are left out of the copy; stopped, it counts no active or ready pods."""

    def clear_controller_fields(self, spec: dict[str, Any]) -> None:
        spec.pop("selector", None)
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        for label in JOB_CONTROLLER_LABELS:
            template_labels.pop(label, None)

    def stop(self, status: dict[str, Any]) -> bool:
        if not status.get("active") and not status.get("ready"):
            return False
        status["active"] = 0
        status.pop("ready", None)
        return True


class JobSetKind(JobKind):
    """A JobSet (owns nothing beyond :class:`JobKind`): nothing in its spec is set by a controller
    (its child Jobs get their selectors and labels when the JobSet controller makes them); stopped,
    none of its replicated jobs counts active or ready Jobs."""

    def stop(self, status: dict[str, Any]) -> bool:
        return _zero_counts(status.get("replicatedJobsStatus") or [], ("active", "ready"))


class PyTorchJobKind(JobKind):
    """A Kubeflow PyTorchJob (owns nothing beyond :class:`JobKind`): its ``managedBy`` and suspend
    live in ``spec.runPolicy``; nothing in its spec is set by a controller; stopped, no replica type
    in ``status.replicaStatuses`` counts active pods."""

    def __init__(self) -> None:
        super().__init__("PyTorchJob", k8s.PYTORCH_JOBS, ("spec", "runPolicy", "managedBy"))

    def stop(self, status: dict[str, Any]) -> bool:
        replicas = status.get("replicaStatuses") or {}
        return _zero_counts([r for r in replicas.values() if isinstance(r, dict)], ("active",))


class TrainJobKind(JobKind):
    """A Kubeflow TrainJob (owns nothing beyond :class:`JobKind`): ``spec.managedBy``, nothing in its
    spec set by a controller; stopped, none of its ``status.jobsStatus`` counts active or ready pods."""

    def __init__(self) -> None:
        super().__init__("TrainJob", k8s.TRAIN_JOBS)

    def stop(self, status: dict[str, Any]) -> bool:
        return _zero_counts(status.get("jobsStatus") or [], ("active", "ready"))


# A RayJob's deployment statuses that have no Ray cluster running (besides the ones that end it).
_RAY_AT_REST = frozenset({"", "New", "Suspended", "ValidationFailed"})


class RayJobKind(JobKind):
    """A KubeRay RayJob (owns nothing beyond :class:`JobKind`): ``spec.managedBy``, nothing in its spec
    set by a controller; stopped, its ``status.jobDeploymentStatus`` says ``Suspended`` as Kueue marks
    it (a deployment status that had ended, or never started, is kept)."""

    def __init__(self) -> None:
        super().__init__("RayJob", k8s.RAY_JOBS)

    def stop(self, status: dict[str, Any]) -> bool:
        deployment = str(status.get("jobDeploymentStatus") or "")
        if deployment in _RAY_AT_REST or integrations.outcome(self.kind, {"status": status}) is not None:
            return False
        status["jobDeploymentStatus"] = "Suspended"
        return True


def _zero_counts(entries: list[dict[str, Any]], fields: tuple[str, ...]) -> bool:
    """Set ``fields`` to 0 in each entry (in place); False when none counted anything."""
    if not any(e.get(f) for e in entries for f in fields):
        return False
    for entry in entries:
        for f in fields:
            entry[f] = 0
    return True


KINDS: dict[str, JobKind] = {
    kind.kind: kind
    for kind in (
        BatchJobKind("Job", k8s.JOBS),
        JobSetKind("JobSet", k8s.JOBSETS),
        PyTorchJobKind(),
        TrainJobKind(),
        RayJobKind(),
    )
}

# What a manager lists on each worker (by its origin label) besides the Workloads.
REMOTE_OWNER_RESOURCES: tuple[k8s.Resource, ...] = tuple(kind.resource for kind in KINDS.values())


def owner_of(wl: Mapping[str, Any]) -> tuple[JobKind, str] | None:
    """The job kind and name of the Workload's owner, among the kinds MultiKueue carries; None for
    a Workload owned by none of them (a plain pod group, a LeaderWorkerSet)."""
    for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
        kind = KINDS.get(str(ref.get("kind", "")))
        if kind is None or not ref.get("name"):
            continue
        group = str(ref.get("apiVersion") or "").rpartition("/")[0]
        if ref.get("apiVersion") and group != kind.resource.group:
            continue  # the same kind name in another API group
        return kind, str(ref["name"])
    return None
