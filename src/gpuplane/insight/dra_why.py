"""Why a workload's ResourceClaims hold it back (Dynamic Resource Allocation), and what fixes it.

The core says a workload with claims is ``Misconfigured`` (a missing class, claim or template, a CEL
error, no published devices) or waits for capacity ("no placement holds all N pods with their
claims"). :func:`dra_cause` reads the cluster as the plan leaves it (the placement's device
inventory: what is published, what is held and by whom) and names the first cause of these, in
this order, for the first request that has one:

* a claim or template that does not exist;
* a DeviceClass that does not exist;
* a driver named by the class that publishes no ResourceSlice;
* a CEL selector that fails to compile or to run (the class or request and the expression);
* selectors that match no published device, with the clause, and the attribute in it, that rules
  out most devices and the values the devices have;
* every matching device allocated, with the owners holding them;
* a ``matchAttribute``/``distinctAttribute`` constraint no node satisfies (ever, or now).

Each cause comes with its blockers and one fix. Causes that do not clear by waiting take a reason
of :data:`gpuplane.insight.why.NEVER` (their ETA is "never by itself").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.core.analysis import GangPodSet, Scheduler
from gpuplane.core.session import PendingDecision, Reason
from gpuplane.model.dra import ALL, DeviceConstraint, DeviceRequest, ExactRequest
from gpuplane.model.objects import Workload

# Owners named per cause; more are counted.
NAMED = 5
_DRIVER = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")
_REFERENCE = re.compile(r"""device\.(attributes|capacity)\[["']([^"']+)["']\]\.([A-Za-z_][A-Za-z0-9_]*)""")
# How the core's placement begins a Misconfigured message about claims.
PLACEMENT_PROBLEM = "cannot allocate devices"
_WAITING = frozenset({Reason.WAITING_FOR_GANG_CAPACITY, Reason.FRAGMENTED, Reason.EXCEEDS_CLUSTER})


@dataclass(frozen=True, slots=True)
class DraCause:
    """One DRA cause: the reason why reports, its message, the blockers (kind, name, detail) and
    the fix."""

    reason: str
    message: str
    blockers: tuple[tuple[str, str, str], ...]
    fix: str


def has_claims(wl: Workload) -> bool:
    return any(ps.template.claims for ps in wl.pod_sets)


def claim_gang(world: Scheduler, wl: Workload) -> list[GangPodSet]:
    """The workload's pod sets as the core places them, claims resolved (no flavor chosen)."""
    return world.placer.gang(wl, [ps.count for ps in wl.pod_sets], [{} for _ in wl.pod_sets])


def dra_cause(
    world: Scheduler, p: PendingDecision, wl: Workload, cache: dict[str, DraCause | None] | None = None
) -> DraCause | None:
    """The DRA cause of ``p`` (a pending decision on ``wl``), or None where its claims are not
    what holds it back. ``cache`` keeps the answer for workloads of the same reason and claims
    (for every pending workload of one plan)."""
    if not has_claims(wl) or (p.reason != Reason.MISCONFIGURED and p.reason not in _WAITING):
        return None
    if p.reason == Reason.MISCONFIGURED and not p.message.startswith(PLACEMENT_PROBLEM):
        return None  # a queue or quota problem (Kueue's unmapped class included), not the placement
    gang = claim_gang(world, wl)
    for ps in gang:
        if ps.claim_problem is not None:
            return DraCause(
                Reason.MISCONFIGURED,
                ps.claim_problem,
                (("Workload", p.workload, ps.claim_problem),),
                "create the missing ResourceClaim or ResourceClaimTemplate in the workload's namespace, "
                "or fix spec.resourceClaims of the pod template",
            )
    cluster = world.cluster
    dra = cluster.dra if cluster is not None else None
    if dra is None:
        message = "the cluster publishes no devices: no ResourceSlice, no DeviceClass"
        return DraCause(
            Reason.NO_NODE_ADVERTISES,
            message,
            (("ResourceSlice", "-", message),),
            "install the device's DRA driver (its kubelet plugin publishes ResourceSlices), and the "
            "DeviceClasses the claims name",
        )
    key = repr((p.reason, [ps.claims for ps in gang]))
    if cache is not None and key in cache:
        return cache[key]
    found = _Reader(dra, p).cause(gang)
    if cache is not None:
        cache[key] = found
    return found


class _Reader:
    """Reads one workload's claims against the placement's DRA allocator (duck-typed: the
    allocator's ``objects``, ``inventory``, ``cel`` and ``matching``). Owns nothing but the
    pending decision it explains."""

    def __init__(self, dra: Any, p: PendingDecision) -> None:
        self.dra = dra
        self.p = p
        self.objects = dra.objects
        self.inv = dra.inventory
        self.cel = dra.cel

    def cause(self, gang: Sequence[GangPodSet]) -> DraCause | None:
        for ps in gang:
            for need in ps.claims:
                if need.allocated is not None:
                    continue
                for request in need.spec.requests:
                    found = self._request(need.pod_claim, request.alternatives)
                    if found is not None:
                        return found
        for ps in gang:
            for need in ps.claims:
                for constraint in need.spec.constraints:
                    found = self._constraint(need.pod_claim, need.spec.requests, constraint)
                    if found is not None:
                        return found
        if self.p.reason in _WAITING:
            return self._whole_gang(gang)
        return None

    def _whole_gang(self, gang: Sequence[GangPodSet]) -> DraCause:
        """Each pod's claims fit some node, but not every pod of the gang at once."""
        inv = self.inv
        pods = sum(ps.count for ps in gang)
        holders: Counter[str] = Counter()
        for ps in gang:
            for need in ps.claims:
                for request in need.spec.requests:
                    for alt in request.alternatives:
                        try:
                            matching = self.dra.matching(alt)
                        except Exception:  # reported by _alternative where it matters
                            continue
                        for d in matching:
                            owner = inv.taken.get(d)
                            if owner:
                                holders[str(owner)] += 1
        message = (
            f"each pod's claims fit a node, but no placement holds all {pods} pods with their claims at once"
        )
        blockers = tuple(
            _holder(o, f"holds {n} devices the claims may get") for o, n in holders.most_common(NAMED)
        )
        return DraCause(
            Reason.WAITING_FOR_GANG_CAPACITY,
            message,
            blockers,
            f"all {pods} pods must start together: wait for the holders to finish (see the ETA), set a "
            "minCount for partial admission, or add nodes whose driver publishes matching devices",
        )

    def _request(self, pod_claim: str, alternatives: Sequence[ExactRequest]) -> DraCause | None:
        """The cause of the first alternative, where no alternative of the request can be met."""
        causes = [self._alternative(pod_claim, alt) for alt in alternatives]
        if any(c is None for c in causes):
            return None
        return causes[0]

    def _alternative(self, pod_claim: str, alt: ExactRequest) -> DraCause | None:
        where = f"pod claim {pod_claim}, request {alt.name}"
        cls = self.objects.classes.get(alt.device_class)
        if cls is None:
            known = ", ".join(sorted(self.objects.classes)) or "none"
            message = f"{where}: DeviceClass {alt.device_class} does not exist"
            return DraCause(
                Reason.MISCONFIGURED,
                message,
                (("DeviceClass", alt.device_class, "not found"),),
                f"name an existing DeviceClass in deviceClassName (the cluster has: {known}), or create "
                f"DeviceClass {alt.device_class}",
            )
        publishing = {e.driver for e in self.inv.entries}
        named = set(cls.config_drivers)
        for expression in cls.selectors:
            named.update(_DRIVER.findall(expression))
        silent = sorted(d for d in named if d not in publishing)
        if named and not (named & publishing):
            message = (
                f"{where}: DeviceClass {cls.name} selects devices of driver {', '.join(silent)}, "
                "which publishes no ResourceSlice"
            )
            drivers = ", ".join(sorted(publishing)) or "none"
            return DraCause(
                Reason.NO_NODE_ADVERTISES,
                message,
                tuple(("Driver", d, "publishes no ResourceSlice") for d in silent),
                f"install or restart the DRA driver {', '.join(silent)} (its kubelet plugin publishes the "
                f"nodes' ResourceSlices; check kubectl get resourceslices), or use a class of a driver "
                f"that publishes devices ({drivers})",
            )
        owned = [(f"DeviceClass {cls.name}", e) for e in cls.selectors]
        owned += [(f"request {alt.name}", e) for e in alt.selectors]
        try:
            matching = self.dra.matching(alt)
        except Exception as err:  # the allocator's DraError: a CEL expression that fails
            message = f"{where}: {err}"
            owner = "DeviceClass" if f"DeviceClass {cls.name}" in str(err) else "ResourceClaimTemplate"
            name = cls.name if owner == "DeviceClass" else pod_claim
            return DraCause(
                Reason.MISCONFIGURED,
                message,
                ((owner, name, str(err)),),
                "fix the CEL expression (the device environment: device.driver, "
                'device.attributes["domain"].name, device.capacity["domain"].name, '
                "device.allowMultipleAllocations)",
            )
        if not matching:
            return self._no_match(where, alt, owned)
        return self._held(where, alt, matching)

    # --- selectors that match nothing ---------------------------------------------------------

    def _no_match(self, where: str, alt: ExactRequest, owned: list[tuple[str, str]]) -> DraCause:
        entries = self.inv.entries
        total = len(entries)
        worst: tuple[int, str, str] | None = None  # rejected, owner, clause
        for owner, expression in owned:
            for clause in split_and(expression):
                rejected = sum(1 for e in entries if not self._matches(clause, e))
                if worst is None or rejected > worst[0]:
                    worst = (rejected, owner, clause)
        blockers: list[tuple[str, str, str]] = []
        if worst is None or worst[0] == 0:
            # The selectors match; capacity or device taints rule the devices out.
            detail = "the devices the selectors match have too little capacity or untolerated taints"
            message = f"{where}: no published device matches: {detail}"
            blockers.append(("DeviceClass", alt.device_class, detail))
            fix = "ask for less capacity (capacity.requests), or tolerate the devices' taints"
            return DraCause(Reason.NO_NODE_ADVERTISES, message, tuple(blockers), fix)
        rejected, owner, clause = worst
        refs = _REFERENCE.findall(clause)
        detail = f"{clause!r} rules out {rejected} of {total} published devices"
        fix = f"change the selector {clause!r} of {owner}"
        if refs:
            field, domain, name = refs[0]
            values = self._values(field, domain, name)
            attribute = f"{domain}/{name}"
            shown = ", ".join(f"{v} ({n})" for v, n in values.most_common(NAMED)) or "no device has it"
            detail += f"; attribute {attribute} rules out most: the devices have {shown}"
            fix += f" to a value the devices publish for {attribute} ({shown})"
        message = f"{where}: the selectors match no published device: {detail}"
        blockers.append(
            ("DeviceClass" if owner.startswith("DeviceClass") else "Request", owner.split()[-1], detail)
        )
        return DraCause(
            Reason.NO_NODE_ADVERTISES, message, tuple(blockers), fix + ", or add devices that match"
        )

    def _matches(self, expression: str, entry: Any) -> bool:
        try:
            return bool(self.cel.matches(expression, entry.driver, entry.device))
        except Exception:  # a missing attribute: the device does not match (as Kubernetes reads it)
            return False

    def _values(self, field: str, domain: str, name: str) -> Counter[str]:
        out: Counter[str] = Counter()
        for e in self.inv.entries:
            key = f"{domain}/{name}"
            mapping = e.device.attributes if field == "attributes" else e.device.capacity
            value = mapping.get(key)
            if value is None and domain == e.driver:
                value = mapping.get(name)
            if value is not None:
                out[str(getattr(value, "text", value))] += 1
        return out

    # --- every matching device held ----------------------------------------------------------

    def _free(self, index: int, alt: ExactRequest | None = None) -> bool:
        """Whether device ``index`` can still be given (to ``alt``, for a device shared by capacity)."""
        inv = self.inv
        entry = inv.entries[index]
        if entry.device.allow_multiple:
            if alt is not None:
                consumed = self.dra.consumption(alt, entry)
                if any(inv.capacity_left(index, n) < amount for n, amount in consumed.items()):
                    return False
            return bool(inv.counters_free(entry)) or inv.shares.get(index, 0) > 0
        return index not in inv.taken and bool(inv.counters_free(entry))

    def _held(self, where: str, alt: ExactRequest, matching: Iterable[int]) -> DraCause | None:
        inv = self.inv
        indexes = sorted(matching)
        free = [d for d in indexes if self._free(d, alt)]
        want = 1 if alt.mode == ALL else alt.count
        per_node: Counter[str] = Counter()
        for d in free:
            for node in inv.reach[d]:
                per_node[node] += 1
        if per_node and max(per_node.values()) >= want:
            return None
        holders: Counter[str] = Counter()
        wanted = set(indexes)
        for owner, takes in inv.owners.items():  # whole devices and shares of capacity
            held = len({i for i, _ in takes if i in wanted})
            if held:
                holders[str(owner)] += held
        for d in indexes:  # partitions whose counters others' devices consume
            if d not in inv.taken and not inv.shares.get(d) and not inv.counters_free(inv.entries[d]):
                owner = self._counter_owner(d)
                if owner:
                    holders[owner] += 1
        most = max(per_node.values(), default=0)
        message = (
            f"{where}: every device it may get is allocated: {len(indexes)} match, {len(free)} free, "
            f"at most {most} free on one node, {want} needed on one node"
        )
        blockers = tuple(
            _holder(o, f"holds {n} of the {len(indexes)} matching devices")
            for o, n in holders.most_common(NAMED)
        )
        more = f" and {len(holders) - NAMED} more" if len(holders) > NAMED else ""
        names = ", ".join(b[1] for b in blockers) + more
        return DraCause(
            Reason.WAITING_FOR_GANG_CAPACITY,
            message,
            blockers,
            f"wait for the holders ({names or 'none'}) to finish (see the ETA), ask for fewer devices, or "
            "add nodes whose driver publishes matching devices",
        )

    def _counter_owner(self, index: int) -> str | None:
        """Who holds a partition's counters: an owner of a device of the same counter set."""
        inv = self.inv
        entry = inv.entries[index]
        sets = set(entry.device.consumes)
        for d, owner in inv.taken.items():
            other = inv.entries[d]
            if (other.driver, other.pool) == (entry.driver, entry.pool) and sets & set(other.device.consumes):
                return str(owner)
        return None

    # --- constraints -------------------------------------------------------------------------

    def _constraint(
        self, pod_claim: str, requests: Sequence[DeviceRequest], c: DeviceConstraint
    ) -> DraCause | None:
        alts = [r.alternatives[0] for r in requests if not c.requests or r.name in c.requests]
        if not alts:
            return None
        attribute = c.match_attribute or c.distinct_attribute
        assert attribute is not None
        want = sum(a.count for a in alts if a.mode != ALL)
        try:
            matching = set().union(*(self.dra.matching(a) for a in alts))
        except Exception:
            return None
        now = self._best(matching, attribute, c, free_only=True)
        if now >= want:
            return None
        ever = self._best(matching, attribute, c, free_only=False)
        kind = "matchAttribute" if c.match_attribute else "distinctAttribute"
        group = "sharing one value of" if c.match_attribute else "with distinct values of"
        where = f"pod claim {pod_claim}: constraint {kind} {attribute}"
        if ever < want:
            message = (
                f"{where}: no node has {want} matching devices {group} it (at most {ever}), "
                "even with every device free"
            )
            return DraCause(
                Reason.NO_NODE_ADVERTISES,
                message,
                (("Constraint", attribute, message),),
                f"relax the constraint ({kind} {attribute}) or ask for at most {ever} devices under it",
            )
        message = f"{where}: no node has {want} free matching devices {group} it right now (at most {now})"
        return DraCause(
            Reason.WAITING_FOR_GANG_CAPACITY,
            message,
            (("Constraint", attribute, message),),
            "wait for devices to free up (see the ETA), or relax the constraint",
        )

    def _best(self, matching: set[int], attribute: str, c: DeviceConstraint, *, free_only: bool) -> int:
        """The most devices one node offers under the constraint."""
        inv = self.inv
        groups: dict[str, Counter[object]] = {}
        for d in matching:
            if free_only and not self._free(d):
                continue
            value = inv.entries[d].device.attributes.get(attribute)
            if value is None:
                continue
            for node in inv.reach[d]:
                groups.setdefault(node, Counter())[value] += 1
        if c.match_attribute is not None:
            return max((max(g.values()) for g in groups.values()), default=0)
        return max((len(g) for g in groups.values()), default=0)


def _holder(owner: str, detail: str) -> tuple[str, str, str]:
    """A blocker for an owner of devices: a workload, a pod, or a claim allocated in the input."""
    kind = (
        "Pod" if owner.startswith("pod:") else "ResourceClaim" if owner.startswith("claim:") else "Workload"
    )
    return (kind, owner.removeprefix("pod:").removeprefix("claim:"), detail)


def split_and(expression: str) -> list[str]:
    """The clauses of ``expression`` joined by a top-level ``&&`` (outside brackets and strings)."""
    out: list[str] = []
    depth, quote, start, i = 0, "", 0, 0
    while i < len(expression):
        ch = expression[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and expression.startswith("&&", i):
            out.append(expression[start:i].strip())
            start = i + 2
            i += 1
        i += 1
    out.append(expression[start:].strip())
    return [c for c in out if c]
