"""The cluster side of the controller-vs-kube-scheduler benchmarks (not a benchmark): the project's
control plane, the benchmark's nodes, queues and namespaces, pod templates, watches that count what
the API server shows, and the gpuplane controller run in a process of its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar, Self

from rich.console import Console
from urllib3.exceptions import HTTPError

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests"), str(ROOT / "bench")]

from controller_harness import install_crds  # noqa: E402 (after the path set-up)
from gpuplane.k8s import api as k8s  # noqa: E402
from gpuplane.k8s.api import ApiError, KubeApi, Resource, load_api_client  # noqa: E402
from gpuplane.k8s.controller import Controller, ControllerConfig  # noqa: E402
from gpuplane.k8s.informer import Cache, Informer  # noqa: E402
from manifests import GPU, cluster_queue, local_queue, node, pod_spec, resource_flavor  # noqa: E402

PREFIX = "bench-vs"
POOL = "gpuplane.dev/bench-pool"
FLAVOR = f"{PREFIX}-gpu"
WORKERS = 16  # client threads that create and delete objects
VERSION = "v1.36.2"
# The namespaces of the passes: gpuplane's Jobs and plain pods, kube-scheduler at its defaults and
# tuned, and the two ceilings (raw bindings; the Job controller alone).
BENCH_NAMESPACES = tuple(
    f"{PREFIX}-{name}" for name in ("gpuplane", "pods", "default", "tuned", "raw", "jobs-only")
)
QUEUED = (f"{PREFIX}-gpuplane", f"{PREFIX}-pods")  # those with gpuplane's LocalQueue "queue"


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


# --- objects ------------------------------------------------------------------------------------------


def setup(api: KubeApi, nodes: int, gpus: int) -> None:
    install_crds(api)
    for ns in BENCH_NAMESPACES:
        make_namespace(api, ns)
    # A run that was killed leaves its cluster-scoped objects (a teardown that did run removes them):
    # the flavor and the queue get this run's spec, and its nodes are taken as they are.
    flavor = resource_flavor(FLAVOR).set("spec.nodeLabels", {POOL: PREFIX}).to_dict()
    _create_or_respec(api, k8s.RESOURCE_FLAVORS, flavor)
    queue = cluster_queue(f"{PREFIX}-cq").flavor(FLAVOR, cpu="100000", gpu=gpus).to_dict()
    _create_or_respec(api, k8s.CLUSTER_QUEUES, queue)
    for ns in QUEUED:
        api.create(k8s.LOCAL_QUEUES, local_queue("queue", ns, f"{PREFIX}-cq").to_dict(), ns)

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
        _keep_existing(lambda: api.create(k8s.NODES, body))

    in_parallel(list(range(nodes)), add_node)


def make_namespace(api: KubeApi, name: str, timeout: float = 300.0) -> None:
    """Create the namespace; one of an earlier run (still being deleted, or about to be by that
    run's teardown) is waited for, up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            api.create(k8s.NAMESPACES, {"metadata": {"name": name}})
            return
        except ApiError as err:
            if not err.conflict:
                raise
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"namespace {name} is left from an earlier run: delete it (kubectl delete ns {name})"
                ) from err
        time.sleep(1.0)


def teardown(api: KubeApi, nodes: int) -> None:
    for ns in BENCH_NAMESPACES:
        clear_namespace(api, ns)
        _ignore(lambda ns=ns: api.delete(k8s.NAMESPACES, ns))
    _ignore(lambda: api.delete(k8s.CLUSTER_QUEUES, f"{PREFIX}-cq"))
    _ignore(lambda: api.delete(k8s.RESOURCE_FLAVORS, FLAVOR))
    in_parallel(list(range(nodes)), lambda i: _ignore(lambda: api.delete(k8s.NODES, f"{PREFIX}-n{i:05d}")))


def _create_or_respec(api: KubeApi, res: Resource, body: dict[str, Any]) -> None:
    """Create a cluster-scoped object, or give the one of that name that exists already ``body``'s spec."""
    try:
        api.create(res, body)
    except ApiError as err:
        if not err.conflict:
            raise
        found = api.get(res, body["metadata"]["name"])
        api.replace(res, {**found, "spec": body["spec"]})


def _keep_existing(create: Callable[[], Any]) -> None:
    """Create, or keep the object of that name that exists already (409)."""
    try:
        create()
    except ApiError as err:
        if not err.conflict:
            raise


def _ignore(call: Callable[[], Any]) -> None:
    """Make a call whose failure the caller checks for itself (a refusal, or a connection that the
    loaded server broke off mid-reply)."""
    with suppress(ApiError, HTTPError):
        call()


def clear_namespace(api: KubeApi, namespace: str) -> None:
    """Delete the namespace's Jobs, Workloads and pods (grace period 0: no kubelet ends them), and
    wait until none is left. A collection delete can time out part way on a loaded machine, so each
    is asked again every 15 s: a Workload left admitted would hold quota in the next pass."""
    deletes = (
        (k8s.JOBS, {"propagationPolicy": "Orphan"}),
        (k8s.WORKLOADS, {"propagationPolicy": "Orphan"}),
        (k8s.PODS, {"gracePeriodSeconds": 0}),
    )
    deadline = time.monotonic() + 1200  # thousands of pods go slowly on a loaded machine
    for res, options in deletes:
        asked = 0.0
        while True:
            if time.monotonic() - asked > 15:
                _ignore(lambda res=res, options=options: api.request("DELETE", res.path(namespace), options))
                asked = time.monotonic()
            if not api.list(res, namespace, limit=1).get("items"):
                break
            if time.monotonic() > deadline:
                raise SystemExit(f"the {res.plural} of {namespace} did not go")
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
    """Some kinds' objects, kept by watches (informers into one cache of its own) while in a ``with``."""

    def __init__(self, kubeconfig: str, namespace: str, *resources: k8s.Resource) -> None:
        self.namespace = namespace
        self.api = KubeApi(load_api_client(kubeconfig), qps=None)
        self.cache = Cache()
        self.informers = [Informer(self.api, resource, self.cache) for resource in resources]

    def __enter__(self) -> Self:
        for informer in self.informers:
            informer.start()
        for informer in self.informers:
            informer.synced.wait(60)
        return self

    def __exit__(self, *_exc: object) -> None:
        for informer in self.informers:
            informer.stop()

    def wait_for(
        self,
        done: Callable[[], int],
        count: int,
        *,
        timeout: float,
        console: Console,
        started: float,
        what: str,
        process: Any = None,
    ) -> None:
        """Until ``done()`` reaches ``count`` (looked at on every change the watch brings), logging
        progress every 15 s; exits the run after ``timeout`` seconds since ``started``, or once
        ``process`` (the controller's, when given) has ended."""
        last = time.perf_counter()
        while (now_done := done()) < count:
            now = time.perf_counter()
            if now - started > timeout:
                raise SystemExit(f"timed out with {now_done:,}/{count:,} {what} in {self.namespace}")
            if process is not None and not process.is_alive():
                raise SystemExit(
                    f"the controller ended (exit code {process.exitcode}) with {now_done:,}/{count:,} {what}"
                )
            if now - last > 15:
                log(console, f"  {now_done:,}/{count:,} {what}")
                last = now
            self.cache.changed.wait(0.05)
            self.cache.changed.clear()


class BoundPods(Watched):
    """Counts the bound pods of one namespace from a watch, and notes when the last one was bound."""

    def __init__(self, kubeconfig: str, namespace: str, *more: k8s.Resource) -> None:
        super().__init__(kubeconfig, namespace, k8s.PODS, *more)

    def made(self) -> list[dict[str, Any]]:
        """The namespace's pods."""
        prefix = f"{self.namespace}/"
        with self.cache.lock:
            return [p for key, p in self.cache.objects.get("Pod", {}).items() if key.startswith(prefix)]

    def bound(self) -> list[dict[str, Any]]:
        """The namespace's pods that have a node."""
        return [p for p in self.made() if p["spec"].get("nodeName")]

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
    """The controller's client, counting every request it sends (watches included), in all and by
    verb and resource (owns the counts, shared by every instance of the process)."""

    calls = 0
    by_kind: ClassVar[Counter[str]] = Counter()

    def _call(self, method: str, path: str, query: Any = None, *args: Any, **kwargs: Any) -> Any:
        CountingApi.calls += 1
        CountingApi.by_kind[call_kind(method, path, query)] += 1
        return super()._call(method, path, query, *args, **kwargs)


def call_kind(method: str, path: str, query: Any = None) -> str:
    """``VERB resource[/subresource]`` of a request (a watch is ``WATCH``)."""
    parts = [p for p in path.split("/") if p]
    if "namespaces" in parts[:-1] and parts.index("namespaces") + 2 < len(parts):
        rest = parts[parts.index("namespaces") + 2 :]
    else:
        rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    what = rest[0] if rest else (parts[-1] if parts else "")
    if len(rest) > 2:
        what += "/" + rest[2]
    verb = "WATCH" if (query or {}).get("watch") else method
    return f"{verb} {what}"


def controller_process(
    kubeconfig: str, stop: Any, results: Any, profile: str | None, ready: Any = None
) -> None:
    """The controller under test, until ``stop`` is set; sets ``ready`` (when given) once its
    informers have synced, and sends its API calls and CPU time."""
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
    if ready is not None:
        ready.set()
    controller.run(stop.is_set, interval=0.05)
    controller.stop()
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(profile)
    results.put(
        {
            "cpuSeconds": time.process_time(),
            "apiCalls": CountingApi.calls,
            "apiCallsByKind": dict(CountingApi.by_kind.most_common()),
        }
    )
