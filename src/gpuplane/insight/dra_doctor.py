"""`gpuplane doctor`'s checks of what DRA drivers publish (``resource.k8s.io/v1``).

* incomplete pools: a pool's newest generation has fewer ResourceSlices than its
  ``resourceSliceCount`` (the driver is still publishing, or lost some); a request with
  ``allocationMode: All`` is never given such a pool's devices;
* stale generations: slices of a pool's older generation still present (only the newest counts,
  the driver should have deleted them);
* DeviceClasses whose selectors match no published device, or whose CEL fails.

The devices and the CEL evaluation are the placement's own (a :class:`PlacementState` built on the
state), so the doctor and the scheduler read the selectors alike.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from gpuplane.core.analysis import PlacementState
from gpuplane.core.session import DeviceConfig
from gpuplane.insight.doctor import Finding
from gpuplane.model.dra import DraObjects, ExactRequest
from gpuplane.model.objects import ClusterState


def dra_findings(state: ClusterState, config: DeviceConfig | None = None) -> list[Finding]:
    """Every finding about slices and classes, errors first, then by check and object."""
    dra = state.dra
    if not dra:
        return []
    findings = [*_pools(dra), *_classes(state, config or DeviceConfig())]
    return sorted(findings, key=lambda f: (f.severity != "error", f.check, f.objects))


def _pools(dra: DraObjects) -> list[Finding]:
    by_pool: dict[tuple[str, str], list[tuple[int, int, str]]] = defaultdict(list)
    for s in dra.slices:
        by_pool[(s.driver, s.pool)].append((s.generation, s.slice_count, s.name))
    findings: list[Finding] = []
    for (driver, pool), slices in sorted(by_pool.items()):
        newest = max(g for g, _, _ in slices)
        current = [(count, name) for g, count, name in slices if g == newest]
        want = max(count for count, _ in current)
        if len(current) < want:
            findings.append(
                Finding(
                    "warning",
                    "dra-incomplete-pool",
                    tuple(f"ResourceSlice/{name}" for _, name in sorted(current, key=lambda c: c[1])),
                    f"pool {pool} of driver {driver} has {len(current)} of its {want} ResourceSlices "
                    f"(generation {newest}): requests with allocationMode All never get its devices",
                    f"wait for driver {driver} to publish the rest, or check its kubelet plugin's logs",
                )
            )
        stale = sorted((g, name) for g, _, name in slices if g < newest)
        if stale:
            findings.append(
                Finding(
                    "warning",
                    "dra-stale-generation",
                    tuple(f"ResourceSlice/{name}" for _, name in stale),
                    f"pool {pool} of driver {driver} still has slices of generation "
                    f"{', '.join(str(g) for g in sorted({g for g, _ in stale}))} beside its newest, "
                    f"{newest}; only the newest counts",
                    f"driver {driver} should delete its older slices: check that its kubelet plugin "
                    "runs, or delete them (kubectl delete resourceslice ...)",
                )
            )
    return findings


def _classes(state: ClusterState, config: DeviceConfig) -> list[Finding]:
    if not state.dra.classes:
        return []
    placement = PlacementState(state.nodes, config, dra=state.dra)
    allocator = placement.dra
    if allocator is None:
        return []
    published = Counter(e.driver for e in allocator.inventory.entries)
    findings: list[Finding] = []
    for name in sorted(state.dra.classes):
        try:
            matched = allocator.matching(ExactRequest(name="doctor", device_class=name))
        except Exception as err:  # the allocator's DraError: its CEL fails
            findings.append(
                Finding(
                    "error",
                    "dra-class-selector",
                    (f"DeviceClass/{name}",),
                    str(err),
                    "fix the CEL expression; every claim of this class stays pending until then",
                )
            )
            continue
        if not matched:
            drivers = ", ".join(f"{d} ({n})" for d, n in sorted(published.items())) or "none"
            findings.append(
                Finding(
                    "warning",
                    "dra-class-matches-nothing",
                    (f"DeviceClass/{name}",),
                    f"its selectors match none of the {sum(published.values())} published devices "
                    f"(devices by driver: {drivers})",
                    "fix the class's selectors, or install the driver whose devices it is for",
                )
            )
    return findings
