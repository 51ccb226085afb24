"""Flavor assignment: which ResourceFlavor each pod set's resources take.

For each pod set and each resource group it needs, flavors are tried in the
ClusterQueue's order. A flavor is skipped when its taints are not tolerated or its
labels contradict the pod's node selector/affinity; otherwise each resource gets a
mode (fit, preempt, reclaim, no fit) and a borrowing level, and the flavor
fungibility policy decides whether to stop at it or try the next one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.lifecycle import Reason
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.quota import ClusterQueueNode, FlavorResource
from gpuplane.core.victims import PreemptionContext, lowest_subtree_that_fits
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import FlavorFungibility, PodTemplate, ResourceFlavor
from gpuplane.model.quantity import MAX_BASE_UNITS, format_quantity

# Flavor assignment modes, worst to best.
NO_FIT, PREEMPT, FIT = 0, 1, 2
MODE_NAMES = {NO_FIT: "NoFit", PREEMPT: "Preempt", FIT: "Fit"}

# Finer modes used while choosing a flavor.
G_NO_FIT, G_NO_CANDIDATES, G_PREEMPT, G_RECLAIM, G_FIT = range(5)
_COARSE = {G_NO_FIT: NO_FIT, G_NO_CANDIDATES: PREEMPT, G_PREEMPT: PREEMPT, G_RECLAIM: PREEMPT, G_FIT: FIT}

# Why a workload does not fit (most severe last).
_SEVERITY = {"": 0, Reason.WAITING_FOR_QUOTA: 2, Reason.EXCEEDS_MAX_QUOTA: 3, Reason.NO_MATCHING_FLAVOR: 4}


def most_severe(a: str, b: str) -> str:
    return a if _SEVERITY.get(a, 0) >= _SEVERITY.get(b, 0) else b


@dataclass(frozen=True, slots=True)
class Granular:
    mode: int
    borrow: float  # borrowing level; inf is the worst


WORST = Granular(G_NO_FIT, float("inf"))
BEST = Granular(G_FIT, 0)


def is_preferred(a: Granular, b: Granular, ff: FlavorFungibility) -> bool:
    """Whether mode ``a`` is better than ``b`` under the fungibility preference."""
    if G_NO_FIT in (a.mode, b.mode):
        return a.mode != G_NO_FIT  # anything beats no fit; no fit beats nothing
    a_none, b_none = a.mode == G_NO_CANDIDATES, b.mode == G_NO_CANDIDATES
    if a_none != b_none:
        return not a_none
    if ff.preference == "PreemptionOverBorrowing":
        if a.borrow != b.borrow:
            return a.borrow < b.borrow
        return a.mode > b.mode
    if a.mode != b.mode:
        return a.mode > b.mode
    return a.borrow < b.borrow


def should_try_next_flavor(mode: Granular, ff: FlavorFungibility) -> bool:
    if mode.mode in (G_NO_FIT, G_NO_CANDIDATES):
        return True
    if mode.mode in (G_PREEMPT, G_RECLAIM) and ff.when_can_preempt == "TryNextFlavor":
        return True
    return mode.borrow != 0 and ff.when_can_borrow == "TryNextFlavor"


@dataclass(slots=True)
class FlavorChoice:
    flavor: str
    mode: int
    borrow: int
    # Kueue's TriedFlavorIdx: the last flavor index the scan reached, -1 after the last flavor.
    tried: int = -1


@dataclass(slots=True)
class PodSetAssignment:
    name: str
    count: int
    requests: dict[str, int]
    flavors: dict[str, FlavorChoice] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)
    error: str | None = None
    no_fit_reason: str = ""

    @property
    def is_fit(self) -> bool:
        return self.error is None and not self.reasons

    def mode(self) -> int:
        if self.is_fit:
            return FIT
        if self.error is not None or not self.flavors:
            return NO_FIT
        return min(choice.mode for choice in self.flavors.values())


@dataclass(slots=True)
class Assignment:
    pod_sets: list[PodSetAssignment] = field(default_factory=list)
    borrowing: int = 0
    usage: dict[FlavorResource, int] = field(default_factory=dict)
    no_fit_reason: str = ""

    def mode(self) -> int:
        pod_sets = self.pod_sets
        if len(pod_sets) == 1:  # most workloads: one pod set
            return pod_sets[0].mode()
        if not pod_sets:
            return NO_FIT
        return min(ps.mode() for ps in pod_sets)

    def message(self) -> str:
        parts = []
        for ps in self.pod_sets:
            if ps.is_fit:
                continue
            if ps.error is not None:
                return f"failed to assign flavors to pod set {ps.name}: {ps.error}"
            parts.append(f"couldn't assign flavors to pod set {ps.name}: {', '.join(sorted(ps.reasons))}")
        return "; ".join(parts)

    def append(self, ps: PodSetAssignment) -> None:
        self.pod_sets.append(ps)
        usage, requests = self.usage, ps.requests
        for res, choice in ps.flavors.items():
            self.borrowing = max(self.borrowing, choice.borrow)
            fr = (choice.flavor, res)
            # Saturating, as Kueue's Requests.Add: a huge request stays at the int64 bound.
            total = usage.get(fr, 0) + requests.get(res, 0)
            usage[fr] = total if total < MAX_BASE_UNITS else MAX_BASE_UNITS

    def scan_progress(self) -> dict[tuple[int, str], int]:
        """Kueue's LastTriedFlavorIdx: per pod set and resource, where the flavor scan stopped."""
        return {(i, res): c.tried for i, ps in enumerate(self.pod_sets) for res, c in ps.flavors.items()}

    def flavors_needing_preemption(self) -> frozenset[FlavorResource]:
        return frozenset(
            (choice.flavor, res)
            for ps in self.pod_sets
            for res, choice in ps.flavors.items()
            if choice.mode == PREEMPT
        )

    def quota_requests(self, pending: PendingWorkload) -> dict[FlavorResource, int]:
        """Kueue's TotalRequestsFor: usage of the pod sets at their assigned counts."""
        out: dict[FlavorResource, int] = {}
        counts = [ps.count for ps in self.pod_sets]
        if len(counts) < len(pending.workload.pod_sets):
            return out
        for ps, requests in zip(self.pod_sets, pending.requests_at(counts), strict=True):
            for res, q in requests.items():
                if q == 0 or res not in ps.flavors:
                    continue
                fr = (ps.flavors[res].flavor, res)
                out[fr] = out.get(fr, 0) + q
        return out


def untolerated_taint(flavor: ResourceFlavor, template: PodTemplate) -> str | None:
    tolerations = (*template.tolerations, *flavor.tolerations)
    for taint in flavor.node_taints:
        if taint.effect not in ("NoSchedule", "NoExecute"):
            continue
        if not any(t.tolerates(taint) for t in tolerations):
            return str(taint)
    return None


def flavor_matches_affinity(flavor: ResourceFlavor, template: PodTemplate) -> bool:
    """Node selector and required affinity, restricted to the flavor's own label keys."""
    labels = flavor.node_labels
    for k, v in template.node_selector.items():
        if k in labels and labels[k] != v:
            return False
    terms = template.required_node_terms
    if not terms:
        return True
    matched = False
    for term in terms:
        relevant = False
        for e in term.match_expressions:
            if e.key in labels:
                relevant = True
                if not e.matches(labels):
                    break
        else:
            if not relevant:
                return True  # a term with no relevant keys matches any flavor
            matched = True
        # (a failed relevant expression fails its term; a later term may still match)
    return matched


def ineligibility(name: str, flavor: ResourceFlavor, template: PodTemplate) -> str | None:
    """Why pods of ``template`` may not take the flavor ``name`` (an untolerated taint, labels
    against their affinity), or None when they may."""
    if (taint := untolerated_taint(flavor, template)) is not None:
        return f"untolerated taint {taint} in flavor {name}"
    if not flavor_matches_affinity(flavor, template):
        return f"flavor {name} doesn't match node affinity"
    return None


class EligibilityMemo:
    """:func:`ineligibility` per flavor and template object, asked for every flavor a scan visits.

    Flavors and templates are immutable (frozen dataclasses over read-only mappings), so the
    answer never changes; the memo keeps both objects, so no other object can take their
    identity while it is remembered. Past ``size`` entries it starts afresh.
    """

    def __init__(self, size: int = 4096) -> None:
        self.size = size
        self._known: dict[tuple[str, int], tuple[ResourceFlavor, PodTemplate, str | None]] = {}

    def why_not(self, name: str, flavor: ResourceFlavor, template: PodTemplate) -> str | None:
        key = (name, id(template))
        known = self._known.get(key)
        if known is not None and known[0] is flavor and known[1] is template:
            return known[2]
        why = ineligibility(name, flavor, template)
        if len(self._known) >= self.size:
            self._known.clear()
        self._known[key] = (flavor, template, why)
        return why


@dataclass(slots=True)
class _FlavorScan:
    """One resource group's flavor scan so far: every reason a flavor was passed over, the no-fit
    reason of each flavor tried (the group is blocked by the least severe, flavors being
    alternatives), and the best flavor's choices and mode."""

    reasons: list[str] = field(default_factory=list)
    attempt_reasons: list[str] = field(default_factory=list)
    best: dict[str, FlavorChoice] | None = None
    best_mode: Granular = WORST


class FlavorAssigner:
    """Assigns flavors to one pending workload against one ClusterQueue."""

    __slots__ = ("config", "cq", "eligibility", "flavors", "nominated", "pending", "preemptor", "start")

    def __init__(  # noqa: PLR0913  the scheduler's flavors, preemptor and config, plus optional keywords
        self,
        pending: PendingWorkload,
        cq: ClusterQueueNode,
        flavors: Mapping[str, ResourceFlavor],
        preemptor: Preemptor,
        config: SchedulerConfig,
        *,
        nominated: list[dict[str, str]] | None = None,
        start: Mapping[tuple[int, str], int] | None = None,
        eligibility: EligibilityMemo | None = None,
    ) -> None:
        self.pending = pending
        self.cq = cq
        self.flavors = flavors
        self.preemptor = preemptor
        self.config = config
        # Kueue's NominationMapping: per pod set, the flavor each resource was nominated with.
        # A recomputation within the cycle sticks to those flavors.
        self.nominated = nominated
        # Kueue's LastAssignment: the scan of each pod set's resource group resumes after the
        # flavor it reached last time (NextFlavorToTryForPodSetResource).
        self.start = start or {}
        # Which flavors the pod templates may take: the scheduler's memo, kept across nominations.
        self.eligibility = EligibilityMemo() if eligibility is None else eligibility

    def assign(self, counts: list[int] | None = None) -> Assignment:
        wl = self.pending.workload
        if counts is None:
            counts = [ps.count for ps in wl.pod_sets]
        cq = self.cq
        requests_per_set = quota_requests_per_pod_set(self.pending, cq, counts)
        assignment = Assignment()
        for i, ps in enumerate(wl.pod_sets):
            count = counts[i]
            requests = requests_per_set[i]
            psa = PodSetAssignment(name=ps.name, count=count, requests=requests)
            # The flavors chosen for the pod set: only resources it requests (each resource group's
            # choices cover resources of ``order``), so they are the pod set's flavors as they are.
            chosen: dict[str, FlavorChoice] = {}
            failed = False
            order = sorted(requests)
            for res in order:
                if res in chosen or (requests[res] == 0 and cq.group_for(res) is None):
                    continue
                flavors, reasons, no_fit, error = self._find_flavor(i, requests, order, res, assignment.usage)
                if error is not None or not flavors:
                    chosen = {}
                    psa.reasons = reasons
                    psa.error = error
                    psa.no_fit_reason = no_fit
                    failed = True
                    break
                chosen.update(flavors)
                if reasons:
                    psa.reasons += reasons
            psa.flavors = chosen
            assignment.append(psa)
            if failed and requests:
                assignment.no_fit_reason = most_severe(assignment.no_fit_reason, psa.no_fit_reason)
                return assignment
        if assignment.mode() == NO_FIT:
            for psa in assignment.pod_sets:
                assignment.no_fit_reason = most_severe(assignment.no_fit_reason, psa.no_fit_reason)
        return assignment

    def _find_flavor(
        self,
        ps_index: int,
        requests: dict[str, int],
        order: list[str],
        res: str,
        assigned: dict[FlavorResource, int],
    ) -> tuple[dict[str, FlavorChoice] | None, list[str], str, str | None]:
        """Returns (flavors for the resource group, reasons, no-fit reason, error); ``order``: the
        requested resources sorted by name."""
        group_for = self.cq.group_for
        group = group_for(res)
        if group is None:
            return None, [f"resource {res} unavailable in ClusterQueue"], Reason.NO_MATCHING_FLAVOR, None
        covered = [r for r in order if group_for(r) is group]
        template = self.pending.workload.pod_sets[ps_index].template
        ff = self.cq.spec.flavor_fungibility
        scan = _FlavorScan()
        first = self.start.get((ps_index, res), -1) + 1 if self.config.flavor_fungibility else 0
        attempted = -1
        for index in range(first, len(group.flavors)):
            attempted = index
            name = group.flavors[index].name
            if not self._flavor_eligible(ps_index, res, name, template, scan):
                continue
            mode, choices = self._flavor_mode(name, covered, requests, assigned, scan)
            if self._keep_best(mode, choices, ff, scan):
                break
        if self.config.flavor_fungibility:
            tried = -1 if attempted == len(group.flavors) - 1 else attempted
            for choice in (scan.best or {}).values():
                choice.tried = tried
        if scan.best_mode.mode == G_FIT:
            return scan.best, [], "", None
        attempts = scan.attempt_reasons
        no_fit_reason = min(attempts, key=lambda r: _SEVERITY.get(r, 0)) if attempts else ""
        return scan.best, scan.reasons, no_fit_reason, None

    def _flavor_eligible(
        self, ps_index: int, res: str, name: str, template: PodTemplate, scan: _FlavorScan
    ) -> bool:
        """Whether the flavor may be tried at all: nominated (when recomputing), known, tolerated
        and matching the pod's affinity. Otherwise the scan notes why not."""
        if self.nominated is not None and self.nominated[ps_index].get(res) != name:
            scan.reasons.append(
                f"skipping flavor {name} as it is not found in the nomination mapping for resource {res}"
            )
            return False
        flavor = self.flavors.get(name)
        why = (
            f"flavor {name} not found" if flavor is None else self.eligibility.why_not(name, flavor, template)
        )
        if why is None:
            return True
        scan.reasons.append(why)
        scan.attempt_reasons.append(Reason.NO_MATCHING_FLAVOR)
        return False

    def _flavor_mode(
        self,
        name: str,
        covered: list[str],
        requests: dict[str, int],
        assigned: dict[FlavorResource, int],
        scan: _FlavorScan,
    ) -> tuple[Granular, dict[str, FlavorChoice]]:
        """The flavor's worst mode over the group's resources, and a choice per resource."""
        ff = self.cq.spec.flavor_fungibility
        choices: dict[str, FlavorChoice] = {}
        mode = BEST
        flavor_reason = ""
        for rname in covered:
            fr = (name, rname)
            gmode, borrow, why, nofit = self._fits_quota(fr, assigned.get(fr, 0), requests[rname])
            if why:
                scan.reasons += why
            if nofit:  # (most_severe keeps the first reason against an empty one)
                flavor_reason = most_severe(flavor_reason, nofit)
            # A fit without borrowing is BEST, which no mode is preferred to (borrowing levels are
            # never negative): the worst mode so far stays, and no Granular need be built for it.
            if gmode != G_FIT or borrow != 0:
                candidate = Granular(gmode, borrow)
                if is_preferred(mode, candidate, ff):
                    mode = candidate
            if mode.mode == G_NO_FIT:
                continue
            choices[rname] = FlavorChoice(name, _COARSE[gmode], borrow)
        if mode.mode == G_NO_FIT:
            scan.attempt_reasons.append(flavor_reason or Reason.WAITING_FOR_QUOTA)
        return mode, choices

    def _keep_best(
        self, mode: Granular, choices: dict[str, FlavorChoice], ff: FlavorFungibility, scan: _FlavorScan
    ) -> bool:
        """Keep the flavor if it is the best so far; True when the scan stops at it."""
        if self.config.flavor_fungibility:
            if not should_try_next_flavor(mode, ff):
                scan.best, scan.best_mode = choices, mode
                return True
            if is_preferred(mode, scan.best_mode, ff):
                scan.best, scan.best_mode = choices, mode
            return False
        if mode.mode > scan.best_mode.mode:
            scan.best, scan.best_mode = choices, mode
            return mode.mode == G_FIT
        return False

    def _fits_quota(
        self, fr: FlavorResource, assumed: int, request: int
    ) -> tuple[int, int, tuple[str, ...], str]:
        """Mode, borrowing level, reasons and no-fit reason for one flavor-resource."""
        cq = self.cq
        flavor, res = fr
        max_capacity = cq.potential_available(fr)
        value = assumed + request
        if value > max_capacity:
            msg = (
                f"insufficient quota for {res} in flavor {flavor}, previously considered podsets requests "
                f"({format_quantity(res, assumed)}) + current podset request "
                f"({format_quantity(res, request)}) > maximum capacity ({format_quantity(res, max_capacity)})"
            )
            return G_NO_FIT, 0, (msg,), Reason.EXCEEDS_MAX_QUOTA
        borrow, may_reclaim = lowest_subtree_that_fits(cq, fr, value)
        available = cq.available(fr)
        if value <= available:
            return G_FIT, borrow, (), ""
        msg = (
            f"insufficient unused quota for {res} in flavor {flavor}, "
            f"{format_quantity(res, value - available)} more needed"
        )
        if worth_a_search(cq, self.config, cq.quota_for(fr).nominal, value, may_reclaim):
            gmode, borrow_after = self._simulate_preemption(fr, value, borrow)
            return gmode, borrow_after, (msg,), "" if gmode != G_NO_FIT else Reason.WAITING_FOR_QUOTA
        return G_NO_FIT, borrow, (msg,), Reason.WAITING_FOR_QUOTA

    def _simulate_preemption(self, fr: FlavorResource, value: int, borrow: int) -> tuple[int, int]:
        """The mode and borrowing level once the preemption search for ``value`` of ``fr`` is
        done; ``borrow``: the level now (a search that finds nothing leaves the tree as it was)."""
        ctx = PreemptionContext(self.pending, self.cq, frozenset([fr]), {fr: value})
        targets = self.preemptor.get_targets(ctx)
        if not targets:
            return G_NO_CANDIDATES, borrow
        with self.preemptor.tree.without_usage_of([t.workload for t in targets], (fr,)):
            borrow_after, _ = lowest_subtree_that_fits(self.cq, fr, value)
        if any(t.workload.cluster_queue == self.cq.name for t in targets):
            return G_PREEMPT, borrow_after
        return G_RECLAIM, borrow_after


def quota_requests_per_pod_set(
    pending: PendingWorkload, cq: ClusterQueueNode, counts: list[int]
) -> list[dict[str, int]]:
    """What each pod set asks of ``cq``'s quota at ``counts`` pods: its total requests, and its
    pod count as ``pods`` where the queue's resource groups cover that resource (shared lists and
    dicts: read, never changed)."""
    totals = pending.requests_at(counts)
    if "pods" not in cq.resource_group_of:
        return totals
    return [{**requests, "pods": count} for requests, count in zip(totals, counts, strict=True)]


def could_take_flavor(
    pending: PendingWorkload, cq: ClusterQueueNode, flavor: str, preemptor: Preemptor, config: SchedulerConfig
) -> bool:
    """Whether the flavor assignment could give some pod set of ``pending`` the flavor ``flavor``
    in ``cq``'s quota now (mode Fit, or Preempt with targets): a cheap necessary condition.

    Each pod set is taken alone (the pod sets before it only add to what it needs) and at its
    smallest count (partial admission), and each of its resources in a group that lists the
    flavor is asked what :meth:`FlavorAssigner._fits_quota` asks, with the preemption search
    replaced by its necessary condition (:meth:`Preemptor.could_fit`). False means no
    assignment can use the flavor until usage falls again: what waking a workload parked for
    quota after a release would only find out at a nomination's cost.
    """
    wl = pending.workload
    counts = [ps.count if ps.min_count is None else min(ps.min_count, ps.count) for ps in wl.pod_sets]
    for requests in quota_requests_per_pod_set(pending, cq, counts):
        uses_flavor = False
        for res, value in requests.items():
            group = cq.group_for(res)
            if group is None or all(fq.name != flavor for fq in group.flavors):
                continue
            uses_flavor = True
            fr = (flavor, res)
            if value > cq.potential_available(fr):
                break
            if value <= cq.available(fr):
                continue
            _, may_reclaim = lowest_subtree_that_fits(cq, fr, value)
            if not worth_a_search(cq, config, cq.quota_for(fr).nominal, value, may_reclaim):
                break
            if not preemptor.could_fit(PreemptionContext(pending, cq, frozenset([fr]), {fr: value})):
                break
        else:
            if uses_flavor:
                return True
    return False


def worth_a_search(
    cq: ClusterQueueNode, config: SchedulerConfig, nominal: int, value: int, may_reclaim: bool
) -> bool:
    """Whether a preemption search may make room for ``value`` of a flavor-resource whose free
    quota is short: it is within the queue's nominal quota, there is quota to reclaim in the
    cohort, or the queue may preempt while borrowing."""
    policy = cq.spec.preemption
    return (
        nominal >= value
        or may_reclaim
        or policy.borrow_within_cohort != "Never"
        or (config.fair_sharing and policy.reclaim_within_cohort != "Never")
    )
