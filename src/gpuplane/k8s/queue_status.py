"""What ``kubectl get clusterqueue,localqueue`` shows: each queue's status, as Kueue writes it.

Pure functions from the cached objects (plain dicts, as the API server sent them) to the status
each ClusterQueue and LocalQueue should have, and to the writes that bring the cluster there:

=====================  =====================================================================
field                  what it counts (unfinished workloads only)
=====================  =====================================================================
pendingWorkloads       active workloads of the queue without a quota reservation
reservingWorkloads     workloads holding a quota reservation (``status.admission``)
admittedWorkloads      those of them with ``Admitted=True`` (all admission checks passed)
flavorsReservation     per flavor and resource, the quota the reserving workloads hold
flavorsUsage           the same for the admitted workloads (LocalQueue v1beta1: ``flavorUsage``)
Active condition       ``Ready``, or why the queue cannot admit (see below)
=====================  =====================================================================

Flavor usage lists every flavor and covered resource of the ClusterQueue's spec, in its order,
zeros included, as Kueue does; a ClusterQueue's entries also say how much of each total is
``borrowed`` (beyond the nominal quota). A LocalQueue lists the flavors of its ClusterQueue, with
its own workloads' totals.

The Active condition of a ClusterQueue is ``True``/``Ready`` unless the queue is being deleted
(``Terminating``), is stopped by its stopPolicy (``Stopped``), names a ResourceFlavor that does
not exist (``FlavorNotFound``), an AdmissionCheck that does not exist (``AdmissionCheckNotFound``)
or a flavor whose Topology does not exist (``TopologyNotFound``); the first that applies is the
reason, and the message names them all, as Kueue's ``inactiveReason`` does. A LocalQueue is
``Ready`` while its ClusterQueue is active, else ``Stopped`` (its own stopPolicy),
``ClusterQueueDoesNotExist`` or ``ClusterQueueIsInactive``.

Positions are not part of these statuses (Kueue keeps them in its visibility API).

A write is produced only for a queue whose status differs from the desired one (the
``lastTransitionTime`` of a condition whose status did not change is kept), so a quiet cluster
gets no writes. Everything here is deterministic: the same objects give the same writes.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.model.quantity import QuantityError, format_quantity, parse_resource_quantity

Obj = Mapping[str, Any]

ACTIVE = "Active"
READY = "Ready"
READY_MESSAGE = "Can admit new workloads"
LQ_READY_MESSAGE = "Can submit new workloads to localQueue"
LQ_CQ_INACTIVE_MESSAGE = "Can't submit new workloads to clusterQueue"
LQ_STOPPED_MESSAGE = "LocalQueue is stopped"


Activity = tuple[bool, str, str]  # the Active condition: (status, reason, message)


@dataclass(frozen=True, slots=True)
class QueueObjects:
    """The cached objects the queue statuses are computed from (each kind as listed)."""

    cluster_queues: Iterable[Obj]
    local_queues: Iterable[Obj]
    workloads: Iterable[Obj]
    flavors: Iterable[Obj] = ()
    topologies: Iterable[Obj] = ()
    admission_checks: Iterable[Obj] = ()


@dataclass(frozen=True, slots=True)
class QueueStatusWrite:
    """The status one queue should be written with (a merge patch of its status subresource)."""

    kind: str  # ClusterQueue | LocalQueue
    name: str
    namespace: str | None
    status: dict[str, Any]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


@dataclass
class _Tally:
    """Counts and usage of one queue, summed over its workloads."""

    pending: int = 0
    reserving: int = 0
    admitted: int = 0
    # (flavor, resource) -> base units
    reserved: dict[tuple[str, str], int] | None = None
    used: dict[tuple[str, str], int] | None = None

    def add_usage(self, usage: Mapping[tuple[str, str], int], *, admitted: bool) -> None:
        if self.reserved is None:
            self.reserved = defaultdict(int)
            self.used = defaultdict(int)
        assert self.used is not None
        for key, amount in usage.items():
            self.reserved[key] += amount
            if admitted:
                self.used[key] += amount


def _meta(obj: Obj) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _spec(obj: Obj) -> Mapping[str, Any]:
    spec = obj.get("spec")
    return spec if isinstance(spec, Mapping) else {}


def _status(obj: Obj) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def _condition_true(obj: Obj, ctype: str) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("type") == ctype and c.get("status") == "True"
        for c in _status(obj).get("conditions") or []
    )


def _workload_usage(wl: Obj) -> dict[tuple[str, str], int]:
    """(flavor, resource) -> base units the workload's admission holds; a malformed entry counts 0."""
    usage: dict[tuple[str, str], int] = defaultdict(int)
    admission = _status(wl).get("admission")
    if not isinstance(admission, Mapping):
        return usage
    for psa in admission.get("podSetAssignments") or []:
        if not isinstance(psa, Mapping):
            continue
        flavors = psa.get("flavors") if isinstance(psa.get("flavors"), Mapping) else {}
        amounts = psa.get("resourceUsage") if isinstance(psa.get("resourceUsage"), Mapping) else {}
        for resource, flavor in (flavors or {}).items():
            try:
                usage[(str(flavor), str(resource))] += parse_resource_quantity(
                    str(resource), (amounts or {}).get(resource, 0)
                )
            except (QuantityError, TypeError):
                continue
    return usage


def _resource_groups(cq: Obj) -> list[tuple[str, list[tuple[str, int]]]]:
    """The ClusterQueue's flavors in spec order, each with (resource, nominal base units)."""
    out: dict[str, list[tuple[str, int]]] = {}
    for group in _spec(cq).get("resourceGroups") or []:
        if not isinstance(group, Mapping):
            continue
        for flavor in group.get("flavors") or []:
            if not isinstance(flavor, Mapping) or not isinstance(flavor.get("name"), str):
                continue
            resources = out.setdefault(flavor["name"], [])
            for res in flavor.get("resources") or []:
                if not isinstance(res, Mapping) or not isinstance(res.get("name"), str):
                    continue
                try:
                    nominal = parse_resource_quantity(res["name"], res.get("nominalQuota", 0))
                except (QuantityError, TypeError):
                    nominal = 0
                resources.append((res["name"], nominal))
    return list(out.items())


def _check_names(cq: Obj) -> list[str]:
    """AdmissionCheck names a ClusterQueue uses: ``admissionChecks`` or its strategy's list."""
    spec = _spec(cq)
    names = [n for n in spec.get("admissionChecks") or [] if isinstance(n, str)]
    strategy = spec.get("admissionChecksStrategy")
    if isinstance(strategy, Mapping):
        names += [
            rule["name"]
            for rule in strategy.get("admissionChecks") or []
            if isinstance(rule, Mapping) and isinstance(rule.get("name"), str)
        ]
    return names


def cluster_queue_active(
    cq: Obj, flavors: Mapping[str, Obj], topologies: Iterable[str], checks: Iterable[str]
) -> Activity:
    """(active, reason, message) of the ClusterQueue's ``Active`` condition, as Kueue decides it."""
    if _meta(cq).get("deletionTimestamp"):
        return False, "Terminating", "Can't admit new workloads; clusterQueue is terminating"
    known_topologies, known_checks = set(topologies), set(checks)
    reasons: list[tuple[str, str]] = []
    if _spec(cq).get("stopPolicy", "None") not in ("None", None):
        reasons.append(("Stopped", "is stopped"))
    names = [name for name, _ in _resource_groups(cq)]
    missing = sorted({n for n in names if n not in flavors})
    if missing:
        reasons.append(("FlavorNotFound", f"references missing ResourceFlavor(s): {','.join(missing)}"))
    missing_checks = sorted({n for n in _check_names(cq) if n not in known_checks})
    if missing_checks:
        reasons.append(
            ("AdmissionCheckNotFound", f"references missing AdmissionCheck(s): {','.join(missing_checks)}")
        )
    for name in names:
        topology = _spec(flavors[name]).get("topologyName") if name in flavors else None
        if isinstance(topology, str) and topology not in known_topologies:
            reasons.append(("TopologyNotFound", f'there is no Topology "{topology}" for TAS flavor "{name}"'))
    if not reasons:
        return True, READY, READY_MESSAGE
    message = ", ".join(m for _, m in reasons)
    return False, reasons[0][0], f"Can't admit new workloads: {message}."


def _flavor_usage(
    groups: list[tuple[str, list[tuple[str, int]]]],
    totals: Mapping[tuple[str, str], int] | None,
    *,
    borrowed: bool,
) -> list[dict[str, Any]]:
    out = []
    for flavor, resources in groups:
        entries = []
        for resource, nominal in resources:
            total = (totals or {}).get((flavor, resource), 0)
            entry: dict[str, Any] = {"name": resource, "total": format_quantity(resource, total)}
            if borrowed:
                entry["borrowed"] = format_quantity(resource, max(0, total - nominal))
            entries.append(entry)
        out.append({"name": flavor, "resources": entries})
    return out


def _conditions(existing: Obj, activity: Activity, now: str) -> list[dict[str, Any]]:
    """The queue's conditions with ``Active`` set: others kept, the transition time kept when the
    status is unchanged."""
    active, reason, message = activity
    status = "True" if active else "False"
    conditions = [c for c in _status(existing).get("conditions") or [] if isinstance(c, Mapping)]
    before = next((c for c in conditions if c.get("type") == ACTIVE), None)
    since = before.get("lastTransitionTime") if before and before.get("status") == status else None
    cond: dict[str, Any] = {
        "type": ACTIVE,
        "status": status,
        "reason": reason,
        "message": message[:32768],
        "lastTransitionTime": since or now,
    }
    generation = _meta(existing).get("generation")
    if isinstance(generation, int):
        cond["observedGeneration"] = generation
    return [dict(c) for c in conditions if c.get("type") != ACTIVE] + [cond]


def _status_of(
    conditions: list[dict[str, Any]],
    tally: _Tally,
    groups: list[tuple[str, list[tuple[str, int]]]],
    *,
    borrowed: bool,
) -> dict[str, Any]:
    """A queue's status; ``borrowed``: whether usage entries say how much is borrowed (a
    ClusterQueue's do, a LocalQueue's do not)."""
    return {
        "conditions": conditions,
        "pendingWorkloads": tally.pending,
        "reservingWorkloads": tally.reserving,
        "admittedWorkloads": tally.admitted,
        "flavorsReservation": _flavor_usage(groups, tally.reserved, borrowed=borrowed),
        "flavorsUsage": _flavor_usage(groups, tally.used, borrowed=borrowed),
    }


def _tallies(
    workloads: Iterable[Obj], cqs: Mapping[str, Obj], lqs: Mapping[str, Obj]
) -> tuple[dict[str, _Tally], dict[str, _Tally]]:
    """Counts and usage by ClusterQueue name and by LocalQueue key."""
    cq_tally: dict[str, _Tally] = defaultdict(_Tally)
    lq_tally: dict[str, _Tally] = defaultdict(_Tally)
    for wl in workloads:
        if _condition_true(wl, "Finished"):
            continue
        queue = _spec(wl).get("queueName")
        lq_key = f"{_meta(wl).get('namespace')}/{queue}" if isinstance(queue, str) else ""
        admission = _status(wl).get("admission")
        if isinstance(admission, Mapping) and admission.get("clusterQueue"):
            admitted = _condition_true(wl, "Admitted")
            usage = _workload_usage(wl)
            tallies = [cq_tally[str(admission["clusterQueue"])]]
            if lq_key in lqs:
                tallies.append(lq_tally[lq_key])
            for tally in tallies:
                tally.reserving += 1
                tally.admitted += admitted
                tally.add_usage(usage, admitted=admitted)
        elif _spec(wl).get("active", True) is not False and lq_key in lqs:
            cq_name = str(_spec(lqs[lq_key]).get("clusterQueue", ""))
            if cq_name in cqs:
                cq_tally[cq_name].pending += 1
                lq_tally[lq_key].pending += 1
    return cq_tally, lq_tally


def _local_queue_active(lq: Obj, cqs: Mapping[str, Obj], active_cqs: set[str]) -> Activity:
    cq_name = str(_spec(lq).get("clusterQueue", ""))
    if _spec(lq).get("stopPolicy", "None") not in ("None", None):
        return False, "Stopped", LQ_STOPPED_MESSAGE
    if cq_name not in cqs:
        return False, "ClusterQueueDoesNotExist", LQ_CQ_INACTIVE_MESSAGE
    if cq_name not in active_cqs:
        return False, "ClusterQueueIsInactive", LQ_CQ_INACTIVE_MESSAGE
    return True, READY, LQ_READY_MESSAGE


def queue_status_writes(objects: QueueObjects, now: str) -> list[QueueStatusWrite]:
    """The status writes that bring every ClusterQueue and LocalQueue to the status described in
    the module docstring; only those whose status differs from what they show now.

    ``now`` (RFC 3339) becomes the ``lastTransitionTime`` of a condition that changes status.
    """
    cqs = {str(_meta(cq).get("name")): cq for cq in objects.cluster_queues}
    lqs = {f"{_meta(lq).get('namespace')}/{_meta(lq).get('name')}": lq for lq in objects.local_queues}
    flavors = {str(_meta(f).get("name")): f for f in objects.flavors}
    topologies = [str(_meta(t).get("name")) for t in objects.topologies]
    checks = [str(_meta(c).get("name")) for c in objects.admission_checks]
    cq_tally, lq_tally = _tallies(objects.workloads, cqs, lqs)
    writes: list[QueueStatusWrite] = []
    active_cqs: set[str] = set()
    for name in sorted(cqs):
        cq = cqs[name]
        activity = cluster_queue_active(cq, flavors, topologies, checks)
        if activity[0]:
            active_cqs.add(name)
        conditions = _conditions(cq, activity, now)
        status = _status_of(conditions, cq_tally.get(name, _Tally()), _resource_groups(cq), borrowed=True)
        if _differs(cq, status):
            writes.append(QueueStatusWrite("ClusterQueue", name, None, status))
    for key in sorted(lqs):
        lq = lqs[key]
        cq_name = str(_spec(lq).get("clusterQueue", ""))
        groups = _resource_groups(cqs[cq_name]) if cq_name in cqs else []
        tally = lq_tally.get(key, _Tally()) if cq_name in cqs else _Tally()
        activity = _local_queue_active(lq, cqs, active_cqs)
        status = _status_of(_conditions(lq, activity, now), tally, groups, borrowed=False)
        if _differs(lq, status):
            meta = _meta(lq)
            writes.append(
                QueueStatusWrite("LocalQueue", str(meta.get("name")), meta.get("namespace"), status)
            )
    return writes


def _differs(obj: Obj, status: Mapping[str, Any]) -> bool:
    """Whether the object's status differs from ``status`` in any field ``status`` sets (an empty
    list and an absent one are the same: the server drops neither, but a reader cannot tell)."""
    current = _status(obj)
    for field, want in status.items():
        have = current.get(field)
        if want == [] and have in (None, []):
            continue
        if have != want:
            return True
    return False
