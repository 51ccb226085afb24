"""What each kind of write on gpuplane's path costs a real API server: calls per second and the CPU
milliseconds per call of kube-apiserver and etcd.

From 16 client threads, nothing else running on the benchmark's side, it writes N of each, in this
order: Workload creates (the Workload of a queued one-GPU Job, as gpuplane makes it), placement
annotation patches, status writes, Events, suspended Job creates, the Jobs' release (their templates
stamped for the admission, as gpuplane writes it, kept suspended so that no pod is made meanwhile),
creates of pods behind gpuplane's admission gate, the gate lifted, and a Binding of each pod. The CPU is read
from ``/proc/PID/stat`` of the processes ``scripts/kube-up.sh`` listed in the kubeconfig's folder.

Usage::

    python3 bench/run.py api-write-costs -- --kubeconfig DIR/kubeconfig [--writes 400] [--output json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_cluster import PREFIX, clear_namespace, control_plane, in_parallel, pod_template, setup, teardown
from vs_passes import meter

from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.model import labels as keys


def _job(namespace: str, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"cost-{i}", "namespace": namespace, "labels": {keys.QUEUE_NAME_LABEL: "queue"}},
        "spec": {
            "parallelism": 1,
            "completions": 1,
            "suspend": True,
            "template": {"spec": pod_template(1, keys.SCHEDULER_NAME)},
        },
    }


# The writes each of gpuplane's paths must make per one-pod workload, at the floor of calls: what
# the API server's CPU for them allows on this machine's cores is that path's ceiling, whatever
# the controller does. The Jobs path's Job controller adds its own writes (the pod, the Job's
# status) on top: `controller-vs-kube-scheduler`'s `jobControllerCeiling` measures those.
PATHS = {
    "pods": ("POST pods", "POST workloads", "PUT workloads/status", "PUT pods", "POST pods/binding"),
    "jobs": ("POST workloads", "PUT workloads/status", "PUT jobs", "POST pods/binding"),
    "admission": ("POST workloads", "PUT workloads/status"),
}
SERVER = ("kube-apiserver", "etcd")


def server_ms(costs: dict[str, dict[str, Any]], kind: str) -> float:
    """The API server's and etcd's CPU ms per call of one kind of write."""
    return sum(float(costs[kind]["cpuMsPerCall"].get(proc, 0.0)) for proc in SERVER)


def floors(costs: dict[str, dict[str, Any]], cpus: int) -> dict[str, dict[str, Any]]:
    """Per path of :data:`PATHS`: the API server's and etcd's CPU ms per workload for its writes,
    and the workloads per second that those alone allow on ``cpus`` cores (every other process,
    the controller's included, taken to cost nothing)."""
    out = {}
    for path, kinds in PATHS.items():
        ms = sum(server_ms(costs, kind) for kind in kinds)
        out[path] = {
            "writes": list(kinds),
            "serverCpuMsPerWorkload": round(ms, 2),
            "workloadsPerSecondAtMost": round(cpus * 1000 / ms, 1) if ms else None,
        }
    return out


def measure(kubeconfig: str, api: KubeApi, namespace: str, writes: int) -> dict[str, dict[str, Any]]:
    """Each kind of write, ``writes`` times: calls per second and CPU ms per call."""
    out: dict[str, dict[str, Any]] = {}

    def step(label: str, items: list[Any], call: Callable[[Any], Any]) -> None:
        cpu = meter(kubeconfig)
        t = time.perf_counter()
        in_parallel(items, call)
        seconds = time.perf_counter() - t
        out[label] = {
            "callsPerSecond": round(len(items) / seconds, 1),
            "cpuMsPerCall": cpu.per_pod(len(items)),
        }

    def fetched(res: k8s.Resource, name: str) -> dict[str, Any]:
        """The object as the controller's cache holds it, to write back: without managedFields."""
        obj = api.get(res, name, namespace)
        obj["metadata"].pop("managedFields", None)
        return obj

    workloads = []
    for i in range(writes):
        job = _job(namespace, i)
        job["metadata"]["uid"] = f"bench-{i}"
        body = jobs.workload_for("Job", job, {})
        assert body is not None
        body["metadata"].pop("ownerReferences", None)  # no such Job: the garbage collector would take it
        workloads.append(body)
    created: list[dict[str, Any]] = []
    step("POST workloads", workloads, lambda body: created.append(api.create(k8s.WORKLOADS, body, namespace)))
    names = sorted(w["metadata"]["name"] for w in created)
    placement = {"metadata": {"annotations": {keys.PLACEMENT_ANNOTATION: "0" * 200}}}
    step("PATCH workloads", names, lambda name: api.patch(k8s.WORKLOADS, name, placement, namespace))
    condition = {
        "type": "QuotaReserved",
        "status": "True",
        "reason": "QuotaReserved",
        "message": "bench",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    bodies = [{**fetched(k8s.WORKLOADS, name), "status": {"conditions": [condition]}} for name in names]
    step("PUT workloads/status", bodies, lambda body: api.replace(k8s.WORKLOADS, body, sub="status"))

    def event(name: str) -> None:
        body = {
            "metadata": {"generateName": f"{name}.", "namespace": namespace},
            "involvedObject": {"kind": "Workload", "name": name, "namespace": namespace},
            "reason": "Bench",
            "message": "bench",
            "type": "Normal",
        }
        api.create(k8s.EVENTS, body, namespace)

    step("POST events", names, event)
    made: list[dict[str, Any]] = []
    step(
        "POST jobs",
        [_job(namespace, i) for i in range(writes)],
        lambda body: made.append(api.create(k8s.JOBS, body, namespace)),
    )

    def release(job: dict[str, Any]) -> None:
        name = job["metadata"]["name"]
        body = jobs.released_job("Job", job, f"job-{name}", {"main": {"pool": "bench"}}, {"q": "bench"})
        body["spec"]["suspend"] = True  # the same write, without the Job controller's pods after it
        api.replace(k8s.JOBS, body)

    time.sleep(2)  # the Job controller's own first writes (its status) come first
    step("PUT jobs", [fetched(k8s.JOBS, j["metadata"]["name"]) for j in made], release)
    _pod_writes(step, api, namespace, writes)
    return out


def _pod_writes(
    step: Callable[[str, list[Any], Callable[[Any], Any]], None], api: KubeApi, namespace: str, writes: int
) -> None:
    """Pods behind gpuplane's admission gate: their creates, the gate lifted, and a Binding each."""
    pods: list[dict[str, Any]] = []

    def pod(i: int) -> None:
        spec = {**pod_template(1, "bench-no-scheduler"), "schedulingGates": [{"name": keys.ADMISSION_GATE}]}
        body = {"metadata": {"name": f"cost-{i}", "namespace": namespace}, "spec": spec}
        made = api.create(k8s.PODS, body, namespace)
        made["metadata"].pop("managedFields", None)  # as the controller's cache holds it
        pods.append(made)

    step("POST pods", list(range(writes)), pod)

    def lift(obj: dict[str, Any]) -> None:
        body = {**obj, "spec": {**obj["spec"], "schedulingGates": []}}
        body["metadata"] = {**obj["metadata"], "labels": {keys.WORKLOAD_LABEL: obj["metadata"]["name"]}}
        api.replace(k8s.PODS, body)

    step("PUT pods", pods, lift)

    def bind(obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "annotations": {keys.DEVICES_ANNOTATION: "0"}},
            "target": {"apiVersion": "v1", "kind": "Node", "name": f"{PREFIX}-n00000"},
        }
        api.request("POST", k8s.PODS.path(namespace, name, "binding"), body=binding)

    step("POST pods/binding", pods, bind)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kubeconfig", help="a kubelet-less cluster; default: start the project's control plane"
    )
    parser.add_argument("--writes", type=int, default=400, help="writes of each kind")
    parser.add_argument("--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    if args.writes < 1:
        parser.error(f"--writes must be positive, not {args.writes}")
    console = Console(stderr=args.output == "json")
    with control_plane(args.kubeconfig, console) as kubeconfig:
        api = KubeApi(load_api_client(kubeconfig), timeout=600.0, qps=None)
        setup(api, 1, 8)
        namespace = f"{PREFIX}-gpuplane"
        try:
            result = measure(kubeconfig, api, namespace, args.writes)
        finally:
            clear_namespace(api, namespace)
            teardown(api, 1)
            api.api_client.close()
    bounds = floors(result, os.cpu_count() or 1)
    if args.output == "json":
        print(json.dumps({**result, "floors": bounds}))
    else:
        for label, figures in result.items():
            console.print(f"{label:22s} {figures['callsPerSecond']:8.1f}/s  {figures['cpuMsPerCall']}")
        for path, bound in bounds.items():
            console.print(
                f"{path:10s} {bound['serverCpuMsPerWorkload']:6.2f} ms of API server and etcd CPU a workload:"
                f" at most {bound['workloadsPerSecondAtMost']}/s ({' + '.join(bound['writes'])})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
