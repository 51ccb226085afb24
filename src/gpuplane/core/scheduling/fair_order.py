"""The order in which a cycle tries its entries under fair sharing (a tournament on dominant
resource shares down the cohort tree). The classical order (borrowing, priority, queue time) is
:func:`gpuplane.core.scheduling.state.classical_key`, which the cycle keeps in a heap
(:meth:`gpuplane.core.scheduling.cycle.Cycle.decide`)."""

from __future__ import annotations

from collections.abc import Iterator

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.quota import (
    DRS,
    CohortNode,
    compare_drs,
)
from gpuplane.core.scheduling.state import Entry


class FairOrder:
    """The fair-sharing order of a cycle's entries. Owns no state: it reads the entries' usage on
    the quota tree (held there only while their shares are compared) and the configuration."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config

    def order(self, entries: list[Entry]) -> Iterator[Entry]:
        """The entries, the winner of each cohort tree's tournament first."""
        by_cq: dict[str, Entry] = {e.cq.name: e for e in entries}
        remaining = dict(by_cq)
        roots: dict[str, list[Entry]] = {}
        for e in entries:
            roots.setdefault(e.cq.root().name, []).append(e)
        for root_name in sorted(roots):
            group = roots[root_name]
            root = group[0].cq.root()
            if not isinstance(root, CohortNode):
                for e in group:
                    remaining.pop(e.cq.name, None)
                    yield e
                continue
            while any(e.cq.name in remaining for e in group):
                winner = self._tournament(root, remaining)
                assert winner is not None
                del remaining[winner.cq.name]
                yield winner

    def _tournament(self, root: CohortNode, remaining: dict[str, Entry]) -> Entry | None:
        drs: dict[tuple[str, str], DRS] = {}
        for cq in root.subtree_queues():
            entry = remaining.get(cq.name)
            if entry is None:
                continue
            with cq.with_usage(entry.assignment.usage):
                share = cq.dominant_resource_share()
                for ancestor in cq.ancestors():
                    drs[(ancestor.name, entry.pending.key)] = share
                    share = ancestor.dominant_resource_share()
        return self._run_tournament(root, remaining, drs)

    def _run_tournament(
        self, cohort: CohortNode, remaining: dict[str, Entry], drs: dict[tuple[str, str], DRS]
    ) -> Entry | None:
        candidates: list[Entry] = []
        for child in cohort.child_cohorts:
            winner = self._run_tournament(child, remaining, drs)
            if winner is not None:
                candidates.append(winner)
        candidates += [remaining[cq.name] for cq in cohort.child_queues if cq.name in remaining]
        if not candidates:
            return None
        best = candidates[0]
        for current in candidates[1:]:
            if self._fair_less(current, best, cohort.name, drs):
                best = current
        return best

    def _fair_less(self, a: Entry, b: Entry, parent: str, drs: dict[tuple[str, str], DRS]) -> bool:
        a_drs = drs[(parent, a.pending.key)]
        b_drs = drs[(parent, b.pending.key)]
        if self.config.prioritize_non_borrowing:
            a_b = a_drs.borrowing_on(a.assignment.usage)
            b_b = b_drs.borrowing_on(b.assignment.usage)
            if a_b != b_b:
                return not a_b
        cmp = compare_drs(a_drs, b_drs)
        if cmp != 0:
            return cmp == -1
        if self.config.priority_sorting_within_cohort and a.pending.priority != b.pending.priority:
            return a.pending.priority > b.pending.priority
        return a.pending.timestamp < b.pending.timestamp
