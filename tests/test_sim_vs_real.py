"""sim-vs-real (``bench/sim_vs_real.py``): the manifests it submits, how it measures, and its CI-size run.

The run itself needs a real control plane (kube-controller-manager's Job controller completes the
Jobs, the API server calls the registered webhook): it runs where ``GPUPLANE_E2E_KUBECONFIG`` names
one, as the real-control-plane stage of the test command does. Everything else runs anywhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from apiserver.fixtures import E2E_KUBECONFIG
from bench_scripts import load_bench
from fake_kubelet import CHECKPOINT_SECONDS, RUN_SECONDS, STARTUP_SECONDS, STATELESS, Run
from gpuplane.model import labels as keys
from gpuplane.sim.experiment import GPUPLANE_VARIANTS
from gpuplane.sim.gpuplane_model import GPU_MILLI, GpuplaneModel

svr = load_bench("sim_vs_real.py")


@pytest.fixture(scope="module")
def small() -> Any:
    scenario = svr.small_scenario(svr.CI_NODES, 2.0, 4.0, 42, None)
    return svr.arrivals(scenario, 2.0)


def model_of(sim: Any) -> GpuplaneModel:
    return GpuplaneModel(svr.CONFIGURATION, sim.cluster, GPUPLANE_VARIANTS[svr.CONFIGURATION], 0.0)


def test_the_arrivals_are_the_scenarios_first_hours_on_the_small_cluster(small: Any) -> None:
    assert small.cluster.gpus == 28
    assert small.workloads.jobs, "some jobs arrive"
    assert all(0 <= j.submit <= 2 * 3600 for j in small.workloads.jobs)
    assert not small.workloads.node_events, "no node fails in the comparison"


def test_a_job_is_submitted_as_a_user_would_with_its_run_for_the_kubelet(small: Any) -> None:
    model = model_of(small)
    for job in small.workloads.jobs:
        body = svr.job_manifest(model, job)
        labels = body["metadata"]["labels"]
        assert labels[keys.QUEUE_NAME_LABEL] in ("default", "backfill")
        assert "suspend" not in body["spec"], "the webhook suspends it, not the user"
        template = body["spec"]["template"]
        assert "schedulerName" not in template["spec"]
        assert body["spec"]["parallelism"] == body["spec"]["completions"] == job.pods
        annotations = template["metadata"]["annotations"]
        assert float(annotations[RUN_SECONDS]) == job.work
        assert float(annotations.get(STARTUP_SECONDS, 0)) == job.startup
        assert (CHECKPOINT_SECONDS in annotations) == bool(job.checkpoint)
        assert (annotations.get(STATELESS) == "true") == job.stateless
        resources = template["spec"]["containers"][0]["resources"]
        assert resources["requests"] == resources["limits"]
        assert int(resources["requests"][GPU_MILLI]) == job.request.milli


def test_the_cluster_queues_carry_the_models_quotas(small: Any) -> None:
    state = model_of(small).kueue_state()
    objects = svr.cluster_objects(state, {"normal": 100, "backfill": 0})
    queues = {body["metadata"]["name"]: body for res, body in objects if body.get("kind") == "ClusterQueue"}
    assert set(queues) == set(state.cluster_queues)
    for name, cq in state.cluster_queues.items():
        spec = queues[name]["spec"]
        assert spec["cohortName"] == cq.cohort
        for group, model_group in zip(spec["resourceGroups"], cq.resource_groups, strict=True):
            for flavor, model_flavor in zip(group["flavors"], model_group.flavors, strict=True):
                for entry in flavor["resources"]:
                    assert int(entry["nominalQuota"]) == model_flavor.resources[entry["name"]].nominal
    nodes = [body for res, body in objects if body.get("kind") == "Node"]
    assert sum(int(n["status"]["allocatable"].get(GPU_MILLI, 0)) for n in nodes) == 28 * 1000


def _workload(owner: str, milli: int, *conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "metadata": {"name": f"job-{owner}", "namespace": "team", "ownerReferences": [{"name": owner}]},
        "status": {
            "admission": {"podSetAssignments": [{"resourceUsage": {GPU_MILLI: str(milli)}}]},
            "conditions": [{"type": t, "status": "True", "reason": r} for t, r in conditions],
        },
    }


def _job(name: str, *conditions: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "team"},
        "status": {"conditions": [{"type": t, "status": "True"} for t in conditions]},
    }


def _pod(milli: int, phase: str) -> dict[str, Any]:
    resources = {"requests": {GPU_MILLI: str(milli)}}
    return {"spec": {"nodeName": "n", "containers": [{"resources": resources}]}, "status": {"phase": phase}}


def test_the_ledger_finds_quota_held_for_a_job_that_ended_or_is_gone() -> None:
    workloads = [
        _workload("runs", 1000),
        _workload("done", 8000, ("Finished", "Succeeded")),
        _workload("ended", 500),  # its Job is Complete, its Workload not finished: a leak
        _workload("gone", 2000),  # its Job was deleted, its Workload stayed: a leak
    ]
    jobs = [_job("runs"), _job("done", "Complete"), _job("ended", "Complete")]
    pods = [_pod(1000, "Running"), _pod(8000, "Succeeded"), _pod(500, "Succeeded")]
    ledger = svr.quota_ledger(workloads, jobs, pods)
    assert ledger["quotaLeakMilliGpu"] == 2500
    assert len(ledger["leaks"]) == 2
    assert ledger["quotaUsageMilliGpu"] == 3500
    assert ledger["podsHoldMilliGpu"] == 1000
    balanced = svr.quota_ledger(workloads[:2], jobs[:2], pods[:2])
    assert balanced["quotaLeakMilliGpu"] == 0
    assert balanced["quotaUsageMilliGpu"] == balanced["podsHoldMilliGpu"] == 1000


def test_the_real_side_is_measured_as_the_simulator_measures(small: Any) -> None:
    job = replace(small.workloads.jobs[0], submit=600.0, work=1200.0, startup=60.0, activity=0.5, active=())
    sim = replace(small, workloads=replace(small.workloads, jobs=(job,)))
    speedup = 100.0
    run = svr.RealRun(t0=1000.0, end=1000.0 + 36.0)  # 3,600 virtual seconds
    started = 1000.0 + 900.0 / speedup  # starts at 900 s: waited 300 s
    key = (job.team, job.name, "")
    pods = [
        Run(f"{job.team}/{job.name}-{i}", key, started, 0.0, job.work, job.startup, ended=started + 12.6)
        for i in range(job.pods)
    ]
    run.runs = pods
    run.submitted = {f"{job.team}/{job.name}": 1006.0}
    doc = svr.measured(sim, run, speedup)
    assert doc["waitP50Seconds"] == pytest.approx(300.0)
    rate = min(job.request.share, job.activity) * job.pods
    expected_busy = rate * 1200.0 / (sim.cluster.gpus * 3600.0)  # 60 s startup, then all 1,200 s
    assert doc["gpuBusyOfCapacity"] == pytest.approx(expected_busy, abs=1e-4)


def test_the_targets_allow_what_the_issue_allows() -> None:
    real = {"finished": 100, "gpuBusyOfCapacity": 0.50, "waitP95Seconds": 1000.0}
    close = {"finished": 98, "gpuBusyOfCapacity": 0.46, "waitP95Seconds": 1300.0}
    assert all(svr.comparison(real, close).values())
    far = {"finished": 90, "gpuBusyOfCapacity": 0.40, "waitP95Seconds": 2000.0}
    assert not any(svr.comparison(real, far).values())
    short = {"finished": 100, "gpuBusyOfCapacity": 0.50, "waitP95Seconds": 500.0}
    assert svr.comparison({**real, "waitP95Seconds": 0.0}, short)["waitP95Within25PercentOr10Minutes"]


@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not os.environ.get(E2E_KUBECONFIG), reason="needs a real control plane (its Job controller)"
)
def test_ci_size_run_leaks_no_quota_and_every_job_that_fits_finishes(tmp_path: Path) -> None:
    out = tmp_path / "sim-vs-real.json"
    status = svr.main(
        ["--ci", "--kubeconfig", os.environ[E2E_KUBECONFIG], "--output", "json", "--out", str(out)]
    )
    doc = json.loads(out.read_text())
    real, simulated = doc["real"], doc["simulated"]
    assert doc["quotaLeakGpus"] == 0, real["leaks"]
    assert real["quotaUsageMilliGpu"] == real["podsHoldMilliGpu"], "usage equals what is running"
    assert not real["stuck"], real["stuck"]
    assert real["submitted"] == doc["jobs"]
    assert real["finished"] > 0
    assert doc["targets"]["finishedWithin2Percent"], (real["finished"], simulated["finished"])
    assert status == 0
