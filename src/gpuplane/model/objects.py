"""Frozen domain types for the Kubernetes and Kueue objects gpuplane reads.

Everything here is immutable: mappings are ``types.MappingProxyType`` views and
sequences are tuples, so a snapshot built from these objects cannot be changed by
accident while the core is deciding on it. Quantities are integers in base units
(``cpu`` in millicores, everything else in units; see :mod:`gpuplane.model.quantity`).
Timestamps are seconds since the Unix epoch, as floats.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, TypeVar

from gpuplane.model import gpu_share
from gpuplane.model import labels as keys
from gpuplane.model.admission_checks import AdmissionCheck, CheckRef, CheckStatus
from gpuplane.model.dra import DraObjects, PodClaim, QuotaSource

if TYPE_CHECKING:
    from gpuplane.model.karpenter import NodePool

K = TypeVar("K")
V = TypeVar("V")

EMPTY: Mapping[str, str] = MappingProxyType({})
NO_COUNTS: Mapping[str, int] = MappingProxyType({})
WARM_NODES_ANNOTATION = keys.WARM_NODES_ANNOTATION
WARM_NODE_GPUS_ANNOTATION = keys.WARM_NODE_GPUS_ANNOTATION
WARM_BUFFER_LABEL = keys.WARM_BUFFER_LABEL  # on placeholder pods: the flavor they keep warm
INTERRUPTED_REASON = "NodeInterrupted"  # Evicted reason when a workload's node is taken back


def frozen_map(items: Mapping[K, V] | None = None) -> Mapping[K, V]:
    """Read-only copy of ``items`` (or an empty mapping)."""
    return MappingProxyType(dict(items or {}))


# ---------------------------------------------------------------------------
# Scheduling building blocks shared by pods, nodes and flavors
# ---------------------------------------------------------------------------

TaintEffect = Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str
    operator: str  # "Equal" or "Exists"
    value: str
    effect: str  # "" means every effect

    def tolerates(self, taint: Taint) -> bool:
        """Kubernetes' toleration matching (core/v1 ToleratesTaint)."""
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        if self.operator == "Exists":
            return True
        # An empty key with operator Equal matches nothing but an empty-key taint.
        return self.value == taint.value


@dataclass(frozen=True, slots=True)
class SelectorRequirement:
    """One ``matchExpressions`` entry (label selectors and node selector terms)."""

    key: str
    operator: str  # In, NotIn, Exists, DoesNotExist, Gt, Lt
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        op = self.operator
        if op in ("Gt", "Lt"):
            return present and self._compares(labels[self.key])
        if op == "In":
            return present and labels[self.key] in self.values
        if op == "NotIn":
            return not present or labels[self.key] not in self.values
        if op == "Exists":
            return present
        return op == "DoesNotExist" and not present  # an unknown operator matches nothing

    def _compares(self, value: str) -> bool:
        """``Gt`` / ``Lt``: the label and the one value compared as integers."""
        if len(self.values) != 1:
            return False
        try:
            have, want = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > want if self.operator == "Gt" else have < want


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A metav1.LabelSelector. ``{}`` selects everything.

    ``nothing=True`` is the null selector where Kueue reads null as "no object": a ClusterQueue
    without ``namespaceSelector`` admits from no namespace.
    """

    match_labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    match_expressions: tuple[SelectorRequirement, ...] = ()
    nothing: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.nothing:
            return False
        for k, v in self.match_labels.items():
            if labels.get(k) != v:
                return False
        return all(req.matches(labels) for req in self.match_expressions)


@dataclass(frozen=True, slots=True)
class NodeSelectorTerm:
    match_expressions: tuple[SelectorRequirement, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        # An empty term matches nothing, as in Kubernetes.
        if not self.match_expressions:
            return False
        return all(req.matches(labels) for req in self.match_expressions)


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """What scheduling needs from a pod template.

    ``requests`` are the effective per-pod requests: the larger of the sum of the
    regular containers (plus restartable init containers) and each init container,
    plus pod overhead, as the Kubernetes scheduler computes them. They are what a node
    must hold.

    ``quota_requests`` (derived, never given) are what one pod is charged against
    ClusterQueue quota: ``requests`` plus the pod's share of a GPU under
    ``gpuplane.dev/gpu-fraction`` when its annotations ask for one (see
    :mod:`gpuplane.model.gpu_share`), and what its ResourceClaims cost (``claim_quota``, in place
    of the ``claim_replaced`` requests; see :mod:`gpuplane.model.dra_quota`). Every quota
    computation reads these.
    """

    requests: Mapping[str, int]
    limits_below_requests: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    required_node_terms: tuple[NodeSelectorTerm, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    active_deadline: int | None = None  # spec.activeDeadlineSeconds: a limit on the pod's run
    claims: tuple[PodClaim, ...] = ()  # spec.resourceClaims (Dynamic Resource Allocation)
    # What the pod's claims are charged against quota (Kueue's deviceClassMappings), and requests
    # whose charge they replace (an extended resource a DeviceClass stands for).
    claim_quota: Mapping[str, int] = field(default_factory=lambda: NO_COUNTS)
    claim_replaced: tuple[str, ...] = ()
    quota_requests: Mapping[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        charged = gpu_share.quota_requests(self.requests, self.annotations)
        if self.claim_quota or self.claim_replaced:
            charged = {k: v for k, v in charged.items() if k not in self.claim_replaced}
            for name, amount in self.claim_quota.items():
                charged[name] = charged.get(name, 0) + amount
        if charged is not self.requests:
            charged = MappingProxyType(dict(charged))
        object.__setattr__(self, "quota_requests", charged)

    def node_matches(self, labels: Mapping[str, str]) -> bool:
        """Required node selector and node affinity against a node's labels."""
        for k, v in self.node_selector.items():
            if labels.get(k) != v:
                return False
        if self.required_node_terms is None:
            return True
        return any(term.matches(labels) for term in self.required_node_terms)


# ---------------------------------------------------------------------------
# Workloads
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodSet:
    name: str
    count: int
    template: PodTemplate
    min_count: int | None = None
    required_topology: str | None = None
    preferred_topology: str | None = None


@dataclass(frozen=True, slots=True)
class PodSetAssignment:
    name: str
    count: int
    flavors: Mapping[str, str]
    resource_usage: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Admission:
    cluster_queue: str
    pod_set_assignments: tuple[PodSetAssignment, ...]


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str = ""
    message: str = ""
    last_transition: float = 0.0


@dataclass(frozen=True, slots=True)
class Workload:
    """A Kueue Workload (or one derived from a job)."""

    namespace: str
    name: str
    uid: str
    creation: float
    priority: int
    pod_sets: tuple[PodSet, ...]
    queue_name: str | None = None
    priority_class: str | None = None
    admission: Admission | None = None
    conditions: tuple[Condition, ...] = ()
    active: bool = True
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    check_states: tuple[CheckStatus, ...] = ()  # status.admissionChecks
    # status.reclaimablePods: pods of a pod set that ended and will not run again (Kueue's field);
    # an admitted workload's quota and devices for them go back before the workload finishes.
    reclaimable: Mapping[str, int] = field(default_factory=lambda: NO_COUNTS)
    # MultiKueue on a manager: the worker cluster it runs on (status.clusterName), and those it is
    # nominated to while it is dispatched (status.nominatedClusterNames).
    cluster_name: str | None = None
    nominated_clusters: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    def condition(self, ctype: str) -> Condition | None:
        for cond in self.conditions:
            if cond.type == ctype:
                return cond
        return None

    def condition_true(self, ctype: str) -> bool:
        cond = self.condition(ctype)
        return cond is not None and cond.status

    @property
    def has_quota_reservation(self) -> bool:
        return self.admission is not None

    @property
    def evicted(self) -> bool:
        return self.condition_true("Evicted")

    @property
    def finished(self) -> bool:
        return self.condition_true("Finished")

    def quota_reservation_time(self, now: float) -> float:
        cond = self.condition("QuotaReserved")
        if cond is None or not cond.status:
            return now
        return cond.last_transition

    @property
    def queue_order_timestamp(self) -> float:
        """Kueue's queue ordering time: the eviction time for requeued workloads. A workload whose
        node was taken back (spot interruption) goes back to the head of its priority band."""
        cond = self.condition("Evicted")
        if cond is not None and cond.status:
            return 0.0 if cond.reason == INTERRUPTED_REASON else cond.last_transition
        return self.creation


# ---------------------------------------------------------------------------
# Kueue configuration kinds
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResourceQuota:
    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None


@dataclass(frozen=True, slots=True)
class FlavorQuotas:
    name: str
    resources: Mapping[str, ResourceQuota]


@dataclass(frozen=True, slots=True)
class ResourceGroup:
    covered_resources: tuple[str, ...]
    flavors: tuple[FlavorQuotas, ...]


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    within_cluster_queue: str = "Never"  # Never | LowerPriority | LowerOrNewerEqualPriority
    reclaim_within_cohort: str = "Never"  # Never | LowerPriority | Any
    borrow_within_cohort: str = "Never"  # Never | LowerPriority
    max_priority_threshold: int | None = None


@dataclass(frozen=True, slots=True)
class FlavorFungibility:
    when_can_borrow: str = "MayStopSearch"  # MayStopSearch | TryNextFlavor
    when_can_preempt: str = "TryNextFlavor"  # MayStopSearch | TryNextFlavor
    preference: str | None = None  # BorrowingOverPreemption | PreemptionOverBorrowing


@dataclass(frozen=True, slots=True)
class ClusterQueue:
    name: str
    resource_groups: tuple[ResourceGroup, ...]
    cohort: str | None = None
    namespace_selector: LabelSelector | None = None
    queueing_strategy: str = "BestEffortFIFO"
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    flavor_fungibility: FlavorFungibility = field(default_factory=FlavorFungibility)
    fair_weight: float = 1.0
    stop_policy: str = "None"  # None | Hold | HoldAndDrain
    admission_checks: tuple[CheckRef, ...] = ()


@dataclass(frozen=True, slots=True)
class Cohort:
    name: str
    parent: str | None = None
    resource_groups: tuple[ResourceGroup, ...] = ()
    fair_weight: float = 1.0


@dataclass(frozen=True, slots=True)
class ResourceFlavor:
    name: str
    node_labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    node_taints: tuple[Taint, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    topology_name: str | None = None
    warm_nodes: int = 0  # annotation gpuplane.dev/warm-nodes: idle nodes kept ready (placeholder pods)
    warm_node_gpus: int = 0  # annotation gpuplane.dev/warm-node-gpus: what one placeholder requests


@dataclass(frozen=True, slots=True)
class LocalQueue:
    namespace: str
    name: str
    cluster_queue: str
    stop_policy: str = "None"

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class WorkloadPriorityClass:
    name: str
    value: int


@dataclass(frozen=True, slots=True)
class Topology:
    name: str
    levels: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Namespace:
    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True, slots=True)
class KueueConfiguration:
    """The parts of Kueue's ``config.kueue.x-k8s.io`` Configuration the core uses."""

    fair_sharing: bool = False
    preemption_strategies: tuple[str, ...] = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
    feature_gates: Mapping[str, bool] = field(default_factory=lambda: MappingProxyType({}))
    # resources.deviceClassMappings: DeviceClass -> the resource its devices are charged as.
    device_class_mappings: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    # Their sources: DeviceClass -> counters or capacities charged instead of the device count.
    device_class_sources: Mapping[str, tuple[QuotaSource, ...]] = field(
        default_factory=lambda: MappingProxyType({})
    )

    def gate(self, name: str) -> bool:
        """Feature gate value, with Kueue's defaults for the gates the core reads."""
        return self.feature_gates.get(name, DEFAULT_FEATURE_GATES.get(name, False))


DEFAULT_FEATURE_GATES: Mapping[str, bool] = MappingProxyType(
    {
        "PartialAdmission": True,
        "FlavorFungibility": True,
        "PrioritySortingWithinCohort": True,
        "FairSharingPrioritizeNonBorrowing": True,
        "FairSharingPreemptWithinNominal": True,
        "RecomputeAssignmentUponPreemptionTargetsOverlap": True,
        "FlavorFungibilityPreserveScanProgress": True,
        "MultiKueueOrchestratedPreemption": False,
    }
)


# ---------------------------------------------------------------------------
# Core Kubernetes kinds
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    allocatable: Mapping[str, int]
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    annotations: Mapping[str, str] = field(default_factory=lambda: EMPTY)


@dataclass(frozen=True, slots=True)
class Pod:
    namespace: str
    name: str
    template: PodTemplate
    node_name: str | None = None
    phase: str = "Pending"
    scheduler_name: str | None = None  # spec.schedulerName; None where the document gives none

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class InvalidWorkload:
    """A Workload (or queued Job) that exists but cannot be scheduled as written.

    Kueue keeps such a workload pending with reason ``Misconfigured``; every other object is
    scheduled as usual. ``problem`` is the located one-line description of what is wrong.
    """

    namespace: str
    name: str
    queue_name: str | None
    problem: str

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ClusterState:
    """Everything read from the input files, validated and cross-checked."""

    configuration: KueueConfiguration = field(default_factory=KueueConfiguration)
    namespaces: Mapping[str, Namespace] = field(default_factory=lambda: MappingProxyType({}))
    resource_flavors: Mapping[str, ResourceFlavor] = field(default_factory=lambda: MappingProxyType({}))
    cohorts: Mapping[str, Cohort] = field(default_factory=lambda: MappingProxyType({}))
    cluster_queues: Mapping[str, ClusterQueue] = field(default_factory=lambda: MappingProxyType({}))
    local_queues: Mapping[str, LocalQueue] = field(default_factory=lambda: MappingProxyType({}))
    priority_classes: Mapping[str, WorkloadPriorityClass] = field(
        default_factory=lambda: MappingProxyType({})
    )
    topologies: Mapping[str, Topology] = field(default_factory=lambda: MappingProxyType({}))
    workloads: tuple[Workload, ...] = ()
    nodes: tuple[Node, ...] = ()
    pods: tuple[Pod, ...] = ()
    invalid_workloads: tuple[InvalidWorkload, ...] = ()
    admission_checks: Mapping[str, AdmissionCheck] = field(default_factory=lambda: MappingProxyType({}))
    node_pools: Mapping[str, NodePool] = field(default_factory=lambda: MappingProxyType({}))  # Karpenter
    dra: DraObjects = field(default_factory=DraObjects)  # resource.k8s.io/v1 objects
    # "Kind/key" -> (file, document index), to point errors found later at their source.
    origins: Mapping[str, tuple[str, int]] = field(
        default_factory=lambda: MappingProxyType({}), compare=False, repr=False
    )

    def locate(self, obj: str | None) -> tuple[str, int] | None:
        return self.origins.get(obj or "")
