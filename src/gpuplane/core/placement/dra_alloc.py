"""Allocating a pod's ResourceClaims on one node, as Kubernetes' structured allocator does.

A pod's claims (:func:`resolve_claims`: its own claim from a template, or a shared ResourceClaim)
are allocated on one node at a time: each request in order, a ``firstAvailable`` request's
subrequests in order, ``ExactCount`` devices or ``All`` matching ones, with the claim's
``matchAttribute`` and ``distinctAttribute`` constraints, device taints against the request's
tolerations, counters of partitionable devices and consumable capacity. The search backtracks
over the choices (bounded by :data:`SEARCH_STEPS`) and takes what it chose in the
:class:`~gpuplane.core.placement.dra_inventory.DraInventory` only on success. A shared claim is
allocated once: a later pod reuses its devices where they are reachable.

A missing DeviceClass, claim or template, or a CEL selector that fails, raises
:class:`DraError`, which placement turns into a pending reason; no fit on a node is ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction

from gpuplane.core.placement.dra_inventory import ZERO, DeviceEntry, DraInventory
from gpuplane.model.dra import (
    ALL,
    AllocatedDevice,
    ClaimSpec,
    DeviceConstraint,
    DraObjects,
    ExactRequest,
    PodClaim,
)
from gpuplane.model.dra_cel import CelSelectors, SelectorError

# Device choices tried per claim and node before the node counts as no fit.
SEARCH_STEPS = 20_000

ClaimResult = tuple[str, tuple[AllocatedDevice, ...]]  # pod claim name, its devices


class DraError(Exception):
    """A claim that cannot be allocated as written (no class, claim, template; a CEL error)."""


@dataclass(frozen=True, slots=True)
class ClaimNeed:
    """One pod claim of a pod set: the pod's name for it, the claim spec, and the shared
    ResourceClaim's key (``None``: each pod gets a claim of its own, from a template)."""

    pod_claim: str
    spec: ClaimSpec
    shared: str | None = None
    allocated: tuple[AllocatedDevice, ...] | None = None  # a shared claim's allocation in the input
    # Devices a plan chose for the claim (bind time), one option each: tried first, in order, each
    # alone; when none still fits, the claim's devices are chosen again. Empty: any.
    planned: tuple[tuple[AllocatedDevice, ...], ...] = ()


def resolve_claims(objects: DraObjects, namespace: str, claims: Sequence[PodClaim]) -> tuple[ClaimNeed, ...]:
    """The pod claims of a pod template in ``namespace``; :class:`DraError` for a missing one."""
    out = []
    for c in claims:
        if c.claim_name is not None:
            key = f"{namespace}/{c.claim_name}"
            claim = objects.claims.get(key)
            if claim is None:
                raise DraError(f"pod claim {c.name}: ResourceClaim {key} not found")
            out.append(ClaimNeed(c.name, claim.spec, key, claim.allocation))
        else:
            key = f"{namespace}/{c.template_name}"
            template = objects.templates.get(key)
            if template is None:
                raise DraError(f"pod claim {c.name}: ResourceClaimTemplate {key} not found")
            out.append(ClaimNeed(c.name, template.spec))
    return tuple(out)


class _Search:
    """One claim's backtracking search on one node. Owns the choices made so far (device,
    consumed capacity, result) and the step count; reads the allocator's matching devices and the
    inventory's free state, and takes each choice there (given back when undone)."""

    def __init__(
        self,
        alloc: DraAllocator,
        owner: str,
        node: str,
        spec: ClaimSpec,
        only: frozenset[tuple[str, int]] | None = None,
    ) -> None:
        self.alloc = alloc
        self.inv = alloc.inventory
        self.owner = owner
        self.node = node
        self.spec = spec
        self.only = only  # (request, device index) allowed for ExactCount requests; None: any
        self.chosen: list[tuple[ExactRequest, int, Mapping[str, Fraction] | None]] = []
        self.steps = 0

    def run(self) -> list[tuple[ExactRequest, int, Mapping[str, Fraction] | None]] | None:
        if self._request(0):
            return self.chosen
        for _, index, consumed in reversed(self.chosen):
            self.inv.give_back(self.owner, index, consumed)
        self.chosen = []
        return None

    def _request(self, i: int) -> bool:
        requests = self.spec.requests
        if i == len(requests):
            return True
        for alt in requests[i].alternatives:
            candidates = self.alloc.candidates(alt, self.node)
            if self.only is not None and alt.mode != ALL:
                candidates = [d for d in candidates if (alt.name, d) in self.only]
            if alt.mode == ALL:
                if self._all(alt, candidates, i):
                    return True
            elif self._pick(alt, candidates, 0, alt.count, i):
                return True
        return False

    def _all(self, alt: ExactRequest, candidates: list[int], i: int) -> bool:
        inv = self.inv
        if not candidates or any(
            (inv.entries[d].driver, inv.entries[d].pool) in inv.incomplete for d in candidates
        ):
            return False
        mark = len(self.chosen)
        for d in candidates:
            if not self._choose(alt, d):
                self._undo(mark)
                return False
        if self._request(i + 1):
            return True
        self._undo(mark)
        return False

    def _pick(self, alt: ExactRequest, candidates: list[int], start: int, left: int, i: int) -> bool:
        if left == 0:
            return self._request(i + 1)
        for k in range(start, len(candidates) - left + 1):
            self.steps += 1
            if self.steps > SEARCH_STEPS:
                return False
            mark = len(self.chosen)
            if not self._choose(alt, candidates[k]):
                continue
            if self._pick(alt, candidates, k + 1, left - 1, i):
                return True
            self._undo(mark)
        return False

    def _choose(self, alt: ExactRequest, index: int) -> bool:
        """Take ``index`` for ``alt`` if it is free and meets the constraints."""
        inv = self.inv
        entry = inv.entries[index]
        if entry.device.allow_multiple:
            consumed: Mapping[str, Fraction] | None = self.alloc.consumption(alt, entry)
            assert consumed is not None
            if any(inv.capacity_left(index, n) < amount for n, amount in consumed.items()):
                return False
            if inv.shares.get(index, 0) == 0 and not inv.counters_free(entry):
                return False
        else:
            consumed = None
            if index in inv.taken or not inv.counters_free(entry):
                return False
        if not self._constraints_hold(alt, entry):
            return False
        inv.take(self.owner, index, consumed)
        self.chosen.append((alt, index, consumed))
        return True

    def _constraints_hold(self, alt: ExactRequest, entry: DeviceEntry) -> bool:
        for c in self.spec.constraints:
            if not _covers(c, alt):
                continue
            attribute = c.match_attribute or c.distinct_attribute
            assert attribute is not None
            value = entry.device.attributes.get(attribute)
            if value is None:
                return False
            others = [
                self.inv.entries[d].device.attributes.get(attribute)
                for a, d, _ in self.chosen
                if _covers(c, a)
            ]
            if c.match_attribute is not None and others and others[0] != value:
                return False
            if c.distinct_attribute is not None and value in others:
                return False
        return True

    def _undo(self, mark: int) -> None:
        while len(self.chosen) > mark:
            _, index, consumed = self.chosen.pop()
            self.inv.give_back(self.owner, index, consumed)


def _covers(c: DeviceConstraint, alt: ExactRequest) -> bool:
    return not c.requests or alt.name in c.requests or alt.name.split("/", 1)[0] in c.requests


def _least(need: ClaimNeed) -> int:
    """The fewest devices a claim takes on a node (none when it is allocated already)."""
    if need.allocated is not None or need.shared is not None:
        return 0
    return sum(min(a.count if a.mode != ALL else 1 for a in r.alternatives) for r in need.spec.requests)


class DraAllocator:
    """Allocates pods' claims on nodes over one :class:`DraInventory`. Owns the compiled
    selectors and, per request, the devices it may ever be given (class and request selectors,
    capacity, tolerations), computed once; and the last reason a pod found no node."""

    def __init__(self, objects: DraObjects, inventory: DraInventory) -> None:
        self.objects = objects
        self.inventory = inventory
        self.cel = CelSelectors()
        # By what decides it (class, selectors, capacity, tolerations): claims alike share it.
        self._matching: dict[tuple[object, ...], frozenset[int]] = {}
        self.last_miss = ""
        self.replanned = 0  # claims whose planned devices no longer fit, so others were chosen

    def matching(self, alt: ExactRequest) -> frozenset[int]:
        """Every published device ``alt`` may be given, free or not."""
        key = (alt.device_class, alt.selectors, tuple(sorted(alt.capacity.items())), alt.tolerations)
        cached = self._matching.get(key)
        if cached is not None:
            return cached
        cls = self.objects.classes.get(alt.device_class)
        if cls is None:
            raise DraError(f"request {alt.name}: DeviceClass {alt.device_class} not found")
        out = set()
        for entry in self.inventory.entries:
            device = entry.device
            if any(
                taint.effect != "None" and not any(t.tolerates(taint) for t in alt.tolerations)
                for taint in device.taints
            ):
                continue
            if not self._capacity_fits(alt, entry):
                continue
            try:
                if all(self.cel.matches(e, entry.driver, device) for e in cls.selectors) and all(
                    self.cel.matches(e, entry.driver, device) for e in alt.selectors
                ):
                    out.add(entry.index)
            except SelectorError as err:
                owner = (
                    f"DeviceClass {cls.name}" if err.expression in cls.selectors else f"request {alt.name}"
                )
                raise DraError(f"{owner}: {err}") from None
        found = frozenset(out)
        self._matching[key] = found
        return found

    def _capacity_fits(self, alt: ExactRequest, entry: DeviceEntry) -> bool:
        """Whether the device has each capacity ``alt`` asks for, and its requestPolicy grants it."""
        device = entry.device
        for name, amount in alt.capacity.items():
            qname = entry.qualify(name)
            policy = device.capacity_policy.get(qname)
            granted = amount if policy is None else policy.round(amount)
            if granted is None or device.capacity.get(qname, ZERO) < granted:
                return False
        return True

    def consumption(self, alt: ExactRequest, entry: DeviceEntry) -> dict[str, Fraction]:
        """What ``alt`` consumes of a shared device: its request rounded up as the capacity's
        requestPolicy rounds it, else the policy's default, else all of it."""
        asked = {entry.qualify(n): amount for n, amount in alt.capacity.items()}
        device = entry.device
        out = {}
        for name, value in device.capacity.items():
            amount = asked.get(name)
            policy = device.capacity_policy.get(name)
            if amount is not None and policy is not None:
                amount = policy.round(amount)  # granted: matching devices are those it grants
            out[name] = device.capacity_default.get(name, value) if amount is None else amount
        return out

    def candidates(self, alt: ExactRequest, node: str) -> list[int]:
        matching = self.matching(alt)
        return [d for d in self.inventory.node_devices.get(node, ()) if d in matching]

    # --- one pod --------------------------------------------------------------------------------

    def allocate(self, owner: str, needs: Sequence[ClaimNeed], node: str) -> tuple[ClaimResult, ...] | None:
        """Allocate every claim of one pod on ``node`` for ``owner`` (taken on success), or None."""
        inv = self.inventory
        results: list[ClaimResult] = []
        made: list[_Search] = []
        new_shared: list[str] = []
        for need in needs:
            done = need.allocated
            if done is None and need.shared is not None and need.shared in inv.shared_claims:
                done = inv.shared_claims[need.shared][1]
            if done is not None:
                if not self._reachable(done, node):
                    self.last_miss = (
                        f"pod claim {need.pod_claim}: its allocated devices are not reachable from the node"
                    )
                    self._undo(owner, made, new_shared)
                    return None
                results.append((need.pod_claim, done))
                continue
            chosen = None
            for option in need.planned:  # the plan's devices, if they still fit as the claim asks
                search = _Search(self, owner, node, need.spec, self._planned(option))
                chosen = search.run()
                if chosen is not None:
                    break
            if chosen is None and need.planned:
                self.replanned += 1
            if chosen is None:
                search = _Search(self, owner, node, need.spec)
                chosen = search.run()
            if chosen is None:
                self.last_miss = f"pod claim {need.pod_claim}: no node has free devices for all its requests"
                self._undo(owner, made, new_shared)
                return None
            made.append(search)
            devices = tuple(
                AllocatedDevice(
                    alt.name, inv.entries[i].driver, inv.entries[i].pool, inv.entries[i].device.name, c or {}
                )
                for alt, i, c in chosen
            )
            if need.shared is not None:
                inv.shared_claims[need.shared] = (owner, devices)
                new_shared.append(need.shared)
            results.append((need.pod_claim, devices))
        return tuple(results)

    def _undo(self, owner: str, made: Iterable[_Search], shared: Iterable[str]) -> None:
        for search in reversed(list(made)):
            for _, index, consumed in reversed(search.chosen):
                self.inventory.give_back(owner, index, consumed)
        for key in shared:
            self.inventory.shared_claims.pop(key, None)

    def give_back(self, owner: str, claims: Sequence[ClaimResult], needs: Sequence[ClaimNeed]) -> None:
        """Undo one successful :meth:`allocate` (a gang that did not fit as a whole)."""
        inv = self.inventory
        fresh = {n.pod_claim for n in needs if n.allocated is None}
        for name, devices in reversed(claims):
            if name not in fresh:
                continue
            need = next(n for n in needs if n.pod_claim == name)
            if need.shared is not None:
                held = inv.shared_claims.get(need.shared)
                if held is None or held[1] is not devices:
                    continue  # allocated by an earlier pod: that pod gives it back
                del inv.shared_claims[need.shared]
            for d in reversed(devices):
                index = inv.by_name[(d.driver, d.pool, d.device)]
                held_takes = inv.owners.get(owner, [])
                consumed = next((c for i, c in reversed(held_takes) if i == index), None)
                inv.give_back(owner, index, consumed)

    def _planned(self, devices: Iterable[AllocatedDevice]) -> frozenset[tuple[str, int]]:
        by_name = self.inventory.by_name
        return frozenset(
            (d.request, by_name[(d.driver, d.pool, d.device)])
            for d in devices
            if (d.driver, d.pool, d.device) in by_name
        )

    def _reachable(self, devices: Iterable[AllocatedDevice], node: str) -> bool:
        inv = self.inventory
        for d in devices:
            index = inv.by_name.get((d.driver, d.pool, d.device))
            if index is None or node not in inv.reach[index]:
                return False
        return True

    def ordered(self, needs: Sequence[ClaimNeed], allowed: set[str], used: set[str]) -> Iterator[str]:
        """The order of :meth:`order` over the nodes ``allowed``, read lazily from the inventory's
        buckets of nodes by free devices; nodes with fewer free devices than the pod's new claims
        need at least are left out (they cannot hold them)."""
        free = self.inventory.free_on
        least = sum(_least(n) for n in needs)
        yield from sorted(n for n in used if n in allowed and n in free)
        buckets = self.inventory.buckets
        for count in sorted(buckets, key=lambda c: (c == 0, c)):
            if count < least:
                continue
            for name in list(buckets.get(count, ())):
                if name in allowed and name not in used:
                    yield name

    def order(self, names: Iterable[str], used: set[str]) -> list[str]:
        """Nodes for a pod with claims, tightest first: a node of this gang, then fewest free devices
        (the fullest node that still holds the pod keeps whole nodes free for bigger claims), nodes
        with none free last."""
        free = self.inventory.free_on
        # A node with no free device comes last: only a claim allocated already may still go there.
        ranked = [
            (0 if n in used else 1, free[n] == 0, free[n], i, n) for i, n in enumerate(names) if n in free
        ]
        ranked.sort()
        return [r[4] for r in ranked]
