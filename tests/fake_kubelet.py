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

RUN_SECONDS = "e2e.gpuplane.dev/run-seconds"  # how long the pod's work takes (virtual seconds)
EXIT_CODE = "e2e.gpuplane.dev/exit-code"  # how it ends (0: Succeeded, otherwise Failed)
CHECKPOINT_SECONDS = "e2e.gpuplane.dev/checkpoint-seconds"  # work saved every so many seconds

ENDED = ("Succeeded", "Failed")


def run_annotations(seconds: float, exit_code: int = 0, checkpoint: float | None = None) -> dict[str, str]:
    """The pod-template annotations that tell :class:`FakeKubelet` how a pod runs."""
    out = {RUN_SECONDS: str(seconds), EXIT_CODE: str(exit_code)}
    if checkpoint:
        out[CHECKPOINT_SECONDS] = str(checkpoint)
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
class _Running:
    started: float  # wall clock
    need: float  # virtual seconds of work left when it started
    exit_code: int
    checkpoint: float | None
    work: tuple[str, str, str]  # what a restarted pod continues (:func:`_work_key`)


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
        self.running: dict[str, _Running] = {}  # pod uid -> its run
        self.started: dict[str, float] = {}  # "ns/name" -> wall time it started running
        self.ended: dict[str, tuple[str, float]] = {}  # "ns/name" -> (phase, wall time)
        self.kept: dict[tuple[str, str, str], float] = {}  # work saved by killed pods (virtual s)
        self.errors = 0
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
        now = self.clock()
        pods = self._pods()
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

    def _run(self, pod: dict[str, Any], now: float) -> None:
        annotations = pod["metadata"].get("annotations") or {}
        need = float(annotations.get(RUN_SECONDS, "inf"))
        checkpoint = float(annotations[CHECKPOINT_SECONDS]) if CHECKPOINT_SECONDS in annotations else None
        need = max(0.0, need - self.kept.get(_work_key(pod), 0.0))
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        stamp = _stamp(now)
        status = {
            "phase": "Running",
            "startTime": stamp,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": stamp}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "fake",
                    "imageID": "fake",
                    "state": {"running": {"startedAt": stamp}},
                }
                for name in containers
            ],
        }
        self._write_status(pod, status)
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        self.running[pod["metadata"]["uid"]] = _Running(
            now, need, int(annotations.get(EXIT_CODE, "0")), checkpoint, _work_key(pod)
        )
        self.started[key] = now

    def _maybe_end(self, pod: dict[str, Any], now: float) -> None:
        run = self.running.get(pod["metadata"]["uid"])
        if run is None:  # running before this kubelet started: time it from now
            self._adopt(pod, now)
            return
        if (now - run.started) * self.speedup < run.need:
            return
        phase = "Succeeded" if run.exit_code == 0 else "Failed"
        stamp = _stamp(now)
        containers = [c["name"] for c in pod["spec"].get("containers", [])]
        status = {
            "phase": phase,
            "conditions": [
                {"type": t, "status": "False", "lastTransitionTime": stamp, "reason": "PodCompleted"}
                for t in ("ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": name,
                    "ready": False,
                    "started": False,
                    "restartCount": 0,
                    "image": "fake",
                    "imageID": "fake",
                    "state": {
                        "terminated": {
                            "exitCode": run.exit_code,
                            "reason": "Completed" if run.exit_code == 0 else "Error",
                            "finishedAt": stamp,
                        }
                    },
                }
                for name in containers
            ],
        }
        self._write_status(pod, status)
        self.running.pop(pod["metadata"]["uid"], None)
        self.kept.pop(_work_key(pod), None)
        self.ended[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = (phase, now)

    def _adopt(self, pod: dict[str, Any], now: float) -> None:
        annotations = pod["metadata"].get("annotations") or {}
        self.running[pod["metadata"]["uid"]] = _Running(
            now,
            float(annotations.get(RUN_SECONDS, "inf")),
            int(annotations.get(EXIT_CODE, "0")),
            None,
            _work_key(pod),
        )

    def _terminate(self, pod: dict[str, Any], now: float) -> None:
        """A pod being deleted: its containers stop (what it had checkpointed is kept for the next
        pod of its job), and once its grace period is over it is removed."""
        meta = pod["metadata"]
        grace = meta.get("deletionGracePeriodSeconds") or 0
        deleted = datetime.strptime(meta["deletionTimestamp"], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        if now < deleted.timestamp() - grace + grace / self.speedup:
            return  # still within its grace period
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
        """The pod ``uid`` stopped before its work was done: whole checkpoints it saved are kept for
        the next pod of its job."""
        run = self.running.pop(uid, None)
        if run is None or not run.checkpoint:
            return
        done = min((now - run.started) * self.speedup, run.need)
        self.kept[run.work] = self.kept.get(run.work, 0.0) + (done // run.checkpoint) * run.checkpoint
