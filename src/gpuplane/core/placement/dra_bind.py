"""Allocating a pod's ResourceClaims on its node at bind time, for the controller.

A plan gives every pod of an admitted gang a node and the devices each of its claims gets there (the
placement record keeps them); they are allocated when the pod is bound, because the claims made from
templates exist only once the pod does (kube-controller-manager creates them). The planned devices
are given when they still fit the claim as it is written (free, matching, within its constraints);
else the claim's devices on that node are chosen again. :class:`ClaimAllocation` is built from the
published devices and every claim allocated in the cluster (those hold their devices, whoever they
are reserved for), and allocates each pod's claims on its node with the same allocator the placement
runs (:class:`~gpuplane.core.placement.dra_alloc.DraAllocator`), beside the pods allocated before
it. A claim already allocated (by this controller before a restart) keeps its devices when they are
reachable from the node. The driver writes what it answers; it never picks devices itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpuplane.core.placement.dra_alloc import ClaimNeed, DraAllocator, DraError
from gpuplane.core.placement.dra_inventory import DraInventory
from gpuplane.model.dra import AllocatedDevice, DraObjects, ResourceClaim
from gpuplane.model.objects import Node

# (pod claim name, the claim's devices) for each claim of one pod.
ClaimDevices = tuple[tuple[str, tuple[AllocatedDevice, ...]], ...]


class ClaimAllocation:
    """The devices published and held at one moment, for bind-time allocation. Owns the allocator
    over them (the inventory with every allocated claim held, and what :meth:`allocate` took since)
    and the last reason a pod's claims did not fit."""

    def __init__(self, dra: DraObjects, nodes: Iterable[Node]) -> None:
        self.allocator = DraAllocator(dra, DraInventory(dra, nodes))
        self.why_not = ""
        self.unpublished: list[str] = []  # allocated devices no driver publishes any more
        for claim in dra.claims.values():
            if claim.allocation is not None:
                gone = self.allocator.inventory.hold_allocation(f"claim:{claim.key}", claim.allocation)
                self.unpublished += [f"ResourceClaim {claim.key}: {name}" for name in gone]

    def allocate(
        self,
        pod: str,
        claims: Sequence[tuple[str, ResourceClaim]],
        node: str,
        planned: Mapping[str, Sequence[tuple[AllocatedDevice, ...]]] | None = None,
    ) -> ClaimDevices | None:
        """Allocate the claims of ``pod`` (each as ``(pod claim name, ResourceClaim)``) on
        ``node``, taken until :meth:`give_back`: for each pod claim, the first option of its
        ``planned`` devices that still fits, else others; ``None`` with :attr:`why_not` set when
        they do not fit there or cannot be allocated as written."""
        plans = planned or {}
        needs = [
            ClaimNeed(name, claim.spec, claim.key, claim.allocation, tuple(plans.get(name, ())))
            for name, claim in claims
        ]
        try:
            got = self.allocator.allocate(f"pod:{pod}", needs, node)
        except DraError as err:
            self.why_not = str(err)
            return None
        if got is None:
            self.why_not = self.allocator.last_miss or f"the claims do not fit on node {node}"
            return None
        return got

    @property
    def replanned(self) -> int:
        """Claims whose planned devices no longer fit, so that others were chosen (so far)."""
        return self.allocator.replanned

    def give_back(self, pod: str) -> None:
        """Undo every allocation made for ``pod`` (its gang did not get all its claims)."""
        self.allocator.inventory.release(f"pod:{pod}")
