"""What a runtime is learned from: the features of a job that users repeat, and one observed runtime.

A finished workload leaves a :class:`RuntimeSample`: how long it ran, when it finished, and the
:class:`JobFeatures` a later job shares with it (its namespace, its job name without the suffix a
generator or a controller added, its queue, its priority class and the shape of its pod sets).
The controller collects samples as it sees workloads finish and keeps them across restarts; the
simulator draws jobs with such features; the runtime predictor of the ETA reads them, from the most
specific feature with enough samples down to the queue.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuplane.model.objects import Workload

# A workload name as the Job -> Workload derivation writes it: `<kind>-<name>` and 5 hex digits.
_WORKLOAD_SUFFIX = re.compile(r"-[0-9a-f]{5}$")
# Suffixes that make every run of one job name unique: a generateName's 5 characters, a date or a
# timestamp, a run number, a UUID.
_GENERATED = re.compile(
    r"(-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"  # a UUID
    r"|-\d{6,14}"  # a date or a timestamp
    r"|-(run-?)?\d{1,5}"  # a run number
    r"|-[bcdfghjklmnpqrstvwxz2456789]{5})+$"  # a generateName suffix (Kubernetes' alphabet: no vowels)
)


@dataclass(frozen=True, slots=True)
class JobFeatures:
    """What one job shares with the earlier runs of the same work."""

    namespace: str
    name: str  # the job's name without generated suffixes ("" when unknown)
    queue: str  # the ClusterQueue it is admitted to or queued in
    priority_class: str  # "" when none
    shape: str  # the pod sets' counts and per-pod accelerator requests, e.g. "4x nvidia.com/gpu=1"


@dataclass(frozen=True, slots=True)
class RuntimeSample:
    """One finished run: its features, how long it ran (seconds) and when it finished (seconds since
    the epoch, the observer's clock)."""

    features: JobFeatures
    seconds: float
    finished_at: float


def base_name(name: str) -> str:
    """``name`` without the suffixes generators add, so reruns of one job share it:
    ``train-resnet-x7k2p`` and ``train-resnet-20261201`` are both ``train-resnet``. A name that is
    nothing but such a suffix is kept whole."""
    stripped = _GENERATED.sub("", name)
    return stripped or name


def job_name(wl: Workload) -> str:
    """The name of the job behind a Workload, without generated suffixes: the owner's name where the
    Workload was derived from a job (``job-<name>-<hash>``), else the Workload's own name."""
    name = _WORKLOAD_SUFFIX.sub("", wl.name)
    kind, sep, rest = name.partition("-")
    if sep and rest and kind in _JOB_KINDS:
        name = rest
    return base_name(name)


_JOB_KINDS = frozenset({"job", "jobset", "pytorchjob", "trainjob", "rayjob", "leaderworkerset", "pod"})


def shape_of(wl: Workload) -> str:
    """The shape of a workload's pod sets: count and per-pod requests of each, in one string."""
    parts = []
    for ps in wl.pod_sets:
        requests = ",".join(f"{res}={q}" for res, q in sorted(ps.template.quota_requests.items()))
        parts.append(f"{ps.count}x {requests}" if requests else f"{ps.count}x")
    return "; ".join(parts)


def features_of(wl: Workload, queue: str) -> JobFeatures:
    """The features of ``wl``, queued in or admitted to ClusterQueue ``queue``."""
    return JobFeatures(wl.namespace, job_name(wl), queue, wl.priority_class or "", shape_of(wl))
