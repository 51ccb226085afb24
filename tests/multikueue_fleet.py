"""A MultiKueue fleet for the tests and the benchmark: one manager and two workers, each its own API
server, each worker running gpuplane's controller in its own process, the manager running it with
``--multikueue``.

With three doubles, the test's Job controller and fake kubelet run on each worker; with a real
control plane for the manager, the two workers are real control planes of their own
(``scripts/kube-up.sh``), whose Job controller is kube-controller-manager's.

Worker ``small`` has ``small_nodes`` nodes of 8 GPUs, worker ``big`` ``big_nodes``. The manager's
ClusterQueue has a MultiKueue AdmissionCheck whose MultiKueueConfig lists both (kubeconfigs in Secrets,
as Kueue documents it). A user submits a plain suspended Job with ``spec.managedBy:
kueue.x-k8s.io/multikueue``, or a JobSet so managed (:meth:`Fleet.submit_jobset`); the tests' JobSet
controller (tests/jobset_controller.py) runs on each worker, the JobSet CRD is installed on every
cluster.
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from apiserver.errors import ApiError as DoubleError
from apiserver.server import ApiServerDouble
from controller_harness import JobController, gpu_job, install_crds
from fake_kubelet import FakeKubelet, run_annotations
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi, load_api_client
from gpuplane.model import labels as keys
from jobset_controller import JobSetController, install_jobset_crd
from manifests import GPU, cluster_queue, local_queue, node, pod_spec, resource_flavor
from prometheus import free_port

ROOT = Path(__file__).resolve().parents[1]
NS = f"mk-e2e-{os.getpid()}"  # a fresh namespace per run: a real server may still be deleting the last
MANAGER_NS = "gpuplane-system"
CHECK = "mk-check"
MANAGED_BY = keys.MULTIKUEUE_CONTROLLER
POOL = "gpuplane.dev/e2e-pool"


@dataclass
class Member:
    """One cluster of the fleet: its kubeconfig, client, and what runs beside it."""

    name: str
    kubeconfig: Path
    api: KubeApi
    stop: list[Any] = field(default_factory=list)
    double: ApiServerDouble | None = None
    directory: Path | None = None  # a real control plane's (scripts/kube-up.sh)

    def outage(self, seconds: float) -> None:
        """The API server answers nothing for ``seconds``: the real kube-apiserver stopped and started
        again (``scripts/kube-restart.sh``), or every request to the double refused with 503."""
        if self.double is not None:
            rule = self.double.faults.intercept(
                lambda _r: DoubleError(503, "the server is down", "ServiceUnavailable")
            )
            time.sleep(seconds)
            self.double.faults.remove(rule)
            return
        assert self.directory is not None
        subprocess.run(
            [
                "bash",
                str(ROOT / "scripts" / "kube-restart.sh"),
                str(self.directory),
                "kube-apiserver",
                str(seconds),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )

    def close(self) -> None:
        for thing in reversed(self.stop):
            thing()
        self.api.close()


def _start_plane(directory: Path) -> Path:
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kube-up.sh"), str(directory)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "GPUPLANE_KUBE_AUDIT": "0"},
    )
    if result.returncode != 0:
        pytest.fail(f"a worker control plane did not start:\n{result.stderr[-2000:]}")
    return directory / "kubeconfig"


def _member(name: str, directory: Path, real: bool) -> Member:
    stop: list[Any] = []
    double = None
    if real:
        kubeconfig = _start_plane(directory)
        stop.append(
            lambda: subprocess.run(
                ["bash", str(ROOT / "scripts" / "kube-down.sh"), "--purge", str(directory)],
                capture_output=True,
                timeout=120,
                check=False,
            )
        )
    else:
        double = ApiServerDouble().start(kubeconfig=directory / "kubeconfig")
        stop.append(double.stop)
        kubeconfig = directory / "kubeconfig"
    api = KubeApi(load_api_client(str(kubeconfig)), qps=None)
    member = Member(name, kubeconfig, api, stop, double, directory if real else None)
    install_crds(member.api)
    install_jobset_crd(member.api)
    return member


def _controller(member: Member, directory: Path, *extra: str) -> subprocess.Popen[bytes]:
    with (directory / f"controller-{member.name}.log").open("ab") as log:
        process = _popen(member, log, extra)
    member.stop.append(lambda: _stop_process(process))
    return process


def _stop_process(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM, then SIGKILL if it has not ended within 30 s (a busy machine is slow to let go)."""
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _popen(member: Member, log: Any, extra: tuple[str, ...]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuplane",
            "controller",
            "--kubeconfig",
            str(member.kubeconfig),
            "--no-leader-elect",
            "--no-dry-run",
            "--interval",
            "0.3",
            "--runtime-history-size",
            "0",
            *extra,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )


def _setup_worker(member: Member, nodes: int, real: bool) -> None:
    api = member.api
    api.create(k8s.NAMESPACES, {"metadata": {"name": NS}})
    for i in range(nodes):
        name = f"{member.name}-n{i}"
        api.create(
            k8s.NODES,
            node(name)
            .allocatable(cpu="64", memory="512Gi", pods="110", gpu=8)
            .label(POOL, member.name)
            .label("kubernetes.io/hostname", name)
            .label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
            .to_dict(),
        )
    api.create(
        k8s.RESOURCE_FLAVORS, resource_flavor("gpu").set("spec.nodeLabels", {POOL: member.name}).to_dict()
    )
    api.create(k8s.CLUSTER_QUEUES, cluster_queue("cq").flavor("gpu", cpu="1000", gpu=nodes * 8).to_dict())
    api.create(k8s.LOCAL_QUEUES, local_queue("queue", NS, "cq").to_dict(), NS)
    if not real:
        member.stop.append(JobController(api, NS).start().stop)
    member.stop.append(JobSetController(api, NS).start().stop)  # no real one on either kind of plane
    member.stop.append(FakeKubelet(api, [NS], speedup=1.0).start().stop)


def _setup_manager(manager: Member, workers: list[Member], gpus: int) -> None:
    api = manager.api
    _clean_manager(api)  # what an earlier run on the same server left
    for ns in (NS, MANAGER_NS):
        try:
            api.create(k8s.NAMESPACES, {"metadata": {"name": ns}})
        except ApiError as err:
            if not err.conflict:
                raise
    for worker in workers:
        _delete_quietly(api, k8s.SECRETS, f"{worker.name}-secret", MANAGER_NS)
        secret = {
            "metadata": {"name": f"{worker.name}-secret", "namespace": MANAGER_NS},
            "data": {"kubeconfig": base64.b64encode(worker.kubeconfig.read_bytes()).decode()},
        }
        api.create(k8s.SECRETS, secret, MANAGER_NS)
        api.create(
            k8s.MULTIKUEUE_CLUSTERS,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "MultiKueueCluster",
                "metadata": {
                    "name": worker.name,
                    "labels": {"region": "eu" if worker.name == "big" else "us"},
                },
                "spec": {
                    "clusterSource": {
                        "kubeConfig": {"locationType": "Secret", "location": f"{worker.name}-secret"}
                    }
                },
            },
        )
    api.create(
        k8s.MULTIKUEUE_CONFIGS,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "MultiKueueConfig",
            "metadata": {"name": "fleet"},
            "spec": {"clusters": [w.name for w in workers]},
        },
    )
    api.create(
        k8s.ADMISSION_CHECKS,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK},
            "spec": {
                "controllerName": MANAGED_BY,
                "parameters": {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "fleet"},
            },
        },
    )
    api.create(k8s.RESOURCE_FLAVORS, resource_flavor("gpu").to_dict())
    api.create(
        k8s.CLUSTER_QUEUES,
        cluster_queue("cq")
        .flavor("gpu", cpu="100000", gpu=gpus)
        .set("spec.admissionChecks", [CHECK])
        .to_dict(),
    )
    api.create(k8s.LOCAL_QUEUES, local_queue("queue", NS, "cq").to_dict(), NS)


@dataclass
class Fleet:
    manager: Member
    small: Member
    big: Member
    directory: Path
    manager_process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0  # the manager's /metrics, once started

    def start_manager(self, lost_timeout: float = 60.0, *extra: str) -> None:
        """Start the manager's controller (``extra``: more of its options, e.g. a dispatcher)."""
        self.metrics_port = free_port()
        self.manager_process = _controller(
            self.manager,
            self.directory,
            "--metrics-port",
            str(self.metrics_port),
            "--multikueue",
            "--multikueue-gc-interval",
            "1",
            "--multikueue-worker-lost-timeout",
            str(lost_timeout),
            *extra,
        )

    def stop_manager(self) -> None:
        assert self.manager_process is not None
        self.manager_process.kill()
        self.manager_process.wait(10)

    def submit(
        self, name: str, *, pods: int, gpus: int, seconds: float, annotations: dict[str, str] | None = None
    ) -> None:
        body = gpu_job(
            name, NS, "queue", pods=pods, gpus=gpus, annotations=run_annotations(seconds)
        ).to_dict()
        body["spec"]["managedBy"] = MANAGED_BY
        if annotations:
            body["metadata"].setdefault("annotations", {}).update(annotations)
        self.manager.api.create(k8s.JOBS, body, NS)

    def submit_jobset(self, name: str, replicated: dict[str, tuple[int, int]], *, seconds: float) -> None:
        """A suspended, queued JobSet managed by MultiKueue: per replicated job (by name), its replicas
        (one pod each) and the GPUs of each pod."""
        jobs = []
        for rjob, (replicas, gpus) in replicated.items():
            limits = {GPU: gpus}
            spec = pod_spec().container(limits=limits, cpu="100m", **limits).to_dict()
            spec["restartPolicy"] = "Never"
            spec["terminationGracePeriodSeconds"] = 0
            template = {"metadata": {"annotations": run_annotations(seconds)}, "spec": spec}
            jobs.append(
                {
                    "name": rjob,
                    "replicas": replicas,
                    "template": {"spec": {"parallelism": 1, "completions": 1, "template": template}},
                }
            )
        body = {
            "apiVersion": k8s.JOBSETS.api_version,
            "kind": "JobSet",
            "metadata": {"name": name, "namespace": NS, "labels": {keys.QUEUE_NAME_LABEL: "queue"}},
            "spec": {"managedBy": MANAGED_BY, "suspend": True, "replicatedJobs": jobs},
        }
        self.manager.api.create(k8s.JOBSETS, body, NS)

    def workload(self, member: Member, job: str) -> dict[str, Any] | None:
        for wl in member.api.list(k8s.WORKLOADS, NS).get("items") or []:
            owners = [r.get("name") for r in wl["metadata"].get("ownerReferences") or []]
            if job in owners or (wl["metadata"].get("labels") or {}).get(keys.PREBUILT_WORKLOAD_LABEL) == job:
                return wl
        return None

    def remote_workloads(self, member: Member) -> list[dict[str, Any]]:
        return list(member.api.list(k8s.WORKLOADS, NS).get("items") or [])


def finished(fleet: Fleet, key: str) -> dict[str, Any] | None:
    wl = fleet.manager.api.get(k8s.WORKLOADS, key, NS)
    return wl if true(wl, "Finished") else None


def dispatched(fleet: Fleet, key: str) -> str | None:
    wl = fleet.manager.api.get(k8s.WORKLOADS, key, NS)
    return (wl.get("status") or {}).get("clusterName")


def true(obj: dict[str, Any] | None, ctype: str) -> bool:
    return obj is not None and any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


@contextlib.contextmanager
def build_fleet(
    base: Path, given: str | None, *, small_nodes: int = 1, big_nodes: int = 2
) -> Iterator[Fleet]:
    """A manager and two workers, ``small`` and ``big``, set up and running (module docstring).

    ``given``: a real control plane's kubeconfig for the manager (the workers are then real
    control planes too); None: three doubles."""
    real = bool(given)
    members: list[Member] = []
    try:
        if real:
            assert given is not None
            manager = Member("manager", Path(given), KubeApi(load_api_client(given), qps=None))
            install_crds(manager.api)
            install_jobset_crd(manager.api)
        else:
            manager = _member("manager", base / "manager", real=False)
            assert manager.double is not None
        members.append(manager)
        small = _member("small", base / "small", real)
        members.append(small)
        big = _member("big", base / "big", real)
        members.append(big)
        _setup_worker(small, small_nodes, real)
        _setup_worker(big, big_nodes, real)
        for worker in (small, big):
            _controller(worker, base)
        _setup_manager(manager, [small, big], 8 * (small_nodes + big_nodes))
        fleet = Fleet(manager, small, big, base)
        fleet.start_manager()
        yield fleet
    finally:
        for member in reversed(members):
            member.close()
        if real and members:
            _clean_manager(members[0].api)
            _delete_quietly(members[0].api, k8s.NAMESPACES, NS)


def _delete_quietly(api: KubeApi, res: k8s.Resource, name: str, ns: str | None = None) -> None:
    with contextlib.suppress(ApiError):
        api.delete(res, name, ns)


def _clean_manager(api: KubeApi) -> None:
    for res, name, ns in (
        (k8s.LOCAL_QUEUES, "queue", NS),
        (k8s.CLUSTER_QUEUES, "cq", None),
        (k8s.RESOURCE_FLAVORS, "gpu", None),
        (k8s.ADMISSION_CHECKS, CHECK, None),
        (k8s.MULTIKUEUE_CONFIGS, "fleet", None),
        (k8s.MULTIKUEUE_CLUSTERS, "small", None),
        (k8s.MULTIKUEUE_CLUSTERS, "big", None),
        (k8s.NAMESPACES, NS, None),
    ):
        with contextlib.suppress(ApiError):
            api.delete(res, name, ns)
