"""Work that went around gpuplane, and what to do about it.

gpuplane admits a job and binds its pods itself: the job waits suspended until its Workload is
admitted, and its pods carry ``schedulerName: gpuplane`` so that no other scheduler takes them.
Both depend on gpuplane's mutating webhook (:mod:`gpuplane.k8s.webhook`), as Kueue's guardrails
depend on Kueue's. Without it:

* a queued job created unsuspended runs at once: its pods go to kube-scheduler and no Workload is
  ever made for it (:func:`bypassed_job_message`);
* an admitted job's pods keep the default scheduler name, so kube-scheduler binds them one by one,
  wherever it likes, and a gang can end half placed (:func:`foreign_bindings`).

Pure functions over the parsed cluster state; nothing here reads the API.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplane.model import labels as keys
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from gpuplane.model.objects import ClusterState, Pod, Workload
from gpuplane.model.records import recorded_placement

BOUND_ELSEWHERE = "BoundByAnotherScheduler"
WEBHOOK_DOCS = "docs/deploy.md, 'The webhook'"
WEBHOOK_FIX = (
    f"register gpuplane's mutating webhook for pods and jobs ({WEBHOOK_DOCS}; `gpuplane doctor "
    "--kubeconfig` checks it), then delete and re-create the job so that it is queued from the start"
)


@dataclass(frozen=True, slots=True)
class ForeignBinding:
    """A bound pod of an admitted workload that gpuplane did not place: ``detail`` says why."""

    pod: Pod
    detail: str


def workload_pods(state: ClusterState, wl: Workload) -> list[Pod]:
    """The bound pods that belong to ``wl``: a released job's pods carry its name in Kueue's
    workload label or gpuplane's."""
    labels = (keys.KUEUE_WORKLOAD_LABEL, keys.WORKLOAD_LABEL)
    return [
        p
        for p in state.pods
        if p.namespace == wl.namespace
        and p.node_name
        and any(p.template.labels.get(k) == wl.name for k in labels)
    ]


def foreign_bindings(state: ClusterState, wl: Workload) -> list[ForeignBinding]:
    """The bound pods of admitted ``wl`` that another scheduler placed: a scheduler name other
    than gpuplane's (a pod whose document gives none is not judged), or a node outside the
    placement recorded on the Workload (when one is recorded). Empty when all is well."""
    planned = recorded_placement(wl.annotations.get(PLACEMENT_ANNOTATION))
    nodes = None if planned is None else {node for slots in planned.values() for node, _ in slots}
    found = []
    for pod in workload_pods(state, wl):
        if pod.scheduler_name is not None and pod.scheduler_name != keys.SCHEDULER_NAME:
            found.append(ForeignBinding(pod, f"schedulerName {pod.scheduler_name}, bound to {pod.node_name}"))
        elif nodes is not None and pod.node_name not in nodes:
            found.append(
                ForeignBinding(pod, f"bound to {pod.node_name}, a node gpuplane did not plan for it")
            )
    return found


def foreign_bindings_message(found: list[ForeignBinding]) -> str:
    """One sentence for ``why``: how many of the workload's pods another scheduler bound."""
    names = ", ".join(sorted(b.pod.name for b in found))
    return (
        f"admitted, but {len(found)} of its pods ({names}) were bound by another scheduler, not by "
        "gpuplane: the webhook that gives them gpuplane's scheduler name did not run, so the gang "
        "may be placed in part, on nodes and devices other than the ones gpuplane reserved"
    )


def bypassed_job_message(kind: str, key: str, queue: str) -> str:
    """What ``why`` says of a job that names LocalQueue ``queue`` but has no Workload because it
    was created unsuspended: it went around gpuplane, with the fix."""
    return (
        f"{kind} {key} bypassed gpuplane: it names LocalQueue {queue} ({keys.QUEUE_NAME_LABEL}) but "
        "was created unsuspended, and no webhook suspended it at creation, so it has no Workload "
        f"and kube-scheduler runs its pods outside any quota. Fix: {WEBHOOK_FIX}"
    )
