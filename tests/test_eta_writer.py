"""The controller's ETA annotations: written once, rewritten only when the wait moves by more than 10 %."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.insight.queue_eta import Estimate
from gpuplane.insight.why import Explanation
from gpuplane.k8s.eta_writer import DETAIL_ANNOTATION, ETA_ANNOTATION, NEVER, EtaWriter, needs_update

NOW = 1_772_000_000.0


def _rfc(seconds: float) -> str:
    import datetime  # noqa: PLC0415

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize(
    ("current", "start", "want"),
    [
        (None, NOW + 600, True),
        (_rfc(NOW + 600), NOW + 650, False),  # 50 s of 600: under 10 %
        (_rfc(NOW + 600), NOW + 700, True),  # 100 s of 600: over 10 %
        (_rfc(NOW + 30), NOW + 34, False),  # a short wait must move by 10 % of a minute (6 s)
        (_rfc(NOW + 30), NOW + 40, True),
        (NEVER, None, False),
        (NEVER, NOW + 10, True),
        (_rfc(NOW + 600), None, True),
        ("garbage", NOW, True),
    ],
    ids=[
        "none",
        "small-move",
        "large-move",
        "floor-small",
        "floor-large",
        "never-never",
        "never-to-time",
        "time-to-never",
        "unreadable",
    ],
)
def test_needs_update(current: str | None, start: float | None, want: bool) -> None:
    assert needs_update(current, start, NOW) is want


class RecordingApi:
    def __init__(self) -> None:
        self.patches: list[tuple[str, str | None, Any]] = []

    def patch(self, res: object, name: str, patch: Any, namespace: str | None = None) -> dict[str, Any]:
        del res
        self.patches.append((name, namespace, patch))
        return {}


def explanation(seconds: float | None) -> Explanation:
    estimate = Estimate(
        seconds, None if seconds is None else seconds / 2, None if seconds is None else seconds * 2, "b"
    )
    return Explanation("ns/w", "cq", "ns/lq", 0, 0, estimate, "WaitingForQuota", "m")


def test_writes_once_then_only_on_a_real_move() -> None:
    api = RecordingApi()
    objects: dict[str, dict[str, Any]] = {"ns/w": {"metadata": {"name": "w", "namespace": "ns"}}}
    writer = EtaWriter(api, objects.get)  # type: ignore[arg-type]
    writer.write([explanation(600)], NOW)
    writer.write([explanation(590)], NOW + 10)  # the same start, ticking down
    writer.write([explanation(800)], NOW + 20)  # moved by 200 s of 580
    assert len(api.patches) == 2
    name, ns, patch = api.patches[0]
    assert (name, ns) == ("w", "ns")
    annotations = patch["metadata"]["annotations"]
    assert annotations[ETA_ANNOTATION] == _rfc(NOW + 600)
    assert annotations[DETAIL_ANNOTATION].startswith("in 600s (300s-1200s)")
    writer.write([explanation(None)], NOW + 30)
    assert api.patches[-1][2]["metadata"]["annotations"][ETA_ANNOTATION] == NEVER
    objects["ns/w"]["status"] = {"admission": {"clusterQueue": "cq"}}
    writer.write([explanation(5)], NOW + 40)  # admitted: nothing to write any more
    assert len(api.patches) == 3


def test_the_insight_worker_takes_the_latest_pass_and_never_blocks_the_submitter() -> None:
    import threading  # noqa: PLC0415

    from gpuplane.cli.insight import LatestWorker  # noqa: PLC0415
    from gpuplane.core.plan import Plan  # noqa: PLC0415
    from gpuplane.model.objects import ClusterState  # noqa: PLC0415

    started, release = threading.Event(), threading.Event()
    seen: list[float] = []

    def work(state: ClusterState, plan: Plan, now: float) -> None:
        del state, plan
        started.set()
        assert release.wait(10)
        seen.append(now)

    worker = LatestWorker(work)
    try:
        worker.submit(ClusterState(), Plan(), 1.0)
        assert started.wait(10)
        for now in (2.0, 3.0, 4.0):  # while the first is being explained: only the last one stays
            worker.submit(ClusterState(), Plan(), now)
        release.set()
        assert worker.wait_idle(10)
        assert seen == [1.0, 4.0]
    finally:
        worker.stop()
