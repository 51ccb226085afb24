"""Job integrations: from a job object to the Workload gpuplane queues, and back.

Each integration knows where a kind keeps its pod templates and how many pods each
template makes, and how the job waits (``spec.suspend``) until it is admitted. Plain
pods and pod groups (``kueue.x-k8s.io/pod-group-name``) wait behind a scheduling gate
instead. On admission the job's templates get the flavor's node selector, gpuplane's
scheduler name and two labels that tie every pod to its workload and pod set, and the
job is released.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuplane.core import scheduler as core_scheduler
from gpuplane.k8s import api

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS_LABEL = "kueue.x-k8s.io/priority-class"
POD_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
POD_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
WORKLOAD_LABEL = "gpuplane.dev/workload"
PODSET_LABEL = "gpuplane.dev/podset"
# Ties a bound pod to its admitted workload for the core; without it the core counts an admitted
# workload twice (its pods and its admission) and cannot free a victim's pods in a preemption search.
CORE_WORKLOAD_LABEL = core_scheduler.WORKLOAD_LABEL
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/cluster-queue-name"
LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name"
GATE = "gpuplane.dev/admission"
SCHEDULER_NAME = "gpuplane"

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class PodSetRef:
    name: str
    count: int
    template: Path  # where the pod template lives in the job object


def _get(obj: Any, path: Path) -> Any:
    for step in path:
        obj = obj[step]
    return obj


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _job_pods(spec: dict[str, Any]) -> int:
    parallelism = _int(spec.get("parallelism"), 1)
    completions = spec.get("completions")
    return parallelism if completions is None else min(parallelism, _int(completions, parallelism))


def batch_job(obj: dict[str, Any]) -> list[PodSetRef]:
    return [PodSetRef("main", _job_pods(obj.get("spec", {})), ("spec", "template"))]


def jobset(obj: dict[str, Any]) -> list[PodSetRef]:
    out = []
    for i, rj in enumerate(obj.get("spec", {}).get("replicatedJobs", [])):
        job_spec = rj.get("template", {}).get("spec", {})
        count = _int(rj.get("replicas"), 1) * _job_pods(job_spec)
        out.append(
            PodSetRef(
                str(rj.get("name", f"job{i}")),
                count,
                ("spec", "replicatedJobs", i, "template", "spec", "template"),
            )
        )
    return out


def pytorch_job(obj: dict[str, Any]) -> list[PodSetRef]:
    specs = obj.get("spec", {}).get("pytorchReplicaSpecs", {})
    return [
        PodSetRef(
            role.lower(), _int(spec.get("replicas"), 1), ("spec", "pytorchReplicaSpecs", role, "template")
        )
        for role, spec in sorted(specs.items(), key=lambda kv: (kv[0] != "Master", kv[0]))
    ]


def ray_job(obj: dict[str, Any]) -> list[PodSetRef]:
    cluster = obj.get("spec", {}).get("rayClusterSpec", {})
    out = [PodSetRef("head", 1, ("spec", "rayClusterSpec", "headGroupSpec", "template"))]
    for i, group in enumerate(cluster.get("workerGroupSpecs", [])):
        out.append(
            PodSetRef(
                str(group.get("groupName", f"workers{i}")),
                _int(group.get("replicas"), 1),
                ("spec", "rayClusterSpec", "workerGroupSpecs", i, "template"),
            )
        )
    return out


def train_job(obj: dict[str, Any]) -> list[PodSetRef]:
    return [
        PodSetRef(
            "node", _int(obj.get("spec", {}).get("trainer", {}).get("numNodes"), 1), ("spec", "trainer")
        )
    ]


def leader_worker_set(obj: dict[str, Any]) -> list[PodSetRef]:
    spec = obj.get("spec", {})
    lwt = spec.get("leaderWorkerTemplate", {})
    replicas, size = _int(spec.get("replicas"), 1), _int(lwt.get("size"), 1)
    leader = ("spec", "leaderWorkerTemplate", "leaderTemplate") if "leaderTemplate" in lwt else None
    worker = ("spec", "leaderWorkerTemplate", "workerTemplate")
    out = [PodSetRef("leader", replicas, leader or worker)]
    if size > 1:
        out.append(PodSetRef("workers", replicas * (size - 1), worker))
    return out


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


def workload_name(kind: str, name: str, uid: str) -> str:
    digest = hashlib.sha256(f"{kind}/{name}/{uid}".encode()).hexdigest()[:5]
    return f"{kind.lower()}-{name}"[:56] + f"-{digest}"


def _template_for_workload(template: dict[str, Any], kind: str) -> dict[str, Any]:
    if kind == "TrainJob":  # the trainer block carries per-node resources, not a pod template
        resources = template.get("resourcesPerNode", {})
        return {"spec": {"containers": [{"name": "node", "resources": resources}]}}
    out = copy.deepcopy(template)
    out.get("metadata", {}).pop("labels", None)
    return out


def workload_for(kind: str, obj: dict[str, Any], priorities: dict[str, int]) -> dict[str, Any] | None:
    """The Workload object for a queued job, or None if the job is not queued."""
    meta = obj.get("metadata", {})
    labels = meta.get("labels", {}) or {}
    queue = labels.get(QUEUE_LABEL)
    if not queue:
        return None
    integration = INTEGRATIONS[kind]
    pod_sets = [
        {"name": ps.name, "count": ps.count, "template": _template_for_workload(_get(obj, ps.template), kind)}
        for ps in integration.pod_sets(obj)
    ]
    priority_class = labels.get(PRIORITY_CLASS_LABEL)
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets}
    if priority_class:
        spec["priorityClassRef"] = {
            "group": api.KUEUE,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        }
        spec["priority"] = priorities.get(priority_class, 0)
    uid = str(meta.get("uid", ""))
    return {
        "apiVersion": f"{api.KUEUE}/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(kind, meta["name"], uid),
            "namespace": meta.get("namespace", "default"),
            "labels": {JOB_UID_LABEL: uid},
            "ownerReferences": [
                {
                    "apiVersion": obj.get("apiVersion", integration.resource.api_version),
                    "kind": kind,
                    "name": meta["name"],
                    "uid": uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": spec,
    }


def pod_group_workload(pods: list[dict[str, Any]], priorities: dict[str, int]) -> dict[str, Any] | None:
    """The Workload of a plain pod or a pod group (all pods that have arrived)."""
    first = pods[0]
    meta = first.get("metadata", {})
    labels = meta.get("labels", {}) or {}
    queue = labels.get(QUEUE_LABEL)
    if not queue:
        return None
    group = labels.get(POD_GROUP_LABEL)
    annotations = meta.get("annotations", {}) or {}
    count = int(annotations.get(POD_GROUP_COUNT, "1")) if group else 1
    name = group or meta["name"]
    template = {"metadata": {}, "spec": copy.deepcopy(first.get("spec", {}))}
    template["spec"].pop("nodeName", None)
    template["spec"].pop("schedulingGates", None)
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [{"name": "main", "count": count, "template": template}],
    }
    pc = labels.get(PRIORITY_CLASS_LABEL)
    if pc:
        spec["priorityClassRef"] = {"group": api.KUEUE, "kind": "WorkloadPriorityClass", "name": pc}
        spec["priority"] = priorities.get(pc, 0)
    return {
        "apiVersion": f"{api.KUEUE}/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name("Pod" if not group else "PodGroup", name, meta.get("namespace", "default")),
            "namespace": meta.get("namespace", "default"),
            "labels": {JOB_UID_LABEL: name},
        },
        "spec": spec,
    }


def released_job(
    kind: str,
    obj: dict[str, Any],
    workload: str,
    flavor_labels: dict[str, dict[str, str]],
    queue_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The job with templates stamped for its admitted workload and unsuspended.

    ``flavor_labels`` maps pod set name to the node labels of its assigned flavor;
    ``queue_labels`` (Kueue's cluster- and local-queue name labels) go on every pod.
    """
    out = copy.deepcopy(obj)
    integration = INTEGRATIONS[kind]
    for ps in integration.pod_sets(obj):
        if kind == "TrainJob":
            continue
        template = _get(out, ps.template)
        meta = template.setdefault("metadata", {})
        meta.setdefault("labels", {}).update(
            {
                WORKLOAD_LABEL: workload,
                CORE_WORKLOAD_LABEL: workload,
                PODSET_LABEL: ps.name,
                **(queue_labels or {}),
            }
        )
        pod_spec = template.setdefault("spec", {})
        # The scheduler name is immutable in a Job's template; the webhook sets it on each
        # pod from the workload label stamped here.
        selector = flavor_labels.get(ps.name, {})
        if selector:
            pod_spec.setdefault("nodeSelector", {}).update(selector)
    if integration.suspend is not None:
        parent = _get(out, integration.suspend[:-1]) if len(integration.suspend) > 1 else out
        parent[str(integration.suspend[-1])] = False
    return out


def is_suspended(kind: str, obj: dict[str, Any]) -> bool:
    integration = INTEGRATIONS[kind]
    if integration.suspend is None:
        return False
    try:
        return bool(_get(obj, integration.suspend))
    except (KeyError, IndexError, TypeError):
        return False


def suspended_job(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    integration = INTEGRATIONS[kind]
    if integration.suspend is not None:
        parent: dict[str, Any] = out
        for step in integration.suspend[:-1]:
            parent = parent.setdefault(str(step), {})
        parent[str(integration.suspend[-1])] = True
    return out
