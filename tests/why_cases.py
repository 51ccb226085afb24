"""The seed's "why is my pod pending" causes as cluster states, shared by the state-file and the
real-API-server tests of ``gpuplane why``.

Each case is a list of manifests (built with :mod:`manifests`) with one pending workload ``w`` in
namespace ``default`` (a Workload, or a Job whose Workload is named by the loader), plus what
``why`` must answer: the reason, blocker names and words the fix must contain.
"""

from __future__ import annotations

from dataclasses import dataclass

from manifests import (
    GPU,
    Manifest,
    PodSpec,
    cluster_queue,
    local_queue,
    namespace,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

MIG_3G = "nvidia.com/mig-3g.40gb"
MIG_1G = "nvidia.com/mig-1g.10gb"
CREATED = "2026-03-01T10:00:00Z"


@dataclass(frozen=True)
class WhyCase:
    id: str
    manifests: list[Manifest]
    want_reason: str
    want_blockers: set[tuple[str, str]]  # (kind, name) that must be among the blockers
    want_fix: tuple[str, ...]  # substrings of the fix
    want_detail: tuple[str, ...] = ()  # substrings of some blocker's detail
    target: str = "workload/w"


def gpu_node(name: str, gpus: int = 8, product: str = "NVIDIA-H100-80GB-HBM3") -> Manifest:
    return (
        node(name)
        .allocatable(gpu=gpus, cpu="64", memory="512Gi", pods=110)
        .label("nvidia.com/gpu.product", product)
        .label("nvidia.com/gpu.count", str(gpus))
        .label("kubernetes.io/hostname", name)
    )


def holder(name: str, gpus: int, cq: str = "team-a", ns: str = "default") -> Manifest:
    """An admitted (running) workload holding ``gpus`` whole GPUs of flavor ``default``."""
    return (
        workload(name, ns)
        .queue("lq")
        .created("2026-03-01T09:00:00Z")
        .podset(count=1, gpu=gpus, cpu="1")
        .admitted(
            cq,
            {
                "name": "main",
                "count": 1,
                "flavors": {GPU: "default", "cpu": "default"},
                "resourceUsage": {GPU: gpus, "cpu": "1"},
            },
        )
    )


def base(gpu_quota: int = 64, extra_resources: dict[str, object] | None = None) -> list[Manifest]:
    quotas: dict[str, object] = {"gpu": gpu_quota, "cpu": "100"}
    quotas.update(extra_resources or {})
    return [
        namespace("default"),
        resource_flavor("default"),
        cluster_queue("team-a").flavor("default", **quotas),
        local_queue("lq", "default", "team-a"),
    ]


def pending(count: int = 1, **requests: object) -> Manifest:
    return workload("w").queue("lq").created(CREATED).podset(count=count, **requests)


def _with_spec(count: int, spec: PodSpec) -> Manifest:
    return workload("w").queue("lq").created(CREATED).podset(count=count, spec=spec)


def cases() -> list[WhyCase]:
    return [
        WhyCase(
            "no-free-gpu",
            [*base(), gpu_node("n1"), holder("big", 8), pending(gpu=1, cpu="1")],
            "WaitingForGangCapacity",
            {("Workload", "default/big")},
            ("no free GPU",),
            ("holds 8 GPU on n1",),
        ),
        WhyCase(
            "device-plugin-missing",
            [
                *base(),
                node("n1")
                .allocatable(cpu="64", memory="512Gi", pods=110)
                .label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
                .label("nvidia.com/gpu.count", "8"),
                pending(gpu=1, cpu="1"),
            ],
            "NoNodeAdvertisesResource",
            {("Node", "n1")},
            ("device plugin", "n1"),
            ("no device plugin advertises",),
        ),
        WhyCase(
            "taint-without-toleration",
            [*base(), gpu_node("n1").taint("dedicated", "ml", "NoSchedule"), pending(gpu=1, cpu="1")],
            "UntoleratedTaint",
            {("Node", "n1")},
            ("tolerations", "key: dedicated", "value: ml", "effect: NoSchedule"),
            ("dedicated=ml:NoSchedule",),
        ),
        WhyCase(
            "selector-label-no-node-has",
            [
                *base(),
                gpu_node("n1"),
                _with_spec(
                    1, pod_spec().container(gpu=1, cpu="1").node_selector("nvidia.com/gpu.product", "A100")
                ),
            ],
            "NoNodeMatchesSelector",
            {("NodeSelector", "nvidia.com/gpu.product=A100")},
            ("NVIDIA-H100-80GB-HBM3",),
            ("they have nvidia.com/gpu.product in {NVIDIA-H100-80GB-HBM3}",),
        ),
        WhyCase(
            "quota-exhausted-by-borrower",
            [
                namespace("default"),
                namespace("team-b"),
                resource_flavor("default"),
                cluster_queue("team-a").cohort("org").flavor("default", gpu=4, cpu="100"),
                cluster_queue("team-b").cohort("org").flavor("default", gpu=4, cpu="100"),
                local_queue("lq", "default", "team-a"),
                local_queue("lq", "team-b", "team-b"),
                holder("a1", 2, "team-a"),
                holder("b1", 6, "team-b", ns="team-b"),
                pending(gpu=4, cpu="1"),
            ],
            "WaitingForQuota",
            {("Workload", "default/a1"), ("ClusterQueue", "team-b"), ("Workload", "team-b/b1")},
            ("reclaimWithinCohort", "team-a"),
            ("borrows 2 nvidia.com/gpu from cohort org",),
        ),
        WhyCase(
            "waiting-for-gang-capacity",
            [*base(), gpu_node("n1"), gpu_node("n2"), holder("half", 4), pending(count=2, gpu=8, cpu="1")],
            "WaitingForGangCapacity",
            {("Workload", "default/half")},
            ("all 2 pods must start together",),
        ),
        WhyCase(
            "fragmented",
            [
                *base(),
                gpu_node("n1"),
                gpu_node("n2"),
                holder("x1", 5),
                holder("x2", 6),
                pending(gpu=4, cpu="1"),
            ],
            "Fragmented",
            {("Node", "n1"), ("Workload", "default/x1")},
            ("one preemption makes room", "default/x1", "n1"),
            ("would fit after preempting workload default/x1",),
        ),
        WhyCase(
            "mig-profile-no-node-offers",
            [
                *base(extra_resources={MIG_3G: 4}),
                node("n1")
                .allocatable(cpu="64", memory="512Gi", pods=110, **{MIG_1G: 7})
                .label("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")
                .label("nvidia.com/gpu.memory", "81920")
                .label("nvidia.com/gpu.count", "1"),
                pending(cpu="1", **{MIG_3G: 1}),
            ],
            "NoNodeAdvertisesResource",
            {("Resource", MIG_3G), ("Node", "n1")},
            ("MIG profile", MIG_1G, "nvidia.com/mig.config"),
            ("no node offers this MIG profile",),
        ),
    ]
