"""How the long-running commands log: plain text for a terminal, or one JSON object per line.

``--log-format json`` gives each record as one line with ``time`` (RFC 3339, UTC), ``level``,
``logger`` and ``message``, plus the structured fields a record carries in ``extra`` (the
controller's lines about a workload carry ``event`` and ``workload``; leadership lines ``event``,
``lease`` and ``identity``), and ``exception`` with the traceback when there is one. Log
collectors (Loki, Cloud Logging, Elasticsearch) parse such lines without a pattern.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in the message are escaped)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in record.__dict__.items():
            if name not in _STANDARD and not name.startswith("_"):
                entry[name] = value if isinstance(value, str | int | float | bool | None) else str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure(level: str, fmt: LogFormat) -> None:
    """Send the root logger's records to standard error at ``level``, in ``fmt``."""
    handler = logging.StreamHandler()
    if fmt == LogFormat.JSON:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
