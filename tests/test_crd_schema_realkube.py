"""The CRDs in deploy/crds are as strict as Kueue's, on a real API server: kubectl's default server-side
field validation (Strict) rejects an unknown field, and the schema's rules reject what Kueue rejects."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest
import yaml

from manifests import Manifest, cluster_queue, cohort, local_queue, resource_flavor
from realkube import ROOT, RealKube

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def kube(real_kube: RealKube) -> RealKube:
    real_kube.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(ROOT / "deploy" / "crds"))
    for crd in ("clusterqueues", "localqueues", "cohorts", "resourceflavors", "topologies"):
        real_kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}.kueue.x-k8s.io", "--timeout=30s")
    return real_kube


def _apply(kube: RealKube, body: Mapping[str, Any]) -> tuple[bool, str]:
    done = kube.kubectl("apply", "-f", "-", input=yaml.safe_dump(dict(body)), check=False)
    return done.returncode == 0, done.stderr


def _queue(name: str) -> Manifest:
    return cluster_queue(name).flavor("h100", **{"nvidia.com/gpu": 8})


def _renamed(body: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    body["spec"][new] = body["spec"].pop(old)
    return body


@pytest.mark.parametrize(
    ("body", "want_error"),
    [
        pytest.param(
            _renamed(_queue("schema-typo").to_dict(), "namespaceSelector", "namespaceSelecter"),
            'unknown field "spec.namespaceSelecter"',
            id="selector-typo",
        ),
        pytest.param(
            _queue("schema-nested").set("spec.preemption.withinClusterQueu", "Never").to_dict(),
            'unknown field "spec.preemption.withinClusterQueu"',
            id="nested-typo",
        ),
        pytest.param(
            _queue("schema-cohort").cohort("Team_A").to_dict(), "spec.cohortName", id="cohort-name-format"
        ),
        pytest.param(
            _queue("schema-uncovered")
            .set("spec.resourceGroups[0].flavors[0].resources[0].name", "nvidia.com/gpus")
            .to_dict(),
            "coveredResources",
            id="uncovered-resource",
        ),
        pytest.param(
            _queue("schema-borrow")
            .set("spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit", 2)
            .to_dict(),
            "borrowingLimit needs a cohortName",
            id="borrowing-without-cohort",
        ),
        pytest.param(
            _queue("schema-selector")
            .set("spec.namespaceSelector", {"matchExpressions": [{"key": "a", "operator": "Is"}]})
            .to_dict(),
            "spec.namespaceSelector.matchExpressions[0].operator",
            id="selector-operator",
        ),
        pytest.param(
            local_queue("lq", "default", "Bad_Name").to_dict(), "spec.clusterQueue", id="local-queue-target"
        ),
        pytest.param(
            cohort("schema-child", parent="Not A Name").to_dict(), "spec.parentName", id="cohort-parent"
        ),
        pytest.param(
            resource_flavor("schema-flavor").set("spec.nodeLable", {"a": "b"}).to_dict(),
            'unknown field "spec.nodeLable"',
            id="flavor-typo",
        ),
    ],
)
def test_what_kueue_rejects_is_rejected(kube: RealKube, body: dict[str, Any], want_error: str) -> None:
    applied, stderr = _apply(kube, body)
    assert not applied
    assert want_error in stderr


def test_valid_kueue_objects_are_accepted_and_kept_whole(kube: RealKube) -> None:
    name = "schema-valid"
    queue = (
        _queue(name)
        .cohort("research")
        .set("spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit", 4)
        .set("spec.namespaceSelector", {"matchLabels": {"team": "a"}})
        .set(
            "spec.preemption",
            {"reclaimWithinCohort": "Any", "borrowWithinCohort": {"policy": "LowerPriority"}},
        )
        .set("spec.admissionChecksStrategy", {"admissionChecks": [{"name": "prov", "onFlavors": ["h100"]}]})
    )
    try:
        applied, stderr = _apply(kube, queue.to_dict())
        assert applied, stderr
        stored = yaml.safe_load(kube.kubectl("get", "clusterqueue", name, "-o", "yaml").stdout)
        assert stored["spec"]["namespaceSelector"] == {"matchLabels": {"team": "a"}}
        assert stored["spec"]["admissionChecksStrategy"]["admissionChecks"][0]["onFlavors"] == ["h100"]
        assert stored["spec"]["resourceGroups"] == queue.to_dict()["spec"]["resourceGroups"]
    finally:
        kube.kubectl("delete", "clusterqueue", name, "--ignore-not-found", check=False)
