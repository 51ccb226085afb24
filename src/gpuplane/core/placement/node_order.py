"""The nodes to try for one pod of a gang, best first.

Candidates come tightest first (fewest free GPUs left); the first :data:`NODES_TO_SCORE` that fit
are scored by the engine's profile, as the Kubernetes scheduler scores a sample of a large
cluster, and tried best score first, a node that already holds part of the gang before any other;
the rest follow tightest first. MIG instances and time-sliced slots, which the engine's GPU array
does not model, keep the tightest-first order.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gpuplane.core.placement.devices import NodeState, PodNeeds
from gpuplane.core.placement.eligibility import EligibleNodes
from gpuplane.core.placement.gpu_arrays import GpuRequest
from gpuplane.core.placement.node_holdings import NodeHoldings
from gpuplane.core.placement.node_scores import NodeScores

# Feasible candidates scored per pod (the rest are tried tightest first if none of these fits).
NODES_TO_SCORE = 16


class NodeOrder:
    """The order in which a pod's candidate nodes are tried. Owns no state of its own: it reads the
    free-device indexes of :class:`NodeHoldings`, the sorted eligible names of
    :class:`EligibleNodes` and the scores of :class:`NodeScores`."""

    def __init__(self, holdings: NodeHoldings, eligibility: EligibleNodes, scores: NodeScores) -> None:
        self._holdings = holdings
        self._eligibility = eligibility
        self._scores = scores
        self._repartition = holdings.config.mig_repartition

    def candidates(
        self,
        needs: PodNeeds,
        request: GpuRequest | None,
        eligible: list[NodeState],
        allowed: set[str],
        used: set[str],
    ) -> Iterator[NodeState]:
        """Nodes to try for one pod, best first: the profile's scores over a tightest-first sample.

        ``request`` is the engine's form of ``needs`` (``None``: the GPU array cannot model it).
        """
        base = iter(self._tightest_first(needs, eligible, allowed, used))
        scores = self._scores
        profile = scores.profile() if request is not None else None
        holdings = self._holdings
        nodes = holdings.nodes
        if request is None or profile is None or holdings.rows.array is None:
            yield from map(nodes.__getitem__, self._roomy(needs, base))
            return
        rows = holdings.rows.row
        picked: list[str] = []
        for name in base:
            if name in rows:
                picked.append(name)
                if len(picked) == NODES_TO_SCORE:
                    break
        roomy = self._roomy(needs, picked)
        # With no room on any node of the sample, neither order below yields one: the array finds
        # a node feasible only where its exclusive GPUs hold the request, which ``_roomy`` keeps
        # (a request the array models has whole GPUs or a fraction of one, nothing else). Then
        # the looks and scores, kept to be read again only, are not needed.
        if roomy:
            looks = scores.looks(picked, nodes)
            if len(set(looks)) > 1:
                yield from scores.ranked(profile, request, [nodes[n] for n in picked], looks, used)
            else:
                # They all look alike: the same score, so the inventory's order.
                yield from map(nodes.__getitem__, roomy)
        yield from map(nodes.__getitem__, self._roomy(needs, base))

    def _tightest_first(
        self, needs: PodNeeds, eligible: list[NodeState], allowed: set[str], used: set[str]
    ) -> Iterable[str]:
        """Names of the nodes in the inventory's order: a node of this gang first, then tightest fit."""
        if needs.whole and not (needs.fraction_milli or needs.mig or needs.shared) and len(eligible) > 64:
            return self.by_free_whole(needs.whole, allowed, used)
        # A node of this gang first; then GPU pods pack onto the tightest node, and CPU-only pods
        # keep off GPU nodes; then by name.
        if needs.uses_devices:
            # ``allowed`` names exactly the ``eligible`` nodes: sorted by name, then (stable) by
            # free milli-GPU, the same order as the key (free, name) without building it.
            by_free = sorted(
                self._eligibility.sorted_names(allowed), key=self._holdings.free_milli.__getitem__
            )
            if used:
                return [n for n in by_free if n in used] + [n for n in by_free if n not in used]
            return by_free
        order = sorted([(0 if (n := s.name) in used else 1, 1 if s.devices else 0, n) for s in eligible])
        return [item[2] for item in order]

    def by_free_whole(self, whole: int, allowed: set[str], used: set[str]) -> Iterator[str]:
        """The tightest-first order for whole GPUs on many nodes: from the buckets by free whole
        GPUs, the nodes without ``whole`` of them left out."""
        yield from sorted(n for n in used if n in allowed)
        buckets = self._holdings.buckets
        for free in sorted(k for k in buckets if k >= whole):
            for name in buckets[free]:
                if name in allowed and name not in used:
                    yield name

    def _roomy(self, needs: PodNeeds, names: Iterable[str]) -> list[str]:
        """The nodes ``names`` less those where :meth:`NodeState.fit` cannot succeed for lack of
        free devices: a pod of whole GPUs needs that many free whole GPUs
        (:meth:`NodeState.free_whole` counts exactly the devices ``fit`` may give it), a fraction
        needs a GPU with that much free (so at least as much free on the node), and any other pod
        that uses devices some free share of one (a MIG instance, a slot). Only the sure cases are
        left out, so the first node that fits is the same: nodes with time-sliced GPUs (a slot may
        count as 0 milli-GPU, and gives whole GPUs as slots), and MIG requests when repartitioning
        may carve a new instance out of unused slices. What is read here does not change while a
        pod's candidates are tried, so the list is built at once."""
        if not needs.uses_devices or (needs.mig and self._repartition):
            return list(names)
        holdings = self._holdings
        if needs.whole:
            free, least = holdings.free_whole, needs.whole
        else:
            free, least = holdings.free_milli, max(1, needs.fraction_milli)
        sliced = holdings.sliced
        return [name for name in names if free[name] >= least or name in sliced]
