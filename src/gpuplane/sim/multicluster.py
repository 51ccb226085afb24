"""Several clusters behind one MultiKueue manager, as one simulated configuration.

::

    arrival ──> manager: nominate (gpuplane.insight.dispatch.nominate) ──> a copy on each nominee
                                                                              │
    worker clusters (gpuplane's model each, the same core) admit their copies ┘
                                                                              │
    the first worker to admit wins; the other copies are deleted <───────────┘
    (a copy a loser admitted meanwhile holds its GPUs until then: a cancelled start)

The scenario's nodes are split into the workers pool by pool, dealt round-robin like cards
(:func:`split_cluster`), so each worker has a mix of the pools. Every worker holds every team's
queues, with floors on its own share of the pools.

Kueue's flow, as the simulator models it:

* AllAtOnce and Incremental copy the workload to every nominated worker. Each copy may start
  preemptions there. The first worker to admit wins (workers admitting at the same instant: the
  first by name). The other copies are deleted :data:`DELETE_SECONDS` later (the manager sees the
  admission, then deletes). A copy that a losing worker admitted held its GPUs until then: that
  is a cancelled start, and the preemptions its copies started are wasted.
* The gpuplane dispatcher asks each worker first (:meth:`WorkerCluster.view`: does the gang fit
  now, when would it start) and nominates one. While its copy waits, it asks again every
  :data:`REDISPATCH_SECONDS` and moves the copy if another worker is now the better choice
  (a copy not yet admitted costs nothing to move).
* A workload stays on the worker that won it: preempted or hit by a node failure, it waits in
  that worker's queue (the job runs there).
* A workload whose cluster selector matches no active worker stays at the manager and never
  runs; the nomination's reason says why (:meth:`MultiClusterModel.reason_of`).

The manager's own quota is the fleet's and is not modelled: the workers' quotas bind.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from gpuplane.insight.dispatch import RECHECK_SECONDS, ClusterView, DispatchPolicy, nominate
from gpuplane.insight.eta import Capacity
from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.engine import HOLD, START, STOP, Change, Engine, ProgressCallback
from gpuplane.sim.gpuplane_model import GpuplaneOptions
from gpuplane.sim.multicluster_worker import WorkerCluster
from gpuplane.sim.runs import JobRun
from gpuplane.sim.workloads import Job, Workloads

DELETE_SECONDS = 10.0  # assumed: the manager sees a worker's admission and deletes the other copies
# The gpuplane dispatcher looks again at a waiting copy every RECHECK_SECONDS live; the simulator
# looks every 5 minutes: ten times fewer looks, and looking every minute changed nothing at load 1.4
# (docs/multicluster.md).
REDISPATCH_SECONDS = 10 * RECHECK_SECONDS
CLUSTER_LABEL = "gpuplane.dev/cluster"  # every simulated worker carries its own name under it


def worker_names(count: int) -> tuple[str, ...]:
    return tuple(f"worker-{i + 1}" for i in range(count))


def split_cluster(cluster: ClusterSpec, count: int) -> tuple[ClusterSpec, ...]:
    """``cluster``'s nodes dealt to ``count`` workers: pool by pool, node by node, round-robin
    across pools (the k-th node overall goes to worker k mod ``count``). Each worker keeps the
    pools it got nodes of, in the cluster's order, and every team."""
    nodes = len(cluster.nodes)
    if count < 1 or count > nodes:
        raise ValueError(f"--clusters must be between 1 and the scenario's {nodes} nodes, got {count}")
    shares: list[list[NodeSpec]] = [[] for _ in range(count)]
    ordered = sorted(cluster.nodes, key=lambda n: cluster.pools.index(n.pool))
    for k, node in enumerate(ordered):
        shares[k % count].append(node)
    out = []
    for share in shares:
        pools = tuple(p for p in cluster.pools if any(n.pool == p for n in share))
        out.append(
            ClusterSpec(
                nodes=tuple(share),
                pools=pools,
                teams=cluster.teams,
                normal_priority=cluster.normal_priority,
                backfill_priority=cluster.backfill_priority,
            )
        )
    return tuple(out)


@dataclass(frozen=True, slots=True)
class MultiClusterSettings:
    """How the fleet is cut and dispatched: ``clusters`` workers, the ``dispatcher``, each worker's
    extra labels (by worker name), the cluster selector of each workload class (data locality),
    and the gpuplane dispatcher's spill-over order."""

    clusters: int
    dispatcher: DispatchPolicy
    labels: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    selectors: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # class -> labels
    spill_order: tuple[str, ...] = ()
    delete_seconds: float = DELETE_SECONDS
    redispatch_seconds: float = REDISPATCH_SECONDS

    def __post_init__(self) -> None:
        if self.clusters < 1:
            raise ValueError(f"--clusters must be at least 1, got {self.clusters}")
        if not self.delete_seconds > 0 or not self.redispatch_seconds > 0:
            raise ValueError("the copies' deletion delay and the redispatch period must be positive")


@dataclass(slots=True)
class Dispatched:
    """One workload at the manager: where its copies are, who won, and what its copies cost.

    ``copies``: workers holding a copy (``ever``: every worker that was given one); ``held``:
    losing workers whose copy is admitted, since when; ``victims``: per worker, the preemptions
    its copy started; ``lost``: per worker, the GPU-seconds of work its copy's victims lost."""

    job: Job
    selector: Mapping[str, str]
    first_nominated: float | None = None
    next_look: float = 0.0
    copies: set[int] = field(default_factory=set)
    ever: set[int] = field(default_factory=set)
    winner: int | None = None
    reason: str = ""
    held: dict[int, float] = field(default_factory=dict)
    victims: dict[int, int] = field(default_factory=dict)
    lost: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class CopyCosts:
    """What losing copies cost over a run (counted from the measured window's start)."""

    cancelled_starts: int = 0
    held_gpu_seconds: float = 0.0


class MultiClusterModel:
    """The manager and its workers as one :class:`gpuplane.sim.engine.Model`.

    Owns the workers (``workers``, each a :class:`WorkerCluster`), every workload's dispatch
    (``dispatched``, by job id; those without a winner in ``undecided``), the copies to delete
    (``deletions``: time, worker, job id), the victims whose preemptor's copy is known
    (``victim_of``: job id -> (workload, worker)), the changes for the engine (``changes``) and
    the costs of losing copies (``costs``). ``expected_end`` is set by the engine that runs it.
    """

    def __init__(
        self,
        cluster: ClusterSpec,
        options: GpuplaneOptions,
        start: float,
        *,
        grace: float,
        settings: MultiClusterSettings,
    ) -> None:
        self.name = f"multikueue-{settings.dispatcher}"
        self.settings = settings
        self.reaper = options.reaper
        self.cluster = cluster
        self.options = options
        names = worker_names(settings.clusters)
        unknown = sorted(set(settings.labels) - set(names))
        if unknown:
            raise ValueError(f"labels for unknown worker {unknown[0]!r} (workers: {', '.join(names)})")
        self.workers = [
            WorkerCluster(
                name,
                spec,
                options,
                start,
                grace=grace,
                labels={CLUSTER_LABEL: name, **settings.labels.get(name, {})},
            )
            for name, spec in zip(names, split_cluster(cluster, settings.clusters), strict=True)
        ]
        self.worker_of_node = {n.name: i for i, w in enumerate(self.workers) for n in w.cluster.nodes}
        self.gpus_of = {n.name: n.gpus for n in cluster.nodes}
        self.dispatched: dict[int, Dispatched] = {}
        self.undecided: dict[int, Dispatched] = {}
        self.deletions: list[tuple[float, int, int]] = []
        self.looks: list[tuple[float, int]] = []  # (next look, job id) of undecided workloads
        self.victim_of: dict[int, tuple[Dispatched, int]] = {}
        self.changes: list[Change] = []
        self.stash: dict[tuple[int, int], Change] = {}
        self.costs = CopyCosts()
        self.wakes: list[float] = []
        self.expected_end: Callable[[int], float | None] = lambda _job_id: None

    # --- what happened -----------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        selector = self.settings.selectors.get(job.klass, {})
        entry = Dispatched(job, selector, next_look=now)
        self.dispatched[job.id] = entry
        self.undecided[job.id] = entry
        heapq.heappush(self.looks, (now, job.id))

    def release(self, job: Job, now: float) -> None:
        entry = self.dispatched.get(job.id)
        if entry is None:
            return
        self.undecided.pop(job.id, None)
        for i in sorted(entry.copies):
            self._drop(entry, i, now)

    def node_down(self, node: str, now: float) -> None:
        i = self.worker_of_node[node]
        self.workers[i].node_down(node, now)
        self._collect(i, now)

    def node_up(self, node: str, now: float) -> None:
        i = self.worker_of_node[node]
        self.workers[i].node_up(node, now)
        self._collect(i, now)

    # --- one pass: deletions due, nominations due, every worker's cycles ---------------------

    def schedule(self, now: float, checkpoints: Callable[[], Iterable[tuple[Job, float]]]) -> int:
        while self.deletions and self.deletions[0][0] <= now:
            _, i, job_id = heapq.heappop(self.deletions)
            copy = self.dispatched[job_id]
            if i in copy.copies:
                self._drop(copy, i, now)
        looks = self.looks
        while looks and looks[0][0] <= now:
            at, job_id = heapq.heappop(looks)
            entry = self.undecided.get(job_id)
            if entry is not None and entry.next_look == at:
                self._dispatch(entry, now)
        reached: list[tuple[Job, float]] | None = None

        def checkpoints_of(i: int) -> Callable[[], Iterable[tuple[Job, float]]]:
            def ask() -> Iterable[tuple[Job, float]]:
                nonlocal reached
                if reached is None:
                    reached = list(checkpoints())
                return [(job, at) for job, at in reached if self.dispatched[job.id].winner == i]

            return ask

        cycles = 0
        for i, worker in enumerate(self.workers):
            cycles += worker.schedule(now, checkpoints_of(i))
            self._collect(i, now)
        return cycles

    def _dispatch(self, entry: Dispatched, now: float) -> None:
        asking = self.settings.dispatcher == "gpuplane"
        views = [
            worker.view(entry.job, now, self.expected_end)
            if asking
            else ClusterView(worker.name, worker.labels)
            for worker in self.workers
        ]
        if entry.first_nominated is None:
            entry.first_nominated = now
        nomination = nominate(
            self.settings.dispatcher,
            views,
            since_first_nomination_s=now - entry.first_nominated,
            cluster_selector=entry.selector,
            spill_order=self.settings.spill_order,
        )
        entry.reason = nomination.reason
        chosen = {self._index(name) for name in nomination.clusters}
        if self.settings.dispatcher == "gpuplane":
            for i in sorted(entry.copies - chosen):
                self._drop(entry, i, now)  # a waiting copy moves to the better worker
            entry.next_look = now + self.settings.redispatch_seconds if chosen else math.inf
        elif nomination.next_round_in_seconds is not None:
            # Kueue starts the next round once one has lasted more than 5 minutes: a second later.
            entry.next_look = now + nomination.next_round_in_seconds + 1.0
        else:
            entry.next_look = math.inf
        for i in sorted(chosen - entry.copies):
            entry.copies.add(i)
            entry.ever.add(i)
            self.workers[i].submit(entry.job, now)
        if math.isfinite(entry.next_look):
            self.wakes.append(entry.next_look)
            heapq.heappush(self.looks, (entry.next_look, entry.job.id))

    def _index(self, name: str) -> int:
        return next(i for i, w in enumerate(self.workers) if w.name == name)

    def _drop(self, entry: Dispatched, i: int, now: float) -> None:
        """Delete worker ``i``'s copy (or, for the winner, let the workload go)."""
        entry.copies.discard(i)
        since = entry.held.pop(i, None)
        if since is not None:
            self._count_held(entry, since, now)
        self.workers[i].release(entry.job, now)
        self._collect(i, now)

    def _count_held(self, entry: Dispatched, since: float, now: float) -> None:
        """A losing copy held its GPUs from ``since`` to ``now`` (counted from the window's start)."""
        counted = now - max(since, 0.0)
        if counted > 0:
            per_pod, _ = self.allocation(entry.job)
            self.costs.held_gpu_seconds += per_pod * entry.job.pods * counted

    def _collect(self, i: int, now: float) -> None:
        """Worker ``i``'s changes: the winner's go to the engine; a first start makes a winner;
        a losing copy's are its cancelled start and nothing else."""
        worker = self.workers[i]
        self._note_preemptions(i, now)
        for change in worker.take_changes():
            entry = self.dispatched[change.job]
            if entry.winner == i:
                self.changes.append(change)
            elif entry.winner is None:
                if change.kind == HOLD:
                    self.stash[(i, change.job)] = change
                elif change.kind == START:
                    held = self.stash.pop((i, change.job), None)
                    self._win(entry, i, now)
                    if held is not None:
                        self.changes.append(held)
                    self.changes.append(change)
            else:
                self._lost_copy(entry, i, change, now)

    def _note_preemptions(self, i: int, now: float) -> None:
        """The preemptions worker ``i`` decided: which workload's copy started each."""
        worker = self.workers[i]
        for victim, preemptor in worker.take_preemptions():
            by = worker.jobs.get(preemptor)
            if by is None:
                continue
            entry = self.dispatched[by.id]
            if now >= 0:
                entry.victims[i] = entry.victims.get(i, 0) + 1
            self.victim_of[victim] = (entry, i)

    def _lost_copy(self, entry: Dispatched, i: int, change: Change, now: float) -> None:
        """A change of worker ``i``'s copy of a workload another worker won: a start is a
        cancelled start (the copy holds its GPUs until it is deleted); a stop ends that hold."""
        if change.kind == START:
            entry.held[i] = now
            self.workers[i].end_override[change.job] = now + self.settings.delete_seconds
            if now >= 0:
                self.costs.cancelled_starts += 1
        elif change.kind == STOP:
            self.victim_of.pop(change.job, None)
            since = entry.held.pop(i, None)
            if since is not None:
                self._count_held(entry, since, now)

    def _win(self, entry: Dispatched, i: int, now: float) -> None:
        entry.winner = i
        self.undecided.pop(entry.job.id, None)
        for w, job_id in [k for k in self.stash if k[1] == entry.job.id]:
            del self.stash[(w, job_id)]
        at = now + self.settings.delete_seconds
        for other in sorted(entry.copies - {i}):
            heapq.heappush(self.deletions, (at, other, entry.job.id))
            self.wakes.append(at)

    def stopped(self, job_id: int, lost_gpu_seconds: float) -> None:
        """The engine stopped ``job_id``'s run, losing that much work: charged to the copy that
        preempted it, if one did."""
        source = self.victim_of.pop(job_id, None)
        if source is not None:
            entry, i = source
            entry.lost[i] = entry.lost.get(i, 0.0) + lost_gpu_seconds

    def take_changes(self) -> list[Change]:
        out, self.changes = self.changes, []
        return out

    # --- views for the engine -------------------------------------------------------------------

    def allocation(self, job: Job) -> tuple[float, float]:
        return self.workers[0].allocation(job)

    def priority(self, job: Job) -> int:
        return self.workers[0].priority(job)

    def pools_of(self, job: Job) -> tuple[str, ...]:
        if job.request.mig is not None and not self.options.sharing:
            return self.cluster.whole_gpu_pools(job.pools)
        return job.pools

    def eta_capacity(self) -> Capacity | None:
        return None  # ETAs per workload are each worker's; the fleet gives none here

    def whole_nodes(self, job: Job) -> None:
        """Not given: the fleet gives no ETA (see :meth:`eta_capacity`)."""

    def quota_blocked(self) -> float:
        """GPU-equivalents blocked on quota in the workers, divided by the mean number of copies
        of a waiting workload (a workload waits once, however many copies it has)."""
        return sum(worker.quota_blocked() for worker in self.workers) / max(1.0, self._copies_per_waiting())

    def _copies_per_waiting(self) -> float:
        waiting = [len(e.copies) for e in self.undecided.values() if e.copies]
        return sum(waiting) / len(waiting) if waiting else 1.0

    def node_gpus(self, node: str) -> int:
        return self.gpus_of[node]

    def wake_ups(self) -> list[float]:
        out, self.wakes = self.wakes, []
        for worker in self.workers:
            out += worker.wake_ups()
        return out

    @property
    def livelocks(self) -> int:
        return sum(worker.livelocks for worker in self.workers)

    def reason_of(self, job: Job) -> str:
        """The last nomination's reason for ``job`` ("" before its first)."""
        entry = self.dispatched.get(job.id)
        return "" if entry is None else entry.reason


class MultiClusterEngine(Engine):
    """The simulator's engine over a :class:`MultiClusterModel`: it also tells the model how much
    work each stopped run lost, and lends it the runs' expected ends (for the gpuplane
    dispatcher's start estimates). Owns nothing beyond :class:`Engine`'s state."""

    model: MultiClusterModel

    def __init__(
        self,
        model: MultiClusterModel,
        workloads: Workloads,
        gpus: int,
        reaper_idle: float,
        *,
        progress: ProgressCallback | None = None,
    ) -> None:
        super().__init__(model, workloads, gpus, reaper_idle, progress=progress)
        runs = self.runs

        def expected_end(job_id: int) -> float | None:
            run = runs.get(job_id)
            return None if run is None or run.running_since is None else run.expected_end

        model.expected_end = expected_end

    def stop(self, run: JobRun, reason: str, now: float) -> None:
        before = run.stats.lost
        super().stop(run, reason, now)
        self.model.stopped(run.job.id, run.stats.lost - before)
