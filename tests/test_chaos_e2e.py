"""Crash safety end to end: jobs run to completion while controller replicas are killed and restarted,
the leader is killed under a standby, and (on a real control plane) the API server is restarted.

Jobs of every kind gpuplane places (gangs of whole GPUs, single pods, shares of a GPU) are submitted
in batches with plain kubectl, run through the fake kubelet and finish. Two replicas with leader
election run at any time; the test kills one at a random point (at its Nth API call, before the
request is sent or after the answer came back unread, or after a few passes) and starts another.
Twice during the run the API server restarts: the real kube-apiserver on the project's control plane
(``scripts/kube-restart.sh``); on the double, every watch is cut and the history compacted, which is
what its clients see of a restart.

The invariants are read from the API server's own objects, at every kill and at the end:

- no device is held by two live pods (whole GPUs, MIG instances, shares adding up to one GPU);
- no ClusterQueue's admitted usage exceeds its quota;
- every job has exactly one Workload, and none is lost: every job completes;
- every admitted gang is whole or not at all: once the run has settled, each admitted Workload has
  exactly its admitted count of pods, all bound where its placement planned.

The leader's fail-over time (kill to the standby's first pass as leader) is measured each time.
``CHAOS_JOBS`` and ``CHAOS_KILLS`` set the size (CI runs a small one; ``bench`` runs the full one).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from apiserver.fixtures import Cluster
from apiserver.server import ApiServerDouble
from controller_harness import (
    RunningController,
    Scene,
    device_clashes,
    quota_violations,
    wait_until,
)
from fake_kubelet import run_annotations
from gpuplane.k8s import api as k8s
from manifests import Manifest

ROOT = Path(__file__).resolve().parent.parent
JOBS = int(os.environ.get("CHAOS_JOBS", "24"))
KILLS = int(os.environ.get("CHAOS_KILLS", "12"))
SEED = 20261205
LEASE = 2.0  # seconds: a killed leader's lease expires this long after its last renewal
FRACTION = "gpuplane.dev/gpu-fraction"

pytestmark = pytest.mark.timeout(120 + 12 * JOBS + 20 * KILLS)


def chaos_jobs(scene: Scene, rng: np.random.Generator, priorities: list[str]) -> list[Manifest]:
    """Gangs of whole GPUs, single pods and GPU shares, each running a few seconds."""
    jobs = []
    for i in range(JOBS):
        kind = ("gang", "single", "share")[i % 3]
        seconds = float(rng.uniform(1.0, 4.0))
        priority = priorities[int(rng.integers(len(priorities)))]
        if kind == "gang":
            job = scene.job(
                f"g{i:03d}",
                pods=int(rng.integers(2, 4)),
                gpus=int(rng.choice([1, 2, 4])),
                priority_class=priority,
                annotations=run_annotations(seconds),
            )
        elif kind == "single":
            job = scene.job(
                f"s{i:03d}",
                gpus=int(rng.choice([1, 2])),
                priority_class=priority,
                annotations=run_annotations(seconds),
            )
        else:
            job = scene.job(
                f"f{i:03d}",
                gpus=0,
                priority_class=priority,
                annotations={FRACTION: "0.5", **run_annotations(seconds)},
            )
        jobs.append(job)
    return jobs


def live(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        p
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]


def check_invariants(scene: Scene) -> list[str]:
    """What is wrong now, read from the API server's objects (empty: nothing)."""
    pods = scene.pods()
    problems = [f"device: {c}" for c in device_clashes(pods)]
    # Bound by gpuplane, which records the devices it gave: a pod bound without that record was bound
    # by someone else (kube-scheduler), and the device checks above would check nothing of it.
    problems += [
        f"pod {p['metadata']['name']} bound without gpuplane's device record"
        for p in pods
        if (p.get("spec") or {}).get("nodeName")
        and not (p["metadata"].get("annotations") or {}).get("gpuplane.dev/devices")
    ]
    workloads = scene.list(k8s.WORKLOADS)
    queues = [q for q in scene.list(k8s.CLUSTER_QUEUES) if q["metadata"]["name"].startswith(scene.prefix)]
    problems += [f"quota: {q}" for q in quota_violations(workloads, queues)]
    jobs = scene.jobs()
    owners = Counter(ref["uid"] for wl in workloads for ref in wl["metadata"].get("ownerReferences") or [])
    problems += [
        f"job {name} has {owners[j['metadata']['uid']]} Workloads"
        for name, j in jobs.items()
        if owners[j["metadata"]["uid"]] > 1
    ]
    return problems


def complete(job: dict[str, Any]) -> bool:
    return any(
        c.get("type") == "Complete" and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or []
    )


def gangs_whole(scene: Scene) -> list[str]:
    """Admitted Workloads of jobs still running whose live pods are not all there and bound."""
    problems = []
    pods = live(scene.pods())
    jobs = scene.jobs()
    for name, wl in scene.workloads().items():
        admission = (wl.get("status") or {}).get("admission")
        if not admission or complete(jobs.get(name, {})):
            continue
        want = sum(a["count"] for a in admission["podSetAssignments"])
        mine = [p for p in pods if p["metadata"]["labels"].get("job-name") == name]
        bound = [p for p in mine if p["spec"].get("nodeName")]
        if bound and len(bound) != want:
            problems.append(f"{name}: {len(bound)} of {want} pods bound")
    return problems


class ApiServerRestarts:
    """Restarts of the API server as each backend allows: the real kube-apiserver of a control plane
    started by scripts/kube-up.sh, or, on the double, every watch cut and the history compacted."""

    def __init__(self, scene: Scene, apiserver: Cluster) -> None:
        self.scene = scene
        self.double = apiserver if isinstance(apiserver, ApiServerDouble) else None
        directory = Path(scene.kubeconfig).parent
        self.directory = directory if (directory / "commands" / "kube-apiserver").exists() else None
        self.done = 0

    @property
    def possible(self) -> bool:
        return self.double is not None or self.directory is not None

    def restart(self) -> None:
        if self.double is not None:
            self.double.faults.cut_watches(after=0, abrupt=True, times=50)
            self.double.store.compact()
        elif self.directory is not None:
            subprocess.run(
                ["bash", str(ROOT / "scripts" / "kube-restart.sh"), str(self.directory), "kube-apiserver"],
                check=True,
                capture_output=True,
                timeout=180,
            )
        self.done += 1


class Replicas:
    """The controller replicas of one run: started two at a time, killed one at a time."""

    def __init__(self, scene: Scene) -> None:
        self.scene = scene
        self.runs: list[RunningController] = []
        self.kills = Counter[str]()
        self.failovers: list[float] = []  # seconds from a leader's kill to its successor's lead

    def start(self, **options: Any) -> RunningController:
        run = self.scene.controller(
            identity=f"replica-{len(self.runs) + 1}", dry_run=False, lease_duration=LEASE, **options
        )
        self.runs.append(run)
        return run

    def leader(self) -> RunningController | None:
        for run in self.runs:
            if not run.api.killed.is_set() and run.controller.elector.is_leader:
                return run
        return None

    def kill_leader(self) -> bool:
        """Kill the leader (False: none leads now), start a standby, and time the fail-over."""
        victim = self.leader()
        if victim is None:
            return False
        wait_until(lambda: victim.passes >= 1, 30, "the leader's first pass")
        killed = time.monotonic()
        victim.kill()
        self.kills["the leader"] += 1
        self.start()

        def successor() -> bool:
            now = self.leader()
            return now is not None and now is not victim

        wait_until(successor, 10 * LEASE + 30, "a new leader")
        self.failovers.append(time.monotonic() - killed)
        return True

    def kill_at_a_call(self, rng: np.random.Generator) -> None:
        """Start a third replica that dies at its Nth API call (before the request is sent, or after
        the answer came back unread), or after three passes: two replicas run again after it."""
        run = self.start(kill_after=int(rng.integers(5, 120)), after_send=bool(rng.random() < 0.5))
        wait_until(lambda: run.api.killed.is_set() or run.passes >= 3, 60, "the replica's fatal call")
        run.kill()
        self.kills["a replica at a call"] += 1


def test_jobs_finish_and_nothing_is_given_twice_while_replicas_and_the_api_server_die(
    scene: Scene, apiserver: Cluster
) -> None:
    rng = np.random.default_rng(SEED)
    scene.setup(
        nodes=3, quota_gpus=16, preemption={"withinClusterQueue": "LowerPriority"}, quota={FRACTION: 8}
    )
    priorities = [scene.priority_class(n, v) for n, v in (("low", 10), ("mid", 100), ("high", 1000))]
    scene.job_controller()
    scene.kubelet()
    restarts = ApiServerRestarts(scene, apiserver)
    jobs = chaos_jobs(scene, rng, priorities)
    rounds = max(1, KILLS // 2)
    batches = [jobs[i::rounds] for i in range(rounds)]
    restart_at = {KILLS // 3, (2 * KILLS) // 3}
    replicas = Replicas(scene)
    replicas.start()
    replicas.start()
    problems: list[str] = []
    for k in range(KILLS):
        if batches:
            scene.submit(*batches.pop(0))
        if k in restart_at and restarts.possible:
            restarts.restart()
        if k % 2 == 1 or not replicas.kill_leader():
            replicas.kill_at_a_call(rng)
        problems += check_invariants(scene)
        # Whole or not at all: a gang caught part-bound by a kill is made whole by the next leader.
        wait_until(lambda: not gangs_whole(scene), 30 + 5 * LEASE, "every admitted gang whole")
    for batch in batches:
        scene.submit(*batch)

    def finished() -> bool:
        jobs_now = scene.jobs()
        return len(jobs_now) == JOBS and all(complete(j) for j in jobs_now.values())

    deadline = time.monotonic() + 120 + 5 * JOBS
    while not finished():
        problems += check_invariants(scene)
        assert not problems, problems
        assert time.monotonic() < deadline, "every job completes (none is lost)"
        time.sleep(1.0)
    problems += check_invariants(scene)
    assert problems == [], problems
    assert sum(replicas.kills.values()) == KILLS
    assert restarts.done == (2 if restarts.possible else 0)
    assert replicas.failovers, "the leader was killed at least once"
    assert max(replicas.failovers) <= 5 * LEASE + 30, replicas.failovers
    print(
        f"chaos: {JOBS} jobs, kills {dict(replicas.kills)}, API server restarts {restarts.done}, "
        f"fail-over s {[round(f, 1) for f in replicas.failovers]}"
    )
