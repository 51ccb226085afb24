"""The simulated cluster, as every configuration sees it: nodes in pools, teams with floors.

A *pool* is a group of nodes with one GPU model (one ResourceFlavor under gpuplane). Teams split
each pool's GPUs by their floor weights: nominal quotas under gpuplane, one ResourceQuota per
namespace (all GPU models together, in whole GPUs) under stock Kubernetes. Shares are rounded by
largest remainder, so the parts always add up to the whole.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuplane.sim.scenario import Scenario, Team


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    pool: str
    gpus: int
    model: str = ""
    gpu_memory_mib: int = 0
    mig_layout: tuple[str, ...] | None = None
    cpu_milli: int = 0  # 0: not modelled
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    nodes: tuple[NodeSpec, ...]
    pools: tuple[str, ...]  # in the order flavors are tried
    teams: tuple[Team, ...]
    normal_priority: int = 100
    backfill_priority: int = 0

    @property
    def gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def whole_gpu_pools(self, pools: tuple[str, ...]) -> tuple[str, ...]:
        """Where a MIG request may run once MIG is off: every pool with the same GPU model."""
        models = {n.model for n in self.nodes if n.pool in pools}
        wanted = {n.pool for n in self.nodes if n.model in models} | set(pools)
        return tuple(p for p in self.pools if p in wanted)

    def pool_gpus(self, pool: str) -> int:
        return sum(n.gpus for n in self.nodes if n.pool == pool)

    @property
    def models_cpu(self) -> bool:
        return any(n.cpu_milli for n in self.nodes)

    def team_milli(self) -> dict[tuple[str, str], int]:
        """Nominal milli-GPU of each (team, pool)."""
        out: dict[tuple[str, str], int] = {}
        for pool in self.pools:
            parts = split(self.pool_gpus(pool) * 1000, [t.floor for t in self.teams])
            for team, part in zip(self.teams, parts, strict=True):
                out[(team.name, pool)] = part
        return out

    def team_gpus(self) -> dict[str, int]:
        """Whole GPUs of each team's namespace quota (every GPU model together)."""
        parts = split(self.gpus, [t.floor for t in self.teams])
        return {t.name: p for t, p in zip(self.teams, parts, strict=True)}


def split(amount: int, weights: Sequence[float]) -> list[int]:
    """``amount`` split by ``weights`` into integers that add up to ``amount`` (largest remainder)."""
    total = sum(weights)
    if total <= 0:
        return [0] * len(weights)
    exact = [amount * w / total for w in weights]
    parts = [int(x) for x in exact]
    left = amount - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[:left]:
        parts[i] += 1
    return parts


def cluster_from_scenario(scenario: Scenario) -> ClusterSpec:
    nodes = [
        NodeSpec(
            name=name,
            pool=pool.name,
            gpus=pool.gpus_per_node,
            model=pool.model,
            gpu_memory_mib=pool.gpu_memory_mib,
            mig_layout=pool.mig_layout,
            cpu_milli=pool.cpu_milli,
            memory_mib=pool.memory_mib,
        )
        for pool in scenario.pools
        for name in pool.node_names()
    ]
    return ClusterSpec(
        nodes=tuple(nodes),
        pools=tuple(p.name for p in scenario.pools),
        teams=scenario.teams,
        normal_priority=scenario.policies.normal_priority,
        backfill_priority=scenario.policies.backfill_priority,
    )
