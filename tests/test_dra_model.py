"""Dynamic Resource Allocation objects (resource.k8s.io/v1) read from state files."""

from __future__ import annotations

import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from gpuplane.model.dra import ALL, Version
from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_state, state_from_objects

SLICE = """
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-gpus-%(gen)s}
spec:
  driver: gpu.example.com
  pool: {name: n1, generation: %(gen)s, resourceSliceCount: 1}
  nodeName: n1
  sharedCounters:
  - name: gpu-0-counters
    counters:
      memory: {value: 80Gi}
  devices:
  - name: gpu-%(gen)s
    attributes:
      model: {string: H100}
      nvlink.example.com/domain: {int: 3}
      healthy: {bool: true}
      driverVersion: {version: 550.1.2}
    capacity:
      memory: {value: 80Gi, requestPolicy: {default: 10Gi}}
    consumesCounters:
    - counterSet: gpu-0-counters
      counters: {memory: {value: 80Gi}}
    allowMultipleAllocations: true
    taints:
    - {key: maintenance, value: soon, effect: NoSchedule}
"""

CLASS = """
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: gpu.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com"'}
  config:
  - opaque: {driver: gpu.example.com, parameters: {sharing: none}}
  extendedResourceName: example.com/gpu
"""

CLAIM = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: pair, namespace: team}
spec:
  devices:
    requests:
    - name: gpus
      exactly:
        deviceClassName: gpu.example.com
        allocationMode: All
        tolerations: [{key: maintenance, operator: Exists}]
    - name: small
      firstAvailable:
      - {name: mig, deviceClassName: mig.example.com, count: 2}
      - {name: whole, deviceClassName: gpu.example.com, capacity: {requests: {memory: 10Gi}}}
    constraints:
    - {requests: [gpus], matchAttribute: nvlink.example.com/domain}
status:
  allocation:
    devices:
      results:
      - {request: gpus, driver: gpu.example.com, pool: n1, device: gpu-1}
  reservedFor:
  - {resource: pods, name: p0, uid: "1"}
"""

TEMPLATE = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {name: one-gpu, namespace: team}
spec:
  spec:
    devices:
      requests:
      - name: gpu
        exactly: {deviceClassName: gpu.example.com, count: 2}
"""

JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: train, namespace: team, labels: {kueue.x-k8s.io/queue-name: q}}
spec:
  parallelism: 2
  template:
    spec:
      resourceClaims:
      - {name: gpu, resourceClaimTemplateName: one-gpu}
      - {name: shared, resourceClaimName: pair}
      containers:
      - name: c
        resources: {requests: {cpu: "1"}, claims: [{name: gpu}, {name: shared, request: gpus}]}
"""


def load(*docs: str) -> object:
    return load_state([("state.yaml", "---".join(docs))])


def test_every_kind_parses_with_typed_values_and_qualified_names() -> None:
    state = load(SLICE % {"gen": 1}, CLASS, CLAIM, TEMPLATE, JOB)
    dra = state.dra  # type: ignore[attr-defined]
    (s,) = dra.slices
    assert (s.driver, s.pool, s.generation, s.slice_count, s.node_name) == (
        "gpu.example.com",
        "n1",
        1,
        1,
        "n1",
    )
    dev = s.devices[0]
    assert dev.attributes["gpu.example.com/model"] == "H100"
    assert dev.attributes["nvlink.example.com/domain"] == 3
    assert dev.attributes["gpu.example.com/healthy"] is True
    assert dev.attributes["gpu.example.com/driverVersion"] == Version("550.1.2")
    assert dev.capacity["gpu.example.com/memory"] == Fraction(80 * 2**30)
    assert dev.capacity_default["gpu.example.com/memory"] == Fraction(10 * 2**30)
    assert dev.consumes["gpu-0-counters"]["memory"] == Fraction(80 * 2**30)
    assert dev.allow_multiple
    assert dev.taints[0].effect == "NoSchedule"
    assert s.shared_counters["gpu-0-counters"]["memory"] == Fraction(80 * 2**30)
    cls = dra.classes["gpu.example.com"]
    assert cls.selectors == ('device.driver == "gpu.example.com"',)
    assert cls.config_drivers == ("gpu.example.com",)
    assert cls.extended_resource_name == "example.com/gpu"
    claim = dra.claims["team/pair"]
    gpus, small = claim.spec.requests
    assert gpus.alternatives[0].mode == ALL
    assert gpus.alternatives[0].tolerations[0].operator == "Exists"
    assert [a.name for a in small.alternatives] == ["small/mig", "small/whole"]
    assert small.alternatives[0].count == 2
    assert claim.spec.constraints[0].match_attribute == "nvlink.example.com/domain"
    assert claim.allocation is not None
    assert claim.allocation[0].device == "gpu-1"
    assert claim.reserved_for == ("p0",)
    assert dra.templates["team/one-gpu"].spec.requests[0].alternatives[0].count == 2
    (wl,) = state.workloads  # type: ignore[attr-defined]
    claims = wl.pod_sets[0].template.claims
    assert [(c.name, c.claim_name, c.template_name) for c in claims] == [
        ("gpu", None, "one-gpu"),
        ("shared", "pair", None),
    ]


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    state = load(SLICE % {"gen": 1}, SLICE % {"gen": 2})
    current = state.dra.current_slices()  # type: ignore[attr-defined]
    assert [s.generation for s in current] == [2]
    assert len(state.dra.slices) == 2  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        (
            CLASS.replace("cel: {expression:", "cel: {expr:"),
            "DeviceClass/gpu.example.com: spec.selectors[0].cel",
        ),
        (
            (SLICE % {"gen": 1}).replace("{int: 3}", "{int: three}"),
            "ResourceSlice/n1-gpus-1: spec.devices[0].attributes",
        ),
        (
            (SLICE % {"gen": 1}).replace("resourceSliceCount: 1", "resourceSliceCount: 0"),
            "spec.pool.resourceSliceCount",
        ),
        (
            CLAIM.replace("allocationMode: All", "allocationMode: Some"),
            "ResourceClaim/team/pair: spec.devices.requests[0]",
        ),
        (
            CLAIM.replace("matchAttribute: nvlink", "distinctAttribute: x, matchAttribute: nvlink"),
            "constraints[0]",
        ),
        (TEMPLATE.replace("count: 2", "count: 0"), "ResourceClaimTemplate/team/one-gpu: spec.spec.devices"),
        (JOB.replace("{name: shared, request: gpus}", "{name: other}"), "resources.claims[1].name"),
    ],
)
def test_a_malformed_object_is_one_error_that_names_it(doc: str, where: str) -> None:
    with pytest.raises(InputError) as err:
        load(CLASS if "DeviceClass" not in doc else TEMPLATE, doc)
    assert where in str(err.value)
    assert "\n" not in str(err.value)


def test_a_beta_version_is_refused_with_the_served_one() -> None:
    with pytest.raises(InputError, match=r"expected resource\.k8s\.io/v1"):
        load(CLASS.replace("resource.k8s.io/v1", "resource.k8s.io/v1beta1"))


def test_a_malformed_slice_is_left_out_on_a_live_cluster() -> None:
    skipped: list[InputError] = []
    bad = yaml.safe_load(SLICE % {"gen": 1})
    bad["spec"]["driver"] = ["gpu.example.com"]  # a list, not a string
    good = yaml.safe_load(SLICE % {"gen": 2})
    state = state_from_objects([bad, good], skipped=skipped)
    assert [s.name for s in state.dra.slices] == ["n1-gpus-2"]
    assert "ResourceSlice/n1-gpus-1" in str(skipped[0])


def test_schedule_exits_2_with_one_line_naming_a_malformed_slice(tmp_path: Path) -> None:
    state = tmp_path / "state.yaml"
    state.write_text(CLASS + "---" + (SLICE % {"gen": 1}).replace("{int: 3}", "{int: three}"))
    run = subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", "schedule", "-f", str(state)],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 2
    (line,) = run.stderr.decode().strip().splitlines()
    assert "document 1: ResourceSlice/n1-gpus-1: spec.devices[0].attributes" in line
