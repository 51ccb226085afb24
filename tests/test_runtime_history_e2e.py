"""The runtime history on a live cluster: learned from jobs that finish, kept across a restart.

Four runs of the job ``train`` (``train-1`` .. ``train-4``: one name once its run number is taken
off) finish through the fake kubelet; the controller learns their runtimes and, when it stops,
writes them to its ConfigMap. Their Jobs and Workloads are then deleted, so a new controller can
only know them from that ConfigMap. It admits ``train-5`` and keeps ``train-6`` pending behind it;
the ETA written on ``train-6`` (``gpuplane.dev/eta-detail``) comes from the history of the name
``train``, a few seconds, not from the hour assumed without history. Run unchanged on a real API
server with ``GPUPLANE_E2E_KUBECONFIG``.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from controller_harness import Scene, wait_until
from fake_kubelet import run_annotations
from gpuplane.cli.insight import InsightOptions, attach
from gpuplane.k8s import api as k8s
from gpuplane.k8s.eta_writer import DETAIL_ANNOTATION
from gpuplane.k8s.runtime_store import CONFIG_MAP_NAME, DATA_KEY, decode
from manifests import Manifest

pytestmark = pytest.mark.timeout(180)

RUN = 8.0  # seconds each learned run takes
_DETAIL = re.compile(r"^in (\d+)s \((\d+)s-(\d+)s\); (.*)$")


def _job(scene: Scene, name: str, seconds: float, gpus: int) -> Manifest:
    built = scene.job(name, gpus=gpus, annotations=run_annotations(seconds))
    built.set("spec.backoffLimit", 0)
    return built


def _finished(wl: dict[str, Any] | None) -> bool:
    return any(
        c["type"] == "Finished" and c["status"] == "True"
        for c in (wl or {}).get("status", {}).get("conditions") or []
    )


def _detail(scene: Scene, name: str) -> str | None:
    wl = scene.workloads().get(name) or {}
    return (wl.get("metadata", {}).get("annotations") or {}).get(DETAIL_ANNOTATION)


def test_an_eta_uses_the_learned_history_of_its_job_name_after_a_restart(scene: Scene) -> None:
    scene.setup(nodes=1, gpus_per_node=8)
    scene.job_controller()
    scene.kubelet()
    first = scene.controller(leader_election=False)
    runs = [f"train-{i}" for i in range(1, 5)]
    scene.submit(*(_job(scene, name, RUN, gpus=2) for name in runs))  # side by side, 2 GPUs each
    wait_until(lambda: all(_finished(scene.workloads().get(n)) for n in runs), 60, "the four runs finished")
    wait_until(lambda: len(first.controller.runtime_history.samples()) == len(runs), 10, "four runs learned")
    learned = first.controller.runtime_history.samples()
    assert {s.features.name for s in learned} == {"train"}
    assert all(RUN - 1 <= s.seconds <= RUN + 10 for s in learned), [s.seconds for s in learned]
    first.stop()  # a clean stop writes what it learned

    stored = scene.api.get(k8s.CONFIG_MAPS, CONFIG_MAP_NAME, scene.namespace)
    kept = decode(stored["data"][DATA_KEY])
    assert sorted(s.seconds for s in kept.values()) == sorted(s.seconds for s in learned)
    for name in runs:  # what finished is gone: the new controller learns only from the ConfigMap
        scene.delete_job(name)

    second = scene.controller(leader_election=False)
    attached = attach(second.controller, InsightOptions(write_eta=True))
    try:
        scene.submit(_job(scene, "train-5", 600, gpus=8))
        wait_until(lambda: scene.bound("train-5", 1), 30, "train-5 admitted and bound")
        scene.submit(_job(scene, "train-6", 1, gpus=8))
        detail = wait_until(lambda: _detail(scene, "train-6"), 30, "an ETA on the pending train-6")
        assert len(second.controller.runtime_history.samples()) == len(runs), "read back from the ConfigMap"
    finally:
        attached.close()
    match = _DETAIL.match(detail)
    assert match is not None, detail
    seconds, basis = int(match.group(1)), match.group(4)
    assert "the history of its job name" in basis, detail
    # train-5 is expected to run as long as the learned runs of train, not the hour assumed without history.
    assert seconds <= 60, detail
