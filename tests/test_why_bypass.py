"""`gpuplane why` on work that went around gpuplane: an admitted workload whose pods another
scheduler bound (state files), and a queued job created unsuspended that has no Workload (a live
cluster: the double, or the real control plane with ``GPUPLANE_E2E_KUBECONFIG``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from apiserver.fixtures import manifest
from controller_harness import E2E_LABEL, Scene, wait_until
from gpuplane.cli.app import build_app
from gpuplane.insight.bypass import BOUND_ELSEWHERE
from gpuplane.k8s import api as k8s
from gpuplane.model import labels as keys
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from manifests import Manifest, documents, node, pod_spec
from why_cases import base, holder

PLACEMENT = json.dumps({"main": [["n1", "0,1,2,3"], ["n1", "4,5,6,7"]]})


def bound_pod(name: str, node_name: str, scheduler: str | None) -> Manifest:
    pod = Manifest("v1", "Pod", name, "default").label(keys.KUEUE_WORKLOAD_LABEL, "w")
    pod.body["spec"] = pod_spec().container(gpu=4, cpu="1").to_dict()
    pod.set("spec.nodeName", node_name).set("status.phase", "Running")
    if scheduler is not None:
        pod.set("spec.schedulerName", scheduler)
    return pod


def gang_state(*pods: Manifest, placement: str | None = PLACEMENT) -> str:
    """An admitted 2-pod gang ``w`` (4 GPUs a pod) planned on n1, two 8-GPU nodes, and its pods."""
    wl = holder("w", 8).set("spec.podSets[0].count", 2)
    wl.set("status.admission.podSetAssignments[0].count", 2)
    if placement is not None:
        wl.annotate(PLACEMENT_ANNOTATION, placement)
    nodes = [node(n).allocatable(cpu="64", pods="110", gpu=8) for n in ("n1", "n2")]
    return documents(*base(), *nodes, wl, *pods)


def why_json(tmp_path: Path, text: str) -> dict[str, object]:
    path = tmp_path / "state.yaml"
    path.write_text(text)
    result = CliRunner().invoke(build_app(), ["why", "w", "-f", str(path), "-o", "json"])
    assert result.exit_code == 0, result.stderr
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


@pytest.mark.parametrize(
    ("pods", "placement", "want_reason", "want_blockers"),
    [
        pytest.param(
            [bound_pod("p0", "n1", "gpuplane"), bound_pod("p1", "n1", "gpuplane")],
            PLACEMENT,
            "Admitted",
            [],
            id="placed-by-gpuplane",
        ),
        pytest.param(
            [bound_pod("p0", "n1", "gpuplane"), bound_pod("p1", "n2", "default-scheduler")],
            PLACEMENT,
            BOUND_ELSEWHERE,
            ["default/p1"],
            id="one-pod-bound-by-kube-scheduler",
        ),
        pytest.param(
            [bound_pod("p0", "n1", "default-scheduler"), bound_pod("p1", "n1", "default-scheduler")],
            None,
            BOUND_ELSEWHERE,
            ["default/p0", "default/p1"],
            id="no-placement-recorded-scheduler-name-tells",
        ),
        pytest.param(
            [bound_pod("p0", "n1", "gpuplane"), bound_pod("p1", "n2", "gpuplane")],
            PLACEMENT,
            BOUND_ELSEWHERE,
            ["default/p1"],
            id="bound-off-the-placement",
        ),
        pytest.param(
            [bound_pod("p0", "n1", None), bound_pod("p1", "n1", None)],
            PLACEMENT,
            "Admitted",
            [],
            id="no-scheduler-name-not-judged",
        ),
    ],
)
def test_an_admitted_workload_whose_pods_another_scheduler_bound(
    tmp_path: Path, pods: list[Manifest], placement: str | None, want_reason: str, want_blockers: list[str]
) -> None:
    doc = why_json(tmp_path, gang_state(*pods, placement=placement))
    assert doc["reason"] == want_reason
    blockers = doc["blockers"]
    assert isinstance(blockers, list)
    assert [b["name"] for b in blockers] == want_blockers
    assert all(b["kind"] == "Pod" for b in blockers)
    if want_blockers:
        assert "webhook" in str(doc["fix"])
        assert "docs/deploy.md" in str(doc["fix"])
        assert "bound by another scheduler" in str(doc["message"])
    else:
        assert doc["fix"] == "nothing to fix"


# --- a queued job created unsuspended, on a live cluster --------------------------------------------


@pytest.mark.timeout(90)
def test_why_says_a_job_created_unsuspended_bypassed_gpuplane(scene: Scene) -> None:
    """The namespace is taken out of the registered webhook's reach (as in a cluster without it), so
    the Job is stored as written: queued, unsuspended. No Workload is made for it; ``why`` says
    it went around gpuplane and how to fix that, for the job and for its pod."""
    scene.setup(nodes=1)
    scene.api.request(
        "PATCH",
        k8s.NAMESPACES.path(None, scene.namespace),
        body={"metadata": {"labels": {E2E_LABEL: None}}},
        content_type="application/merge-patch+json",
    )
    scene.job_controller()
    scene.controller(leader_election=False)
    built = scene.job("bypass", gpus=1)
    built.body["spec"].pop("suspend")
    scene.kubectl("apply", "-f", "-", input=manifest(built.to_dict()))  # not Scene.submit: no webhook
    assert not scene.jobs()["bypass"]["spec"].get("suspend")
    wait_until(lambda: scene.pods("bypass"), 30, "the Job controller runs the unsuspended job")

    for ref in ("job/bypass", f"pod/{scene.pods('bypass')[0]['metadata']['name']}"):
        result = CliRunner().invoke(
            build_app(), ["why", ref, "-n", scene.namespace, "--kubeconfig", scene.kubeconfig]
        )
        assert result.exit_code == 2, result.output
        assert f"Job {scene.namespace}/bypass bypassed gpuplane" in result.stderr
        assert "created unsuspended" in result.stderr
        assert "webhook" in result.stderr
        assert "is it queued" not in result.stderr
    assert "bypass" not in scene.workloads()


def test_why_keeps_its_plain_answer_for_a_job_that_names_no_queue(scene: Scene) -> None:
    scene.setup(nodes=1)
    built = scene.job("free", gpus=1)
    built.body["spec"].pop("suspend")
    built.body["metadata"]["labels"].pop(keys.QUEUE_NAME_LABEL)
    built.body["spec"]["parallelism"] = 0  # nothing runs: only the Job object matters here
    scene.kubectl("apply", "-f", "-", input=manifest(built.to_dict()))
    result = CliRunner().invoke(
        build_app(), ["why", "job/free", "-n", scene.namespace, "--kubeconfig", scene.kubeconfig]
    )
    assert result.exit_code == 2
    assert "is it queued" in result.stderr
    assert "bypassed" not in result.stderr
