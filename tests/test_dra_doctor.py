"""`gpuplane doctor` on what DRA drivers publish (issue 32, item 6): incomplete pools, stale
generations, DeviceClasses that match nothing or whose CEL fails; quiet on a healthy DRA cluster."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from dra_states import CLUSTER
from gpuplane.cli.app import build_app
from gpuplane.insight.doctor import diagnose
from gpuplane.insight.dra_doctor import dra_findings
from gpuplane.model.loader import load_state


def slice_doc(name: str, pool: str, generation: int, count: int, node: str = "n1") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {{name: {name}}}
spec:
  driver: gpu.example.com
  pool: {{name: {pool}, generation: {generation}, resourceSliceCount: {count}}}
  nodeName: {node}
  devices:
  - name: {name}-dev
    attributes: {{type: {{string: gpu}}}}
"""


def device_class(name: str, expression: str) -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {{name: {name}}}
spec:
  selectors:
  - cel: {{expression: '{expression}'}}
"""


def found(*docs: str) -> list[tuple[str, str, tuple[str, ...]]]:
    text = CLUSTER.read_text() + "".join(f"\n---\n{d}" for d in docs)
    state = load_state([("state.yaml", text)])
    return [(f.severity, f.check, f.objects) for f in dra_findings(state)]


def test_the_dra_test_cluster_is_healthy() -> None:
    assert found() == []


def test_an_incomplete_pool() -> None:
    assert found(slice_doc("extra-a", "extra", 1, 3), slice_doc("extra-b", "extra", 1, 3)) == [
        ("warning", "dra-incomplete-pool", ("ResourceSlice/extra-a", "ResourceSlice/extra-b"))
    ]


def test_a_stale_generation() -> None:
    assert found(slice_doc("n1-old", "n1", 0, 1)) == [
        ("warning", "dra-stale-generation", ("ResourceSlice/n1-old",))
    ]


def test_a_class_that_matches_nothing_and_one_whose_cel_fails() -> None:
    got = found(
        device_class("tpu.example.com", 'device.driver == "tpu.example.com"'),
        device_class("broken.example.com", "device.attributes["),
    )
    assert got == [
        ("error", "dra-class-selector", ("DeviceClass/broken.example.com",)),
        ("warning", "dra-class-matches-nothing", ("DeviceClass/tpu.example.com",)),
    ]


def test_a_gpu_node_whose_devices_a_driver_publishes_needs_no_device_plugin() -> None:
    labels = "labels: {kubernetes.io/hostname: n1, example.com/rack: r1}"
    gpu_labels = "labels: {kubernetes.io/hostname: n1, example.com/rack: r1, nvidia.com/gpu.product: H100}"
    text = CLUSTER.read_text().replace(labels, gpu_labels)
    state = load_state([("state.yaml", text)])
    assert [f.check for f in diagnose(state)] == []
    without_slices = load_state([("state.yaml", text.replace("nodeName: n1\n", "nodeName: n9\n"))])
    assert [(f.check, f.objects) for f in diagnose(without_slices)] == [("device-plugin", ("Node/n1",))]


def test_doctor_command_prints_the_slice_findings(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    path.write_text(CLUSTER.read_text() + "\n---\n" + slice_doc("n1-old", "n1", 0, 1))
    result = CliRunner().invoke(build_app(), ["doctor", "-f", str(path)])
    assert result.exit_code == 0, result.output
    assert (
        "[warning] dra-stale-generation: ResourceSlice/n1-old: pool n1 of driver gpu.example.com"
        in result.output
    )
