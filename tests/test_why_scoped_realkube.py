"""`gpuplane why` with a team member's credentials on the real control plane: a token that may read
only its own namespace gets an answer, and is told what it could not read (no raw 403)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from manifests import cluster_queue, local_queue, resource_flavor, workload
from realkube import ROOT, RealKube

pytestmark = pytest.mark.timeout(120)

NAMESPACE_READER = {
    "apiVersion": "rbac.authorization.k8s.io/v1",
    "kind": "Role",
    "metadata": {"name": "queue-user"},
    "rules": [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["workloads", "localqueues"],
            "verbs": ["get", "list"],
        },
        {"apiGroups": ["", "batch"], "resources": ["pods", "jobs"], "verbs": ["get", "list"]},
    ],
}


def _binding(kind: str, role: str, user: str) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": f"{kind}Binding",
        "metadata": {"name": f"{role}-{user}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }


def _why(kube: RealKube, user: str, ns: str, name: str) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(
        build_app(),
        ["why", "--kubeconfig", str(kube.user_kubeconfig(user)), "-n", ns, name, "-o", "json"],
    )
    answer = json.loads(result.stdout) if result.exit_code == 0 else {}
    return result.exit_code, answer, result.stderr


@pytest.fixture
def team(real_kube: RealKube) -> tuple[RealKube, str, str]:
    """A namespace with a queue, a Workload that asks for more than the quota, and the reason the
    controller recorded on it; alice may read only that namespace's queue objects."""
    kube = real_kube
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(ROOT / "deploy" / "crds"))
    for crd in ("workloads", "clusterqueues", "localqueues", "resourceflavors"):
        kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}.kueue.x-k8s.io", "--timeout=30s")
    ns = kube.namespace("why-scoped")
    cq = f"{ns}-cq"
    objects = [
        resource_flavor(f"{ns}-gpu").to_dict(),
        cluster_queue(cq).flavor(f"{ns}-gpu", **{"nvidia.com/gpu": 4}).to_dict(),
        local_queue("lq", ns, cq).to_dict(),
        workload("big", ns).queue("lq").podset(count=1, gpu=8).to_dict(),
        {**NAMESPACE_READER, "metadata": {"name": "queue-user", "namespace": ns}},
        {
            **_binding("Role", "queue-user", "alice"),
            "metadata": {"name": "queue-user-alice", "namespace": ns},
        },
    ]
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(objects))
    recorded = {
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "insufficient quota for nvidia.com/gpu: 8 requested, 4 in the queue",
                    "lastTransitionTime": "2025-01-01T00:00:00Z",
                }
            ]
        }
    }
    kube.kubectl(
        "-n", ns, "patch", "workloads.kueue.x-k8s.io", "big", "--subresource=status", "--type=merge",
        "-p", json.dumps(recorded),
    )  # fmt: skip
    yield kube, ns, cq
    kube.kubectl("delete", "clusterqueue", cq, f"resourceflavor/{ns}-gpu", "--ignore-not-found", check=False)


def test_a_namespace_scoped_token_gets_the_recorded_reason_and_what_it_could_not_read(
    team: tuple[RealKube, str, str],
) -> None:
    kube, ns, _ = team
    code, answer, stderr = _why(kube, "alice", ns, "big")
    assert code == 0, stderr
    # No refusal shown raw; the namespace's random name may itself hold "403".
    assert "403" not in stderr.replace(ns, "<ns>")
    assert answer["reason"] == "Pending"
    assert "4 in the queue" in answer["message"]
    assert answer["positionInClusterQueue"] is None
    assert {"nodes", "clusterqueues", "resourceflavors"} <= set(answer["unreadable"])
    assert "may not read" in stderr
    assert "clusterqueues" in stderr


def test_with_the_queue_configuration_readable_the_core_decides(team: tuple[RealKube, str, str]) -> None:
    kube, ns, cq = team
    role = f"{ns}-queue-viewer"
    viewer = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": role},
        "rules": [
            {
                "apiGroups": ["kueue.x-k8s.io"],
                "resources": ["clusterqueues", "resourceflavors", "cohorts", "workloadpriorityclasses"],
                "verbs": ["get", "list"],
            }
        ],
    }
    binding = _binding("ClusterRole", role, "alice")
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([viewer, binding]))
    try:
        code, answer, stderr = _why(kube, "alice", ns, "big")
        assert code == 0, stderr
        assert answer["clusterQueue"] == cq
        assert answer["reason"] == "ExceedsMaxQuota"
        assert "clusterqueues" not in answer["unreadable"]
        assert "nodes" in answer["unreadable"]
    finally:
        kube.kubectl("delete", "clusterrole", role, "--ignore-not-found", check=False)
        kube.kubectl(
            "delete", "clusterrolebinding", binding["metadata"]["name"], "--ignore-not-found", check=False
        )
