"""How the controller writes: independent writes at once, bounded by the client's QPS and burst; an
assumed admission forgotten whatever made its write fail; the webhook's TLS handshake bounded.

These need the double's fault hooks (or no cluster at all), so they skip against a real cluster.
"""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from apiserver.fixtures import Cluster, Kubectl
from apiserver.server import ApiServerDouble
from controller_harness import JobController, Scene, make_scene, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s import binding as binding_module
from gpuplane.k8s import reporting as reporting_module
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.k8s.controller import Controller, ControllerConfig
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.webhook import serve
from gpuplane.kube.ratelimit import RateLimiter
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from testca import issue

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def scene(apiserver: Cluster, kubectl: Kubectl, double: ApiServerDouble) -> Iterator[Scene]:
    del double  # requested so that these tests skip against a real cluster
    yield from make_scene(apiserver, kubectl)


# --- concurrent writes ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("write", "jobs", "pods"),
    [
        pytest.param(("pods", "binding", "create"), 1, 4, id="bindings-of-the-pods-of-a-gang"),
        pytest.param(("workloads", "status", "update"), 4, 1, id="admissions-of-different-workloads"),
    ],
)
def test_independent_writes_are_in_flight_at_the_same_time(
    scene: Scene, double: ApiServerDouble, write: tuple[str, str, str], jobs: int, pods: int
) -> None:
    """The double holds each matching request of the controller until four of them are in flight
    together: a controller that wrote one after another would never get there (the barrier breaks
    after 10 s, and the test fails)."""
    scene.setup(nodes=1)
    barrier = threading.Barrier(4, timeout=10)
    overlapped = threading.Event()

    def hold(request: Any) -> None:
        ours = (request.resource, request.subresource, request.verb) == write
        if ours and not overlapped.is_set() and request.user_agent.startswith("gpuplane-controller"):
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
                overlapped.set()

    double.faults.intercept(hold)
    scene.job_controller()
    # Every job exists before the controller starts, so one pass admits them all; a gang's pods
    # are bound together once all exist.
    scene.submit(*(scene.job(f"j{i}", pods=pods, gpus=1) for i in range(jobs)))
    wait_until(lambda: len(scene.jobs()) == jobs, 10, "the jobs stored")
    run = scene.controller(leader_election=False)
    wait_until(lambda: all(scene.bound(f"j{i}", pods) for i in range(jobs)), 20, "all bound")
    assert overlapped.is_set(), "the writes never overlapped"
    assert not barrier.broken
    assert run.controller.counters.write_failures == 0


@contextlib.contextmanager
def started_controller(
    scene: Scene, api: KubeApi | None = None, prepare: Callable[[Controller], None] | None = None
) -> Iterator[Controller]:
    """A controller without leader election on the scene's cluster (through ``api`` when given),
    ``prepare``d and started; stopped, with its client closed, when the block ends."""
    api = api or KubeApi(load_api_client(scene.kubeconfig), qps=None)
    controller = Controller(api, ControllerConfig(leader_election=False))
    if prepare is not None:
        prepare(controller)
    controller.start()
    try:
        yield controller
    finally:
        controller.stop()
        api.api_client.close()  # type: ignore[no-untyped-call]


def test_an_assumed_admission_is_forgotten_when_its_write_fails_for_any_reason(scene: Scene) -> None:
    """Not only an API error: a connection that breaks mid-write leaves no assumption behind."""
    scene.setup(nodes=1)
    scene.submit(scene.job("j", gpus=1))

    class BrokenWrites(KubeApi):
        def replace(self, res: Any, body: Any, sub: str | None = None) -> dict[str, Any]:
            if sub == "status" and (body.get("status") or {}).get("admission"):
                raise ConnectionResetError("connection reset while the admission was written")
            return super().replace(res, body, sub)

    with started_controller(scene, BrokenWrites(load_api_client(scene.kubeconfig))) as controller:
        wait_until(lambda: controller.cache.items("Job"), 10, "the job cached")
        with pytest.raises(ConnectionResetError):
            controller.reconcile()  # creates the Workload, then admits it
        assert controller.cache.assumed == {}, "the failed admission is not assumed any more"
        (wl,) = controller.cache.items("Workload")
        assert not (wl.get("status") or {}).get("admission")


# --- client QPS and burst -------------------------------------------------------------------------


class FakeTime:
    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


@pytest.mark.parametrize(
    ("qps", "burst", "calls", "want_waited"),
    [
        pytest.param(10.0, 5, 5, 0.0, id="within-burst-no-wait"),
        pytest.param(10.0, 5, 6, 0.1, id="one-over-burst-waits-one-token"),
        pytest.param(10.0, 5, 25, 2.0, id="twenty-over-burst-take-two-seconds"),
        pytest.param(50.0, 1, 51, 1.0, id="kube-scheduler-qps-one-second-for-fifty"),
    ],
)
def test_rate_limiter_allows_burst_then_qps(qps: float, burst: int, calls: int, want_waited: float) -> None:
    fake = FakeTime()
    limiter = RateLimiter(qps, burst, clock=fake.clock, sleep=fake.sleep)
    waited = sum(limiter.acquire() for _ in range(calls))
    assert waited == pytest.approx(want_waited)
    assert fake.now - 100.0 == pytest.approx(want_waited)


def test_rate_limiter_refills_while_idle_but_never_above_burst() -> None:
    fake = FakeTime()
    limiter = RateLimiter(10.0, 3, clock=fake.clock, sleep=fake.sleep)
    for _ in range(3):
        limiter.acquire()
    fake.now += 60.0  # a long pause refills three tokens, not six hundred
    assert [limiter.acquire() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.1])


@pytest.mark.parametrize(("qps", "burst"), [(0.0, 1), (-1.0, 5), (10.0, 0)])
def test_rate_limiter_refuses_nonsense(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="qps"):
        RateLimiter(qps, burst)


class CountingLimiter(RateLimiter):
    def __init__(self) -> None:
        super().__init__(1000.0, 1000)
        self.taken = 0

    def acquire(self) -> float:
        self.taken += 1
        return super().acquire()


def test_the_client_takes_a_token_per_request_but_none_for_a_watch(double: ApiServerDouble) -> None:
    assert double.kubeconfig_path is not None
    api = KubeApi(load_api_client(str(double.kubeconfig_path)))
    assert api.limiter is not None, "bounded by default"
    limiter = api.limiter = CountingLimiter()
    try:
        listed = api.list(k8s.NAMESPACES)
        api.create(k8s.NAMESPACES, {"metadata": {"name": "counted"}})
        assert limiter.taken == 2
        events = api.watch(k8s.NAMESPACES, listed["metadata"]["resourceVersion"], 5)
        first = next(events)
        events.close()
        assert first["object"]["metadata"]["name"] == "counted"
        assert limiter.taken == 2, "a watch is one long request, not rate limited"
    finally:
        api.api_client.close()  # type: ignore[no-untyped-call]


# --- the webhook's TLS handshake -------------------------------------------------------------------


def test_a_silent_client_neither_stalls_the_webhook_nor_keeps_its_connection(tmp_path: Path) -> None:
    certs = issue(tmp_path / "tls")
    server = serve(0, str(certs.cert), str(certs.key), host="127.0.0.1", handshake_timeout=0.5)
    port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    silent = socket.create_connection(("127.0.0.1", port))
    try:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u1",
                "kind": {"kind": "Pod"},
                "operation": "CREATE",
                "object": {"metadata": {"name": "p", "labels": {"kueue.x-k8s.io/queue-name": "q"}}},
            },
        }
        request = urllib.request.Request(
            f"https://127.0.0.1:{port}/mutate",
            data=json.dumps(review).encode(),
            headers={"Content-Type": "application/json"},
        )
        context = ssl.create_default_context(cafile=str(certs.ca))
        with urllib.request.urlopen(request, context=context, timeout=5) as answer:
            response = json.loads(answer.read())["response"]
        assert (response["uid"], response["allowed"], response["patchType"]) == ("u1", True, "JSONPatch")

        silent.settimeout(5)
        assert silent.recv(1) == b"", "the server hung up on the client that never sent a handshake"
    finally:
        silent.close()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_the_placement_patch_is_refused_when_the_workload_changed_since_it_was_observed(scene: Scene) -> None:
    """The plan's placement annotation goes out with the observed resourceVersion as a precondition:
    a Workload another writer changed meanwhile (another replica admitting it, say) keeps what that
    writer recorded, and this admission is forgotten and tried again. (A Workload admitted by the
    pass that makes it is created with its placement: this one is made while no node can hold it.)"""
    scene.setup(nodes=1, gpus_per_node=1, quota_gpus=8)
    scene.submit(scene.job("j", gpus=2))
    other = scene.api

    class RacedWrites(KubeApi):
        raced = False

        def patch(self, res: Any, name: str, patch: Any, namespace: str | None = None, **kw: Any) -> Any:
            if res is k8s.WORKLOADS and PLACEMENT_ANNOTATION in str(patch) and not self.raced:
                self.raced = True  # another writer gets there first
                other.patch(k8s.WORKLOADS, name, {"metadata": {"annotations": {"other": "x"}}}, namespace)
            return super().patch(res, name, patch, namespace, **kw)

    api = RacedWrites(load_api_client(scene.kubeconfig))
    with started_controller(scene, api) as controller:
        wait_until(lambda: controller.cache.items("Job"), 10, "the job cached")
        controller.reconcile()  # creates the Workload: no node can hold it yet
        wait_until(lambda: controller.cache.items("Workload"), 10, "the Workload cached")
        assert not api.raced
        scene.add_nodes(1)
        wait_until(lambda: (controller.reconcile(), api.raced)[1], 10, "the placement patch raced")
        assert controller.counters.write_failures >= 1
        (wl,) = scene.list(k8s.WORKLOADS)
        annotations = wl["metadata"].get("annotations") or {}
        assert annotations.get("other") == "x"
        assert PLACEMENT_ANNOTATION not in annotations, "not written over a newer version"
        assert not (wl.get("status") or {}).get("admission")
        assert controller.cache.assumed == {}
        wait_until(lambda: controller.cache.get("Workload", object_key(wl)), 10, "seen again")
        wait_until(lambda: (controller.reconcile(), scene.admitted("j"))[1], 10, "admitted on a later pass")


def test_a_pass_that_fails_while_fitting_a_gang_sends_the_whole_gangs_and_forgets_the_part(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gangs fitted before the failure are sent whole; the gang that failed part way leaves no pod
    assumed as bound, and is bound whole on a later pass."""
    scene.setup(nodes=2)
    jc = scene.job_controller()
    assert isinstance(jc, JobController)
    jc.held = {"a", "b"}  # no pods until both gangs are admitted
    scene.submit(scene.job("a", pods=2, gpus=4), scene.job("b", pods=2, gpus=4))
    real = binding_module.binding_writes
    armed = {"calls": 0, "on": False}

    def flaky(*args: Any, **kwargs: Any) -> Iterator[Any]:
        armed["calls"] += armed["on"]
        for i, bind in enumerate(real(*args, **kwargs)):
            if armed["on"] and armed["calls"] == 2 and i == 1:
                raise RuntimeError("a bug while fitting the second pod of the second gang")
            yield bind

    monkeypatch.setattr(binding_module, "binding_writes", flaky)
    with started_controller(scene) as controller:
        wait_until(lambda: len(controller.cache.items("Job")) == 2, 10, "the jobs cached")
        wait_until(
            lambda: (controller.reconcile(), scene.admitted("a") and scene.admitted("b"))[1],
            10,
            "both admitted",
        )
        jc.held = set()
        wait_until(lambda: len(controller.cache.items("Pod")) == 4, 10, "the four pods cached")
        armed["on"] = True
        with pytest.raises(RuntimeError, match="second gang"):
            controller.reconcile()
        bound = [p for p in scene.pods() if p["spec"].get("nodeName")]
        sent = sorted(p["metadata"]["labels"]["job-name"] for p in bound)
        assert sent in (["a", "a"], ["b", "b"]), "the first gang was sent whole, the second not at all"
        assumed = {key for _, key in controller.cache.assumed}
        assert assumed <= {object_key(p) for p in bound}, "only pods really bound may still be assumed"
        armed["on"] = False
        wait_until(
            lambda: (controller.reconcile(), scene.bound("a", 2) and scene.bound("b", 2))[1], 10, "both whole"
        )


def test_a_pass_that_fails_after_the_session_reported_reasons_loses_none_of_them(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The session reports a pending reason once; a pass that fails before writing it must not lose
    it: the next pass starts from the cluster again and writes it."""
    scene.setup(nodes=1, quota_gpus=4)
    scene.submit(scene.job("big", gpus=8))  # more than the queue's quota: pending for ever
    failures = {"left": 1}

    def break_once(controller: Controller) -> None:
        real = controller.pending.record

        def broken(plan: Any) -> None:
            if failures["left"] and any("big" in p.workload for p in plan.pending):
                failures["left"] -= 1
                raise RuntimeError("the connection broke before the pending reasons were written")
            real(plan)

        monkeypatch.setattr(controller.pending, "record", broken)

    with started_controller(scene, prepare=break_once) as controller:
        wait_until(lambda: controller.cache.items("Job"), 10, "the job cached")

        def failed_once() -> bool:
            with contextlib.suppress(RuntimeError):
                controller.reconcile()
            return failures["left"] == 0

        wait_until(failed_once, 10, "a pass failed with the reason in hand")

        def reason_written() -> bool:
            controller.reconcile()
            wl = scene.workloads().get("big") or {}
            return any(
                c["type"] == "QuotaReserved" and c["status"] == "False"
                for c in (wl.get("status") or {}).get("conditions") or []
            )

        wait_until(reason_written, 10, "the pending reason written by a later pass")


def test_queue_status_is_derived_again_only_when_what_it_is_derived_from_changed(
    scene: Scene, monkeypatch: pytest.MonkeyPatch
) -> None:
    scene.setup(nodes=1)
    scene.submit(scene.job("j", gpus=1))
    real = reporting_module.queue_status_writes
    calls = {"n": 0}

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(reporting_module, "queue_status_writes", counted)
    with started_controller(scene) as controller:
        wait_until(lambda: (controller.reconcile(), scene.admitted("j"))[1], 10, "admitted")
        wait_until(
            lambda: (
                (controller.reconcile(), (scene.list(k8s.CLUSTER_QUEUES)[0].get("status") or {}))[1].get(
                    "admittedWorkloads"
                )
                == 1
            ),
            10,
            "the queue's status written",
        )

        def quiet() -> bool:  # once the watch has delivered the last writes: two passes, no work
            seen = calls["n"]
            controller.reconcile()
            controller.reconcile()
            return calls["n"] == seen

        wait_until(quiet, 10, "nothing changed: nothing derived again")
        before = calls["n"]
        scene.submit(scene.job("k", gpus=1))
        wait_until(lambda: (controller.reconcile(), calls["n"] > before)[1], 10, "a new job: derived again")
