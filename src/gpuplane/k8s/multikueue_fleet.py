"""The shared parts of MultiKueue on a manager (:mod:`gpuplane.k8s.multikueue`): its settings, the
state its parts share (:class:`Fleet`), the keys it reads and writes, and small readers of objects."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.insight.dispatch import DispatchPolicy
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi
from gpuplane.k8s.informer import Cache
from gpuplane.k8s.multikueue_workers import (
    DEFAULT_WORKER_BURST,
    DEFAULT_WORKER_QPS,
    WorkerLink,
    WorkerSummary,
)
from gpuplane.model.fields import lenient_timestamp
from gpuplane.model.multikueue import MultiKueueConfig, WorkerCluster

MULTIKUEUE_CLUSTERS = k8s.MULTIKUEUE_CLUSTERS
MULTIKUEUE_CONFIGS = k8s.MULTIKUEUE_CONFIGS

# Annotations on the manager's Workload: gpuplane's dispatcher's data-locality selector
# (``key=value,...``: a worker's MultiKueueCluster must carry these labels) and spill-over order.
CLUSTER_SELECTOR_ANNOTATION = "gpuplane.dev/cluster-selector"
SPILL_ORDER_ANNOTATION = "gpuplane.dev/cluster-order"
# On a MultiKueueCluster: the worker's summary as JSON (WorkerSummary.to_json), refreshed every
# refresh_seconds: what the console and `gpuplane why` show of the fleet.
SUMMARY_ANNOTATION = "gpuplane.dev/worker-summary"
# On a copy: the QuotaReserved time of the manager's reservation it was made for.
RESERVATION_ANNOTATION = "gpuplane.dev/multikueue-reservation"


@dataclass(frozen=True, slots=True)
class MultiKueueSettings:
    """How the manager dispatches (Kueue's Configuration ``multiKueue`` block, and gpuplane's own).

    ``dispatcher``: gpuplane's, which asks each worker first and nominates one, is the default;
    Kueue's default is AllAtOnce. ``worker_qps``/``worker_burst``: the client's rate per worker."""

    origin: str = "multikueue"
    namespace: str = "gpuplane-system"  # where the workers' kubeconfig Secrets are
    worker_lost_timeout: float = 900.0
    gc_interval: float = 60.0
    dispatcher: DispatchPolicy = "gpuplane"
    worker_qps: float = DEFAULT_WORKER_QPS
    worker_burst: int = DEFAULT_WORKER_BURST
    refresh_seconds: float = 5.0  # how often the MultiKueue objects are listed again
    write_workers: int = 16  # workloads whose steps (writes) run at once
    watch_workers: bool = True  # keep the workers' objects by watches (else list them every pass)


@dataclass
class Fleet:
    """What the parts of MultiKueue share (owned by :class:`~gpuplane.k8s.multikueue.MultiKueue`):
    the manager's client and cache, the clocks, the settings, the links to the workers, the
    MultiKueue objects as last listed, each worker's summary, the problems found, and the counters."""

    api: KubeApi
    cache: Cache
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    event: Callable[[dict[str, Any], str, str, str], None]
    settings: MultiKueueSettings
    links: dict[str, WorkerLink] = field(default_factory=dict)
    clusters: dict[str, WorkerCluster] = field(default_factory=dict)
    cluster_objects: dict[str, dict[str, Any]] = field(default_factory=dict)
    configs: dict[str, MultiKueueConfig] = field(default_factory=dict)
    summaries: dict[str, WorkerSummary] = field(default_factory=dict)  # health, quota, usage, workloads
    problems: dict[str, str] = field(default_factory=dict)  # object -> its error, for the Active conditions
    counters: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(
            ("dispatched", "remote_jobs_created", "requeued", "gc_deleted", "status_conflicts_retried"), 0
        )
    )
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, name: str) -> None:
        with self.lock:
            self.counters[name] += 1


class FleetPart:
    """A part of MultiKueue (owns nothing itself): the shared :class:`Fleet`, and for short its
    client (``self.api``: the manager's), cache, clocks, Event recorder and settings."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.api = fleet.api
        self.cache = fleet.cache
        self.clock = fleet.clock
        self.monotonic = fleet.monotonic
        self.event = fleet.event
        self.settings = fleet.settings


def labels_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def annotation_of(wl: Mapping[str, Any], name: str) -> str:
    return str(((wl.get("metadata") or {}).get("annotations") or {}).get(name, ""))


def cluster_selector(wl: Mapping[str, Any]) -> dict[str, str]:
    text = annotation_of(wl, CLUSTER_SELECTOR_ANNOTATION)
    pairs = [p.split("=", 1) for p in text.split(",") if "=" in p]
    return {k.strip(): v.strip() for k, v in pairs}


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def spill_order(wl: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(c.strip() for c in annotation_of(wl, SPILL_ORDER_ANNOTATION).split(",") if c.strip())


def check_message(wl: Mapping[str, Any], check: str) -> str:
    for state in (wl.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            return str(state.get("message") or "")
    return ""


def reserved_stamp(wl: Mapping[str, Any]) -> str:
    for cond in (wl.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "QuotaReserved" and cond.get("status") == "True":
            return str(cond.get("lastTransitionTime", ""))
    return ""


def pending_since(wl: Mapping[str, Any], check: str, now: float) -> float:
    for state in (wl.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            return lenient_timestamp(state.get("lastTransitionTime")) or now
    return now
