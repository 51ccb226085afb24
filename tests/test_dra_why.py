"""`gpuplane why` on DRA workloads (issue 32, item 6): each cause with its blockers and fix, and an
ETA that waits for devices, on state files of tests/data/dra/cluster.yaml."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from starlette.testclient import TestClient
from typer.testing import CliRunner

from dra_states import CLUSTER, NOW, template, workload
from gpuplane.cli.app import build_app
from gpuplane.core.session import Session, config_from_kueue
from gpuplane.insight.dra_why import split_and
from gpuplane.insight.why import explain_all
from gpuplane.model.loader import load_state
from gpuplane.web.app import create_app
from gpuplane.web.auth import Viewer
from gpuplane.web.sources import FileSource, SnapshotHub

EIGHT = "[{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 8}}]"
GPU = "[{name: gpu, resourceClaimTemplateName: %s}]"


def why(*docs: str) -> dict[str, dict[str, Any]]:
    """Every pending workload's explanation (as ``gpuplane why -o json`` gives it), by name."""
    text = CLUSTER.read_text() + "".join(f"\n---\n{d}" for d in docs)
    state = load_state([("state.yaml", text)])
    session = Session(state, config_from_kueue(state.configuration), NOW, track_reasons=False)
    plan = session.drain(NOW, max_cycles=None, until_quiet=True)
    return {e.workload.split("/")[1]: e.to_json() for e in explain_all(state, plan, NOW)}


def selected(expression: str) -> str:
    """One request of a gpu.example.com device with the CEL selector ``expression``."""
    selectors = f'[{{cel: {{expression: "{expression}"}}}}]'
    return f"[{{name: gpu, exactly: {{deviceClassName: gpu.example.com, selectors: {selectors}}}}}]"


def kinds(e: dict[str, Any]) -> list[tuple[str, str]]:
    return [(b["kind"], b["name"]) for b in e["blockers"]]


def test_no_such_device_class() -> None:
    e = why(
        template("t", "[{name: gpu, exactly: {deviceClassName: nope.example.com}}]"),
        workload("w", 1, GPU % "t"),
    )["w"]
    assert e["reason"] == "Misconfigured"
    assert "DeviceClass nope.example.com does not exist" in e["message"]
    assert kinds(e) == [("DeviceClass", "nope.example.com")]
    assert "gpu.example.com, mig.example.com, shared.example.com" in e["fix"]
    assert e["eta"]["seconds"] is None


def test_selector_that_matches_no_device_names_the_attribute_and_the_values() -> None:
    selector = "device.attributes['gpu.example.com'].productName == 'B200'"
    e = why(
        template("t", selected(selector)),
        workload("w", 1, GPU % "t"),
    )["w"]
    assert e["reason"] == "NoNodeAdvertisesResource"
    assert "the selectors match no published device" in e["message"]
    assert "attribute gpu.example.com/productName rules out most" in e["message"]
    assert "H100 (16), A100 (1), L4 (1)" in e["message"]
    assert kinds(e) == [("Request", "gpu")]
    assert "H100 (16)" in e["fix"]
    assert e["eta"]["seconds"] is None


def test_every_matching_device_allocated_names_the_holders_and_waits_for_them() -> None:
    found = why(
        template("eight", EIGHT),
        workload("a", 2, GPU % "eight", at=1),
        workload("b", 1, GPU % "eight", at=2),
    )
    assert "a" not in found
    e = found["b"]
    assert e["reason"] == "WaitingForGangCapacity"
    assert "every device it may get is allocated: 17 match, 1 free" in e["message"]
    assert kinds(e) == [("Workload", "team/a")]
    assert e["blockers"][0]["detail"] == "holds 16 of the 17 matching devices"
    assert "team/a" in e["fix"]
    # The ETA waits for team/a's devices: not "0s".
    assert e["eta"]["seconds"] is not None
    assert e["eta"]["seconds"] > 0
    assert "when team/a ends" in e["eta"]["basis"]


def test_a_device_shared_by_capacity_whose_capacity_is_taken() -> None:
    capacity = "capacity: {requests: {memory: 16Gi}}"
    slice_ = f"[{{name: slice, exactly: {{deviceClassName: shared.example.com, {capacity}}}}}]"
    found = why(template("s", slice_), workload("a", 1, GPU % "s", at=1), workload("b", 1, GPU % "s", at=2))
    assert "a" not in found
    e = found["b"]
    assert e["reason"] == "WaitingForGangCapacity"
    assert "every device it may get is allocated: 1 match, 0 free" in e["message"]
    assert kinds(e) == [("Workload", "team/a")]


def test_mig_partitions_whose_counters_are_taken_name_the_holder() -> None:
    whole = selected("device.attributes['gpu.example.com'].productName == 'A100'")
    mig = "[{name: gpu, exactly: {deviceClassName: mig.example.com}}]"
    found = why(
        template("a100", whole),
        template("mig", mig),
        workload("a", 1, GPU % "a100", at=1),
        workload("b", 1, GPU % "mig", at=2),
    )
    assert "a" not in found
    e = found["b"]
    assert e["reason"] == "WaitingForGangCapacity"
    assert "9 match, 0 free" in e["message"]
    assert kinds(e) == [("Workload", "team/a")]


def test_a_constraint_no_node_ever_satisfies() -> None:
    five = "[{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 5}}]"
    match = "[{requests: [gpu], matchAttribute: nvlink.example.com/domain}]"
    e = why(template("t", five, match), workload("w", 1, GPU % "t"))["w"]
    assert e["reason"] == "NoNodeAdvertisesResource"
    assert "constraint matchAttribute nvlink.example.com/domain" in e["message"]
    assert "no node has 5 matching devices sharing one value of it (at most 4)" in e["message"]
    assert kinds(e) == [("Constraint", "nvlink.example.com/domain")]
    assert "ask for at most 4 devices" in e["fix"]


def test_a_constraint_no_node_satisfies_now_waits() -> None:
    three = "[{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 3}}]"
    two = "[{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 2}}]"
    match = "[{requests: [gpu], matchAttribute: nvlink.example.com/domain}]"
    # Four pods of three GPUs of one NVLink domain leave one GPU free in each of the four domains:
    # n1 and n2 have two free GPUs each, never two of one domain.
    found = why(
        template("three", three, match),
        template("two", two, match),
        workload("a", 4, GPU % "three", at=1),
        workload("w", 1, GPU % "two", at=2),
    )
    assert "a" not in found
    e = found["w"]
    assert e["reason"] == "WaitingForGangCapacity"
    assert "no node has 2 free matching devices sharing one value of it right now (at most 1)" in e["message"]
    assert e["eta"]["seconds"] is not None
    assert e["eta"]["seconds"] > 0


def test_a_gang_whose_pods_fit_one_by_one_but_not_together() -> None:
    four = "[{name: gpu, exactly: {deviceClassName: gpu.example.com, count: 4}}]"
    found = why(
        template("four", four),
        template("eight", EIGHT),
        workload("a", 1, GPU % "four", at=1),
        workload("g", 2, GPU % "eight", at=2),
    )
    assert "a" not in found
    e = found["g"]
    assert e["reason"] == "WaitingForGangCapacity"
    assert "no placement holds all 2 pods with their claims at once" in e["message"]
    assert kinds(e) == [("Workload", "team/a")]
    assert "minCount" in e["fix"]
    assert e["eta"]["seconds"] is not None
    assert e["eta"]["seconds"] > 0


def test_a_cel_error_names_the_expression() -> None:
    bad = "device.attributes['gpu.example.com'].index >"
    e = why(
        template("t", selected(bad)),
        workload("w", 1, GPU % "t"),
    )["w"]
    assert e["reason"] == "Misconfigured"
    assert bad in e["message"]
    assert e["blockers"][0]["kind"] == "ResourceClaimTemplate"
    assert "fix the CEL expression" in e["fix"]


def test_a_driver_that_publishes_no_slices() -> None:
    tpu = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: tpu.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "tpu.example.com"'}
"""
    e = why(
        tpu,
        template("t", "[{name: tpu, exactly: {deviceClassName: tpu.example.com}}]"),
        workload("w", 1, "[{name: tpu, resourceClaimTemplateName: t}]"),
    )["w"]
    assert e["reason"] == "NoNodeAdvertisesResource"
    assert "driver tpu.example.com, which publishes no ResourceSlice" in e["message"]
    assert kinds(e) == [("Driver", "tpu.example.com")]
    assert "install or restart the DRA driver tpu.example.com" in e["fix"]
    assert "(gpu.example.com)" in e["fix"]


def test_a_missing_template() -> None:
    e = why(workload("w", 1, GPU % "absent"))["w"]
    assert e["reason"] == "Misconfigured"
    assert "ResourceClaimTemplate team/absent not found" in e["message"]
    assert "create the missing ResourceClaim or ResourceClaimTemplate" in e["fix"]


def test_why_command_prints_the_cause(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    text = CLUSTER.read_text() + "\n---\n" + template("eight", EIGHT)
    text += (
        "\n---\n" + workload("a", 2, GPU % "eight", at=1) + "\n---\n" + workload("b", 1, GPU % "eight", at=2)
    )
    path.write_text(text)
    result = CliRunner().invoke(
        build_app(), ["why", "workload/b", "-n", "team", "-f", str(path), "-o", "json"]
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["reason"] == "WaitingForGangCapacity"
    assert doc["blockers"][0]["name"] == "team/a"
    assert doc["eta"]["seconds"] > 0


def test_split_and_keeps_brackets_and_strings() -> None:
    assert split_and('a == "x && y" && f(b && c) && d[e]') == ['a == "x && y"', "f(b && c)", "d[e]"]


class _Admin:
    """An authenticator that knows one token, for a viewer who sees everything."""

    def authenticate(self, token: str) -> Viewer | None:
        return Viewer("admin") if token == "t" else None


def test_the_console_shows_the_dra_cause_and_its_fix(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    text = (
        CLUSTER.read_text()
        + "\n---\n"
        + template("t", "[{name: gpu, exactly: {deviceClassName: nope.example.com}}]")
    )
    path.write_text(text + "\n---\n" + workload("w", 1, GPU % "t"))
    hub = SnapshotHub()
    FileSource([path], hub).load()
    with TestClient(create_app(hub, _Admin())) as client:
        page = client.get("/workloads/team/w", headers={"Authorization": "Bearer t"}).text
    assert "DeviceClass nope.example.com does not exist" in page
    assert "create DeviceClass nope.example.com" in page
