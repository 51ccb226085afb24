"""GPU history and idle holders from Prometheus, read through its HTTP query API.

The numbers come from dcgm-exporter's ``DCGM_FI_DEV_GPU_UTIL`` (percent, one series per GPU).
dcgm-exporter labels a GPU with the pod that holds it, as ``pod``/``namespace`` or, when
Prometheus renamed them on scrape, ``exported_pod``/``exported_namespace``; both spellings
are read. From that one metric:

* installed: GPUs reporting (``count``);
* allocated: GPUs labelled with a pod;
* busy: the sum of utilization, in GPU-equivalents (two GPUs at 50 % are one busy GPU);
* per namespace: allocated and busy, as above, grouped by the pod's namespace;
* idle holders: pods whose GPUs averaged the lowest utilization over ``window``.

Answers are cached for ``ttl`` seconds and shared by every viewer, so the number of queries
does not grow with the number of open pages.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuplane.web.charts import Series

METRIC = "DCGM_FI_DEV_GPU_UTIL"
# One vector per GPU with `namespace` and `pod` set from whichever spelling was scraped.
_HELD = (
    f'label_replace(label_replace({METRIC}{{exported_pod!=""}}, "pod", "$1", "exported_pod", "(.+)"),'
    f' "namespace", "$1", "exported_namespace", "(.+)")'
    f' or {METRIC}{{exported_pod="", pod!=""}}'
)
INSTALLED = f"count({METRIC})"
ALLOCATED = f"count({_HELD})"
BUSY = f"sum({METRIC}) / 100"
ALLOCATED_BY_NAMESPACE = f"count by (namespace) ({_HELD})"
BUSY_BY_NAMESPACE = f"sum by (namespace) ({_HELD}) / 100"


def idle_holders_query(window: str) -> str:
    return f"avg by (namespace, pod) (avg_over_time(({_HELD})[{window}:1m]))"


class PrometheusError(Exception):
    """Prometheus could not be reached or refused the query."""


@dataclass(frozen=True, slots=True)
class IdleHolder:
    namespace: str
    pod: str
    gpus: int
    utilization: float  # mean percent over the window


@dataclass(frozen=True, slots=True)
class GpuHistory:
    """What the overview draws from Prometheus, at one moment."""

    series: tuple[Series, ...]
    # Per namespace over time: (namespace, allocated series, busy series).
    by_namespace: tuple[tuple[str, Series, Series], ...] = ()
    allocated_by_namespace: dict[str, float] = field(default_factory=dict)
    busy_by_namespace: dict[str, float] = field(default_factory=dict)
    idle_holders: tuple[IdleHolder, ...] = ()
    window: str = "6h"
    error: str = ""


class PrometheusClient:
    """The HTTP query API of one Prometheus server."""

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.timeout = timeout

    def _get(self, path: str, params: dict[str, str]) -> Any:
        query = urllib.parse.urlencode(params)
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=self.timeout) as response:
                body = json.loads(response.read())
        except (OSError, ValueError) as err:
            raise PrometheusError(f"{self.url}: {err}") from None
        if body.get("status") != "success":
            raise PrometheusError(str(body.get("error", "query failed")))
        return body["data"]["result"]

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        result: list[dict[str, Any]] = self._get("/api/v1/query", params)
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        result: list[dict[str, Any]] = self._get("/api/v1/query_range", params)
        return result


def _by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {str(r["metric"].get(label, "")): float(r["value"][1]) for r in result}


def gpu_history(client: PrometheusClient, now: float, window_seconds: float = 6 * 3600) -> GpuHistory:
    """The overview's Prometheus numbers for the ``window_seconds`` before ``now``."""
    start = now - window_seconds
    step = max(15.0, window_seconds / 120)
    series = []
    for name, expr in (("installed", INSTALLED), ("allocated", ALLOCATED), ("busy", BUSY)):
        result = client.query_range(expr, start, now, step)
        points = tuple((float(t), float(v)) for t, v in (result[0]["values"] if result else []))
        series.append(Series(name, points))
    per_namespace: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {}
    for name, expr in (("allocated", ALLOCATED_BY_NAMESPACE), ("busy", BUSY_BY_NAMESPACE)):
        for r in client.query_range(expr, start, now, step):
            points = tuple((float(t), float(v)) for t, v in r["values"])
            per_namespace.setdefault(str(r["metric"].get("namespace", "")), {})[name] = points
    by_namespace = tuple(
        (ns, Series(f"{ns} allocated", got.get("allocated", ())), Series(f"{ns} busy", got.get("busy", ())))
        for ns, got in sorted(per_namespace.items())
    )
    window = f"{round(window_seconds / 60)}m"
    idle = client.query(idle_holders_query(window), now)
    allocated_pods = {
        (str(r["metric"].get("namespace", "")), str(r["metric"].get("pod", ""))): int(float(r["value"][1]))
        for r in client.query(f"count by (namespace, pod) ({_HELD})", now)
    }
    holders = sorted(
        (
            IdleHolder(
                namespace=str(r["metric"].get("namespace", "")),
                pod=str(r["metric"].get("pod", "")),
                gpus=allocated_pods.get(
                    (str(r["metric"].get("namespace", "")), str(r["metric"].get("pod", ""))), 0
                ),
                utilization=float(r["value"][1]),
            )
            for r in idle
        ),
        key=lambda h: (h.utilization, -h.gpus, h.namespace, h.pod),
    )
    return GpuHistory(
        series=tuple(series),
        by_namespace=by_namespace,
        allocated_by_namespace=_by(client.query(ALLOCATED_BY_NAMESPACE, now), "namespace"),
        busy_by_namespace=_by(client.query(BUSY_BY_NAMESPACE, now), "namespace"),
        idle_holders=tuple(h for h in holders if h.gpus > 0),
        window=window,
    )


class HistoryCache:
    """One :func:`gpu_history` answer shared by every request for ``ttl`` seconds."""

    def __init__(
        self,
        client: PrometheusClient,
        *,
        ttl: float = 15.0,
        clock: Callable[[], float] = time.time,
        window_seconds: float = 6 * 3600,
    ) -> None:
        self.client = client
        self.ttl = ttl
        self.clock = clock
        self.window_seconds = window_seconds
        self._lock = threading.Lock()
        self._value: tuple[float, GpuHistory] | None = None

    def get(self) -> GpuHistory:
        now = self.clock()
        with self._lock:
            if self._value is not None and now - self._value[0] < self.ttl:
                return self._value[1]
            try:
                history = gpu_history(self.client, now, self.window_seconds)
            except PrometheusError as err:
                history = GpuHistory(series=(), error=str(err))
            self._value = (now, history)
            return history
