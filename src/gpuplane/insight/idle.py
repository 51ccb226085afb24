"""The idle policy: is an interactive session wasting its GPUs, and is a training job starved of data?

Pure: samples, the workload's class and annotations, settings and ``now`` go in; a decision comes out.
No clock, no network. The cluster reaper (:mod:`gpuplane.reaper`) and the simulator's reaper
(:mod:`gpuplane.sim.engine`) call the same functions.

Idle, for one GPU, means the *maximum* of its activity over the window stays below the threshold:

- ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a ratio, 0..1; also right for a MIG instance), else
- ``DCGM_FI_DEV_GPU_UTIL`` (a percentage, read as a ratio) where profiling metrics are absent, and
- optionally ``DCGM_FI_DEV_POWER_USAGE``: with a power threshold set, drawing that many watts is activity.

A pod is idle when every GPU it was given is idle; its idle time runs from its last activity (on any
GPU, or Kubeflow's last-activity annotation) to ``now``, and counts only time the samples cover.
**Missing metrics are never idle**: a pod with no samples, with samples for fewer GPUs than it holds,
or whose newest sample is stale, is kept, and the decision says so.

The decision for a session::

    not a session / opted out / no metrics / busy / idle < window ........ keep
    idle >= window, no warning yet ........................................ warn   (reclaimAt = now + grace)
    idle >= window, warned, now < reclaimAt ............................... warn   (same reclaimAt)
    idle >= window, warned, now >= reclaimAt .............................. reclaim
    grace == 0 ............................................................ reclaim at once
    keep-until in the future: reclaimAt is at least keep-until; no warning until it is within grace

The warning is remembered by the cluster, not here: the caller passes the ``reclaim-at`` annotation it
finds (``warned_reclaim_at``), so a decision depends on nothing but its inputs and is idempotent.

Times are epoch seconds compared at Prometheus's millisecond resolution, so a pod idle for exactly the
window is idle whatever rounding produced the two numbers.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum

from gpuplane.model import labels as keys

# --- names the cluster uses ---------------------------------------------------------------------------

OPT_OUT_ANNOTATION = keys.REAPER_OPT_OUT_ANNOTATION  # "disabled" opts a pod or its owner out
KEEP_UNTIL_ANNOTATION = keys.KEEP_UNTIL_ANNOTATION  # RFC 3339: no reclaim before this time
RECLAIM_AT_ANNOTATION = keys.RECLAIM_AT_ANNOTATION  # RFC 3339, written by the warning
SESSION_LABEL = keys.SESSION_LABEL  # "true" marks a pod or owner as an interactive session
INTERACTIVE_ANNOTATION = keys.INTERACTIVE_ANNOTATION  # "true" on a LocalQueue/ClusterQueue
KUBEFLOW_LAST_ACTIVITY = keys.KUBEFLOW_LAST_ACTIVITY_ANNOTATION  # RFC 3339, set by Kubeflow's culler
WINDOW_ANNOTATION = keys.REAPER_WINDOW_ANNOTATION
GRACE_ANNOTATION = keys.REAPER_GRACE_ANNOTATION
THRESHOLD_ANNOTATION = keys.REAPER_THRESHOLD_ANNOTATION

DATA_STALL_CONDITION = "gpuplane.dev/DataStallSuspected"

GR_ENGINE_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
POWER_USAGE = "DCGM_FI_DEV_POWER_USAGE"
SM_ACTIVE = "DCGM_FI_PROF_SM_ACTIVE"

_MS = 3  # decimal places of Prometheus timestamps


class Action(StrEnum):
    KEEP = "keep"
    WARN = "warn"
    RECLAIM = "reclaim"


class WorkloadClass(StrEnum):
    """What the pod is to the reaper: only sessions are ever reclaimed."""

    SESSION = "session"
    BATCH = "batch"


class Reason(StrEnum):
    NOT_A_SESSION = "NotASession"
    OPTED_OUT = "OptedOut"
    NO_METRICS = "NoMetrics"
    BUSY = "Busy"
    IDLE_BELOW_WINDOW = "IdleBelowWindow"
    KEPT_UNTIL = "KeptUntil"
    IDLE = "Idle"
    GRACE_EXPIRED = "GraceExpired"


@dataclass(frozen=True, slots=True)
class Sample:
    time: float  # epoch seconds
    value: float


@dataclass(frozen=True, slots=True)
class DeviceSamples:
    """The samples of one GPU (or MIG instance) of a pod, by metric name; each series in time order."""

    gpu: str
    series: Mapping[str, Sequence[Sample]]


@dataclass(frozen=True, slots=True)
class PodUsage:
    namespace: str
    pod: str
    gpus: int  # devices the pod holds (from its requests)
    devices: tuple[DeviceSamples, ...] = ()


@dataclass(frozen=True, slots=True)
class IdleSettings:
    """The knobs, each settable per queue or namespace (:func:`settings_with`).

    ``stale`` bounds how old the newest sample may be before the metrics count as missing; it is
    generous against dcgm-exporter's 30 s collection interval and a 1 min scrape.
    """

    window: float = 7200.0
    grace: float = 1800.0
    threshold: float = 0.01
    power_watts: float | None = None
    stale: float = 600.0


@dataclass(frozen=True, slots=True)
class Workload:
    """The class of the pod's workload and the annotations that matter, merged from pod and owner
    (the owner's win: they are what a user edits)."""

    klass: WorkloadClass
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Decision:
    action: Action
    reason: Reason
    message: str
    idle_seconds: float | None = None  # None: unknown (no metrics)
    reclaim_at: float | None = None  # set for warn and reclaim


# --- parsing the cluster's strings --------------------------------------------------------------------

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds in a duration such as ``90s``, ``30m``, ``2h``, ``1h30m`` or ``1d`` (Go's units plus
    ``d``). A bare number is seconds. Raises ValueError on anything else or a negative value."""
    raw = text.strip()
    if not raw:
        raise ValueError("empty duration")
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        if seconds < 0 or not math.isfinite(seconds):
            raise ValueError(f"invalid duration {text!r}")
        return seconds
    pos, total = 0, 0.0
    for match in _DURATION.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT[match.group(2)]
        pos = match.end()
    if pos != len(raw):
        raise ValueError(f"invalid duration {text!r} (use e.g. 90s, 30m, 2h, 1h30m)")
    return total


def format_duration(seconds: float) -> str:
    """``seconds`` as ``2h``, ``1h30m``, ``45s`` (rounded to the second; at most two units)."""
    left = round(max(0.0, seconds))
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts[:2]) or "0s"


def parse_time(text: str | None) -> float | None:
    """An RFC 3339 time with a zone as epoch seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        parsed = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed.timestamp() if parsed.tzinfo is not None else None


def format_time(seconds: float) -> str:
    """Epoch seconds as RFC 3339 in UTC, to the second (``2026-12-03T10:00:00Z``)."""
    return datetime.fromtimestamp(round(seconds), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def settings_with(base: IdleSettings, annotations: Mapping[str, str]) -> tuple[IdleSettings, list[str]]:
    """``base`` overridden by the reaper annotations of a namespace or queue.

    Returns the settings and one message per value that could not be read (that value is ignored,
    so a typo in one queue never stops the reaper)."""
    out, problems = base, []
    for key, name in ((WINDOW_ANNOTATION, "window"), (GRACE_ANNOTATION, "grace")):
        text = annotations.get(key)
        if text is None:
            continue
        try:
            out = replace(out, **{name: parse_duration(text)})
        except ValueError as err:
            problems.append(f"{key}: {err}")
    text = annotations.get(THRESHOLD_ANNOTATION)
    if text is not None:
        try:
            value = float(text)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"threshold {text!r} is not a ratio in 0..1")
            out = replace(out, threshold=value)
        except ValueError as err:
            problems.append(f"{THRESHOLD_ANNOTATION}: {err}")
    return out, problems


def is_true(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("true", "yes", "1")


# --- the idle decision ---------------------------------------------------------------------------------


def _ms(seconds: float) -> float:
    return round(seconds, _MS)


def _activity(device: DeviceSamples) -> list[Sample] | None:
    """The device's activity series as a ratio: engine activity, else GPU utilization; None if neither."""
    for metric, scale in ((GR_ENGINE_ACTIVE, 1.0), (GPU_UTIL, 0.01)):
        samples = device.series.get(metric)
        if samples:
            return [Sample(s.time, s.value * scale) for s in samples]
    return None


def _last_busy(device: DeviceSamples, settings: IdleSettings) -> tuple[float | None, float, float] | None:
    """``(last busy time or None, first sample time, newest sample time)`` of one device, or None
    without activity samples. Power counts as busy only with a power threshold set."""
    samples = _activity(device)
    if samples is None:
        return None
    busy = [s.time for s in samples if s.value >= settings.threshold]
    if settings.power_watts is not None:
        busy += [s.time for s in device.series.get(POWER_USAGE, ()) if s.value >= settings.power_watts]
    times = [s.time for s in samples]
    return (max(busy) if busy else None), min(times), max(times)


def idle_seconds(
    usage: PodUsage, settings: IdleSettings, now: float, last_activity: float | None = None
) -> tuple[float | None, str]:
    """How long every GPU of the pod has been idle at ``now``, or ``(None, why)`` when the metrics
    cannot tell (missing, incomplete or stale). Only time the samples cover counts as idle."""
    if not usage.devices:
        return None, "no utilization metrics for this pod"
    per_device = []
    for device in usage.devices:
        seen = _last_busy(device, settings)
        if seen is None:
            return None, f"no utilization metrics for GPU {device.gpu}"
        per_device.append(seen)
    if len(per_device) < usage.gpus:
        return None, f"utilization metrics for {len(per_device)} of {usage.gpus} GPUs"
    newest = min(seen[2] for seen in per_device)
    if now - newest > settings.stale:
        return None, f"newest utilization sample is {format_duration(now - newest)} old"
    if any(seen[0] is not None and seen[0] >= seen[2] for seen in per_device):
        return 0.0, ""  # the newest sample of a device shows activity: busy now
    start = max(seen[1] for seen in per_device)  # idle time is what every device's samples cover
    busy = [seen[0] for seen in per_device if seen[0] is not None]
    if last_activity is not None:
        busy.append(last_activity)
    since = max([start, *busy])
    return max(0.0, _ms(now - since)), ""


def decide(usage: PodUsage, workload: Workload, settings: IdleSettings, now: float) -> Decision:
    """keep, warn or reclaim one pod, with the reason (see the module docstring for the table).

    ``workload.annotations`` may hold the opt-out, keep-until, Kubeflow's last-activity and the
    ``reclaim-at`` of an earlier warning."""
    notes = workload.annotations
    if workload.klass is not WorkloadClass.SESSION:
        return Decision(Action.KEEP, Reason.NOT_A_SESSION, "not an interactive session; never reaped")
    if notes.get(OPT_OUT_ANNOTATION, "").strip().lower() == "disabled":
        return Decision(Action.KEEP, Reason.OPTED_OUT, f"opted out ({OPT_OUT_ANNOTATION}: disabled)")
    idle, why = idle_seconds(usage, settings, now, parse_time(notes.get(KUBEFLOW_LAST_ACTIVITY)))
    if idle is None:
        return Decision(Action.KEEP, Reason.NO_METRICS, f"{why}; missing metrics are never idle")
    if idle < settings.window:
        if idle == 0.0:
            return Decision(Action.KEEP, Reason.BUSY, "GPU activity at or above the threshold", 0.0)
        return Decision(
            Action.KEEP,
            Reason.IDLE_BELOW_WINDOW,
            f"idle for {format_duration(idle)}, less than the {format_duration(settings.window)} window",
            idle,
        )
    return _idle_past_window(idle, notes, settings, now)


def _idle_past_window(idle: float, notes: Mapping[str, str], settings: IdleSettings, now: float) -> Decision:
    """A session idle for the whole window: kept until its keep-until, else warned, and reclaimed
    once the grace period of its warning is over."""
    keep_until = parse_time(notes.get(KEEP_UNTIL_ANNOTATION))
    warned = parse_time(notes.get(RECLAIM_AT_ANNOTATION))
    reclaim_at = warned if warned is not None else now + settings.grace
    if keep_until is not None:
        reclaim_at = max(reclaim_at, keep_until)
        if warned is None and keep_until - now > settings.grace:
            return Decision(
                Action.KEEP,
                Reason.KEPT_UNTIL,
                f"idle for {format_duration(idle)}, kept until {format_time(keep_until)}",
                idle,
            )
    if _ms(now) >= _ms(reclaim_at):
        reason = Reason.GRACE_EXPIRED if warned is not None or keep_until is not None else Reason.IDLE
        return Decision(
            Action.RECLAIM,
            reason,
            f"idle for {format_duration(idle)} (window {format_duration(settings.window)}, "
            f"threshold {settings.threshold:g}); reclaimed",
            idle,
            reclaim_at,
        )
    return Decision(
        Action.WARN,
        Reason.IDLE,
        f"idle for {format_duration(idle)} (window {format_duration(settings.window)}, "
        f"threshold {settings.threshold:g}); reclaim at {format_time(reclaim_at)}",
        idle,
        reclaim_at,
    )


_RANK = {Action.KEEP: 0, Action.WARN: 1, Action.RECLAIM: 2}


def combine(decisions: Sequence[Decision]) -> Decision:
    """One owner's decision from those of its pods (a two-replica StatefulSet, a Job's pods): the
    least drastic wins, so an owner is warned only when every pod is idle and reclaimed only when
    every pod may be; among equals, the one idle for the shortest time speaks for all."""
    if not decisions:
        raise ValueError("an owner has at least one pod")
    return min(
        decisions,
        key=lambda d: (
            _RANK[d.action],
            d.idle_seconds is not None,  # a pod without metrics speaks first
            d.idle_seconds or 0.0,
        ),
    )


def reclaim_delay(settings: IdleSettings) -> float:
    """Idle seconds after which an unwarned, unprotected session is reclaimed: window + grace."""
    return settings.window + settings.grace


# --- the data-stall hint ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StallSettings:
    """When a running training workload looks starved of input rather than of GPUs.

    - *low SM*: over the window, the share of samples where work is resident (``GPU_UTIL`` >=
      ``resident``) but ``SM_ACTIVE`` is below ``sm_threshold`` reaches ``low_sm_share``;
    - *bursty*: the share of samples with no activity at all (below ``noise``) reaches
      ``zero_share`` while the GPU does reach ``burst`` between those stretches.
    The samples must cover ``coverage`` of the window, so a job that just started is not judged.
    """

    window: float = 1800.0
    sm_threshold: float = 0.2
    resident: float = 0.05
    low_sm_share: float = 0.6
    noise: float = 0.01
    zero_share: float = 0.3
    burst: float = 0.5
    coverage: float = 0.8


@dataclass(frozen=True, slots=True)
class StallEvidence:
    suspected: bool
    message: str
    low_sm_share: float | None = None  # of resident samples with SM activity below the threshold
    zero_share: float | None = None  # of samples with no activity at all
    mean_sm_active: float | None = None
    window: float = 0.0
    pattern: str = ""  # LowSMActivity or IdleBetweenBursts when suspected

    def as_fields(self) -> dict[str, str]:
        """The evidence as strings, for a condition message or an Event."""
        out = {"window": format_duration(self.window)}
        for name, value in (
            ("lowSmShare", self.low_sm_share),
            ("zeroActivityShare", self.zero_share),
            ("meanSmActive", self.mean_sm_active),
        ):
            if value is not None:
                out[name] = f"{value:.2f}"
        return out


def _in_window(samples: Iterable[Sample], start: float, now: float) -> list[Sample]:
    return [s for s in samples if start <= s.time <= now]


def data_stall(usage: PodUsage, settings: StallSettings, now: float) -> StallEvidence:
    """The data-stall hint for one running training pod. It only ever suggests: the caller never acts
    on it beyond an Event and a condition. Missing metrics suggest nothing."""
    start = now - settings.window
    sm: list[float] = []
    resident_low = resident = 0
    activity: list[float] = []
    covered = 0.0
    for device in usage.devices:
        sm_s = _in_window(device.series.get(SM_ACTIVE, ()), start, now)
        util_s = _in_window(device.series.get(GPU_UTIL, ()), start, now)
        act_s = _in_window(device.series.get(GR_ENGINE_ACTIVE, ()) or sm_s, start, now)
        spans = [s.time for s in (act_s or sm_s or util_s)]
        if spans:
            covered = max(covered, max(spans) - min(spans))
        util_at = {_ms(s.time): s.value / 100.0 for s in util_s}
        for s in sm_s:
            sm.append(s.value)
            u = util_at.get(_ms(s.time))
            if u is not None and u >= settings.resident:
                resident += 1
                resident_low += s.value < settings.sm_threshold
        activity += [s.value for s in act_s]
    window = settings.window
    if not activity and not sm:
        return StallEvidence(False, "no SM or engine activity metrics; nothing to suggest", window=window)
    if covered < settings.coverage * window:
        return StallEvidence(
            False,
            f"metrics cover {format_duration(covered)} of the {format_duration(window)} window",
            window=window,
        )
    mean_sm = sum(sm) / len(sm) if sm else None
    low_share = resident_low / resident if resident else None
    zero_share = sum(v < settings.noise for v in activity) / len(activity) if activity else None
    bursts = bool(activity) and max(activity) >= settings.burst
    low = low_share is not None and low_share >= settings.low_sm_share
    gaps = zero_share is not None and bursts and zero_share >= settings.zero_share
    evidence = StallEvidence(False, "", low_share, zero_share, mean_sm, window)
    if low:
        text = (
            f"SM activity below {settings.sm_threshold:g} in {low_share:.0%} of samples with work "
            f"resident over {format_duration(window)}: the GPU is likely waiting on input"
        )
        return replace(evidence, suspected=True, message=text, pattern="LowSMActivity")
    if gaps:
        text = (
            f"no GPU activity in {zero_share:.0%} of samples between bursts over "
            f"{format_duration(window)}: the GPU is likely waiting on input"
        )
        return replace(evidence, suspected=True, message=text, pattern="IdleBetweenBursts")
    return replace(evidence, message="GPU activity looks steady; no data stall suspected")
