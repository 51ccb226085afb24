"""One small GPU cluster that exercises every part of the web console.

Two teams share a cohort (``research``: ``team-a`` lends, ``team-b`` borrows), ``inference``
stands alone; ``h100`` nodes sit in two racks of one block, an ``a100`` node is MIG-partitioned.
Workloads: admitted ones (one bound as pods), a gang and fractional pods the plan places,
pending ones with different reasons, and one in a namespace most viewers may not see.
"""

from __future__ import annotations

from collections.abc import Mapping

from manifests import (
    Manifest,
    cluster_queue,
    cohort,
    documents,
    local_queue,
    namespace,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

T0 = "2026-03-01T08:00:00Z"
RACK = "rack"
BLOCK = "block"
MIG_LAYOUT = "gpuplane.dev/mig-layout"


def _at(minute: int) -> str:
    return f"2026-03-01T{8 + minute // 60:02d}:{minute % 60:02d}:00Z"


def h100(name: str, rack: str, gpu_label: str = "h100") -> Manifest:
    return (
        node(name)
        .allocatable(cpu="64", memory="512Gi", gpu=8, pods="110")
        .label("gpu", gpu_label)
        .label(RACK, rack)
        .label(BLOCK, "b1")
        .label("nvidia.com/gpu.product", "H100-SXM")
        .label("nvidia.com/gpu.memory", "81920")
    )


NAMESPACES = ("team-a", "team-b", "serving", "secret")


def scenario(prefix: str = "", namespaces: Mapping[str, str] | None = None) -> list[Manifest]:
    """The objects, in an order the API server accepts (namespaces and queues first).

    ``prefix`` goes before every cluster-scoped name (and the node label the flavors select);
    ``namespaces`` renames the four namespaces (which then are not created here), so one API
    server can hold the scenario next to other tests' objects.
    """
    ns = {n: n for n in NAMESPACES} | dict(namespaces or {})
    p = prefix
    objs: list[Manifest] = [namespace(n) for n in NAMESPACES] if namespaces is None else []
    objs += [
        resource_flavor(f"{p}h100").set("spec.nodeLabels", {"gpu": f"{p}h100"}),
        resource_flavor(f"{p}a100-mig").set("spec.nodeLabels", {"gpu": f"{p}a100"}),
        cohort(f"{p}research"),
        cluster_queue(f"{p}team-a")
        .cohort(f"{p}research")
        .flavor(f"{p}h100", cpu="200", gpu=12, gpu_fraction=2)
        .set("spec.resourceGroups[0].flavors[0].resources[1].lendingLimit", 8),
        cluster_queue(f"{p}team-b").cohort(f"{p}research").flavor(f"{p}h100", cpu="200", gpu=4),
        cluster_queue(f"{p}inference").flavor(
            f"{p}a100-mig", **{"cpu": "64", "nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2}
        ),
        local_queue("train", ns["team-a"], f"{p}team-a"),
        local_queue("train", ns["team-b"], f"{p}team-b"),
        local_queue("dev", ns["team-b"], f"{p}team-b"),
        local_queue("online", ns["serving"], f"{p}inference"),
        local_queue("hidden", ns["secret"], f"{p}team-b"),
    ]
    objs += [h100(f"{p}h100-{i}", rack, f"{p}h100") for i, rack in ((1, "r1"), (2, "r1"), (3, "r2"))]
    objs.append(
        node(f"{p}a100-1")
        .allocatable(cpu="64", **{"nvidia.com/mig-1g.10gb": 7, "nvidia.com/mig-3g.40gb": 2})
        .label("gpu", f"{p}a100")
        .label(RACK, "r2")
        .label(BLOCK, "b1")
        .label("nvidia.com/gpu.product", "A100-SXM4-80GB")
        .label("nvidia.com/gpu.memory", "81920")
        .annotate(MIG_LAYOUT, "0=" + ",".join(f"1g.10gb@{i}" for i in range(7)) + ";1=3g.40gb@0,3g.40gb@4")
    )
    a, b, serving, secret = (ns[n] for n in NAMESPACES)
    objs += [
        # team-a: a 2 x 4-GPU gang within one rack, and a fractional notebook trio.
        workload("pretrain", a)
        .queue("train")
        .created(_at(0))
        .podset("workers", 2, cpu="8", gpu=4)
        .topology(required=RACK),
        workload("notebooks", a)
        .queue("train")
        .created(_at(2))
        .podset("main", 3, cpu="1")
        .pod_annotation("gpuplane.dev/gpu-fraction", "0.5"),
        # team-b borrows: 6 GPUs on a 4-GPU quota.
        workload("finetune", b).queue("train").created(_at(3)).podset("main", 1, cpu="4", gpu=6),
        # Then more than anyone can get: these wait, with different reasons.
        workload("sweep-1", b).queue("train").created(_at(10)).podset("main", 2, cpu="2", gpu=4),
        workload("sweep-2", b).queue("train").created(_at(11)).podset("main", 1, cpu="2", gpu=2),
        workload("debug", b).queue("dev").created(_at(12)).podset("main", 1, cpu="1", gpu=1),
        workload("huge", a).queue("train").created(_at(5)).podset("main", 4, cpu="8", gpu=8),
        workload("secret-job", secret).queue("hidden").created(_at(20)).podset("main", 1, cpu="1", gpu=2),
        # inference: MIG slices.
        workload("llm-small", serving)
        .queue("online")
        .created(_at(1))
        .podset("main", 3, **{"cpu": "2", "nvidia.com/mig-1g.10gb": 1}),
        workload("llm-big", serving)
        .queue("online")
        .created(_at(4))
        .podset("main", 3, **{"cpu": "4", "nvidia.com/mig-3g.40gb": 1}),
    ]
    return objs


def scenario_yaml() -> str:
    return documents(*scenario())


def pod_bound(name: str, ns: str, node_name: str, workload_name: str, **requests: object) -> Manifest:
    """A pod already running on a node, as a workload's pod (holds its devices)."""
    return (
        Manifest("v1", "Pod", name, ns)
        .label("kueue.x-k8s.io/workload-name", workload_name)
        .set("spec", {**pod_spec().container(**requests).to_dict(), "nodeName": node_name})
        .set("status", {"phase": "Running"})
    )
