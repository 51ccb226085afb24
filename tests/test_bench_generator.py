"""The Kueue-shaped scale benchmark's generator: exact shape on a small instance, and it loads."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from bench_scripts import load_bench
from gpuplane.model.loader import load_files

COHORTS, QUEUES_PER_COHORT = 2, 3
QUEUES = COHORTS * QUEUES_PER_COHORT
# name -> (per ClusterQueue, cpu, priority), as the benchmark is specified.
WANT_CLASSES = {"small": (35, 1, 50), "medium": (11, 5, 100), "large": (4, 20, 200)}


ks = load_bench("kueue_scale.py")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = ks.generate_objects(COHORTS, QUEUES_PER_COHORT)
    return result


def _of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def _class_of(workload: dict[str, Any]) -> str:
    return str(workload["metadata"]["name"].rsplit("-", 2)[1])


def test_default_shape_is_fifty_thousand_workloads_in_a_thousand_queues() -> None:
    per_queue = sum(cls.per_queue for cls in ks.WORKLOAD_CLASSES)
    assert per_queue == 50
    assert per_queue * 10 * 100 == 50_000


def test_cluster_queues_have_the_specified_quota_preemption_and_cohort(objects: list[dict[str, Any]]) -> None:
    cqs = _of_kind(objects, "ClusterQueue")
    assert len(cqs) == QUEUES
    by_cohort = Counter(cq["spec"]["cohortName"] for cq in cqs)
    assert by_cohort == {"cohort-0": QUEUES_PER_COHORT, "cohort-1": QUEUES_PER_COHORT}
    for cq in cqs:
        name, spec = cq["metadata"]["name"], cq["spec"]
        assert cq["apiVersion"] == "kueue.x-k8s.io/v1beta2"
        # cq-<cohort>-<queue> sits in cohort-<cohort>.
        assert spec["cohortName"] == f"cohort-{name.split('-')[1]}"
        assert spec["namespaceSelector"] == {}
        assert spec["preemption"] == {"reclaimWithinCohort": "Any", "withinClusterQueue": "LowerPriority"}
        assert spec["resourceGroups"] == [
            {
                "coveredResources": ["cpu"],
                "flavors": [
                    {
                        "name": "default",
                        "resources": [{"name": "cpu", "nominalQuota": "20", "borrowingLimit": "100"}],
                    }
                ],
            }
        ]
    assert [o["metadata"]["name"] for o in _of_kind(objects, "ResourceFlavor")] == ["default"]


def test_one_local_queue_per_cluster_queue_in_its_cohort_namespace(objects: list[dict[str, Any]]) -> None:
    cohort_of = {cq["metadata"]["name"]: cq["spec"]["cohortName"] for cq in _of_kind(objects, "ClusterQueue")}
    lqs = _of_kind(objects, "LocalQueue")
    assert sorted(lq["spec"]["clusterQueue"] for lq in lqs) == sorted(cohort_of)
    for lq in lqs:
        assert lq["metadata"]["namespace"] == cohort_of[lq["spec"]["clusterQueue"]]
    assert {ns["metadata"]["name"] for ns in _of_kind(objects, "Namespace")} == set(cohort_of.values())


def test_workloads_per_queue_and_class(objects: list[dict[str, Any]]) -> None:
    local_to_cluster = {
        (lq["metadata"]["namespace"], lq["metadata"]["name"]): lq["spec"]["clusterQueue"]
        for lq in _of_kind(objects, "LocalQueue")
    }
    workloads = _of_kind(objects, "Workload")
    assert len(workloads) == QUEUES * 50
    counts: Counter[tuple[str, str]] = Counter()
    for wl in workloads:
        cls = _class_of(wl)
        _, want_cpu, want_priority = WANT_CLASSES[cls]
        spec = wl["spec"]
        cq = local_to_cluster[(wl["metadata"]["namespace"], spec["queueName"])]
        counts[(cq, cls)] += 1
        assert spec["priority"] == want_priority
        [pod_set] = spec["podSets"]
        assert pod_set["name"] == "main"
        assert pod_set["count"] == 1
        [container] = pod_set["template"]["spec"]["containers"]
        assert container["resources"] == {"requests": {"cpu": str(want_cpu)}}
    assert counts == {
        (cq, cls): want[0] for cq in set(local_to_cluster.values()) for cls, want in WANT_CLASSES.items()
    }


def test_workloads_are_created_one_second_apart_with_distinct_uids(objects: list[dict[str, Any]]) -> None:
    workloads = _of_kind(objects, "Workload")
    created = [datetime.fromisoformat(wl["metadata"]["creationTimestamp"]) for wl in workloads]
    assert all(wl["metadata"]["creationTimestamp"].endswith("Z") for wl in workloads)
    offsets = [(c - created[0]).total_seconds() for c in created]
    assert offsets == [float(i) for i in range(len(created))]
    assert len({wl["metadata"]["uid"] for wl in workloads}) == len(workloads)
    assert len({wl["metadata"]["name"] for wl in workloads}) == len(workloads)


def test_classes_are_interleaved_in_creation_order(objects: list[dict[str, Any]]) -> None:
    # Every ClusterQueue gets its k-th workload before any gets its (k+1)-th, and each
    # class is spread over the whole sequence rather than created in one block.
    order = [_class_of(wl) for wl in _of_kind(objects, "Workload")]
    per_slot = [order[i : i + QUEUES] for i in range(0, len(order), QUEUES)]
    assert all(len(set(slot)) == 1 for slot in per_slot)
    slots = [slot[0] for slot in per_slot]
    for cls in WANT_CLASSES:
        positions = [i for i, name in enumerate(slots) if name == cls]
        assert positions[0] < len(slots) / 4
        assert positions[-1] > len(slots) * 3 / 4
    assert ks.generate_objects(COHORTS, QUEUES_PER_COHORT) == objects


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_written_state_loads(tmp_path: Path, objects: list[dict[str, Any]], fmt: str) -> None:
    path = tmp_path / f"state.{fmt}"
    ks.write_state(objects, path, fmt)
    text = path.read_text(encoding="utf-8")
    if fmt == "json":
        assert json.loads(text)["kind"] == "List"
    else:
        # No anchors: the loader's fast C path is taken only for alias-free YAML.
        assert "&" not in text
    # Read through `read=`: the loader's default reader leaves its file for the garbage
    # collector to close, which this suite's warnings-as-errors setting turns into a failure.
    state = load_files([str(path)], read=lambda name: Path(name).read_bytes())
    assert len(state.cluster_queues) == QUEUES
    assert len(state.local_queues) == QUEUES
    assert len(state.workloads) == QUEUES * 50
    assert {cq.cohort for cq in state.cluster_queues.values()} == {"cohort-0", "cohort-1"}
    quota = next(iter(state.cluster_queues.values())).resource_groups[0].flavors[0].resources["cpu"]
    assert (quota.nominal, quota.borrowing_limit) == (20_000, 100_000)  # millicores
    assert sorted({wl.priority for wl in state.workloads}) == [50, 100, 200]
    assert len({wl.creation for wl in state.workloads}) == len(state.workloads)
