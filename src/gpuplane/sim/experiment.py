"""Run named configurations on the same workloads and collect their summaries.

Configurations::

    stock                  stock Kubernetes (gpuplane.sim.stock), default LeastAllocated scoring
    stock-packed           ... with MostAllocated (bin-packing) scoring
    gpuplane               the real core, every feature on (gpuplane.sim.gpuplane_model)
    gpuplane-no-sharing    ... every GPU request takes whole GPUs, MIG off
    gpuplane-no-borrowing  ... no queue may borrow beyond its floor
    gpuplane-no-reaper     ... idle sessions are never reaped
    gpuplane-no-backfill   ... CI/evaluation is ordinary work, not a preemptible backfill tier
    gpuplane-no-preemption ... nothing is ever preempted
    kueue                  Kueue's admission in front of kube-scheduler (gpuplane.sim.kueue_model)
    kueue-timeslicing      ... with the device plugin's time-slicing on the inference and notebook pools
    volcano                Volcano: gang scheduling at placement, bin-packing, queues with reclaim
                           (gpuplane.sim.volcano_model)

The workloads (arrivals, sizes, durations, busy traces, node failures) are drawn once and every
configuration replays exactly them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpuplane.sim.cluster import ClusterSpec, cluster_from_scenario
from gpuplane.sim.engine import Engine, Model
from gpuplane.sim.gpuplane_model import GpuplaneModel, GpuplaneOptions
from gpuplane.sim.kueue_model import KueueModel, replicas_fitting_memory, time_sliced_pools
from gpuplane.sim.metrics import Ledger, configuration_document
from gpuplane.sim.parallel import ProgressCallback, RunResult, Task, labelled, run_tasks
from gpuplane.sim.scenario import Scenario
from gpuplane.sim.stock import StockModel
from gpuplane.sim.volcano_model import VolcanoModel
from gpuplane.sim.wait_cut import WaitCut
from gpuplane.sim.workloads import Workloads, generate, offered_gpus

DEFAULT_CONFIGURATIONS = ("stock", "gpuplane")
GPUPLANE_VARIANTS: dict[str, GpuplaneOptions] = {
    "gpuplane": GpuplaneOptions(),
    "gpuplane-no-sharing": GpuplaneOptions(sharing=False),
    "gpuplane-no-borrowing": GpuplaneOptions(borrowing=False),
    "gpuplane-no-reaper": GpuplaneOptions(reaper=False),
    "gpuplane-no-backfill": GpuplaneOptions(backfill=False),
    "gpuplane-no-preemption": GpuplaneOptions(preemption=False),
}
STOCK_VARIANTS = {"stock": False, "stock-packed": True}
PEERS = ("kueue", "kueue-timeslicing", "volcano")
# What each peer adds to the configuration it is built on: where gpuplane's lead over a peer
# falls short, the capacity this feature adds is what closes the gap (the sweep's ``peerGaps``).
PEER_FEATURES: dict[str, tuple[str, str]] = {
    "kueue": ("stock", "Kueue's quota admission with cohorts, borrowing and preemption"),
    "kueue-timeslicing": ("kueue", "the device plugin's time-slicing on the inference and notebook pools"),
    "volcano": ("stock", "gang scheduling at placement with bin-packing and queue reclaim"),
}
CONFIGURATIONS = (*STOCK_VARIANTS, *GPUPLANE_VARIANTS, *PEERS)


@dataclass(frozen=True, slots=True)
class SimInput:
    """Everything one experiment runs on: a cluster, the workloads, policy settings."""

    name: str
    cluster: ClusterSpec
    workloads: Workloads
    reaper_idle: float
    deadlock_timeout: float
    eviction_grace: float
    seed: int | None = None
    days: float = 0.0
    sources: tuple[tuple[str, str, str], ...] = ()
    notes: dict[str, Any] = field(default_factory=dict)
    # Whether a run predicts each pending job's ETA (its etaError figures): a capacity search asks
    # only for the waits, and on the core the predictions cost about a tenth of a run near capacity.
    eta: bool = True


def scenario_input(scenario: Scenario) -> SimInput:
    """Draw a scenario's workloads once."""
    return SimInput(
        name=scenario.name,
        cluster=cluster_from_scenario(scenario),
        workloads=generate(scenario),
        reaper_idle=scenario.policies.reaper_idle.mean,
        deadlock_timeout=scenario.policies.deadlock_timeout.mean,
        eviction_grace=scenario.policies.eviction_grace.mean,
        seed=scenario.seed,
        days=scenario.days,
        sources=scenario.sources,
        notes={"offeredGpus": {k: round(v, 1) for k, v in offered_gpus(scenario).items()}},
    )


@dataclass(frozen=True, slots=True)
class ScenarioDraw:
    """A scenario's input, drawn where it runs (:meth:`draw`, :func:`scenario_input`): handed to
    :class:`~gpuplane.sim.parallel.Workers`, the worker process draws it itself, so the parent
    neither draws nor pickles a week of workloads (about 2.5 s of its CPU at load 2.2 on the
    built-in week) while the workers wait for their next run, and the worker draws instead of
    unpickling (about as long). What a search reads of an input before its run (its cluster, name,
    seed and days) needs no draw. ``eta``: :attr:`SimInput.eta` of the input drawn."""

    scenario: Scenario
    eta: bool = True

    @property
    def cluster(self) -> ClusterSpec:
        return cluster_from_scenario(self.scenario)

    @property
    def name(self) -> str:
        return self.scenario.name

    @property
    def seed(self) -> int | None:
        return self.scenario.seed

    @property
    def days(self) -> float:
        return self.scenario.days

    def draw(self) -> SimInput:
        sim = scenario_input(self.scenario)
        return sim if self.eta else replace(sim, eta=False)


def build_model(name: str, sim: SimInput) -> Model:
    if name in STOCK_VARIANTS:
        return StockModel(sim.cluster, sim.deadlock_timeout, packed=STOCK_VARIANTS[name], name=name)
    if name in PEERS:
        return _peer(name, sim)
    options = GPUPLANE_VARIANTS.get(name)
    if options is None:
        raise KeyError(f"unknown configuration {name!r} (known: {', '.join(CONFIGURATIONS)})")
    return GpuplaneModel(name, sim.cluster, options, sim.workloads.start, grace=sim.eviction_grace)


def _peer(name: str, sim: SimInput) -> Model:
    """A peer configuration: what users run instead of gpuplane."""
    if name in ("kueue", "kueue-timeslicing"):
        jobs = sim.workloads.jobs
        sliced = time_sliced_pools(jobs, sim.cluster.pools) if name == "kueue-timeslicing" else ()
        return KueueModel(
            name,
            sim.cluster,
            sim.deadlock_timeout,
            sim.workloads.start,
            grace=sim.eviction_grace,
            time_sliced=sliced,
            replicas=replicas_fitting_memory(jobs, sliced),
        )
    if name == "volcano":
        return VolcanoModel(sim.cluster, name=name)
    raise KeyError(f"unknown configuration {name!r} (known: {', '.join(CONFIGURATIONS)})")


@dataclass(slots=True)
class ExperimentResult:
    sim: SimInput
    ledgers: dict[str, Ledger]
    document: dict[str, Any]


def run_configuration(
    name: str, sim: SimInput, progress: ProgressCallback | None = None
) -> tuple[Ledger, dict[str, Any]]:
    return run_named(name, sim, labelled(progress, name))


def over_target_share(doc: dict[str, Any]) -> float | None:
    """The share of a run's waits over its wait target, from its summary (:func:`run_named`
    with ``cut_above``); None where the run did not tell it (cut too early to project one)."""
    value = doc.get("waitOverTargetShare")
    return None if value is None else float(value)


def run_named(
    name: str,
    sim: SimInput,
    progress: Callable[[float], None] | None = None,
    cut_above: float | None = None,
) -> RunResult:
    """One configuration on ``sim``: its ledger and its summary (a worker process runs this too).
    Given ``cut_above`` (a wait target, seconds), the run stops once its p95 wait is sure to be
    above it (:mod:`gpuplane.sim.wait_cut`), and its summary has ``waitOverTargetShare``
    (:meth:`~gpuplane.sim.wait_cut.WaitCut.over_share`)."""
    model = build_model(name, sim)
    started = time.perf_counter()
    cut = None if cut_above is None else WaitCut(cut_above, sim.workloads.jobs)
    engine = Engine(
        model, sim.workloads, sim.cluster.gpus, sim.reaper_idle, progress=progress, cut=cut, predict=sim.eta
    )
    ledger = engine.run()
    doc = configuration_document(ledger)
    if cut is not None:
        end = sim.workloads.horizon if ledger.cut is None else ledger.cut.at
        share = cut.over_share(end, sim.workloads.horizon)
        doc["waitOverTargetShare"] = None if share is None else round(share, 5)
    doc["schedulerLivelocks"] = getattr(model, "livelocks", 0)
    extras = getattr(model, "document_extras", None)
    if extras is not None:
        doc.update(extras())
    doc["wallSeconds"] = round(time.perf_counter() - started, 3)
    return ledger, doc


def check_names(names: tuple[str, ...]) -> None:
    unknown = [n for n in names if n not in CONFIGURATIONS]
    if unknown:
        raise KeyError(f"unknown configuration {unknown[0]!r} (known: {', '.join(CONFIGURATIONS)})")


def expected_cost(name: str) -> float:
    """A rough relative cost, only to start the longest runs first: the core costs more than stock."""
    return 2.0 if name in GPUPLANE_VARIANTS or name in PEERS else 1.0


def run_experiment(
    sim: SimInput,
    names: tuple[str, ...] = DEFAULT_CONFIGURATIONS,
    progress: ProgressCallback | None = None,
    jobs: int = 1,
) -> ExperimentResult:
    """Run every named configuration on ``sim`` (names are checked before anything runs), in up to
    ``jobs`` processes at once (:mod:`gpuplane.sim.parallel`; the results do not depend on it)."""
    check_names(names)
    started = time.perf_counter()
    unique = tuple(dict.fromkeys(names))
    tasks = [Task(name, name, 0, expected_cost(name)) for name in unique]
    results = run_tasks(run_named, [sim], tasks, jobs, progress)
    return experiment_result(sim, unique, results, time.perf_counter() - started)


def experiment_result(
    sim: SimInput, names: tuple[str, ...], results: list[RunResult], wall: float
) -> ExperimentResult:
    """The experiment's document from its runs (``results`` in the order of ``names``)."""
    ledgers = {name: ledger for name, (ledger, _) in zip(names, results, strict=True)}
    configurations = {name: doc for name, (_, doc) in zip(names, results, strict=True)}
    document: dict[str, Any] = {
        "scenario": sim.name,
        "seed": sim.seed,
        "days": sim.days,
        "gpus": sim.cluster.gpus,
        "workloads": len(sim.workloads.jobs),
        "wallSeconds": round(wall, 3),
        "configurations": configurations,
    }
    document.update(sim.notes)
    return ExperimentResult(sim, ledgers, document)
