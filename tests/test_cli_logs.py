"""The log formats of the long-running commands (gpuplane.cli.logs)."""

from __future__ import annotations

import json
import logging
import sys

from gpuplane.cli.logs import JsonFormatter


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("gpuplane.k8s.controller", logging.INFO, "f.py", 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_record_is_one_json_line_with_its_extra_fields() -> None:
    line = JsonFormatter().format(
        _record("workload %s admitted:\nby %s", "ns/w", "cq", event="admitted", workload="ns/w")
    )
    assert "\n" not in line
    entry = json.loads(line)
    assert entry.pop("time").endswith("+00:00")
    assert entry == {
        "level": "INFO",
        "logger": "gpuplane.k8s.controller",
        "message": "workload ns/w admitted:\nby cq",
        "event": "admitted",
        "workload": "ns/w",
    }


def test_an_exception_and_odd_extras_stay_on_the_line() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, "f.py", 1, "failed", (), sys.exc_info())
    record.__dict__["nodes"] = {"n1": 2}
    entry = json.loads(JsonFormatter().format(record))
    assert "ValueError: boom" in entry["exception"]
    assert entry["nodes"] == "{'n1': 2}"
