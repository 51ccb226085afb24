"""One worker cluster behind a simulated MultiKueue manager: gpuplane's model on its share of the
nodes, and what the manager may ask of it before it nominates.

The scheduling is :class:`gpuplane.sim.gpuplane_model.GpuplaneModel`'s, unchanged (the same core).
Beside it, a worker keeps what answering the gpuplane dispatcher cheaply needs, updated as
workloads are admitted, preempted, finish or fail:

* the milli-GPU free on each node (a node that is down has none);
* the milli-GPU queued here, by set of pools and priority (the work ahead of a newcomer);
* who started each preemption here (the preemptor of every victim), so that preemptions started
  by a copy that then lost elsewhere can be counted.

:meth:`WorkerCluster.view` answers "does the whole gang fit here now, and if not, when would it
start": the gang fits when its pods fit, one after another, in the free milli-GPU of the nodes of
its pools (a node's fractions are counted in milli-GPU, so the answer can be a little roomier
than the devices are; the worker's core then places for real). Its start is replayed from the
expected ends of the work running on those nodes (the runtimes the simulator learned, as for
``gpuplane why``), after the work queued ahead of it here at its priority or above. It reads no
more than the nodes of the job's pools and the work running on them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gpuplane.core.session import AdmissionDecision, PreemptionDecision
from gpuplane.insight.dispatch import ClusterView
from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.gpuplane_model import GpuplaneModel, GpuplaneOptions
from gpuplane.sim.workloads import MILLI, Job

ExpectedEnd = Callable[[int], float | None]  # a job id -> when its run is expected to end


class WorkerCluster(GpuplaneModel):
    """One worker cluster (``name``) with its ``labels``: the gpuplane model of its nodes, plus the
    milli-GPU free per node (``free``), the nodes down (``down``), the milli-GPU queued per
    (pools, priority) (``queued``, with each queued workload's share in ``queued_of``), each job's key by id
    (``key_by_id``), when copies being deleted let go (``end_override``), and the
    preemptions decided here since the manager last read them (``preemptions``: victim's job id,
    preemptor's key)."""

    def __init__(  # noqa: PLR0913 - the model's own arguments, and the worker's labels
        self,
        name: str,
        cluster: ClusterSpec,
        options: GpuplaneOptions,
        start: float,
        *,
        grace: float,
        labels: Mapping[str, str],
    ) -> None:
        super().__init__(name, cluster, options, start, grace=grace)
        self.labels = dict(labels)
        self.free: dict[str, int] = {n.name: n.gpus * MILLI for n in cluster.nodes}
        self.down: set[str] = set()
        self.queued: dict[tuple[tuple[str, ...], int], int] = {}
        self.queued_of: dict[str, tuple[tuple[tuple[str, ...], int], int]] = {}
        self.preemptions: list[tuple[int, str]] = []
        self.end_override: dict[int, float] = {}  # copies being deleted: when they let go
        self.key_by_id: dict[int, str] = {}

    # --- what happened (the model's own handling, plus the indexes above) ----------------

    def submit(self, job: Job, now: float) -> None:
        super().submit(job, now)
        self.key_by_id[job.id] = self.key(job)
        self._queue(self.key(job))

    def release(self, job: Job, now: float) -> None:
        self._dequeue(self.key(job))
        self.end_override.pop(job.id, None)
        super().release(job, now)
        self.key_by_id.pop(job.id, None)

    def node_down(self, node: str, now: float) -> None:
        hit = [key for key, nodes in self.placed.items() if node in nodes]
        self.down.add(node)
        super().node_down(node, now)
        for key in hit:
            if key not in self.placed and key in self.jobs:
                self._queue(key)  # back in its queue here

    def node_up(self, node: str, now: float) -> None:
        self.down.discard(node)
        super().node_up(node, now)

    def _admitted(self, decision: AdmissionDecision) -> None:
        super()._admitted(decision)
        key = decision.workload
        self._dequeue(key)
        per_pod = self._milli_per_pod(self.jobs[key])
        for node in self.placed[key]:
            self.free[node] -= per_pod

    def _unplace(self, key: str) -> None:
        job = self.jobs.get(key)
        if job is not None and key in self.placed:
            per_pod = self._milli_per_pod(job)
            for node in self.placed[key]:
                self.free[node] += per_pod
        super()._unplace(key)

    def _preempted(self, decision: PreemptionDecision) -> None:
        key = decision.workload
        self.preemptions.append((self.jobs[key].id, decision.preemptor))
        super()._preempted(decision)
        self._queue(key)

    def _queue(self, key: str) -> None:
        if key in self.queued_of:
            return
        job = self.jobs[key]
        slot = (self.pools_of(job), self.priority(job))
        milli = self._milli_per_pod(job) * job.pods
        self.queued_of[key] = (slot, milli)
        self.queued[slot] = self.queued.get(slot, 0) + milli

    def _dequeue(self, key: str) -> None:
        entry = self.queued_of.pop(key, None)
        if entry is not None:
            slot, milli = entry
            self.queued[slot] -= milli

    def take_preemptions(self) -> list[tuple[int, str]]:
        out, self.preemptions = self.preemptions, []
        return out

    # --- what the manager asks --------------------------------------------------------------

    def view(self, job: Job, now: float, expected_end: ExpectedEnd) -> ClusterView:
        """This worker as the gpuplane dispatcher sees it for ``job`` (see the module docstring)."""
        pools = tuple(p for p in self.pools_of(job) if p in self.all_pools)
        if not pools:
            missing = ", ".join(self.pools_of(job))
            return ClusterView(self.name, self.labels, note=f"none of its pools here ({missing})")
        nodes, _ = self._nodes_in(pools)
        per_pod = self._milli_per_pod(job)
        free = {n.name: (0 if n.name in self.down else self.free[n.name]) for n in nodes}
        if _fits(free, per_pod, job.pods):
            return ClusterView(self.name, self.labels, fits_now=True, start_in_seconds=0.0)
        short = _short(free, per_pod, job.pods)
        note = f"{short / MILLI:g} GPUs short" if short > 0 else "no node has room for a pod"
        start = self._start_in(job, pools, nodes, free, now=now, expected_end=expected_end)
        return ClusterView(self.name, self.labels, start_in_seconds=start, note=note)

    def _ahead(self, job: Job, pools: tuple[str, ...]) -> int:
        """Milli-GPU queued here that shares a pool with ``job``, at its priority or above."""
        wanted = set(pools)
        priority = self.priority(job)
        own = self.queued_of.get(self.key(job))
        total = sum(m for (p, prio), m in self.queued.items() if prio >= priority and wanted.intersection(p))
        return total - (own[1] if own is not None else 0)

    def _start_in(  # noqa: PLR0913 - the replay's inputs, worked out once by view
        self,
        job: Job,
        pools: tuple[str, ...],
        nodes: list[NodeSpec],
        free: dict[str, int],
        *,
        now: float,
        expected_end: ExpectedEnd,
    ) -> float | None:
        """Seconds until ``job`` would start here: the running work on its nodes ends in the
        order expected, and it starts once its pods fit and the work queued ahead fits too."""
        per_pod = self._milli_per_pod(job)
        ahead = self._ahead(job, pools)
        holders: set[str] = set()
        for spec in nodes:
            if spec.name not in self.down:
                holders.update(self.key_by_id[job_id] for job_id in self.node_jobs[spec.name])
        ends: list[tuple[float, str]] = []
        for key in holders:
            held = self.jobs[key]
            end = self.end_override.get(held.id)
            if end is None:
                end = expected_end(held.id)
            if end is not None:
                ends.append((max(now, end), key))
        ends.sort()
        room = sum(free.values())
        need = per_pod * job.pods + ahead
        for end, key in ends:
            held = self.jobs[key]
            share = self._milli_per_pod(held)
            for node in self.placed.get(key, ()):
                if node in free:
                    free[node] += share
                    room += share
            if room >= need and _fits(free, per_pod, job.pods):
                return end - now
        return None


def _fits(free: Mapping[str, int], per_pod: int, pods: int) -> bool:
    """Do ``pods`` pods of ``per_pod`` milli-GPU fit in the free milli-GPU of the nodes?"""
    if per_pod <= 0:
        return True
    placed = 0
    for milli in free.values():
        placed += milli // per_pod
        if placed >= pods:
            return True
    return False


def _short(free: Mapping[str, int], per_pod: int, pods: int) -> int:
    """Milli-GPU missing for the pods that do not fit (0 when they fit)."""
    if per_pod <= 0:
        return 0
    placed = sum(milli // per_pod for milli in free.values())
    return max(0, pods - placed) * per_pod if placed < pods else 0
