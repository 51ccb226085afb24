"""Seed the controller's runtime history from Prometheus, where kube-state-metrics exports Jobs.

kube-state-metrics exports, for each Job, ``kube_job_status_start_time`` (when its pods were last
started: a Job resumed from suspension gets a new start) and ``kube_job_status_completion_time``
(set when it completed successfully). Each Job that shows both within the history's retention gives
one :class:`~gpuplane.insight.runtime_history.RuntimeSample`: its namespace and job name (without
generated suffixes) are known; its queue, priority class and pod-set shape are not (empty), so it
teaches the ETA of its job name and its team, not of a queue's shape.

The history is seeded once, when the controller starts with an empty one (the ConfigMap is new),
after the informers' first list has been learned: a Job whose Workload the controller already
learned from (same namespace and job name, finished within :data:`SAME_RUN_SECONDS`) is not counted
twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import urllib.parse
import urllib.request
from collections.abc import Iterable
from typing import Any

from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample, base_name

log = logging.getLogger(__name__)

START = "kube_job_status_start_time"
COMPLETION = "kube_job_status_completion_time"
SAME_RUN_SECONDS = 120.0  # a Workload's Finished and its Job's completion time are this close at most


def _query(url: str, expr: str, timeout: float) -> list[dict[str, Any]]:
    """The result vector of an instant query; ValueError when Prometheus answers with anything else."""
    full = f"{url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': expr})}"
    with urllib.request.urlopen(full, timeout=timeout) as response:
        body = json.loads(response.read())
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(body, dict) or body.get("status") != "success" or not isinstance(data, dict):
        raise ValueError(f"Prometheus answered {str(body)[:200]!r} to {expr}")
    result = data.get("result")
    if not isinstance(result, list):
        raise ValueError(f"Prometheus answered no vector to {expr}")
    return [r for r in result if isinstance(r, dict)]


def _by_job(result: Iterable[dict[str, Any]]) -> dict[tuple[str, str], float]:
    out = {}
    for r in result:
        labels, value = r.get("metric") or {}, r.get("value")
        ns, job = labels.get("namespace"), labels.get("job_name")
        if not ns or not job or not isinstance(value, list) or len(value) != 2:
            continue
        try:
            out[(str(ns), str(job))] = float(value[1])
        except (TypeError, ValueError):
            continue
    return out


def prometheus_samples(
    url: str, window_seconds: float, timeout: float = 30.0
) -> list[tuple[str, RuntimeSample]]:
    """The runtimes of the Jobs that completed within the last ``window_seconds`` as Prometheus
    saw them, with ids of their own. Raises OSError or ValueError when Prometheus cannot answer."""
    window = f"{max(1, int(window_seconds))}s"
    starts = _by_job(_query(url, f"max_over_time({START}[{window}])", timeout))
    ends = _by_job(_query(url, f"max_over_time({COMPLETION}[{window}])", timeout))
    out = []
    for (ns, job), end in sorted(ends.items()):
        start = starts.get((ns, job))
        if start is None or end < start:
            continue
        ident = "p" + hashlib.sha1(f"{ns}/{job}/{start}".encode(), usedforsecurity=False).hexdigest()[:15]
        out.append((ident, RuntimeSample(JobFeatures(ns, base_name(job), "", "", ""), end - start, end)))
    return out


def not_learned(
    seeds: Iterable[tuple[str, RuntimeSample]], learned: Iterable[RuntimeSample]
) -> list[tuple[str, RuntimeSample]]:
    """The ``seeds`` that are not runs already ``learned`` from their Workloads (same namespace and
    job name, finished within :data:`SAME_RUN_SECONDS` of each other)."""
    ends: dict[tuple[str, str], list[float]] = {}
    for s in learned:
        ends.setdefault((s.features.namespace, s.features.name), []).append(s.finished_at)
    return [
        (ident, s)
        for ident, s in seeds
        if not any(
            abs(t - s.finished_at) <= SAME_RUN_SECONDS
            for t in ends.get((s.features.namespace, s.features.name), ())
        )
    ]
