"""The controller's metrics, ETA annotations and pod queue labels, on the real control plane.

One namespace: a node of 8 GPUs (selected by this test's flavor only), a ClusterQueue of 4 GPUs, a
suspended Job of 2 GPUs (admitted and released by the controller), a Workload of 4 GPUs that waits
for the Job's quota, and one of 8 GPUs that never fits the queue.
"""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from dcgm_fixture import DcgmExporter
from gpuplane.cli.app import build_app
from gpuplane.cli.insight import Attached, InsightOptions, attach
from gpuplane.k8s.api import KubeApi
from gpuplane.k8s.controller import Controller, ControllerConfig
from gpuplane.k8s.eta_writer import DETAIL_ANNOTATION, ETA_ANNOTATION, NEVER
from gpuplane.model.fields import lenient_timestamp
from manifests import cluster_queue, documents, job, local_queue, node, pod_spec, resource_flavor, workload
from prometheus import PrometheusFactory
from realkube import RealKube

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
CQ_LABEL = "kueue.x-k8s.io/cluster-queue-name"
LQ_LABEL = "kueue.x-k8s.io/local-queue-name"


def _wait(predicate: Callable[[], Any], timeout: float = 60.0, step: Callable[[], None] | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if step is not None:
            step()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.25)


@pytest.fixture
def running(real_kube: RealKube) -> Iterator[tuple[RealKube, str, str, Controller, Attached]]:
    real_kube.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    ns = real_kube.namespace("insight")
    cq = f"{ns}-cq"
    pool = {"gpuplane.test/pool": ns}
    real_kube.kubectl(
        "apply",
        "-f",
        "-",
        input=documents(
            node(f"{ns}-n1")
            .allocatable(gpu=8, cpu="64", memory="256Gi", pods=110)
            .label("gpuplane.test/pool", ns),
            resource_flavor(f"{ns}-gpu").set("spec.nodeLabels", pool),
            cluster_queue(cq).flavor(f"{ns}-gpu", gpu=4, cpu="64"),
            local_queue("lq", ns, cq),
            job("train", ns)
            .queue("lq")
            .set("spec.suspend", True)
            .pod(pod_spec().container(gpu=2, cpu="1", limits={"nvidia.com/gpu": 2}))
            .set("spec.template.spec.restartPolicy", "Never"),
        ),
    )
    client = real_kube.client()
    controller = Controller(
        KubeApi(client),
        ControllerConfig(leader_election=False, integrations=("Job",), dry_run_preemption=True),
    )
    attached = attach(controller, InsightOptions(metrics_port=0, host="127.0.0.1", write_eta=True))
    controller.start(wait=30)
    try:
        yield real_kube, ns, cq, controller, attached
    finally:
        controller.stop()
        attached.close()
        real_kube.kubectl("-n", ns, "delete", "jobs", "--all", "--wait=false", check=False)
        real_kube.kubectl("-n", ns, "delete", "pods", "--all", "--grace-period=0", "--force", check=False)
        real_kube.kubectl("-n", ns, "delete", "workloads,localqueues", "--all", "--wait=false", check=False)
        for kind, name in (("node", f"{ns}-n1"), ("clusterqueue", cq), ("resourceflavor", f"{ns}-gpu")):
            real_kube.kubectl("delete", kind, name, "--wait=false", check=False)
        client.close()


def get(kube: RealKube, *args: str) -> dict[str, Any]:
    return dict(json.loads(kube.kubectl("get", *args, "-o", "json").stdout))


def test_labels_etas_and_metrics_of_a_running_controller(
    running: tuple[RealKube, str, str, Controller, Attached],
) -> None:
    kube, ns, cq, controller, attached = running

    def released() -> bool:
        spec = get(kube, "-n", ns, "job", "train")["spec"]
        return not spec.get("suspend") and bool(spec["template"]["metadata"].get("labels", {}).get(CQ_LABEL))

    _wait(released, step=controller.reconcile)
    # Only now the others arrive: the Job holds 2 of the 4 GPUs.
    kube.kubectl(
        "apply",
        "-f",
        "-",
        input=documents(
            workload("next", ns).queue("lq").podset(gpu=4, cpu="1"),
            workload("never", ns).queue("lq").podset(gpu=8, cpu="1"),
        ),
    )
    labels = get(kube, "-n", ns, "job", "train")["spec"]["template"]["metadata"]["labels"]
    assert labels[CQ_LABEL] == cq
    assert labels[LQ_LABEL] == "lq"
    pods = _wait(lambda: get(kube, "-n", ns, "pods", "-l", "job-name=train")["items"])
    assert pods[0]["metadata"]["labels"][CQ_LABEL] == cq

    def annotated(name: str) -> dict[str, str]:
        return dict(get(kube, "-n", ns, "workload", name)["metadata"].get("annotations") or {})

    waiting = _wait(lambda: annotated("next").get(ETA_ANNOTATION), step=controller.reconcile)
    start = lenient_timestamp(waiting)
    assert start is not None
    assert start >= time.time() - 120  # a start in the future (modulo clock rounding), not a stale date
    assert "ahead in ClusterQueue" in annotated("next")[DETAIL_ANNOTATION]
    assert _wait(lambda: annotated("never").get(ETA_ANNOTATION)) == NEVER
    assert attached.worker.wait_idle()
    written = attached.eta_writer.written if attached.eta_writer else 0
    controller.reconcile()
    assert attached.worker.wait_idle()
    controller.reconcile()
    assert attached.worker.wait_idle()
    assert attached.eta_writer is not None
    assert attached.eta_writer.written == written  # nothing moved: nothing rewritten

    # gpuplane why on the same cluster, by the names a user knows. No webhook runs here, so the
    # job's pods keep the default scheduler's name: why says so (whoever bound them, kube-scheduler
    # may take the next one), and names the fix.
    pod = pods[0]["metadata"]["name"]
    foreign = "BoundByAnotherScheduler"
    for target, want in (("job/train", foreign), (f"pod/{pod}", foreign), ("next", "WaitingForQuota")):
        run = CliRunner().invoke(
            build_app(), ["why", target, "-n", ns, "--kubeconfig", str(kube.kubeconfig), "-o", "json"]
        )
        assert run.exit_code == 0, run.stderr
        doc = json.loads(run.stdout)
        assert doc["reason"] == want, (target, doc)
        if want == foreign:
            assert "webhook" in doc["fix"], doc
        if want == "WaitingForQuota":
            holders = {b["name"] for b in doc["blockers"] if b["kind"] == "Workload"}
            assert any(h.startswith(f"{ns}/job-train-") for h in holders), doc["blockers"]

    assert attached.metrics_server is not None
    with urllib.request.urlopen(
        f"http://127.0.0.1:{attached.metrics_server.server_port}/metrics", timeout=10
    ) as r:
        text = r.read().decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("kueue_admitted_workloads_total", (("cluster_queue", cq),))] == 1
    assert samples[("kueue_pending_workloads", (("cluster_queue", cq), ("status", "inadmissible")))] == 2
    assert samples[("gpuplane_controller_pass_duration_seconds_count", ())] >= 3


def test_dcgm_series_of_a_real_pod_join_its_queue_in_prometheus(
    running: tuple[RealKube, str, str, Controller, Attached], prometheus_factory: PrometheusFactory
) -> None:
    """The Job's pod on the real API server, the controller's metrics, DCGM telemetry for that pod
    (exported_* spelling) and the recording rules in a real Prometheus: its 2 GPUs at 30 % and 50 %
    are 0.8 busy GPUs of 2 allocated, under the pod's ClusterQueue."""
    kube, ns, cq, controller, attached = running

    def bound() -> list[dict[str, Any]]:
        pods = get(kube, "-n", ns, "pods", "-l", "job-name=train")["items"]
        return [p for p in pods if p.get("spec", {}).get("nodeName")]

    pods = _wait(bound, step=controller.reconcile, timeout=90)
    pod = pods[0]["metadata"]["name"]
    controller.reconcile()  # a pass that sees the bound pod
    assert attached.metrics_server is not None
    with DcgmExporter() as dcgm:
        for gpu, util in ((0, 30), (1, 50)):
            dcgm.set(
                "DCGM_FI_DEV_GPU_UTIL", util, gpu=gpu, node=f"{ns}-n1", namespace=ns, pod=pod, exported=True
            )
        prom = prometheus_factory(
            scrape_targets=[f"127.0.0.1:{attached.metrics_server.server_port}", dcgm.target],
            rule_files=[ROOT / "deploy" / "prometheus" / "rules.yaml"],
        )
        expr = f'gpuplane:pod_gpus_busy:sum{{namespace="{ns}",pod="{pod}"}}'
        deadline = time.monotonic() + 45
        while True:
            result = prom.query(expr)
            if result and abs(float(result[0]["value"][1]) - 0.8) < 1e-9:
                break
            assert time.monotonic() < deadline, f"{expr} gave {result}"
            time.sleep(0.25)
        assert result[0]["metric"]["cluster_queue"] == cq
        assert result[0]["metric"]["local_queue"] == "lq"
        (allocated,) = prom.wait_for(f'gpuplane:cluster_queue_gpus_allocated:sum{{cluster_queue="{cq}"}}')
        assert float(allocated["value"][1]) == 2.0
