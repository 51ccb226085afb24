"""`gpuplane doctor`: each check finds what it should, names the objects, and stays quiet otherwise."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuplane.insight.doctor import diagnose
from gpuplane.model.loader import load_state
from manifests import Manifest, documents, namespace, node, resource_flavor

GPU_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}


def gpu_node(name: str, gpus: int = 8, **labels: str) -> Manifest:
    built = node(name).allocatable(cpu="64", memory="512Gi", gpu=gpus)
    for key, value in {**GPU_LABELS, **labels}.items():
        built.label(key, value)
    return built


def findings(*objects: Manifest) -> list[tuple[str, str, tuple[str, ...]]]:
    state = load_state([("cluster.yaml", documents(*objects))])
    return [(f.severity, f.check, f.objects) for f in diagnose(state)]


def test_a_healthy_cluster_has_no_findings() -> None:
    flavor = resource_flavor("h100").set(
        "spec.nodeLabels", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    )
    assert findings(gpu_node("n1"), flavor) == []


@pytest.mark.parametrize(
    ("objects", "want"),
    [
        pytest.param(
            [gpu_node("n1", gpus=0)],
            ("error", "device-plugin", ("Node/n1",)),
            id="gpu-node-advertises-no-gpu",
        ),
        pytest.param(
            [gpu_node("n1").taint("dedicated", "ml", "NoSchedule")],
            ("warning", "untolerated-taint", ("Node/n1",)),
            id="taint-nobody-tolerates",
        ),
        pytest.param(
            [gpu_node("n1"), resource_flavor("a100").set("spec.nodeLabels", {"gpu": "a100"})],
            ("error", "flavor-matches-no-node", ("ResourceFlavor/a100",)),
            id="flavor-labels-match-no-node",
        ),
        pytest.param(
            [gpu_node("n1", **{"nvidia.com/mig.config.state": "failed"})],
            ("error", "mig-config", ("Node/n1",)),
            id="mig-config-failed",
        ),
        pytest.param(
            [gpu_node("n1", **{"nvidia.com/mig.config.state": "pending"})],
            ("warning", "mig-config", ("Node/n1",)),
            id="mig-config-pending",
        ),
        pytest.param(
            [
                gpu_node("n1", rack="r1"),
                Manifest("kueue.x-k8s.io/v1beta2", "Topology", "dc").set(
                    "spec.levels", [{"nodeLabel": "block"}, {"nodeLabel": "rack"}]
                ),
                resource_flavor("h100").set("spec.topologyName", "dc"),
            ],
            ("warning", "topology-labels", ("Node/n1", "Topology/dc", "ResourceFlavor/h100")),
            id="missing-topology-level",
        ),
        pytest.param(
            [
                gpu_node("n1", **{"nvidia.com/gpu.sharing-strategy": "time-slicing"}),
                namespace("finance").label("gpuplane.dev/isolation", "required"),
            ],
            ("warning", "time-slicing-without-isolation", ("Node/n1", "Namespace/finance")),
            id="time-slicing-where-isolation-is-required",
        ),
    ],
)
def test_each_check(objects: list[Manifest], want: tuple[str, str, tuple[str, ...]]) -> None:
    assert findings(*objects) == [want]


def test_tolerated_taint_is_fine() -> None:
    flavor = resource_flavor("h100").set(
        "spec.tolerations", [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    )
    assert findings(gpu_node("n1").taint("dedicated", "ml", "NoSchedule"), flavor) == []


def test_cli_prints_one_finding_per_line_and_exits_1_on_errors(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(documents(gpu_node("n1", gpus=0), gpu_node("n2").taint("x", "y", "NoExecute")))
    run = subprocess.run(
        [sys.executable, "-m", "gpuplane", "doctor", "-f", str(path)],
        capture_output=True,
        timeout=60,
        check=False,
    )
    lines = run.stdout.decode().strip().splitlines()
    assert run.returncode == 1
    assert len(lines) == 2
    assert lines[0].startswith("[error] device-plugin: Node/n1:")
    assert "Fix:" in lines[0]
    assert lines[1].startswith("[warning] untolerated-taint: Node/n2:")
