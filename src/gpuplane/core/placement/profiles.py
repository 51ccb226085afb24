"""Named placement profiles: which score and reserve plugins run, chosen by name.

* one profile per policy of :mod:`gpuplane.core.placement.scoring` (``random``, ``dotprod``,
  ``gpuclustering``, ``gpupacking``, ``bestfit``, ``fgd``, ``gpuplane``), each that policy alone
  with weight 1 (so it scores exactly as the policy does);
* ``least-allocated`` and ``most-allocated``: the Kubernetes scheduler's ``NodeResourcesFit``
  strategies, with the lowest-index GPUs;
* :data:`DEFAULT_PROFILE`, ``gpuplane``: the policy that beats FGD on the published lists. Gang
  placement in admission uses it unless the configuration names another.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuplane.core.placement.engine import LeastAllocated, LowestFreeGpus, MostAllocated, Profile
from gpuplane.core.placement.scoring import POLICIES, PolicyContext, ScorePolicy, policy_factory

ProfileFactory = Callable[[PolicyContext], Profile]


def _single(policy_name: str) -> ProfileFactory:
    def build(context: PolicyContext) -> Profile:
        policy: ScorePolicy = policy_factory(policy_name)(context)
        return Profile(policy_name, scores=((policy, 1),), reserve=policy)

    return build


def _kube(plugin: type[LeastAllocated | MostAllocated]) -> ProfileFactory:
    def build(context: PolicyContext) -> Profile:
        del context
        return Profile(plugin.name, scores=((plugin(), 1),), reserve=LowestFreeGpus())

    return build


PROFILES: dict[str, ProfileFactory] = {
    **{name: _single(name) for name in POLICIES},
    LeastAllocated.name: _kube(LeastAllocated),
    MostAllocated.name: _kube(MostAllocated),
}
DEFAULT_PROFILE = "gpuplane"


def get_profile(name: str, context: PolicyContext | None = None) -> Profile:
    """A fresh profile by registry name (case-insensitive). Raises ``KeyError`` naming the valid ones."""
    factory = PROFILES.get(name.lower())
    if factory is None:
        raise KeyError(f"unknown placement profile {name!r}; valid: {', '.join(PROFILES)}")
    return factory(context if context is not None else PolicyContext())
