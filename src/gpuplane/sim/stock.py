"""Stock Kubernetes as a simulated configuration: kube-scheduler, ResourceQuota, a Job controller.

A model of its own, deliberately simple, that shares nothing with gpuplane's core:

* **Devices**: whole GPUs only (``nvidia.com/gpu``). A fraction or MIG request takes one whole GPU;
  MIG-capable GPUs run with MIG disabled, the GPU Operator default (domain-facts §1.3).
* **Quota**: one ResourceQuota per namespace (team) on ``requests.nvidia.com/gpu``: the team's
  floor share of all GPUs, hard, no borrowing. Quota is checked when a pod is *created*: the Job
  controller creates a job's pods while the quota allows and retries the rest later, and a created
  pod holds quota whether it runs or not.
* **Scheduling**: pods one at a time, oldest first (no priority classes are defined, so there is
  no preemption), on the core's placement engine (:mod:`gpuplane.core.placement.engine`) over a
  GPU inventory of the nodes. Filter: the node is up, in one of the pod's pools, with enough free
  GPUs (and CPU/memory when modelled). Score: the engine's ``least-allocated`` profile, the
  Kubernetes default ``NodeResourcesFit`` strategy: over CPU and memory when the pod asks for
  them, else over GPUs (assumed: without CPU figures, GPU requests stand in for them). Ties go to
  the first node by name; the pod takes the lowest-index free GPUs. A pod that fits nowhere waits
  and is tried again after capacity is freed. ``packed=True`` uses the ``most-allocated``
  profile instead, the bin-packing setting GPU clusters often switch to.
* **No gangs**: a job computes only when all its pods run. Until then its placed pods hold their
  GPUs and do nothing: a *partly placed gang*. When partly placed gangs hold so much that no order
  of completions lets some of them finish placing (a banker's-algorithm check on GPUs per node and
  quota per namespace), they are in a **circular deadlock**; after ``deadlock_timeout`` such a job is
  deleted and resubmitted by its owner (assumed), so the cluster does not freeze for ever.
* **Node failure**: pods on the node are lost and recreated by their controller; a gang stops
  computing until all its pods run again.
* No idle reaper, no backfill tier.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpuplane.core.pod_engine import (
    MILLI_PER_GPU,
    GpuArrays,
    GpuRequest,
    NodeSpec,
    feasible_nodes,
    get_profile,
    pick_node,
    score_nodes,
)
from gpuplane.insight.eta import Capacity
from gpuplane.sim.cluster import ClusterSpec
from gpuplane.sim.engine import DEADLOCK, HOLD, NODE_FAILURE, RESTART, START, STOP, Change
from gpuplane.sim.workloads import Job

IntArray = np.ndarray[Any, np.dtype[np.int64]]
BoolArray = np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(slots=True, eq=False)
class _Pod:
    job: _StockJob
    alive: bool = True


@dataclass(slots=True, eq=False)
class _StockJob:
    job: Job
    gpus: int  # whole GPUs per pod
    cpu: int
    memory: int
    mask: BoolArray
    uncreated: int
    request: GpuRequest  # what one pod asks of the inventory (CPU and memory when modelled)
    created: int = 0
    bound: list[int] = field(default_factory=list)  # node index of each bound pod
    devices: list[tuple[int, ...]] = field(default_factory=list)  # its GPUs, aligned with bound
    running: bool = False
    deadlocked_since: float | None = None
    queued: list[_Pod] = field(default_factory=list)  # created, not yet bound

    @property
    def held(self) -> int:
        return self.gpus * len(self.bound)


class StockModel:
    """Stock Kubernetes (see the module docstring)."""

    reaper = False

    def __init__(
        self, cluster: ClusterSpec, deadlock_timeout: float, packed: bool = False, name: str = "stock"
    ) -> None:
        self.name = name
        self.packed = packed
        self.cluster = cluster
        nodes = sorted(cluster.nodes, key=lambda n: n.name)
        self.node_index = {n.name: i for i, n in enumerate(nodes)}
        self.node_pool = [n.pool for n in nodes]
        self.pool_ids = {p: i for i, p in enumerate(cluster.pools)}
        self.pool_of: IntArray = np.asarray([self.pool_ids[n.pool] for n in nodes], dtype=np.int64)
        self.gpu_total: IntArray = np.asarray([n.gpus for n in nodes], dtype=np.int64)
        # No pod limit in this model; CPU and memory count only when the cluster models them.
        self.inventory = GpuArrays(
            [NodeSpec(n.name, n.cpu_milli, n.memory_mib, n.gpus, max_pods=1 << 40) for n in nodes]
        )
        self.profile = get_profile("most-allocated" if packed else "least-allocated")
        self.up: BoolArray = np.ones(len(nodes), dtype=bool)
        self._up_masks: dict[int, BoolArray] = {}  # by id of a pool mask (cached in _mask)
        self.models_cpu = cluster.models_cpu
        self.quota = {team: float(q) for team, q in cluster.team_gpus().items()}
        self.hard = cluster.team_gpus()
        self.used = dict.fromkeys(self.hard, 0)
        self.deadlock_timeout = deadlock_timeout
        self.jobs: dict[int, _StockJob] = {}
        self.gangs: dict[int, _StockJob] = {}
        self.uncreated_gpus = 0
        self.waiting_creation: dict[str, list[_StockJob]] = {team: [] for team in self.hard}
        self.pending: list[_Pod] = []
        self.first_new = 0  # pods before this index were tried since capacity last changed
        self.freed = False
        self.dirty = False
        self.masks: dict[tuple[str, ...], BoolArray] = {}
        self.pool_capacity = {p: float(cluster.pool_gpus(p)) for p in cluster.pools}
        self.all_pools = frozenset(cluster.pools)
        self.changes: list[Change] = []
        self._wakes: list[float] = []
        self.due: float | None = None  # earliest deadlock timeout to act on

    @property
    def gpu_free(self) -> IntArray:
        """Free whole GPUs per node (node order by name)."""
        return self.inventory.full_gpus

    # --- what happened ---------------------------------------------------------------------

    def pools_of(self, job: Job) -> tuple[str, ...]:
        """A MIG request runs on a whole GPU of the same model: MIG is off."""
        if job.request.mig is not None:
            return self.cluster.whole_gpu_pools(job.pools)
        return job.pools

    def _mask(self, pools: tuple[str, ...]) -> BoolArray:
        mask = self.masks.get(pools)
        if mask is None:
            ids = [self.pool_ids[p] for p in pools]
            mask = np.isin(self.pool_of, ids)
            self.masks[pools] = mask
        return mask

    def submit(self, job: Job, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        request = job.request
        cpu, memory = (request.cpu_milli, request.memory_mib) if self.models_cpu else (0, 0)
        stock_job = _StockJob(
            job=job,
            gpus=request.whole,
            cpu=request.cpu_milli,
            memory=request.memory_mib,
            mask=self._mask(self.pools_of(job)),
            uncreated=job.pods,
            request=GpuRequest(
                cpu=cpu, memory=memory, gpus=request.whole, gpu_milli=MILLI_PER_GPU if request.whole else 0
            ),
        )
        self.jobs[job.id] = stock_job
        self.waiting_creation[job.team].append(stock_job)
        self.uncreated_gpus += stock_job.uncreated * stock_job.gpus
        if job.pods > 1:
            self.gangs[job.id] = stock_job
        self.dirty = True

    def release(self, job: Job, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        sj = self.jobs.pop(job.id, None)
        self.gangs.pop(job.id, None)
        if sj is None:
            return
        self._delete_pods(sj)
        self.dirty = True

    def _delete_pods(self, sj: _StockJob) -> None:
        """Delete every pod of a job: unbind, give back quota, forget the queued ones."""
        if sj.bound:
            for node, gpus in zip(sj.bound, sj.devices, strict=True):
                self._unbind(sj, node, gpus)
            sj.bound = []
            sj.devices = []
            self.changes.append(Change(HOLD, sj.job.id, 0.0))
        if sj.deadlocked_since is not None:
            sj.deadlocked_since = None
            self.changes.append(Change(DEADLOCK, sj.job.id, 0.0))
        for pod in sj.queued:
            pod.alive = False
        sj.queued = []
        self.used[sj.job.team] -= sj.gpus * sj.created
        sj.created = 0
        sj.running = False
        if sj.uncreated:
            queue = self.waiting_creation[sj.job.team]
            if sj in queue:
                queue.remove(sj)
            self.uncreated_gpus -= sj.uncreated * sj.gpus
        sj.uncreated = 0
        self.freed = True

    def _unbind(self, sj: _StockJob, node: int, gpus: tuple[int, ...]) -> None:
        self.inventory.uncommit(node, sj.request, gpus)
        self.freed = True

    def node_down(self, node: str, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        n = self.node_index[node]
        self.up[n] = False
        self._up_masks.clear()
        for sj in self.jobs.values():
            if n not in sj.bound:
                continue
            lost = [gpus for b, gpus in zip(sj.bound, sj.devices, strict=True) if b == n]
            kept = [(b, gpus) for b, gpus in zip(sj.bound, sj.devices, strict=True) if b != n]
            sj.bound = [b for b, _ in kept]
            sj.devices = [gpus for _, gpus in kept]
            for gpus in lost:
                self._unbind(sj, n, gpus)
                # The controller recreates the pod; it keeps its quota.
                self._queue(sj)
            if sj.running:
                sj.running = False
                self.changes.append(Change(STOP, sj.job.id, text=NODE_FAILURE))
            self.changes.append(Change(HOLD, sj.job.id, float(sj.held)))
        self.dirty = True

    def node_up(self, node: str, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        self.up[self.node_index[node]] = True
        self._up_masks.clear()
        self.freed = True
        self.dirty = True

    # --- scheduling -------------------------------------------------------------------------

    def schedule(
        self,
        now: float,
        checkpoints: Callable[[], Iterable[tuple[Job, float]]],  # noqa: ARG002 - stock knows no checkpoints
    ) -> int:
        due = self.due is not None and now >= self.due
        if not self.dirty and not due:
            return 0
        self.due = None
        passes = 0
        while True:
            passes += 1
            self._create_pods()
            self._bind_pending()
            if not self._resolve_deadlocks(now):
                break
        self.dirty = False
        return passes

    def _create_pods(self) -> None:
        """The Job controller: create pods while the namespace quota allows, oldest job first."""
        for team, queue in self.waiting_creation.items():
            hard = self.hard[team]
            if not queue or self.used[team] >= hard:
                continue
            kept = []
            for i, sj in enumerate(queue):
                if self.used[team] >= hard:
                    kept += queue[i:]
                    break
                while sj.uncreated and self.used[team] + sj.gpus <= hard:
                    self.used[team] += sj.gpus
                    self.uncreated_gpus -= sj.gpus
                    sj.uncreated -= 1
                    sj.created += 1
                    self._queue(sj)
                if sj.uncreated:
                    kept.append(sj)
            queue[:] = kept

    def _queue(self, sj: _StockJob) -> None:
        pod = _Pod(sj)
        sj.queued.append(pod)
        self.pending.append(pod)

    def _bind_pending(self) -> None:
        """kube-scheduler: one pod at a time, oldest first; filter, then LeastAllocated.

        Binding only takes capacity away, so within one pass a request that fitted nowhere keeps
        fitting nowhere: later pods with the same request are skipped without looking again.
        """
        start = 0 if self.freed else self.first_new
        self.freed = False
        pending = self.pending
        failed: set[tuple[int, int, int, int]] = set()
        for i in range(start, len(pending)):
            pod = pending[i]
            if not pod.alive:
                continue
            sj = pod.job
            signature = (id(sj.mask), sj.gpus, sj.cpu, sj.memory)
            if signature in failed:
                continue
            node = self._pick(sj)
            if node < 0:
                failed.add(signature)
                continue
            pod.alive = False
            sj.queued.remove(pod)
            self._bind(sj, node)
        if len(pending) > 64 and sum(1 for p in pending if p.alive) * 2 < len(pending):
            self.pending = [p for p in pending if p.alive]
        self.first_new = len(self.pending)

    def _pick(self, sj: _StockJob) -> int:
        """The engine's filter (pool, node up, free resources) and the profile's score."""
        among = self._up_masks.get(id(sj.mask))
        if among is None:  # the job's pools' nodes that are up (kept until a node goes or comes)
            among = self._up_masks[id(sj.mask)] = sj.mask & self.up
        candidates = feasible_nodes(self.profile, self.inventory, sj.request, among=among)
        if len(candidates) == 0:
            return -1
        if len(candidates) == 1:
            return int(candidates[0])
        scores = score_nodes(self.profile, self.inventory, sj.request, candidates)
        return pick_node(scores, candidates, None)  # ties: the first node by name

    def _bind(self, sj: _StockJob, node: int) -> None:
        self._bind_pod(sj, node)
        if len(sj.bound) == sj.job.pods:
            self._start_job(sj)

    def _bind_pod(self, sj: _StockJob, node: int) -> None:
        """Bind one pod of ``sj`` to ``node``: its devices are taken and held."""
        gpus = self.profile.reserve.choose_gpus(self.inventory, sj.request, node)
        self.inventory.commit(node, sj.request, gpus)  # the engine's filter passed it
        sj.bound.append(node)
        sj.devices.append(gpus)
        self.changes.append(Change(HOLD, sj.job.id, float(sj.held)))

    def _start_job(self, sj: _StockJob) -> None:
        """Every pod of ``sj`` is bound and runs: the job starts."""
        sj.running = True
        if sj.deadlocked_since is not None:
            sj.deadlocked_since = None
            self.changes.append(Change(DEADLOCK, sj.job.id, 0.0))
        self.changes.append(Change(START, sj.job.id, text=self.node_pool[sj.bound[0]]))

    # --- deadlocks ---------------------------------------------------------------------------

    def _resolve_deadlocks(self, now: float) -> bool:
        """Flag gangs in circular deadlock; restart those stuck past the timeout.

        Returns whether anything was restarted (then the pass runs again).
        """
        partial = [sj for sj in self.gangs.values() if not sj.running and sj.created]
        if not partial:
            return False
        stuck = self._circular(partial)
        restarted = False
        for sj in partial:
            if sj.job.id in stuck:
                if sj.deadlocked_since is None:
                    sj.deadlocked_since = now
                    self.changes.append(Change(DEADLOCK, sj.job.id, 1.0))
                if now - sj.deadlocked_since >= self.deadlock_timeout:
                    self._restart(sj)
                    restarted = True
                else:
                    deadline = sj.deadlocked_since + self.deadlock_timeout
                    self._wakes.append(deadline)
                    self.due = deadline if self.due is None else min(self.due, deadline)
            elif sj.deadlocked_since is not None:
                sj.deadlocked_since = None
                self.changes.append(Change(DEADLOCK, sj.job.id, 0.0))
        return restarted

    def _circular(self, partial: list[_StockJob]) -> set[int]:
        """Partly placed gangs that no order of completions can let finish placing.

        Everything that runs, or waits without holding anything, is assumed to finish and give
        back what it holds; a partial gang that can then be completed (pods on nodes with room,
        uncreated pods within the quota) finishes too and gives back its share.
        """
        free = (self.gpu_total * self.up).copy()
        quota_free = dict(self.hard)
        for sj in partial:
            for node in sj.bound:
                free[node] -= sj.gpus
            quota_free[sj.job.team] -= sj.gpus * sj.created
        unresolved = {sj.job.id: sj for sj in partial}
        progress = True
        while progress and unresolved:
            progress = False
            for jid, sj in list(unresolved.items()):
                missing = sj.job.pods - len(sj.bound)
                if sj.uncreated * sj.gpus > quota_free[sj.job.team]:
                    continue
                if missing > 0 and not self._room_for(free, sj, missing):
                    continue
                for node in sj.bound:
                    free[node] += sj.gpus
                quota_free[sj.job.team] += sj.gpus * sj.created
                del unresolved[jid]
                progress = True
        return set(unresolved)

    @staticmethod
    def _room_for(free: IntArray, sj: _StockJob, missing: int) -> bool:
        """Whether ``missing`` more pods of ``sj`` fit on its nodes' ``free`` GPUs, pods packed
        first fit: a node holds as many pods as whole multiples of a pod's GPUs it has free."""
        gpus = sj.gpus
        if gpus <= 0:
            return bool(np.any(sj.mask & (free >= gpus)))
        held = np.maximum(free[sj.mask], 0) // gpus
        return int(held.sum()) >= missing

    def _restart(self, sj: _StockJob) -> None:
        """The owner deletes the stuck job and submits it again."""
        job = sj.job
        self._delete_pods(sj)
        self.changes.append(Change(RESTART, job.id))
        sj.uncreated = job.pods
        self.uncreated_gpus += sj.uncreated * sj.gpus
        self.waiting_creation[job.team].append(sj)

    # --- views for the engine ---------------------------------------------------------------

    def take_changes(self) -> list[Change]:
        out, self.changes = self.changes, []
        return out

    def allocation(self, job: Job) -> tuple[float, float]:
        return float(job.request.whole), job.activity

    def priority(self, job: Job) -> int:  # noqa: ARG002 - no PriorityClass is defined
        return 0

    def eta_capacity(self) -> Capacity:
        """Pools and the namespace quotas (hard, over every pool); nothing is preempted."""
        return Capacity(dict(self.pool_capacity), queue_limit=dict(self.quota), preemption=False)

    def whole_nodes(self, job: Job) -> None:
        """Not modelled: stock's pods wait on their namespace quota, and a job's pods are placed
        one by one, not as a gang."""

    def quota_blocked(self) -> float:
        """GPUs of pods the Job controller cannot create because of the namespace quota."""
        return float(self.uncreated_gpus)

    def node_gpus(self, node: str) -> int:
        return int(self.gpu_total[self.node_index[node]])

    def wake_ups(self) -> list[float]:
        out, self._wakes = self._wakes, []
        return out
