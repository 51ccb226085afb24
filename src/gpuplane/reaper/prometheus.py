"""Utilization samples from Prometheus's HTTP query API, grouped by pod and GPU.

One instant query per metric, of a range selector (``METRIC[Ns]`` at ``time=now``): Prometheus returns
the raw stored samples, so the policy sees every sample dcgm-exporter produced, not a resampled series.
The pod is read from ``pod``/``namespace`` or, when the exporter's labels were renamed by a scrape with
``honor_labels: false``, ``exported_pod``/``exported_namespace``. A device is its ``UUID`` (or ``uuid``)
plus ``GPU_I_ID`` for a MIG instance, else ``gpu``.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass

from gpuplane.insight import idle

METRICS = (idle.GR_ENGINE_ACTIVE, idle.GPU_UTIL, idle.POWER_USAGE, idle.SM_ACTIVE)

PodKey = tuple[str, str]  # (namespace, pod)
Samples = dict[PodKey, dict[str, dict[str, list[idle.Sample]]]]  # pod -> device -> metric -> samples


class PrometheusError(Exception):
    """Prometheus could not be asked or did not answer with data."""


@dataclass(frozen=True, slots=True)
class PrometheusClient:
    url: str
    timeout: float = 30.0

    def query(self, expr: str, time: float) -> list[dict[str, object]]:
        """The ``data.result`` of an instant query at ``time`` (Unix seconds)."""
        query = urllib.parse.urlencode({"query": expr, "time": f"{time:.3f}"})
        try:
            with urllib.request.urlopen(
                f"{self.url.rstrip('/')}/api/v1/query?{query}", timeout=self.timeout
            ) as response:
                body = json.loads(response.read())
        except (OSError, ValueError) as err:
            raise PrometheusError(f"query {expr!r} failed: {err}") from err
        if not isinstance(body, dict) or body.get("status") != "success":
            raise PrometheusError(f"query {expr!r}: Prometheus answered {str(body)[:200]}")
        result = body.get("data", {}).get("result", [])
        return result if isinstance(result, list) else []

    def samples(self, now: float, lookback: float, metrics: Iterable[str] = METRICS) -> Samples:
        """Every sample of ``metrics`` in ``(now - lookback, now]``, by pod, device and metric."""
        out: Samples = {}
        seconds = max(1, round(lookback))
        for metric in metrics:
            for series in self.query(f"{metric}[{seconds}s]", now):
                labels = series.get("metric")
                values = series.get("values")
                if not isinstance(labels, dict) or not isinstance(values, list):
                    continue
                key = pod_of(labels)
                if key is None:
                    continue
                device = device_of(labels)
                got = out.setdefault(key, {}).setdefault(device, {}).setdefault(metric, [])
                got.extend(idle.Sample(float(t), float(v)) for t, v in values)
        for devices in out.values():
            for by_metric in devices.values():
                for samples in by_metric.values():
                    samples.sort(key=lambda s: s.time)
        return out


def pod_of(labels: dict[str, str]) -> PodKey | None:
    pod = labels.get("pod") or labels.get("exported_pod")
    namespace = labels.get("namespace") or labels.get("exported_namespace")
    if not pod or not namespace:
        return None
    return namespace, pod


def device_of(labels: dict[str, str]) -> str:
    host = labels.get("Hostname") or labels.get("hostname", "")
    base = labels.get("UUID") or labels.get("uuid") or f"{host}/{labels.get('gpu', '?')}"
    instance = labels.get("GPU_I_ID")
    return f"{base}/mig-{instance}" if instance else base


def usage(samples: Samples, namespace: str, pod: str, gpus: int) -> idle.PodUsage:
    devices = samples.get((namespace, pod), {})
    return idle.PodUsage(
        namespace,
        pod,
        gpus,
        tuple(idle.DeviceSamples(gpu, series) for gpu, series in sorted(devices.items())),
    )
