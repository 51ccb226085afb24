"""ETA for a pending workload of a real cluster state (after a plan), as a range with its basis.

:mod:`gpuplane.insight.eta` plays a queue forward over one pool of capacity; this module builds
the inputs from what the control plane knows at a moment in time:

* **capacity**: what the workload's ClusterQueue could ever use of its main resource (its
  nominal quota plus what it may borrow from its cohort), and, when nodes are known, the
  accelerators of the nodes;
* **held and releases**: admitted workloads of the queue (and the part of the cohort's
  workloads that borrows) release what they hold at their *expected* end;
* **expected runtimes**: learned per ClusterQueue from finished workloads (admission to
  ``Finished``), conditioned on the runtime a running workload already has (a workload that
  ran 3 h is expected to end with the runs longer than 3 h); a workload may declare its own with
  the ``gpuplane.dev/expected-runtime`` annotation (seconds, or a number with ``s``/``m``/``h``);
  with no history at all a default of one hour is assumed and the basis says so;
* **reclaim**: a queue below its nominal quota whose ClusterQueue may reclaim within the cohort
  gets the borrowed part back now, not when the borrowers end;
* **queue ahead**: the workloads before it in the ClusterQueue start first.

``low``/``high`` play the same queue with the 25th and 75th percentile runtimes (0.5x and 2x the
assumed one without history), ``seconds`` with the median. The estimate ignores arrivals of
higher-priority work and is a lower bound when the pool is fragmented.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.plan import PendingDecision
from gpuplane.core.quota import AdmittedWorkload, ClusterQueueNode, CohortNode
from gpuplane.core.scheduler import Scheduler
from gpuplane.insight.eta import Ahead, latest_start, predict_start
from gpuplane.model.objects import ClusterState, Workload

EXPECTED_RUNTIME_ANNOTATION = "gpuplane.dev/expected-runtime"
DEFAULT_RUNTIME_SECONDS = 3600.0
QUANTILES = (0.25, 0.5, 0.75)
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True, slots=True)
class Estimate:
    """A predicted start as seconds from now; ``None`` everywhere when it never starts by itself."""

    seconds: float | None
    low: float | None
    high: float | None
    basis: str


def declared_runtime(wl: Workload) -> float | None:
    """The workload's own expected runtime annotation, in seconds, if valid."""
    text = wl.annotations.get(EXPECTED_RUNTIME_ANNOTATION)
    if text is None:
        return None
    match = _DURATION.match(text)
    if match is None:
        return None
    return float(match.group(1)) * _UNIT[match.group(2)]


def _started(wl: Workload) -> float | None:
    for ctype in ("Admitted", "QuotaReserved"):
        cond = wl.condition(ctype)
        if cond is not None and cond.status:
            return cond.last_transition
    return None


def learn_runtimes(state: ClusterState) -> dict[str, tuple[float, ...]]:
    """Sorted runtimes of finished workloads per ClusterQueue (``""``: every queue)."""
    out: dict[str, list[float]] = {}
    for wl in state.workloads:
        finished = wl.condition("Finished")
        if finished is None or not finished.status or wl.admission is None:
            continue
        start = _started(wl)
        if start is None or finished.last_transition < start:
            continue
        runtime = finished.last_transition - start
        out.setdefault(wl.admission.cluster_queue, []).append(runtime)
        out.setdefault("", []).append(runtime)
    return {k: tuple(sorted(v)) for k, v in out.items()}


def quantile(samples: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile of sorted ``samples`` (not empty)."""
    if len(samples) == 1:
        return samples[0]
    pos = q * (len(samples) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(samples) - 1)
    return samples[lo] + (samples[hi] - samples[lo]) * (pos - lo)


def _spread(q: float) -> float:
    """A single assumed runtime becomes a range: half of it below the median, twice above."""
    return 0.5 if q < 0.5 else 2.0 if q > 0.5 else 1.0


@dataclass(frozen=True, slots=True)
class RuntimeModel:
    """Expected runtimes per ClusterQueue, learned from finished workloads."""

    samples: Mapping[str, tuple[float, ...]]

    def sample_for(self, queue: str) -> tuple[tuple[float, ...], str]:
        own = self.samples.get(queue)
        if own:
            return own, f"{len(own)} finished in {queue}"
        every = self.samples.get("")
        if every:
            return every, f"{len(every)} finished cluster-wide"
        return (), "no finished workloads"

    def total(self, wl: Workload | None, queue: str, q: float) -> float:
        """Expected total runtime at quantile ``q``."""
        declared = declared_runtime(wl) if wl is not None else None
        if declared is not None:
            return declared * _spread(q)
        samples, _ = self.sample_for(queue)
        if not samples:
            return DEFAULT_RUNTIME_SECONDS * _spread(q)
        return quantile(samples, q)

    def remaining(self, wl: Workload | None, queue: str, elapsed: float, q: float) -> float:
        """Expected remaining runtime of a workload that has run ``elapsed`` seconds."""
        declared = declared_runtime(wl) if wl is not None else None
        samples, _ = self.sample_for(queue)
        if declared is not None or not samples:
            return max(0.0, self.total(wl, queue, q) - elapsed)
        longer = [s - elapsed for s in samples if s > elapsed]
        return quantile(longer, q) if longer else 0.0


def main_resource(wl: Workload, config: SchedulerConfig) -> str:
    """The resource a workload's wait is measured in: its accelerator, else its largest request."""
    totals: dict[str, int] = {}
    for ps in wl.pod_sets:
        for res, q in ps.template.requests.items():
            totals[res] = totals.get(res, 0) + q * ps.count
    devices = sorted(r for r in totals if config.devices.is_device_resource(r) and totals[r])
    if devices:
        return devices[0]
    return max(sorted(totals), key=lambda r: totals[r], default="")


def _need(wl: Workload, resource: str) -> float:
    return float(sum(ps.template.requests.get(resource, 0) * ps.count for ps in wl.pod_sets))


def _cohort_queues(cq: ClusterQueueNode) -> list[ClusterQueueNode]:
    root = cq.root()
    return list(root.subtree_queues()) if isinstance(root, CohortNode) else [cq]


def _held(aw: AdmittedWorkload, frs: Iterable[tuple[str, str]]) -> float:
    return float(sum(aw.usage.get(fr, 0) for fr in frs))


def estimate(
    world: Scheduler,
    pending: PendingDecision,
    ahead: Sequence[PendingDecision],
    *,
    runtimes: RuntimeModel,
    config: SchedulerConfig,
    now: float,
) -> Estimate:
    """ETA of ``pending`` (queued in ``world``), with ``ahead`` the pending workloads before it."""
    wl = world.workloads.get(pending.workload)
    cq = world.tree.queues.get(pending.cluster_queue or "")
    if wl is None or cq is None:
        return Estimate(None, None, None, "not queued in a ClusterQueue")
    resource = main_resource(wl, config)
    need = _need(wl, resource)
    group = cq.group_for(resource)
    flavors = [f.name for f in group.flavors] if group is not None else []
    frs = [(f, resource) for f in flavors]
    capacity = float(sum(cq.potential_available(fr) for fr in frs))
    free = float(sum(cq.available(fr) for fr in frs))
    if need > capacity:
        return Estimate(
            None, None, None, f"needs {need:g} {resource}; ClusterQueue can use at most {capacity:g}"
        )
    nominal = sum(cq.quota_for(fr).nominal for fr in frs)
    own_usage = sum(cq.usage.get(fr, 0) for fr in frs)
    reclaim = own_usage < nominal and cq.spec.preemption.reclaim_within_cohort != "Never"
    samples, sample_basis = runtimes.sample_for(pending.cluster_queue or "")
    workloads = world.workloads

    def releases(q: float) -> list[tuple[float, float]]:
        pool = frs
        out: list[tuple[float, float]] = []
        for queue in _cohort_queues(cq):
            borrowed = sum(max(0, queue.usage.get(fr, 0) - queue.quota_for(fr).nominal) for fr in pool)
            for aw in sorted(queue.workloads.values(), key=lambda a: a.key):
                amount = _held(aw, pool)
                if not amount:
                    continue
                if queue is not cq:
                    amount = min(amount, float(borrowed))  # only what it borrows comes back to us
                    if not amount:
                        continue
                if queue is not cq and reclaim:
                    out.append((now, amount))
                    continue
                elapsed = max(0.0, now - aw.reserved_at)
                out.append((now + runtimes.remaining(workloads.get(aw.key), queue.name, elapsed, q), amount))
        return sorted(out)

    def one(q: float) -> float | None:
        queued = [
            Ahead(
                _need(workloads[p.workload], resource) if p.workload in workloads else 0.0,
                runtimes.total(workloads.get(p.workload), pending.cluster_queue or "", q),
            )
            for p in ahead
        ]
        views = [
            predict_start(
                now,
                need,
                capacity=capacity,
                held=capacity - free,
                releases=releases(q),
                ahead=queued,
            )
        ]
        cluster = world.cluster
        if (
            cluster is not None
            and config.devices.is_device_resource(resource)
            and resource in (config.devices.whole_resources)
        ):
            devices = [d for s in cluster.nodes.values() for d in s.devices if d.sharing == "exclusive"]
            node_capacity = float(len(devices))
            node_free = float(sum(1 for d in devices if d.free_whole))
            everyone = sorted(
                (
                    now
                    + runtimes.remaining(
                        workloads.get(aw.key), aw.cluster_queue, max(0.0, now - aw.reserved_at), q
                    ),
                    float(sum(v for (_, res), v in aw.usage.items() if res == resource)),
                )
                for aw in world.tree.admitted.values()
            )
            views.append(
                predict_start(
                    now,
                    need,
                    capacity=node_capacity,
                    held=node_capacity - node_free,
                    releases=everyone,
                    ahead=queued,
                )
            )
            if single_pod is not None:
                views.append(_one_node(world, single_pod, runtimes, now, q))
        return latest_start(views)

    pods = [ps for ps in wl.pod_sets if ps.count]
    single_pod = (
        float(pods[0].template.requests.get(resource, 0))
        if len(pods) == 1 and pods[0].count == 1 and resource in config.devices.whole_resources
        else None
    )
    starts = [one(q) for q in QUANTILES]
    low, mid, high = (None if s is None else round(max(0.0, s - now), 1) for s in starts)
    if mid is None:
        return Estimate(None, None, None, f"never: {need:g} {resource} never free for this workload")
    parts = [
        f"{len(ahead)} ahead in ClusterQueue {pending.cluster_queue}",
        f"{capacity - free:g}/{capacity:g} {resource} in use",
    ]
    if samples:
        parts.append(f"runtimes from {sample_basis} (median {quantile(samples, 0.5):.0f}s)")
    else:
        parts.append(f"no finished workloads: runtime assumed {DEFAULT_RUNTIME_SECONDS:.0f}s")
    if reclaim:
        parts.append("borrowed quota reclaimed now")
    if world.cluster is not None:
        parts.append("node capacity checked" + ("; the pod needs one node with room" if single_pod else ""))
    return Estimate(mid, low, high, "; ".join(parts))


def _one_node(world: Scheduler, need: float, runtimes: RuntimeModel, now: float, q: float) -> float | None:
    """When the first node has ``need`` free whole GPUs, as its holders end (a pod fits on one node)."""
    cluster = world.cluster
    assert cluster is not None
    best: float | None = None
    for state in cluster.nodes.values():
        devices = [d for d in state.devices if d.sharing == "exclusive"]
        if len(devices) < need or state.node.unschedulable:
            continue
        releases: list[tuple[float, float]] = []
        for owner, items in cluster.owners.items():
            amount = sum(n.whole for name, n, _ in items if name == state.name)
            if not amount:
                continue
            held = world.tree.admitted.get(owner)
            wl = world.workloads.get(owner)
            if held is not None:
                elapsed = max(0.0, now - held.reserved_at)
                end = now + runtimes.remaining(wl, held.cluster_queue, elapsed, q)
            else:  # a pod outside any queue: no history of its own
                end = now + runtimes.total(None, "", q)
            releases.append((end, float(amount)))
        capacity = float(len(devices))
        free = float(sum(1 for d in devices if d.free_whole))
        start = predict_start(now, need, capacity=capacity, held=capacity - free, releases=sorted(releases))
        if start is not None and (best is None or start < best):
            best = start
    return best
