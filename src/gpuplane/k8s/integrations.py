"""Job integrations: from a job object to the Workload gpuplane queues, and back.

Each integration knows where a kind keeps its pod templates and how many pods each
template makes, and how the job waits (``spec.suspend``) until it is admitted. Plain
pods and pod groups (``kueue.x-k8s.io/pod-group-name``) wait behind a scheduling gate
instead. On admission the job's templates get the flavor's node selector, gpuplane's
scheduler name and two labels that tie every pod to its workload and pod set, and the
job is released.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.k8s import api
from gpuplane.model import labels as keys
from gpuplane.model.jobs import (
    Path,
    PodSetRef,
    admitted_job_counts,
    batch_job,
    jobset,
    leader_worker_set,
    pytorch_job,
    ray_job,
    train_job,
    workload_document,
    workload_name,
)
from gpuplane.model.jobs import get_path as _get
from gpuplane.model.jobs import pod_group_document as pod_group_workload

# Re-exported: callers of this module keep their imports.
__all__ = [
    "PodSetRef",
    "batch_job",
    "jobset",
    "leader_worker_set",
    "pod_group_workload",
    "pytorch_job",
    "ray_job",
    "train_job",
    "workload_name",
]


@dataclass(frozen=True, slots=True)
class Integration:
    resource: api.Resource
    pod_sets: Callable[[dict[str, Any]], list[PodSetRef]]
    suspend: Path | None  # None: pods wait behind a scheduling gate


INTEGRATIONS: dict[str, Integration] = {
    "Job": Integration(api.JOBS, batch_job, ("spec", "suspend")),
    "JobSet": Integration(api.JOBSETS, jobset, ("spec", "suspend")),
    "PyTorchJob": Integration(api.PYTORCH_JOBS, pytorch_job, ("spec", "runPolicy", "suspend")),
    "TrainJob": Integration(api.TRAIN_JOBS, train_job, ("spec", "suspend")),
    "RayJob": Integration(api.RAY_JOBS, ray_job, ("spec", "suspend")),
    "LeaderWorkerSet": Integration(api.LEADER_WORKER_SETS, leader_worker_set, None),
}


def workload_for(kind: str, obj: dict[str, Any], priorities: dict[str, int]) -> dict[str, Any] | None:
    """The Workload object for a queued job, or None if the job is not queued."""
    return workload_document(kind, obj, priorities, INTEGRATIONS[kind].resource.api_version)


def released_job(  # noqa: PLR0913  the job and its admission's parts; the counts keyword-only
    kind: str,
    obj: dict[str, Any],
    workload: str,
    flavor_labels: dict[str, dict[str, str]],
    queue_labels: dict[str, str] | None = None,
    *,
    counts: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The job with templates stamped for its admitted workload and unsuspended.

    ``flavor_labels`` maps pod set name to the node labels of its assigned flavor;
    ``queue_labels`` (Kueue's cluster- and local-queue name labels) go on every pod;
    ``counts`` maps pod set name to its admitted pod count: a partially admitted batch Job runs
    that many pods (:func:`gpuplane.model.jobs.admitted_job_counts`).
    """
    # The job as observed is the cache's and stays as it is: only the maps and lists on the way to
    # what changes are copied, and the rest is shared with it (a released Job's body is sent, not
    # changed again). A whole deep copy of every released Job was most of a release's CPU.
    out = dict(obj)
    fresh = {id(out)}
    _set_counts(kind, out, counts, fresh)
    integration = INTEGRATIONS[kind]
    for ps in integration.pod_sets(obj):
        if kind == "TrainJob":
            continue
        template = _own_path(out, ps.template, fresh)
        _own_map(_own_map(template, "metadata", fresh), "labels", fresh).update(
            {
                keys.WORKLOAD_LABEL: workload,
                keys.KUEUE_WORKLOAD_LABEL: workload,
                keys.PODSET_LABEL: ps.name,
                **(queue_labels or {}),
            }
        )
        pod_spec = _own_map(template, "spec", fresh)
        # The scheduler name is immutable in a Job's template; the webhook sets it on each
        # pod from the workload label stamped here.
        selector = flavor_labels.get(ps.name, {})
        if selector:
            _own_map(pod_spec, "nodeSelector", fresh).update(selector)
    if integration.suspend is not None:
        parent = _own_path(out, integration.suspend[:-1], fresh)
        parent[str(integration.suspend[-1])] = False
    return out


def _own_path(root: Any, path: Sequence[str | int], fresh: set[int]) -> Any:
    """The map or list at ``path`` inside ``root``, with every one on the way (``root`` itself
    excepted) replaced by a shallow copy, once: ``fresh`` holds the ids of the copies made."""
    node = root
    for step in path:
        child = node[step]
        if id(child) not in fresh:
            child = list(child) if isinstance(child, list) else dict(child)
            node[step] = child
            fresh.add(id(child))
        node = child
    return node


def _own_map(node: dict[str, Any], key: str, fresh: set[int]) -> dict[str, Any]:
    """``node[key]`` as a map of the caller's own: a shallow copy of the one there (once), or a new
    empty one."""
    child = node.get(key)
    if isinstance(child, dict) and id(child) in fresh:
        return child
    own: dict[str, Any] = dict(child) if isinstance(child, dict) else {}
    node[key] = own
    fresh.add(id(own))
    return own


def is_suspended(kind: str, obj: dict[str, Any]) -> bool:
    integration = INTEGRATIONS[kind]
    if integration.suspend is None:
        return False
    try:
        return bool(_get(obj, integration.suspend))
    except (KeyError, IndexError, TypeError):
        return False


def _set_counts(kind: str, out: dict[str, Any], counts: Mapping[str, int] | None, fresh: set[int]) -> None:
    """Set ``out`` (a shallow copy whose own maps are in ``fresh``) to run ``counts`` pods per pod
    set, where its kind supports partial admission: a batch Job with a job-min-parallelism
    annotation."""
    if kind == "Job" and counts:
        (pod_set,) = batch_job(out)
        if pod_set.name in counts:
            _own_map(out, "spec", fresh).update(admitted_job_counts(out, counts[pod_set.name]))


def suspended_job(kind: str, obj: dict[str, Any], counts: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The job suspended; ``counts`` (pod set name to its Workload's pod count) restores what a
    partial admission changed, as Kueue does when it stops a job. ``obj`` stays as it is: only the
    maps on the way to what changes are copied."""
    out = dict(obj)
    fresh = {id(out)}
    _set_counts(kind, out, counts, fresh)
    integration = INTEGRATIONS[kind]
    if integration.suspend is not None:
        parent = out
        for step in integration.suspend[:-1]:
            parent = _own_map(parent, str(step), fresh)
        parent[str(integration.suspend[-1])] = True
    return out


def is_active(kind: str, obj: dict[str, Any]) -> bool:
    """Whether the job may still have pods running, as Kueue's job reconciler asks before it
    releases an evicted workload's quota: a job that is not suspended is active; a suspended batch
    Job stays active until the Job controller reports no active pods (``status.active`` is 0)."""
    integration = INTEGRATIONS[kind]
    if integration.suspend is not None and not is_suspended(kind, obj):
        return True
    if kind == "Job":
        active = (obj.get("status") or {}).get("active")
        return isinstance(active, int) and active > 0
    return False


# A job kind's terminal conditions (``status.conditions[].type`` set to "True"): the one that means
# success, then the one that means failure. A kind not listed never finishes on its own (a
# LeaderWorkerSet serves until it is deleted); a RayJob reports through its deployment status.
_TERMINAL_CONDITIONS: dict[str, tuple[str, str]] = {
    "Job": ("Complete", "Failed"),
    "JobSet": ("Completed", "Failed"),
    "PyTorchJob": ("Succeeded", "Failed"),
    "TrainJob": ("Complete", "Failed"),
}
_RAY_TERMINAL = {"Complete": True, "Failed": False}


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a job ended: whether it succeeded, and the message its kind gave."""

    succeeded: bool
    message: str


def outcome(kind: str, obj: dict[str, Any]) -> Outcome | None:
    """How the job ended, as its own controller reports it; None while it has not ended.

    Kueue finishes a Workload on the same signals: a batch Job's ``Complete`` or ``Failed``
    condition, a JobSet's ``Completed`` or ``Failed``, a PyTorchJob's ``Succeeded`` or ``Failed``, a
    TrainJob's ``Complete`` or ``Failed``, a RayJob's ``jobDeploymentStatus``.
    """
    status = obj.get("status") or {}
    if kind == "RayJob":
        deployment = status.get("jobDeploymentStatus")
        if deployment in _RAY_TERMINAL:
            return Outcome(_RAY_TERMINAL[deployment], str(status.get("message") or f"RayJob {deployment}"))
        if deployment == "ValidationFailed" and not status.get("rayClusterName"):
            # KubeRay refused the spec before it made a cluster: it never runs (Kueue finishes it too).
            return Outcome(False, str(status.get("message") or "RayJob ValidationFailed"))
        return None
    terminal = _TERMINAL_CONDITIONS.get(kind)
    if terminal is None:
        return None
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True" or cond.get("type") not in terminal:
            continue
        succeeded = cond["type"] == terminal[0]
        default = f"{kind} finished successfully" if succeeded else f"{kind} failed"
        return Outcome(succeeded, str(cond.get("message") or default))
    return None


def pods_outcome(pods: list[dict[str, Any]], expected: int) -> Outcome | None:
    """How a workload of plain pods (or a pod group of ``expected`` pods) ended: once every one of
    them has reached a terminal phase, a success if all succeeded; None while any may still run."""
    phases = [(p.get("status") or {}).get("phase") for p in pods]
    if not phases or len(phases) < expected or any(ph not in ("Succeeded", "Failed") for ph in phases):
        return None
    failed = phases.count("Failed")
    if failed:
        return Outcome(False, f"{failed} of {len(phases)} pods failed")
    return Outcome(True, f"all {len(phases)} pods succeeded")


def reclaimable_pods(kind: str, obj: dict[str, Any]) -> dict[str, int]:
    """Pods of a running job that ended and will not run again, by pod set, as Kueue counts them
    (``status.reclaimablePods``): for a batch Job with more than one pod in parallel, the succeeded
    pods beyond what its remaining completions still need. Other kinds report none."""
    if kind != "Job":
        return {}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    parallelism = spec.get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    succeeded = int(status.get("succeeded") or 0)
    if parallelism <= 1 or succeeded == 0:
        return {}
    completions = spec.get("completions")
    remaining = (parallelism if completions is None else int(completions)) - succeeded
    if remaining >= parallelism:
        return {}
    (pod_set,) = batch_job(obj)
    return {pod_set.name: parallelism - max(0, remaining)}


def recorded_reclaimable(workload: Mapping[str, Any]) -> dict[str, int]:
    """A Workload object's ``status.reclaimablePods`` as pod set name -> count (counts above 0;
    read leniently, as observed, not validated)."""
    out: dict[str, int] = {}
    for item in (workload.get("status") or {}).get("reclaimablePods") or []:
        if isinstance(item, Mapping) and int(item.get("count") or 0) > 0:
            out[str(item.get("name"))] = int(item["count"])
    return out
