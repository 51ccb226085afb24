"""The passes of controller-vs-kube-scheduler that separate what it measures (not a benchmark itself):

* gpuplane's **Jobs path**, with the time each Workload, Job and pod first reached each phase;
* gpuplane's **pods path**: plain pods with the queue label (Kueue's pod integration; gangs are pod
  groups), created by the benchmark as they are for kube-scheduler, behind gpuplane's admission
  gate and with its scheduler name, as gpuplane's webhook would make them;
* the **raw ceiling**: the same API server binding pre-made pods (one Binding each, carrying a
  device annotation, as gpuplane's) from 16 client threads, nothing else;
* the **Job controller's ceiling**: unsuspended Jobs whose pods no scheduler takes, from the first
  Job created to the last pod made.

Each pass reports the CPU milliseconds per pod of the control plane's processes (those that
``scripts/kube-up.sh`` wrote into the kubeconfig's folder) and, where it runs, of gpuplane's.
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))

from processes import CpuMeter, control_plane_pids  # sibling modules, found through the path above
from vs_cluster import PREFIX, BoundPods, controller_process, in_parallel, log, pod_template

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi
from gpuplane.model import labels as keys

NOBODY = "bench-no-scheduler"  # a scheduler name that no scheduler has: its pods stay unbound
PHASES = ("workloadCreated", "admitted", "released", "podCreated", "bound")

Shape = tuple[str, int, int]  # job name, pods, GPUs per pod


def meter(kubeconfig: str) -> CpuMeter:
    """A CPU meter on the control plane's processes, started now (empty for a cluster that the
    project's scripts did not start)."""
    return CpuMeter(control_plane_pids(Path(kubeconfig).parent))


def _gangs_whole(bound: list[dict[str, Any]], shapes: list[Shape], label: str) -> bool:
    """Whether every gang of ``shapes`` has all its pods among ``bound`` (pods tied to their gang
    by ``label``)."""
    by_gang: dict[str, int] = {}
    for pod in bound:
        gang = (pod["metadata"].get("labels") or {}).get(label, "")
        if gang.startswith("gang-"):
            by_gang[gang] = by_gang.get(gang, 0) + 1
    return all(by_gang.get(name, 0) == count for name, count, _ in shapes if name.startswith("gang-"))


# --- gpuplane, Jobs ----------------------------------------------------------------------------------


class Phases(BoundPods):
    """Watches one namespace's Workloads, Jobs and pods, and owns the moment each object was first
    seen in each phase of the Jobs path (:data:`PHASES`)."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        super().__init__(kubeconfig, namespace, k8s.WORKLOADS, k8s.JOBS)
        self.seen: dict[str, dict[str, float]] = {phase: {} for phase in PHASES}

    def note(self) -> int:
        """Note what changed since the last call; returns the number of pods seen bound."""
        now = time.perf_counter()
        prefix = f"{self.namespace}/"
        for kind, changed in self.cache.take_changes().items():
            for key in changed:
                obj = self.cache.get(kind, key) if key.startswith(prefix) else None
                for phase in _reached(kind, obj) if obj is not None else ():
                    self.seen[phase].setdefault(key, now)
        return len(self.seen["bound"])

    def wait_all(self, count: int, timeout: float, console: Console, started: float) -> float:
        self.wait_for(self.note, count, timeout=timeout, console=console, started=started, what="pods bound")
        return time.perf_counter() - started

    def summary(self, started: float) -> dict[str, dict[str, float | int]]:
        """Per phase: how many objects reached it, and the first, median and last of those moments
        in seconds since ``started``."""
        out: dict[str, dict[str, float | int]] = {}
        for phase in PHASES:
            times = sorted(t - started for t in self.seen[phase].values())
            if not times:
                out[phase] = {"count": 0}
                continue
            out[phase] = {
                "count": len(times),
                "firstSeconds": round(times[0], 2),
                "medianSeconds": round(statistics.median(times), 2),
                "lastSeconds": round(times[-1], 2),
            }
        return out


def _reached(kind: str, obj: dict[str, Any]) -> tuple[str, ...]:
    """The phases of the Jobs path that this object shows it has reached."""
    if kind == "Workload":
        admitted = bool((obj.get("status") or {}).get("admission"))
        return ("workloadCreated", "admitted") if admitted else ("workloadCreated",)
    if kind == "Job":
        return () if (obj.get("spec") or {}).get("suspend") else ("released",)
    if kind == "Pod":
        return ("podCreated", "bound") if (obj.get("spec") or {}).get("nodeName") else ("podCreated",)
    return ()


def run_gpuplane_jobs(
    kubeconfig: str, api: KubeApi, shapes: list[Shape], args: Any, console: Console
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Queued, suspended Jobs, then gpuplane started: timed from its start to the last pod bound.
    Returns the pass's figures and its phase breakdown."""
    namespace = f"{PREFIX}-gpuplane"
    total = sum(count for _, count, _ in shapes)

    def create(shape: Shape) -> None:
        name, count, gpus = shape
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace, "labels": {keys.QUEUE_NAME_LABEL: "queue"}},
            "spec": {
                "parallelism": count,
                "completions": count,
                "suspend": True,
                # gpuplane's scheduler name, as its webhook sets it on the templates of queued
                # jobs (without it, the cluster's kube-scheduler would bind the pods)
                "template": {"spec": pod_template(gpus, keys.SCHEDULER_NAME)},
            },
        }
        api.create(k8s.JOBS, body, namespace)

    t = time.perf_counter()
    in_parallel(shapes, create)
    log(console, f"gpuplane, Jobs: {len(shapes):,} queued jobs created in {time.perf_counter() - t:.1f}s")
    context = mp.get_context("spawn")
    with Phases(kubeconfig, namespace) as watch:
        watch.note()  # the suspended Jobs, as listed
        stop, results = context.Event(), context.Queue()
        cpu = meter(kubeconfig)
        started = time.perf_counter()
        child = context.Process(target=controller_process, args=(kubeconfig, stop, results, args.profile))
        child.start()
        if child.pid is not None:
            cpu.add("gpuplane", child.pid)
        try:
            seconds = watch.wait_all(total, args.timeout, console, started)
            cpu_per_pod = cpu.per_pod(total)
        finally:
            stop.set()  # the controller ends with the pass, whether or not it timed out
        measured = results.get(timeout=120)
        child.join(timeout=60)
        whole = _gangs_whole(watch.bound(), shapes, "job-name")
        phases = watch.summary(started)
    log(console, f"gpuplane, Jobs: {total:,} pods bound in {seconds:.1f}s")
    figures = {
        "podsPerSecond": round(total / seconds, 1),
        "seconds": round(seconds, 2),
        "cpuSecondsPerPod": round(measured["cpuSeconds"] / total, 5),
        "apiCallsPerPod": round(measured["apiCalls"] / total, 2),
        "apiCallsByKind": measured["apiCallsByKind"],
        "everyGangWhole": whole,
        "cpuMsPerPod": cpu_per_pod,
    }
    return figures, phases


# --- gpuplane, plain pods ----------------------------------------------------------------------------


def run_gpuplane_pods(
    kubeconfig: str, api: KubeApi, shapes: list[Shape], args: Any, console: Console
) -> dict[str, Any]:
    """gpuplane started and synced first; then the pods created as for kube-scheduler (gangs as pod
    groups), timed from the first pod created to the last pod bound."""
    namespace = f"{PREFIX}-pods"
    pods = [(f"{name}-{i}", name, count, gpus) for name, count, gpus in shapes for i in range(count)]

    def create(item: tuple[str, str, int, int]) -> None:
        name, group, count, gpus = item
        labels = {keys.QUEUE_NAME_LABEL: "queue"}
        annotations = {}
        if count > 1:
            labels[keys.POD_GROUP_LABEL] = group
            annotations[keys.POD_GROUP_COUNT] = str(count)
        spec = pod_template(gpus, keys.SCHEDULER_NAME)
        spec["schedulingGates"] = [{"name": keys.ADMISSION_GATE}]  # as gpuplane's webhook adds it
        meta = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}
        api.create(k8s.PODS, {"metadata": meta, "spec": spec}, namespace)

    context = mp.get_context("spawn")
    stop, results, ready = context.Event(), context.Queue(), context.Event()
    child = context.Process(target=controller_process, args=(kubeconfig, stop, results, None, ready))
    child.start()
    try:
        if not ready.wait(180):
            raise SystemExit("gpuplane's informers did not sync within 180 s")
        with BoundPods(kubeconfig, namespace) as watch:
            cpu = meter(kubeconfig)
            if child.pid is not None:
                cpu.add("gpuplane", child.pid)
            started = time.perf_counter()
            in_parallel(pods, create)
            seconds = watch.wait_all(len(pods), args.timeout, console, started)
            cpu_per_pod = cpu.per_pod(len(pods))
            whole = _gangs_whole(watch.bound(), shapes, keys.POD_GROUP_LABEL)
    finally:
        stop.set()
    measured = results.get(timeout=120)
    child.join(timeout=60)
    log(console, f"gpuplane, pods: {len(pods):,} pods bound in {seconds:.1f}s")
    return {
        "podsPerSecond": round(len(pods) / seconds, 1),
        "seconds": round(seconds, 2),
        "cpuSecondsPerPod": round(measured["cpuSeconds"] / len(pods), 5),
        "apiCallsPerPod": round(measured["apiCalls"] / len(pods), 2),
        "apiCallsByKind": measured["apiCallsByKind"],
        "everyGangWhole": whole,
        "cpuMsPerPod": cpu_per_pod,
    }


# --- the ceilings ----------------------------------------------------------------------------------


def _first_fit(shapes: list[Shape], nodes: int) -> list[tuple[str, int, str, str]]:
    """(pod name, GPUs, node, devices) of every pod, filling the nodes' 8 GPUs in order."""
    out = []
    node, used = 0, 0
    for name, count, gpus in shapes:
        for i in range(count):
            if used + gpus > 8:
                node, used = node + 1, 0
            if node >= nodes:
                raise SystemExit("the pods do not fit the nodes")
            devices = ",".join(str(d) for d in range(used, used + gpus))
            out.append((f"{name}-{i}", gpus, f"{PREFIX}-n{node:05d}", devices))
            used += gpus
    return out


def raw_ceiling(
    kubeconfig: str, api: KubeApi, shapes: list[Shape], nodes: int, console: Console
) -> dict[str, Any]:
    """Pods made beforehand for a scheduler that does not exist, then bound from the benchmark's 16
    client threads: one Binding each, with a device annotation, nothing else."""
    namespace = f"{PREFIX}-raw"
    placed = _first_fit(shapes, nodes)

    def create(item: tuple[str, int, str, str]) -> None:
        name, gpus, _, _ = item
        api.create(
            k8s.PODS,
            {"metadata": {"name": name, "namespace": namespace}, "spec": pod_template(gpus, NOBODY)},
            namespace,
        )

    def bind(item: tuple[str, int, str, str]) -> None:
        name, _, node, devices = item
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "annotations": {keys.DEVICES_ANNOTATION: devices},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        api.request("POST", k8s.PODS.path(namespace, name, "binding"), body=binding)

    cpu = meter(kubeconfig)
    t = time.perf_counter()
    in_parallel(placed, create)
    create_seconds = time.perf_counter() - t
    create_cpu = cpu.per_pod(len(placed))
    cpu = meter(kubeconfig)
    t = time.perf_counter()
    in_parallel(placed, bind)
    seconds = time.perf_counter() - t
    log(
        console,
        f"raw ceiling: {len(placed):,} pods bound in {seconds:.1f}s (created in {create_seconds:.1f}s)",
    )
    return {
        "podsPerSecond": round(len(placed) / seconds, 1),
        "seconds": round(seconds, 2),
        "cpuMsPerPod": cpu.per_pod(len(placed)),
        "createPodsPerSecond": round(len(placed) / create_seconds, 1),
        "createCpuMsPerPod": create_cpu,
    }


def job_controller_ceiling(
    kubeconfig: str, api: KubeApi, shapes: list[Shape], args: Any, console: Console
) -> dict[str, Any]:
    """Unsuspended Jobs whose pods no scheduler takes: from the first Job created to the last pod
    the Job controller made, as a watch sees them."""
    namespace = f"{PREFIX}-jobs-only"
    total = sum(count for _, count, _ in shapes)

    def create(shape: Shape) -> None:
        name, count, gpus = shape
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "parallelism": count,
                "completions": count,
                "template": {"spec": pod_template(gpus, NOBODY)},
            },
        }
        api.create(k8s.JOBS, body, namespace)

    with BoundPods(kubeconfig, namespace) as watch:
        cpu = meter(kubeconfig)
        started = time.perf_counter()
        in_parallel(shapes, create)
        watch.wait_for(
            lambda: len(watch.made()),
            total,
            timeout=args.timeout,
            console=console,
            started=started,
            what="pods made",
        )
        seconds = time.perf_counter() - started
        cpu_per_pod = cpu.per_pod(total)
    log(console, f"Job controller ceiling: {total:,} pods made in {seconds:.1f}s")
    return {
        "podsPerSecond": round(total / seconds, 1),
        "seconds": round(seconds, 2),
        "cpuMsPerPod": cpu_per_pod,
    }
