"""Volcano as a simulated configuration: gang scheduling at placement, bin-packing, queues with reclaim.

What Volcano's users run for batch and training work (the ``gang``, ``binpack``, ``proportion``
plugins with the ``allocate`` and ``reclaim`` actions), on the stock model's nodes and inventory:

* **Gangs at placement**: a job's pods are bound all at once or not at all (a PodGroup with
  ``minMember`` = its pods). A partly placed gang never exists, so nothing deadlocks.
* **Bin-packing**: pods go to the most allocated node that fits (the engine's ``most-allocated``
  profile; ties to the first node by name), each pod on its own, as Volcano's node order does.
* **Queues** (``proportion``): one queue per team, weighted by its floor. A queue's *deserved* share
  is the cluster's GPUs split by weight, water-filled: a queue that asks for less (what it runs plus
  what it waits for) keeps only that, and the rest goes to the others by weight. A queue at or above
  its deserved share is *overused* and gets nothing more in this pass; below it, its jobs are tried
  in priority, then arrival order. The queues take turns, the one with the smallest share of its
  deserved first. A job that does not fit is skipped (later, smaller work may start: no head of line
  blocking).
* **Reclaim**: a queue below its deserved share whose job does not fit evicts whole jobs of
  overused queues (lowest priority first, then the most recently started) while the victim's queue
  stays above its deserved share, and only if the job then fits; an evicted job goes back to its
  queue and restarts from its last checkpoint.
* Whole GPUs only (no fractions, MIG off, as under stock). No namespace quota (the queues are the
  limit), no preemption within a queue (the ``preempt`` action is left out), no reaper, no backfill
  tier beyond the priority order, no ``capability`` caps. A node failure ends every gang with a pod
  there; the job goes back to its queue.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gpuplane.core.pod_engine import MILLI_PER_GPU, GpuRequest
from gpuplane.insight.eta import Capacity
from gpuplane.sim.cluster import ClusterSpec
from gpuplane.sim.engine import HOLD, NODE_FAILURE, PREEMPTED, START, STOP, Change
from gpuplane.sim.stock import StockModel, _StockJob
from gpuplane.sim.workloads import Job

MAX_PASSES = 1000  # allocate-and-reclaim rounds in one scheduling pass (each reclaim starts a job)


@dataclass(slots=True)
class _Queue:
    """One Volcano queue: its weight, the GPUs its running jobs hold, its waiting jobs in order."""

    name: str
    weight: float
    allocated: int = 0
    asked: int = 0  # GPUs of the jobs waiting
    waiting: list[tuple[int, float, int]] = field(default_factory=list)  # (-priority, submit, id)
    deserved: float = 0.0

    @property
    def share(self) -> float:
        return self.allocated / self.deserved if self.deserved > 0 else float("inf")

    @property
    def overused(self) -> bool:
        return self.allocated >= self.deserved


def water_fill(total: float, weights: dict[str, float], asks: dict[str, float]) -> dict[str, float]:
    """``total`` split by ``weights``, no queue getting more than it ``asks``; what a queue does not
    take goes to the others by weight (the proportion plugin's deserved shares)."""
    deserved = dict.fromkeys(weights, 0.0)
    open_ = {q for q, w in weights.items() if w > 0 and asks.get(q, 0.0) > 0}
    left = total
    while open_ and left > 1e-9:
        weight = sum(weights[q] for q in open_)
        capped = {q for q in open_ if asks[q] - deserved[q] <= left * weights[q] / weight + 1e-9}
        if not capped:
            for q in open_:
                deserved[q] += left * weights[q] / weight
            break
        for q in capped:
            left -= asks[q] - deserved[q]
            deserved[q] = asks[q]
        open_ -= capped
    return deserved


class VolcanoModel(StockModel):
    """Volcano (see the module docstring). Owns, beyond the stock model's nodes and inventory, its
    queues (``queues``), the jobs waiting in them and running (``jobs``), and the jobs reclaimed."""

    def __init__(self, cluster: ClusterSpec, name: str = "volcano") -> None:
        super().__init__(cluster, deadlock_timeout=float("inf"), packed=True, name=name)
        # Volcano's weights are at least 1 in practice; a team without a floor still gets leftovers.
        self.queues = {t.name: _Queue(t.name, max(t.floor, 1e-6)) for t in cluster.teams}
        self.started_at: dict[int, float] = {}
        self.reclaimed = 0

    # --- what happened ---------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        request = job.request
        cpu, memory = (request.cpu_milli, request.memory_mib) if self.models_cpu else (0, 0)
        whole = request.whole
        sj = _StockJob(
            job=job,
            gpus=whole,
            cpu=request.cpu_milli,
            memory=request.memory_mib,
            mask=self._mask(self.pools_of(job)),
            uncreated=0,
            created=job.pods,
            request=GpuRequest(cpu=cpu, memory=memory, gpus=whole, gpu_milli=MILLI_PER_GPU if whole else 0),
        )
        self.jobs[job.id] = sj
        self._wait(sj)
        self.dirty = True

    def _queue_of(self, job: Job) -> _Queue:
        queue = self.queues.get(job.team)
        if queue is None:
            raise KeyError(f"job {job.name!r}: team {job.team!r} has no Volcano queue")
        return queue

    def _wait(self, sj: _StockJob) -> None:
        job = sj.job
        queue = self._queue_of(job)
        bisect.insort(queue.waiting, (-self.priority(job), job.submit, job.id))
        queue.asked += sj.gpus * job.pods

    def _unwait(self, sj: _StockJob) -> None:
        job = sj.job
        queue = self._queue_of(job)
        entry = (-self.priority(job), job.submit, job.id)
        i = bisect.bisect_left(queue.waiting, entry)
        if i < len(queue.waiting) and queue.waiting[i] == entry:
            del queue.waiting[i]
            queue.asked -= sj.gpus * job.pods

    def release(self, job: Job, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        sj = self.jobs.pop(job.id, None)
        if sj is None:
            return
        if sj.running:
            self._unbind_all(sj)
            self.changes.append(Change(HOLD, job.id, 0.0))
        else:
            self._unwait(sj)
        self.dirty = True

    def _unbind_all(self, sj: _StockJob) -> None:
        for node, gpus in zip(sj.bound, sj.devices, strict=True):
            self._unbind(sj, node, gpus)
        self._queue_of(sj.job).allocated -= sj.gpus * len(sj.bound)
        sj.bound = []
        sj.devices = []
        sj.running = False
        self.started_at.pop(sj.job.id, None)

    def _stop(self, sj: _StockJob, reason: str) -> None:
        """The gang is broken (evicted, a node failed): every pod goes, the job waits again."""
        self._unbind_all(sj)
        self.changes.append(Change(STOP, sj.job.id, text=reason))
        self.changes.append(Change(HOLD, sj.job.id, 0.0))
        self._wait(sj)

    def node_down(self, node: str, now: float) -> None:  # noqa: ARG002 - the engine's Model protocol
        n = self.node_index[node]
        self.up[n] = False
        self._up_masks.clear()
        for sj in list(self.jobs.values()):
            if sj.running and n in sj.bound:
                self._stop(sj, NODE_FAILURE)
        self.dirty = True

    # --- scheduling -------------------------------------------------------------------------

    def schedule(
        self,
        now: float,
        checkpoints: Callable[[], Iterable[tuple[Job, float]]],  # noqa: ARG002 - Volcano knows no checkpoints
    ) -> int:
        if not self.dirty:
            return 0
        self.dirty = False
        passes = 0
        while passes < MAX_PASSES:
            passes += 1
            self._deserve()
            self._allocate(now)
            if not self._reclaim(now):
                break
        return passes

    def _deserve(self) -> None:
        asks = {name: float(q.allocated + q.asked) for name, q in self.queues.items()}
        weights = {name: q.weight for name, q in self.queues.items()}
        for name, amount in water_fill(float(self.gpu_total.sum()), weights, asks).items():
            self.queues[name].deserved = amount

    def _allocate(self, now: float) -> None:
        """Queues take turns by share; each tries its waiting jobs in order, skipping what does not
        fit. Within the pass capacity only shrinks, so a shape that failed is not tried again."""
        failed: set[tuple[int, int, int, int, int]] = set()
        cursor = dict.fromkeys(self.queues, 0)
        while True:
            ready = [q for q in self.queues.values() if not q.overused and cursor[q.name] < len(q.waiting)]
            if not ready:
                return
            queue = min(ready, key=lambda q: (q.share, q.name))
            # A job that does not fit changes no share, so this queue keeps its turn until one binds
            # (which removes it from ``waiting``: the cursor then points at the next) or none is left.
            waiting, i = queue.waiting, cursor[queue.name]
            while i < len(waiting):
                sj = self.jobs[waiting[i][2]]
                signature = (id(sj.mask), sj.gpus, sj.cpu, sj.memory, sj.job.pods)
                if signature not in failed:
                    if self._place(sj, now):
                        break
                    failed.add(signature)
                i += 1
            cursor[queue.name] = i

    def _place(self, sj: _StockJob, now: float) -> bool:
        """Bind every pod of the gang, or none (the tentative binds are undone)."""
        done: list[tuple[int, tuple[int, ...]]] = []
        for _ in range(sj.job.pods):
            node = self._pick(sj)
            if node < 0:
                for n, gpus in done:
                    self.inventory.uncommit(n, sj.request, gpus)
                return False
            gpus = self.profile.reserve.choose_gpus(self.inventory, sj.request, node)
            self.inventory.commit(node, sj.request, gpus)
            done.append((node, gpus))
        self._unwait(sj)
        job = sj.job
        sj.bound = [n for n, _ in done]
        sj.devices = [g for _, g in done]
        sj.running = True
        self._queue_of(job).allocated += sj.gpus * job.pods
        self.started_at[job.id] = now
        self.changes.append(Change(HOLD, job.id, float(sj.held)))
        self.changes.append(Change(START, job.id, text=self.node_pool[sj.bound[0]]))
        return True

    def _reclaim(self, now: float) -> bool:
        """One job of each queue below its deserved share may reclaim from overused queues."""
        reclaimed = False
        for queue in sorted(self.queues.values(), key=lambda q: (q.share, q.name)):
            if queue.overused or not queue.waiting:
                continue
            sj = self.jobs[queue.waiting[0][2]]
            if self._reclaim_for(sj, now):
                reclaimed = True
        return reclaimed

    def _reclaim_for(self, sj: _StockJob, now: float) -> bool:
        """Evict jobs of overused queues on the gang's nodes until it fits; undone if it never does."""
        team = sj.job.team
        overused = {name for name, q in self.queues.items() if q.allocated > q.deserved and name != team}
        if not overused:
            return False
        mask = sj.mask
        victims = [
            v
            for v in map(self.jobs.__getitem__, self.started_at)  # the running jobs
            if v.job.team in overused and any(mask[n] for n in v.bound)
        ]
        victims.sort(key=lambda v: (self.priority(v.job), -self.started_at.get(v.job.id, 0.0), v.job.id))
        taken: list[_StockJob] = []
        left = {name: q.allocated for name, q in self.queues.items()}
        for victim in victims:
            queue = self._queue_of(victim.job)
            held = victim.gpus * len(victim.bound)
            if left[queue.name] - held < queue.deserved:
                continue
            left[queue.name] -= held
            for node, gpus in zip(victim.bound, victim.devices, strict=True):
                self.inventory.uncommit(node, victim.request, gpus)
            taken.append(victim)
            if self._fits(sj):
                for v in taken:
                    for node, gpus in zip(v.bound, v.devices, strict=True):
                        self.inventory.commit(node, v.request, gpus)
                    self._stop(v, PREEMPTED)
                    self.reclaimed += now >= 0
                return self._place(sj, now)
        for v in taken:
            for node, gpus in zip(v.bound, v.devices, strict=True):
                self.inventory.commit(node, v.request, gpus)
        return False

    def _fits(self, sj: _StockJob) -> bool:
        """Whether every pod of the gang would bind now (nothing is kept)."""
        done: list[tuple[int, tuple[int, ...]]] = []
        fits = True
        for _ in range(sj.job.pods):
            node = self._pick(sj)
            if node < 0:
                fits = False
                break
            gpus = self.profile.reserve.choose_gpus(self.inventory, sj.request, node)
            self.inventory.commit(node, sj.request, gpus)
            done.append((node, gpus))
        for n, gpus in done:
            self.inventory.uncommit(n, sj.request, gpus)
        return fits

    # --- views for the engine ---------------------------------------------------------------

    def priority(self, job: Job) -> int:
        """The PriorityClasses Volcano's users set: the backfill tier below normal work."""
        return self.cluster.backfill_priority if job.tier == "backfill" else self.cluster.normal_priority

    def eta_capacity(self) -> Capacity:
        """Pools only: a queue's deserved share moves with demand, so no fixed quota is replayed."""
        return Capacity(dict(self.pool_capacity), preemption=False)

    def quota_blocked(self) -> float:
        """Nothing waits on a quota: queues only order and reclaim."""
        return 0.0

    def document_extras(self) -> dict[str, Any]:
        """What this peer adds to its configuration's JSON."""
        return {"reclaimedJobs": self.reclaimed}
