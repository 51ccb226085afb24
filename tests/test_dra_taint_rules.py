"""DeviceTaintRule on state files (issue 32): a rule's taint lands on every published device its
selector matches, as if the driver had published it; placement keeps such devices for requests that
tolerate the taint. Served as resource.k8s.io/v1alpha3 (1.33-1.35), v1beta2 (1.36, behind the
DRADeviceTaintRules feature gate) and v1 (1.37)."""

from __future__ import annotations

from collections import defaultdict

import pytest
import yaml

from dra_states import CLUSTER, admitted, devices, pending, schedule, template, workload
from gpuplane.k8s.clusterstate import DRA_READ, state_objects
from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_state, state_from_objects

CLAIM = "[{name: gpu, resourceClaimTemplateName: %s}]"
TOLERATE = ", tolerations: [{key: example.com/unhealthy, operator: Exists, effect: NoSchedule}]"


def gpus(count: int, extra: str = "") -> str:
    return f"[{{name: gpus, exactly: {{deviceClassName: gpu.example.com, count: {count}{extra}}}}}]"


def rule(name: str, selector: str | None, effect: str = "NoSchedule", version: str = "v1beta2") -> str:
    select = f"\n  deviceSelector: {selector}" if selector is not None else ""
    return f"""
apiVersion: resource.k8s.io/{version}
kind: DeviceTaintRule
metadata: {{name: {name}}}
spec:{select}
  taint: {{key: example.com/unhealthy, value: "true", effect: {effect}}}
"""


def test_a_rule_taints_the_device_it_selects_and_placement_keeps_off_it() -> None:
    one_bad = rule("n1-gpu-3", "{driver: gpu.example.com, pool: n1, device: gpu-3}")
    doc = schedule(one_bad, template("eight", gpus(8)), workload("a", 1, CLAIM % "eight"))
    (pod,) = admitted(doc, "a") or []
    assert pod["node"] == "n2"  # n1 has only 7 untainted GPUs
    doc = schedule(one_bad, template("seven", gpus(7)), workload("a", 1, CLAIM % "seven"))
    (pod,) = admitted(doc, "a") or []
    if pod["node"] == "n1":
        assert "gpu-3" not in devices(pod)


@pytest.mark.parametrize("version", ["v1alpha3", "v1beta2", "v1"])
def test_a_rule_for_whole_pools_and_a_request_that_tolerates_it(version: str) -> None:
    pools = [rule(f"drain-{n}", f"{{pool: {n}}}", version=version) for n in ("n1", "n2")]
    doc = schedule(*pools, template("eight", gpus(8)), workload("a", 1, CLAIM % "eight"))
    assert admitted(doc, "a") is None
    assert pending(doc, "a")["reason"] != "Misconfigured"
    doc = schedule(*pools, template("eight", gpus(8, TOLERATE)), workload("a", 1, CLAIM % "eight"))
    assert admitted(doc, "a") is not None


def test_an_empty_selector_matches_every_device_and_none_matches_nothing() -> None:
    everything = rule("all", "{}")
    doc = schedule(everything, template("one", gpus(1)), workload("a", 1, CLAIM % "one"))
    assert admitted(doc, "a") is None
    nothing = rule("none", None)
    doc = schedule(nothing, template("one", gpus(1)), workload("a", 1, CLAIM % "one"))
    assert admitted(doc, "a") is not None


def test_a_rule_with_effect_none_only_informs() -> None:
    told = rule("told", "{}", effect="None")
    doc = schedule(told, template("one", gpus(1)), workload("a", 1, CLAIM % "one"))
    assert admitted(doc, "a") is not None


def test_the_taint_is_on_the_devices_of_the_state() -> None:
    text = CLUSTER.read_text() + "\n---\n" + rule("x", "{driver: gpu.example.com, pool: n2, device: gpu-0}")
    state = load_state([("state.yaml", text)])
    tainted = [
        (s.pool, d.name)
        for s in state.dra.slices
        for d in s.devices
        if any(t.key == "example.com/unhealthy" for t in d.taints)
    ]
    assert tainted == [("n2", "gpu-0")]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (
            rule("r", "{deviceClassName: gpu.example.com}", version="v1alpha3"),
            "deviceClassName is not supported",
        ),
        (rule("r", "{}", effect="PreferNoSchedule"), "effect"),
        (rule("r", "{}", version="v1beta1"), "unsupported apiVersion resource.k8s.io/v1beta1"),
    ],
)
def test_a_bad_rule_is_one_error_naming_it(text: str, says: str) -> None:
    with pytest.raises(InputError, match=says):
        load_state([("state.yaml", CLUSTER.read_text() + "\n---\n" + text)])


def test_a_live_clusters_rules_join_its_state() -> None:
    """The controller, ``schedule --kubeconfig`` and ``why`` list DeviceTaintRules (v1) with the other
    DRA kinds, and the state built from them carries their taints."""
    assert "DeviceTaintRule" in {res.kind for res in DRA_READ}
    text = CLUSTER.read_text() + "\n---\n" + rule("x", "{pool: n2, device: gpu-1}", version="v1")
    by_kind: dict[str, list[dict[str, object]]] = defaultdict(list)
    for doc in yaml.safe_load_all(text):
        if doc:
            by_kind[doc["kind"]].append(doc)
    state = state_from_objects(state_objects(lambda kind: by_kind.get(kind, [])))
    tainted = [(s.pool, d.name) for s in state.dra.slices for d in s.devices if d.taints]
    assert ("n2", "gpu-1") in tainted
