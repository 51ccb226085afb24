"""Scheduler configuration, built once at the edge and passed down.

No code in the core reads feature gates or flags by itself: they are resolved here
into plain booleans from Kueue's Configuration object.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuplane.core.placement.devices import DeviceConfig
from gpuplane.model.objects import KueueConfiguration

STRATEGIES = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Policy switches for one scheduling run.

    ``kueue_cycles`` selects Kueue's exact cycle semantics (one head per
    ClusterQueue, a preemptor is not admitted in the cycle that evicts its victims).
    ``max_cycles`` bounds a drain to a fixed point.
    """

    fair_sharing: bool = False
    fs_strategies: tuple[str, ...] = STRATEGIES
    partial_admission: bool = True
    flavor_fungibility: bool = True
    priority_sorting_within_cohort: bool = True
    prioritize_non_borrowing: bool = True
    reevaluate_fair_candidates: bool = False
    fair_preempt_within_nominal: bool = True
    preemption_gates: bool = False
    # RecomputeAssignmentUponPreemptionTargetsOverlap: an entry whose targets overlap an earlier
    # entry's recomputes its assignment on the nominated flavors as if those victims were gone.
    recompute_on_overlap: bool = True
    # FlavorFungibilityPreserveScanProgress: a flavor scan recorded in the last cycle is resumed
    # even when admissions or evictions in the cohort happened since.
    preserve_scan_progress: bool = True
    max_cycles: int = 100_000
    # gpuplane's cheaper preemption (off for Kueue fidelity): a workload younger than
    # ``min_runtime_seconds`` is never a victim, and among equal priorities the victim
    # that loses the least work since its last checkpoint goes first.
    min_runtime_seconds: float = 0.0
    checkpoint_aware: bool = False
    devices: DeviceConfig = field(default_factory=DeviceConfig)


def config_from_kueue(conf: KueueConfiguration) -> SchedulerConfig:
    """Resolve Kueue's Configuration (fair sharing, strategies, feature gates)."""
    return SchedulerConfig(
        fair_sharing=conf.fair_sharing,
        fs_strategies=conf.preemption_strategies or STRATEGIES,
        partial_admission=conf.gate("PartialAdmission"),
        flavor_fungibility=conf.gate("FlavorFungibility"),
        priority_sorting_within_cohort=conf.gate("PrioritySortingWithinCohort"),
        prioritize_non_borrowing=conf.gate("FairSharingPrioritizeNonBorrowing"),
        reevaluate_fair_candidates=conf.gate("FairSharingReevaluatePreemptionCandidates"),
        fair_preempt_within_nominal=conf.gate("FairSharingPreemptWithinNominal"),
        preemption_gates=conf.gate("MultiKueueOrchestratedPreemption"),
        recompute_on_overlap=conf.gate("RecomputeAssignmentUponPreemptionTargetsOverlap"),
        preserve_scan_progress=conf.gate("FlavorFungibilityPreserveScanProgress"),
    )
