"""From a job object to the Workload Kueue would create for it: the one derivation.

The CLI (``gpuplane schedule`` on a file of Jobs), the controller (which creates the Workload
objects) and anything else that turns jobs into workloads use these functions, so a job gets
the same workload name, pod sets and priority everywhere.

Each supported kind knows where it keeps its pod templates and how many pods each makes
(:data:`POD_SETS`). Objects are decoded JSON (plain mappings); this module reads them leniently
(a missing count is 1) and never changes them. Strict checking with located errors, for input
files, is :func:`gpuplane.model.kinds.workload_from_job`, which builds on the same pieces.

Partial admission of a batch Job follows Kueue: ``kueue.x-k8s.io/job-min-parallelism`` gives the
pod set's ``minCount`` (:func:`job_min_count`); once admitted, the Job runs the admitted count as
its parallelism, and its completions too when ``kueue.x-k8s.io/job-completions-equal-parallelism``
is true (:func:`admitted_job_counts`).
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.model import labels as keys
from gpuplane.model.errors import InputError

Path = tuple[str | int, ...]
# Kueue keeps a workload name within 63 characters: a prefix, a dash and a 5-character hash.
_PREFIX_LENGTH = 56
_HASH_LENGTH = 5


@dataclass(frozen=True, slots=True)
class PodSetRef:
    """One pod set of a job: its name, its pod count, where its pod template lives, and the fewest
    pods it may be admitted with (``None``: all of them)."""

    name: str
    count: int
    template: Path
    min_count: int | None = None


def get_path(obj: Any, path: Path) -> Any:
    """The value at ``path`` (keys and list indices) inside ``obj``."""
    for step in path:
        obj = obj[step]
    return obj


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def job_pod_count(parallelism: int | None, completions: int | None) -> int:
    """Pods a batch Job runs at once: ``parallelism`` (default 1), at most ``completions``."""
    count = 1 if parallelism is None else parallelism
    return count if completions is None else min(count, completions)


def _job_pods(spec: Mapping[str, Any]) -> int:
    parallelism = _int(spec.get("parallelism"), 1)
    completions = spec.get("completions")
    return job_pod_count(parallelism, None if completions is None else _int(completions, parallelism))


def job_min_count(annotations: Mapping[str, Any], count: int) -> int | None:
    """A batch Job's ``minCount`` for partial admission: ``kueue.x-k8s.io/job-min-parallelism``, an
    integer from 1 to the Job's pod ``count``; ``None`` when the annotation is absent.

    Raises :class:`InputError`, located at the annotation, when it is anything else (Kueue's webhook
    rejects such a Job at creation).
    """
    if keys.MIN_PARALLELISM not in annotations:
        return None
    field = f"metadata.annotations[{keys.MIN_PARALLELISM}]"
    try:
        min_count = int(annotations[keys.MIN_PARALLELISM])
    except (TypeError, ValueError):
        raise InputError("expected an integer", field=field) from None
    if not 0 < min_count <= count:
        raise InputError(
            f"must be between 1 and the job's pod count ({count})", field=field, invalid_value=True
        )
    return min_count


def _annotations(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") or {}
    return meta.get("annotations") or {}


def batch_job(obj: Mapping[str, Any]) -> list[PodSetRef]:
    """The one pod set of a batch Job; a job-min-parallelism annotation that is not valid (see
    :func:`job_min_count`) is ignored."""
    count = _job_pods(obj.get("spec", {}))
    try:
        min_count = job_min_count(_annotations(obj), count)
    except InputError:
        min_count = None
    return [PodSetRef("main", count, ("spec", "template"), min_count)]


def admitted_job_counts(obj: Mapping[str, Any], count: int) -> dict[str, int]:
    """The spec fields a batch Job that may be partially admitted runs ``count`` pods with, as
    Kueue sets them when it releases the Job (and restores them when it stops it): ``parallelism``,
    and ``completions`` too when ``kueue.x-k8s.io/job-completions-equal-parallelism`` is true.
    Nothing for a Job without a (valid) job-min-parallelism annotation: it runs as written."""
    (pod_set,) = batch_job(obj)
    if pod_set.min_count is None:
        return {}
    out = {"parallelism": count}
    if str(_annotations(obj).get(keys.COMPLETIONS_EQUAL_PARALLELISM, "")).strip().lower() in (
        "true",
        "1",
        "t",
    ):
        out["completions"] = count
    return out


def jobset(obj: Mapping[str, Any]) -> list[PodSetRef]:
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


def pytorch_job(obj: Mapping[str, Any]) -> list[PodSetRef]:
    specs = obj.get("spec", {}).get("pytorchReplicaSpecs", {})
    return [
        PodSetRef(
            role.lower(), _int(spec.get("replicas"), 1), ("spec", "pytorchReplicaSpecs", role, "template")
        )
        for role, spec in sorted(specs.items(), key=lambda kv: (kv[0] != "Master", kv[0]))
    ]


def ray_job(obj: Mapping[str, Any]) -> list[PodSetRef]:
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


def train_job(obj: Mapping[str, Any]) -> list[PodSetRef]:
    return [
        PodSetRef(
            "node", _int(obj.get("spec", {}).get("trainer", {}).get("numNodes"), 1), ("spec", "trainer")
        )
    ]


def leader_worker_set(obj: Mapping[str, Any]) -> list[PodSetRef]:
    spec = obj.get("spec", {})
    lwt = spec.get("leaderWorkerTemplate", {})
    replicas, size = _int(spec.get("replicas"), 1), _int(lwt.get("size"), 1)
    leader = ("spec", "leaderWorkerTemplate", "leaderTemplate") if "leaderTemplate" in lwt else None
    worker = ("spec", "leaderWorkerTemplate", "workerTemplate")
    out = [PodSetRef("leader", replicas, leader or worker)]
    if size > 1:
        out.append(PodSetRef("workers", replicas * (size - 1), worker))
    return out


POD_SETS: dict[str, Callable[[Mapping[str, Any]], list[PodSetRef]]] = {
    "Job": batch_job,
    "JobSet": jobset,
    "PyTorchJob": pytorch_job,
    "TrainJob": train_job,
    "RayJob": ray_job,
    "LeaderWorkerSet": leader_worker_set,
}


def workload_name(kind: str, name: str, uid: str) -> str:
    """The Workload's name for the job ``kind``/``name`` with ``uid``, at most 63 characters.

    An object read from a file may have no uid; callers then pass ``namespace/name``, so two
    jobs of one name in different namespaces still get different hashes.
    """
    digest = hashlib.sha256(f"{kind}/{name}/{uid}".encode()).hexdigest()[:_HASH_LENGTH]
    return f"{kind.lower()}-{name}"[:_PREFIX_LENGTH] + f"-{digest}"


def queue_name(labels: Mapping[str, str], annotations: Mapping[str, str]) -> str | None:
    """The LocalQueue a job or pod asks for (Kueue reads the label, then the old annotation)."""
    return labels.get(keys.QUEUE_NAME_LABEL) or annotations.get(keys.QUEUE_NAME_LABEL) or None


def _template_for_workload(template: Mapping[str, Any], kind: str) -> dict[str, Any]:
    if kind == "TrainJob":  # the trainer block carries per-node resources, not a pod template
        resources = template.get("resourcesPerNode", {})
        return {"spec": {"containers": [{"name": "node", "resources": resources}]}}
    out = copy.deepcopy(dict(template))
    out.get("metadata", {}).pop("labels", None)
    return out


def _priority_fields(priority_class: str | None, priorities: Mapping[str, int]) -> dict[str, Any]:
    if not priority_class:
        return {}
    return {
        "priorityClassRef": {
            "group": keys.KUEUE_GROUP,
            "kind": "WorkloadPriorityClass",
            "name": priority_class,
        },
        "priority": priorities.get(priority_class, 0),
    }


def workload_document(
    kind: str, obj: Mapping[str, Any], priorities: Mapping[str, int], api_version: str = ""
) -> dict[str, Any] | None:
    """The Workload object (as a document) for a queued job, or ``None`` if the job is not queued.

    ``api_version`` is the owner reference's, used when ``obj`` carries none.
    """
    meta = obj.get("metadata", {})
    labels = meta.get("labels", {}) or {}
    queue = queue_name(labels, meta.get("annotations", {}) or {})
    if not queue:
        return None
    pod_sets: list[dict[str, Any]] = []
    for ps in POD_SETS[kind](obj):
        pod_set: dict[str, Any] = {
            "name": ps.name,
            "count": ps.count,
            "template": _template_for_workload(get_path(obj, ps.template), kind),
        }
        if ps.min_count is not None:
            pod_set["minCount"] = ps.min_count
        pod_sets.append(pod_set)
    spec: dict[str, Any] = {"queueName": queue, "podSets": pod_sets}
    spec.update(_priority_fields(labels.get(keys.PRIORITY_CLASS_LABEL), priorities))
    namespace = meta.get("namespace", "default")
    uid = str(meta.get("uid", ""))
    return {
        "apiVersion": f"{keys.KUEUE_GROUP}/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name(kind, meta["name"], uid or f"{namespace}/{meta['name']}"),
            "namespace": namespace,
            "labels": {keys.JOB_UID_LABEL: uid},
            "ownerReferences": [
                {
                    "apiVersion": obj.get("apiVersion", api_version),
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


def pod_group_document(
    pods: Sequence[Mapping[str, Any]], priorities: Mapping[str, int]
) -> dict[str, Any] | None:
    """The Workload of a plain pod or a pod group (all pods that have arrived), or ``None``."""
    first = pods[0]
    meta = first.get("metadata", {})
    labels = meta.get("labels", {}) or {}
    annotations = meta.get("annotations", {}) or {}
    queue = queue_name(labels, annotations)
    if not queue:
        return None
    group = labels.get(keys.POD_GROUP_LABEL)
    count = int(annotations.get(keys.POD_GROUP_COUNT, "1")) if group else 1
    name = group or meta["name"]
    template = {"metadata": {}, "spec": copy.deepcopy(dict(first.get("spec", {})))}
    template["spec"].pop("nodeName", None)
    template["spec"].pop("schedulingGates", None)
    spec: dict[str, Any] = {
        "queueName": queue,
        "podSets": [{"name": "main", "count": count, "template": template}],
    }
    spec.update(_priority_fields(labels.get(keys.PRIORITY_CLASS_LABEL), priorities))
    namespace = meta.get("namespace", "default")
    return {
        "apiVersion": f"{keys.KUEUE_GROUP}/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": workload_name("Pod" if not group else "PodGroup", name, namespace),
            "namespace": namespace,
            "labels": {keys.JOB_UID_LABEL: name},
        },
        "spec": spec,
    }
