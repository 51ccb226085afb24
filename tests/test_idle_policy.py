"""The pure idle policy and data-stall hint (insight/idle.py), table-driven."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import pytest

from gpuplane.insight import idle
from gpuplane.insight.idle import (
    Action,
    DeviceSamples,
    IdleSettings,
    PodUsage,
    Reason,
    Sample,
    StallSettings,
    Workload,
    WorkloadClass,
)

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
HOUR = 3600.0
STEP = 30.0


def series(hours: float, value: Callable[[float], float], *, end: float = NOW) -> tuple[Sample, ...]:
    """Samples every 30 s over the last ``hours`` before ``end``; ``value(age_seconds)``."""
    count = int(hours * HOUR / STEP)
    return tuple(Sample(end - i * STEP, value(i * STEP)) for i in range(count, -1, -1))


def device(gpu: str = "0", **series_by_metric: tuple[Sample, ...]) -> DeviceSamples:
    names = {"engine": idle.GR_ENGINE_ACTIVE, "util": idle.GPU_UTIL, "power": idle.POWER_USAGE}
    names["sm"] = idle.SM_ACTIVE
    return DeviceSamples(gpu, {names[k]: v for k, v in series_by_metric.items()})


def usage(*devices: DeviceSamples, gpus: int | None = None) -> PodUsage:
    return PodUsage("team-a", "nb-0", len(devices) if gpus is None else gpus, devices)


def zero(_age: float) -> float:
    return 0.0


def busy_until(age: float, level: float = 0.4) -> Callable[[float], float]:
    """Active (``level``) for samples older than ``age`` seconds, then zero."""
    return lambda a: level if a >= age else 0.0


def at(seconds_from_now: float) -> str:
    return idle.format_time(NOW + seconds_from_now)


@dataclass
class Case:
    id: str
    usage: PodUsage
    want_action: Action
    want_reason: Reason
    klass: WorkloadClass = WorkloadClass.SESSION
    notes: Mapping[str, str] = field(default_factory=dict)
    settings: IdleSettings = field(default_factory=IdleSettings)
    want_idle: float | None = None
    want_reclaim_at: float | None = None


IDLE_3H = usage(device(engine=series(3, zero)))

CASES = [
    Case("no-samples-is-never-idle", usage(gpus=1), Action.KEEP, Reason.NO_METRICS),
    Case(
        "a-device-without-series-is-never-idle",
        usage(device(power=series(3, zero))),
        Action.KEEP,
        Reason.NO_METRICS,
    ),
    Case(
        "metrics-for-fewer-gpus-than-held",
        usage(device(engine=series(3, zero)), gpus=2),
        Action.KEEP,
        Reason.NO_METRICS,
    ),
    Case(
        "stale-metrics-are-missing",
        usage(device(engine=series(3, zero, end=NOW - 3 * HOUR))),
        Action.KEEP,
        Reason.NO_METRICS,
    ),
    Case(
        "idle-3h-first-look-warns",
        IDLE_3H,
        Action.WARN,
        Reason.IDLE,
        want_idle=3 * HOUR,
        want_reclaim_at=NOW + 1800,
    ),
    Case("batch-is-never-reaped", IDLE_3H, Action.KEEP, Reason.NOT_A_SESSION, klass=WorkloadClass.BATCH),
    Case("opt-out", IDLE_3H, Action.KEEP, Reason.OPTED_OUT, notes={idle.OPT_OUT_ANNOTATION: "disabled"}),
    Case(
        "busy-now",
        usage(device(engine=series(3, lambda a: 0.9 if a == 0 else 0.0))),
        Action.KEEP,
        Reason.BUSY,
        want_idle=0.0,
    ),
    Case(
        "active-90m-ago-is-below-the-2h-window",
        usage(device(engine=series(3, busy_until(90 * 60)))),
        Action.KEEP,
        Reason.IDLE_BELOW_WINDOW,
        want_idle=90 * 60,
    ),
    Case(
        "noise-below-the-threshold-is-idle",
        usage(device(engine=series(3, lambda _a: 0.009))),
        Action.WARN,
        Reason.IDLE,
        want_idle=3 * HOUR,
    ),
    Case(
        "exactly-the-threshold-is-activity",
        usage(device(engine=series(3, lambda a: 0.01 if a == HOUR else 0.0))),
        Action.KEEP,
        Reason.IDLE_BELOW_WINDOW,
        want_idle=HOUR,
    ),
    Case(
        "a-higher-threshold-makes-light-use-idle",
        usage(device(engine=series(3, lambda _a: 0.04))),
        Action.WARN,
        Reason.IDLE,
        settings=IdleSettings(threshold=0.05),
    ),
    Case(
        "only-1h-of-history-is-not-2h-idle",
        usage(device(engine=series(1, zero))),
        Action.KEEP,
        Reason.IDLE_BELOW_WINDOW,
        want_idle=HOUR,
    ),
    Case(
        "gpu-util-where-profiling-is-absent",
        usage(device(util=series(3, busy_until(HOUR, 35.0)))),
        Action.KEEP,
        Reason.IDLE_BELOW_WINDOW,
        want_idle=HOUR,
    ),
    Case(
        "gpu-util-zero-is-idle",
        usage(device(util=series(3, zero))),
        Action.WARN,
        Reason.IDLE,
    ),
    Case(
        "one-busy-gpu-keeps-the-pod",
        usage(device("0", engine=series(3, zero)), device("1", engine=series(3, lambda _a: 0.5))),
        Action.KEEP,
        Reason.BUSY,
    ),
    Case(
        "power-counts-only-with-a-power-threshold",
        usage(device(engine=series(3, zero), power=series(3, lambda _a: 250.0))),
        Action.KEEP,
        Reason.BUSY,
        settings=IdleSettings(power_watts=100.0),
    ),
    Case(
        "power-ignored-without-a-threshold",
        usage(device(engine=series(3, zero), power=series(3, lambda _a: 250.0))),
        Action.WARN,
        Reason.IDLE,
    ),
    Case(
        "kubeflow-last-activity-counts",
        IDLE_3H,
        Action.KEEP,
        Reason.IDLE_BELOW_WINDOW,
        notes={idle.KUBEFLOW_LAST_ACTIVITY: at(-20 * 60)},
        want_idle=20 * 60,
    ),
    Case(
        "old-kubeflow-last-activity-changes-nothing",
        IDLE_3H,
        Action.WARN,
        Reason.IDLE,
        notes={idle.KUBEFLOW_LAST_ACTIVITY: at(-5 * HOUR)},
        want_idle=3 * HOUR,
    ),
    Case(
        "warned-and-grace-not-over",
        IDLE_3H,
        Action.WARN,
        Reason.IDLE,
        notes={idle.RECLAIM_AT_ANNOTATION: at(600)},
        want_reclaim_at=NOW + 600,
    ),
    Case(
        "warned-and-grace-over",
        IDLE_3H,
        Action.RECLAIM,
        Reason.GRACE_EXPIRED,
        notes={idle.RECLAIM_AT_ANNOTATION: at(-1)},
        want_reclaim_at=NOW - 1,
    ),
    Case(
        "zero-grace-reclaims-at-once",
        IDLE_3H,
        Action.RECLAIM,
        Reason.IDLE,
        settings=IdleSettings(grace=0.0),
        want_reclaim_at=NOW,
    ),
    Case(
        "keep-until-far-away-keeps",
        IDLE_3H,
        Action.KEEP,
        Reason.KEPT_UNTIL,
        notes={idle.KEEP_UNTIL_ANNOTATION: at(5 * HOUR)},
    ),
    Case(
        "keep-until-within-grace-warns-for-keep-until",
        IDLE_3H,
        Action.WARN,
        Reason.IDLE,
        notes={idle.KEEP_UNTIL_ANNOTATION: at(1200)},
        want_reclaim_at=NOW + 1800,
    ),
    Case(
        "keep-until-extends-a-warning",
        IDLE_3H,
        Action.WARN,
        Reason.IDLE,
        notes={idle.RECLAIM_AT_ANNOTATION: at(-60), idle.KEEP_UNTIL_ANNOTATION: at(HOUR)},
        want_reclaim_at=NOW + HOUR,
    ),
    Case(
        "keep-until-past-changes-nothing",
        IDLE_3H,
        Action.RECLAIM,
        Reason.GRACE_EXPIRED,
        notes={idle.RECLAIM_AT_ANNOTATION: at(-60), idle.KEEP_UNTIL_ANNOTATION: at(-HOUR)},
    ),
    Case(
        "unreadable-keep-until-is-ignored",
        IDLE_3H,
        Action.WARN,
        Reason.IDLE,
        notes={idle.KEEP_UNTIL_ANNOTATION: "tomorrow"},
    ),
    Case(
        "shorter-window-per-queue",
        usage(device(engine=series(3, busy_until(40 * 60)))),
        Action.WARN,
        Reason.IDLE,
        settings=IdleSettings(window=30 * 60),
        want_idle=40 * 60,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    got = idle.decide(case.usage, Workload(case.klass, case.notes), case.settings, NOW)
    assert (got.action, got.reason) == (case.want_action, case.want_reason), got.message
    if case.want_idle is not None:
        assert got.idle_seconds == pytest.approx(case.want_idle)
    if case.want_reclaim_at is not None:
        assert got.reclaim_at == pytest.approx(case.want_reclaim_at)
    if got.action is Action.KEEP:
        assert got.reclaim_at is None
    assert got.message


def test_missing_metrics_decision_says_so() -> None:
    got = idle.decide(usage(gpus=1), Workload(WorkloadClass.SESSION), IdleSettings(), NOW)
    assert "missing metrics are never idle" in got.message
    assert got.idle_seconds is None


def test_idle_exactly_the_window_is_idle_despite_rounding() -> None:
    last = NOW - 0.1 - 7200.0 + 0.1  # a float a few ulps away from NOW - 7200
    samples = (Sample(NOW - 3 * HOUR, 0.0), Sample(last, 0.5), Sample(NOW, 0.0))
    got = idle.decide(
        usage(device(engine=samples)), Workload(WorkloadClass.SESSION), IdleSettings(grace=0), NOW
    )
    assert got.action is Action.RECLAIM


def test_an_owner_is_decided_by_its_least_idle_pod() -> None:
    session = Workload(WorkloadClass.SESSION)
    idle_pod = idle.decide(IDLE_3H, session, IdleSettings(grace=0), NOW)
    busy_pod = idle.decide(usage(device(engine=series(3, lambda _a: 0.5))), session, IdleSettings(), NOW)
    blind_pod = idle.decide(usage(gpus=1), session, IdleSettings(), NOW)
    warned_pod = idle.decide(IDLE_3H, session, IdleSettings(), NOW)
    assert idle.combine([idle_pod, busy_pod]) is busy_pod
    assert idle.combine([busy_pod, blind_pod]) is blind_pod  # missing metrics speak first
    assert idle.combine([idle_pod, warned_pod]) is warned_pod
    assert idle.combine([idle_pod]) is idle_pod
    with pytest.raises(ValueError, match="at least one pod"):
        idle.combine([])


def test_reclaim_delay_is_window_plus_grace() -> None:
    assert idle.reclaim_delay(IdleSettings(window=100, grace=20)) == 120


@pytest.mark.parametrize(
    ("text", "want"),
    [("90s", 90), ("2h", 7200), ("30m", 1800), ("1h30m", 5400), ("1d", 86400), ("45", 45), ("500ms", 0.5)],
)
def test_parse_duration(text: str, want: float) -> None:
    assert idle.parse_duration(text) == want


@pytest.mark.parametrize("text", ["", "2x", "h", "-5", "1h 30m", "30m1", "nan"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        idle.parse_duration(text)


def test_settings_from_queue_annotations() -> None:
    got, problems = idle.settings_with(
        IdleSettings(),
        {idle.WINDOW_ANNOTATION: "30m", idle.GRACE_ANNOTATION: "bad", idle.THRESHOLD_ANNOTATION: "0.05"},
    )
    assert (got.window, got.grace, got.threshold) == (1800, 1800, 0.05)
    assert len(problems) == 1
    assert idle.GRACE_ANNOTATION in problems[0]
    _, problems = idle.settings_with(IdleSettings(), {idle.THRESHOLD_ANNOTATION: "5"})
    assert "ratio" in problems[0]


# --- the data-stall hint ------------------------------------------------------------------------------


def steady(_age: float) -> float:
    return 0.85


def bursts(age: float) -> float:
    """Ten minutes of work, then ten of nothing, repeating."""
    return 0.9 if (age // 600) % 2 == 0 else 0.0


@dataclass
class StallCase:
    id: str
    usage: PodUsage
    want: bool
    want_low_share: float | None = None
    want_pattern: str = ""


STALLS = [
    StallCase(
        "busy-training",
        usage(device(sm=series(1, steady), util=series(1, lambda _a: 100.0), engine=series(1, steady))),
        want=False,
        want_low_share=0.0,
    ),
    StallCase(
        "resident-but-sm-starved",
        usage(device(sm=series(1, lambda _a: 0.08), util=series(1, lambda _a: 95.0))),
        want=True,
        want_low_share=1.0,
        want_pattern="LowSMActivity",
    ),
    StallCase(
        "bursts-with-long-gaps",
        usage(device(engine=series(1, bursts), sm=series(1, bursts))),
        True,
        want_pattern="IdleBetweenBursts",
    ),
    StallCase("wholly-idle-is-not-a-stall", usage(device(engine=series(1, zero), sm=series(1, zero))), False),
    StallCase("no-metrics-suggest-nothing", usage(gpus=1), False),
    StallCase(
        "too-little-history",
        usage(device(sm=series(0.1, lambda _a: 0.05), util=series(0.1, lambda _a: 95.0))),
        False,
    ),
]


@pytest.mark.parametrize("case", STALLS, ids=[c.id for c in STALLS])
def test_data_stall(case: StallCase) -> None:
    got = idle.data_stall(case.usage, StallSettings(), NOW)
    assert got.suspected is case.want, got.message
    assert got.pattern == case.want_pattern
    if case.want_low_share is not None:
        assert got.low_sm_share == pytest.approx(case.want_low_share)
    assert got.message


def test_stall_evidence_fields() -> None:
    stalled = usage(device(sm=series(1, lambda _a: 0.08), util=series(1, lambda _a: 95.0)))
    fields = idle.data_stall(stalled, StallSettings(), NOW).as_fields()
    # Without engine activity, SM activity stands in for it: never zero here.
    assert fields == {
        "window": "30m",
        "lowSmShare": "1.00",
        "zeroActivityShare": "0.00",
        "meanSmActive": "0.08",
    }
