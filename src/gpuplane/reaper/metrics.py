"""The reaper's metrics, on a registry the caller owns (no global state)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class ReaperMetrics:
    """``gpuplane_reaper_reclaimed_total`` counts reclaims; ``gpuplane_reaper_reclaimed_gpu_hours_total``
    adds the GPU-hours each reclaimed session had held idle (GPUs x idle time), so freed capacity and
    the idle time charged to a team before a reclaim can be read per namespace."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.reclaimed = Counter(
            "gpuplane_reaper_reclaimed",
            "Idle sessions reclaimed by the reaper",
            ["namespace", "owner_kind"],
            registry=self.registry,
        )
        self.gpu_hours = Counter(
            "gpuplane_reaper_reclaimed_gpu_hours",
            "GPU-hours held idle by sessions before the reaper reclaimed them",
            ["namespace", "owner_kind"],
            registry=self.registry,
        )
        self.warned = Counter(
            "gpuplane_reaper_warned",
            "Idle warnings given",
            ["namespace", "owner_kind"],
            registry=self.registry,
        )

    def record_reclaim(self, namespace: str, owner_kind: str, gpus: int, idle_seconds: float) -> None:
        self.reclaimed.labels(namespace, owner_kind).inc()
        self.gpu_hours.labels(namespace, owner_kind).inc(gpus * idle_seconds / 3600.0)
