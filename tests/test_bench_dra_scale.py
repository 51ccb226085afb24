"""The DRA scale benchmark's generator on a small instance: its shape, and both runs schedule the
same pods with every DRA pod holding distinct devices (gang pods two GPUs of one NVLink domain)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from bench_scripts import load_bench
from gpuplane.cli.schedule import plan_document
from gpuplane.core.session import Session, config_from_kueue
from gpuplane.model.loader import load_state

ds = load_bench("dra_scale.py")
NODES, SINGLES, GANGS = 25, 60, 6
NOW = 1_767_225_600.0


def _kinds(objects: list[dict[str, Any]]) -> Counter[str]:
    return Counter(o["kind"] for o in objects)


def _plan(objects: list[dict[str, Any]]) -> dict[str, Any]:
    text = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    state = load_state([("state.json", text)])
    session = Session(state, config_from_kueue(state.configuration), NOW, track_reasons=False)
    return plan_document(session.drain(NOW, max_cycles=None, until_quiet=True), 0.0, 0.0)


@pytest.fixture(scope="module")
def dra() -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = ds.generate(NODES, SINGLES, GANGS, True)
    return result


@pytest.fixture(scope="module")
def extended() -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = ds.generate(NODES, SINGLES, GANGS, False)
    return result


def test_dra_state_has_one_slice_per_node_and_the_mapping(dra: list[dict[str, Any]]) -> None:
    kinds = _kinds(dra)
    assert kinds["Node"] == kinds["ResourceSlice"] == NODES
    assert kinds["Workload"] == SINGLES + GANGS
    assert kinds["DeviceClass"] == 1
    assert kinds["ResourceClaimTemplate"] == 2
    config = next(o for o in dra if o["kind"] == "Configuration")
    assert config["resources"]["deviceClassMappings"] == [
        {"name": "nvidia.com/gpu", "deviceClassNames": ["gpu.nvidia.com"]}
    ]
    for node in (o for o in dra if o["kind"] == "Node"):
        assert "nvidia.com/gpu" not in node["status"]["allocatable"]


def test_one_node_in_ten_is_mig_partitioned_over_counters(dra: list[dict[str, Any]]) -> None:
    slices = [o for o in dra if o["kind"] == "ResourceSlice"]
    mig = [s for s in slices if "sharedCounters" in s["spec"]]
    assert [s["spec"]["nodeName"] for s in mig] == ["node-0000", "node-0010", "node-0020"]
    whole = [d for d in mig[0]["spec"]["devices"] if d["attributes"]["type"]["string"] == "gpu"]
    parts = [d for d in mig[0]["spec"]["devices"] if d["attributes"]["type"]["string"] == "mig"]
    assert len(whole) == 8
    assert len(parts) == 8 * 9
    assert all(len(d["consumesCounters"][0]["counters"]) == 8 for d in whole)
    plain = next(s for s in slices if "sharedCounters" not in s["spec"])
    assert len(plain["spec"]["devices"]) == 8
    domains = Counter(d["attributes"]["nvlinkDomain"]["string"] for d in plain["spec"]["devices"])
    assert sorted(domains.values()) == [4, 4]


def test_extended_state_asks_the_same_gpus_as_resources(extended: list[dict[str, Any]]) -> None:
    kinds = _kinds(extended)
    assert kinds["ResourceSlice"] == kinds["DeviceClass"] == 0
    workloads = [o for o in extended if o["kind"] == "Workload"]
    gpus = Counter(
        w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"]["requests"][
            "nvidia.com/gpu"
        ]
        for w in workloads
    )
    assert gpus == {"1": SINGLES, "2": GANGS}


def test_both_runs_admit_the_whole_load_and_dra_devices_are_sound(
    dra: list[dict[str, Any]], extended: list[dict[str, Any]]
) -> None:
    want = SINGLES + GANGS * ds.GANG_PODS
    for objects in (extended, dra):
        doc = _plan(objects)
        assert doc["pending"] == []
        assert sum(ps["count"] for a in doc["admitted"] for ps in a["podSets"]) == want
    assert ds.check_claims(doc) == []


def test_check_claims_finds_a_device_given_twice() -> None:
    place = {"node": "node-0001", "claims": {"gpu": [{"pool": "node-0001", "device": "gpu-3"}]}}
    doc = {
        "admitted": [
            {"workload": "bench/single-1", "podSets": [{"placement": [place]}]},
            {"workload": "bench/single-2", "podSets": [{"placement": [place]}]},
        ]
    }
    assert ds.check_claims(doc) == ["node-0001/gpu-3 given to bench/single-1 and bench/single-2"]
