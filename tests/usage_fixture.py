"""A small cluster with GPU pods of two teams, and the DCGM telemetry of those pods.

Shared by the exporter, recording-rule and chargeback tests; the expected numbers are computed by
hand in :data:`WANT` (GPU-equivalents):

============  =========================================  =========  ======================
team          pods (GPUs; device utilization)            allocated  busy
============  =========================================  =========  ======================
alpha         wa-0 (2; GPU_UTIL 50 %, 30 %)              4          0.8 + 1.6 = 2.4
              wa-1 (2; PROF 0.9, 0.7 beat GPU_UTIL 10 %)
beta          wb-0 (4; GPU_UTIL 100, 100, 0, 0 %)        4 + 3/7    2 + 0.5 x 3/7
              wm-0 (MIG 3g.40gb = 3/7; PROF 0.5)          + 1
              idle-0 (1; no telemetry: idle)
============  =========================================  =========  ======================

``wa-1`` and ``wm-0`` are reported with the ``exported_namespace``/``exported_pod`` spelling.
"""

from __future__ import annotations

from typing import Any

from dcgm_fixture import DcgmExporter
from manifests import (
    GPU,
    Manifest,
    cluster_queue,
    local_queue,
    namespace,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

MIG_3G = "nvidia.com/mig-3g.40gb"
CQ_LABEL = "kueue.x-k8s.io/cluster-queue-name"
LQ_LABEL = "kueue.x-k8s.io/local-queue-name"
WL_LABEL = "kueue.x-k8s.io/workload-name"

WANT = {
    "alpha": {"allocated": 4.0, "busy": 2.4},
    "beta": {"allocated": 4 + 3 / 7 + 1, "busy": 2 + 0.5 * 3 / 7},
}


def _pod(name: str, ns: str, node_name: str, wl: str, cq: str, **requests: object) -> Manifest:
    return (
        Manifest("v1", "Pod", name, ns)
        .label(CQ_LABEL, cq)
        .label(LQ_LABEL, "lq")
        .label(WL_LABEL, wl)
        .set("spec", pod_spec().container(cpu="1", **requests).to_dict())
        .set("spec.nodeName", node_name)
        .set("status.phase", "Running")
    )


def _admitted(name: str, ns: str, cq: str, *, count: int, resource: str, per_pod: int) -> Manifest:
    return (
        workload(name, ns)
        .queue("lq")
        .created("2026-03-01T09:00:00Z")
        .podset(count=count, cpu="1", **{resource: per_pod})
        .admitted(
            cq,
            {
                "name": "main",
                "count": count,
                "flavors": {resource: "default", "cpu": "default"},
                "resourceUsage": {resource: per_pod * count, "cpu": str(count)},
            },
        )
        .set(
            "status.conditions",
            [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "",
                    "lastTransitionTime": "2026-03-01T09:00:00Z",
                }
            ],
        )
    )


def manifests() -> list[Manifest]:
    h100 = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"}
    n1 = node("n1").allocatable(gpu=8, cpu="64", memory="512Gi", pods=110)
    n3 = node("n3").allocatable(gpu=8, cpu="64", memory="512Gi", pods=110)
    for key, value in h100.items():
        n1.label(key, value)
        n3.label(key, value)
    n2 = (
        node("n2")
        .allocatable(cpu="64", memory="512Gi", pods=110, **{MIG_3G: 2})
        .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")
        .label("nvidia.com/gpu.memory", "81920")
        .label("nvidia.com/gpu.count", "1")
    )
    quotas: dict[str, Any] = {"gpu": 16, "cpu": "100", MIG_3G: 2}
    return [
        namespace("ml-a").label("team", "alpha"),
        namespace("ml-b").label("team", "beta"),
        resource_flavor("default"),
        cluster_queue("cq-a").flavor("default", **quotas),
        cluster_queue("cq-b").flavor("default", **quotas),
        local_queue("lq", "ml-a", "cq-a"),
        local_queue("lq", "ml-b", "cq-b"),
        n1,
        n2,
        n3,
        _admitted("wa", "ml-a", "cq-a", count=2, resource=GPU, per_pod=2),
        _admitted("wb", "ml-b", "cq-b", count=1, resource=GPU, per_pod=4),
        _admitted("wm", "ml-b", "cq-b", count=1, resource=MIG_3G, per_pod=1),
        _admitted("idle", "ml-b", "cq-b", count=1, resource=GPU, per_pod=1),
        _pod("wa-0", "ml-a", "n1", "wa", "cq-a", gpu=2),
        _pod("wa-1", "ml-a", "n1", "wa", "cq-a", gpu=2),
        _pod("wb-0", "ml-b", "n1", "wb", "cq-b", gpu=4),
        _pod("wm-0", "ml-b", "n2", "wm", "cq-b", **{MIG_3G: 1}),
        _pod("idle-0", "ml-b", "n3", "idle", "cq-b", gpu=1),
        workload("queued", "ml-a")
        .queue("lq")
        .created("2026-03-01T10:00:00Z")
        .podset(count=1, cpu="1", gpu=16),
    ]


def set_telemetry(dcgm: DcgmExporter) -> None:
    """The DCGM series of the table above."""
    util = "DCGM_FI_DEV_GPU_UTIL"
    prof = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
    dcgm.set(util, 50, gpu=0, node="n1", namespace="ml-a", pod="wa-0")
    dcgm.set(util, 30, gpu=1, node="n1", namespace="ml-a", pod="wa-0")
    for gpu, active in ((2, 0.9), (3, 0.7)):
        dcgm.set(prof, active, gpu=gpu, node="n1", namespace="ml-a", pod="wa-1", exported=True)
        dcgm.set(util, 10, gpu=gpu, node="n1", namespace="ml-a", pod="wa-1", exported=True)
    for gpu, value in ((4, 100), (5, 100), (6, 0), (7, 0)):
        dcgm.set(util, value, gpu=gpu, node="n1", namespace="ml-b", pod="wb-0")
    dcgm.set(
        prof,
        0.5,
        gpu=0,
        node="n2",
        namespace="ml-b",
        pod="wm-0",
        mig_profile="3g.40gb",
        mig_instance=1,
        exported=True,
    )
    dcgm.set(
        util,
        0,
        gpu=0,
        node="n2",
        namespace="ml-b",
        pod="wm-0",
        mig_profile="3g.40gb",
        mig_instance=1,
        exported=True,
    )
    for gpu in range(8):  # n3: the idle pod's GPU reports nothing; the free GPUs report no pod
        if gpu:
            dcgm.set(util, 0, gpu=gpu, node="n3")
