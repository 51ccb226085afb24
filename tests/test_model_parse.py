"""Correct cluster state parses into the model: base units, both Kueue versions, every container format,
Jobs as Workloads, effective pod requests, admissions, and the selector, taint and affinity semantics."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from gpuplane.model.loader import load_state
from gpuplane.model.objects import (
    Admission,
    ClusterState,
    PodSetAssignment,
    Taint,
    Toleration,
    frozen_map,
)
from manifests import (
    GPU,
    MIN_PARALLELISM,
    Manifest,
    PodSpec,
    cluster_queue,
    documents,
    expression,
    job,
    list_of,
    local_queue,
    namespace,
    node,
    pod_spec,
    priority_class,
    resource_flavor,
    workload,
)

GI = 1024**3


def load(text: str, name: str = "state.yaml") -> ClusterState:
    return load_state([(name, text)])


def load_objects(*manifests: Manifest) -> ClusterState:
    return load(documents(*manifests))


def cluster() -> list[Manifest]:
    """A small valid cluster: a namespace, a flavor, a queue pair and one workload."""
    return [
        namespace("team-a").label("team", "a"),
        resource_flavor("default"),
        cluster_queue("q").cohort("all").flavor("default", cpu="10", memory="64Gi", gpu=8),
        local_queue("lq", "team-a", "q"),
        workload("w", "team-a")
        .queue("lq")
        .created("2026-01-01T00:00:00Z")
        .podset(count=2, cpu="500m", gpu=1),
    ]


# ---------------------------------------------------------------------------
# Quantities
# ---------------------------------------------------------------------------

QUANTITIES = [
    pytest.param("cpu", "500m", 500, id="cpu-millicores"),
    pytest.param("cpu", "2", 2000, id="cpu-cores-string"),
    pytest.param("cpu", 2, 2000, id="cpu-cores-integer"),
    pytest.param("cpu", 0.5, 500, id="cpu-cores-float"),
    pytest.param("cpu", "1.5", 1500, id="cpu-fractional-cores"),
    pytest.param("memory", "16Gi", 17179869184, id="memory-gibibytes"),
    pytest.param("memory", "1G", 10**9, id="memory-gigabytes"),
    pytest.param("memory", "1Ki", 1024, id="memory-kibibytes"),
    pytest.param(GPU, "1e3", 1000, id="gpu-count-with-exponent"),
    pytest.param(GPU, 8, 8, id="gpu-count-integer"),
    pytest.param("pods", "110", 110, id="pods-count"),
]


@pytest.mark.parametrize(("resource", "amount", "want_base_units"), QUANTITIES)
def test_quantities_are_integers_in_base_units(resource: str, amount: object, want_base_units: int) -> None:
    state = load_objects(node("n1").set("status.allocatable", {resource: amount}))

    got = state.nodes[0].allocatable[resource]

    assert (got, type(got)) == (want_base_units, int)


QUANTITY_PLACES: list[Any] = [
    pytest.param(
        lambda s: s.cluster_queues["q"].resource_groups[0].flavors[0].resources["memory"].nominal,
        64 * GI,
        id="nominal-quota",
    ),
    pytest.param(
        lambda s: s.cluster_queues["q"].resource_groups[0].flavors[0].resources["cpu"].borrowing_limit,
        2500,
        id="borrowing-limit",
    ),
    pytest.param(
        lambda s: s.cluster_queues["q"].resource_groups[0].flavors[0].resources["cpu"].lending_limit,
        250,
        id="lending-limit",
    ),
    pytest.param(lambda s: s.workloads[0].pod_sets[0].template.requests["cpu"], 500, id="pod-request"),
    pytest.param(lambda s: s.workloads[0].pod_sets[0].template.requests[GPU], 1, id="pod-device-request"),
]


@pytest.mark.parametrize(("read", "want"), QUANTITY_PLACES)
def test_quantities_in_every_place_are_base_units(read: Callable[[ClusterState], int], want: int) -> None:
    ns, flavor, queue, lq, wl = cluster()
    queue.set("spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit", "2.5")
    queue.set("spec.resourceGroups[0].flavors[0].resources[0].lendingLimit", "250m")

    assert read(load_objects(ns, flavor, queue, lq, wl)) == want


# ---------------------------------------------------------------------------
# Kueue API versions
# ---------------------------------------------------------------------------

KUEUE_VERSIONS = [
    pytest.param(
        cluster_queue("q", "v1beta1")
        .cohort("team")
        .fungibility(whenCanBorrow="Borrow", whenCanPreempt="Preempt"),
        "team",
        "MayStopSearch",
        "MayStopSearch",
        id="v1beta1-cohort-and-borrow",
    ),
    pytest.param(
        cluster_queue("q", "v1beta1")
        .cohort("team")
        .fungibility(whenCanBorrow="TryNextFlavor", whenCanPreempt="TryNextFlavor"),
        "team",
        "TryNextFlavor",
        "TryNextFlavor",
        id="v1beta1-try-next-flavor",
    ),
    pytest.param(
        cluster_queue("q", "v1beta2")
        .cohort("team")
        .fungibility(whenCanBorrow="MayStopSearch", whenCanPreempt="MayStopSearch"),
        "team",
        "MayStopSearch",
        "MayStopSearch",
        id="v1beta2-cohort-name-and-may-stop-search",
    ),
    pytest.param(
        cluster_queue("q", "v1beta2"), None, "MayStopSearch", "TryNextFlavor", id="v1beta2-defaults"
    ),
    pytest.param(
        cluster_queue("q", "v1beta1"), None, "MayStopSearch", "TryNextFlavor", id="v1beta1-defaults"
    ),
]


@pytest.mark.parametrize(
    ("queue", "want_cohort", "want_when_can_borrow", "want_when_can_preempt"), KUEUE_VERSIONS
)
def test_cluster_queue_in_both_kueue_versions(
    queue: Manifest, want_cohort: str | None, want_when_can_borrow: str, want_when_can_preempt: str
) -> None:
    cq = load_objects(queue).cluster_queues["q"]

    assert (cq.cohort, cq.flavor_fungibility.when_can_borrow, cq.flavor_fungibility.when_can_preempt) == (
        want_cohort,
        want_when_can_borrow,
        want_when_can_preempt,
    )


def in_version(version: str) -> list[Manifest]:
    """``cluster()`` with every Kueue object written in ``version``."""
    ns, flavor, _, lq, wl = cluster()
    queue = cluster_queue("q", version).cohort("all").flavor("default", cpu="10", memory="64Gi", gpu=8)
    return [ns, *(m.set("apiVersion", f"kueue.x-k8s.io/{version}") for m in (flavor, queue, lq, wl))]


def test_both_kueue_versions_give_the_same_state() -> None:
    assert load_objects(*in_version("v1beta1")) == load_objects(*in_version("v1beta2"))


# ---------------------------------------------------------------------------
# Container formats
# ---------------------------------------------------------------------------

FORMATS: list[Any] = [
    pytest.param(lambda ms: documents(*ms), "state.yaml", id="yaml-documents"),
    pytest.param(lambda ms: list_of(*ms).yaml(), "state.yaml", id="yaml-kind-list"),
    pytest.param(lambda ms: "---\n" + documents(*ms) + "---\n", "state.yaml", id="yaml-with-empty-documents"),
    pytest.param(lambda ms: list_of(*ms).json(), "state.json", id="json-kind-list"),
    pytest.param(lambda ms: json.dumps([m.to_dict() for m in ms], indent=2), "state.json", id="json-array"),
    pytest.param(lambda ms: "\n  " + list_of(*ms).json(), "state.json", id="json-after-whitespace"),
]


@pytest.mark.parametrize(("render", "file_name"), FORMATS)
def test_every_container_format_gives_the_same_state(
    render: Callable[[list[Manifest]], str], file_name: str
) -> None:
    want = load_objects(*cluster())

    got = load(render(cluster()), file_name)

    assert got == want
    assert len(got.workloads) == 1


def test_json_numbers_are_quantities_too() -> None:
    text = json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "n1"},
            "status": {"allocatable": {"cpu": 1.5, GPU: 1e3, "memory": "16Gi"}},
        }
    )

    got = load(text, "node.json").nodes[0].allocatable

    assert dict(got) == {"cpu": 1500, GPU: 1000, "memory": 16 * GI}


TIMESTAMPS = [
    pytest.param("'2026-01-01T00:00:00Z'", 1767225600.0, id="quoted-utc"),
    pytest.param("2026-01-01T00:00:00Z", 1767225600.0, id="unquoted-utc"),
    pytest.param("2026-01-01T02:00:00+02:00", 1767225600.0, id="unquoted-offset"),
    pytest.param("'2026-01-01T00:00:01.5Z'", 1767225601.5, id="fractional-seconds"),
]


@pytest.mark.parametrize(("written", "want_epoch_seconds"), TIMESTAMPS)
def test_creation_timestamps(written: str, want_epoch_seconds: float) -> None:
    text = (
        workload("w", "team-a")
        .podset(cpu="1")
        .yaml()
        .replace("metadata:\n", f"metadata:\n  creationTimestamp: {written}\n", 1)
    )

    assert load(text).workloads[0].creation == want_epoch_seconds


# ---------------------------------------------------------------------------
# Jobs become Workloads
# ---------------------------------------------------------------------------

JOBS = [
    pytest.param(job("train", "team-a").queue("lq"), 1, None, 0, None, id="defaults-one-pod"),
    pytest.param(job("train", "team-a").queue("lq").parallelism(3), 3, None, 0, None, id="parallelism"),
    pytest.param(
        job("train", "team-a").queue("lq").parallelism(4).completions(2),
        2,
        None,
        0,
        None,
        id="completions-below-parallelism",
    ),
    pytest.param(
        job("train", "team-a").queue("lq").parallelism(3).completions(10),
        3,
        None,
        0,
        None,
        id="completions-above-parallelism",
    ),
    pytest.param(
        job("train", "team-a").queue("lq").parallelism(4).annotate(MIN_PARALLELISM, "2"),
        4,
        2,
        0,
        None,
        id="min-parallelism-annotation",
    ),
    pytest.param(
        job("train", "team-a").queue("lq").parallelism(2).priority_class("high"),
        2,
        None,
        1000,
        "high",
        id="priority-class-label",
    ),
]


@pytest.mark.parametrize(
    ("manifest", "want_count", "want_min_count", "want_priority", "want_priority_class"), JOBS
)
def test_job_with_queue_name_becomes_a_workload(
    manifest: Manifest,
    want_count: int,
    want_min_count: int | None,
    want_priority: int,
    want_priority_class: str | None,
) -> None:
    with_pod = copy.deepcopy(manifest).pod(pod_spec().container(cpu="2", memory="1Gi", gpu=1))

    (wl,) = load_objects(priority_class("high", 1000), with_pod).workloads

    (pod_set,) = wl.pod_sets
    assert (wl.namespace, wl.queue_name, pod_set.name) == ("team-a", "lq", "main")
    assert wl.name.startswith("job-train-")
    assert (pod_set.count, pod_set.min_count) == (want_count, want_min_count)
    assert (wl.priority, wl.priority_class) == (want_priority, want_priority_class)
    assert dict(pod_set.template.requests) == {"cpu": 2000, "memory": GI, GPU: 1}


def test_job_without_queue_name_is_ignored() -> None:
    state = load_objects(job("batch", "team-a").parallelism(3))

    assert state.workloads == ()


WORKLOAD_PRIORITIES = [
    pytest.param(workload("w").podset(cpu="1"), 0, id="none"),
    pytest.param(workload("w").podset(cpu="1").priority(7), 7, id="explicit"),
    pytest.param(workload("w").podset(cpu="1").set("spec.priorityClassName", "high"), 1000, id="class-name"),
    pytest.param(
        workload("w").podset(cpu="1").set("spec.priorityClassRef", {"name": "high"}),
        1000,
        id="class-reference",
    ),
    pytest.param(
        workload("w").podset(cpu="1").set("spec.priorityClassName", "high").priority(5),
        5,
        id="explicit-beats-class",
    ),
]


@pytest.mark.parametrize(("manifest", "want_priority"), WORKLOAD_PRIORITIES)
def test_workload_priority(manifest: Manifest, want_priority: int) -> None:
    (wl,) = load_objects(manifest, priority_class("high", 1000)).workloads

    assert wl.priority == want_priority


# ---------------------------------------------------------------------------
# Effective pod requests
# ---------------------------------------------------------------------------

POD_REQUESTS = [
    pytest.param(
        pod_spec().container(cpu="1", memory="1Gi"), {"cpu": 1000, "memory": GI}, (), id="one-container"
    ),
    pytest.param(
        pod_spec().container(cpu="1", gpu=1).container(cpu="500m", memory="1Gi"),
        {"cpu": 1500, GPU: 1, "memory": GI},
        (),
        id="containers-sum",
    ),
    pytest.param(
        pod_spec().init_container(cpu="4").container(cpu="1").container(cpu="1"),
        {"cpu": 4000},
        (),
        id="init-container-above-sum",
    ),
    pytest.param(
        pod_spec().init_container(cpu="1").container(cpu="2").container(cpu="1"),
        {"cpu": 3000},
        (),
        id="init-container-below-sum",
    ),
    pytest.param(
        pod_spec().init_container(memory="2Gi").container(cpu="1"),
        {"cpu": 1000, "memory": 2 * GI},
        (),
        id="resource-only-in-init-container",
    ),
    pytest.param(
        pod_spec().init_container(sidecar=True, cpu="1").init_container(cpu="3").container(cpu="2"),
        {"cpu": 4000},
        (),
        id="init-container-runs-beside-earlier-sidecar",
    ),
    pytest.param(
        pod_spec().init_container(cpu="3").init_container(sidecar=True, cpu="1").container(cpu="1"),
        {"cpu": 3000},
        (),
        id="sidecar-adds-to-containers",
    ),
    pytest.param(
        pod_spec().container(limits={"cpu": "2", GPU: 1}),
        {"cpu": 2000, GPU: 1},
        (),
        id="limits-default-missing-requests",
    ),
    pytest.param(
        pod_spec().container(cpu="1", limits={"cpu": "2", "memory": "1Gi"}),
        {"cpu": 1000, "memory": GI},
        (),
        id="request-below-limit-kept",
    ),
    pytest.param(
        pod_spec().container(cpu="3", limits={"cpu": "2"}),
        {"cpu": 3000},
        ("cpu",),
        id="request-above-limit-flagged",
    ),
    pytest.param(
        pod_spec().container(cpu="1").overhead(cpu="250m", memory="128Mi"),
        {"cpu": 1250, "memory": 128 * 1024**2},
        (),
        id="overhead-added",
    ),
]


@pytest.mark.parametrize(("spec", "want_requests", "want_limits_below_requests"), POD_REQUESTS)
def test_effective_pod_requests(
    spec: PodSpec, want_requests: Mapping[str, int], want_limits_below_requests: tuple[str, ...]
) -> None:
    (wl,) = load_objects(workload("w").podset(count=1, spec=spec)).workloads

    template = wl.pod_sets[0].template
    assert (dict(template.requests), template.limits_below_requests) == (
        want_requests,
        want_limits_below_requests,
    )


# ---------------------------------------------------------------------------
# Workload admission
# ---------------------------------------------------------------------------

ADMISSIONS = [
    pytest.param(
        workload("w").podset(count=3, cpu="1"),
        None,
        id="not-admitted",
    ),
    pytest.param(
        workload("w")
        .podset(count=3, cpu="1")
        .admitted(
            "q", {"name": "main", "count": 3, "flavors": {"cpu": "default"}, "resourceUsage": {"cpu": "3"}}
        ),
        Admission(
            "q", (PodSetAssignment("main", 3, frozen_map({"cpu": "default"}), frozen_map({"cpu": 3000})),)
        ),
        id="explicit-count-and-usage",
    ),
    pytest.param(
        workload("w")
        .podset(count=3, cpu="1", gpu=2)
        .admitted("q", {"name": "main", "flavors": {GPU: "h100"}}),
        Admission("q", (PodSetAssignment("main", 3, frozen_map({GPU: "h100"}), frozen_map({GPU: 6})),)),
        id="count-and-usage-from-pod-set",
    ),
    pytest.param(
        workload("w")
        .podset(count=4, min_count=1, cpu="1")
        .admitted("q", {"name": "main", "count": 2, "flavors": {"cpu": "default"}}),
        Admission(
            "q", (PodSetAssignment("main", 2, frozen_map({"cpu": "default"}), frozen_map({"cpu": 2000})),)
        ),
        id="partial-admission",
    ),
    pytest.param(
        workload("w")
        .podset("driver", count=1, cpu="1")
        .podset("workers", count=2, gpu=4)
        .admitted(
            "q",
            {"name": "driver", "flavors": {"cpu": "default"}},
            {"name": "workers", "flavors": {GPU: "a100"}},
        ),
        Admission(
            "q",
            (
                PodSetAssignment("driver", 1, frozen_map({"cpu": "default"}), frozen_map({"cpu": 1000})),
                PodSetAssignment("workers", 2, frozen_map({GPU: "a100"}), frozen_map({GPU: 8})),
            ),
        ),
        id="two-pod-sets",
    ),
]


@pytest.mark.parametrize(("manifest", "want_admission"), ADMISSIONS)
def test_workload_admission(manifest: Manifest, want_admission: Admission | None) -> None:
    (wl,) = load_objects(manifest).workloads

    assert wl.admission == want_admission
    assert wl.has_quota_reservation is (want_admission is not None)


# ---------------------------------------------------------------------------
# Namespace selectors, taints and tolerations, node affinity
# ---------------------------------------------------------------------------

NAMESPACE_SELECTORS = [
    pytest.param({}, {}, True, id="empty-selector-selects-all"),
    pytest.param(None, {"team": "a"}, False, id="absent-selector-selects-none"),
    pytest.param({"matchLabels": {"team": "a"}}, {"team": "a", "tier": "x"}, True, id="match-labels"),
    pytest.param({"matchLabels": {"team": "a"}}, {"team": "b"}, False, id="match-labels-other-value"),
    pytest.param({"matchLabels": {"team": "a"}}, {}, False, id="match-labels-missing"),
    pytest.param({"matchExpressions": [expression("team", "In", "a", "b")]}, {"team": "b"}, True, id="in"),
    pytest.param(
        {"matchExpressions": [expression("team", "In", "a")]}, {"team": "c"}, False, id="in-not-listed"
    ),
    pytest.param({"matchExpressions": [expression("team", "NotIn", "a")]}, {}, True, id="not-in-key-absent"),
    pytest.param({"matchExpressions": [expression("team", "NotIn", "a")]}, {"team": "a"}, False, id="not-in"),
    pytest.param({"matchExpressions": [expression("team", "Exists")]}, {"team": ""}, True, id="exists"),
    pytest.param(
        {"matchExpressions": [expression("team", "DoesNotExist")]}, {"x": "y"}, True, id="does-not-exist"
    ),
    pytest.param(
        {"matchLabels": {"team": "a"}, "matchExpressions": [expression("tier", "In", "gold")]},
        {"team": "a", "tier": "silver"},
        False,
        id="labels-and-expressions-all-hold",
    ),
]


@pytest.mark.parametrize(("selector", "namespace_labels", "want_match"), NAMESPACE_SELECTORS)
def test_namespace_selector(
    selector: Mapping[str, object] | None, namespace_labels: Mapping[str, str], want_match: bool
) -> None:
    cq = load_objects(cluster_queue("q").namespace_selector(selector)).cluster_queues["q"]

    assert cq.namespace_selector is not None
    assert cq.namespace_selector.matches(namespace_labels) is want_match


TOLERATIONS = [
    pytest.param(
        {"key": "gpu", "value": "h100", "effect": "NoSchedule"},
        ("gpu", "h100", "NoSchedule"),
        True,
        id="equal",
    ),
    pytest.param(
        {"key": "gpu", "operator": "Equal", "value": "a100"},
        ("gpu", "h100", "NoSchedule"),
        False,
        id="equal-other-value",
    ),
    pytest.param(
        {"key": "gpu", "operator": "Exists"}, ("gpu", "h100", "NoExecute"), True, id="exists-any-value"
    ),
    pytest.param(
        {"operator": "Exists"}, ("spot", "true", "NoSchedule"), True, id="exists-empty-key-tolerates-all"
    ),
    pytest.param(
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        ("gpu", "h100", "NoExecute"),
        False,
        id="effect-differs",
    ),
    pytest.param(
        {"key": "spot", "operator": "Exists"}, ("gpu", "h100", "NoSchedule"), False, id="key-differs"
    ),
    pytest.param({"key": "dedicated"}, ("dedicated", "", "PreferNoSchedule"), True, id="equal-empty-values"),
]


@pytest.mark.parametrize(("toleration_fields", "node_taint", "want_tolerated"), TOLERATIONS)
def test_toleration_tolerates_taint(
    toleration_fields: dict[str, str], node_taint: tuple[str, str, str], want_tolerated: bool
) -> None:
    key, value, effect = node_taint
    state = load_objects(
        node("n1").taint(key, value or None, effect),
        workload("w").podset(spec=pod_spec().container(cpu="1").toleration(**toleration_fields)),
    )

    (taint,) = state.nodes[0].taints
    (toleration,) = state.workloads[0].pod_sets[0].template.tolerations
    assert isinstance(taint, Taint)
    assert isinstance(toleration, Toleration)
    assert toleration.tolerates(taint) is want_tolerated


NODE_AFFINITY = [
    pytest.param(pod_spec(), {}, True, id="no-constraints"),
    pytest.param(pod_spec().affinity_term(expression("zone", "In", "a", "b")), {"zone": "b"}, True, id="in"),
    pytest.param(
        pod_spec().affinity_term(expression("zone", "In", "a")), {"zone": "c"}, False, id="in-not-listed"
    ),
    pytest.param(pod_spec().affinity_term(expression("zone", "In", "a")), {}, False, id="in-label-absent"),
    pytest.param(
        pod_spec().affinity_term(expression("zone", "NotIn", "a")), {}, True, id="not-in-label-absent"
    ),
    pytest.param(
        pod_spec().affinity_term(expression("zone", "NotIn", "a")), {"zone": "a"}, False, id="not-in"
    ),
    pytest.param(pod_spec().affinity_term(expression("gpu", "Exists")), {"gpu": "h100"}, True, id="exists"),
    pytest.param(pod_spec().affinity_term(expression("gpu", "Exists")), {}, False, id="exists-absent"),
    pytest.param(pod_spec().affinity_term(expression("spot", "DoesNotExist")), {}, True, id="does-not-exist"),
    pytest.param(
        pod_spec().affinity_term(expression("spot", "DoesNotExist")), {"spot": "true"}, False, id="does-exist"
    ),
    pytest.param(pod_spec().affinity_term(expression("gpus", "Gt", "4")), {"gpus": "8"}, True, id="gt"),
    pytest.param(
        pod_spec().affinity_term(expression("gpus", "Gt", "8")), {"gpus": "8"}, False, id="gt-equal"
    ),
    pytest.param(pod_spec().affinity_term(expression("gpus", "Lt", "8")), {"gpus": "4"}, True, id="lt"),
    pytest.param(
        pod_spec().affinity_term(expression("gpus", "Lt", "4")), {"gpus": "8"}, False, id="lt-above"
    ),
    pytest.param(
        pod_spec().affinity_term(expression("gpus", "Gt", "4")),
        {"gpus": "many"},
        False,
        id="gt-label-not-integer",
    ),
    pytest.param(
        pod_spec().affinity_term(expression("zone", "In", "a"), expression("gpu", "Exists")),
        {"zone": "a"},
        False,
        id="expressions-in-a-term-all-hold",
    ),
    pytest.param(
        pod_spec().affinity_term(expression("zone", "In", "a")).affinity_term(expression("zone", "In", "b")),
        {"zone": "b"},
        True,
        id="any-term-holds",
    ),
    pytest.param(
        pod_spec().node_selector("pool", "gpu").affinity_term(expression("zone", "In", "a")),
        {"zone": "a", "pool": "cpu"},
        False,
        id="node-selector-and-affinity-both-hold",
    ),
]


@pytest.mark.parametrize(("spec", "node_labels", "want_match"), NODE_AFFINITY)
def test_node_affinity(spec: PodSpec, node_labels: Mapping[str, str], want_match: bool) -> None:
    (wl,) = load_objects(workload("w").podset(spec=spec)).workloads

    assert wl.pod_sets[0].template.node_matches(node_labels) is want_match
