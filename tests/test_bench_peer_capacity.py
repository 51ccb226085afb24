"""``bench/peer_capacity.py``: the auto sweep against the peers, run as the user's command, on the
golden scenario at a small size (the built-in week is the benchmark's own run)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load_bench

TINY = Path(__file__).resolve().parent / "golden" / "tiny-mixed.yaml"


def test_the_benchmark_reports_each_capacity_the_strongest_peer_and_the_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench = load_bench("peer_capacity.py")
    argv = ["--scenario", str(TINY), "--days", "0.25", "--wait-target", "30min", "--jobs", "2"]
    assert bench.main([*argv, "--out", str(tmp_path), "--output", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    names = {"stock", "gpuplane", "kueue", "kueue-timeslicing", "volcano"}
    assert set(result["capacityAtWaitTarget"]) == names
    assert set(result["runs"]) == names
    assert result["wallSeconds"] > 0
    assert result["cpuSeconds"] > 0  # the command's and its workers' CPU
    assert result["withinTarget"] == (result["wallSeconds"] <= 900)
    assert result["workers"] == 2
    assert 0 < result["runShareOfWorkerTime"] <= 1
    kept = sum(r["runSeconds"] for r in result["runs"].values()) + sum(result["matchRunSeconds"].values())
    rounding = 0.05 * (len(result["runs"]) + len(result["matchRunSeconds"])) + 0.05  # per 0.1 s figure
    assert abs(result["runShareOfWorkerTime"] * 2 * result["wallSeconds"] - kept) <= rounding + 0.01
    peer = result["strongestPeer"]
    assert peer in {"kueue", "kueue-timeslicing", "volcano"}
    capacity = result["capacityAtWaitTarget"]
    assert result["gpuplaneMultipleOfStrongestPeer"] == pytest.approx(
        capacity["gpuplane"] / capacity[peer], abs=1e-3
    )
    assert result["meetsGoal"] == (result["gpuplaneMultipleOfStrongestPeer"] >= 2.0)
    assert all(r["runs"] >= 3 and 0 <= r["cut"] <= r["runs"] for r in result["runs"].values())
    saved = json.loads((tmp_path / "peer-capacity.json").read_text())
    assert saved["sweep"]["capacityAtWaitTarget"] == capacity  # the sweep's own JSON, kept beside
    assert (tmp_path / "sweep-wait.png").is_file()  # --out is also the sweep's report folder
    assert result["headline"].startswith("At p95 wait ≤ 30.0 min")
