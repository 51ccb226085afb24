"""`gpuplane doctor`'s queue checks (gpuplane.insight.queue_doctor): each finds its problem, names the
objects, and stays quiet on a sound configuration; on a live cluster one bad object is reported and
the rest is still checked."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from gpuplane.insight.queue_doctor import queue_findings
from gpuplane.model.loader import load_state
from manifests import (
    Manifest,
    cluster_queue,
    cohort,
    documents,
    local_queue,
    namespace,
    resource_flavor,
    workload,
)
from realkube import ROOT, RealKube

GPU = "nvidia.com/gpu"


def _findings(*objects: Manifest) -> list[tuple[str, str, tuple[str, ...]]]:
    state = load_state([("cluster.yaml", documents(*objects))])
    return [(f.severity, f.check, f.objects) for f in queue_findings(state)]


def _sound() -> list[Manifest]:
    return [
        namespace("team-a"),
        resource_flavor("h100"),
        cohort("research"),
        cluster_queue("a").cohort("research").flavor("h100", cpu="64", **{GPU: 8}),
        local_queue("lq", "team-a", "a"),
        workload("w", "team-a").queue("lq").podset(count=1, cpu="1", gpu=1),
    ]


def test_a_sound_configuration_has_no_findings() -> None:
    assert _findings(*_sound()) == []


@pytest.mark.parametrize(
    ("extra", "want"),
    [
        pytest.param(
            [cluster_queue("b").flavor("a100", **{GPU: 8})],
            ("error", "flavor-missing", ("ClusterQueue/b", "ResourceFlavor/a100")),
            id="missing-flavor",
        ),
        pytest.param(
            [local_queue("orphan", "team-a", "nowhere")],
            ("error", "cluster-queue-missing", ("LocalQueue/team-a/orphan", "ClusterQueue/nowhere")),
            id="local-queue-to-nothing",
        ),
        pytest.param(
            [workload("mem", "team-a").queue("lq").podset(count=1, memory="1Gi", gpu=1)],
            ("error", "resource-uncovered", ("ClusterQueue/a", "Workload/team-a/mem")),
            id="uncovered-request",
        ),
        pytest.param(
            [cluster_queue("typo").cohort("reserch").flavor("h100", **{GPU: 1})],
            ("warning", "cohort-unknown", ("ClusterQueue/typo",)),
            id="cohort-typo",
        ),
    ],
)
def test_each_queue_check(extra: list[Manifest], want: tuple[str, str, tuple[str, ...]]) -> None:
    assert want in _findings(*_sound(), *extra)


def test_two_queues_sharing_an_undeclared_cohort_are_fine() -> None:
    # Kueue makes a cohort implicitly for the queues that name it: with two members it is deliberate.
    extra = [cluster_queue(n).cohort("shared").flavor("h100", **{GPU: 1}) for n in ("x", "y")]
    assert not [f for f in _findings(*_sound(), *extra) if f[1] == "cohort-unknown"]


@pytest.mark.timeout(120)
def test_doctor_reports_a_bad_object_and_checks_the_rest_on_a_real_cluster(real_kube: RealKube) -> None:
    kube = real_kube
    kube.kubectl("apply", "--server-side", "--force-conflicts", "-k", str(ROOT / "deploy" / "crds"))
    for crd in ("cohorts", "clusterqueues"):
        kube.kubectl("wait", "--for=condition=Established", f"crd/{crd}.kueue.x-k8s.io", "--timeout=30s")
    ns = kube.namespace("doctor")
    cycle = [cohort(f"{ns}-a", parent=f"{ns}-b").to_dict(), cohort(f"{ns}-b", parent=f"{ns}-a").to_dict()]
    typo = cluster_queue(f"{ns}-cq").flavor(f"{ns}-missing", **{GPU: 1}).to_dict()
    kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([*cycle, typo]))
    try:
        result = CliRunner().invoke(build_app(), ["doctor", "--kubeconfig", str(kube.kubeconfig)])
        assert result.exit_code == 1, result.output  # findings, not "cannot read the cluster" (2)
        lines = result.stdout.splitlines()
        assert any(
            line.startswith("[error] invalid-object: Cohort/") and "cohort cycle" in line for line in lines
        )
        assert any(f"flavor-missing: ClusterQueue/{ns}-cq" in line for line in lines)
    finally:
        names = [f"cohort/{ns}-a", f"cohort/{ns}-b", f"clusterqueue/{ns}-cq"]
        kube.kubectl("delete", *names, "--ignore-not-found", check=False)
