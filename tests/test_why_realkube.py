"""`gpuplane why --kubeconfig` on the real control plane: every FAQ cause of :mod:`why_cases`.

Each case is created in fresh namespaces; its cluster-scoped objects (nodes, flavors, queues) get
names prefixed with the namespace, its nodes and flavors a label of their own, so cases do not see
each other. Admissions are written through the Workload status subresource, as a controller does.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from realkube import RealKube
from why_cases import WhyCase, cases

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CLUSTER_KINDS = ("Node", "ResourceFlavor", "ClusterQueue", "Cohort")


def renamer(ns: str, namespaces: dict[str, str]) -> Callable[[str, str], str]:
    def rename(kind: str, name: str) -> str:
        if kind in CLUSTER_KINDS or kind == "Flavor":
            return f"{ns}-{name}"
        if kind in ("Workload", "Pod") and "/" in name:
            space, _, rest = name.partition("/")
            return f"{namespaces.get(space, space)}/{rest}"
        return name

    return rename


def _rename_queue_refs(kind: str, spec: dict[str, Any], rename: Callable[[str, str], str]) -> None:
    """A ClusterQueue's cohort and flavors, a LocalQueue's ClusterQueue: under this test's names."""
    if kind == "ClusterQueue":
        if "cohortName" in spec:
            spec["cohortName"] = rename("Cohort", spec["cohortName"])
        for group in spec.get("resourceGroups", []):
            for flavor in group["flavors"]:
                flavor["name"] = rename("Flavor", flavor["name"])
    if kind == "LocalQueue":
        spec["clusterQueue"] = rename("ClusterQueue", spec["clusterQueue"])


def localize(
    case: WhyCase, ns: str, namespaces: dict[str, str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The case's objects for this cluster, and the admissions to write as status afterwards."""
    rename = renamer(ns, namespaces)
    pool = {"gpuplane.test/pool": ns}
    objects, statuses = [], []
    for manifest in case.manifests:
        body = copy.deepcopy(manifest.to_dict())
        kind, meta = body["kind"], body["metadata"]
        if kind == "Namespace":
            continue
        if kind in CLUSTER_KINDS:
            meta["name"] = rename(kind, meta["name"])
        if "namespace" in meta:
            meta["namespace"] = namespaces[meta["namespace"]]
        spec = body.setdefault("spec", {})
        if kind == "Node":
            meta.setdefault("labels", {}).update(pool)
        if kind == "ResourceFlavor":
            spec.setdefault("nodeLabels", {}).update(pool)
        _rename_queue_refs(kind, spec, rename)
        status = body.pop("status", None)
        if kind == "Workload" and status:
            admission = status.get("admission")
            if admission:
                admission["clusterQueue"] = rename("ClusterQueue", admission["clusterQueue"])
                for psa in admission["podSetAssignments"]:
                    psa["flavors"] = {r: rename("Flavor", f) for r, f in psa["flavors"].items()}
                status.setdefault(
                    "conditions",
                    [
                        {
                            "type": "QuotaReserved",
                            "status": "True",
                            "reason": "QuotaReserved",
                            "message": "reserved",
                            "lastTransitionTime": "2026-03-01T09:00:00Z",
                        }
                    ],
                )
            statuses.append({"namespace": meta["namespace"], "name": meta["name"], "status": status})
        elif status is not None:
            body["status"] = status
        objects.append(body)
    return objects, statuses


def apply_case(kube: RealKube, case: WhyCase) -> tuple[str, dict[str, str], list[dict[str, Any]]]:
    ns = kube.namespace("why")
    namespaces = {"default": ns}
    if any(
        m.to_dict()["kind"] == "Namespace" and m.to_dict()["metadata"]["name"] == "team-b"
        for m in case.manifests
    ):
        namespaces["team-b"] = kube.namespace("why-b")
    objects, statuses = localize(case, ns, namespaces)
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    for item in statuses:
        kube.kubectl(
            "-n",
            item["namespace"],
            "patch",
            "workload",
            item["name"],
            "--subresource=status",
            "--type=merge",
            "-p",
            json.dumps({"status": item["status"]}),
        )
    return ns, namespaces, objects


def cleanup(kube: RealKube, objects: list[dict[str, Any]], namespaces: dict[str, str]) -> None:
    for space in namespaces.values():
        kube.kubectl("-n", space, "delete", "workloads,localqueues", "--all", "--wait=false", check=False)
    names = [
        f"{body['kind'].lower()}/{body['metadata']['name']}"
        for body in objects
        if body["kind"] in CLUSTER_KINDS
    ]
    if names:
        kube.kubectl("delete", *names, "--wait=false", check=False)


@pytest.fixture(scope="module")
def crds(real_kube: RealKube) -> RealKube:
    real_kube.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    return real_kube


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
def test_each_cause_on_the_real_api_server(crds: RealKube, case: WhyCase) -> None:
    real_kube = crds
    ns, namespaces, objects = apply_case(real_kube, case)
    try:
        result = CliRunner().invoke(
            build_app(),
            ["why", case.target, "-n", ns, "--kubeconfig", str(real_kube.kubeconfig), "-o", "json"],
        )
        assert result.exit_code == 0, result.stderr
        doc = json.loads(result.stdout)
        assert doc["workload"] == f"{ns}/w"
        assert doc["reason"] == case.want_reason, doc
        rename = renamer(ns, namespaces)
        got = {(b["kind"], b["name"]) for b in doc["blockers"]}
        assert {(kind, rename(kind, name)) for kind, name in case.want_blockers} <= got, doc["blockers"]
        fix = doc["fix"]
        for want in case.want_fix:
            words = want
            for space, real in namespaces.items():
                words = words.replace(f"{space}/", f"{real}/")
            assert words in fix, fix
    finally:
        cleanup(real_kube, objects, namespaces)
