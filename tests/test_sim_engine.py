"""The simulator's semantics on hand-built workloads, and its invariants on random small scenarios.

Hand-built cases pin one behaviour each (checkpoint loss, reaping and resuming, partly placed and
deadlocked gangs under stock Kubernetes, node failure). The property tests draw small scenarios
with hypothesis and check, after every scheduling pass, that no GPU is over-allocated and that a
gpuplane gang never runs partly; and, at the end, that GPU-hours add up.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Self

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.engine import HOLD, YOUNG_GENERATION, Change, Engine, Model, checkpoint_at
from gpuplane.sim.experiment import CONFIGURATIONS, SimInput, build_model, scenario_input
from gpuplane.sim.gpuplane_model import GpuplaneModel, GpuplaneOptions
from gpuplane.sim.metrics import HOUR, Ledger, configuration_document, total
from gpuplane.sim.scenario import Scenario, Team, parse_scenario
from gpuplane.sim.stock import StockModel
from gpuplane.sim.workloads import Job, NodeEvent, Request, Workloads

A100 = "A100-80GB"

# ---------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------


def cluster(nodes: int, gpus: int, teams: dict[str, float], pool: str = "gpu") -> ClusterSpec:
    return ClusterSpec(
        nodes=tuple(NodeSpec(f"{pool}-{i:03d}", pool, gpus, A100, 81920) for i in range(nodes)),
        pools=(pool,),
        teams=tuple(Team(name, floor, floor) for name, floor in teams.items()),
    )


@dataclass
class Jobs:
    """Fluent list of hand-made jobs: ``Jobs().add("a", at=0, gpus=8, work=3600)``."""

    jobs: list[Job] = field(default_factory=list)

    def add(
        self,
        team: str,
        *,
        at: float,
        work: float,
        gpus: int = 1,
        pods: int = 1,
        fraction: int = 0,
        checkpoint: float | None = None,
        active: tuple[float, ...] = (),
        busy: float = 1.0,
        tier: str = "normal",
        klass: str = "job",
    ) -> Self:
        request = Request(fraction_milli=fraction) if fraction else Request(gpus=gpus)
        self.jobs.append(
            Job(
                id=len(self.jobs),
                name=f"{klass}-{len(self.jobs):03d}",
                team=team,
                klass=klass,
                tier=tier,
                submit=at,
                pods=pods,
                request=request,
                pools=("gpu",),
                work=work,
                startup=0.0,
                activity=busy * (request.gpus or 1),
                expected=work,
                checkpoint=checkpoint,
                stateless=bool(active),
                active=active,
            )
        )
        return self

    def workloads(self, horizon: float, failures: Iterable[NodeEvent] = ()) -> Workloads:
        return Workloads(tuple(self.jobs), tuple(failures), 0.0, horizon)


def run(
    name: str, spec: ClusterSpec, workloads: Workloads, reaper_idle: float = 3600.0, deadlock: float = 3600.0
) -> dict[str, Any]:
    sim = SimInput("test", spec, workloads, reaper_idle, deadlock, 30.0)
    ledger = Engine(build_model(name, sim), workloads, spec.gpus, reaper_idle).run()
    return configuration_document(ledger)


# ---------------------------------------------------------------------------
# Hand-built behaviour
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compute_start", "period", "due"),
    [
        # A checkpoint's own instant, where (due - start) / period rounds to just below the whole
        # number it is: the last checkpoint was taken as the one before, and the next one was due
        # at ``due`` again, for ever (the engine's checkpoint loop never ended).
        (0.0, 4845.234210820203, 130821.32369214547),
        (308529.426927731, 2.2, 308639.426927731),
        (102227.15811004823, 153.91932518473413, 109615.28571891546),
    ],
)
def test_checkpoint_at_its_own_instant_is_the_last_one(
    compute_start: float, period: float, due: float
) -> None:
    last, following = checkpoint_at(compute_start, period, due)
    assert last == due
    assert following > due
    assert following == pytest.approx(due + period)


@settings(max_examples=300, deadline=None)
@given(
    compute_start=st.floats(0, 1e7),
    period=st.floats(0.5, 1e5),
    steps=st.integers(0, 10_000),
    into=st.floats(0, 1, exclude_max=True),
)
def test_checkpoint_at_moves_on(compute_start: float, period: float, steps: int, into: float) -> None:
    """The next checkpoint is always due after ``now``, and the last one is at most one period
    before it: a loop over the due checkpoints ends."""
    now = compute_start + (steps + into) * period
    last, following = checkpoint_at(compute_start, period, now)
    assert last <= now < following
    assert now - last <= period * (1 + 1e-9) + 1e-6


def test_reclaim_loses_only_work_since_the_last_checkpoint() -> None:
    # blue borrows the whole node; red reclaims its floor 50 minutes later.
    spec = cluster(1, 8, {"red": 1, "blue": 1})
    jobs = Jobs().add("blue", at=0, gpus=8, work=36000, checkpoint=1800).add("red", at=3000, gpus=4, work=600)
    doc = run("gpuplane", spec, jobs.workloads(7200))
    assert doc["preemptions"] == 1
    # 3000 s of compute, checkpointed at 1800 s: 1200 s x 8 GPUs are lost.
    assert doc["lostGpuHours"] == pytest.approx(1200 * 8 / HOUR, abs=0.01)
    assert doc["teams"]["red"]["waitMaxSeconds"] == 0.0


def test_reclaim_at_a_checkpoint_instant_keeps_that_checkpoint() -> None:
    # 27 periods of this length end at ``due``, though due / period rounds to just below 27: the
    # checkpoint taken at that instant is the one the work keeps (before, one period was lost).
    period, due = 4845.234210820203, 130821.32369214547
    assert math.floor(due / period) == 26
    spec = cluster(1, 8, {"red": 1, "blue": 1})
    jobs = (
        Jobs().add("blue", at=0, gpus=8, work=400_000, checkpoint=period).add("red", at=due, gpus=4, work=600)
    )
    doc = run("gpuplane", spec, jobs.workloads(due + 7200))
    assert doc["preemptions"] == 1
    assert doc["lostGpuHours"] == 0.0


def test_work_without_checkpoints_loses_everything_since_it_started() -> None:
    spec = cluster(1, 8, {"red": 1, "blue": 1})
    jobs = Jobs().add("blue", at=0, gpus=8, work=36000).add("red", at=3000, gpus=4, work=600)
    doc = run("gpuplane", spec, jobs.workloads(7200))
    assert doc["lostGpuHours"] == pytest.approx(3000 * 8 / HOUR, abs=0.01)


def test_a_run_sets_the_collector_for_itself_and_restores_it() -> None:
    spec = cluster(1, 8, {"red": 1})
    jobs = Jobs().add("red", at=0, gpus=8, work=600)
    seen: list[tuple[tuple[int, int, int], int]] = []

    class Watching(GpuplaneModel):
        def submit(self, job: Job, now: float) -> None:
            seen.append((gc.get_threshold(), gc.get_freeze_count()))
            super().submit(job, now)

    sim = SimInput("test", spec, jobs.workloads(3600), 3600.0, 3600.0, 30.0)
    before = gc.get_threshold(), gc.get_freeze_count()
    Engine(Watching("gpuplane", spec, GpuplaneOptions(), 0.0), sim.workloads, spec.gpus, 3600.0).run()
    assert (gc.get_threshold(), gc.get_freeze_count()) == before
    ((threshold, frozen),) = seen
    assert threshold[0] >= YOUNG_GENERATION
    assert frozen > before[1]  # what existed when the run began: the drawn jobs among it


def test_idle_session_is_reaped_and_resumed_when_the_user_returns() -> None:
    # Active 0..600, idle until 7800, active again until 8400, then done at 9000.
    spec = cluster(1, 4, {"red": 1})
    jobs = Jobs().add("red", at=0, work=9000, fraction=500, active=(0, 600, 7800, 8400), busy=0.4, klass="nb")
    with_reaper = run("gpuplane", spec, jobs.workloads(20000), reaper_idle=3600)
    without = run("gpuplane-no-reaper", spec, jobs.workloads(20000), reaper_idle=3600)
    assert with_reaper["sessionsReaped"] == 1  # the final idle tail (600 s) is below the threshold
    assert with_reaper["sessionsResumed"] == 1
    assert without["sessionsReaped"] == 0
    # Held 0..4200 (reaped an hour into the idle stretch) and 7800..9000, at half a GPU.
    assert with_reaper["allocatedGpuHours"] == pytest.approx(0.5 * (4200 + 1200) / HOUR, abs=0.01)
    assert without["allocatedGpuHours"] == pytest.approx(0.5 * 9000 / HOUR, abs=0.01)
    # Busy time is the same: the reaper only takes idle time away.
    assert with_reaper["busyGpuHours"] == pytest.approx(without["busyGpuHours"], abs=0.01)
    assert with_reaper["busyGpuHours"] == pytest.approx(0.4 * 1200 / HOUR, abs=0.01)


def test_stock_partly_placed_gang_holds_gpus_gpuplane_does_not() -> None:
    # Two 4-GPU nodes; a 1-GPU job runs on one of them for an hour, then a 2 x 4-GPU gang arrives.
    spec = cluster(2, 4, {"red": 1})
    jobs = (
        Jobs().add("red", at=0, gpus=1, work=3600).add("red", at=10, gpus=4, pods=2, work=600, klass="gang")
    )
    stock = run("stock", spec, jobs.workloads(7200))
    gpuplane = run("gpuplane", spec, jobs.workloads(7200))
    assert stock["deadlockedGpuHours"] == pytest.approx(4 * 3590 / HOUR, abs=0.01)
    assert gpuplane["deadlockedGpuHours"] == 0.0
    for doc in (stock, gpuplane):
        assert doc["classes"]["gang"]["waitMaxSeconds"] == pytest.approx(3590, abs=1)


def test_stock_gang_larger_than_its_quota_is_a_circular_deadlock_and_gets_restarted() -> None:
    # red's quota is 4 GPUs: a 2 x 4-GPU gang can create one pod only, which binds and waits.
    spec = cluster(2, 4, {"red": 1, "blue": 1})
    jobs = Jobs().add("red", at=0, gpus=4, pods=2, work=600, klass="gang")
    stock = run("stock", spec, jobs.workloads(4 * 3600), deadlock=3600)
    assert stock["circularDeadlockGpuHours"] == pytest.approx(4 * 4, abs=0.1)
    assert stock["deadlockRestarts"] == 3
    assert stock["started"] == 0
    gpuplane = run("gpuplane", spec, jobs.workloads(4 * 3600))
    assert gpuplane["started"] == 1  # red borrows blue's idle floor


def test_node_failure_stops_work_and_requeues_it() -> None:
    spec = cluster(2, 8, {"red": 1})
    jobs = Jobs().add("red", at=0, gpus=8, work=7200, checkpoint=600)
    failures = [NodeEvent(1000, "gpu-000", up=False), NodeEvent(5000, "gpu-000", up=True)]
    for name in ("stock", "gpuplane"):
        doc = run(name, spec, jobs.workloads(20000, failures))
        assert doc["interruptedByNodeFailure"] == 1
        assert doc["nodeFailures"] == 1
        assert doc["lostGpuHours"] == pytest.approx(400 * 8 / HOUR, abs=0.01)
        assert doc["downGpuHours"] == pytest.approx(8 * 4000 / HOUR, abs=0.01)
        assert doc["completed"] == 1


def test_stock_rounds_fractions_up_to_whole_gpus() -> None:
    spec = cluster(1, 4, {"red": 1})
    jobs = Jobs()
    for i in range(4):
        jobs.add("red", at=i, work=3600, fraction=250, busy=0.2)
    stock = run("stock", spec, jobs.workloads(3600))
    gpuplane = run("gpuplane", spec, jobs.workloads(3600))
    assert stock["gpuAllocatedShare"] == pytest.approx(1.0, abs=0.01)
    assert gpuplane["gpuAllocatedShare"] == pytest.approx(0.25, abs=0.01)
    assert stock["gpuBusyShare"] == pytest.approx(0.2, abs=0.01)
    assert gpuplane["gpuBusyShare"] == pytest.approx(0.8, abs=0.01)


# ---------------------------------------------------------------------------
# Properties on random small scenarios
# ---------------------------------------------------------------------------


def _param(value: object, **extra: object) -> dict[str, object]:
    return {"value": value, "source": "assumed: property test", **extra}


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    pools = []
    for i in range(draw(st.integers(1, 2))):
        gpus = draw(st.sampled_from([2, 4, 8]))
        pool: dict[str, object] = {
            "name": f"p{i}",
            "model": A100,
            "nodes": _param(draw(st.integers(1, 3))),
            "gpusPerNode": _param(gpus),
            "gpuMemoryMiB": _param(81920),
        }
        if gpus == 8 and draw(st.booleans()):
            pool["mig"] = {
                "layout": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
                "source": "domain-facts §1.1",
            }
        pools.append(pool)
    whole = [p["name"] for p in pools if "mig" not in p]
    migs = [p["name"] for p in pools if "mig" in p]
    smallest = min(int(p["gpusPerNode"]["value"]) for p in pools if "mig" not in p) if whole else 0  # type: ignore[index]
    classes = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["whole", "fraction", "mig", "session"]))
        if kind == "mig" and not migs:
            kind = "whole"
        if kind != "mig" and not whole:
            kind = "mig"
        shape: dict[str, object] = {"weight": _param(1), "pods": _param(1)}
        klass: dict[str, object] = {
            "name": f"c{i}",
            "arrivalsPerDay": _param(draw(st.integers(5, 300))),
            "duration": _param(draw(st.integers(5, 300)), unit="min"),
            "startup": _param(draw(st.integers(0, 5)), unit="min"),
            "busy": {"uniform": [0.1, 0.9], "source": "assumed"},
            "tier": draw(st.sampled_from(["normal", "backfill"])),
        }
        if kind == "whole":
            shape |= {"pools": whole, "gpus": _param(draw(st.integers(1, smallest)))}
            shape["pods"] = _param(draw(st.integers(1, 3)))
            klass["checkpoint"] = _param(draw(st.integers(5, 60)), unit="min")
        elif kind == "mig":
            shape |= {"pools": migs, "mig": draw(st.sampled_from(["3g.40gb", "2g.20gb", "1g.10gb"]))}
            klass["stateless"] = True
        else:
            shape |= {"pools": whole, "fraction": _param(draw(st.sampled_from([0.25, 0.5])))}
            klass["stateless"] = True
            if kind == "session":
                klass["session"] = {
                    "active": {"exponential": {"mean": 10}, "unit": "min", "source": "assumed"},
                    "idle": {"exponential": {"mean": 30}, "unit": "min", "source": "assumed"},
                    "tail": {"exponential": {"mean": 60}, "unit": "min", "source": "assumed"},
                }
        klass["shapes"] = [shape]
        classes.append(klass)
    doc = {
        "name": "property",
        "days": _param(0.5),
        "seed": draw(st.integers(0, 10_000)),
        "cluster": {
            "pools": pools,
            "failures": {"mtbf": _param(1, unit="d"), "repair": _param(1, unit="h")},
        },
        "teams": [
            {"name": "red", "floor": _param(draw(st.integers(1, 3)))},
            {"name": "blue", "floor": _param(1), "demand": _param(draw(st.integers(0, 3)))},
        ],
        "classes": classes,
        "policies": {"reaperIdle": _param(20, unit="min"), "deadlockTimeout": _param(30, unit="min")},
    }
    return parse_scenario(doc, "property")


def _check_gpuplane(model: GpuplaneModel) -> None:
    devices = model.session.device_use()
    assert devices
    for device in devices:
        assert 0 <= device.milli_used <= 1000
        assert device.whole_by is None or device.milli_used == 0
    used: dict[str, float] = {}
    for key, nodes in model.placed.items():
        job = model.jobs[key]
        # All-or-nothing: an admitted gang has every pod placed.
        assert len(nodes) == job.pods, key
        per_pod, _ = model.allocation(job)
        for node in nodes:
            used[node] = used.get(node, 0.0) + per_pod
    for node, amount in used.items():
        assert amount <= model.gpus_of[node] + 1e-9, node


def _check_stock(model: StockModel) -> None:
    assert (model.gpu_free >= 0).all()
    bound = model.gpu_total - model.gpu_free
    recount = bound * 0
    for sj in model.jobs.values():
        for node in sj.bound:
            recount[node] += sj.gpus
    assert (recount == bound).all()


def _checked(model: Model) -> Model:
    """Wrap a model's scheduling pass and changes with the invariant checks."""
    schedule = model.schedule
    take_changes = model.take_changes
    full: dict[int, float] = {}

    def checked_schedule(now: float, checkpoints: Callable[[], Iterable[tuple[Job, float]]]) -> int:
        cycles = schedule(now, checkpoints)
        if isinstance(model, GpuplaneModel):
            _check_gpuplane(model)
        elif isinstance(model, StockModel):
            _check_stock(model)
        return cycles

    def checked_take_changes() -> list[Change]:
        changes = take_changes()
        if isinstance(model, GpuplaneModel):
            for change in changes:
                if change.kind == HOLD and change.level:
                    job = model.jobs.get(next((k for k, j in model.jobs.items() if j.id == change.job), ""))
                    if job is not None:
                        per_pod, _ = model.allocation(job)
                        full[change.job] = per_pod * job.pods
                        # A gang holds all of its GPUs or none.
                        assert change.level == pytest.approx(full[change.job])
        return changes

    model.schedule = checked_schedule  # type: ignore[method-assign]
    model.take_changes = checked_take_changes  # type: ignore[method-assign]
    return model


def _conservation(ledger: Ledger) -> None:
    stats = total(ledger.groups.values())
    capacity = ledger.gpus * ledger.horizon
    assert stats.busy <= stats.allocated + 1e-6
    assert stats.allocated <= capacity + 1e-6
    for group in ledger.groups.values():
        assert group.busy <= group.allocated + 1e-6
    assert ledger.allocated_series.values.sum() == pytest.approx(stats.allocated, rel=1e-9, abs=1e-6)
    assert ledger.busy_series.values.sum() == pytest.approx(stats.busy, rel=1e-9, abs=1e-6)
    width = ledger.allocated_series.width
    assert (ledger.allocated_series.values <= ledger.gpus * width + 1e-6).all()
    assert (ledger.busy_series.values <= ledger.allocated_series.values + 1e-6).all()
    doc = configuration_document(ledger)
    assert doc["allocatedGpuHours"] == pytest.approx(doc["busyGpuHours"] + doc["idleGpuHours"], abs=0.02)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=scenarios(), name=st.sampled_from(CONFIGURATIONS))
def test_invariants_hold_on_random_scenarios(scenario: Scenario, name: str) -> None:
    sim = scenario_input(scenario)
    model = _checked(build_model(name, sim))
    ledger = Engine(model, sim.workloads, sim.cluster.gpus, sim.reaper_idle).run()
    _conservation(ledger)


Starts = dict[int, float | None]


def _stock_etas(spec: ClusterSpec, workloads: Jobs) -> tuple[Starts, Starts]:
    """Each job's predicted and real start under the stock model, over 5,000 s."""
    sim = SimInput("test", spec, workloads.workloads(5000.0), 3600.0, 3600.0, 30.0)
    engine = Engine(build_model("stock", sim), sim.workloads, spec.gpus, 3600.0)
    engine.run()
    predicted = {run.job.id: run.predicted for run in engine.runs.values()}
    started = {run.job.id: run.first_start for run in engine.runs.values()}
    return predicted, started


def test_stock_eta_replays_each_team_within_its_quota() -> None:
    """Two teams with a quota of 2 GPUs each on one 4-GPU node, both running. a's second job waits
    for a's first (expected end 1,000 s): its team's quota binds, not the node. b's second job,
    queued after it, waits only for b's first (ends at 305 s): a's queued job does not compete for
    b's quota. (A pool taken as one bucket put b behind a's queued job, at 1,000 s too.) Jobs the
    pass at their arrival started get no ETA: they never waited for one."""
    spec = cluster(1, 4, {"a": 2, "b": 2})
    workloads = (
        Jobs()
        .add("a", at=0, gpus=2, work=1000)
        .add("b", at=5, gpus=2, work=300)
        .add("a", at=10, gpus=2, work=1000)
        .add("b", at=20, gpus=2, work=500)
    )
    predicted, started = _stock_etas(spec, workloads)
    assert started == {0: 0.0, 1: 5.0, 2: 1000.0, 3: 305.0}
    assert predicted == {0: None, 1: None, 2: 1000.0, 3: 305.0}


def test_eta_counts_only_work_queued_before_the_job() -> None:
    """Two jobs of one team arrive at the same instant behind a running one, on a 2-GPU node. The
    first's ETA is the running job's end; the second's is after the first. Each is predicted after
    the pass at that instant, when both are queued: the one queued after it is not ahead of the
    first."""
    spec = cluster(1, 2, {"a": 2})
    workloads = (
        Jobs()
        .add("a", at=0, gpus=2, work=1000)
        .add("a", at=10, gpus=2, work=500)
        .add("a", at=10, gpus=2, work=500)
    )
    predicted, started = _stock_etas(spec, workloads)
    assert started == {0: 0.0, 1: 1000.0, 2: 1500.0}
    assert predicted == started | {0: None}
