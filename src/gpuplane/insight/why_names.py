"""Which workload a NAME means to ``gpuplane why``: ``[KIND/]NAME`` as kubectl spells it.

A job's Workload is the one named ``<kind>-<name>-<5 hex>`` (as Kueue and gpuplane name it); a pod's is
found through its workload label, its Job, its pod group, or its own name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from gpuplane.model import labels as keys
from gpuplane.model.objects import ClusterState, Pod, Workload

WORKLOAD_NAME_LABEL = keys.KUEUE_WORKLOAD_LABEL
QUEUE_NAME_LABEL = keys.QUEUE_NAME_LABEL
POD_GROUP_LABEL = keys.POD_GROUP_LABEL
JOB_NAME_LABELS = ("batch.kubernetes.io/job-name", "job-name")
# kubectl's spellings of the kinds a NAME may carry, to the kind a Workload is named after.
KIND_ALIASES = {
    "workload": "workload",
    "workloads": "workload",
    "wl": "workload",
    "workload.kueue.x-k8s.io": "workload",
    "pod": "pod",
    "pods": "pod",
    "po": "pod",
    "job": "job",
    "jobs": "job",
    "job.batch": "job",
    "jobset": "jobset",
    "jobsets": "jobset",
    "pytorchjob": "pytorchjob",
    "pytorchjobs": "pytorchjob",
    "rayjob": "rayjob",
    "rayjobs": "rayjob",
    "trainjob": "trainjob",
    "trainjobs": "trainjob",
    "leaderworkerset": "leaderworkerset",
    "leaderworkersets": "leaderworkerset",
    "lws": "leaderworkerset",
}


class NotFoundError(LookupError):
    """The NAME given to ``why`` names no workload (the message says what was looked for)."""


# ---------------------------------------------------------------------------
# Finding the workload behind a name
# ---------------------------------------------------------------------------


def split_reference(ref: str) -> tuple[str, str]:
    """``[KIND/]NAME`` as kubectl spells it into (canonical kind, name); bare names are Workloads."""
    kind, sep, name = ref.partition("/")
    if not sep:
        return "workload", ref
    canonical = KIND_ALIASES.get(kind.lower())
    if canonical is None or not name or "/" in name:
        known = ", ".join(sorted(set(KIND_ALIASES.values())))
        raise NotFoundError(f"cannot read {ref!r}: expected [KIND/]NAME with KIND one of {known}")
    return canonical, name


def owned_workload_names(kind: str, name: str, workloads: Iterable[Workload]) -> list[Workload]:
    """Workloads named as Kueue and gpuplane name the Workload of a ``kind`` object ``name``.

    Both name it ``<kind>-<name>-<5 hex digits>`` (the name part cut to fit 63 characters).
    """
    prefix = f"{kind}-{name}"[:56]
    pattern = re.compile(re.escape(prefix) + r"-[0-9a-f]{5}$")
    return [wl for wl in workloads if pattern.match(wl.name)]


def resolve(state: ClusterState, ref: str, namespace: str) -> Workload:
    """The workload behind ``ref`` (``[KIND/]NAME``) in ``namespace``; raises :class:`NotFoundError`."""
    kind, name = split_reference(ref)
    here = [wl for wl in state.workloads if wl.namespace == namespace]
    if kind == "workload":
        for wl in here:
            if wl.name == name:
                return wl
        raise NotFoundError(f"workload {namespace}/{name} not found")
    if kind == "pod":
        return _resolve_pod(state, here, name, namespace)
    found = owned_workload_names(kind, name, here)
    if not found:
        raise NotFoundError(
            f"no workload for {kind} {namespace}/{name} (is it queued with {QUEUE_NAME_LABEL}?)"
        )
    return found[0]


def _resolve_pod(state: ClusterState, here: Sequence[Workload], name: str, namespace: str) -> Workload:
    pod: Pod | None = next((p for p in state.pods if p.namespace == namespace and p.name == name), None)
    if pod is not None:
        labels = pod.template.labels
        direct = labels.get(WORKLOAD_NAME_LABEL) or labels.get("gpuplane.dev/workload")
        if direct:
            for wl in here:
                if wl.name == direct:
                    return wl
        for label in JOB_NAME_LABELS:
            if label in labels:
                found = owned_workload_names("job", labels[label], here)
                if found:
                    return found[0]
        group = labels.get(POD_GROUP_LABEL)
        if group:
            found = owned_workload_names("podgroup", group, here)
            if found:
                return found[0]
    found = owned_workload_names("pod", name, here)
    if found:
        return found[0]
    if pod is not None and QUEUE_NAME_LABEL not in pod.template.labels:
        raise NotFoundError(
            f"pod {namespace}/{name} is not queued by gpuplane: it has no {QUEUE_NAME_LABEL} label"
        )
    raise NotFoundError(f"no workload for pod {namespace}/{name}")
