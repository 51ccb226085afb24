"""Counter- and capacity-based quota (Kueue's mapping ``sources``), and capacity request policies
(issue 32): what a claim is charged when its class's mapping has sources, the errors Kueue gives,
and how a requestPolicy rounds what placement hands out."""

from __future__ import annotations

import pytest

from dra_states import admitted, pending, schedule, template, workload
from gpuplane.model.dra import CapacityPolicy
from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_state

GI = 1024**3

BASE = """
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata: {name: default}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata: {name: q}
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, %(resource)s]
    flavors:
    - name: default
      resources:
      - {name: cpu, nominalQuota: 1000}
      - {name: %(resource)s, nominalQuota: %(quota)s}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata: {name: q, namespace: team}
spec: {clusterQueue: q}
---
apiVersion: v1
kind: Node
metadata:
  name: n1
  labels: {kubernetes.io/hostname: n1}
status:
  allocatable: {cpu: '64', memory: 512Gi, pods: '110'}
"""

PARTITIONS = """
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: mig.example.com}
spec:
  selectors:
  - cel: {expression: 'device.attributes["gpu.example.com"].type == "mig"'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-counters}
spec:
  driver: gpu.example.com
  pool: {name: n1, generation: 1, resourceSliceCount: 2}
  nodeName: n1
  sharedCounters:
  - name: gpu-0
    counters: {memory: {value: 40Gi}}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-parts}
spec:
  driver: gpu.example.com
  pool: {name: n1, generation: 1, resourceSliceCount: 2}
  nodeName: n1
  devices:
%(parts)s
"""


def _part(name: str, profile: str, memory: int) -> str:
    return f"""  - name: {name}
    attributes: {{type: {{string: mig}}, profile: {{string: {profile}}}}}
    consumesCounters:
    - counterSet: gpu-0
      counters: {{memory: {{value: {memory}Gi}}}}
"""


PARTS = "".join(
    [_part(f"mig-1g-{i}", "1g", 10) for i in range(4)] + [_part(f"mig-2g-{i}", "2g", 20) for i in range(2)]
)

SHARED = """
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata: {name: shared.example.com}
spec:
  selectors:
  - cel: {expression: 'device.driver == "gpu.example.com" && device.allowMultipleAllocations'}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: n1-shared}
spec:
  driver: gpu.example.com
  pool: {name: n1, generation: 1, resourceSliceCount: 1}
  nodeName: n1
  devices:
  - name: gpu-0
    allowMultipleAllocations: true
    attributes: {type: {string: shared}}
    capacity:
      memory: {value: 24Gi, requestPolicy: %(policy)s}
"""

RANGE = "{default: 4Gi, validRange: {min: 1Gi, step: 1Gi}}"


def counter_config(selector: str = "device.driver == 'gpu.example.com'", name: str = "memory") -> str:
    return f"""
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
resources:
  deviceClassMappings:
  - name: example.com/gpu-memory
    deviceClassNames: [mig.example.com]
    sources:
    - counter:
        name: {name}
        driver: gpu.example.com
        deviceSelector: {{cel: {{expression: "{selector}"}}}}
"""


CAPACITY_CONFIG = """
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
featureGates: {KueueDRAIntegrationConsumableCapacity: true}
resources:
  deviceClassMappings:
  - name: example.com/shared-memory
    deviceClassNames: [shared.example.com]
    sources:
    - capacity: {name: memory, driver: gpu.example.com}
"""


def partitions(quota: str) -> str:
    base = BASE % {"resource": "example.com/gpu-memory", "quota": quota}
    return base + PARTITIONS % {"parts": PARTS}


def shared(quota: str, policy: str = RANGE) -> str:
    return BASE % {"resource": "example.com/shared-memory", "quota": quota} + SHARED % {"policy": policy}


def mig(count: int = 1, profile: str | None = None) -> str:
    rule = f'device.attributes["gpu.example.com"].profile == "{profile}"'
    selector = f", selectors: [{{cel: {{expression: '{rule}'}}}}]" if profile else ""
    return f"[{{name: part, exactly: {{deviceClassName: mig.example.com, count: {count}{selector}}}}}]"


def share(memory: str | None = None) -> str:
    asked = f", capacity: {{requests: {{memory: {memory}}}}}" if memory else ""
    return f"[{{name: part, exactly: {{deviceClassName: shared.example.com{asked}}}}}]"


CLAIM = "[{name: gpu, resourceClaimTemplateName: %s}]"


def charged(doc_text: str, name: str) -> dict[str, int]:
    state = load_state([("state.yaml", doc_text)])
    wl = next(w for w in state.workloads if w.name == name)
    return dict(wl.pod_sets[0].template.claim_quota)


# --- counters ---------------------------------------------------------------------------------------


def test_a_partition_is_charged_the_counter_it_consumes() -> None:
    text = "\n---\n".join(
        [
            partitions("30Gi"),
            counter_config(),
            template("one", mig(profile="1g")),
            workload("a", 1, CLAIM % "one"),
        ]
    )
    assert charged(text, "a") == {"example.com/gpu-memory": 10 * GI}


def test_counter_quota_admits_what_it_covers_and_the_rest_waits_for_quota() -> None:
    doc = schedule(
        counter_config(),
        template("big", mig(profile="2g")),
        template("small", mig(profile="1g")),
        workload("a", 1, CLAIM % "big"),
        workload("b", 1, CLAIM % "small", at=1),
        workload("c", 1, CLAIM % "small", at=2),
        cluster=partitions("30Gi"),
    )
    assert admitted(doc, "a") is not None
    assert admitted(doc, "b") is not None
    # The GPU still has 10 GiB of counters for c, but the quota (30 GiB) is spent.
    waiting = pending(doc, "c")
    assert waiting["reason"] == "WaitingForQuota"
    assert "example.com/gpu-memory" in waiting["message"]


def test_counter_charge_is_the_largest_any_matching_device_consumes_times_the_count() -> None:
    text = "\n---\n".join(
        [partitions("80Gi"), counter_config(), template("any", mig(count=2)), workload("a", 1, CLAIM % "any")]
    )
    assert charged(text, "a") == {"example.com/gpu-memory": 2 * 20 * GI}  # conservative: a 2g's 20 GiB


def test_fewer_matching_devices_than_the_count_is_kueues_error() -> None:
    doc = schedule(
        counter_config(),
        template("many", mig(count=3, profile="2g")),
        workload("a", 1, CLAIM % "many"),
        cluster=partitions("80Gi"),
    )
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert (
        "devices.requests[0]: Internal error: insufficient matching devices for counter driver: "
        "2 device(s) match but 3 requested"
    ) in why["message"]


def test_devices_that_consume_no_such_counter_are_kueues_error() -> None:
    doc = schedule(
        counter_config(name="cores"),
        template("one", mig(profile="1g")),
        workload("a", 1, CLAIM % "one"),
        cluster=partitions("80Gi"),
    )
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert 'matched devices have no consumesCounters entry for counter "cores"' in why["message"]


def test_the_source_selector_scopes_the_devices_and_a_failing_one_is_an_error() -> None:
    only_1g = "device.attributes['gpu.example.com'].profile == '1g'"
    text = "\n---\n".join(
        [partitions("80Gi"), counter_config(only_1g), template("any", mig()), workload("a", 1, CLAIM % "any")]
    )
    assert charged(text, "a") == {"example.com/gpu-memory": 10 * GI}
    doc = schedule(
        counter_config("device.attributes['gpu.example.com'].nope == 1"),
        template("one", mig(profile="1g")),
        workload("a", 1, CLAIM % "one"),
        cluster=partitions("80Gi"),
    )
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert "CEL evaluation error" in why["message"]


def test_first_available_on_a_mapping_with_sources_is_refused() -> None:
    first = (
        "[{name: part, firstAvailable: [{name: a, deviceClassName: mig.example.com}, "
        "{name: b, deviceClassName: mig.example.com, count: 2}]}]"
    )
    doc = schedule(
        counter_config(),
        template("either", first),
        workload("a", 1, CLAIM % "either"),
        cluster=partitions("80Gi"),
    )
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert "cannot be charged by counter or capacity sources" in why["message"]


def test_an_incomplete_pool_has_no_matching_devices() -> None:
    incomplete = partitions("80Gi").replace("resourceSliceCount: 2", "resourceSliceCount: 3")
    doc = schedule(
        counter_config(),
        template("one", mig(profile="1g")),
        workload("a", 1, CLAIM % "one"),
        cluster=incomplete,
    )
    assert "0 device(s) match but 1 requested" in pending(doc, "a")["message"]


# --- capacity ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "expected"),
    [("6Gi", 6), ("5500Mi", 6), (None, 4)],  # as asked; rounded up to a 1 GiB step; the policy's default
)
def test_a_share_is_charged_the_capacity_it_asks_rounded_as_its_policy(
    memory: str | None, expected: int
) -> None:
    text = "\n---\n".join(
        [shared("16Gi"), CAPACITY_CONFIG, template("s", share(memory)), workload("a", 1, CLAIM % "s")]
    )
    assert charged(text, "a") == {"example.com/shared-memory": expected * GI}


def test_capacity_quota_admits_shares_up_to_the_quota() -> None:
    doc = schedule(
        CAPACITY_CONFIG,
        template("six", share("6Gi")),
        workload("a", 1, CLAIM % "six"),
        workload("b", 1, CLAIM % "six", at=1),
        workload("c", 1, CLAIM % "six", at=2),
        cluster=shared("16Gi"),
    )
    assert admitted(doc, "a") is not None
    assert admitted(doc, "b") is not None
    waiting = pending(doc, "c")  # the device has 12 GiB left, the quota 4 GiB
    assert waiting["reason"] == "WaitingForQuota"
    assert "example.com/shared-memory" in waiting["message"]


def test_a_capacity_no_policy_grants_is_kueues_error() -> None:
    doc = schedule(
        CAPACITY_CONFIG,
        template("huge", share("20Gi")),
        workload("a", 1, CLAIM % "huge"),
        cluster=shared("64Gi", "{default: 4Gi, validValues: [4Gi, 8Gi, 16Gi]}"),
    )
    why = pending(doc, "a")
    assert why["reason"] == "Misconfigured"
    assert "capacity request cannot be satisfied by any matched device's RequestPolicy" in why["message"]


def test_capacity_sources_need_kueues_feature_gate() -> None:
    off = CAPACITY_CONFIG.replace("featureGates: {KueueDRAIntegrationConsumableCapacity: true}\n", "")
    with pytest.raises(InputError, match="need the feature gate KueueDRAIntegrationConsumableCapacity"):
        load_state([("state.yaml", shared("16Gi") + "\n---\n" + off)])


def test_counter_and_capacity_sources_cannot_be_mixed_in_one_mapping() -> None:
    mixed = CAPACITY_CONFIG + "    - counter: {name: memory, driver: gpu.example.com}\n"
    with pytest.raises(InputError, match="cannot be mixed in one mapping"):
        load_state([("state.yaml", shared("16Gi") + "\n---\n" + mixed)])


def test_a_source_sets_exactly_one_kind() -> None:
    neither = CAPACITY_CONFIG.replace("- capacity: {name: memory, driver: gpu.example.com}", "- {}")
    with pytest.raises(InputError, match="exactly one of counter and capacity"):
        load_state([("state.yaml", shared("16Gi") + "\n---\n" + neither)])


# --- request policies ---------------------------------------------------------------------------------


def test_policy_rounding() -> None:
    values = CapacityPolicy(valid_values=(4 * GI, 8 * GI, 16 * GI))
    assert values.round(5 * GI) == 8 * GI
    assert values.round(16 * GI) == 16 * GI
    assert values.round(17 * GI) is None
    span = CapacityPolicy(minimum=GI, maximum=10 * GI, step=GI)
    assert span.round(GI // 2) == GI
    assert span.round(5 * GI + 1) == 6 * GI
    assert span.round(11 * GI) is None
    assert CapacityPolicy(minimum=GI).round(3 * GI + 7) == 3 * GI + 7


@pytest.mark.parametrize(
    ("policy", "says"),
    [
        ("{default: 4Gi, validValues: [8Gi, 4Gi]}", "must be sorted in ascending order"),
        ("{validValues: [4Gi, 8Gi]}", "required with validValues or validRange"),
        ("{default: 6Gi, validValues: [4Gi, 8Gi]}", "must be one of validValues"),
        (
            "{default: 4Gi, validValues: [4Gi], validRange: {min: 1Gi}}",
            "at most one of validValues and validRange",
        ),
        ("{default: 4Gi, validRange: {min: 8Gi}}", "must lie in validRange"),
        ("{default: 4Gi, validRange: {min: 4Gi, max: 2Gi}}", "must not be below min"),
        ("{default: 4Gi, validRange: {min: 1Gi, step: '0'}}", "must be above zero"),
    ],
)
def test_a_bad_request_policy_is_one_error_naming_the_field(policy: str, says: str) -> None:
    with pytest.raises(InputError, match=says) as caught:
        load_state([("state.yaml", shared("16Gi", policy))])
    assert "requestPolicy" in str(caught.value)


def test_a_request_policy_needs_allow_multiple_allocations() -> None:
    text = shared("16Gi").replace("    allowMultipleAllocations: true\n", "")
    with pytest.raises(InputError, match="needs allowMultipleAllocations"):
        load_state([("state.yaml", text)])


def test_placement_consumes_what_the_policy_rounds_a_request_to() -> None:
    values = "{default: 4Gi, validValues: [4Gi, 8Gi, 16Gi]}"
    five = share("5Gi")  # consumes 8 GiB of the device's 24 GiB: three fit, a fourth does not
    doc = schedule(
        template("five", five),
        *(workload(name, 1, CLAIM % "five", at=i) for i, name in enumerate("abcd")),
        cluster=shared("64Gi", values),
    )
    assert all(admitted(doc, name) is not None for name in "abc")
    assert admitted(doc, "d") is None
    placed = admitted(doc, "a")
    assert placed is not None
    assert placed[0]["claims"]["gpu"][0]["device"] == "gpu-0"
    # A request above every valid value matches no device.
    doc = schedule(
        template("huge", share("20Gi")), workload("e", 1, CLAIM % "huge"), cluster=shared("64Gi", values)
    )
    assert admitted(doc, "e") is None
