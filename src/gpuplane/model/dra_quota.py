"""What ResourceClaims cost against ClusterQueue quota, as Kueue charges them.

With ``resources.deviceClassMappings`` in Kueue's Configuration, each pod is charged, under the
mapped resource name, the devices its claims from ResourceClaimTemplates ask for (a shared
ResourceClaim is not charged per pod; Kueue refuses those outright). A request for a class
without a mapping makes the workload inadmissible with Kueue's reason and message
(``Misconfigured``), as does ``allocationMode: All``, whose count is not known before
allocation. A ``firstAvailable`` request is charged the most any of its entries asks for.

A mapping with ``sources`` charges its classes' requests by counters or capacities instead of the
device count (:mod:`gpuplane.model.dra_sources`); a request that cannot be charged so is
inadmissible with Kueue's message.

The extended-resource path (KEP-5004): a pod that requests an extended resource which a
DeviceClass names in ``extendedResourceName`` is charged it under the class's mapped name where
the class is mapped, else under the extended resource itself (as before).

Without mappings nothing changes: claims are placed, and charged nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gpuplane.model.dra import ALL, DeviceRequest
from gpuplane.model.dra_extended import EXTENDED_PREFIX
from gpuplane.model.dra_sources import SourceChargeError, SourcePricing
from gpuplane.model.objects import ClusterState, InvalidWorkload, PodSet, Workload, frozen_map


class UnmappedClaimError(Exception):
    """A workload Kueue finds inadmissible for its claims (the message is Kueue's)."""


class _Pricing:
    """What claims cost: owns the class -> quota resource mappings, the extended resources the
    classes stand for, and the DRA objects templates are read from."""

    def __init__(self, state: ClusterState) -> None:
        self.mappings: Mapping[str, str] = state.configuration.device_class_mappings
        self.extended = {
            c.extended_resource_name: c.name for c in state.dra.classes.values() if c.extended_resource_name
        }
        self.objects = state.dra
        # Counter- and capacity-based quota (a mapping's sources), priced when a class has them.
        self.sources = state.configuration.device_class_sources
        self.by_source = SourcePricing(state.dra) if self.sources else None

    def workload(self, wl: Workload) -> Workload:
        pod_sets = tuple(self.pod_set(ps, i, wl.namespace) for i, ps in enumerate(wl.pod_sets))
        return wl if pod_sets == wl.pod_sets else replace(wl, pod_sets=pod_sets)

    def pod_set(self, ps: PodSet, i: int, namespace: str) -> PodSet:
        template = ps.template
        charges: dict[str, int] = dict(template.claim_quota)
        replaced: list[str] = list(template.claim_replaced)
        for resource, amount in template.requests.items():
            cls = self.extended.get(resource)
            if cls is not None and cls in self.mappings:
                replaced.append(resource)
                charges[self.mappings[cls]] = charges.get(self.mappings[cls], 0) + amount
        for j, claim in enumerate(template.claims):
            if claim.template_name is None or claim.template_name.startswith(EXTENDED_PREFIX):
                continue  # a shared claim; an extended resource's claim (charged as the resource)
            found = self.objects.templates.get(f"{namespace}/{claim.template_name}")
            if found is None:
                continue  # placement names the missing template
            here = f"spec.podSets[{i}].template.spec.resourceClaims[{j}]"
            for k, request in enumerate(found.spec.requests):
                for name, count in self._request(
                    request, f"{here}.devices.requests[{k}]", claim.template_name, ps.name, here
                ).items():
                    charges[name] = charges.get(name, 0) + count
        if charges == template.claim_quota and tuple(replaced) == template.claim_replaced:
            return ps
        charged = replace(template, claim_quota=frozen_map(charges), claim_replaced=tuple(replaced))
        return replace(ps, template=charged)

    def _request(
        self, request: DeviceRequest, path: str, template: str, pod_set: str, here: str
    ) -> dict[str, int]:
        """Per quota resource, the most any entry of ``request`` asks for (by count, or by its
        mapping's sources)."""
        most: dict[str, int] = {}
        sourced = [alt.device_class for alt in request.alternatives if alt.device_class in self.sources]
        if sourced and len(request.alternatives) > 1:
            raise UnmappedClaimError(
                f'{path}.firstAvailable: Invalid value: "{sourced[0]}": ResourceClaimTemplate {template}: '
                "a firstAvailable request cannot be charged by counter or capacity sources"
            )
        for alt in request.alternatives:
            if alt.mode == ALL:
                raise UnmappedClaimError(
                    f'{path}.exactly.allocationMode: Invalid value: "All": ResourceClaimTemplate {template}: '
                    "AllocationMode 'All' is not supported"
                )
            name = self.mappings.get(alt.device_class)
            if name is None:
                raise UnmappedClaimError(
                    f'{here}.resourceClaimTemplateName: Not found: "DeviceClass {alt.device_class} '
                    f'is not mapped in DRA configuration for podset {pod_set}"'
                )
            amount = alt.count
            sources = self.sources.get(alt.device_class)
            if sources and self.by_source is not None:
                try:
                    amount = self.by_source.charge(alt, sources, name)
                except SourceChargeError as err:
                    raise UnmappedClaimError(f"{path}: Internal error: {err}") from None
            most[name] = max(most.get(name, 0), amount)
        return most


def charge_claims(state: ClusterState) -> ClusterState:
    """``state`` with each workload's claims charged (``PodTemplate.claim_quota``), and the
    workloads Kueue would find inadmissible moved to ``invalid_workloads``."""
    if not state.configuration.device_class_mappings:
        return state
    pricing = _Pricing(state)
    workloads: list[Workload] = []
    invalid = list(state.invalid_workloads)
    for wl in state.workloads:
        try:
            workloads.append(pricing.workload(wl))
        except UnmappedClaimError as problem:
            invalid.append(InvalidWorkload(wl.namespace, wl.name, wl.queue_name, str(problem)))
    return replace(state, workloads=tuple(workloads), invalid_workloads=tuple(invalid))
