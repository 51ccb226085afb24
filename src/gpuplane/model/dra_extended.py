"""The extended-resource path of Dynamic Resource Allocation (KEP-5004), on state files.

A DeviceClass with ``extendedResourceName: R`` stands for ``R``: a pod that requests ``R`` where
no node advertises it (no device plugin publishes it) gets its devices from that class, as
kube-scheduler allocates them. Here each such request becomes an implicit claim of the pod, for
``count`` devices of the class (its pod claim is named ``R``, its request ``R`` too, as the plan
reports them), and leaves the pod's requests, so that placement allocates the devices and no node
needs to advertise ``R``. The pod is still charged ``R`` against quota, or the class's mapped
resource under Kueue's ``deviceClassMappings``.

Where some node advertises ``R``, requests for it stay as they are (device plugins serve them).
"""

from __future__ import annotations

from dataclasses import replace

from gpuplane.model.dra import ClaimSpec, DeviceRequest, ExactRequest, PodClaim, ResourceClaimTemplate
from gpuplane.model.objects import ClusterState, PodTemplate, frozen_map

# Names of the implicit templates: a ':' never appears in a real object's name.
EXTENDED_PREFIX = "extended-resource:"


class _Converter:
    """Turns requests for DRA-backed extended resources into implicit claims. Owns the resources
    backed (resource -> class), the quota name of each class, and the implicit templates made."""

    def __init__(self, state: ClusterState, backed: dict[str, str]) -> None:
        self.backed = backed
        self.mappings = state.configuration.device_class_mappings
        self.templates = dict(state.dra.templates)

    def template(self, template: PodTemplate, namespace: str) -> PodTemplate:
        asked = {r: n for r, n in template.requests.items() if r in self.backed and n > 0}
        if not asked:
            return template
        claims = list(template.claims)
        charges = dict(template.claim_quota)
        for resource, count in sorted(asked.items()):
            name = f"{EXTENDED_PREFIX}{resource}:{count}"
            key = f"{namespace}/{name}"
            cls = self.backed[resource]
            if key not in self.templates:
                request = DeviceRequest(resource, (ExactRequest(resource, cls, count=count),))
                self.templates[key] = ResourceClaimTemplate(namespace, name, ClaimSpec((request,)))
            claims.append(PodClaim(resource, template_name=name))
            charged = self.mappings.get(cls, resource)
            charges[charged] = charges.get(charged, 0) + count
        requests = {r: n for r, n in template.requests.items() if r not in asked}
        return replace(
            template, requests=frozen_map(requests), claims=tuple(claims), claim_quota=frozen_map(charges)
        )


def extended_resource_claims(state: ClusterState) -> ClusterState:
    """``state`` with requests for DRA-backed extended resources that no node advertises turned
    into implicit claims (workloads' pod sets and pods alike)."""
    advertised = {r for node in state.nodes for r, n in node.allocatable.items() if n > 0}
    backed = {
        c.extended_resource_name: c.name
        for c in state.dra.classes.values()
        if c.extended_resource_name and c.extended_resource_name not in advertised
    }
    if not backed:
        return state
    convert = _Converter(state, backed)
    workloads = tuple(
        replace(
            wl,
            pod_sets=tuple(
                replace(ps, template=convert.template(ps.template, wl.namespace)) for ps in wl.pod_sets
            ),
        )
        for wl in state.workloads
    )
    pods = tuple(replace(p, template=convert.template(p.template, p.namespace)) for p in state.pods)
    dra = replace(state.dra, templates=frozen_map(convert.templates))
    return replace(state, workloads=workloads, pods=pods, dra=dra)
