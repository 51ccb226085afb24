"""Write each pending Workload's ETA on it, and keep it current without churning the API.

After every controller pass, :class:`EtaWriter` puts two annotations on each pending Workload
that has an estimate (:func:`gpuplane.insight.why.explain_all`):

* ``gpuplane.dev/eta``: the predicted start, RFC 3339 (``never`` when nothing but a fix helps);
* ``gpuplane.dev/eta-detail``: ``in 900s (600s-1200s); <basis>``.

A new estimate is written only when the predicted wait moved by more than 10 % (of the wait the
annotation promised, at least a minute), or the workload had none: an ETA that ticks down as
predicted is not rewritten every pass. Writes are merge patches of the annotations only.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Iterable
from typing import Any

from gpuplane.insight.why import Explanation
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.model import labels as keys
from gpuplane.model.fields import lenient_timestamp

log = logging.getLogger(__name__)

ETA_ANNOTATION = keys.ETA_ANNOTATION
DETAIL_ANNOTATION = keys.ETA_DETAIL_ANNOTATION
NEVER = "never"
MOVE = 0.10  # rewrite when the wait moved by more than this share
FLOOR_SECONDS = 60.0  # ... of at least this many seconds


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def needs_update(current: str | None, start: float | None, now: float) -> bool:
    """Whether the annotation ``current`` is stale for a predicted ``start`` (None: never)."""
    if current is None:
        return True
    if start is None or current == NEVER:
        return (start is None) != (current == NEVER)
    promised = lenient_timestamp(current)
    if promised is None:
        return True
    old_wait = max(0.0, promised - now)
    new_wait = max(0.0, start - now)
    return abs(new_wait - old_wait) > MOVE * max(old_wait, FLOOR_SECONDS)


def detail(found: Explanation) -> str:
    eta = found.eta
    if eta.seconds is None:
        return f"never by itself ({found.reason}); {eta.basis}"[:1000]
    return f"in {eta.seconds:.0f}s ({eta.low:.0f}s-{eta.high:.0f}s); {eta.basis}"[:1000]


class EtaWriter:
    """Annotates pending Workloads with their ETA (see the module docstring)."""

    def __init__(self, api: KubeApi, lookup: Callable[[str], dict[str, Any] | None]) -> None:
        self.api = api
        self.lookup = lookup  # workload key -> its object in the controller's cache
        self.written = 0
        self._last: dict[str, str] = {}  # what this writer wrote last, before the watch shows it

    def write(self, explanations: Iterable[Explanation], now: float) -> None:
        for found in explanations:
            obj = self.lookup(found.workload)
            if obj is None or obj.get("status", {}).get("admission"):
                continue
            annotations = obj.get("metadata", {}).get("annotations") or {}
            current = self._last.get(found.workload, annotations.get(ETA_ANNOTATION))
            start = None if found.eta.seconds is None else now + found.eta.seconds
            if not needs_update(current, start, now):
                continue
            ns, _, name = found.workload.partition("/")
            value = NEVER if start is None else _rfc3339(start)
            patch = {"metadata": {"annotations": {ETA_ANNOTATION: value, DETAIL_ANNOTATION: detail(found)}}}
            try:
                self.api.patch(k8s.WORKLOADS, name, patch, ns)
            except ApiError as err:
                log.info("could not write the ETA of %s: %s", found.workload, err)
                continue
            self.written += 1
            self._last[found.workload] = value
