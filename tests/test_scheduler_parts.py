"""Each part of the scheduler (core/scheduling/) on its own, with fakes for the parts it uses.

The behaviour of the whole is tested through ``Scheduler`` and ``Session`` elsewhere; these tests
pin down what each part does with the narrow interface it is given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from gpuplane.core.check_gate import CheckGate, Verdict
from gpuplane.core.config import SchedulerConfig, config_from_kueue
from gpuplane.core.fair_victims import FairVictims
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.gangs import PlacementFailure
from gpuplane.core.quota import QuotaTree
from gpuplane.core.scheduler import Scheduler
from gpuplane.core.scheduling.cycle import Cycle
from gpuplane.core.scheduling.decider import Decider
from gpuplane.core.scheduling.evictor import Evictor
from gpuplane.core.scheduling.fair_order import FairOrder
from gpuplane.core.scheduling.nominator import Nominator
from gpuplane.core.scheduling.placer import NodePlacer
from gpuplane.core.scheduling.queue_manager import QueueManager
from gpuplane.core.scheduling.reservations import CheckedReservations
from gpuplane.core.scheduling.shapes import Shapes
from gpuplane.core.scheduling.state import CycleResult, Entry, Ledger, Status
from gpuplane.core.scheduling.waker import Waker
from gpuplane.core.victims import PreemptionContext
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.loader import load_state
from gpuplane.model.objects import ClusterState, Workload
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    local_queue,
    namespace,
    node,
    resource_flavor,
    workload,
)

T0 = "2026-01-01T00:00:00Z"
T1 = "2026-01-01T00:00:01Z"


def state_of(*objects: Manifest, nodes: int = 0) -> ClusterState:
    """Queue ``a`` (8 CPUs of flavor ``default``) with LocalQueue ``a``, and ``nodes`` nodes."""
    base: list[Manifest] = [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("a").flavor("default", cpu="8"),
        local_queue("a", "default", "a"),
    ]
    base += [node(f"n{i}").allocatable(cpu="8", memory="64Gi") for i in range(nodes)]
    return load_state([("state.yaml", documents(*base, *objects))])


def one_workload(name: str, created: str = T0, cpu: str = "4") -> Workload:
    return load_state(
        [("w.yaml", documents(workload(name).queue("a").created(created).podset(cpu=cpu)))]
    ).workloads[0]


def config(state: ClusterState) -> SchedulerConfig:
    return config_from_kueue(state.configuration)


class NoShapes:
    """A fake :class:`Shapes`: no workload has a shape, none could take any flavor."""

    def of(self, _pending: PendingWorkload) -> int | None:
        return None

    def eligible_flavors(self, _pending: PendingWorkload) -> frozenset[str]:
        return frozenset()


def test_the_queue_manager_alone_orders_heads_parks_and_withdraws() -> None:
    state = state_of()
    queues = QueueManager(state, QuotaTree(state), cast(Shapes, NoShapes()))
    queues.enqueue(one_workload("late", T1), 1.0, keep_sorted=True)
    queues.enqueue(one_workload("early", T0), 0.0, keep_sorted=True)
    assert [p.key for p in queues.heads()] == ["default/early"]
    result = CycleResult()
    queues.park(queues.heads()[0], result)
    assert result.parked == 1
    assert [p.key for p in queues.heads()] == ["default/late"]  # the parked head is passed over
    assert queues.withdraw("default/late")
    assert queues.heads() == []
    queues.wake_all()
    assert [p.key for p in queues.heads()] == ["default/early"]
    assert queues.pending_count() == 1
    assert [d.reason for d in queues.pending_decisions()] == [Reason.QUEUED]


def test_the_queue_manager_records_why_a_workload_is_not_queued() -> None:
    state = state_of()
    queues = QueueManager(state, QuotaTree(state), cast(Shapes, NoShapes()))
    stray = load_state([("w.yaml", documents(workload("stray").queue("nowhere").podset(cpu="1")))]).workloads[
        0
    ]
    queues.enqueue(stray, 0.0)
    assert queues.pending_count() == 0
    assert queues.unqueued["default/stray"][2].reason == Reason.MISCONFIGURED


def test_shapes_number_equal_workloads_alike() -> None:
    state = state_of()
    scheduler = Scheduler(state, config(state), 0.0)
    shapes = scheduler.shapes
    scheduler.submit(one_workload("w1"))
    scheduler.submit(one_workload("w2", T1))
    first, second = scheduler.queues["a"]
    assert shapes.of(first) == shapes.of(second) is not None
    assert shapes.eligible_flavors(first) == frozenset({"default"})


@dataclass
class RefusingPlacer:
    """A fake :class:`NodePlacer` whose nodes hold nothing."""

    cluster: object = field(default_factory=object)  # not None: the cycle asks the nodes
    asked: list[str] = field(default_factory=list)

    def placement_for(self, e: Entry, probe: bool, recall: bool = False) -> PlacementFailure:
        del probe, recall  # a probe is refused too, on any state
        self.asked.append(e.pending.key)
        return PlacementFailure(Reason.FRAGMENTED, "no node has room")

    def to_come(self, _e: Entry) -> str:
        return ""


def test_the_cycle_with_a_placement_that_refuses_everything_admits_nothing() -> None:
    state = state_of(
        workload("w1").queue("a").created(T0).podset(cpu="4"),
        workload("w2").queue("a").created(T1).podset(cpu="4"),
    )
    scheduler = Scheduler(state, config(state), 0.0)
    placer = RefusingPlacer()
    decider = Decider(
        scheduler.config, scheduler.tree, scheduler.nominator, cast(NodePlacer, placer), scheduler.gate
    )
    cycle = Cycle(
        scheduler.config,
        scheduler.ledger,
        scheduler.queue_manager,
        scheduler.shapes,
        scheduler.nominator,
        decider,
        scheduler.evictor,
        scheduler.reservations,
        scheduler.preemptor,
    )
    result = cycle.run()
    assert result.admitted == []
    assert placer.asked == ["default/w1"]  # one head per queue
    assert scheduler.status["default/w1"].reason == Reason.FRAGMENTED
    assert scheduler.tree.queues["a"].usage.get(("default", "cpu"), 0) == 0  # nothing held


@dataclass
class RecordingWaker:
    """A fake :class:`Waker`: records which releases it was told of."""

    woken: list[tuple[str, bool]] = field(default_factory=list)

    def wake(self, cq_name: str, _freed: object = None, *, settled: bool = False) -> None:
        self.woken.append((cq_name, settled))


def test_the_evictor_frees_quota_and_tells_the_waker() -> None:
    state = state_of(workload("w1").queue("a").created(T0).podset(cpu="4"))
    scheduler = Scheduler(state, config(state), 0.0)
    assert [d.workload for d in scheduler.cycle().admitted] == ["default/w1"]
    waker = RecordingWaker()
    evictor = Evictor(
        state, scheduler.ledger, scheduler.queue_manager, cast(Waker, waker), None, scheduler.preemptor
    )
    version = scheduler.state_version
    assert evictor.evict("default/w1", "idle")
    assert waker.woken == [("a", True)]  # a finish between cycles: a settled wake
    assert scheduler.state_version > version
    assert "default/w1" not in scheduler.admitted
    assert [p.key for p in scheduler.queues["a"]] == ["default/w1"]  # requeued
    assert not evictor.finish("default/w1")  # no longer admitted


class StoppedGate:
    """A fake admission-check gate: every ClusterQueue waits for a check that is not there."""

    def inactive_reason(self, _cq: object) -> str:
        return "check missing"

    def required(self, _cq: object, _flavors: object) -> tuple[str, ...]:
        return ()


def test_the_nominator_reports_an_inactive_queue_without_assigning_flavors() -> None:
    state = state_of()
    cfg = config(state)
    scheduler = Scheduler(state, cfg, 0.0)
    nominator = Nominator(
        state,
        cfg,
        Ledger(scheduler.tree, 0.0),
        scheduler.flavors,
        scheduler.preemptor,
        cast(Any, StoppedGate()),
        scheduler.nominator.needs,
        scheduler.nominator.eligibility,
        has_nodes=False,
    )
    scheduler.submit(one_workload("w1"))
    (pending,) = scheduler.queues["a"]
    assert nominator.nominate(pending) == Status(Reason.SUSPENDED, "check missing")
    assert nominator.scan == {}


def test_the_fair_order_keeps_queues_outside_a_cohort_in_the_order_given() -> None:
    state = state_of()
    scheduler = Scheduler(state, config(state), 0.0)
    scheduler.submit(one_workload("w1"))
    scheduler.submit(one_workload("w2", T1))
    entries = []
    for pending in scheduler.queues["a"]:
        entry = scheduler.nominate(pending)
        assert isinstance(entry, Entry)
        entries.append(entry)
    assert list(FairOrder(scheduler.config).order(entries)) == entries


def test_the_placer_places_an_admitted_gang_and_notes_what_does_not_fit() -> None:
    state = state_of(nodes=1)
    cfg = config(state)
    scheduler = Scheduler(state, cfg, 0.0)
    ledger = Ledger(scheduler.tree, 0.0)
    placer = NodePlacer(state, cfg, scheduler.flavors, scheduler.nominator.needs, ledger)
    assert placer.cluster is not None
    scheduler.submit(one_workload("w1", cpu="6"))
    (pending,) = scheduler.queues["a"]
    entry = scheduler.nominate(pending)
    assert isinstance(entry, Entry)
    assert not isinstance(placer.placement_for(entry, probe=False), PlacementFailure)
    scheduler.submit(one_workload("w2", T1, cpu="6"))
    second = scheduler.nominate(scheduler.queues["a"][1])
    assert isinstance(second, Entry)
    assert isinstance(placer.placement_for(second, probe=True), PlacementFailure)  # 2 CPUs left
    assert ledger.notes == []


class FreedShapes:
    """A fake :class:`Shapes`: no shape, and every workload could take exactly ``flavors``."""

    def __init__(self, flavors: frozenset[str]) -> None:
        self.flavors = flavors
        self.eligible: dict[str, object] = {}

    def of(self, _pending: PendingWorkload) -> int | None:
        return None

    def eligible_flavors(self, _pending: PendingWorkload) -> frozenset[str]:
        return self.flavors


def test_the_waker_wakes_only_parked_work_that_could_use_a_freed_flavor() -> None:
    state = state_of()
    cfg = config(state)
    tree = QuotaTree(state)
    for could_use, woken in ((frozenset({"other"}), False), (frozenset({"default"}), True)):
        shapes = cast(Shapes, FreedShapes(could_use))
        queues = QueueManager(state, tree, shapes)
        queues.enqueue(one_workload("w1"), 0.0)
        queues.park(queues.queues["a"][0], CycleResult())
        # Neither the nodes, the gate, the preemptor nor the needs are read by a wake that is
        # not settled: a wake between cycles (settled) asks them for its bounds.
        waker = Waker(cfg, tree, queues, shapes, None, {}, cast(Any, None), cast(Any, None), cast(Any, None))
        waker.wake("a", frozenset({("default", "cpu")}))
        assert ("default/w1" not in queues.parked) is woken


@dataclass
class RecordingPlacer:
    """A fake :class:`NodePlacer` without nodes that records the admitted workloads it is given."""

    cluster: None = None
    placed: list[str] = field(default_factory=list)

    def place_admitted(self, wl: Workload) -> None:
        self.placed.append(wl.key)


class VerdictGate(CheckGate):
    """The real gate with one verdict for every workload."""

    def __init__(self, state: ClusterState, verdict: Verdict) -> None:
        super().__init__(state)
        self.fixed = verdict

    def verdict(self, _wl: Workload) -> tuple[Verdict, None]:
        return self.fixed, None


CPU4 = {"cpu": "4"}


def test_checked_reservations_hold_quota_and_place_only_workloads_without_checks() -> None:
    admitted = (
        workload("held")
        .created(T0)
        .podset(cpu="4")
        .admitted(
            "a", {"name": "main", "count": 1, "flavors": {"cpu": "default"}, "resourceUsage": {"cpu": "4"}}
        )
        .set("status.conditions", [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": T0}])
    )
    state = state_of(admitted)
    (wl,) = state.workloads
    for verdict, placed in ((Verdict.NONE, ["default/held"]), (Verdict.WAITING, [])):
        scheduler = Scheduler(state_of(), config(state), 0.0)
        placer = RecordingPlacer()
        reservations = CheckedReservations(
            scheduler.ledger,
            VerdictGate(state, verdict),
            cast(NodePlacer, placer),
            scheduler.queue_manager,
            scheduler.waker,
            scheduler.preemptor,
        )
        reservations.hold_admitted(wl, 0.0)
        assert scheduler.tree.queues["a"].usage[("default", "cpu")] == 4000  # the quota is held
        assert placer.placed == placed  # on the nodes only when no check is pending


def test_the_fair_sharing_search_finds_nothing_to_evict_in_an_empty_queue() -> None:
    state = state_of()
    scheduler = Scheduler(state, config(state), 0.0)
    scheduler.submit(one_workload("w1", cpu="16"))
    (pending,) = scheduler.queues["a"]
    cq = scheduler.tree.queues["a"]
    search = FairVictims(scheduler.tree, scheduler.config)
    ctx = PreemptionContext(pending, cq, frozenset({("default", "cpu")}), {("default", "cpu"): 16000})
    assert search.targets(ctx, 0.0) == []


def test_the_ledger_moves_the_state_version_with_a_cohort_generation() -> None:
    state = state_of()
    ledger = Ledger(QuotaTree(state), 0.0)
    ledger.bump_generation("a")
    ledger.bump_generation("gone")  # a queue no longer in the tree moves the version only
    assert ledger.generation_of("a") == 1
    assert ledger.state_version == 2
