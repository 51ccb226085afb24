"""Who holds which accelerators, and what pending demand waits for, in GPU-equivalents.

Pure functions over a frozen :class:`ClusterState` (usually the state a plan leaves,
:func:`gpuplane.insight.aftermath.state_after`). A GPU-equivalent is one whole device: a MIG
instance counts as its compute slices over 7, a fraction as itself, a time-sliced or MPS slot
as one device (what it blocks others from), as :attr:`PodNeeds.gpu_milli` counts them (but exact).

``device_kind`` is ``whole``, ``mig``, ``fraction`` or ``shared``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from gpuplane.core.analysis import device_resource
from gpuplane.core.session import DeviceConfig, PodNeeds, pod_needs
from gpuplane.model import labels as keys
from gpuplane.model import mig
from gpuplane.model.objects import ClusterState, PodTemplate, Workload

DEVICE_KINDS = ("whole", "mig", "fraction", "shared")


@dataclass(frozen=True, slots=True)
class Allocation:
    """GPU-equivalents one admitted workload holds of one flavor and device kind."""

    namespace: str
    workload: str
    cluster_queue: str
    local_queue: str
    flavor: str
    device_kind: str
    gpus: float


def device_kind(needs: PodNeeds) -> str | None:
    """The kind of accelerator a pod uses, or ``None`` for a pod without one."""
    if needs.mig:
        return "mig"
    if needs.fraction_milli or needs.fraction_memory_mib:
        return "fraction"
    if needs.shared:
        return "shared"
    if needs.whole:
        return "whole"
    return None


def pod_gpus(template: PodTemplate, config: DeviceConfig) -> tuple[str | None, float]:
    """(device kind, GPU-equivalents) of one pod; a template the core refuses holds none."""
    try:
        needs = pod_needs(template, config)
    except ValueError:
        return None, 0.0
    return device_kind(needs), gpu_equivalents(needs)


def gpu_equivalents(needs: PodNeeds) -> float:
    """Exact GPU-equivalents of one pod (``PodNeeds.gpu_milli`` rounds MIG slices down)."""
    slices = sum(mig.parse_profile(p).compute * n for p, n in needs.mig.items())
    return needs.whole + needs.fraction_milli / 1000 + slices / 7 + needs.shared


def workload_gpus(wl: Workload, config: DeviceConfig) -> float:
    """GPU-equivalents of every pod of ``wl`` at full count."""
    return sum(pod_gpus(ps.template, config)[1] * ps.count for ps in wl.pod_sets)


def allocations(state: ClusterState, config: DeviceConfig) -> Iterator[Allocation]:
    """One :class:`Allocation` per admitted, unfinished workload, pod set and device kind."""
    for wl in state.workloads:
        if wl.admission is None or wl.finished:
            continue
        yield from _workload_allocations(wl, config)


def _workload_allocations(wl: Workload, config: DeviceConfig) -> Iterable[Allocation]:
    assert wl.admission is not None
    templates = {ps.name: ps.template for ps in wl.pod_sets}
    for psa in wl.admission.pod_set_assignments:
        template = templates.get(psa.name)
        if template is None:
            continue
        kind, per_pod = pod_gpus(template, config)
        if kind is None or not per_pod:
            continue
        device_flavor = psa.flavors.get(device_resource(psa.flavors, config)) or next(
            iter(sorted(psa.flavors.values())), ""
        )
        yield Allocation(
            namespace=wl.namespace,
            workload=wl.key,
            cluster_queue=wl.admission.cluster_queue,
            local_queue=wl.queue_name or "",
            flavor=device_flavor,
            device_kind=kind,
            gpus=per_pod * psa.count,
        )


CLUSTER_QUEUE_LABEL = keys.CLUSTER_QUEUE_LABEL
LOCAL_QUEUE_LABEL = keys.LOCAL_QUEUE_LABEL
QUEUE_NAME_LABEL = keys.QUEUE_NAME_LABEL
WORKLOAD_LABELS = ("kueue.x-k8s.io/workload-name", "gpuplane.dev/workload")
TEAM_LABEL = "team"
NO_TEAM = "none"


@dataclass(frozen=True, slots=True)
class PodAllocation:
    """GPU-equivalents one bound pod holds, with what ties it to a queue and a team.

    ``team`` is the pod's ``team`` label, else its namespace's, else ``none``.
    """

    namespace: str
    pod: str
    node: str
    workload: str
    cluster_queue: str
    local_queue: str
    team: str
    device_kind: str
    gpus: float


def pod_allocations(state: ClusterState, config: DeviceConfig) -> Iterator[PodAllocation]:
    """Every pod bound to a node (Pending or Running) that holds an accelerator."""
    workloads = {wl.key: wl for wl in state.workloads}
    for pod in state.pods:
        if pod.node_name is None or pod.phase not in ("Pending", "Running"):
            continue
        kind, gpus = pod_gpus(pod.template, config)
        if kind is None or not gpus:
            continue
        labels = pod.template.labels
        owner = next((labels[k] for k in WORKLOAD_LABELS if labels.get(k)), "")
        wl = workloads.get(f"{pod.namespace}/{owner}") if owner else None
        cq = labels.get(CLUSTER_QUEUE_LABEL) or (wl.admission.cluster_queue if wl and wl.admission else "")
        lq = (
            labels.get(LOCAL_QUEUE_LABEL)
            or labels.get(QUEUE_NAME_LABEL)
            or (wl.queue_name if wl else "")
            or ""
        )
        ns = state.namespaces.get(pod.namespace)
        team = labels.get(TEAM_LABEL) or (ns.labels.get(TEAM_LABEL) if ns else None) or NO_TEAM
        yield PodAllocation(
            namespace=pod.namespace,
            pod=pod.name,
            node=pod.node_name,
            workload=wl.name if wl else owner,
            cluster_queue=cq,
            local_queue=lq,
            team=team,
            device_kind=kind,
            gpus=gpus,
        )
