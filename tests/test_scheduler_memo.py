"""The core's remembered nomination outcomes change nothing but the time a pass takes.

A workload parked on a cycle's starting state is remembered by its shape until the state
changes (``Shapes.of``, ``state_version``). These tests run the same simulation with the
memory and without it (every head nominated afresh) and want identical results, on a run that
saturates the cluster so that long queues, preemption, gangs and node failures all occur.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from calls import count_calls
from gpuplane.core.flavors import FlavorAssigner
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.quota import QuotaTree
from gpuplane.core.scheduler import Scheduler
from gpuplane.core.scheduling.cycle import Cycle
from gpuplane.core.scheduling.nominator import Nominator
from gpuplane.core.scheduling.placer import NodePlacer
from gpuplane.core.scheduling.shapes import Shapes
from gpuplane.core.scheduling.state import Kind, Ledger, Parked, StateMemo
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import ClusterState, Workload
from gpuplane.sim.experiment import run_configuration, scenario_input
from gpuplane.sim.scenario import load_scenario

GOLDEN = Path(__file__).resolve().parent / "golden"


def _without_timings(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "wallSeconds"}


@pytest.mark.parametrize(
    ("memory", "scenario", "load", "want_fewer"),
    [
        # Its queues have several flavors, so a parked head usually has a flavor scan under way
        # (Kueue's LastTriedFlavorIdx), which the parked outcomes leave out by design: same
        # decisions, and never more nominations.
        pytest.param("parked", "tiny-mixed", 1.6, False, id="parked-tiny-mixed-saturated"),
        pytest.param("parked", "gang-pressure", None, True, id="parked-gangs"),
        # Saturated, with several flavors per queue: many heads of one shape, and scans resumed.
        pytest.param("assignments", "tiny-mixed", 1.6, True, id="assignments-tiny-mixed-saturated"),
        # Each gang is a shape of its own here: nothing to reuse, and nothing may change.
        pytest.param("assignments", "gang-pressure", None, False, id="assignments-gangs"),
        # One-pod heads of one shape, woken together, that find no place on the same nodes.
        pytest.param("placements", "tiny-mixed", 2.5, True, id="placements-tiny-mixed-past-capacity"),
    ],
)
def test_remembered_outcomes_change_nothing_but_the_work(
    memory: str, scenario: str, load: float | None, want_fewer: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same simulation with a memory of the core and without it: the same document, and no
    more work. ``parked``: a head whose shape was parked on the same state is parked unnominated
    (counted: nominations). ``assignments``: two workloads of one shape whose flavor scans start
    alike get the same assignment while the state stays the same, and a scan requeued to resume
    at a later flavor gets what the cycle's own look at that flavor found (``Nominator.known``;
    counted: flavor scans). ``placements``: a one-pod gang with a known assignment that found no
    place is not searched for again on the same nodes (counted: searches)."""
    loaded = load_scenario(GOLDEN / f"{scenario}.yaml").with_days(0.5)
    if load is not None:
        loaded = loaded.with_load(load)
    sim = scenario_input(loaded)
    if memory == "parked":
        counted = count_calls(monkeypatch, Nominator, "nominate")
    elif memory == "assignments":
        counted = count_calls(monkeypatch, FlavorAssigner, "assign")
    else:
        counted = count_calls(monkeypatch, PlacementState, "place")
    _, kept = run_configuration("gpuplane", sim)
    with_memory = counted["count"]
    counted["count"] = 0
    if memory == "parked":
        monkeypatch.setattr(Shapes, "of", lambda *_: None)
    elif memory == "assignments":
        monkeypatch.setattr(Nominator, "known", lambda _self: {})  # nothing is ever found again
    else:
        search = NodePlacer.placement_for
        monkeypatch.setattr(NodePlacer, "placement_for", lambda self, e, probe, **_: search(self, e, probe))
    _, afresh = run_configuration("gpuplane", sim)
    assert _without_timings(kept) == _without_timings(afresh)
    assert kept["started"] > 0
    if want_fewer:
        assert with_memory < counted["count"]
    else:
        assert with_memory <= counted["count"]


@pytest.mark.parametrize("clock", [True, False])
def test_a_state_memo_forgets_when_the_state_moves_and_as_checked_never_outlives_it(clock: bool) -> None:
    """A :class:`StateMemo` keeps its entries while the ledger's state version (and, with
    ``clock``, its clock) stays; an entry added through ``as_checked`` after the state moved
    belongs to the old state and is gone at the next check."""
    ledger = Ledger(QuotaTree(ClusterState()), 0.0)
    memo: StateMemo[str, int] = StateMemo(ledger, clock=clock)
    memo.entries()["a"] = 1
    assert memo.entries() == {"a": 1}
    ledger.now = 5.0
    assert memo.entries() == ({} if clock else {"a": 1})
    memo.entries()["b"] = 2
    ledger.state_version += 1
    memo.as_checked()["late"] = 3  # found on the state before the move
    assert memo.entries() == {}
    memo.entries()["c"] = 4
    assert memo.as_checked() == memo.entries() == {"c": 4}


def test_cycles_that_only_park_heads_run_in_one_call_with_the_same_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cycle that parks every head without nominating one leaves the state as it found it, so
    ``Scheduler.cycle`` runs the next ones in the same call (``budget``). Same simulation with
    that and without it (one call per cycle): the same document, the same number of cycles, and
    fewer calls."""
    sim = scenario_input(load_scenario(GOLDEN / "gang-pressure.yaml").with_days(0.5))
    calls = count_calls(monkeypatch, Scheduler, "cycle")
    _, merged = run_configuration("gpuplane", sim)
    merged_calls = calls["count"]
    calls["count"] = 0
    monkeypatch.setattr(Cycle, "best_effort_only", lambda _self: False)
    _, one_by_one = run_configuration("gpuplane", sim)
    assert _without_timings(merged) == _without_timings(one_by_one)
    assert one_by_one["schedulingCycles"] == calls["count"] > merged_calls


def test_parked_files_every_parked_key_once_under_its_kind() -> None:
    """The wake's files of parked workloads follow every way a key leaves the set (discard,
    remove, clear) and never keep a key that is not parked."""
    rng = random.Random(7)
    parked = Parked()
    kinds: list[Kind | None] = [None, (0, False, frozenset({"a"})), (1, True, frozenset({"a", "b"}))]
    for step in range(2000):
        key = f"ns/w{rng.randrange(40)}"
        op = rng.random()
        if op < 0.5 and key not in parked:
            queue = rng.choice(["q1", "q2"])
            workload = Workload("ns", key[3:], key, 0.0, 0, ())
            pending = PendingWorkload(workload, queue, "ns/lq", 0, 0.0, step)
            parked.park(pending, rng.choice(kinds))
        elif op < 0.8:
            parked.discard(key)
        elif op < 0.95 and key in parked:
            parked.remove(key)
        elif op >= 0.995:
            parked.clear()
        filed = [k for per_queue in parked.kinds.values() for members in per_queue.values() for k in members]
        filed += [k for members in parked.loose.values() for k in members]
        assert sorted(filed) == sorted(parked)
        assert all(members for per_queue in parked.kinds.values() for members in per_queue.values())
    with pytest.raises(KeyError):
        parked.remove("ns/never")
