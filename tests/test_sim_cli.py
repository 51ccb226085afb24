"""`gpuplane simulate` (the scenario simulator) as a user runs it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
GOLDEN = REPO / "tests" / "golden"
OPENB = REPO.parent / "shared" / "traces" / "alibaba-openb-gpu-v2023" / "csv" / "openb_pod_list_default.csv"
DOC = REPO / "docs" / "simulator.md"
HEADLINE_KEYS = (
    "gpuAllocatedShare",
    "gpuBusyShare",
    "waitP50Seconds",
    "waitP95Seconds",
    "deadlockedGpuHours",
    "lostGpuHours",
    "etaErrorP50",
    "etaErrorP90",
    "strandedQuotaGpuHours",
    "preemptions",
    "sessionsReaped",
)


def gpuplane(
    *args: str, timeout: float = 120, columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    env = None if columns is None else {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=REPO,
        env=env,
    )


def simulate_json(*args: str, timeout: float = 120) -> dict[str, Any]:
    run = gpuplane("simulate", *args, "--output", "json", timeout=timeout)
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""  # no progress bar for JSON or when stderr is not a terminal
    doc = json.loads(run.stdout)
    assert isinstance(doc, dict)
    return doc


def test_json_has_both_configurations_side_by_side() -> None:
    doc = simulate_json("--days", "0.5")
    assert doc["scenario"] == "builtin"
    assert isinstance(doc["wallSeconds"], float)
    assert list(doc["configurations"]) == ["stock", "gpuplane"]
    for config in doc["configurations"].values():
        for key in HEADLINE_KEYS:
            assert key in config
        assert config["teams"]
        assert config["classes"]
        assert config["allocatedGpuHours"] == pytest.approx(
            config["busyGpuHours"] + config["idleGpuHours"], abs=0.02
        )


def test_same_seed_same_result_other_seed_other_arrivals() -> None:
    a = simulate_json("--days", "0.25", "--seed", "5")
    b = simulate_json("--days", "0.25", "--seed", "5")
    c = simulate_json("--days", "0.25", "--seed", "6")
    strip = re.compile(r'"wallSeconds": [0-9.e-]+')
    assert strip.sub("", json.dumps(a)) == strip.sub("", json.dumps(b))
    assert c["workloads"] != a["workloads"] or c["configurations"] != a["configurations"]


def test_table_output_and_compare() -> None:
    run = gpuplane(
        "simulate",
        "--days",
        "0.25",
        "--compare",
        "gpuplane-no-reaper",
        "--compare",
        "stock-packed,gpuplane-no-sharing",
    )
    assert run.returncode == 0, run.stderr
    header = next(line for line in run.stdout.splitlines() if "measure" in line)
    for name in ("stock", "gpuplane", "gpuplane-no-reaper", "stock-packed", "gpuplane-no-sharing"):
        assert name in header
    assert "GPU busy share" in run.stdout
    assert "per workload class" in run.stdout
    assert "(Kueue)" not in run.stdout  # no peer: none of the peers' own rows


def _row(stdout: str, label: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if label in line)
    return [cell.strip() for cell in line.split("\u2502")[2:-1]]


def test_table_shows_the_peers_own_counts() -> None:
    args = ("--scenario", str(GOLDEN / "tiny-mixed.yaml"), "--days", "0.25")
    peers = ("--compare", "kueue,kueue-timeslicing,volcano")
    run = gpuplane("simulate", *args, *peers, "--output", "table", columns=200)  # a label per line
    assert run.returncode == 0, run.stderr
    doc = simulate_json(*args, *peers)
    configs = doc["configurations"]
    assert list(configs) == ["stock", "gpuplane", "kueue", "kueue-timeslicing", "volcano"]
    admitted = _row(run.stdout, "admitted, not all pods bound (Kueue)")
    assert admitted[:2] == ["-", "-"]
    assert admitted[4] == "-"
    assert admitted[2] == f"{configs['kueue']['admittedUnplaceableWorkloads']:,}"
    memory = _row(run.stdout, "pods bound short of GPU memory (time-slicing)")
    assert memory == [
        "-",
        "-",
        "-",
        f"{configs['kueue-timeslicing']['timeSlicing']['memoryOvercommits']:,}",
        "-",
    ]
    reclaimed = _row(run.stdout, "jobs reclaimed (Volcano)")
    assert reclaimed == ["-", "-", "-", "-", f"{configs['volcano']['reclaimedJobs']:,}"]


def test_report_writes_html_and_plots(tmp_path: Path) -> None:
    out = tmp_path / "report"
    run = gpuplane("simulate", "--days", "0.25", "--report", str(out))
    assert run.returncode == 0, run.stderr
    page = (out / "index.html").read_text()
    for png in ("utilization.png", "waits.png", "teams.png", "classes.png"):
        assert (out / png).stat().st_size > 1000
        assert png in page
    assert "source" in page


def test_scenario_file_runs() -> None:
    doc = simulate_json("--scenario", str(GOLDEN / "tiny-mixed.yaml"))
    assert doc["scenario"] == "tiny-mixed"
    assert doc["gpus"] == 52


def _bad_scenario(tmp_path: Path) -> Path:
    text = (GOLDEN / "tiny-mixed.yaml").read_text()
    path = tmp_path / "bad.yaml"
    path.write_text(text.replace('nodes: {value: 3, source: "assumed"}', "nodes: {value: 3}", 1))
    return path


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("--compare", "nope"), "--compare: unknown configuration 'nope'"),
        (("--scenario", "missing.yaml"), "--scenario: missing.yaml: no such file"),
        (("--days", "-1"), "--days must be positive"),
        (("--trace-format", "openb"), "--trace-format needs --trace"),
        (("--trace", "missing.csv"), "--trace: missing.csv: no such file"),
    ],
    ids=[
        "unknown-configuration",
        "missing-scenario",
        "negative-days",
        "format-without-trace",
        "missing-trace",
    ],
)
def test_bad_input_is_one_line_and_status_2(args: tuple[str, ...], want: str) -> None:
    run = gpuplane("simulate", *args)
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1
    assert want in run.stderr


def test_bad_scenario_names_the_field(tmp_path: Path) -> None:
    run = gpuplane("simulate", "--scenario", str(_bad_scenario(tmp_path)))
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1
    assert "cluster.pools[0].nodes.source: missing" in run.stderr


HELIOS_CSV = """job_id,user,vc,gpu_num,cpu_num,node_num,state,submit_time,start_time,end_time,duration,queue
1,u1,vcA,8,32,1,COMPLETED,2020-04-01 00:00:00,,,3600,0
2,u2,vcB,16,64,2,COMPLETED,2020-04-01 00:10:00,,,7200,0
3,u1,vcA,1,4,1,COMPLETED,2020-04-01 00:20:00,,,600,0
4,u3,vcB,0,4,1,COMPLETED,2020-04-01 00:30:00,,,60,0
5,u3,vcB,2,4,1,FAILED,2020-04-01 06:00:00,,,60,0
"""


def test_replays_a_helios_style_job_log(tmp_path: Path) -> None:
    trace = tmp_path / "cluster_log.csv"
    trace.write_text(HELIOS_CSV)
    doc = simulate_json("--trace", str(trace))
    assert doc["trace"]["jobs"] == 3  # the CPU job is skipped, the last one falls at the end
    assert doc["trace"]["skipped"] == 1
    assert set(doc["configurations"]["gpuplane"]["teams"]) == {"vcA", "vcB"}


def test_replays_a_csv_through_a_column_mapping(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("t,secs,g,who\n0,600,1,a\n100,900,4,b\n200,60,2,a\n5000,60,1,b\n")
    mapping = tmp_path / "mapping.yaml"
    mapping.write_text("columns: {submit: t, duration: secs, gpus: g, team: who}\n")
    doc = simulate_json("--trace", str(trace), "--trace-format", str(mapping))
    assert doc["configurations"]["stock"]["submitted"] == 3
    bad = tmp_path / "bad.yaml"
    bad.write_text("columns: {submit: t, gpus: g}\n")
    run = gpuplane("simulate", "--trace", str(trace), "--trace-format", str(bad))
    assert run.returncode == 2
    assert "columns.duration: missing" in run.stderr


def test_unknown_trace_header_is_bad_input(tmp_path: Path) -> None:
    trace = tmp_path / "x.csv"
    trace.write_text("a,b\n1,2\n")
    run = gpuplane("simulate", "--trace", str(trace))
    assert run.returncode == 2
    assert "cannot tell the trace format" in run.stderr


@pytest.mark.skipif(not OPENB.exists(), reason="the shared openb trace is not next to the repository")
def test_replays_the_openb_default_pod_list() -> None:
    doc = simulate_json("--trace", str(OPENB))
    assert doc["trace"]["pods"] == 8152
    assert doc["gpus"] == 6212
    stock, gpuplane_ = doc["configurations"]["stock"], doc["configurations"]["gpuplane"]
    assert stock["submitted"] == gpuplane_["submitted"] == 8152
    # Fractional pods take a whole GPU under stock Kubernetes, their share under gpuplane.
    assert stock["allocatedGpuHours"] > gpuplane_["allocatedGpuHours"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_no_arguments_runs_the_builtin_week() -> None:
    doc = simulate_json(timeout=300)
    assert doc["days"] >= 7
    assert doc["gpus"] >= 300
    assert set(doc["configurations"]) == {"stock", "gpuplane"}


CONSOLE_COMMAND = re.compile(r"^\$ (gpuplane [^#\n]*)", re.MULTILINE)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_commands_in_the_simulator_doc_run() -> None:
    commands = CONSOLE_COMMAND.findall(DOC.read_text())
    assert commands, "docs/simulator.md shows no gpuplane command"
    for command in commands:
        args = command.split()[1:]
        if any(a.startswith("--trace") for a in args) and not OPENB.exists():
            continue
        run = gpuplane(*args, timeout=600)
        assert run.returncode == 0, (command, run.stderr)
