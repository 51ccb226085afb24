"""The peer configurations (what users run instead of gpuplane), each pinned on a small hand-built case.

* ``kueue`` admits by quota alone, so it admits a gang that no set of nodes can hold, and the gang's
  pods sit partly bound (kueue #407);
* ``kueue-timeslicing`` puts more pods on a time-sliced GPU than its memory holds, and runs them;
* ``volcano`` binds a gang all at once or not at all.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.sim.cluster import ClusterSpec, NodeSpec
from gpuplane.sim.engine import HOLD, Change, Engine, Model
from gpuplane.sim.experiment import CONFIGURATIONS, SimInput, build_model, run_named
from gpuplane.sim.kueue_model import KueueModel, next_restart, replicas_fitting_memory, time_sliced_pools
from gpuplane.sim.metrics import configuration_document
from gpuplane.sim.scenario import Team
from gpuplane.sim.volcano_model import VolcanoModel, water_fill
from gpuplane.sim.workloads import Job, NodeEvent, Request, Workloads

HOUR = 3600.0


def _cluster(pool: str, sizes: list[int], teams: tuple[str, ...] = ("red",)) -> ClusterSpec:
    return ClusterSpec(
        nodes=tuple(NodeSpec(f"{pool}-{i}", pool, g, "GPU", 24576) for i, g in enumerate(sizes)),
        pools=(pool,),
        teams=tuple(Team(t, 1.0, 1.0) for t in teams),
    )


def _job(
    number: int, pool: str, *, at: float, pods: int = 1, gpus: int = 0, fraction: int = 0, work: float = HOUR
) -> Job:
    request = Request(fraction_milli=fraction) if fraction else Request(gpus=gpus)
    return Job(
        id=number,
        name=f"job-{number:03d}",
        team="red",
        klass="gang" if pods > 1 else "job",
        tier="normal",
        submit=at,
        pods=pods,
        request=request,
        pools=(pool,),
        work=work,
        startup=0.0,
        activity=0.5,
        expected=work,
    )


def _sim(spec: ClusterSpec, jobs: list[Job], horizon: float) -> SimInput:
    return SimInput("peers", spec, Workloads(tuple(jobs), (), 0.0, horizon), HOUR, 2 * HOUR, 30.0)


def _run(name: str, sim: SimInput) -> tuple[Model, dict[str, Any]]:
    return _run_model(build_model(name, sim), sim)


def _run_model(model: Model, sim: SimInput) -> tuple[Model, dict[str, Any]]:
    ledger = Engine(model, sim.workloads, sim.cluster.gpus, sim.reaper_idle).run()
    doc = configuration_document(ledger)
    extras = getattr(model, "document_extras", None)
    if extras is not None:
        doc.update(extras())
    return model, doc


def test_peers_are_configurations() -> None:
    for name in ("kueue", "kueue-timeslicing", "volcano"):
        assert name in CONFIGURATIONS


def test_kueue_admits_a_gang_no_node_set_can_hold_and_its_pods_sit_partly_bound() -> None:
    # A 4-GPU and a 2-GPU node: quota is 6 GPUs, so a 2 x 3-GPU gang is admitted; one pod binds on
    # the 4-GPU node, the other fits no node.
    spec = _cluster("gpu", [4, 2])
    sim = _sim(spec, [_job(0, "gpu", at=10.0, pods=2, gpus=3)], HOUR)
    model, doc = _run("kueue", sim)
    assert isinstance(model, KueueModel)
    assert doc["admittedUnplaceableGangs"] == 1
    assert doc["admittedPartlyBoundGangs"] == 1
    assert doc["admittedGangsNoNodeSetHolds"] == 1
    assert doc["started"] == 0
    stuck = model.binder.jobs[0]
    assert len(stuck.bound) == 1  # one pod bound, holding 3 GPUs that compute nothing
    assert model.admission.session.holds("red/job-000")  # and the quota stays taken
    assert doc["deadlockedGpuHours"] == pytest.approx(3 * (HOUR - 10) / HOUR, abs=0.01)
    # gpuplane admits only with a placement: nothing is held.
    _, gpuplane = _run("gpuplane", sim)
    assert gpuplane["deadlockedGpuHours"] == 0.0
    assert gpuplane["started"] == 0


def test_kueue_requeues_a_stuck_gang_after_the_deadlock_timeout() -> None:
    spec = _cluster("gpu", [4, 2])
    sim = _sim(spec, [_job(0, "gpu", at=0.0, pods=2, gpus=3)], 5 * HOUR)
    _, doc = _run("kueue", sim)
    assert doc["deadlockRestarts"] == 2  # stuck for ever: every two hours, evicted and admitted again
    assert doc["admittedUnplaceableGangs"] == 3


def test_kueue_places_a_gang_that_fits_and_runs_it() -> None:
    spec = _cluster("gpu", [4, 4])
    sim = _sim(spec, [_job(0, "gpu", at=0.0, pods=2, gpus=4)], 2 * HOUR)
    _, doc = _run("kueue", sim)
    assert doc["started"] == 1
    assert doc["admittedUnplaceableGangs"] == 0


def test_kueue_timeslicing_overcommits_a_gpus_memory_without_noticing() -> None:
    # One L4: three inference pods that each need a quarter of its memory, then one that needs
    # half. Its users set the replicas for the common pod: 4, a quarter each. Each pod asks for
    # one replica, so all four bind to the same GPU: neither Kueue nor kube-scheduler sees its
    # memory.
    spec = _cluster("l4", [1])
    jobs = [_job(i, "l4", at=float(i), fraction=250) for i in range(3)]
    jobs.append(_job(3, "l4", at=3.0, fraction=500))
    sim = _sim(spec, jobs, 2 * HOUR)
    assert time_sliced_pools(sim.workloads.jobs, spec.pools) == ("l4",)
    assert replicas_fitting_memory(sim.workloads.jobs, ("l4",)) == {"l4": 4}
    model, doc = _run("kueue-timeslicing", sim)
    assert isinstance(model, KueueModel)
    sliced = doc["timeSlicing"]
    assert sliced["pools"] == ["l4"]
    assert sliced["replicasPerGpu"] == {"l4": 4}
    assert sliced["memoryOvercommits"] == 1  # the fourth pod: 125 % of the GPU's memory
    assert sliced["memoryOvercommittedWorkloads"] == 1
    # The fourth pod's allocation fails: it crash-loops on its replica, holding it, until the
    # first pod ends at one hour, and runs at the kubelet's next restart after that: it was
    # bound at 3 s, so its restarts come at 13, 33, 73, 153, 313 s, then every 5 minutes.
    assert doc["started"] == 4
    assert next_restart(3.0, HOUR) == 3613.0
    assert doc["classes"]["job"]["waitMaxSeconds"] == pytest.approx(3613.0 - 3, abs=1)
    assert sliced["memoryUseAtEndMax"] <= 1.0
    # Each replica counts as a quarter of the GPU: a whole GPU for the first hour (the
    # crash-looping pod's replica included), then the half pod's quarter.
    assert doc["allocatedGpuHours"] == pytest.approx(1.25, abs=0.01)
    # Kueue alone gives each pod a whole GPU: one runs at a time.
    _, plain = _run("kueue", sim)
    assert plain["started"] == 2  # the first ends at one hour, the second starts then
    assert "timeSlicing" not in plain
    # gpuplane gives each pod its fraction: three quarters fit, the half waits for one to end,
    # and no pod is bound where it cannot run.
    _, gpuplane = _run("gpuplane", sim)
    assert gpuplane["started"] == 4
    assert gpuplane["classes"]["job"]["waitMaxSeconds"] == pytest.approx(HOUR - 3, abs=1)
    # The half held nothing while it waited.
    assert gpuplane["allocatedGpuHours"] == pytest.approx(0.75 + 0.5, abs=0.01)


def test_kueue_timeslicing_puts_a_whole_gpu_request_on_a_replica_where_it_crash_loops() -> None:
    # One L4 sliced in 2 (the half pods' memory); a half pod runs, then a CI job that asks for a
    # whole GPU, and needs all its memory, takes the free replica: it crash-loops, holding it,
    # until the half pod ends at one hour, and runs at the kubelet's next restart.
    spec = _cluster("l4", [1])
    jobs = [_job(0, "l4", at=0.0, fraction=500), _job(1, "l4", at=5.0, gpus=1)]
    sim = _sim(spec, jobs, 2 * HOUR)
    model, doc = _run("kueue-timeslicing", sim)
    assert isinstance(model, KueueModel)
    assert doc["timeSlicing"]["replicasPerGpu"] == {"l4": 2}
    assert doc["timeSlicing"]["memoryOvercommits"] == 1
    assert doc["started"] == 2
    assert doc["classes"]["job"]["waitMaxSeconds"] == pytest.approx(next_restart(5.0, HOUR) - 5, abs=1)
    assert not model.binder.looping_pods  # none is left crash-looping


def test_the_kubelets_restarts_of_a_crash_looping_pod_back_off_to_five_minutes() -> None:
    # 10 s after the first failure, then after 20, 40, 80, 160 s, then every 300 s.
    assert [next_restart(100.0, 100.0 + t) for t in (0.0, 10.0, 10.5, 31.0, 150.0, 151.0, 311.0, 900.0)] == [
        110.0,
        110.0,
        130.0,
        170.0,
        250.0,
        410.0,
        710.0,
        1010.0,
    ]


def test_renamed_time_slicing_keeps_whole_gpu_requests_off_the_shared_pools() -> None:
    # An L4 and an A100; a job that asks for a whole GPU and may run on either, and a half.
    spec = ClusterSpec(
        nodes=(NodeSpec("l4-0", "l4", 1, "L4", 24576), NodeSpec("a100-0", "a100", 1, "A100", 81920)),
        pools=("l4", "a100"),
        teams=(Team("red", 1.0, 1.0),),
    )
    whole = _job(0, "l4", at=0.0, gpus=1)
    whole.pools = ("l4", "a100")
    shared = _job(1, "l4", at=1.0, fraction=500)
    sim = _sim(spec, [whole, shared], HOUR)
    # The peer as configured (no renameByDefault): the whole-GPU request may take an L4 replica.
    model, doc = _run("kueue-timeslicing", sim)
    assert isinstance(model, KueueModel)
    assert doc["timeSlicing"]["wholeGpuRequestsShared"] is True
    assert model.pools_of(whole) == ("l4", "a100")
    # renameByDefault: the L4 advertises nvidia.com/gpu.shared, so the whole-GPU request takes the
    # A100 and the half takes the L4.
    renamed = KueueModel(
        "kueue-timeslicing",
        spec,
        sim.deadlock_timeout,
        sim.workloads.start,
        time_sliced=("l4",),
        replicas={"l4": 2},
        whole_gpus_shared=False,
    )
    assert renamed.pools_of(whole) == ("a100",)
    assert renamed.pools_of(shared) == ("l4",)
    _, doc = _run_model(renamed, sim)
    assert doc["timeSlicing"]["wholeGpuRequestsShared"] is False
    assert doc["timeSlicing"]["replicasPerGpu"] == {"l4": 2}
    assert doc["started"] == 2
    assert doc["timeSlicing"]["memoryOvercommits"] == 0


def test_time_slicing_leaves_training_pools_alone() -> None:
    jobs = [
        _job(0, "a", at=0.0, fraction=500),
        _job(1, "a", at=0.0, pods=2, gpus=1),
        _job(2, "b", at=0.0, fraction=250),
    ]
    assert time_sliced_pools(jobs, ("a", "b", "c")) == ("b",)


def test_run_named_adds_the_peers_counts() -> None:
    spec = _cluster("gpu", [4, 2])
    sim = _sim(spec, [_job(0, "gpu", at=10.0, pods=2, gpus=3)], HOUR)
    _, doc = run_named("kueue", sim)
    assert doc["admittedUnplaceableGangs"] == 1


def test_bad_time_slicing_settings_are_refused() -> None:
    spec = _cluster("gpu", [4])
    with pytest.raises(ValueError, match="replicas"):
        KueueModel("kueue", spec, HOUR, 0.0, replicas=0)
    with pytest.raises(ValueError, match="not a pool"):
        KueueModel("kueue", spec, HOUR, 0.0, time_sliced=("l4",))


def _two_teams(sizes: list[int]) -> ClusterSpec:
    return _cluster("gpu", sizes, teams=("red", "blue"))


def _team(job: Job, team: str) -> Job:
    job.team = team
    return job


def _full_holds_only(model: Model) -> list[tuple[int, float]]:
    """Wrap the model's changes: every hold it reports is recorded (job, level)."""
    holds: list[tuple[int, float]] = []
    take = model.take_changes

    def recorded() -> list[Change]:
        changes = take()
        holds.extend((c.job, c.level) for c in changes if c.kind == HOLD)
        return changes

    model.take_changes = recorded  # type: ignore[method-assign]
    return holds


def test_volcano_never_binds_a_partial_gang() -> None:
    # Two 4-GPU nodes; a 1-GPU job holds one for an hour, then a 2 x 4-GPU gang arrives. Volcano
    # binds nothing of it until both nodes are free, then all of it.
    spec = _cluster("gpu", [4, 4])
    jobs = [_job(0, "gpu", at=0.0, gpus=1), _job(1, "gpu", at=10.0, pods=2, gpus=4, work=600.0)]
    sim = _sim(spec, jobs, 2 * HOUR)
    model = build_model("volcano", sim)
    holds = _full_holds_only(model)
    ledger = Engine(model, sim.workloads, spec.gpus, sim.reaper_idle).run()
    doc = configuration_document(ledger)
    assert doc["deadlockedGpuHours"] == 0.0
    assert doc["started"] == 2
    assert doc["classes"]["gang"]["waitMaxSeconds"] == pytest.approx(HOUR - 10, abs=1)
    assert [level for job, level in holds if job == 1] == [8.0, 0.0]  # all of it, then nothing


def test_kueue_spreads_and_strands_a_gang_where_volcano_packs_and_runs_it() -> None:
    # Three 4-GPU nodes (quota 12), two 1-GPU jobs, then a 2 x 4-GPU gang that quota admits.
    # kube-scheduler spreads the small jobs over two nodes: one gang pod binds, the other waits.
    # Volcano packs them on one node: the gang binds at once.
    spec = _cluster("gpu", [4, 4, 4])
    jobs = [
        _job(0, "gpu", at=0.0, gpus=1),
        _job(1, "gpu", at=1.0, gpus=1),
        _job(2, "gpu", at=10.0, pods=2, gpus=4, work=600.0),
    ]
    sim = _sim(spec, jobs, 2 * HOUR)
    _, kueue = _run("kueue", sim)
    assert kueue["admittedPartlyBoundGangs"] == 1
    assert kueue["deadlockedGpuHours"] == pytest.approx(4 * (HOUR - 10) / HOUR, abs=0.01)
    _, volcano = _run("volcano", sim)
    assert volcano["deadlockedGpuHours"] == 0.0
    assert volcano["classes"]["gang"]["waitMaxSeconds"] == pytest.approx(0.0, abs=1)


def test_volcano_gangs_are_all_or_nothing_under_load() -> None:
    # Many gangs of every size on uneven nodes, node failures included: every hold is a whole gang.
    spec = _cluster("gpu", [8, 8, 4, 4, 2])
    jobs = [
        _job(i, "gpu", at=37.0 * i, pods=1 + i % 3, gpus=(1, 2, 4, 8)[i % 4], work=600.0 + 97.0 * (i % 7))
        for i in range(40)
    ]
    failures = (NodeEvent(900.0, "gpu-0", up=False), NodeEvent(2400.0, "gpu-0", up=True))
    workloads = Workloads(tuple(jobs), failures, 0.0, 3 * HOUR)
    sim = SimInput("peers", spec, workloads, HOUR, 2 * HOUR, 30.0)
    model = build_model("volcano", sim)
    holds = _full_holds_only(model)
    Engine(model, workloads, spec.gpus, sim.reaper_idle).run()
    full = {job.id: job.pods * job.request.whole for job in jobs}
    assert holds
    assert all(level in (0.0, float(full[job])) for job, level in holds)


def test_volcano_reclaims_for_a_queue_below_its_deserved_share() -> None:
    # red fills both nodes while blue is idle; blue's gang then reclaims one node from red.
    spec = _two_teams([4, 4])
    jobs = [
        _job(0, "gpu", at=0.0, gpus=4, work=4 * HOUR),
        _job(1, "gpu", at=1.0, gpus=4, work=4 * HOUR),
        _team(_job(2, "gpu", at=600.0, gpus=4, work=600.0), "blue"),
    ]
    sim = _sim(spec, jobs, 2 * HOUR)
    model, doc = _run("volcano", sim)
    assert doc["reclaimedJobs"] == 1
    assert doc["started"] == 3
    assert doc["classes"]["job"]["waitMaxSeconds"] == pytest.approx(0.0, abs=1)  # blue waited not
    assert isinstance(model, VolcanoModel)


def test_water_fill_gives_what_a_queue_does_not_ask_to_the_others() -> None:
    assert water_fill(12.0, {"a": 1.0, "b": 1.0, "c": 1.0}, {"a": 2.0, "b": 10.0, "c": 10.0}) == {
        "a": 2.0,
        "b": 5.0,
        "c": 5.0,
    }
    assert water_fill(12.0, {"a": 1.0, "b": 2.0}, {"a": 0.0, "b": 30.0}) == {"a": 0.0, "b": 12.0}
