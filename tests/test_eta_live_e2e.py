"""On a live cluster, the ETA of work waiting behind a job whose name has a history beats the class's.

Jobs of three names run through the real controller, the Job controller and the fake kubelet, in
one ClusterQueue: ``train`` (about 12 s), ``eval`` (about 3 s) and ``sweep`` (about 1.5 s), as
many runs of each, one GPU each, eight side by side. The controller learns their runtimes as they
finish. Then, in each trial, a ``train`` run takes the whole node and a ``probe`` queues behind it;
a second into the holder's run, the ETA of the probe is computed from the cluster's objects as
``gpuplane why`` computes it, twice: with the history the controller learned (the holder's
runtime from the runs of its name), and with the same runs stripped of their names and shapes
(the class fallback: every run of the queue). Each is measured against the probe's real start.

Sizes (environment): ``ETA_LIVE_RUNS`` runs of each name (12 here; ``bench/run.py eta-live``
runs 50), ``ETA_LIVE_TRIALS`` trials (3; the benchmark: 10). The test prints one line the
benchmark reads. Runs unchanged on a real API server with ``GPUPLANE_E2E_KUBECONFIG``.
"""

from __future__ import annotations

import math
import os
import random
import statistics
import time
from typing import Any

import pytest

from controller_harness import Scene, wait_until
from fake_kubelet import run_annotations
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample
from gpuplane.insight.why import explain_all
from gpuplane.model.loader import state_from_objects
from manifests import Manifest

RUNS = int(os.environ.get("ETA_LIVE_RUNS", "12"))
TRIALS = int(os.environ.get("ETA_LIVE_TRIALS", "3"))
MEDIANS = {"train": 12.0, "eval": 3.0, "sweep": 1.5}  # seconds, per job name
SPREAD = 0.15  # log spread of the runs of one name
INTO_RUN = 1.0  # seconds into the holder's run when the ETA is taken

pytestmark = pytest.mark.timeout(120 + RUNS * 6 + TRIALS * 40)


def _job(scene: Scene, name: str, seconds: float, gpus: int) -> Manifest:
    built = scene.job(name, gpus=gpus, annotations=run_annotations(seconds))
    built.set("spec.backoffLimit", 0)
    return built


def _condition(wl: dict[str, Any] | None, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in (wl or {}).get("status", {}).get("conditions") or []
    )


def _class_only(samples: tuple[RuntimeSample, ...]) -> tuple[RuntimeSample, ...]:
    """The runs without the names and shapes that tell them apart: what the queue alone knows."""
    return tuple(
        RuntimeSample(
            JobFeatures(s.features.namespace, "", s.features.queue, "", ""), s.seconds, s.finished_at
        )
        for s in samples
    )


def _eta(scene: Scene, probe: str, history: tuple[RuntimeSample, ...], now: float) -> float:
    # Only ``history`` teaches runtimes: the finished Workloads still in the cluster are left out.
    objects = [o for o in scene.state() if not (o["kind"] == "Workload" and _condition(o, "Finished"))]
    state = state_from_objects(objects)
    config = config_from_kueue(state.configuration)
    plan = schedule(state, config, now, cycles=None)
    found = {e.workload: e for e in explain_all(state, plan, now, config, diagnose=False, history=history)}
    wl = _workload_of(scene, probe)
    assert wl is not None
    eta = found[f"{scene.namespace}/{wl['metadata']['name']}"].eta
    assert eta.seconds is not None, eta.basis
    bases = [(b.workload.rsplit("/", 1)[-1], b.basis, b.samples) for b in eta.runtimes]
    print(f"\n{probe}: eta {eta.seconds}s ({eta.low}-{eta.high}), runtimes from {bases}")
    return eta.seconds


def _workload_of(scene: Scene, job: str) -> dict[str, Any] | None:
    return next((wl for name, wl in scene.workloads().items() if job in name), None)


def test_after_runs_of_a_name_the_eta_beats_the_class_fallback(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.kubelet()
    running = scene.controller(leader_election=False)
    rng = random.Random(7)

    def drawn(name: str) -> float:
        return rng.lognormvariate(math.log(MEDIANS[name]), SPREAD)

    learning = [f"{name}-{i}" for i in range(RUNS) for name in MEDIANS]
    scene.submit(*(_job(scene, run, drawn(run.rsplit("-", 1)[0]), gpus=1) for run in learning))
    wait_until(
        lambda: len(running.controller.runtime_history.samples()) >= len(learning),
        60 + RUNS * 6,
        f"{len(learning)} runs learned",
    )

    by_name, by_class = [], []
    for trial in range(TRIALS):
        holder, probe = f"train-{RUNS + trial}", f"probe-{trial}"  # a rerun of train, by its number
        scene.submit(_job(scene, holder, drawn("train"), gpus=8))
        wait_until(lambda holder=holder: scene.bound(holder, 1), 30, f"{holder} bound")
        scene.submit(_job(scene, probe, 0.5, gpus=8))
        wait_until(lambda probe=probe: _workload_of(scene, probe) is not None, 10, f"{probe}'s Workload")
        time.sleep(INTO_RUN)
        now = time.time()
        learned = running.controller.runtime_history.samples()
        named = _eta(scene, probe, learned, now)
        fallback = _eta(scene, probe, _class_only(learned), now)
        wait_until(
            lambda probe=probe: _condition(_workload_of(scene, probe), "QuotaReserved"),
            60,
            f"{probe} admitted",
        )
        started = time.time() - now
        print(f"{probe}: started after {started:.1f}s")
        by_name.append(abs(named - started) / started)
        by_class.append(abs(fallback - started) / started)
        wait_until(
            lambda probe=probe: _condition(_workload_of(scene, probe), "Finished"), 30, f"{probe} done"
        )

    name_error, class_error = statistics.median(by_name), statistics.median(by_class)
    print(
        f"\neta-live: runs per name {RUNS}, trials {TRIALS}, relative error p50 name history "
        f"{name_error:.3f}, class fallback {class_error:.3f}, by trial name {[round(e, 3) for e in by_name]} "
        f"class {[round(e, 3) for e in by_class]}"
    )
    assert name_error < class_error, (by_name, by_class)
