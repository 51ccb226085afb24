"""gpuplane against kube-scheduler, on the same real API server in the same run.

Load (defaults): 1,000 Nodes x 8 GPUs, 5,000 one-GPU pods and 200 gangs of 4 pods x 2 GPUs. Three
passes over the same pods, one after another, each on empty nodes:

* **gpuplane**: the pods are batch Jobs, queued and suspended. The controller runs in its own process
  (the official client, its default QPS and burst), creates their Workloads, admits them, releases the
  Jobs, and binds their pods once kube-controller-manager's Job controller has made them. Timed from
  the controller's start to the last pod bound (queued jobs -> admitted -> bound). Reported: pods per
  second, the controller process's CPU seconds per pod, its API requests per pod, and whether every
  gang was bound whole.
* **kube-scheduler**: the cluster's own ``default-scheduler`` at its default settings (client QPS 50,
  burst 100), on the same pods created directly (gangs are plain pods). Timed from the first pod
  created to the last pod bound.
* **kube-scheduler, tuned**: a second kube-scheduler from the project's build (``GPUPLANE_KUBE_BIN``
  or the unpacked cache of ``scripts/kube-up.sh``) with client QPS 1,000 / burst 2,000 and its own
  scheduler name. ``null`` when that binary is not available.

Without ``--kubeconfig`` it starts the project's control plane (``scripts/kube-up.sh``), with the Job
controller's client raised to 1,000 QPS so that pod creation does not set gpuplane's pace, and stops it
at the end. With ``--kubeconfig`` the cluster must have no kubelets (the pods never run), and the
benchmark deletes what it created.

Usage::

    python3 bench/run.py controller-vs-kube-scheduler [--kubeconfig K] [--nodes 1000] [--pods 5000]
                                                      [--gangs 200] [--output json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Self

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from processes import running  # noqa: E402 (a sibling module of this folder)

from controller_harness import install_crds  # noqa: E402 (after the path set-up)
from gpuplane.k8s import api as k8s  # noqa: E402
from gpuplane.k8s.api import ApiError, KubeApi, load_api_client  # noqa: E402
from gpuplane.k8s.controller import Controller, ControllerConfig  # noqa: E402
from gpuplane.k8s.informer import Cache, Informer  # noqa: E402
from manifests import GPU, cluster_queue, local_queue, node, pod_spec, resource_flavor  # noqa: E402

PREFIX = "bench-vs"
POOL = "gpuplane.dev/bench-pool"
FLAVOR = f"{PREFIX}-gpu"
WORKERS = 16  # client threads that create and delete objects
TUNED_QPS, TUNED_BURST = 1000, 2000
TUNED_NAME = "bench-tuned-scheduler"
VERSION = "v1.36.2"


def log(console: Console, text: str) -> None:
    console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {text}", highlight=False)


def in_parallel(work: list[Any], call: Callable[[Any], Any]) -> None:
    with ThreadPoolExecutor(WORKERS) as pool:
        for _ in pool.map(call, work):
            pass


# --- the control plane ------------------------------------------------------------------------------


@contextmanager
def control_plane(kubeconfig: str | None, console: Console) -> Iterator[str]:
    """The given cluster, or the project's own control plane started for this run."""
    if kubeconfig:
        yield kubeconfig
        return
    directory = Path(tempfile.mkdtemp(prefix="gpuplane-bench-kube-"))
    env = {**os.environ, "GPUPLANE_KCM_QPS": "1000", "GPUPLANE_KCM_BURST": "2000"}
    started = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kube-up.sh"), str(directory)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=300,
    )
    if started.returncode != 0:
        raise SystemExit(f"the control plane did not start:\n{started.stderr[-2000:]}")
    log(console, f"control plane {VERSION} started in {directory}")
    try:
        yield str(directory / "kubeconfig")
    finally:
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "kube-down.sh"), "--purge", str(directory)],
            capture_output=True,
            check=False,
            timeout=120,
        )


def kube_scheduler_binary() -> Path | None:
    """The project's kube-scheduler build: ``GPUPLANE_KUBE_BIN``, or the cache kube-up.sh unpacks."""
    given = os.environ.get("GPUPLANE_KUBE_BIN")
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpuplane" / "kube" / VERSION
    for folder in (Path(given) if given else None, cache):
        if folder is not None and os.access(folder / "kube-scheduler", os.X_OK):
            return folder / "kube-scheduler"
    found = shutil.which("kube-scheduler")
    return Path(found) if found else None


@contextmanager
def tuned_scheduler(binary: Path, kubeconfig: str, directory: Path) -> Iterator[None]:
    """A second kube-scheduler with a raised client QPS and its own scheduler name."""
    config = directory / "tuned-scheduler.yaml"
    config.write_text(
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        f"clientConnection: {{kubeconfig: {kubeconfig}, qps: {TUNED_QPS}, burst: {TUNED_BURST}}}\n"
        "leaderElection: {leaderElect: false}\n"
        f"profiles: [{{schedulerName: {TUNED_NAME}}}]\n"
    )
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        str(binary),
        "--config",
        str(config),
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
    ]
    command += ["--authentication-kubeconfig", kubeconfig, "--authorization-kubeconfig", kubeconfig]
    with running(command, directory / "tuned-scheduler.log"):
        yield


# --- objects ------------------------------------------------------------------------------------------


def setup(api: KubeApi, nodes: int, gpus: int) -> None:
    install_crds(api)
    for ns in (f"{PREFIX}-gpuplane", f"{PREFIX}-default", f"{PREFIX}-tuned"):
        api.create(k8s.NAMESPACES, {"metadata": {"name": ns}})
    api.create(k8s.RESOURCE_FLAVORS, resource_flavor(FLAVOR).set("spec.nodeLabels", {POOL: PREFIX}).to_dict())
    queue = cluster_queue(f"{PREFIX}-cq").flavor(FLAVOR, cpu="100000", gpu=gpus).to_dict()
    api.create(k8s.CLUSTER_QUEUES, queue)
    api.create(
        k8s.LOCAL_QUEUES,
        local_queue("queue", f"{PREFIX}-gpuplane", f"{PREFIX}-cq").to_dict(),
        f"{PREFIX}-gpuplane",
    )

    def add_node(i: int) -> None:
        name = f"{PREFIX}-n{i:05d}"
        body = (
            node(name)
            .allocatable(cpu="128", memory="2Ti", pods="110", gpu=8)
            .label(POOL, PREFIX)
            .label("kubernetes.io/hostname", name)
            .label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
            .to_dict()
        )
        body["status"]["capacity"] = dict(body["status"]["allocatable"])
        api.create(k8s.NODES, body)

    in_parallel(list(range(nodes)), add_node)


def teardown(api: KubeApi, nodes: int) -> None:
    for ns in (f"{PREFIX}-gpuplane", f"{PREFIX}-default", f"{PREFIX}-tuned"):
        clear_namespace(api, ns)
        _ignore(lambda ns=ns: api.delete(k8s.NAMESPACES, ns))
    _ignore(lambda: api.delete(k8s.CLUSTER_QUEUES, f"{PREFIX}-cq"))
    _ignore(lambda: api.delete(k8s.RESOURCE_FLAVORS, FLAVOR))
    in_parallel(list(range(nodes)), lambda i: _ignore(lambda: api.delete(k8s.NODES, f"{PREFIX}-n{i:05d}")))


def _ignore(call: Callable[[], Any]) -> None:
    with suppress(ApiError):
        call()


def clear_namespace(api: KubeApi, namespace: str) -> None:
    """Delete the namespace's Jobs, Workloads and pods (grace period 0: no kubelet ends them)."""
    for res in (k8s.JOBS, k8s.WORKLOADS):
        _ignore(lambda res=res: api.request("DELETE", res.path(namespace), {"propagationPolicy": "Orphan"}))
    _ignore(lambda: api.request("DELETE", k8s.PODS.path(namespace), {"gracePeriodSeconds": 0}))
    deadline = time.monotonic() + 1200  # thousands of pods go slowly on a loaded machine
    while api.list(k8s.PODS, namespace, limit=1).get("items"):
        if time.monotonic() > deadline:
            raise SystemExit(f"the pods of {namespace} did not go")
        time.sleep(0.2)


def pod_template(gpus: int, scheduler: str | None = None) -> dict[str, Any]:
    spec = pod_spec().container(limits={GPU: gpus}, cpu="100m", gpu=gpus).to_dict()
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = 0
    spec["nodeSelector"] = {POOL: PREFIX}
    if scheduler:
        spec["schedulerName"] = scheduler
    return spec


def workload_shapes(pods: int, gangs: int, gang_size: int) -> list[tuple[str, int, int]]:
    """(name, pods, GPUs per pod) of every job: the single pods, then the gangs."""
    shapes = [(f"single-{i:05d}", 1, 1) for i in range(pods)]
    return shapes + [(f"gang-{i:04d}", gang_size, 2) for i in range(gangs)]


# --- watching pods ---------------------------------------------------------------------------------


class Watched:
    """One kind's objects, kept by a watch (an informer into a cache of its own) while in a ``with``."""

    def __init__(self, kubeconfig: str, namespace: str, resource: k8s.Resource) -> None:
        self.namespace = namespace
        self.api = KubeApi(load_api_client(kubeconfig), qps=None)
        self.cache = Cache()
        self.informer = Informer(self.api, resource, self.cache)

    def __enter__(self) -> Self:
        self.informer.start()
        self.informer.synced.wait(60)
        return self

    def __exit__(self, *_exc: object) -> None:
        self.informer.stop()

    def wait_for(
        self,
        done: Callable[[], int],
        count: int,
        *,
        timeout: float,
        console: Console,
        started: float,
        what: str,
    ) -> None:
        """Until ``done()`` reaches ``count`` (looked at on every change the watch brings), logging
        progress every 15 s; exits the run after ``timeout`` seconds since ``started``."""
        last = time.perf_counter()
        while (now_done := done()) < count:
            now = time.perf_counter()
            if now - started > timeout:
                raise SystemExit(f"timed out with {now_done:,}/{count:,} {what} in {self.namespace}")
            if now - last > 15:
                log(console, f"  {now_done:,}/{count:,} {what}")
                last = now
            self.cache.changed.wait(0.05)
            self.cache.changed.clear()


class BoundPods(Watched):
    """Counts the bound pods of one namespace from a watch, and notes when the last one was bound."""

    def __init__(self, kubeconfig: str, namespace: str) -> None:
        super().__init__(kubeconfig, namespace, k8s.PODS)

    def bound(self) -> list[dict[str, Any]]:
        prefix = f"{self.namespace}/"
        with self.cache.lock:
            pods = self.cache.objects.get("Pod", {})
            return [p for key, p in pods.items() if key.startswith(prefix) and p["spec"].get("nodeName")]

    def wait_all(self, count: int, timeout: float, console: Console, started: float) -> float:
        """Until ``count`` pods are bound; returns the seconds since ``started``."""
        self.wait_for(
            lambda: len(self.bound()),
            count,
            timeout=timeout,
            console=console,
            started=started,
            what="pods bound",
        )
        return time.perf_counter() - started


# --- gpuplane --------------------------------------------------------------------------------------


class CountingApi(KubeApi):
    """The controller's client, counting every request it sends (watches included)."""

    calls = 0

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        CountingApi.calls += 1
        return super()._call(*args, **kwargs)


def controller_process(kubeconfig: str, stop: Any, results: Any, profile: str | None) -> None:
    """The controller under test, until ``stop`` is set; sends its API calls and CPU time."""
    profiler = None
    if profile:
        import cProfile  # noqa: PLC0415 (only when asked)

        profiler = cProfile.Profile()
        profiler.enable()
    api = CountingApi(load_api_client(kubeconfig))
    api.api_client.user_agent = "gpuplane-controller/bench"
    controller = Controller(
        api, ControllerConfig(leader_election=False, integrations=("Job",), dry_run_preemption=True)
    )
    controller.start(wait=120)
    controller.run(stop.is_set, interval=0.05)
    controller.stop()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    results.put({"cpuSeconds": time.process_time(), "apiCalls": CountingApi.calls})


def run_gpuplane(
    kubeconfig: str, api: KubeApi, shapes: list[tuple[str, int, int]], args: Any, console: Console
) -> dict[str, Any]:
    namespace = f"{PREFIX}-gpuplane"
    total = sum(count for _, count, _ in shapes)

    def create(shape: tuple[str, int, int]) -> None:
        name, count, gpus = shape
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "labels": {"kueue.x-k8s.io/queue-name": "queue"},
            },
            "spec": {
                "parallelism": count,
                "completions": count,
                "suspend": True,
                "template": {"spec": pod_template(gpus)},
            },
        }
        api.create(k8s.JOBS, body, namespace)

    t = time.perf_counter()
    in_parallel(shapes, create)
    log(console, f"gpuplane: {len(shapes):,} queued jobs created in {time.perf_counter() - t:.1f}s")
    context = mp.get_context("spawn")
    with BoundPods(kubeconfig, namespace) as watch:
        stop, results = context.Event(), context.Queue()
        started = time.perf_counter()
        child = context.Process(target=controller_process, args=(kubeconfig, stop, results, args.profile))
        child.start()
        seconds = watch.wait_all(total, args.timeout, console, started)
        stop.set()
        measured = results.get(timeout=120)
        child.join(timeout=60)
        by_gang: dict[str, int] = {}
        for pod in watch.bound():
            job_name = (pod["metadata"].get("labels") or {}).get("job-name", "")
            if job_name.startswith("gang-"):
                by_gang[job_name] = by_gang.get(job_name, 0) + 1
    gangs_whole = all(by_gang.get(name, 0) == count for name, count, _ in shapes if name.startswith("gang-"))
    log(console, f"gpuplane: {total:,} pods bound in {seconds:.1f}s")
    return {
        "podsPerSecond": round(total / seconds, 1),
        "seconds": round(seconds, 2),
        "cpuSecondsPerPod": round(measured["cpuSeconds"] / total, 5),
        "apiCallsPerPod": round(measured["apiCalls"] / total, 2),
        "everyGangWhole": gangs_whole,
    }


# --- kube-scheduler ---------------------------------------------------------------------------------


def run_kube_scheduler(
    kubeconfig: str,
    api: KubeApi,
    shapes: list[tuple[str, int, int]],
    *,
    namespace: str,
    scheduler: str | None,
    args: Any,
    console: Console,
    label: str,
) -> dict[str, Any]:
    pods = [(f"{name}-{i}", gpus) for name, count, gpus in shapes for i in range(count)]

    def create(item: tuple[str, int]) -> None:
        name, gpus = item
        body = {"metadata": {"name": name, "namespace": namespace}, "spec": pod_template(gpus, scheduler)}
        api.create(k8s.PODS, body, namespace)

    with BoundPods(kubeconfig, namespace) as watch:
        started = time.perf_counter()
        in_parallel(pods, create)
        seconds = watch.wait_all(len(pods), args.timeout, console, started)
    log(console, f"{label}: {len(pods):,} pods bound in {seconds:.1f}s")
    return {"podsPerSecond": round(len(pods) / seconds, 1), "seconds": round(seconds, 2)}


# --- the run -----------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, console: Console) -> dict[str, Any]:
    shapes = workload_shapes(args.pods, args.gangs, args.gang_size)
    total_pods = sum(count for _, count, _ in shapes)
    total_gpus = sum(count * gpus for _, count, gpus in shapes)
    if total_gpus > args.nodes * 8:
        raise SystemExit(f"{total_gpus} GPUs asked of {args.nodes * 8}: every pod must fit")
    with control_plane(args.kubeconfig, console) as kubeconfig, tempfile.TemporaryDirectory() as tmp:
        # Deleting thousands of objects in one request takes longer than a client's usual timeout.
        api = KubeApi(load_api_client(kubeconfig), timeout=600.0, qps=None)
        t = time.perf_counter()
        setup(api, args.nodes, total_gpus)
        log(console, f"set up {args.nodes:,} nodes in {time.perf_counter() - t:.1f}s")
        try:
            gpuplane = run_gpuplane(kubeconfig, api, shapes, args, console)
            clear_namespace(api, f"{PREFIX}-gpuplane")
            if args.only_gpuplane:
                return {"gpuplane": gpuplane}
            default = run_kube_scheduler(
                kubeconfig,
                api,
                shapes,
                namespace=f"{PREFIX}-default",
                scheduler=None,
                args=args,
                console=console,
                label="kube-scheduler",
            )
            clear_namespace(api, f"{PREFIX}-default")
            binary = kube_scheduler_binary()
            tuned: dict[str, Any] | None = None
            if binary is not None:
                with tuned_scheduler(binary, kubeconfig, Path(tmp)):
                    tuned = run_kube_scheduler(
                        kubeconfig,
                        api,
                        shapes,
                        namespace=f"{PREFIX}-tuned",
                        scheduler=TUNED_NAME,
                        args=args,
                        console=console,
                        label="kube-scheduler tuned",
                    )
            else:
                log(console, "no kube-scheduler binary of the project's build: kubeSchedulerTuned is null")
        finally:
            teardown(api, args.nodes)
            api.api_client.close()
    ratio = gpuplane["podsPerSecond"] / default["podsPerSecond"]
    return {
        "gpuplane": gpuplane,
        "kubeScheduler": default,
        "kubeSchedulerTuned": tuned,
        "ratio": round(ratio, 2),
        "ratioTuned": None if tuned is None else round(gpuplane["podsPerSecond"] / tuned["podsPerSecond"], 2),
        "load": {
            "nodes": args.nodes,
            "gpusPerNode": 8,
            "pods": args.pods,
            "gangs": args.gangs,
            "gangSize": args.gang_size,
            "totalPods": total_pods,
            "cpus": os.cpu_count(),
        },
        "settings": {
            "gpuplaneQps": "client default",
            "kubeScheduler": "default-scheduler, client QPS 50 / burst 100",
            "kubeSchedulerTuned": f"client QPS {TUNED_QPS} / burst {TUNED_BURST}",
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--kubeconfig", help="a kubelet-less cluster; default: start the project's control plane"
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000, help="one-GPU pods")
    parser.add_argument("--gangs", type=int, default=200, help="gangs of --gang-size pods x 2 GPUs")
    parser.add_argument("--gang-size", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds one pass may take")
    parser.add_argument("--output", choices=("table", "json"), default="table")
    parser.add_argument("--profile", help="write a cProfile of the controller process here")
    parser.add_argument("--only-gpuplane", action="store_true", help="skip the kube-scheduler passes")
    args = parser.parse_args(argv)
    console = Console(stderr=args.output == "json")
    result = run(args, console)
    if args.output == "json":
        sys.stdout.write(json.dumps(result, indent=1) + "\n")
        return 0
    table = Table(
        title=f"{args.nodes:,} nodes, {args.pods:,} pods + {args.gangs:,} gangs of {args.gang_size}"
    )
    table.add_column("scheduler")
    table.add_column("pods / s", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("gpuplane / this", justify="right")
    table.add_row(
        "gpuplane", f"{result['gpuplane']['podsPerSecond']:,.1f}", f"{result['gpuplane']['seconds']:,.1f}", ""
    )
    table.add_row(
        "kube-scheduler (default)",
        f"{result['kubeScheduler']['podsPerSecond']:,.1f}",
        f"{result['kubeScheduler']['seconds']:,.1f}",
        f"{result['ratio']:.2f}",
    )
    if result["kubeSchedulerTuned"] is not None:
        table.add_row(
            "kube-scheduler (tuned)",
            f"{result['kubeSchedulerTuned']['podsPerSecond']:,.1f}",
            f"{result['kubeSchedulerTuned']['seconds']:,.1f}",
            f"{result['ratioTuned']:.2f}",
        )
    console.print(table)
    console.print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
