"""The pure parts of the controller-vs-kube-scheduler benchmark: how it names the controller's API
calls, places the raw ceiling's pods, reads the phases of the Jobs path, meters CPU and sets the paths
against the ceilings (the passes themselves need a real API server: ``bench/run.py
controller-vs-kube-scheduler --small``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench_scripts import load_bench

passes = load_bench("vs_passes.py")
cluster = load_bench("vs_cluster.py")
processes = load_bench("processes.py")
vs = load_bench("controller_vs_kube_scheduler.py")


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/pods", {"watch": True}, "WATCH pods"),
        ("POST", "/api/v1/namespaces/a/pods/x/binding", None, "POST pods/binding"),
        ("PUT", "/apis/kueue.x-k8s.io/v1beta2/namespaces/a/workloads/w/status", None, "PUT workloads/status"),
        ("POST", "/apis/kueue.x-k8s.io/v1beta2/namespaces/a/workloads", None, "POST workloads"),
        ("PATCH", "/apis/kueue.x-k8s.io/v1beta2/clusterqueues/cq/status", None, "PATCH clusterqueues/status"),
        ("GET", "/api/v1/nodes", None, "GET nodes"),
        ("PUT", "/apis/batch/v1/namespaces/a/jobs/j", None, "PUT jobs"),
    ],
)
def test_call_kind_names_verb_and_resource(
    method: str, path: str, query: dict[str, bool] | None, expected: str
) -> None:
    assert cluster.call_kind(method, path, query) == expected


def test_first_fit_fills_each_node_s_eight_gpus_in_order() -> None:
    placed = passes._first_fit([("single-0", 3, 1), ("gang-0", 3, 2)], nodes=2)
    assert [(p[2][-5:], p[3]) for p in placed] == [
        ("00000", "0"),
        ("00000", "1"),
        ("00000", "2"),
        ("00000", "3,4"),
        ("00000", "5,6"),
        ("00001", "0,1"),  # 2 GPUs do not fit the one left on the first node
    ]
    with pytest.raises(SystemExit, match="do not fit"):
        passes._first_fit([("single-0", 17, 1)], nodes=2)


def test_phases_an_object_shows() -> None:
    assert passes._reached("Workload", {"status": {}}) == ("workloadCreated",)
    assert passes._reached("Workload", {"status": {"admission": {"clusterQueue": "q"}}}) == (
        "workloadCreated",
        "admitted",
    )
    assert passes._reached("Job", {"spec": {"suspend": True}}) == ()
    assert passes._reached("Job", {"spec": {"suspend": False}}) == ("released",)
    assert passes._reached("Pod", {"spec": {}}) == ("podCreated",)
    assert passes._reached("Pod", {"spec": {"nodeName": "n"}}) == ("podCreated", "bound")


def test_cpu_meter_counts_this_process_and_refuses_no_pods(tmp_path: Path) -> None:
    assert processes.cpu_seconds(os.getpid()) is not None
    meter = processes.CpuMeter({"me": os.getpid(), "gone": 2**22 + 12345})
    sum(range(200_000))
    assert set(meter.spent()) == {"me"}  # a process that cannot be read is left out
    assert meter.per_pod(10)["me"] >= 0
    with pytest.raises(ValueError, match="positive"):
        meter.per_pod(0)
    (tmp_path / "pids").write_text("101 etcd\n102 kube-apiserver\nnot a line\n")
    assert processes.control_plane_pids(tmp_path) == {"etcd": 101, "kube-apiserver": 102}
    assert processes.control_plane_pids(tmp_path / "missing") == {}


def test_shares_set_the_paths_against_the_ceilings_and_kube_scheduler() -> None:
    result = {
        "gpuplane": {"podsPerSecond": 30.0},
        "gpuplanePods": {"podsPerSecond": 60.0},
        "rawCeiling": {"podsPerSecond": 300.0},
        "jobControllerCeiling": {"podsPerSecond": 100.0},
        "kubeScheduler": {"podsPerSecond": 50.0},
        "kubeSchedulerTuned": None,
    }
    shares = vs.shares(result)
    assert shares["podsOfRawCeiling"] == 0.2
    assert shares["podsVsKubeScheduler"] == 1.2
    assert shares["podsVsKubeSchedulerTuned"] is None
    assert shares["jobsOfJobControllerCeiling"] == 0.3
    assert shares["jobsVsKubeScheduler"] == 0.6
    assert set(vs.TARGETS) <= set(shares)
    assert shares["podsOfFloor"] is None  # no floors measured


def cost(apiserver: float, etcd: float = 0.0) -> dict[str, object]:
    return {
        "callsPerSecond": 1.0,
        "cpuMsPerCall": {"kube-apiserver": apiserver, "etcd": etcd, "kube-scheduler": 9.0},
    }


def test_floors_add_up_each_path_s_writes_per_pod() -> None:
    costs = {
        "POST pods": cost(5.0, 1.0),
        "PUT pods": cost(4.0),
        "POST pods/binding": cost(2.0),
        "POST workloads": cost(3.0, 1.0),
        "PUT workloads/status": cost(6.0),
        "PUT jobs": cost(4.0),
        "POST jobs": cost(5.0),
    }
    job_controller = {"podsPerSecond": 100.0, "cpuMsPerPod": {"kube-apiserver": 15.0, "etcd": 3.0}}
    # 6 single pods and a gang of 4: 10 pods, 7 workloads (and 7 Jobs on the Jobs path)
    shapes = [*((f"single-{i}", 1, 1) for i in range(6)), ("gang-0", 4, 2)]
    floors = vs.floors(costs, job_controller, shapes, cpus=2)
    # pods: 6 + 4 + 2 per pod, and 4 + 6 per workload, 0.7 workloads a pod
    assert floors["pods"]["serverCpuMsPerPod"] == 19.0
    assert floors["pods"]["podsPerSecondAtMost"] == round(2000 / 19.0, 1)
    # jobs: 2 per pod, 4 + 6 + 4 per workload, and the Job controller's 18 less 0.7 x 5 for the Jobs
    assert floors["jobs"]["serverCpuMsPerPod"] == 26.3  # 2 + 9.8 + 18 - 3.5
    shares = vs.shares(
        {"gpuplane": {"podsPerSecond": 20.0}, "gpuplanePods": {"podsPerSecond": 52.6}, "floors": floors}
    )
    assert shares["podsOfFloor"] == 0.5
    assert shares["jobsOfFloor"] == round(20.0 / floors["jobs"]["podsPerSecondAtMost"], 2)
