"""Karpenter-aware capacity: what NodePools can still bring, and which flavors they serve.

- A flavor is *provided* by a NodePool when every one of the flavor's ``nodeLabels`` can be on a
  node the pool launches: a template label with that value, or a requirement on the key that
  admits the value (``In`` listing it, ``NotIn`` not listing it, ``Exists``).
- A pool's *remaining* capacity is its ``spec.limits`` less the allocatable of the nodes it has
  launched (label ``karpenter.sh/nodepool``); a resource without a limit is unbounded.
- Existing nodes come first: the core places only on nodes that exist; what a pool can still
  bring is reported (pending messages, ``doctor``), never counted as a place.
- A node tainted ``karpenter.sh/disrupted`` is on its way out: no gang starts there, whatever its
  pods tolerate.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gpuplane.model.karpenter import DISRUPTED_TAINT, NODEPOOL_LABEL, NodePool
from gpuplane.model.objects import Node, ResourceFlavor


def can_label(pool: NodePool, key: str, value: str) -> bool:
    """Whether a node of ``pool`` can carry the label ``key=value``."""
    if key in pool.labels:
        return pool.labels[key] == value
    found = False
    for req in pool.requirements:
        if req.key != key:
            continue
        found = True
        if req.operator == "In" and value not in req.values:
            return False
        if req.operator == "NotIn" and value in req.values:
            return False
        if req.operator == "DoesNotExist":
            return False
    return found


def provides(pool: NodePool, flavor: ResourceFlavor) -> bool:
    return all(can_label(pool, k, v) for k, v in flavor.node_labels.items())


def remaining(pool: NodePool, nodes: Iterable[Node]) -> dict[str, int]:
    """What ``pool`` may still launch, per limited resource."""
    used: dict[str, int] = {}
    for node in nodes:
        if node.labels.get(NODEPOOL_LABEL) != pool.name:
            continue
        for res, q in node.allocatable.items():
            used[res] = used.get(res, 0) + q
    return {res: max(0, limit - used.get(res, 0)) for res, limit in pool.limits.items()}


def capacity_to_come(
    pools: Mapping[str, NodePool], flavor: ResourceFlavor | None, nodes: Iterable[Node], resource: str
) -> list[tuple[str, int | None]]:
    """(pool, amount of ``resource`` it may still bring; None: no limit) for each pool that can
    provide ``flavor``, heaviest pool first."""
    node_list = list(nodes)
    out: list[tuple[str, int | None]] = []
    for pool in sorted(pools.values(), key=lambda p: (-p.weight, p.name)):
        if flavor is not None and not provides(pool, flavor):
            continue
        out.append((pool.name, remaining(pool, node_list).get(resource) if resource in pool.limits else None))
    return out


def disrupted(node: Node) -> bool:
    return any(t.key == DISRUPTED_TAINT for t in node.taints)
