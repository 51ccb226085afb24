"""Counter- and capacity-based quota for claims: the ``sources`` of a Kueue ``deviceClassMappings``
entry, charged as Kueue 0.19 charges them.

A mapping with ``counter`` sources charges, for each request of a class it maps, the largest amount
of that counter any matching device consumes (``consumesCounters``), times the request's ``count``
(partitionable devices: a 1g MIG partition costs its 10 GiB of memory, not "1 device"). A mapping
with ``capacity`` sources charges what the request asks of that capacity (``capacity.requests``;
else the device's ``requestPolicy.default``; else its whole capacity), rounded up as the device's
``requestPolicy`` rounds it, the largest over the matching devices, times ``count`` (shared devices:
two jobs that each ask 20 GiB of a GPU's memory cost 20 GiB each).

The matching devices are those of ``driver`` in complete pools (their newest generation, every slice
of it read) that the source's ``deviceSelector``, the request's DeviceClass and the request's own
selectors all select. A request that Kueue cannot charge this way is inadmissible with Kueue's
message: fewer matching devices than its count, no matching device that consumes the counter or has
the capacity, a capacity no device's policy can grant, a selector that fails, or a ``firstAvailable``
request on such a mapping.
"""

from __future__ import annotations

from collections.abc import Iterable
from fractions import Fraction

from gpuplane.model.dra import CAPACITY, Device, DraObjects, ExactRequest, QuotaSource, qualified
from gpuplane.model.dra_cel import CelSelectors, SelectorError
from gpuplane.model.quantity import MAX_BASE_UNITS, to_base_units


class SourceChargeError(Exception):
    """A request Kueue cannot charge by its mapping's sources (the message is Kueue's, less the path)."""


class SourcePricing:
    """What requests cost by counters or capacities. Owns the compiled selectors and, per driver,
    the devices of its complete pools (read once)."""

    def __init__(self, objects: DraObjects) -> None:
        self.objects = objects
        self.cel = CelSelectors()
        self._devices: dict[str, list[Device]] | None = None
        self._matched: dict[tuple[QuotaSource, str, tuple[str, ...]], list[Device]] = {}

    def charge(self, alt: ExactRequest, sources: Iterable[QuotaSource], resource: str) -> int:
        """What one ``alt`` request costs under ``resource`` (base units, saturating)."""
        total = 0
        for source in sources:
            matched = self._matching(source, alt)
            if len(matched) < alt.count:
                raise SourceChargeError(
                    f"insufficient matching devices for {source.kind} driver: {len(matched)} device(s) "
                    f"match but {alt.count} requested"
                )
            most = (
                _capacity_charge(source, alt, matched)
                if source.kind == CAPACITY
                else _counter(source, matched)
            )
            total += min(to_base_units(resource, most) * alt.count, MAX_BASE_UNITS)
        return min(total, MAX_BASE_UNITS)

    def _matching(self, source: QuotaSource, alt: ExactRequest) -> list[Device]:
        key = (source, alt.device_class, alt.selectors)
        found = self._matched.get(key)
        if found is None:
            cls = self.objects.classes.get(alt.device_class)
            selectors = [*([source.selector] if source.selector else []), *(cls.selectors if cls else ())]
            selectors += alt.selectors
            try:
                found = [
                    d
                    for d in self._pool_devices().get(source.driver, ())
                    if all(self.cel.matches(expr, source.driver, d) for expr in selectors)
                ]
            except SelectorError as err:
                raise SourceChargeError(f"CEL evaluation error: {err}") from None
            self._matched[key] = found
        return found

    def _pool_devices(self) -> dict[str, list[Device]]:
        """The devices of each driver's complete pools (a pool's newest generation, all its slices)."""
        if self._devices is None:
            slices: dict[tuple[str, str], list[int]] = {}
            current = self.objects.current_slices()
            for i, s in enumerate(current):
                slices.setdefault((s.driver, s.pool), []).append(i)
            self._devices = {}
            for (driver, _), members in slices.items():
                if len(members) != current[members[0]].slice_count:
                    continue  # incomplete: Kueue skips it
                for i in members:
                    self._devices.setdefault(driver, []).extend(current[i].devices)
        return self._devices


def _counter(source: QuotaSource, matched: list[Device]) -> Fraction:
    values = [c[source.name] for d in matched for c in d.consumes.values() if source.name in c]
    if not values:
        raise SourceChargeError(f'matched devices have no consumesCounters entry for counter "{source.name}"')
    return max(values)


def _capacity_charge(source: QuotaSource, alt: ExactRequest, matched: list[Device]) -> Fraction:
    asked = next((v for k, v in alt.capacity.items() if qualified(k, source.driver) == source.name), None)
    charges = []
    has_dimension = False
    for device in matched:
        if source.name not in device.capacity:
            continue
        has_dimension = True
        base = (
            asked
            if asked is not None
            else device.capacity_default.get(source.name, device.capacity[source.name])
        )
        policy = device.capacity_policy.get(source.name)
        rounded = base if policy is None else policy.round(base)
        if rounded is not None:
            charges.append(rounded)
    if not has_dimension:
        raise SourceChargeError(f'matched devices have no capacity dimension "{source.name}"')
    if not charges:
        raise SourceChargeError(
            "capacity request cannot be satisfied by any matched device's RequestPolicy for dimension "
            f'"{source.name}"'
        )
    return max(charges)
