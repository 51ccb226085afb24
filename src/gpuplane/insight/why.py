"""Why is a workload pending, what blocks it, how to fix it, and when it will start.

:func:`explain` turns the core's pending decision (reason, message, positions) into an
:class:`Explanation`: the blocking objects, one fix a user can act on, and an ETA range
(:mod:`gpuplane.insight.queue_eta`). :func:`explain_all` does it for every pending workload of
a plan. Inputs are the parsed cluster state, the plan the core made on it and the time; the
analysis runs on the cluster as the plan leaves it (:mod:`gpuplane.insight.aftermath`) and
changes nothing. The workload behind a NAME (``[KIND/]NAME``) is found by
:mod:`gpuplane.insight.why_names`.

Reasons are the core's: Kueue's names (``WaitingForQuota``, ``ExceedsMaxQuota``,
``NoMatchingFlavor``, ``WaitingForPreemptedWorkloads``, ``Misconfigured``, ``Inactive``, ...)
and gpuplane's placement reasons (``Fragmented``, ``WaitingForGangCapacity``,
``NoNodeAdvertisesResource``, ``UntoleratedTaint``, ``NoNodeMatchesSelector``,
``ExceedsClusterCapacity``). ``NoNodeAdvertisesResource`` is split here into its two usual
causes: GPU nodes whose device plugin advertises nothing, and a MIG profile no node offers.

Positions in the JSON are counted from 0, as Kueue's visibility API counts them (the plan's
``position`` is 1-based).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuplane.core.analysis import (
    AdmittedWorkload,
    ClusterQueueNode,
    CohortNode,
    GangPlacement,
    GangPodSet,
    PlacementState,
    Scheduler,
)
from gpuplane.core.session import PendingDecision, Plan, Reason, SchedulerConfig, config_from_kueue, pod_needs
from gpuplane.insight import bypass
from gpuplane.insight.aftermath import world_after
from gpuplane.insight.dra_why import DraCause, claim_gang, dra_cause, has_claims
from gpuplane.insight.idle import DATA_STALL_CONDITION
from gpuplane.insight.live_runtimes import RuntimeModel, runtime_model
from gpuplane.insight.node_eta import Room, with_one_node, with_room
from gpuplane.insight.queue_eta import (
    Estimate,
    NodeGang,
    estimate_gangs,
    estimate_queue,
    main_resource,
    node_gang,
)
from gpuplane.insight.runtime_history import RuntimeSample
from gpuplane.insight.why_dispatch import waiting_checks_message, worker_note
from gpuplane.insight.why_names import QUEUE_NAME_LABEL, NotFoundError, resolve, split_reference
from gpuplane.model.objects import ClusterState, Node, Workload
from gpuplane.model.quantity import base_units_per_unit

__all__ = [
    "NEVER",
    "Blocker",
    "Explanation",
    "NotFoundError",
    "explain",
    "explain_all",
    "resolve",
    "split_reference",
]
NEVER = frozenset(
    {
        Reason.EXCEEDS_MAX_QUOTA,
        Reason.NO_MATCHING_FLAVOR,
        Reason.NO_NODE_ADVERTISES,
        Reason.NO_NODE_MATCHES_SELECTOR,
        Reason.UNTOLERATED_TAINT,
        Reason.EXCEEDS_CLUSTER,
        Reason.MISCONFIGURED,
        Reason.SUSPENDED,
        Reason.NAMESPACE_MISMATCH,
        Reason.DEACTIVATED,
    }
)


@dataclass(frozen=True, slots=True)
class Blocker:
    """One object standing in the way: ``kind`` is a Kubernetes kind (or ``NodeSelector``)."""

    kind: str
    name: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "name": self.name, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class Explanation:
    """Why one workload waits. ``workload`` is ``namespace/name``; positions count from 0."""

    workload: str
    cluster_queue: str | None
    local_queue: str | None
    position_in_cluster_queue: int | None
    position_in_local_queue: int | None
    eta: Estimate
    reason: str
    message: str
    blockers: tuple[Blocker, ...] = ()
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        """The document of ``gpuplane why --output json``."""
        return {
            "workload": self.workload,
            "clusterQueue": self.cluster_queue,
            "localQueue": self.local_queue,
            "positionInClusterQueue": self.position_in_cluster_queue,
            "positionInLocalQueue": self.position_in_local_queue,
            "eta": {
                "seconds": self.eta.seconds,
                "low": self.eta.low,
                "high": self.eta.high,
                "basis": self.eta.basis,
                # Where each runtime it took came from: name | team | queue | all | declared | assumed.
                "runtimes": [b.to_json() for b in self.eta.runtimes],
            },
            "reason": self.reason,
            "message": self.message,
            "blockers": [b.to_json() for b in self.blockers],
            "fix": self.fix,
        }


# ---------------------------------------------------------------------------
# Explaining
# ---------------------------------------------------------------------------


@dataclass
class _Context:
    """Everything one explanation reads; built once per :func:`explain_all`."""

    state: ClusterState
    plan: Plan
    config: SchedulerConfig
    now: float
    world: Scheduler
    runtimes: RuntimeModel
    pending_by_queue: dict[str, list[PendingDecision]] = field(default_factory=dict)
    etas: dict[str, dict[str, Estimate]] = field(default_factory=dict)  # per ClusterQueue, computed once
    gangs: dict[str, NodeGang | None] = field(default_factory=dict)  # whole-node gangs, by workload
    gang_etas: dict[str, Estimate] = field(default_factory=dict)  # their node replay, made once
    gangs_replayed: bool = False
    rooms: dict[str, Room] = field(default_factory=dict)  # gangs waiting for room, by shape
    dra_causes: dict[str, DraCause | None] = field(default_factory=dict)  # by reason and claims

    def eta(self, p: PendingDecision) -> Estimate:
        name = p.cluster_queue or ""
        table = self.etas.get(name)
        if table is None:
            waiting = [q for q in self.pending_by_queue.get(name, []) if q.reason not in NEVER]
            table = estimate_queue(
                self.world, waiting, runtimes=self.runtimes, config=self.config, now=self.now
            )
            self.etas[name] = table
        return table.get(p.workload) or Estimate(None, None, None, "not queued in a ClusterQueue")

    def gang(self, p: PendingDecision) -> NodeGang | None:
        """``p``'s workload as a whole-node gang (computed once per workload)."""
        if p.workload not in self.gangs:
            wl = self.world.workloads.get(p.workload)
            found = None
            if wl is not None and p.cluster_queue is not None and p.reason not in NEVER:
                found = node_gang(self.world, wl, p.cluster_queue, self.config)
            self.gangs[p.workload] = found
        return self.gangs[p.workload]

    def gang_eta(self, p: PendingDecision) -> Estimate:
        """The node replay's estimate of a whole-node gang (:func:`estimate_gangs`), made once for
        all the pending whole-node gangs, one replay per node size."""
        if not self.gangs_replayed:
            self.gangs_replayed = True
            groups: dict[tuple[str, int], list[NodeGang]] = {}
            quotas: dict[str, Estimate] = {}
            for waiting in self.pending_by_queue.values():
                for other in waiting:
                    g = self.gang(other)
                    if g is not None:
                        groups.setdefault((g.resource, g.size), []).append(g)
                        quotas[other.workload] = self.eta(other)
            for gangs in groups.values():
                self.gang_etas.update(
                    estimate_gangs(self.world, gangs, quotas, runtimes=self.runtimes, now=self.now)
                )
        return self.gang_etas[p.workload]


def _context(
    state: ClusterState,
    plan: Plan,
    now: float,
    config: SchedulerConfig | None,
    history: Iterable[RuntimeSample] = (),
) -> _Context:
    config = config or config_from_kueue(state.configuration)
    runtimes = runtime_model(state, now, history)
    ctx = _Context(state, plan, config, now, world_after(state, plan, config, now), runtimes)
    for p in plan.pending:
        if p.cluster_queue is not None and p.position is not None:
            ctx.pending_by_queue.setdefault(p.cluster_queue, []).append(p)
    for queue in ctx.pending_by_queue.values():
        queue.sort(key=lambda p: p.position or 0)
    return ctx


def explain(  # noqa: PLR0913 - keyword-only: the history
    state: ClusterState,
    plan: Plan,
    now: float,
    workload: str,
    config: SchedulerConfig | None = None,
    *,
    history: Iterable[RuntimeSample] = (),
) -> Explanation:
    """Why ``workload`` (``namespace/name``) waits after ``plan``.

    A workload the plan admitted (or one already admitted in ``state``) is explained as
    ``Admitted`` with no blockers; an unknown key raises :class:`NotFoundError`. ``history``:
    finished runs recorded elsewhere (the controller's), learned with the state's own.
    """
    ctx = _context(state, plan, now, config, history)
    return _explain_one(ctx, workload)


def explain_all(  # noqa: PLR0913 - keyword-only: diagnose and the history
    state: ClusterState,
    plan: Plan,
    now: float,
    config: SchedulerConfig | None = None,
    *,
    diagnose: bool = True,
    history: Iterable[RuntimeSample] = (),
) -> tuple[Explanation, ...]:
    """An explanation for every pending workload of ``plan``, in the plan's order.

    With ``diagnose=False`` blockers and fixes are left out (reason, positions and ETA stay): the
    metrics, the visibility API and the ETA annotations need no more, and the fragmentation
    search is the costly part. ``history``: as for :func:`explain`.
    """
    ctx = _context(state, plan, now, config, history)
    return tuple(_explain_pending(ctx, p, diagnose) for p in plan.pending)


def _explain_one(ctx: _Context, key: str) -> Explanation:
    for p in ctx.plan.pending:
        if p.workload == key:
            return _explain_pending(ctx, p)
    wl = ctx.world.workloads.get(key)
    if wl is None:
        raise NotFoundError(f"workload {key} not found")
    admitted = next((a for a in ctx.plan.admitted if a.workload == key), None)
    cq = admitted.cluster_queue if admitted else (wl.admission.cluster_queue if wl.admission else None)
    lq = f"{wl.namespace}/{wl.queue_name}" if wl.queue_name else None
    waiting = waiting_checks_message(wl, cq) if cq is not None and admitted is None else None
    if wl.finished:
        reason, message = Reason.FINISHED, "the workload has finished"
    elif waiting is not None:
        reason, message = Reason.WAITING_FOR_CHECKS, waiting
    elif cq is not None:
        reason, message = Reason.ADMITTED, f"admitted to ClusterQueue {cq}"
    else:
        reason, message = Reason.UNKNOWN, "the workload is not pending in this plan"
    eta = (
        Estimate(0.0, 0.0, 0.0, "already admitted")
        if reason == Reason.ADMITTED
        else Estimate(None, None, None, message)
    )
    fix = "nothing to fix"
    foreign = bypass.foreign_bindings(ctx.state, wl) if reason == Reason.ADMITTED else []
    if foreign:  # admitted, but gpuplane did not place its pods: the webhook is missing
        blockers = tuple(Blocker("Pod", b.pod.key, b.detail) for b in foreign)
        message = bypass.foreign_bindings_message(foreign)
        return Explanation(
            key, cq, lq, None, None, eta, bypass.BOUND_ELSEWHERE, message, blockers, bypass.WEBHOOK_FIX
        )
    if reason in (Reason.ADMITTED, Reason.FINISHED):
        message += worker_note(wl)
    stall = wl.condition(DATA_STALL_CONDITION)
    if reason == Reason.ADMITTED and stall is not None and stall.status:
        # The reaper's data-stall hint (insight.idle): running, but starved of input, not of GPUs.
        message = f"{message}; data stall suspected: {stall.message}"
        fix = "not a scheduling problem: check its input pipeline (data loaders, storage, network)"
    return Explanation(key, cq, lq, None, None, eta, reason, message, (), fix)


_PLACEMENT_CAPACITY = frozenset({Reason.FRAGMENTED, Reason.WAITING_FOR_GANG_CAPACITY, Reason.EXCEEDS_CLUSTER})


def _refine(ctx: _Context, p: PendingDecision, wl: Workload) -> PendingDecision:
    """A MIG profile that no node's current layout offers is not a capacity wait.

    The core counts every MIG GPU as able to hold any profile (a repartition could make it);
    with repartitioning off, no layout change will come from gpuplane, so the workload waits
    for something only an admin does.
    """
    if p.reason not in _PLACEMENT_CAPACITY or ctx.config.devices.mig_repartition:
        return p
    prefix = ctx.config.devices.mig_prefix
    missing = [
        r
        for r in _requested_devices(wl, ctx)
        if r.startswith(prefix)
        and not any(n.allocatable.get(r, 0) for n in ctx.state.nodes if not n.unschedulable)
    ]
    if not missing:
        return p
    return replace(
        p,
        reason=Reason.NO_NODE_ADVERTISES,
        message=f"no node offers MIG profile {', '.join(missing)} in its current layout ({p.message})",
    )


def _explain_pending(ctx: _Context, p: PendingDecision, diagnose: bool = True) -> Explanation:
    wl = ctx.world.workloads.get(p.workload)
    blockers: tuple[Blocker, ...] = ()
    fix = ""
    if wl is not None:
        p = _refine(ctx, p, wl)
        cause = dra_cause(ctx.world, p, wl, ctx.dra_causes)
        if cause is not None:  # the claims hold it back (insight.dra_why)
            p = replace(p, reason=cause.reason, message=cause.message)
            blockers, fix = tuple(Blocker(*b) for b in cause.blockers), cause.fix
        elif diagnose:
            blockers, fix = _diagnose(ctx, p, wl)
    if p.reason in NEVER or wl is None:
        eta = Estimate(
            None, None, None, f"never by itself: {p.reason} does not clear until the fix is applied"
        )
    else:
        eta = ctx.eta(p)
        if ctx.gang(p) is not None:
            eta = ctx.gang_eta(p)
        elif (
            p.reason in _PLACEMENT_CAPACITY
            and sum(ps.count for ps in wl.pod_sets) == 1
            and not has_claims(wl)
        ):
            eta = with_one_node(ctx.world, wl, eta, runtimes=ctx.runtimes, config=ctx.config, now=ctx.now)
        elif p.reason in _PLACEMENT_CAPACITY:
            gangs = _flavored(ctx, p, wl)
            probe = f"eta:{p.workload}"
            runtimes, now = ctx.runtimes, ctx.now
            eta = with_room(ctx.world, gangs, eta, runtimes=runtimes, now=now, probe=probe, cache=ctx.rooms)
    return Explanation(
        workload=p.workload,
        cluster_queue=p.cluster_queue,
        local_queue=p.local_queue,
        position_in_cluster_queue=None if p.position is None else p.position - 1,
        position_in_local_queue=None if p.local_position is None else p.local_position - 1,
        eta=eta,
        reason=p.reason,
        message=p.message,
        blockers=blockers,
        fix=fix,
    )


# ---------------------------------------------------------------------------
# Per-reason diagnosis: (blockers, fix)
# ---------------------------------------------------------------------------


def _diagnose(ctx: _Context, p: PendingDecision, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    diagnosis = _DIAGNOSES.get(p.reason)
    return diagnosis(ctx, p, wl) if diagnosis is not None else _simple(p)


def _preempting(ctx: _Context, p: PendingDecision, _wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    victims = tuple(
        Blocker("Workload", v.workload, f"being preempted ({v.reason}) to make room")
        for v in ctx.plan.preempted
        if v.preemptor == p.workload
    )
    return victims, "nothing to do: the workload starts once its victims are gone"


def _no_matching_flavor(_ctx: _Context, p: PendingDecision, _wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    cq = p.cluster_queue or "?"
    return (
        (Blocker("ClusterQueue", cq, p.message),),
        f"make the pod template match a flavor of ClusterQueue {cq} (node selector, affinity and "
        "tolerations), or add a flavor for it",
    )


def _simple(p: PendingDecision) -> tuple[tuple[Blocker, ...], str]:
    cq = p.cluster_queue or "-"
    lq = p.local_queue or "-"
    table: Mapping[str, tuple[Blocker, str]] = {
        Reason.MISCONFIGURED: (
            Blocker("Workload", p.workload, p.message),
            "fix the pod template: every request must be within its limit and name a known device",
        ),
        Reason.SUSPENDED: (
            Blocker("ClusterQueue", cq, p.message),
            f"create the missing ResourceFlavors or clear spec.stopPolicy of ClusterQueue {cq}",
        ),
        Reason.NAMESPACE_MISMATCH: (
            Blocker("ClusterQueue", cq, p.message),
            f"label the namespace to match spec.namespaceSelector of ClusterQueue {cq}",
        ),
        Reason.DEACTIVATED: (
            Blocker("Workload", p.workload, p.message),
            "set spec.active of the workload back to true",
        ),
    }
    entry = _broken_reference(p, cq, lq) or table.get(p.reason)
    if entry is not None:
        return (entry[0],), entry[1]
    return (), "nothing to do: it has not been attempted yet and waits its turn"


def _broken_reference(p: PendingDecision, cq: str, lq: str) -> tuple[Blocker, str] | None:
    """Kueue gives a dangling reference and a stopped LocalQueue the same reasons as other problems
    (Misconfigured, Suspended); the core's message names the missing or inactive object."""
    message = p.message
    if p.reason == Reason.MISCONFIGURED and message.startswith("LocalQueue "):
        return (
            Blocker("LocalQueue", lq, message),
            f"create LocalQueue {lq} or set {QUEUE_NAME_LABEL} to an existing one",
        )
    if p.reason == Reason.MISCONFIGURED and message == "The workload names no LocalQueue":
        return (Blocker("Workload", p.workload, message), f"set the {QUEUE_NAME_LABEL} label of the job")
    if p.reason == Reason.MISCONFIGURED and message.startswith("ClusterQueue "):
        return (
            Blocker("ClusterQueue", cq, message),
            f"create ClusterQueue {cq} or point LocalQueue {lq} at an existing one",
        )
    if p.reason == Reason.SUSPENDED and message.startswith("LocalQueue "):
        return (Blocker("LocalQueue", lq, message), f"set spec.stopPolicy of LocalQueue {lq} back to None")
    return None


def _amount(value: int, resource: str) -> str:
    scale = base_units_per_unit(resource)
    return f"{value / scale:g}" if scale != 1 else str(value)


def _quota(ctx: _Context, p: PendingDecision, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    cq = ctx.world.tree.queues.get(p.cluster_queue or "")
    if cq is None:
        return (), ""
    resource = main_resource(wl, ctx.config)
    group = cq.group_for(resource)
    frs = [(f.name, resource) for f in group.flavors] if group is not None else []
    need = sum(ps.template.quota_requests.get(resource, 0) * ps.count for ps in wl.pod_sets)
    blockers: list[Blocker] = []
    nominal = sum(cq.quota_for(fr).nominal for fr in frs)
    if p.reason == Reason.EXCEEDS_MAX_QUOTA:
        most = sum(cq.potential_available(fr) for fr in frs)
        blockers.append(
            Blocker(
                "ClusterQueue",
                cq.name,
                f"requests {_amount(need, resource)} {resource}; the queue can use at most "
                f"{_amount(most, resource)} (nominal {_amount(nominal, resource)} plus what it may borrow)",
            )
        )
        return tuple(blockers), (
            f"request at most {_amount(most, resource)} {resource}, or raise nominalQuota/borrowingLimit "
            f"of ClusterQueue {cq.name}"
        )
    own = _holders(cq, frs, resource)
    blockers += own
    borrowers: list[Blocker] = []
    root = cq.root()
    queues = [q for q in root.subtree_queues() if q is not cq] if isinstance(root, CohortNode) else []
    for other in sorted(queues, key=lambda q: q.name):
        used = sum(other.usage.get(fr, 0) for fr in frs)
        other_nominal = sum(other.quota_for(fr).nominal for fr in frs)
        if used > other_nominal:
            borrowers.append(
                Blocker(
                    "ClusterQueue",
                    other.name,
                    f"borrows {_amount(used - other_nominal, resource)} {resource} from cohort "
                    f"{root.name}: uses {_amount(used, resource)} of its nominal "
                    f"{_amount(other_nominal, resource)}",
                )
            )
            borrowers += _holders(other, frs, resource, borrowing=True)
    blockers += borrowers
    used_here = sum(cq.usage.get(fr, 0) for fr in frs)
    fixes = []
    if borrowers and used_here < nominal:
        if cq.spec.preemption.reclaim_within_cohort == "Never":
            fixes.append(
                f"set spec.preemption.reclaimWithinCohort: Any on ClusterQueue {cq.name} so the borrowers "
                f"give back its nominal quota ({_amount(nominal - used_here, resource)} {resource} unused)"
            )
        else:
            fixes.append("reclaim is enabled: the borrowers are preempted as soon as the quota is needed")
    fixes.append(
        f"wait for the holders to finish, or raise nominalQuota of ClusterQueue {cq.name} for {resource} "
        f"(uses {_amount(used_here, resource)} of {_amount(nominal, resource)}, this workload needs "
        f"{_amount(need, resource)})"
    )
    return tuple(blockers), "; ".join(fixes)


def _holders(
    cq: ClusterQueueNode, frs: Sequence[tuple[str, str]], resource: str, borrowing: bool = False
) -> list[Blocker]:
    out = []
    nominal = sum(cq.quota_for(fr).nominal for fr in frs)
    used = sum(cq.usage.get(fr, 0) for fr in frs)
    held: list[tuple[int, AdmittedWorkload]] = []
    for aw in cq.workloads.values():
        amount = sum(aw.usage.get(fr, 0) for fr in frs)
        if amount:
            held.append((amount, aw))
    for amount, aw in sorted(held, key=lambda item: (-item[0], item[1].key)):
        flavors = ", ".join(sorted({f for (f, r) in aw.usage if r == resource}))
        state = "borrowing" if borrowing or used > nominal else "within nominal quota"
        out.append(
            Blocker(
                "Workload",
                aw.key,
                f"holds {_amount(amount, resource)} {resource} of flavor {flavors} in ClusterQueue "
                f"{cq.name} ({state})",
            )
        )
    return out


def _requested_devices(wl: Workload, ctx: _Context) -> list[str]:
    return sorted(
        {
            r
            for ps in wl.pod_sets
            for r, q in ps.template.requests.items()
            if q and ctx.config.devices.is_device_resource(r)
        }
    )


def _not_advertised(ctx: _Context, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    devices = ctx.config.devices
    wanted = _requested_devices(wl, ctx)
    migs = [r for r in wanted if r.startswith(devices.mig_prefix)]
    nodes = ctx.state.nodes
    if migs:
        offered = sorted(
            {r for n in nodes for r, q in n.allocatable.items() if r.startswith(devices.mig_prefix) and q}
        )
        blockers = [
            Blocker(
                "Node",
                n.name,
                f"offers {', '.join(sorted(r for r in n.allocatable if r.startswith(devices.mig_prefix)))}",
            )
            for n in nodes
            if any(r.startswith(devices.mig_prefix) for r in n.allocatable)
        ]
        blockers.insert(0, Blocker("Resource", ", ".join(migs), "no node offers this MIG profile"))
        offer = ", ".join(offered) if offered else "none"
        return tuple(blockers), (
            f"request a MIG profile the nodes offer ({offer}), or repartition GPUs with the MIG manager "
            "(label a node nvidia.com/mig.config with a layout that has the profile)"
        )
    silent = [
        n
        for n in nodes
        if _gpu_labelled(n, ctx)
        and not any(q for r, q in n.allocatable.items() if devices.is_device_resource(r))
    ]
    if silent:
        found = tuple(
            Blocker(
                "Node",
                n.name,
                f"labelled as a GPU node ({n.labels.get(devices.model_label, 'GPU present')}) "
                f"but allocatable "
                f"{', '.join(wanted) or 'GPU'} is 0: no device plugin advertises its GPUs",
            )
            for n in silent
        )
        return found, (
            "install or restart the NVIDIA device plugin (or GPU Operator) on "
            + ", ".join(n.name for n in silent)
            + "; check with kubectl describe node that allocatable lists the GPUs"
        )
    return (Blocker("Resource", ", ".join(wanted) or "?", "no node advertises it"),), (
        "add nodes that offer the resource, or request one the cluster has"
    )


def _gpu_labelled(node: Node, ctx: _Context) -> bool:
    return ctx.config.devices.labels_accelerators(node.labels)


def _advertising(ctx: _Context, wl: Workload) -> list[Node]:
    wanted = _requested_devices(wl, ctx)
    return [
        n for n in ctx.state.nodes if not n.unschedulable and all(n.allocatable.get(r, 0) for r in wanted)
    ]


def _taints(ctx: _Context, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    blockers = []
    taints: dict[str, tuple[str, str, str]] = {}
    templates = [ps.template for ps in wl.pod_sets]
    for n in _advertising(ctx, wl):
        if not all(t.node_matches(n.labels) for t in templates):
            continue
        bad = [
            t
            for t in n.taints
            if t.effect in ("NoSchedule", "NoExecute")
            and not any(tol.tolerates(t) for tpl in templates for tol in tpl.tolerations)
        ]
        if bad:
            blockers.append(
                Blocker("Node", n.name, f"taint {', '.join(str(t) for t in bad)} is not tolerated")
            )
            for t in bad:
                taints[str(t)] = (t.key, t.value, t.effect)
    tolerations = "; ".join(
        f"{{key: {k}, operator: {'Equal, value: ' + v if v else 'Exists'}, effect: {e}}}"
        for k, v, e in sorted(taints.values())
    )
    return tuple(blockers), (
        f"add to the pod template spec.tolerations: {tolerations} (or to the ResourceFlavor's tolerations), "
        "if the workload may run on those nodes"
    )


def _selector(ctx: _Context, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    candidates = _advertising(ctx, wl)
    blockers = []
    suggestions = []
    for ps in wl.pod_sets:
        for key, value in sorted(ps.template.node_selector.items()):
            if any(n.labels.get(key) == value for n in candidates):
                continue
            have = sorted({n.labels[key] for n in candidates if key in n.labels})
            detail = f"no node with the requested devices has {key}={value}; " + (
                f"they have {key} in {{{', '.join(have)}}}" if have else f"none has label {key}"
            )
            blockers.append(Blocker("NodeSelector", f"{key}={value}", detail))
            suggestions.append(
                f"set nodeSelector {key} to one of {', '.join(have)}" if have else f"drop nodeSelector {key}"
            )
    if not blockers:
        blockers.append(
            Blocker("NodeSelector", "affinity", "the node affinity matches no node with the devices")
        )
        suggestions.append("relax the required node affinity")
    return tuple(blockers), "; ".join(suggestions) + ", or label a node accordingly"


def _gang(ctx: _Context, wl: Workload) -> list[GangPodSet]:
    if has_claims(wl):  # placed with its claims, so the probes wait for devices too
        return claim_gang(ctx.world, wl)
    return [
        GangPodSet(
            name=ps.name,
            count=ps.count,
            needs=pod_needs(ps.template, ctx.config.devices),
            template=ps.template,
            required_level=ps.required_topology,
            preferred_level=ps.preferred_topology,
        )
        for ps in wl.pod_sets
    ]


def _flavored(ctx: _Context, p: PendingDecision, wl: Workload) -> list[list[GangPodSet]]:
    """The gang once per flavor of its ClusterQueue that covers its main resource."""
    base = _gang(ctx, wl)
    cq = ctx.world.tree.queues.get(p.cluster_queue or "")
    group = cq.group_for(main_resource(wl, ctx.config)) if cq is not None else None
    flavors = (
        [ctx.world.flavors[f.name] for f in group.flavors if f.name in ctx.world.flavors] if group else []
    )
    if not flavors:
        return [base]
    return [[replace(g, flavor=fl) for g in base] for fl in flavors]


def _owner_nodes(cluster: PlacementState) -> dict[str, set[str]]:
    return {owner: {name for name, _, _ in items} for owner, items in cluster.owners.items()}


def _fragmented(ctx: _Context, p: PendingDecision, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    cluster = ctx.world.cluster
    if cluster is None:
        return (), ""
    owners = _owner_nodes(cluster)

    def held(owner: str) -> int:
        return sum(needs.gpu_milli for _, needs, _ in cluster.owners.get(owner, []))

    for gang in _flavored(ctx, p, wl):
        eligible = set().union(*(cluster.eligible_names(g) for g in gang)) if gang else set()
        candidates = sorted(
            (o for o, nodes in owners.items() if nodes & eligible), key=lambda o: (held(o), o)
        )
        for owner in candidates:
            nodes = _placed_without(cluster, owner, gang, f"why:{p.workload}")
            if not nodes:
                continue
            victim = owner.removeprefix("pod:")
            kind = "Pod" if owner.startswith("pod:") else "Workload"
            blockers = [
                Blocker(
                    "Node",
                    node,
                    f"would fit after preempting {kind.lower()} {victim} ({held(owner) / 1000:g} GPU); "
                    f"{cluster.nodes[node].free_gpu_milli() / 1000:g} GPU free now",
                )
                for node in nodes
            ]
            blockers.append(
                Blocker(
                    kind, victim, f"holds {held(owner) / 1000:g} GPU on {', '.join(sorted(owners[owner]))}"
                )
            )
            return tuple(blockers), (
                f"one preemption makes room: free {kind.lower()} {victim} on {', '.join(nodes)} "
                "(give it a lower priority or enable preemption), or wait for it to finish; "
                "packing workloads tighter (gpuplane's placement) avoids this fragmentation"
            )
    return (), "wait: no single preemption makes room; capacity frees as workloads finish"


def _placed_without(cluster: PlacementState, owner: str, gang: list[GangPodSet], probe: str) -> list[str]:
    """The nodes the gang lands on once ``owner`` is gone (empty: it still does not fit).

    Probes under the core's undo: the cluster is unchanged afterwards.
    """
    with cluster.without([owner]):
        placed = cluster.place(probe, gang)
        if not isinstance(placed, GangPlacement):
            return []
        cluster.release(probe)
        return sorted({pp.node for pods in placed.pods.values() for pp in pods})


def _capacity(ctx: _Context, p: PendingDecision, wl: Workload) -> tuple[tuple[Blocker, ...], str]:
    cluster = ctx.world.cluster
    if cluster is None:
        return (), ""
    gangs = _flavored(ctx, p, wl)
    eligible: set[str] = set()
    for gang in gangs:
        for g in gang:
            eligible |= cluster.eligible_names(g)
    owners = _owner_nodes(cluster)
    blockers = []
    for owner in sorted(owners):
        on = sorted(owners[owner] & eligible)
        if not on:
            continue
        amount = sum(needs.gpu_milli for n, needs, _ in cluster.owners[owner] if n in eligible)
        kind = "Pod" if owner.startswith("pod:") else "Workload"
        blockers.append(
            Blocker(kind, owner.removeprefix("pod:"), f"holds {amount / 1000:g} GPU on {', '.join(on)}")
        )
    pods = sum(ps.count for ps in wl.pod_sets)
    if p.reason == Reason.EXCEEDS_CLUSTER:
        return tuple(blockers), (
            f"the gang of {pods} pods is larger than every eligible node together: reduce it, set a "
            "minCount for partial admission, or add nodes"
        )
    if pods == 1:
        fix = "no free GPU right now: wait for a holder to finish (see the ETA), or add nodes"
    else:
        fix = (
            f"all {pods} pods must start together: wait for the holders to finish (see the ETA), "
            "set a minCount for partial admission, or add nodes"
        )
    return tuple(blockers), fix


# The diagnosis of each pending reason that has its own; any other reason is read from its message
# (``_simple``).
_Diagnosis = Callable[[_Context, PendingDecision, Workload], tuple[tuple[Blocker, ...], str]]
_DIAGNOSES: dict[str, _Diagnosis] = {
    Reason.WAITING_FOR_QUOTA: _quota,
    Reason.EXCEEDS_MAX_QUOTA: _quota,
    Reason.NO_NODE_ADVERTISES: lambda ctx, _p, wl: _not_advertised(ctx, wl),
    Reason.UNTOLERATED_TAINT: lambda ctx, _p, wl: _taints(ctx, wl),
    Reason.NO_NODE_MATCHES_SELECTOR: lambda ctx, _p, wl: _selector(ctx, wl),
    Reason.FRAGMENTED: _fragmented,
    Reason.WAITING_FOR_GANG_CAPACITY: _capacity,
    Reason.EXCEEDS_CLUSTER: _capacity,
    Reason.WAITING_FOR_PREEMPTED: _preempting,
    Reason.NO_MATCHING_FLAVOR: _no_matching_flavor,
}
