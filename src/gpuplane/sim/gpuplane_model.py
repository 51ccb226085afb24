"""gpuplane as a simulated configuration: the real scheduling core, driven over virtual time.

Nothing here decides admission, placement or preemption. The simulator builds the Kueue objects
once (a ClusterQueue per team in one cohort, a ResourceFlavor per pool, the nodes with their
devices), keeps one :class:`gpuplane.core.session.Session` for the whole run, and only tells
it what happened: ``submit`` on arrival, ``finish`` or ``withdraw`` on completion or deletion,
``node_down`` when a node fails; then drains the session (its stop rule catches a preemption
loop) and carries out what the cycles decided (admissions with placements, preemptions).

How workloads are expressed (``sharing`` on):

* quota is counted in milli-GPU (resource ``gpuplane.dev/gpu-milli``): a whole GPU is 1000, a
  fraction its share, a MIG instance its compute slices x 1000 / 7. Each team's nominal quota per
  pool is its floor share of the pool; with borrowing the rest of the cohort may be borrowed.
* device requests: ``nvidia.com/gpu`` for whole GPUs, the ``gpuplane.dev/gpu-fraction`` annotation
  for a fraction (charged under ``gpuplane.dev/gpu-fraction`` as well, see
  :mod:`gpuplane.model.gpu_share`), ``nvidia.com/mig-<profile>`` for a MIG instance. Device counts
  and the fraction charge are given quotas no team can exhaust (a pool's GPUs), so milli-GPU is the
  only quota that binds.
* the backfill tier gets the low priority; every queue may preempt lower priorities in itself,
  reclaim borrowed quota from the cohort (``reclaimWithinCohort: Any``) and, while borrowing,
  preempt the backfill tier of other queues (``borrowWithinCohort``).
* checkpoint-aware victim order (:class:`gpuplane.core.config.SchedulerConfig`): before a pass
  with queued work, the core is told each running workload's last checkpoint.

A failed node's devices are held by a placeholder owner until it comes back, so the core places
nothing there.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from gpuplane.core.session import (
    AdmissionDecision,
    CycleOutcome,
    DeviceConfig,
    PreemptionDecision,
    Reason,
    SchedulerConfig,
    Session,
)
from gpuplane.insight.eta import Capacity
from gpuplane.model import labels as keys
from gpuplane.model.gpu_share import FRACTION_RESOURCE
from gpuplane.model.objects import (
    ClusterQueue,
    ClusterState,
    FlavorQuotas,
    LocalQueue,
    Namespace,
    Node,
    NodeSelectorTerm,
    PodSet,
    PodTemplate,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    SelectorRequirement,
    Workload,
    frozen_map,
)
from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.engine import HOLD, NODE_FAILURE, PREEMPTED, START, STOP, Change
from gpuplane.sim.workloads import MILLI, Job, Request

POOL_LABEL = keys.POOL_LABEL
GPU_MILLI = "gpuplane.dev/gpu-milli"
GPU = "nvidia.com/gpu"
FRACTION = "gpuplane.dev/gpu-fraction"
MIG_PREFIX = "nvidia.com/mig-"
LOCAL_QUEUE = "default"
BACKFILL = "backfill"  # the tier, its ClusterQueue and its LocalQueue in every team namespace
COHORT = "org"
MIB = 1024 * 1024
MAX_CYCLES = 1_000_000
QUOTA_REASONS = frozenset({Reason.WAITING_FOR_QUOTA, Reason.EXCEEDS_MAX_QUOTA})


@dataclass(frozen=True, slots=True)
class GpuplaneOptions:
    """Which gpuplane features a configuration turns on."""

    sharing: bool = True  # fractions and MIG; off: every GPU request takes whole GPUs
    borrowing: bool = True
    reaper: bool = True
    backfill: bool = True  # the backfill tier is low priority and preemptible
    preemption: bool = True
    checkpoint_aware: bool = True


class GpuplaneModel:
    """One gpuplane configuration (see the module docstring)."""

    def __init__(
        self, name: str, cluster: ClusterSpec, options: GpuplaneOptions, start: float, grace: float = 30.0
    ) -> None:
        self.name = name
        self.cluster = cluster
        self.options = options
        self.reaper = options.reaper
        self.pool_of = {n.name: n.pool for n in cluster.nodes}
        self.gpus_of = {n.name: n.gpus for n in cluster.nodes}
        self.pool_capacity = {p: float(cluster.pool_gpus(p)) for p in cluster.pools}
        self.all_pools = frozenset(cluster.pools)
        self.team_milli = cluster.team_milli()
        state = self._state()
        config = SchedulerConfig(checkpoint_aware=options.checkpoint_aware, devices=DeviceConfig())
        # One session for the whole run, keeping no lifecycles (nothing here reads them); pending
        # reasons are read on demand (quota_blocked).
        self.session = Session(state, config, start, history=False)
        self.jobs: dict[str, Job] = {}
        self.placed: dict[str, tuple[str, ...]] = {}
        self.node_jobs: dict[str, set[int]] = {n.name: set() for n in cluster.nodes}  # job ids
        self.changes: list[Change] = []
        self.templates: dict[tuple[object, ...], PodTemplate] = {}
        self.dirty = False
        self.grace = grace
        self.livelocks = 0
        self._wakes: list[float] = []
        # quota_blocked's running figure: each queued workload blocked on quota, with its milli-GPUs.
        self._touched = self.session.reasons.watch()
        self._blocked: dict[str, int] = {}
        self._blocked_milli = 0
        self._pool_nodes: dict[tuple[str, ...], tuple[list[NodeSpec], frozenset[int]]] = {}

    # --- the Kueue objects ------------------------------------------------------------

    def _mig_on(self, node: NodeSpec) -> bool:
        return self.options.sharing and node.mig_layout is not None

    def _node(self, spec: NodeSpec) -> Node:
        labels = {POOL_LABEL: spec.pool}
        if spec.model:
            labels["nvidia.com/gpu.product"] = spec.model
        if spec.gpu_memory_mib:
            labels["nvidia.com/gpu.memory"] = str(spec.gpu_memory_mib)
        allocatable: dict[str, int] = {"pods": 110}
        annotations: dict[str, str] = {}
        if spec.gpus:
            allocatable[GPU_MILLI] = spec.gpus * MILLI
            if self._mig_on(spec):
                assert spec.mig_layout is not None
                for profile in sorted(set(spec.mig_layout)):
                    allocatable[MIG_PREFIX + profile] = spec.mig_layout.count(profile) * spec.gpus
                annotations["gpuplane.dev/mig-layout"] = ";".join([",".join(spec.mig_layout)] * spec.gpus)
            else:
                allocatable[GPU] = spec.gpus
        if spec.cpu_milli:
            allocatable["cpu"] = spec.cpu_milli
            allocatable["memory"] = spec.memory_mib * MIB
        return Node(
            name=spec.name,
            allocatable=frozen_map(allocatable),
            labels=frozen_map(labels),
            annotations=frozen_map(annotations),
        )

    def _resources(self) -> tuple[str, ...]:
        names = {GPU_MILLI, GPU, FRACTION_RESOURCE} if self.options.sharing else {GPU_MILLI, GPU}
        for node in self.cluster.nodes:
            if self._mig_on(node):
                assert node.mig_layout is not None
                names |= {MIG_PREFIX + p for p in node.mig_layout}
        if self.cluster.models_cpu:
            names |= {"cpu", "memory"}
        return tuple(sorted(names))

    def _pool_totals(self, pool: str) -> dict[str, int]:
        """Everything a pool's nodes advertise, summed: device quotas no team can exhaust."""
        totals: dict[str, int] = {}
        for node in self.cluster.nodes:
            if node.pool != pool:
                continue
            for name, q in self._node(node).allocatable.items():
                totals[name] = totals.get(name, 0) + q
        return totals

    def _cluster_queue(self, name: str, resources: tuple[str, ...]) -> ClusterQueue:
        """A team's queue (nominal = its floor share), or the backfill queue (nominal 0)."""
        backfill = name == BACKFILL
        borrowing_limit = None if self.options.borrowing or backfill else 0
        flavors = []
        for pool in self.cluster.pools:
            totals = self._pool_totals(pool)
            milli = 0 if backfill else self.team_milli[(name, pool)]
            quotas = {}
            for res in resources:
                if res == GPU_MILLI:
                    quotas[res] = ResourceQuota(milli, borrowing_limit)
                elif res == FRACTION_RESOURCE:
                    quotas[res] = ResourceQuota(totals.get(GPU, 0) * MILLI)
                else:
                    quotas[res] = ResourceQuota(totals.get(res, 0))
            flavors.append(FlavorQuotas(pool, frozen_map(quotas)))
        if self.options.preemption and not backfill:
            preemption = PreemptionPolicy(
                within_cluster_queue="LowerPriority",
                reclaim_within_cohort="Any",
                borrow_within_cohort="LowerPriority" if self.options.backfill else "Never",
                max_priority_threshold=self.cluster.backfill_priority if self.options.backfill else None,
            )
        else:
            preemption = PreemptionPolicy()
        return ClusterQueue(
            name=name,
            resource_groups=(ResourceGroup(resources, tuple(flavors)),),
            cohort=COHORT,
            preemption=preemption,
        )

    def kueue_state(self) -> ClusterState:
        """The Kueue objects and nodes this configuration schedules on, before anything is submitted
        (what a real cluster would hold to run the same configuration)."""
        return self._state()

    def _state(self) -> ClusterState:
        resources = self._resources()
        teams = [t.name for t in self.cluster.teams]
        queues = {t: self._cluster_queue(t, resources) for t in teams}
        local = {f"{t}/{LOCAL_QUEUE}": LocalQueue(t, LOCAL_QUEUE, t) for t in teams}
        if self.options.backfill:
            queues[BACKFILL] = self._cluster_queue(BACKFILL, resources)
            local |= {f"{t}/{BACKFILL}": LocalQueue(t, BACKFILL, BACKFILL) for t in teams}
        return ClusterState(
            namespaces=frozen_map({t: Namespace(t) for t in teams}),
            resource_flavors=frozen_map(
                {p: ResourceFlavor(p, node_labels=frozen_map({POOL_LABEL: p})) for p in self.cluster.pools}
            ),
            cluster_queues=frozen_map(queues),
            local_queues=frozen_map(local),
            nodes=tuple(self._node(n) for n in self.cluster.nodes),
        )

    def _template(self, job: Job) -> PodTemplate:
        request = job.request
        key = (request, job.pools)
        template = self.templates.get(key)
        if template is not None:
            return template
        requests: dict[str, int] = {}
        annotations: dict[str, str] = {}
        if request.gpus or not self.options.sharing:
            whole = request.whole
            if whole:
                requests[GPU] = whole
                requests[GPU_MILLI] = whole * MILLI
        elif request.fraction_milli:
            annotations[FRACTION] = f"{request.fraction_milli / MILLI:g}"
            requests[GPU_MILLI] = request.fraction_milli
        elif request.mig is not None:
            requests[MIG_PREFIX + request.mig] = 1
            requests[GPU_MILLI] = request.milli
        if request.cpu_milli:
            requests["cpu"] = request.cpu_milli
        if request.memory_mib:
            requests["memory"] = request.memory_mib * MIB
        pools = self.pools_of(job)
        terms = None
        if frozenset(pools) != self.all_pools:
            terms = (NodeSelectorTerm((SelectorRequirement(POOL_LABEL, "In", pools),)),)
        template = PodTemplate(
            requests=frozen_map(requests), required_node_terms=terms, annotations=frozen_map(annotations)
        )
        self.templates[key] = template
        return template

    def _backfill(self, job: Job) -> bool:
        return job.tier == BACKFILL and self.options.backfill

    def pools_of(self, job: Job) -> tuple[str, ...]:
        """Without sharing, MIG is off: a MIG request takes a whole GPU of the same model."""
        if job.request.mig is not None and not self.options.sharing:
            return self.cluster.whole_gpu_pools(job.pools)
        return job.pools

    def priority(self, job: Job) -> int:
        return self.cluster.backfill_priority if self._backfill(job) else self.cluster.normal_priority

    def _workload(self, job: Job) -> Workload:
        return Workload(
            namespace=job.team,
            name=job.name,
            uid=str(job.id),
            creation=job.submit,
            priority=self.priority(job),
            pod_sets=(PodSet("main", job.pods, self._template(job)),),
            queue_name=BACKFILL if self._backfill(job) else LOCAL_QUEUE,
        )

    def workload_of(self, job: Job) -> Workload:
        """The Workload this configuration submits for ``job`` (its queue, priority and pod set)."""
        return self._workload(job)

    @staticmethod
    def key(job: Job) -> str:
        return f"{job.team}/{job.name}"

    # --- what happened ---------------------------------------------------------------------

    def submit(self, job: Job, now: float) -> None:
        key = self.key(job)
        self.jobs[key] = job
        self.session.submit(self._workload(job), now)
        self.dirty = True

    def release(self, job: Job, now: float) -> None:
        key = self.key(job)
        if key in self.placed:
            self.session.finish(key, now)
            self._unplace(key)
            self.changes.append(Change(HOLD, job.id, 0.0))
        else:
            self.session.withdraw(key, now)
        self.jobs.pop(key, None)
        self.dirty = True

    def node_down(self, node: str, now: float) -> None:
        for key in self.session.node_down(node, now):
            job = self.jobs[key]
            self._unplace(key)
            self.changes.append(Change(STOP, job.id, text=NODE_FAILURE))
            self.changes.append(Change(HOLD, job.id, 0.0))
        self.dirty = True

    def node_up(self, node: str, now: float) -> None:
        # Capacity came back: every parked workload gets another look, as after a finish.
        self.session.node_up(node, now)
        self.dirty = True

    def _unplace(self, key: str) -> None:
        job_id = self.jobs[key].id
        for node in self.placed.pop(key, ()):
            self.node_jobs[node].discard(job_id)

    # --- scheduling -------------------------------------------------------------------------

    def schedule(self, now: float, checkpoints: Callable[[], Iterable[tuple[Job, float]]]) -> int:
        if not self.dirty:
            return 0
        session = self.session
        if self.options.checkpoint_aware and self.options.preemption and session.has_pending():
            for job, at in checkpoints():
                session.record_checkpoint(self.key(job), at)
        preempted_now: set[str] = set()
        self.dirty = False

        def livelock(outcome: CycleOutcome) -> bool:
            for admitted_decision in outcome.admitted:
                self._admitted(admitted_decision)
            again = False
            for preempted in outcome.preempted:
                again = again or preempted.workload in preempted_now
                preempted_now.add(preempted.workload)
                self._preempted(preempted)
            if again:
                # The same workload preempted twice at one instant: the cycles would go round
                # for ever. Stop here; victims take their grace period to go anyway.
                self.livelocks += 1
                self.dirty = True
                self._wakes.append(now + self.grace)
            return again

        return session.run_cycles(now, stop=livelock, max_cycles=MAX_CYCLES)

    def _admitted(self, decision: AdmissionDecision) -> None:
        key = decision.workload
        job = self.jobs[key]
        nodes: list[str] = []
        for ps in decision.pod_sets:
            for place in ps.placement or ():
                nodes += [place.node] * place.count
        self.placed[key] = tuple(nodes)
        for node in set(nodes):
            self.node_jobs[node].add(job.id)
        per_pod, _ = self.allocation(job)
        self.changes.append(Change(HOLD, job.id, per_pod * job.pods))
        self.changes.append(Change(START, job.id, text=self.pool_of[nodes[0]] if nodes else ""))

    def _preempted(self, decision: PreemptionDecision) -> None:
        key = decision.workload
        job = self.jobs[key]
        self._unplace(key)
        self.changes.append(Change(STOP, job.id, text=PREEMPTED))
        self.changes.append(Change(HOLD, job.id, 0.0))

    def take_changes(self) -> list[Change]:
        out, self.changes = self.changes, []
        return out

    # --- views for the engine ---------------------------------------------------------------

    def allocation(self, job: Job) -> tuple[float, float]:
        return self._milli_per_pod(job) / MILLI, job.activity

    def _milli_per_pod(self, job: Job) -> int:
        """What one pod of ``job`` holds, in milli-GPU: its share with sharing on, else its whole
        GPUs (the same figure as ``Request.share`` or ``whole``, times ``MILLI``)."""
        request: Request = job.request
        return request.milli if self.options.sharing else request.whole * MILLI

    def eta_capacity(self) -> Capacity:
        """Pools (flavors), each team's nominal quota per pool (a hard limit without borrowing, what
        may be reclaimed with preemption), and preemption of lower priorities."""
        nominal = {key: milli / MILLI for key, milli in self.team_milli.items()}
        return Capacity(
            dict(self.pool_capacity),
            flavor_limit={} if self.options.borrowing else nominal,
            nominal=nominal if self.options.preemption else {},
            preemption=self.options.preemption,
        )

    def whole_nodes(self, job: Job) -> dict[str, list[tuple[str, list[int]]]] | None:
        """The nodes of a job whose pods each take a whole node, with the jobs running on each."""
        gpus = job.request.gpus
        if not gpus:
            return None
        nodes, sizes = self._nodes_in(self.pools_of(job))
        if not nodes or sizes != {gpus}:
            return None
        out: dict[str, list[tuple[str, list[int]]]] = {}
        for n in nodes:
            out.setdefault(n.pool, []).append((n.name, list(self.node_jobs[n.name])))
        return out

    def _nodes_in(self, pools: tuple[str, ...]) -> tuple[list[NodeSpec], frozenset[int]]:
        """The nodes of ``pools`` and their GPU counts, worked out once per set of pools (asked at
        every arrival; the cluster's nodes never change in a run)."""
        known = self._pool_nodes.get(pools)
        if known is None:
            nodes = [n for n in self.cluster.nodes if n.pool in pools]
            known = self._pool_nodes[pools] = (nodes, frozenset(n.gpus for n in nodes))
        return known

    def quota_blocked(self) -> float:
        """GPU-equivalents of queued workloads whose last attempt found no quota.

        Asked after every event. The figure is kept per workload, in milli-GPUs, and only the
        workloads whose pending reason the session wrote since the last call
        (``Session.reasons.watch``: queued, requeued, admitted, withdrawn or tried again)
        are looked at again, not the whole backlog.
        """
        touched = self._touched
        if touched:
            blocked = self._blocked
            reason_of = self.session.reasons.reason_of
            total = self._blocked_milli
            for key in touched:
                total -= blocked.pop(key, 0)
                if reason_of(key) in QUOTA_REASONS:
                    job = self.jobs[key]
                    blocked[key] = self._milli_per_pod(job) * job.pods
                    total += blocked[key]
            touched.clear()
            self._blocked_milli = total
        return self._blocked_milli / MILLI

    def node_gpus(self, node: str) -> int:
        return self.gpus_of[node]

    def wake_ups(self) -> list[float]:
        out, self._wakes = self._wakes, []
        return out
