"""The placement engine's scores of nodes for a gang's pods, with the profile learned from the workload.

The profile's policies learn the workload from the pods the cluster has seen (held, and the pod
sets of every gang it was asked to place, each owner once): the typical pods are rebuilt when a
new pod shape appears or the number of pods seen has doubled. Nodes that look alike to the engine
(:meth:`~gpuplane.core.placement.node_holdings.GpuRows.look`) score alike, so a score is kept per
request and look until the profile is rebuilt.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

from gpuplane.core.placement import engine
from gpuplane.core.placement.devices import MILLI, NodeState, PodNeeds
from gpuplane.core.placement.eligibility import MAX_REMEMBERED
from gpuplane.core.placement.fragmentation import typical_pods
from gpuplane.core.placement.gangs import GangPodSet
from gpuplane.core.placement.gpu_arrays import GpuRequest
from gpuplane.core.placement.node_holdings import GpuRows
from gpuplane.core.placement.profiles import get_profile
from gpuplane.core.placement.scoring import PolicyContext

_MIB = 1024 * 1024

# Bound of the distinct node looks (and the scores kept by look). A node's look changes only when a
# pod lands on it or leaves it, so a long session makes new looks all the time, most never seen
# again; a look costs its key (a node's used resources and each GPU's free milli-GPU, a few hundred
# bytes) and a float per request shape. 100,000 looks are ten of every node of a 10,000-node
# cluster, tens of megabytes at most; then looks and scores start afresh, which costs one scoring
# of each look seen again and changes no score.
MAX_LOOKS = 100_000


class NodeScores:
    """The engine's scores of nodes, and the workload they are scored for.

    Owns the profile (by name) and what it learned of the workload (the pod shapes seen and how
    many, the owners counted), the engine's request of each needs object seen lately (bounded by
    :data:`~gpuplane.core.placement.eligibility.MAX_REMEMBERED`), and the scores by request and
    node look (bounded by :data:`MAX_LOOKS`, dropped when the profile is rebuilt). Reads the
    engine's GPU array from :class:`GpuRows`."""

    def __init__(self, rows: GpuRows, profile: str | None) -> None:
        self._rows = rows
        self.profile_name = profile
        self._shapes: Counter[GpuRequest] = Counter()
        self._shape_total = 0
        self._new_shape = False
        self._seen_owners: set[str] = set()
        self.profile_reads = 0  # how often the profile was asked for (see PlacementState.relearn)
        self._profile: engine.Profile | None = None
        self._profile_total = 0
        # Scores by request and node look (None: does not fit).
        self._scores: dict[GpuRequest, dict[int, float | None]] = {}
        # The engine's request of each needs object seen lately (see request).
        self._requests: dict[int, tuple[PodNeeds, GpuRequest | None]] = {}

    @staticmethod
    def check(profile: str | None) -> None:
        """Raise ``KeyError`` for an unknown profile name."""
        if profile is not None:
            get_profile(profile, PolicyContext(typical=typical_pods([GpuRequest(gpus=1, gpu_milli=MILLI)])))

    def request(self, needs: PodNeeds) -> GpuRequest | None:
        """The engine's request for a pod that uses exclusive GPUs only, else ``None``;
        remembered per needs object (immutable, and shared by every pod of a template)."""
        known = self._requests.get(id(needs))
        if known is not None and known[0] is needs:
            return known[1]
        request = self._request_of(needs)
        if len(self._requests) >= MAX_REMEMBERED:
            self._requests.clear()
        self._requests[id(needs)] = (needs, request)
        return request

    @staticmethod
    def _request_of(needs: PodNeeds) -> GpuRequest | None:
        if (
            needs.mig
            or needs.shared
            or not (needs.whole or needs.fraction_milli or needs.fraction_memory_mib)
        ):
            return None
        if needs.whole and (needs.fraction_milli or needs.fraction_memory_mib):
            return None
        cpu = needs.resources.get("cpu", 0)
        memory = -(-needs.resources.get("memory", 0) // _MIB)
        if needs.whole:
            return GpuRequest(cpu=cpu, memory=memory, gpus=needs.whole, gpu_milli=MILLI)
        return GpuRequest(cpu=cpu, memory=memory, gpus=1, gpu_milli=max(1, min(needs.fraction_milli, MILLI)))

    def record(self, owner: str, pod_sets: Sequence[GangPodSet]) -> None:
        """Learn the workload: each owner's pods once (a probe counts as its workload)."""
        owner = owner.removeprefix("probe:")
        if owner in self._seen_owners:
            return
        self._seen_owners.add(owner)
        for ps in pod_sets:
            request = self.request(ps.needs)
            if request is not None and ps.count:
                self.learn(request, ps.count)

    def learn(self, request: GpuRequest, count: int) -> None:
        if request not in self._shapes:
            self._new_shape = True
        self._shapes[request] += count
        self._shape_total += count

    def profile(self) -> engine.Profile | None:
        """The profile for the workload seen so far (rebuilt on a new shape or twice the pods)."""
        self.profile_reads += 1
        if not self._shapes or self.profile_name is None:
            return None
        if self._profile is None or self._new_shape or self._shape_total >= 2 * self._profile_total:
            seen = itertools.chain.from_iterable(
                itertools.repeat(r, n)
                for r, n in sorted(self._shapes.items(), key=lambda kv: (kv[0].shape, kv[0].memory))
            )
            self._profile = get_profile(self.profile_name, PolicyContext(typical=typical_pods(seen)))
            self._profile_total = self._shape_total
            self._new_shape = False
            self._scores.clear()
        return self._profile

    def looks(self, names: Sequence[str], nodes: dict[str, NodeState]) -> list[int]:
        """The looks of ``names`` (nodes with a row), starting looks and scores afresh at the bound."""
        if self._rows.look_count >= MAX_LOOKS:
            self._rows.forget_looks()
            self._scores.clear()
        return self._rows.looks_of(names, nodes)

    def ranked(
        self,
        profile: engine.Profile,
        request: GpuRequest,
        sample: list[NodeState],
        looks: list[int],
        used: set[str],
    ) -> list[NodeState]:
        """``sample`` that the engine says fit, best first: this gang's nodes, score, sample order.

        Only one node per look not scored before is scored (a look's score is kept until the
        profile is rebuilt): the score plugins read nothing of a node but its row.
        """
        array = self._rows.array
        assert array is not None
        cache = self._scores.get(request)
        if cache is None:
            cache = self._scores[request] = {}
        todo: dict[int, NodeState] = {}
        for state, look in zip(sample, looks, strict=True):
            if look not in cache and look not in todo:
                todo[look] = state
        if todo:
            nodes = self._rows.rows_of(list(todo.values()))
            fit = array.feasible_among(request, nodes)
            fitting = nodes[fit]
            scores = engine.score(profile, array, request, fitting) if fitting.size else fitting
            scored = iter(scores.tolist())
            for look, ok in zip(todo, fit.tolist(), strict=True):
                cache[look] = float(next(scored)) if ok else None
        # (not of this gang, -score, sample order): unique, so the states are never compared.
        ranked = [
            (state.name not in used, -value, i, state)
            for i, (state, look) in enumerate(zip(sample, looks, strict=True))
            if (value := cache[look]) is not None
        ]
        ranked.sort()
        return [item[3] for item in ranked]
