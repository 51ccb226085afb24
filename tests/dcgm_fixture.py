"""A stand-in for NVIDIA's dcgm-exporter: serves its text format on loopback, with values set by tests.

The series look exactly like dcgm-exporter's (domain-facts §3): ``# HELP``/``# TYPE`` lines, then one
sample per GPU (or MIG instance) with the labels ``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
``modelName``, ``Hostname`` (or ``hostname``, as its main branch spells it), ``DCGM_FI_DRIVER_VERSION``,
``GPU_I_PROFILE``/``GPU_I_ID`` for MIG, and the Kubernetes mapping ``namespace``/``pod``/``container``.
With ``exported=True`` the mapping is spelled ``exported_namespace``/``exported_pod``/
``exported_container``, as a Prometheus scrape without ``honor_labels`` renames them.

Example::

    with DcgmExporter() as dcgm:
        dcgm.set("DCGM_FI_DEV_GPU_UTIL", 42, gpu=0, node="n1", namespace="team-a", pod="train-0")
        prometheus_factory(scrape_targets=[dcgm.target])
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

HELP = {
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", "Ratio of time the graphics engine is active."),
    "DCGM_FI_PROF_SM_ACTIVE": ("gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("gauge", "Ratio of cycles the device memory interface is active."),
}
DRIVER = "535.104.05"
MODEL = "NVIDIA H100 80GB HBM3"


@dataclass
class Series:
    metric: str
    labels: dict[str, str]
    value: float


@dataclass
class DcgmExporter:
    """An HTTP server on 127.0.0.1 answering ``GET /metrics`` like dcgm-exporter."""

    hostname_label: str = "Hostname"
    series: dict[tuple[str, tuple[tuple[str, str], ...]], Series] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                body = exporter.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def target(self) -> str:
        """``host:port`` for a Prometheus scrape configuration."""
        return f"127.0.0.1:{self._server.server_address[1]}"

    def set(
        self,
        metric: str,
        value: float,
        *,
        gpu: int,
        node: str,
        namespace: str | None = None,
        pod: str | None = None,
        container: str = "main",
        mig_profile: str | None = None,
        mig_instance: int | None = None,
        exported: bool = False,
    ) -> None:
        """Set one series; a GPU (or MIG instance) with no pod has no Kubernetes labels."""
        labels = {
            "gpu": str(gpu),
            "UUID": f"GPU-{node}-{gpu:02d}",
            "pci_bus_id": f"00000000:{gpu + 0x10:02X}:00.0",
            "device": f"nvidia{gpu}",
            "modelName": MODEL,
            self.hostname_label: node,
            "DCGM_FI_DRIVER_VERSION": DRIVER,
        }
        if mig_profile is not None:
            labels["GPU_I_PROFILE"] = mig_profile
            labels["GPU_I_ID"] = str(mig_instance if mig_instance is not None else 0)
        if pod is not None:
            prefix = "exported_" if exported else ""
            labels[f"{prefix}container"] = container
            labels[f"{prefix}namespace"] = namespace or "default"
            labels[f"{prefix}pod"] = pod
        key = (metric, tuple(sorted((k, v) for k, v in labels.items() if k not in _POD_LABELS)))
        with self._lock:
            self.series[key] = Series(metric, labels, value)

    def clear(self) -> None:
        with self._lock:
            self.series.clear()

    def render(self) -> str:
        with self._lock:
            by_metric: dict[str, list[Series]] = {}
            for item in self.series.values():
                by_metric.setdefault(item.metric, []).append(item)
        lines: list[str] = []
        for metric in sorted(by_metric):
            kind, text = HELP.get(metric, ("gauge", metric))
            lines += [f"# HELP {metric} {text}", f"# TYPE {metric} {kind}"]
            for item in by_metric[metric]:
                labels = ",".join(f'{k}="{v}"' for k, v in item.labels.items())
                lines.append(f"{metric}{{{labels}}} {item.value:g}")
        return "\n".join(lines) + "\n"

    def start(self) -> DcgmExporter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> DcgmExporter:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()


_POD_LABELS = {"container", "namespace", "pod", "exported_container", "exported_namespace", "exported_pod"}
