"""The cluster as a plan leaves it: admissions recorded, victims back in their queues.

Insight answers questions about the moment *after* a scheduling run: who holds the quota a
pending workload waits for, which node would fit it after one preemption, how long until it
starts. :func:`state_after` gives that moment as a frozen :class:`ClusterState`, and
:func:`world_after` the core's working copy of it (quota tree with usage, node inventory with
every holder), built by the same :class:`~gpuplane.core.scheduler.Scheduler` that decides.

The working copy places newly admitted workloads itself (deterministically); when the plan
carried a placement it is usually the same one, but insight never relies on that.
"""

from __future__ import annotations

from dataclasses import replace

from gpuplane.core.analysis import Scheduler
from gpuplane.core.session import Plan, Reason, SchedulerConfig
from gpuplane.model.conditions import ConditionType
from gpuplane.model.objects import (
    Admission,
    ClusterState,
    Condition,
    PodSetAssignment,
    Workload,
    frozen_map,
)

# Replaced whenever a plan admits or evicts a workload.
_ADMISSION_CONDITIONS = (ConditionType.QUOTA_RESERVED, ConditionType.ADMITTED, ConditionType.EVICTED)


def _admitted(wl: Workload, plan_admission: Admission, now: float) -> Workload:
    kept = tuple(c for c in wl.conditions if c.type not in _ADMISSION_CONDITIONS)
    reserved = Condition(ConditionType.QUOTA_RESERVED, True, Reason.QUOTA_RESERVED, "", now)
    return replace(wl, admission=plan_admission, conditions=(*kept, reserved))


def state_after(state: ClusterState, plan: Plan, now: float) -> ClusterState:
    """``state`` with the plan's admissions recorded and its victims' admissions removed.

    An admitted workload gets ``status.admission`` (usage = per-pod requests x admitted
    count) and ``QuotaReserved=True`` at ``now``; a victim loses its admission and is pending
    again. Nothing else changes.
    """
    decisions = {a.workload: a for a in plan.admitted}
    victims = {p.workload for p in plan.preempted}
    workloads: list[Workload] = []
    for original in state.workloads:
        wl = original
        decision = decisions.get(wl.key)
        if decision is not None and wl.admission is None:
            templates = {ps.name: ps.template for ps in wl.pod_sets}
            assignments = tuple(
                PodSetAssignment(
                    name=d.name,
                    count=d.count,
                    flavors=frozen_map(d.flavors),
                    resource_usage=frozen_map(
                        {res: q * d.count for res, q in templates[d.name].quota_requests.items()}
                        if d.name in templates
                        else {}
                    ),
                )
                for d in decision.pod_sets
            )
            wl = _admitted(wl, Admission(decision.cluster_queue, assignments), now)
        elif wl.key in victims and wl.admission is not None:
            evicted = Condition(ConditionType.EVICTED, True, Reason.PREEMPTED, "", now)
            kept = tuple(c for c in wl.conditions if c.type not in _ADMISSION_CONDITIONS)
            wl = replace(wl, admission=None, conditions=(*kept, evicted))
        workloads.append(wl)
    return replace(state, workloads=tuple(workloads))


def world_after(state: ClusterState, plan: Plan, config: SchedulerConfig, now: float) -> Scheduler:
    """The core's working copy of :func:`state_after`: quota usage and node holders.

    The returned scheduler is only read (``tree``, ``cluster``) and probed under the core's
    undo context managers; no cycle is run on it.
    """
    return Scheduler(state_after(state, plan, now), config, now)
