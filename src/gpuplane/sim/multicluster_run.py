"""`gpuplane simulate --clusters N`: the three MultiKueue dispatchers on the same workloads.

Each dispatcher runs the whole scenario once over N workers behind one manager
(:class:`gpuplane.sim.multicluster.MultiClusterModel`); the workloads are drawn once and every run
replays them. The document has the fleet (``clusters``, ``workers``), one summary per dispatcher
(``dispatchers``: the simulator's usual figures plus what losing copies cost) and, first, the
result in one sentence (``headline``).

Per dispatcher, beside :func:`gpuplane.sim.metrics.configuration_document`'s figures:

``preemptionsByLosingCopies``
    preemptions started in a worker by a copy of a workload that another worker then won;
``cancelledStarts``
    copies admitted by a worker after another worker had won (or at the same instant);
``cancelledStartGpuHours``
    the GPU-hours lost to them: what those copies held until they were deleted, plus the work
    their victims lost (``heldByLosingCopiesGpuHours`` + ``workLostToLosingCopiesGpuHours``);
``copiesPerWorkload``
    the mean number of workers a dispatched workload was copied to;
``wins``
    workloads each worker won; ``neverDispatched``: workloads no worker was nominated for, by
    the nomination's reason.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gpuplane.insight.dispatch import DISPATCHER_NAMES, POLICIES, DispatchPolicy, parse_policy
from gpuplane.sim.experiment import SimInput
from gpuplane.sim.gpuplane_model import GpuplaneOptions
from gpuplane.sim.headline import duration
from gpuplane.sim.metrics import HOUR, configuration_document
from gpuplane.sim.multicluster import MultiClusterEngine, MultiClusterModel, MultiClusterSettings
from gpuplane.sim.parallel import ProgressCallback, RunResult, Task, run_tasks


@dataclass(frozen=True, slots=True)
class FleetInput:
    """One fleet experiment's input: the drawn scenario and the fleet's settings (the dispatcher
    in ``settings`` is replaced by each run's)."""

    sim: SimInput
    settings: MultiClusterSettings


def run_dispatcher(
    name: str, fleet: FleetInput, progress: Callable[[float], None] | None = None
) -> RunResult:
    """One dispatcher over the fleet: its ledger and its summary (a worker process runs this too)."""
    sim = fleet.sim
    settings = replace(fleet.settings, dispatcher=parse_policy(name))
    model = MultiClusterModel(
        sim.cluster, GpuplaneOptions(), sim.workloads.start, grace=sim.eviction_grace, settings=settings
    )
    started = time.perf_counter()
    engine = MultiClusterEngine(model, sim.workloads, sim.cluster.gpus, sim.reaper_idle, progress=progress)
    ledger = engine.run()
    doc = configuration_document(ledger)
    doc.update(dispatch_figures(model))
    doc["schedulerLivelocks"] = model.livelocks
    doc["wallSeconds"] = round(time.perf_counter() - started, 3)
    return ledger, doc


def dispatch_figures(model: MultiClusterModel) -> dict[str, Any]:
    """What the dispatcher did and what losing copies cost (see the module docstring)."""
    wasted = 0
    lost = 0.0
    copies = 0
    dispatched = 0
    wins: Counter[str] = Counter()
    never: Counter[str] = Counter()
    for entry in model.dispatched.values():
        if entry.ever:
            dispatched += 1
            copies += len(entry.ever)
        if entry.winner is not None:
            wins[model.workers[entry.winner].name] += 1
            wasted += sum(n for i, n in entry.victims.items() if i != entry.winner)
            lost += sum(s for i, s in entry.lost.items() if i != entry.winner)
        elif not entry.copies and entry.reason.startswith("no worker nominated"):
            never[entry.reason] += 1
    held = model.costs.held_gpu_seconds / HOUR
    return {
        "dispatcher": model.settings.dispatcher,
        "dispatcherName": DISPATCHER_NAMES[model.settings.dispatcher],
        "preemptionsByLosingCopies": wasted,
        "cancelledStarts": model.costs.cancelled_starts,
        "cancelledStartGpuHours": round(held + lost / HOUR, 2),
        "heldByLosingCopiesGpuHours": round(held, 2),
        "workLostToLosingCopiesGpuHours": round(lost / HOUR, 2),
        "copiesPerWorkload": round(copies / max(1, dispatched), 2),
        "wins": dict(sorted(wins.items())),
        "neverDispatched": dict(sorted(never.items())),
    }


def parse_dispatchers(text: str | None) -> tuple[DispatchPolicy, ...]:
    """``AllAtOnce,Incremental,gpuplane`` (the default: all three) -> the dispatchers, checked."""
    if text is None:
        return POLICIES
    names = [parse_policy(item) for item in text.split(",") if item.strip()]
    if not names:
        raise ValueError("--dispatchers: name at least one of " + ", ".join(POLICIES))
    return tuple(dict.fromkeys(names))


def run_fleet(
    sim: SimInput,
    settings: MultiClusterSettings,
    dispatchers: Sequence[DispatchPolicy] = POLICIES,
    *,
    jobs: int = 1,
    progress: ProgressCallback | None = None,
) -> dict[str, Any]:
    """Every dispatcher over the same fleet and workloads; the experiment's document."""
    started = time.perf_counter()
    probe = MultiClusterModel(
        sim.cluster, GpuplaneOptions(), sim.workloads.start, grace=sim.eviction_grace, settings=settings
    )
    tasks = [Task(name, name, 0, 1.0) for name in dispatchers]
    results = run_tasks(run_dispatcher, [FleetInput(sim, settings)], tasks, jobs, progress)
    document: dict[str, Any] = {
        "scenario": sim.name,
        "seed": sim.seed,
        "days": sim.days,
        "gpus": sim.cluster.gpus,
        "workloads": len(sim.workloads.jobs),
        "clusters": settings.clusters,
        "workers": [
            {
                "name": w.name,
                "nodes": len(w.cluster.nodes),
                "gpus": w.cluster.gpus,
                "pools": {p: w.cluster.pool_gpus(p) for p in w.cluster.pools},
            }
            for w in probe.workers
        ],
        "dispatchers": {name: doc for name, (_, doc) in zip(dispatchers, results, strict=True)},
        "wallSeconds": round(time.perf_counter() - started, 3),
    }
    document["headline"] = fleet_headline(document)
    return document


def _others(docs: dict[str, dict[str, Any]], key: str, fmt: Callable[[Any], str], skip: str) -> str:
    rest = [f"{name} {fmt(doc[key])}" for name, doc in docs.items() if name != skip]
    return f" ({', '.join(rest)})" if rest else ""


def fleet_headline(document: dict[str, Any]) -> str:
    """The result in one sentence: the gpuplane dispatcher (or the first run) against the others
    on p95 wait, preemptions and GPU-hours lost to cancelled starts."""
    docs: dict[str, dict[str, Any]] = document["dispatchers"]
    if not docs:
        return ""
    lead = "gpuplane" if "gpuplane" in docs else next(iter(docs))
    mine = docs[lead]

    def hours(value: float) -> str:
        return f"{value:,.1f}"

    def count(value: int) -> str:
        return f"{value:,}"

    return (
        f"Over {document['clusters']} clusters behind one manager, the {lead} dispatcher gives a p95 wait of "
        f"{duration(mine['waitP95Seconds'])}{_others(docs, 'waitP95Seconds', duration, lead)}, "
        f"{count(mine['preemptions'])} preemptions{_others(docs, 'preemptions', count, lead)} of which "
        f"{count(mine['preemptionsByLosingCopies'])} by copies that lost"
        f"{_others(docs, 'preemptionsByLosingCopies', count, lead)}, and "
        f"{hours(mine['cancelledStartGpuHours'])} GPU-hours lost to cancelled starts"
        f"{_others(docs, 'cancelledStartGpuHours', hours, lead)}."
    )


ROWS: tuple[tuple[str, str], ...] = (
    ("queue wait p50", "waitP50Seconds"),
    ("queue wait p95", "waitP95Seconds"),
    ("preemptions", "preemptions"),
    ("... started by copies that lost", "preemptionsByLosingCopies"),
    ("cancelled starts", "cancelledStarts"),
    ("GPU-hours lost to cancelled starts", "cancelledStartGpuHours"),
    ("copies per workload", "copiesPerWorkload"),
    ("GPU allocated share", "gpuAllocatedShare"),
    ("busy GPU-hours", "busyGpuHours"),
    ("GPU-hours of work lost", "lostGpuHours"),
    ("workloads started / submitted", ""),
    ("wall time", "wallSeconds"),
)


def table_rows(document: dict[str, Any]) -> list[tuple[str, list[str]]]:
    """The summary table's rows: a label, then one cell per dispatcher."""
    docs: dict[str, dict[str, Any]] = document["dispatchers"]
    rows = []
    for label, key in ROWS:
        cells = []
        for doc in docs.values():
            if not key:
                cells.append(f"{doc['started']:,} / {doc['submitted']:,}")
                continue
            value = doc.get(key)
            if value is None:
                cells.append("-")
            elif key.endswith("Seconds") and key != "wallSeconds":
                cells.append(duration(value))
            elif key == "wallSeconds":
                cells.append(f"{value:.1f} s")
            elif key == "gpuAllocatedShare":
                cells.append(f"{100 * value:.1f} %")
            elif isinstance(value, float):
                cells.append(f"{value:,.2f}")
            else:
                cells.append(f"{value:,}")
        rows.append((label, cells))
    return rows
