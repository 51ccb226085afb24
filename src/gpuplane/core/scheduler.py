"""Scheduling cycles with Kueue's semantics.

``schedule(state, config, now)`` is the pure entry point: a frozen ClusterState in,
a :class:`~gpuplane.core.plan.Plan` out. Internally a :class:`Scheduler` keeps a
working copy (quota tree and queues) that lives only for that call.

One cycle::

    heads (one per ClusterQueue) -> nominate (flavors, preemption targets)
        -> order (classical or fair sharing) -> for each entry:
           NoFit: skip | Preempt without targets: reserve | overlap/no longer fits: skip
           Preempt: evict victims (they are gone in the next cycle) | Fit: admit

With ``cycles=None`` the scheduler repeats cycles until nothing changes (a fixed
point): victims are requeued, and inadmissible workloads of BestEffortFIFO queues
wait aside until capacity is freed in their cohort.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuplane.core.check_gate import CheckGate
from gpuplane.core.config import SchedulerConfig
from gpuplane.core.flavors import EligibilityMemo
from gpuplane.core.lifecycle import Reason
from gpuplane.core.placement.devices import NeedsMemo
from gpuplane.core.placement.gang_placement import PlacementState
from gpuplane.core.plan import AdmissionDecision, PendingDecision, Plan, PreemptionDecision
from gpuplane.core.preemptor import Preemptor
from gpuplane.core.quota import QuotaTree
from gpuplane.core.scheduling.cycle import Cycle
from gpuplane.core.scheduling.decider import Decider
from gpuplane.core.scheduling.evictor import Evictor
from gpuplane.core.scheduling.nominator import Nominator
from gpuplane.core.scheduling.placer import NodePlacer
from gpuplane.core.scheduling.queue_manager import QueueManager
from gpuplane.core.scheduling.reservations import CheckedReservations
from gpuplane.core.scheduling.shapes import Shapes
from gpuplane.core.scheduling.state import (
    WORKLOAD_LABEL,
    CycleResult,
    Entry,
    Ledger,
    ScanProgress,
    Status,
    flavors_of,
)
from gpuplane.core.scheduling.waker import Waker
from gpuplane.core.workloads import PendingWorkload
from gpuplane.model.objects import ClusterState, ResourceFlavor, Workload

__all__ = [
    "WORKLOAD_LABEL",
    "CycleResult",
    "Entry",
    "PendingWorkload",
    "ScanProgress",
    "Scheduler",
    "Status",
    "drain",
    "drain_bound",
    "plan_after",
    "schedule",
]


class Scheduler:
    """The working state and the cycle, for one ``schedule`` call or one session's whole life.

    It builds the parts (:mod:`gpuplane.core.scheduling`), each holding the others it uses, loads
    the cluster state into them, and delegates the driver's events and the cycle to them. What it
    owns itself is only those parts; the attributes below read through to the part that owns each.
    """

    def __init__(self, state: ClusterState, config: SchedulerConfig, now: float) -> None:
        self.state = state
        self.config = config
        self.tree = tree = QuotaTree(state)
        self.preemptor = preemptor = Preemptor(tree, config, now)
        self.ledger = ledger = Ledger(tree, now)
        self.flavors: dict[str, ResourceFlavor] = flavors_of(state)
        self.gate = gate = CheckGate(state)
        needs = NeedsMemo(config.devices)  # each pod template's needs, read once
        eligibility = EligibilityMemo()  # which flavors each pod template may take
        self.placer = placer = NodePlacer(state, config, self.flavors, needs, ledger)
        cluster = placer.cluster
        self.shapes = shapes = Shapes(tree, config, self.flavors, eligibility)
        self.queue_manager = queues = QueueManager(state, tree, shapes)
        self.nominator = nominator = Nominator(
            state,
            config,
            ledger,
            self.flavors,
            preemptor,
            gate,
            needs,
            eligibility,
            has_nodes=cluster is not None,
        )
        self.waker = waker = Waker(
            config, tree, queues, shapes, cluster, self.flavors, gate, preemptor, needs
        )
        self.evictor = Evictor(state, ledger, queues, waker, cluster, preemptor)
        self.reservations = CheckedReservations(ledger, gate, placer, queues, waker, preemptor)
        decider = Decider(config, tree, nominator, placer, gate)
        self.cycler = Cycle(
            config, ledger, queues, shapes, nominator, decider, self.evictor, self.reservations, preemptor
        )
        self._load(state, now)

    def _load(self, state: ClusterState, now: float) -> None:
        """Hold what the state says is running or admitted, and queue the rest."""
        queues, workloads = self.queue_manager, self.ledger.workloads
        for node in self.tree.queues.values():
            node.active = self.nominator.inactive_reason(node) is None
        if self.placer.cluster is not None:
            self.placer.hold_running_pods()
        for bad in state.invalid_workloads:
            lq = state.local_queues.get(f"{bad.namespace}/{bad.queue_name}") if bad.queue_name else None
            queues.unqueued[bad.key] = (
                lq.cluster_queue if lq is not None else None,
                f"{bad.namespace}/{bad.queue_name}" if bad.queue_name else None,
                Status(Reason.MISCONFIGURED, bad.problem),
            )
        for wl in state.workloads:
            workloads[wl.key] = wl
            if wl.finished:
                continue
            if wl.admission is not None:
                self.reservations.hold_admitted(wl, now)
                continue
            queues.enqueue(wl, wl.queue_order_timestamp)
        for queue in queues.queues.values():
            queue.sort(key=PendingWorkload.sort_key)

    # --- the cycle -----------------------------------------------------------

    def cycle(self, budget: int = 1) -> CycleResult:
        """Run one scheduling cycle and apply its outcome to the working state.

        With ``budget`` > 1, the cycles that follow one in which every head was parked without
        a nomination run in this call too, up to ``budget`` cycles (``result.cycles``). Such a
        cycle changes nothing but which heads are parked (and their reasons), so the next one
        starts from the same state: running it here gives what a separate call would, without
        the call's cost (a long backlog parks one head per queue per cycle). Only where every
        queue is BestEffortFIFO, so that each such cycle parks every head it visits, and never
        the first cycle (which settles admission checks); a cycle that would find no head is
        left to the next call (it is the quiet one that ends a drain).
        """
        return self.cycler.run(budget)

    def nominate(self, pending: PendingWorkload) -> Entry | Status:
        """The flavors and preemption targets ``pending`` would get now (see :class:`Nominator`)."""
        return self.nominator.nominate(pending)

    def heads(self) -> list[PendingWorkload]:
        return self.queue_manager.heads()

    # --- the driver's events between cycles -----------------------------------

    def advance(self, now: float) -> None:
        """Move the scheduler's clock (time is always passed in, never read)."""
        ledger = self.ledger
        if now != ledger.now and self.config.min_runtime_seconds > 0:
            # Only the minimum-runtime protection makes a nomination's outcome depend on the
            # clock (who may be preempted); otherwise a new instant alone changes nothing.
            ledger.state_version += 1
        ledger.now = now
        self.preemptor.now = now

    def capacity_changed(self, freed: bool) -> None:
        """A driver changed the nodes outside a cycle (a node failed, or came back: ``freed``).

        Nothing remembered about the old capacity is reused; when capacity was freed, every
        parked workload gets another look, as after a finish.
        """
        self.ledger.state_version += 1
        if freed:
            self.queue_manager.wake_all()

    def submit(self, wl: Workload) -> None:
        """A new pending workload arrives and is queued by its LocalQueue."""
        self.ledger.workloads[wl.key] = wl
        self.queue_manager.enqueue(wl, wl.queue_order_timestamp, keep_sorted=True)

    def finish(self, key: str) -> bool:
        """An admitted workload completed: free its quota and devices (idempotent)."""
        return self.evictor.finish(key)

    def evict(self, key: str, why: str) -> bool:
        """Evict an admitted workload outside preemption (reaper, node failure) and requeue it."""
        return self.evictor.evict(key, why)

    def withdraw(self, key: str) -> bool:
        """A pending workload was deleted before admission."""
        if self.queue_manager.withdraw(key):
            self.nominator.scan.pop(key, None)
            self.shapes.forget(key)
            return True
        return self.queue_manager.unqueued.pop(key, None) is not None

    # --- what the drivers and insight read -----------------------------------

    def pending_count(self) -> int:
        return self.queue_manager.pending_count()

    def pending_decisions(self) -> list[PendingDecision]:
        return self.queue_manager.pending_decisions()

    @property
    def now(self) -> float:
        return self.ledger.now

    @property
    def cycle_number(self) -> int:
        return self.ledger.cycle_number

    @property
    def state_version(self) -> int:
        return self.ledger.state_version

    @state_version.setter
    def state_version(self, value: int) -> None:
        self.ledger.state_version = value

    @property
    def workloads(self) -> dict[str, Workload]:
        return self.ledger.workloads

    @property
    def admitted(self) -> dict[str, AdmissionDecision]:
        return self.ledger.admitted

    @property
    def preempted(self) -> list[PreemptionDecision]:
        return self.ledger.preempted

    @property
    def notes(self) -> list[str]:
        return self.ledger.notes

    @property
    def cluster(self) -> PlacementState | None:
        return self.placer.cluster

    @property
    def queues(self) -> dict[str, list[PendingWorkload]]:
        return self.queue_manager.queues

    @property
    def status(self) -> dict[str, Status]:
        return self.queue_manager.status

    @status.setter
    def status(self, value: dict[str, Status]) -> None:
        self.queue_manager.status = value

    @property
    def unqueued(self) -> dict[str, tuple[str | None, str | None, Status]]:
        return self.queue_manager.unqueued

    @property
    def preemptor_of(self) -> dict[str, str]:
        return self.queue_manager.preemptor_of


def drain_bound(config: SchedulerConfig, workloads: int) -> int:
    """How many cycles a drain to a fixed point may run: one that still changes something after
    ten cycles per workload is cut short (and never more than ``config.max_cycles``)."""
    return min(config.max_cycles, 10 * (workloads + 10))


def drain(
    scheduler: Scheduler,
    limit: int,
    *,
    until_quiet: bool,
    after_cycle: Callable[[CycleResult], bool] | None = None,
    merge: bool = True,
) -> tuple[list[AdmissionDecision], int]:
    """The one drain loop: cycles until ``limit`` have run, a cycle changes nothing
    (``until_quiet``), or ``after_cycle(result)`` returns True. Returns every admission made and
    the number of cycles run; :func:`plan_after` turns them into a plan. With ``merge``, cycles
    that only park heads run within one call (:meth:`Scheduler.cycle`): ``after_cycle`` sees
    them as one result (nothing admitted or preempted), and the count is the same; a driver that
    records every cycle's reasons passes False."""
    admitted: list[AdmissionDecision] = []
    ran = 0
    while ran < limit:
        result = scheduler.cycle(limit - ran if merge else 1)
        ran += result.cycles
        admitted += result.admitted
        if after_cycle is not None and after_cycle(result):
            break
        if until_quiet and not result.changed:
            break
    return admitted, ran


def plan_after(
    scheduler: Scheduler,
    admitted: list[AdmissionDecision],
    cycles: int,
    *,
    since: tuple[int, int, int] = (0, 0, 0),
    with_pending: bool = True,
) -> Plan:
    """The plan of a drain: its admissions that still stand, by workload; the preemptions, notes
    and check evictions recorded after ``since`` (their counts when the drain began); the
    reservations held and, with ``with_pending``, the pending workloads now."""
    preempted_from, notes_from, evictions_from = since
    still = [d for d in admitted if scheduler.admitted.get(d.workload) is d]
    return Plan(
        admitted=tuple(sorted(still, key=lambda d: d.workload)),
        preempted=tuple(scheduler.preempted[preempted_from:]),
        pending=tuple(scheduler.pending_decisions()) if with_pending else (),
        cycles=cycles,
        notes=tuple(scheduler.notes[notes_from:]),
        reserved=tuple(scheduler.gate.reserved.values()),
        check_evictions=tuple(scheduler.gate.evictions[evictions_from:]),
    )


def schedule(state: ClusterState, config: SchedulerConfig, now: float, cycles: int | None = 1) -> Plan:
    """Decide on a frozen cluster state.

    ``cycles=N`` runs exactly N Kueue cycles (``1``: one cycle); ``None`` runs until a cycle
    changes nothing (bounded by :func:`drain_bound`). The same input always gives the same plan.
    A driver that lives longer keeps a :class:`gpuplane.core.session.Session`, which drains the
    same way.
    """
    scheduler = Scheduler(state, config, now)
    limit = drain_bound(config, len(state.workloads)) if cycles is None else cycles
    admitted, ran = drain(scheduler, limit, until_quiet=cycles is None)
    return plan_after(scheduler, admitted, ran)
