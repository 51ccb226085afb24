"""A kubelet for tests: moves bound pods through their lives on an API server that has no kubelets.

The real control plane in the tests (and the API-server double) has Nodes but no kubelets, so a pod
bound to a node would stay Pending for ever and a Job would never finish. :class:`FakeKubelet`
stands in for every kubelet at once, the way a kubelet reports to the API server:

- a pod bound to a node (``spec.nodeName`` set) and still ``Pending`` becomes ``Running``
  (``startTime``, a running container status, ``Ready``);
- after its run time it becomes ``Succeeded`` (exit code 0) or ``Failed`` (the exit code it was
  given), with a terminated container status, written through the ``status`` subresource; the real
  Job controller then counts it and marks its Job ``Complete`` or ``Failed``;
- a pod being deleted (``deletionTimestamp`` set: an eviction, a suspended Job) is removed at grace
  period 0 once its grace period has passed, as a kubelet does when its containers have stopped.

A pod's run time and exit code come from its annotations, set by a test on the job's pod template
(:func:`run_annotations`): :data:`RUN_SECONDS` (virtual seconds; a pod without it runs until it is
deleted), :data:`EXIT_CODE` and :data:`CHECKPOINT_SECONDS`. With a checkpoint period, the work a
killed pod had saved (whole periods) is kept for the next pod of the same job and completion index:
a job preempted after three periods and admitted again runs only what is left, as a training job
restarted from its last checkpoint would.

Time runs ``speedup`` times faster than the wall clock: a pod annotated with 600 s runs 6 s of wall
time at ``speedup=100``. The kubelet polls (every ``interval`` seconds): one list of the pods it
watches, then the status writes that are due. What it did is recorded in :attr:`started`,
:attr:`ended` and :attr:`kept` for the test to check.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from urllib3.exceptions import HTTPError

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi

RUN_SECONDS = "e2e.gpuplane.dev/run-seconds"  # the pod's work (virtual seconds; by index: "1,1,600")
STARTUP_SECONDS = "e2e.gpuplane.dev/startup-seconds"  # idle time before the work starts, each run
EXIT_CODE = "e2e.gpuplane.dev/exit-code"  # how it ends (0: Succeeded, otherwise Failed)
CHECKPOINT_SECONDS = "e2e.gpuplane.dev/checkpoint-seconds"  # work saved every so many seconds
STATELESS = "e2e.gpuplane.dev/stateless"  # "true": all work done is kept when the pod is killed

ENDED = ("Succeeded", "Failed")


def run_annotations(
    seconds: float,
    exit_code: int = 0,
    checkpoint: float | None = None,
    *,
    startup: float = 0.0,
    stateless: bool = False,
) -> dict[str, str]:
    """The pod-template annotations that tell :class:`FakeKubelet` how a pod runs."""
    out = {RUN_SECONDS: repr(float(seconds)), EXIT_CODE: str(exit_code)}
    if checkpoint:
        out[CHECKPOINT_SECONDS] = repr(float(checkpoint))
    if startup:
        out[STARTUP_SECONDS] = repr(float(startup))
    if stateless:
        out[STATELESS] = "true"
    return out


def _stamp(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _work_key(pod: dict[str, Any]) -> tuple[str, str, str]:
    """What a restarted pod continues: its job (or itself) and completion index."""
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    owner = labels.get("batch.kubernetes.io/job-name") or labels.get("job-name") or meta["name"]
    index = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index", "")
    return meta.get("namespace", ""), str(owner), str(index)


@dataclass
class Run:
    """One pod's run, as the kubelet saw it (times on the wall clock, work in virtual seconds)."""

    pod: str  # "ns/name"
    work_key: tuple[str, str, str]  # what a restarted pod continues (:func:`_work_key`)
    started: float
    progress: float  # work already done (kept from earlier runs) when it started
    work: float  # the whole work
    startup: float
    exit_code: int = 0
    checkpoint: float | None = None
    stateless: bool = False
    ended: float | None = None
    phase: str = "Running"  # then Succeeded, Failed, or Killed (deleted before its work was done)

    def need(self) -> float:
        """Virtual seconds from its start to its end: the startup, then the work left."""
        return self.startup + max(0.0, self.work - self.progress)

    def computed(self, until: float, speedup: float) -> float:
        """Virtual seconds of work it did by wall time ``until`` (its startup does no work)."""
        return min(max(0.0, (until - self.started) * speedup - self.startup), self.work - self.progress)


def _work(annotations: dict[str, str]) -> float:
    """The pod's work: :data:`RUN_SECONDS`, or for an Indexed Job's pod a comma-separated list of
    them by completion index."""
    values = annotations.get(RUN_SECONDS, "inf").split(",")
    index = int(annotations.get("batch.kubernetes.io/job-completion-index", "0"))
    return float(values[min(index, len(values) - 1)])


def _run_of(pod: dict[str, Any], now: float, kept: float) -> Run:
    annotations = pod["metadata"].get("annotations") or {}
    return Run(
        pod=f"{pod['metadata']['namespace']}/{pod['metadata']['name']}",
        work_key=_work_key(pod),
        started=now,
        progress=kept,
        work=_work(annotations),
        startup=float(annotations.get(STARTUP_SECONDS, "0")),
        exit_code=int(annotations.get(EXIT_CODE, "0")),
        checkpoint=float(annotations[CHECKPOINT_SECONDS]) if CHECKPOINT_SECONDS in annotations else None,
        stateless=annotations.get(STATELESS) == "true",
    )


class FakeKubelet:
    """Every kubelet of the cluster, for pods in ``namespaces`` (all of them when None)."""

    def __init__(
        self,
        api: KubeApi,
        namespaces: Iterable[str] | None = None,
        *,
        speedup: float = 1.0,
        interval: float = 0.05,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api = api
        self.namespaces = None if namespaces is None else tuple(namespaces)
        self.speedup = speedup
        self.interval = interval
        self.clock = clock
        self.running: dict[str, Run] = {}  # pod uid -> its run
        self.runs: list[Run] = []  # every run, in the order they started
        self.started: dict[str, float] = {}  # "ns/name" -> wall time it started running
        self.ended: dict[str, tuple[str, float]] = {}  # "ns/name" -> (phase, wall time)
        self.kept: dict[tuple[str, str, str], float] = {}  # work saved by killed pods (virtual s)
        self.errors = 0
        self.lock = threading.Lock()  # held while a look changes what it recorded
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-kubelet", daemon=True)

    def start(self) -> FakeKubelet:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except (ApiError, OSError, ValueError, HTTPError):
                self.errors += 1  # the next look retries, as a kubelet's next sync would
            self._stop.wait(self.interval)

    def _pods(self) -> list[dict[str, Any]]:
        if self.namespaces is None:
            return list(self.api.list(k8s.PODS).get("items", []))
        out: list[dict[str, Any]] = []
        for ns in self.namespaces:
            out += self.api.list(k8s.PODS, ns).get("items", [])
        return out

    def sync(self) -> None:
        """One look at every pod: start the bound ones, end the ones whose time is up, remove the
        ones being deleted."""
        pods = self._pods()
        now = self.clock()
        with self.lock:
            seen = {pod["metadata"]["uid"] for pod in pods}
            for uid in [uid for uid in self.running if uid not in seen]:
                self._killed(uid, now)  # deleted at once (grace period 0): its containers stop now
        for pod in pods:
            meta, status = pod["metadata"], pod.get("status") or {}
            if not (pod.get("spec") or {}).get("nodeName"):
                continue
            if meta.get("deletionTimestamp"):
                self._terminate(pod, now)
            elif status.get("phase", "Pending") == "Pending":
                self._run(pod, now)
            elif status.get("phase") == "Running":
                self._maybe_end(pod, now)

    # --- one pod's life --------------------------------------------------------------------------

    def _write_status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        body = {"status": status, "metadata": {"resourceVersion": meta["resourceVersion"]}}
        self.api.patch(k8s.PODS, meta["name"], body, meta["namespace"], sub="status")

    @staticmethod
    def _containers(pod: dict[str, Any], state: dict[str, Any], running: bool) -> list[dict[str, Any]]:
        return [
            {
                "name": c["name"],
                "ready": running,
                "started": running,
                "restartCount": 0,
                "image": "fake",
                "imageID": "fake",
                "state": state,
            }
            for c in pod["spec"].get("containers", [])
        ]

    def _run(self, pod: dict[str, Any], now: float) -> None:
        run = _run_of(pod, now, self.kept.get(_work_key(pod), 0.0))
        stamp = _stamp(now)
        status = {
            "phase": "Running",
            "startTime": stamp,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": stamp}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": self._containers(pod, {"running": {"startedAt": stamp}}, True),
        }
        self._write_status(pod, status)
        with self.lock:
            self.running[pod["metadata"]["uid"]] = run
            self.runs.append(run)
            self.started[run.pod] = now

    def _maybe_end(self, pod: dict[str, Any], now: float) -> None:
        run = self.running.get(pod["metadata"]["uid"])
        if run is None:  # running before this kubelet started: time it from now
            run = _run_of(pod, now, self.kept.get(_work_key(pod), 0.0))
            with self.lock:
                self.running[pod["metadata"]["uid"]] = run
                self.runs.append(run)
            return
        if (now - run.started) * self.speedup < run.need():
            return
        phase = "Succeeded" if run.exit_code == 0 else "Failed"
        stamp = _stamp(now)
        terminated = {
            "exitCode": run.exit_code,
            "reason": "Completed" if run.exit_code == 0 else "Error",
            "finishedAt": stamp,
        }
        status = {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "False", "lastTransitionTime": stamp, "reason": "PodCompleted"}
                for t in ("ContainersReady", "Ready")
            ],
            "containerStatuses": self._containers(pod, {"terminated": terminated}, False),
        }
        self._write_status(pod, status)
        with self.lock:
            self.running.pop(pod["metadata"]["uid"], None)
            self.kept.pop(run.work_key, None)
            run.ended, run.phase = now, phase
            self.ended[run.pod] = (phase, now)

    def _terminate(self, pod: dict[str, Any], now: float) -> None:
        """A pod being deleted: its containers stop once its grace period is over (what it had
        saved is kept for the next pod of its job), and it is removed."""
        meta = pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds") or 0
        deleted = datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if now < deleted.timestamp() - grace + grace / self.speedup:
            return  # still within its grace period
        with self.lock:
            self._killed(meta["uid"], now)
        with contextlib.suppress(ApiError):  # 404: gone already
            self.api.delete(
                k8s.PODS,
                meta["name"],
                meta["namespace"],
                gracePeriodSeconds=0,
                preconditions={"uid": meta["uid"]},
            )

    def _killed(self, uid: str, now: float) -> None:
        """The pod ``uid`` stopped before its work was done: the work it saved (whole checkpoints,
        or all of it when stateless) is kept for the next pod of its job. Called with the lock."""
        run = self.running.pop(uid, None)
        if run is None:
            return
        run.ended, run.phase = now, "Killed"
        self.ended[run.pod] = ("Killed", now)
        done = run.computed(now, self.speedup)
        if run.stateless:
            saved = done
        elif run.checkpoint:
            saved = (done // run.checkpoint) * run.checkpoint
        else:
            saved = 0.0
        # The pods of one gang share the key and started from the same progress: the most saved.
        self.kept[run.work_key] = max(self.kept.get(run.work_key, 0.0), run.progress + saved)
