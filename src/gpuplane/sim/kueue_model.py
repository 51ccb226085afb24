"""Kueue in front of kube-scheduler, the peer most gpuplane users would run instead.

Two layers, as on a real cluster::

    arrival -> Kueue (the core in quota-only mode: no nodes, so admission never looks at them)
                 admits a workload to one flavor (pool) when its ClusterQueue's quota allows:
                 nominal quota per flavor, borrowing in one cohort, reclaim and priority preemption
            -> the Job controller creates every pod at once (the workload holds quota whether its
               pods run or not), with the flavor's node selector
            -> kube-scheduler binds pods one at a time (the stock model's binding, LeastAllocated)

* **Admission** is the real core with the :class:`~gpuplane.core.session.Session` given no nodes:
  that is Kueue's own behaviour (quota only, no placement). The queues are gpuplane's (a ClusterQueue
  per team with its floor share of each flavor as nominal quota, one cohort, borrowing, reclaim
  with ``reclaimWithinCohort: Any``, a low-priority backfill tier preempted while borrowing), the
  features Kueue has. Whole GPUs only: no fractions, MIG off (the GPU Operator's default). No
  fair sharing (Kueue's default), no checkpoint-aware victim order and no reaper (gpuplane's own).
* **Binding** is :class:`~gpuplane.sim.stock.StockModel`'s kube-scheduler with no namespace quota:
  an admitted gang's pods are created together and bound one by one, so a gang that quota admits
  can sit partly bound on nodes that cannot hold it (kueue #407). These are counted:
  ``admittedUnplaceableGangs`` (admitted gangs whose pods were not all bound in the pass that
  admitted them), ``admittedPartlyBoundGangs`` (of those, the ones left holding some of their
  nodes) and ``admittedGangsNoNodeSetHolds`` (admitted gangs that no set of their flavor's nodes
  could hold even empty).
* **Stuck gangs**: ``waitForPodsReady`` is off (Kueue's default). A gang whose partial placement is
  a circular deadlock (the stock model's check) is evicted and queued again after
  ``deadlockTimeout``, as its owner would delete and resubmit it; it keeps its place in the queue.
* **Node failure**: the pods on the node are recreated by their controller; the workload stays
  admitted and holds its quota.

``kueue-timeslicing`` adds the NVIDIA device plugin's time-slicing on the inference and notebook
nodes (the pools that fraction or MIG requests may use and no multi-GPU or multi-pod work does),
as its users configure it:

* each GPU is advertised as ``replicas`` devices, per pool the most (at most 4, the plugin's
  documented example) whose share of a GPU's memory holds the pool's most common fraction or MIG
  request (:func:`replicas_fitting_memory`);
* a request for whole GPUs may take replicas there too (``nvidia.com/gpu``, the plugin's default;
  ``whole_gpus_shared=False`` models ``renameByDefault`` instead, where the replicas are
  ``nvidia.com/gpu.shared`` and such a request goes to the job's other pools);
* a pod asking for ``n`` shared GPUs gets ``n`` replicas, Kueue's quota on those flavors is counted
  in replicas (a team's floor share times ``replicas``), and nothing isolates memory or accounts
  for who uses what. Replicas are spread over a node's GPUs (replica ``r`` is GPU ``r mod gpus``,
  the kindest layout).

A pod is taken to use its request's share of the GPU's memory (a whole-GPU request all of it, a
fraction its share, a MIG profile its slices). A bind where the GPU's running pods leave too little
is a ``memoryOvercommits``: nobody notices at binding, the pod's allocation fails, and it
crash-loops on its replicas, holding them, until the running pods free enough memory. The
kubelet restarts it with its back-off (10 s, doubled after each failed start, at most 5 minutes:
:func:`next_restart`), so it runs at its first restart after the memory is free, if the memory is
still free then; its job starts then. Left out, in the peer's favour: the slowdown of pods that
share a GPU's compute.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gpuplane.core.pod_engine import MILLI_PER_GPU, GpuRequest
from gpuplane.core.session import AdmissionDecision, PreemptionDecision, Reason
from gpuplane.insight.eta import Capacity
from gpuplane.model.objects import ClusterQueue, ClusterState, FlavorQuotas, ResourceGroup, ResourceQuota
from gpuplane.sim.cluster import ClusterSpec
from gpuplane.sim.engine import HOLD, PREEMPTED, RESTART, STOP, Change
from gpuplane.sim.gpuplane_model import GPU, GPU_MILLI, GpuplaneModel, GpuplaneOptions
from gpuplane.sim.stock import StockModel, _StockJob
from gpuplane.sim.workloads import MILLI, Job

TIME_SLICING_REPLICAS = 4  # the NVIDIA device plugin's documented time-slicing example
KUEUE_OPTIONS = GpuplaneOptions(sharing=False, reaper=False, checkpoint_aware=False)
UNBOUNDED = 1 << 40
BACKOFF_FIRST = 10.0  # s: the kubelet's first restart of a crashed container comes after this
BACKOFF_MAX = 300.0  # s: each later one after twice the last delay, at most this


def next_restart(since: float, at: float) -> float:
    """The kubelet's first restart at or after ``at`` of a container that has crash-looped since
    ``since``: restarts come 10 s after the first failure, then after delays that double, each at
    most 5 minutes (``CrashLoopBackOff``)."""
    elapsed = at - since
    offset = step = BACKOFF_FIRST
    while offset < elapsed:
        step = min(2.0 * step, BACKOFF_MAX)
        if step == BACKOFF_MAX:
            offset += math.ceil((elapsed - offset) / step) * step
            break
        offset += step
    return since + offset


@dataclass(slots=True, eq=False)
class _Loop:
    """A pod bound where its GPU's memory was short: crash-looping since ``since``; ``restart``:
    the restart at which it is to run, set once the memory it needs is free (else None)."""

    sj: _StockJob
    gpus: tuple[int, ...]
    since: float
    restart: float | None = None


def time_sliced_pools(jobs: Iterable[Job], pools: Iterable[str]) -> tuple[str, ...]:
    """The inference and notebook pools: some fraction or MIG request may use them, and no work
    with more than one GPU or more than one pod does."""
    shared: set[str] = set()
    big: set[str] = set()
    for job in jobs:
        if job.request.fraction_milli or job.request.mig is not None:
            shared.update(job.pools)
        if job.pods > 1 or job.request.gpus > 1:
            big.update(job.pools)
    return tuple(p for p in pools if p in shared and p not in big)


def replicas_fitting_memory(jobs: Iterable[Job], pools: Iterable[str]) -> dict[str, int]:
    """Per pool, the replicas per GPU that its users would set: the most (at most
    :data:`TIME_SLICING_REPLICAS`) whose share of a GPU's memory holds the pool's most common
    fraction or MIG request (the larger share on a tie). Those pods never over-commit a GPU;
    larger ones beside them may."""
    counts: dict[str, Counter[float]] = {pool: Counter() for pool in pools}
    for job in jobs:
        request = job.request
        if request.fraction_milli or request.mig is not None:
            for pool in job.pools:
                if pool in counts:
                    counts[pool][_memory_share(job)] += 1
    out = {}
    for pool, shares in counts.items():
        share = max(shares.items(), key=lambda item: (item[1], item[0]))[0] if shares else 0.0
        fit = int(1 / share + 1e-9) if share > 0 else TIME_SLICING_REPLICAS
        out[pool] = max(1, min(TIME_SLICING_REPLICAS, fit))
    return out


class _KueueAdmission(GpuplaneModel):
    """Kueue's admission: the core with no nodes. Owns the admissions and preemptions of the last
    pass (``admitted_now``, ``preempted_now``) for the binding layer to carry out."""

    def __init__(  # noqa: PLR0913 - the configuration's settings
        self,
        name: str,
        cluster: ClusterSpec,
        start: float,
        grace: float,
        replicas: Mapping[str, int],
        *,
        whole_gpus_shared: bool = True,
    ) -> None:
        self.replicas = dict(replicas)
        self.whole_gpus_shared = whole_gpus_shared
        self.admitted_now: list[tuple[Job, str]] = []
        self.preempted_now: list[Job] = []
        super().__init__(name, cluster, KUEUE_OPTIONS, start, grace=grace)

    def _state(self) -> ClusterState:
        state = super()._state()
        queues = {name: self._in_replicas(cq) for name, cq in state.cluster_queues.items()}
        return replace(state, cluster_queues=queues, nodes=())

    def _in_replicas(self, cq: ClusterQueue) -> ClusterQueue:
        """Quota on a time-sliced flavor counts replicas: every GPU figure times ``replicas``."""
        if not self.replicas:
            return cq
        groups = []
        for group in cq.resource_groups:
            flavors = []
            for fq in group.flavors:
                n = self.replicas.get(fq.name, 1)
                resources = {
                    res: ResourceQuota(
                        q.nominal * n,
                        None if q.borrowing_limit is None else q.borrowing_limit * n,
                        None if q.lending_limit is None else q.lending_limit * n,
                    )
                    if res in (GPU, GPU_MILLI) and n > 1
                    else q
                    for res, q in fq.resources.items()
                }
                flavors.append(FlavorQuotas(fq.name, resources))
            groups.append(ResourceGroup(group.covered_resources, tuple(flavors)))
        return replace(cq, resource_groups=tuple(groups))

    def _admitted(self, decision: AdmissionDecision) -> None:
        job = self.jobs[decision.workload]
        self.placed[decision.workload] = ()
        pool = next(iter(decision.pod_sets[0].flavors.values()), "") if decision.pod_sets else ""
        self.admitted_now.append((job, pool or job.pools[0]))

    def _preempted(self, decision: PreemptionDecision) -> None:
        self.placed.pop(decision.workload, None)
        self.preempted_now.append(self.jobs[decision.workload])

    def pools_of(self, job: Job) -> tuple[str, ...]:
        """With ``whole_gpus_shared`` off (the device plugin's ``renameByDefault``), a time-sliced
        node advertises ``nvidia.com/gpu.shared``: a request for whole GPUs no longer lands on a
        replica there, only on the job's other pools (all of them if it has no other)."""
        pools = super().pools_of(job)
        if self.whole_gpus_shared or not self.replicas or not job.request.gpus:
            return pools
        whole = tuple(p for p in pools if p not in self.replicas)
        return whole or pools

    def requeue(self, job: Job, now: float) -> None:
        """The stuck workload is evicted and queued again (its quota freed)."""
        key = self.key(job)
        if self.session.evict(key, now, Reason.PODS_READY_TIMEOUT):
            self.placed.pop(key, None)
            self.dirty = True


class _KueueBinder(StockModel):
    """kube-scheduler behind Kueue: no namespace quota, an admitted job's pods limited to its flavor.

    Owns, beyond the stock model's state, the jobs stuck past the deadlock timeout that Kueue must
    queue again (``requeued``) and, on time-sliced nodes, the memory each physical GPU's pods use
    (``memory``) with the over-commits counted so far.
    """

    def __init__(self, cluster: ClusterSpec, deadlock_timeout: float, name: str, physical: Mapping[str, int]):
        super().__init__(cluster, deadlock_timeout, packed=False, name=name)
        self.hard = dict.fromkeys(self.hard, UNBOUNDED)
        self.used = dict.fromkeys(self.hard, 0)
        self.requeued: list[Job] = []
        # Physical GPUs per node index, for the nodes whose devices are time-sliced replicas.
        self.physical = {self.node_index[n]: g for n, g in physical.items()}
        # Memory that running pods use, per physical GPU (node index, GPU).
        self.memory: dict[tuple[int, int], float] = {}
        # Pods bound where their GPU's memory was short, per node, oldest first: each pod's CUDA
        # allocation fails, and the kubelet restarts it in place until the memory is free.
        self.looping: dict[int, list[_Loop]] = {}
        self.looping_pods: dict[int, int] = {}  # per job id: its pods in ``looping``
        self.restarts: list[tuple[float, int]] = []  # (time, node) of restarts due, a heap
        self.clock = 0.0  # the time of what the model is doing now
        self.overcommits = 0
        self.overcommitted_jobs: set[int] = set()
        self.counting = False  # over-commits count inside the measured window only

    def admit(self, job: Job, pool: str) -> _StockJob:
        request = job.request
        whole = request.whole
        cpu, memory = (request.cpu_milli, request.memory_mib) if self.models_cpu else (0, 0)
        sj = _StockJob(
            job=job,
            gpus=whole,
            cpu=request.cpu_milli,
            memory=request.memory_mib,
            mask=self._mask((pool,)),
            uncreated=job.pods,
            request=self._request(cpu, memory, whole),
        )
        self.jobs[job.id] = sj
        self.waiting_creation[job.team].append(sj)
        self.uncreated_gpus += sj.uncreated * sj.gpus
        if job.pods > 1:
            self.gangs[job.id] = sj
        self.dirty = True
        return sj

    @staticmethod
    def _request(cpu: int, memory: int, whole: int) -> GpuRequest:
        return GpuRequest(cpu=cpu, memory=memory, gpus=whole, gpu_milli=MILLI_PER_GPU if whole else 0)

    def evict(self, job: Job) -> None:
        """Kueue preempted the workload: its pods are deleted."""
        sj = self.jobs.pop(job.id, None)
        self.gangs.pop(job.id, None)
        if sj is None:
            return
        running = sj.running
        self._delete_pods(sj)
        if running:
            self.changes.append(Change(STOP, job.id, text=PREEMPTED))
        self.dirty = True

    def _restart(self, sj: _StockJob) -> None:
        """Stuck past the timeout: the pods go, and Kueue queues the workload again."""
        job = sj.job
        self.jobs.pop(job.id, None)
        self.gangs.pop(job.id, None)
        self._delete_pods(sj)
        self.changes.append(Change(RESTART, job.id))
        self.requeued.append(job)

    def _bind(self, sj: _StockJob, node: int) -> None:
        """Bind a pod; on a time-sliced node, it runs only if its GPUs' memory holds it.

        Neither Kueue nor kube-scheduler sees memory there: the pod is bound to its replicas
        whatever the other pods on the same GPU use. If they leave too little, its allocation
        fails and it crash-loops in place, holding its replicas, until they free enough
        (:meth:`_revive`); its job starts then.
        """
        physical = self.physical.get(node)
        if physical is None:
            super()._bind(sj, node)
            return
        self._bind_pod(sj, node)
        gpus = sj.devices[-1]
        if self._memory_fits(sj, node, gpus, physical):
            self._use_memory(sj, node, gpus, physical, 1.0)
        else:
            self.looping.setdefault(node, []).append(_Loop(sj, gpus, self.clock))
            self.looping_pods[sj.job.id] = self.looping_pods.get(sj.job.id, 0) + 1
            if self.counting:
                self.overcommits += 1
                self.overcommitted_jobs.add(sj.job.id)
        if len(sj.bound) == sj.job.pods and not self.looping_pods.get(sj.job.id):
            self._start_job(sj)

    def _memory_fits(self, sj: _StockJob, node: int, gpus: tuple[int, ...], physical: int) -> bool:
        need = _memory_share(sj.job)
        memory = self.memory
        return all(memory.get((node, r % physical), 0.0) + need <= 1.0 + 1e-9 for r in gpus)

    def _use_memory(
        self, sj: _StockJob, node: int, gpus: tuple[int, ...], physical: int, sign: float
    ) -> None:
        """Add (``sign`` 1) or take back (-1) the pod's memory on each GPU of its replicas."""
        need = sign * _memory_share(sj.job)
        memory = self.memory
        for replica in gpus:
            key = (node, replica % physical)
            memory[key] = max(0.0, memory.get(key, 0.0) + need)

    def _unbind(self, sj: _StockJob, node: int, gpus: tuple[int, ...]) -> None:
        super()._unbind(sj, node, gpus)
        physical = self.physical.get(node)
        if physical is None:
            return
        loops = self.looping.get(node, [])
        loop = next((lp for lp in loops if lp.sj is sj and lp.gpus == gpus), None)
        if loop is not None:  # a crash-looping pod used no memory
            loops.remove(loop)
            self._loop_ended(sj)
            return
        self._use_memory(sj, node, gpus, physical, -1.0)
        self._revive(node, physical)

    def _revive(self, node: int, physical: int) -> None:
        """Memory was freed on ``node``: each crash-looping pod that now fits is to run at its next
        restart (:func:`next_restart`), if the memory is still free then (:meth:`restart_due`)."""
        loops = self.looping.get(node)
        if not loops or not self.up[node]:
            return
        for loop in loops:
            if loop.restart is None and self._memory_fits(loop.sj, node, loop.gpus, physical):
                loop.restart = next_restart(loop.since, self.clock)
                heapq.heappush(self.restarts, (loop.restart, node))
                self._wakes.append(loop.restart)

    def restart_due(self, now: float) -> None:
        """The restarts due by ``now``: a pod whose memory is free runs, oldest first (its job
        starts once none of its pods crash-loops); the others wait for memory to be freed again."""
        restarts = self.restarts
        nodes = set()
        while restarts and restarts[0][0] <= now:
            nodes.add(heapq.heappop(restarts)[1])
        for node in sorted(nodes):
            loops, physical = self.looping.get(node), self.physical[node]
            if not loops:
                continue
            kept = []
            for loop in loops:
                sj, gpus = loop.sj, loop.gpus
                if loop.restart is None or loop.restart > now:
                    kept.append(loop)
                    continue
                loop.restart = None
                if not self.up[node] or not self._memory_fits(sj, node, gpus, physical):
                    kept.append(loop)
                    continue
                self._use_memory(sj, node, gpus, physical, 1.0)
                if not self._loop_ended(sj) and len(sj.bound) == sj.job.pods:
                    self._start_job(sj)
            loops[:] = kept

    def _loop_ended(self, sj: _StockJob) -> int:
        """One pod of ``sj`` no longer crash-loops; returns how many still do."""
        left = self.looping_pods[sj.job.id] - 1
        if left:
            self.looping_pods[sj.job.id] = left
        else:
            del self.looping_pods[sj.job.id]
        return left

    def no_node_set_holds(self, sj: _StockJob) -> bool:
        """Whether the job's nodes could not hold all its pods even if every one were empty."""
        return not self._room_for(self.gpu_total.copy(), sj, sj.job.pods)


def _memory_share(job: Job) -> float:
    """Share of one GPU's memory a pod uses: all of it for a whole-GPU request, else its share."""
    request = job.request
    if request.gpus:
        return 1.0
    return min(1.0, request.milli / MILLI)


class KueueModel:
    """Kueue admission in front of kube-scheduler (see the module docstring). Owns the two layers
    (``admission``, ``binder``), the flavor each admitted job got (``pool_of_job``) and the
    counts of admitted gangs the nodes could not hold."""

    reaper = False

    def __init__(  # noqa: PLR0913 - the configuration's settings
        self,
        name: str,
        cluster: ClusterSpec,
        deadlock_timeout: float,
        start: float,
        *,
        grace: float = 30.0,
        time_sliced: Iterable[str] = (),
        replicas: int | Mapping[str, int] = TIME_SLICING_REPLICAS,
        whole_gpus_shared: bool = True,
    ) -> None:
        if isinstance(replicas, int) and replicas < 1:
            raise ValueError(f"time-slicing replicas must be at least 1, got {replicas}")
        self.name = name
        self.cluster = cluster
        sliced = {
            pool: replicas if isinstance(replicas, int) else replicas.get(pool, TIME_SLICING_REPLICAS)
            for pool in time_sliced
            if pool in cluster.pools
        }
        unknown = [p for p in time_sliced if p not in cluster.pools]
        if unknown:
            raise ValueError(f"time-sliced pool {unknown[0]!r} is not a pool of the cluster")
        few = [(p, n) for p, n in sliced.items() if n < 1]
        if few:
            pool, n = few[0]
            raise ValueError(f"time-slicing replicas must be at least 1, got {n} on pool {pool!r}")
        self.replicas = sliced
        self.admission = _KueueAdmission(
            name, cluster, start, grace, sliced, whole_gpus_shared=whole_gpus_shared
        )
        advertised = replace(
            cluster,
            nodes=tuple(replace(n, gpus=n.gpus * sliced.get(n.pool, 1)) for n in cluster.nodes),
        )
        physical = {n.name: n.gpus for n in cluster.nodes if n.pool in sliced}
        self.binder = _KueueBinder(advertised, deadlock_timeout, name, physical)
        self.gpus_of = {n.name: n.gpus for n in cluster.nodes}
        self.pool_of_job: dict[int, str] = {}
        self.unplaceable_gangs = 0
        self.partly_bound_gangs = 0
        self.unplaceable_workloads = 0
        self.never_placeable_gangs = 0

    # --- what happened ---------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        self.admission.submit(job, now)

    def release(self, job: Job, now: float) -> None:
        self.admission.release(job, now)
        self.admission.take_changes()
        self.binder.clock = now
        self.binder.release(job, now)
        self.pool_of_job.pop(job.id, None)

    def node_down(self, node: str, now: float) -> None:
        self.binder.clock = now
        self.binder.node_down(node, now)

    def node_up(self, node: str, now: float) -> None:
        self.binder.node_up(node, now)

    # --- scheduling -------------------------------------------------------------------------

    def schedule(self, now: float, checkpoints: Callable[[], Iterable[tuple[Job, float]]]) -> int:
        admission, binder = self.admission, self.binder
        binder.counting = now >= 0
        binder.clock = now
        binder.restart_due(now)
        fresh: list[_StockJob] = []
        cycles = 0
        for _ in range(8):  # requeued gangs are admitted again at once, if quota allows
            cycles += admission.schedule(now, checkpoints)
            admission.take_changes()
            for job in admission.preempted_now:
                binder.evict(job)
                self.pool_of_job.pop(job.id, None)
            for job, pool in admission.admitted_now:
                self.pool_of_job[job.id] = pool
                fresh.append(binder.admit(job, pool))
            admission.admitted_now.clear()
            admission.preempted_now.clear()
            cycles += binder.schedule(now, checkpoints)
            requeued, binder.requeued = binder.requeued, []
            if not requeued:
                break
            for job in requeued:
                self.pool_of_job.pop(job.id, None)
                admission.requeue(job, now)
        if now >= 0:
            self._count_unplaceable(fresh)
        return cycles

    def _count_unplaceable(self, fresh: list[_StockJob]) -> None:
        for sj in fresh:
            if len(sj.bound) == sj.job.pods or self.binder.jobs.get(sj.job.id) is not sj:
                continue
            self.unplaceable_workloads += 1
            if sj.job.pods > 1:
                self.unplaceable_gangs += 1
                self.partly_bound_gangs += bool(sj.bound)
                self.never_placeable_gangs += self.binder.no_node_set_holds(sj)

    def take_changes(self) -> list[Change]:
        changes = self.binder.take_changes()
        if self.replicas:
            for change in changes:
                if change.kind == HOLD and change.level:
                    change.level *= self._unit(self.pool_of_job.get(change.job, ""))
        return changes

    def _unit(self, pool: str) -> float:
        """GPUs one advertised device is on ``pool``."""
        return 1.0 / self.replicas.get(pool, 1)

    # --- views for the engine ---------------------------------------------------------------

    def allocation(self, job: Job) -> tuple[float, float]:
        """Whole GPUs per pod; on time-sliced pools a replica each (the least over the job's
        pools, since the flavor is chosen only at admission: busy time is capped by it)."""
        unit = min(self._unit(p) for p in self.pools_of(job)) if self.replicas else 1.0
        return float(job.request.whole) * unit, job.activity

    def priority(self, job: Job) -> int:
        return self.admission.priority(job)

    def pools_of(self, job: Job) -> tuple[str, ...]:
        return self.admission.pools_of(job)

    def eta_capacity(self) -> Capacity:
        return self.admission.eta_capacity()

    def whole_nodes(self, job: Job) -> None:
        """Not modelled: pods are bound one by one, not as a gang."""

    def quota_blocked(self) -> float:
        return self.admission.quota_blocked()

    def node_gpus(self, node: str) -> int:
        return self.gpus_of[node]

    def wake_ups(self) -> list[float]:
        return self.admission.wake_ups() + self.binder.wake_ups()

    def document_extras(self) -> dict[str, Any]:
        """What this peer adds to its configuration's JSON (counted in the measured window)."""
        out: dict[str, Any] = {
            "admittedUnplaceableWorkloads": self.unplaceable_workloads,
            "admittedUnplaceableGangs": self.unplaceable_gangs,
            "admittedPartlyBoundGangs": self.partly_bound_gangs,
            "admittedGangsNoNodeSetHolds": self.never_placeable_gangs,
        }
        if self.replicas:
            memory = np.asarray(list(self.binder.memory.values()) or [0.0])
            out["timeSlicing"] = {
                "pools": sorted(self.replicas),
                "replicasPerGpu": dict(sorted(self.replicas.items())),
                "wholeGpuRequestsShared": self.admission.whole_gpus_shared,
                "memoryOvercommits": self.binder.overcommits,
                "memoryOvercommittedWorkloads": len(self.binder.overcommitted_jobs),
                "memoryUseAtEndMax": round(float(memory.max()), 3),
            }
        return out
