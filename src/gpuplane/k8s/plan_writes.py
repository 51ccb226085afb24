"""Observed state + plan -> writes: the pure half of a controller pass.

The functions here read the Workloads a plan names (through ``get``, the informer cache as the
controller observes it) and return the writes that carry the plan out, as data. They make no
request and change nothing; the controller's applier assumes each write in the cache, sends it,
and counts and reports what happened. So what a pass would write is testable without any API
server::

    admission_writes(get, plan, now)                       -> [Write(ADMIT, ...)]
    preemption_writes(get, plan, now, dry_run=...)         -> [Write(EVICT | WOULD_PREEMPT, ...)]
    eviction_writes(get, evicted, active, now)             -> [Write(STOP | REQUEUE, ...)]
    finished_workload(wl, succeeded, message, now)         -> the Workload with Finished=True
    pending_writes(get, plan, now, written)                -> [Write(PENDING, ...)]

The steps that follow the plan (Workloads of queued jobs, releases, bindings) are in
:mod:`gpuplane.k8s.bind_writes`.

``now`` is the time as the API writes it (a MicroTime string). Each step is idempotent: a
Workload that already shows what the plan asks gets no write.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuplane.core.session import (
    CONDITIONS,
    AdmissionDecision,
    PendingDecision,
    Plan,
    PreemptionDecision,
    Reason,
    WorkloadState,
    placement_annotation,
)
from gpuplane.k8s import api as k8s
from gpuplane.k8s.provisioning import checks_passed, pending_checks
from gpuplane.model import labels as keys
from gpuplane.model.conditions import ConditionType, condition, condition_true, with_conditions
from gpuplane.model.errors import InputError
from gpuplane.model.kinds import pod_template
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from gpuplane.model.quantity import format_quantity
from gpuplane.model.topology import topology_assignment

Get = Callable[[str], dict[str, Any] | None]  # a Workload by key, as observed
# What one pod of a Workload's pod set is charged (workload key, pod set), where its claims are charged.
Charged = Callable[[str, str], Mapping[str, int] | None]

# The conditions an admission sets, in the order they are written.
ADMISSION_ORDER = (ConditionType.QUOTA_RESERVED, ConditionType.ADMITTED)


class Verb(StrEnum):
    ADMIT = "admit"  # status.admission and conditions (and the plan's placement annotation)
    EVICT = "evict"  # Evicted + Preempted conditions; the admission stays until the job stops
    WOULD_PREEMPT = "would-preempt"  # dry run: an Event only
    PENDING = "pending"  # QuotaReserved=False with the core's reason
    STOP = "stop"  # an evicted workload's job suspended and its pods evicted; the admission stays
    REQUEUE = "requeue"  # an evicted, stopped workload's admission cleared: quota back, queued again
    CREATE = "create"  # a queued job's or gated pod group's new Workload (see k8s/bind_writes.py)
    RELEASE = "release"  # an admitted workload's job unsuspended, or a pod's admission gate lifted
    FINISH = "finish"  # the job ended: Finished=True (Succeeded or Failed); quota and devices go back


@dataclass(frozen=True, slots=True)
class Write:
    """One write a plan asks for: the Workload ``workload`` as it should be (``body``)."""

    verb: Verb
    workload: str
    body: dict[str, Any]
    message: str = ""
    kind: str = "Workload"  # what ``body`` is: a Workload, or (RELEASE) a job's kind or "Pod"
    # ADMIT: the placement annotation the observed Workload carries (a patch goes first if it
    # differs from the body's), the decision; PENDING: the decision.
    recorded: str | None = None
    admission: AdmissionDecision | None = None
    pending: PendingDecision | None = None


def copy_object(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of an API object (plain JSON data), to change and write back."""
    copied: dict[str, Any] = json.loads(json.dumps(obj))
    return copied


# --- admissions ---------------------------------------------------------------------------------


def admission_writes(get: Get, plan: Plan, now: str, charged: Charged | None = None) -> list[Write]:
    """The plan's admissions, each as the admitted Workload. One that is gone, or that already
    holds a reservation whose checks have not all passed, gets none. ``charged`` gives what one pod
    of a pod set is charged where its ResourceClaims are (Kueue's deviceClassMappings)."""
    out = []
    for decision in plan.admitted:
        wl = get(decision.workload)
        if wl is None or ((wl.get("status") or {}).get("admission") and not checks_passed(wl, decision)):
            continue
        recorded = ((wl.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        out.append(
            Write(
                Verb.ADMIT,
                decision.workload,
                admitted_workload(wl, decision, now, charged),
                recorded=recorded,
                admission=decision,
            )
        )
    return out


def _template_requests(template: dict[str, Any]) -> dict[str, int]:
    """What one pod of ``template`` is charged against quota (a GPU share's charge included)."""
    try:
        return dict(pod_template(template.get("spec", {}), "spec", template.get("metadata")).quota_requests)
    except InputError:
        return {}


def admitted_workload(
    wl: Mapping[str, Any], decision: AdmissionDecision, now: str, charged: Charged | None = None
) -> dict[str, Any]:
    """``wl`` with the decision's admission and the QuotaReserved and Admitted conditions."""
    assignments = []
    by_name = {ps["name"]: ps for ps in wl["spec"]["podSets"]}
    for ps in decision.pod_sets:
        claims = None if charged is None else charged(decision.workload, ps.name)
        requests = dict(claims) if claims is not None else _template_requests(by_name[ps.name]["template"])
        assignment: dict[str, Any] = {
            "name": ps.name,
            "count": ps.count,
            "flavors": dict(ps.flavors),
            "resourceUsage": {
                r: format_quantity(r, q * ps.count) for r, q in requests.items() if r in ps.flavors
            },
        }
        if ps.placement is not None and not decision.checks:
            per_node: dict[str, int] = {}
            for place in ps.placement:
                per_node[place.node] = per_node.get(place.node, 0) + 1
            assignment["topologyAssignment"] = topology_assignment(
                [keys.HOSTNAME_LABEL],
                [((n,), c) for n, c in sorted(per_node.items())],
                wl.get("apiVersion") or f"{k8s.KUEUE}/v1beta2",
            )
        assignments.append(assignment)
    # Only the metadata's annotations and the status change: the rest (the spec, with its pod
    # templates) is shared with the observed Workload, which nothing changes in place.
    annotations = dict(wl["metadata"].get("annotations") or {})
    updated = {
        **wl,
        "metadata": {**wl["metadata"], "annotations": annotations},
        "status": copy_object(wl.get("status") or {}),
    }
    # The plan's devices, recorded on the Workload: the binding step binds exactly these.
    planned = placement_annotation(decision)
    if planned is None:
        annotations.pop(PLACEMENT_ANNOTATION, None)
    else:
        annotations[PLACEMENT_ANNOTATION] = planned
    status = updated["status"]
    status["admission"] = {"clusterQueue": decision.cluster_queue, "podSetAssignments": assignments}
    # A reservation whose checks have all passed keeps its QuotaReserved time; Admitted is new.
    reserved = (wl.get("status") or {}).get("admission") and next(
        (c for c in wl["status"].get("conditions", []) if c.get("type") == ConditionType.QUOTA_RESERVED),
        None,
    )
    state = WorkloadState.QUOTA_RESERVED if decision.checks else WorkloadState.ADMITTED
    status["conditions"] = with_conditions(
        status.get("conditions", []),
        *(
            reserved
            if ctype == ConditionType.QUOTA_RESERVED and reserved
            else condition(ctype, Reason(ctype), now)
            for ctype in ADMISSION_ORDER
            if ctype in CONDITIONS[state]
        ),
        drop=(ConditionType.ADMITTED, ConditionType.EVICTED, ConditionType.PREEMPTED),
    )
    if decision.checks:  # quota reserved; admitted once every check is Ready
        status["admissionChecks"] = pending_checks(decision.checks, now)
    return updated


# --- preemptions --------------------------------------------------------------------------------


def preemption_writes(get: Get, plan: Plan, now: str, *, dry_run: bool) -> list[Write]:
    """Each victim marked Evicted and Preempted (or, in a dry run, an Event only). A victim that
    is gone, or already evicted, gets none."""
    out = []
    for victim in plan.preempted:
        wl = get(victim.workload)
        if wl is None or condition_true(wl, ConditionType.EVICTED):
            continue
        message = preemption_message(victim)
        if dry_run:
            out.append(Write(Verb.WOULD_PREEMPT, victim.workload, dict(wl), f"dry run: {message}"))
        else:
            out.append(
                Write(Verb.EVICT, victim.workload, evicted_workload(wl, message, victim.reason, now), message)
            )
    return out


def preemption_message(victim: PreemptionDecision) -> str:
    return f"Preempted to accommodate {victim.preemptor} ({victim.reason})"


def evicted_workload(wl: Mapping[str, Any], message: str, reason: str, now: str) -> dict[str, Any]:
    """``wl`` marked Evicted (reason Preempted) and Preempted (``reason``), as Kueue marks a victim;
    its admission and QuotaReserved condition stay until its job is no longer active."""
    updated = copy_object(wl)
    status = updated.setdefault("status", {})
    status["conditions"] = with_conditions(
        status.get("conditions", []),
        condition(ConditionType.EVICTED, Reason.PREEMPTED, now, message),
        condition(ConditionType.PREEMPTED, reason, now, message),
    )
    return updated


# --- evicted workloads --------------------------------------------------------------------------


def eviction_writes(
    get: Get,
    evicted: Iterable[str],
    active: Callable[[dict[str, Any]], bool],
    now: str,
    *,
    stop_jobs: bool = True,
) -> list[Write]:
    """For each evicted Workload (keys) that still holds its admission: while its job is
    ``active`` (it may still run pods), a STOP (unless ``stop_jobs`` is False; the body is the
    Workload as observed); once it is not, a REQUEUE that gives its quota back. One that is gone, or
    no longer evicted or admitted, gets none."""
    out = []
    for key in evicted:
        wl = get(key)
        if (
            wl is None
            or not (wl.get("status") or {}).get("admission")
            or not condition_true(wl, ConditionType.EVICTED)
        ):
            continue
        if active(wl):
            if stop_jobs:
                out.append(Write(Verb.STOP, key, wl))
        else:
            out.append(Write(Verb.REQUEUE, key, requeued_workload(wl, now)))
    return out


def requeued_workload(wl: Mapping[str, Any], now: str) -> dict[str, Any]:
    """An evicted ``wl`` with its admission cleared and QuotaReserved and Admitted False, with the
    eviction's reason and message: queued again, as Kueue requeues a stopped victim."""
    updated = copy_object(wl)
    status = updated.setdefault("status", {})
    status.pop("admission", None)
    evicted = next(c for c in status.get("conditions", []) if c.get("type") == ConditionType.EVICTED)
    status["conditions"] = with_conditions(
        status.get("conditions", []),
        *(
            condition(
                ctype, evicted.get("reason", Reason.PREEMPTED), now, evicted.get("message", ""), status=False
            )
            for ctype in ADMISSION_ORDER
        ),
    )
    return updated


def finished_workload(wl: Mapping[str, Any], succeeded: bool, message: str, now: str) -> dict[str, Any]:
    """``wl`` with ``Finished=True`` (reason ``Succeeded`` or ``Failed``, the job's message), as Kueue
    marks the Workload of a job that ended. Its admission stays as a record; a Finished workload
    holds no quota and no devices (every reader of the cluster skips it)."""
    updated = copy_object(wl)
    status = updated.setdefault("status", {})
    reason = Reason.SUCCEEDED if succeeded else Reason.FAILED
    status["conditions"] = with_conditions(
        status.get("conditions", []), condition(ConditionType.FINISHED, reason, now, message)
    )
    return updated


# --- pending ------------------------------------------------------------------------------------


def pending_writes(get: Get, plan: Plan, now: str, written: Mapping[str, tuple[str, str]]) -> list[Write]:
    """A QuotaReserved=False condition with the core's reason on each pending Workload that does
    not show it yet. ``written``: what the controller wrote last, by workload (a write whose watch
    event has not arrived yet is not made twice)."""
    out = []
    for pending in plan.pending:
        if written.get(pending.workload) == (pending.reason, pending.message):
            continue
        wl = get(pending.workload)
        if wl is None or (wl.get("status") or {}).get("admission"):
            continue
        current = next(
            (
                c
                for c in (wl.get("status") or {}).get("conditions", [])
                if c.get("type") == ConditionType.QUOTA_RESERVED
            ),
            None,
        )
        message = pending.message or pending.reason
        if current and current.get("reason") == pending.reason and current.get("message") == message:
            continue
        updated = copy_object(wl)
        status = updated.setdefault("status", {})
        status["conditions"] = with_conditions(
            status.get("conditions", []),
            condition(ConditionType.QUOTA_RESERVED, pending.reason, now, message, status=False),
        )
        out.append(Write(Verb.PENDING, pending.workload, updated, pending=pending))
    return out
