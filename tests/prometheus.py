"""Pytest plugin: a real Prometheus for the tests (registered in ``tests/conftest.py``).

``prometheus_factory(scrape_targets=[...], rule_files=[...], backfill=TEXT)`` starts Debian's
``/usr/bin/prometheus`` on a free loopback port with a 1 s scrape and rule-evaluation interval and
returns a :class:`Prometheus`. ``backfill`` is OpenMetrics text with explicit timestamps (seconds); it is
written into the TSDB with ``promtool tsdb create-blocks-from openmetrics`` before the server starts, so a
test can have hours of history without sleeping and then query at a chosen evaluation time.

Every server started is stopped when the test ends. Outside CI a missing binary skips the test; in CI
(``CI=true``) it fails, because ``scripts/test.sh`` installs the ``prometheus`` package.

Example::

    def test_busy(prometheus_factory):
        prom = prometheus_factory(backfill="gpu_busy 0.5 1700000000\\n# EOF\\n")
        assert prom.query("gpu_busy", time=1700000000)[0]["value"][1] == "0.5"
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

START_TIMEOUT = 60.0  # seconds until /-/ready answers
PROMETHEUS = "/usr/bin/prometheus"
PROMTOOL = "/usr/bin/promtool"


def _missing(what: str) -> None:
    message = f"{what} is not installed (scripts/test.sh installs the Debian package `prometheus`)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Prometheus:
    """One running Prometheus server: its URL, queries, and reload of its configuration."""

    def __init__(self, directory: Path, port: int, process: subprocess.Popen[bytes]) -> None:
        self.directory = directory
        self.url = f"http://127.0.0.1:{port}"
        self.process = process

    def _get(self, path: str, params: dict[str, Any]) -> Any:
        query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=30) as response:
            body = json.loads(response.read())
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus answered {body!r}")
        return body["data"]

    def query(self, expr: str, time: float | None = None) -> list[dict[str, Any]]:
        """The ``data.result`` of an instant query (``time`` in Unix seconds; default: now)."""
        result: list[dict[str, Any]] = self._get("/api/v1/query", {"query": expr, "time": time})["result"]
        return result

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """The ``data.result`` of a range query."""
        params = {"query": expr, "start": start, "end": end, "step": step}
        result: list[dict[str, Any]] = self._get("/api/v1/query_range", params)["result"]
        return result

    def wait_for(self, expr: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """Poll until ``expr`` returns at least one series (e.g. after the first scrapes); return it."""
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr)
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{expr!r} returned no series within {timeout} s")
            time.sleep(0.25)

    def reload(self) -> None:
        """Re-read the configuration and rule files (``POST /-/reload``)."""
        request = urllib.request.Request(f"{self.url}/-/reload", method="POST")
        with urllib.request.urlopen(request, timeout=30):
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


PrometheusFactory = Callable[..., Prometheus]


def _backfill(text: str, data: Path, directory: Path) -> None:
    if shutil.which(PROMTOOL) is None:
        _missing("promtool")
    source = directory / "backfill.om"
    source.write_text(text if text.rstrip().endswith("# EOF") else text.rstrip("\n") + "\n# EOF\n")
    result = subprocess.run(
        [PROMTOOL, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"promtool could not backfill: {result.stderr or result.stdout}")


@pytest.fixture
def prometheus_factory(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """Start real Prometheus servers for this test; all are stopped at its end."""
    if shutil.which(PROMETHEUS) is None:
        _missing("prometheus")
    started: list[Prometheus] = []

    def start(
        scrape_targets: Sequence[str] = (),
        rule_files: Sequence[Path] = (),
        backfill: str | None = None,
        retention: str = "30d",
    ) -> Prometheus:
        directory = tmp_path / f"prometheus-{len(started)}"
        data = directory / "data"
        data.mkdir(parents=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(path) for path in rule_files],
            "scrape_configs": [
                {
                    "job_name": f"target-{index}",
                    "honor_labels": True,
                    "static_configs": [{"targets": [target]}],
                }
                for index, target in enumerate(scrape_targets)
            ],
        }
        (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
        if backfill is not None:
            _backfill(backfill, data, directory)
        port = free_port()
        log = (directory / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={directory / 'prometheus.yml'}",
                f"--storage.tsdb.path={data}",
                f"--storage.tsdb.retention.time={retention}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--web.enable-lifecycle",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        server = Prometheus(directory, port, process)
        started.append(server)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if process.poll() is not None:
                raise AssertionError(
                    f"prometheus exited {process.returncode}: {(directory / 'prometheus.log').read_text()}"
                )
            try:
                with urllib.request.urlopen(f"{server.url}/-/ready", timeout=2) as response:
                    if response.status == 200:
                        return server
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"prometheus not ready within {START_TIMEOUT} s")
            time.sleep(0.2)

    try:
        yield start
    finally:
        for server in started:
            server.stop()
