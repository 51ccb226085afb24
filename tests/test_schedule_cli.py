"""`gpuplane schedule` as a user runs it: output formats, determinism, exit codes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from manifests import cluster_queue, documents, local_queue, namespace, resource_flavor, workload

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "quickstart.yaml"
TIMINGS = re.compile(rb'"(parseSeconds|scheduleSeconds)": [0-9.e-]+')


def gpuplane(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", *args],
        input=None if stdin is None else stdin.encode(),
        capture_output=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def state_file(tmp_path: Path) -> Path:
    path = tmp_path / "state.yaml"
    path.write_text(
        documents(
            namespace("default"),
            resource_flavor("default"),
            cluster_queue("team").flavor("default", cpu="4"),
            local_queue("team", "default", "team"),
            workload("a").queue("team").created("2026-01-01T00:00:00Z").podset(cpu="3"),
            workload("b").queue("team").created("2026-01-01T00:00:01Z").podset(cpu="3"),
        )
    )
    return path


def test_json_document_has_the_contract_fields(state_file: Path) -> None:
    run = gpuplane("schedule", "-f", str(state_file), "--output", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert set(doc) == {"admitted", "preempted", "pending", "stats"}
    assert doc["admitted"] == [
        {
            "workload": "default/a",
            "clusterQueue": "team",
            "podSets": [{"name": "main", "count": 1, "flavors": {"cpu": "default"}}],
        }
    ]
    (waiting,) = doc["pending"]
    assert waiting["workload"] == "default/b"
    assert waiting["position"] == 1
    assert waiting["reason"] == "WaitingForQuota"
    assert set(doc["stats"]) == {"cycles", "parseSeconds", "scheduleSeconds"}


def test_same_input_gives_byte_identical_json(state_file: Path) -> None:
    """Only the two measured timings may differ between runs."""
    first = gpuplane("schedule", "-f", str(state_file), "--output", "json")
    second = gpuplane("schedule", "-f", str(state_file), "--output", "json")
    assert first.returncode == second.returncode == 0
    assert TIMINGS.sub(b"T", first.stdout) == TIMINGS.sub(b"T", second.stdout)


def test_table_output_for_people(state_file: Path) -> None:
    run = gpuplane("schedule", "-f", str(state_file), "--output", "table")
    assert run.returncode == 0, run.stderr
    text = run.stdout.decode()
    assert "Admitted (1)" in text
    assert "Pending (1)" in text
    assert "default/b" in text


def test_reads_standard_input(state_file: Path) -> None:
    run = gpuplane("schedule", "-f", "-", "--output", "json", stdin=state_file.read_text())
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["admitted"][0]["workload"] == "default/a"


def test_cycles_must_be_positive(state_file: Path) -> None:
    run = gpuplane("schedule", "-f", str(state_file), "--cycles", "0")
    assert run.returncode == 2


def test_missing_file_is_one_line_and_exit_2(tmp_path: Path) -> None:
    run = gpuplane("schedule", "-f", str(tmp_path / "nope.yaml"))
    assert run.returncode == 2
    lines = run.stderr.decode().strip().splitlines()
    assert len(lines) == 1
    assert "nope.yaml" in lines[0]


def test_strict_refuses_borrowing_limit_without_cohort(tmp_path: Path) -> None:
    path = tmp_path / "state.yaml"
    cq = (
        cluster_queue("solo")
        .flavor("default", cpu="4")
        .set("spec.resourceGroups[0].flavors[0].resources[0].borrowingLimit", "2")
    )
    path.write_text(documents(resource_flavor("default"), cq))
    lenient = gpuplane("schedule", "-f", str(path), "--output", "json")
    assert lenient.returncode == 0
    assert b"warning:" in lenient.stderr
    strict = gpuplane("schedule", "-f", str(path), "--strict")
    assert strict.returncode == 2
    assert b"borrowingLimit" in strict.stderr


def test_quickstart_example_runs() -> None:
    run = gpuplane("schedule", "-f", str(EXAMPLE), "--output", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["admitted"]
    assert doc["preempted"] or doc["pending"]


DOCS = [REPO / "README.md", REPO / "docs" / "scheduling.md", REPO / "docs" / "devices.md"]
CONSOLE_COMMAND = re.compile(r"^\$ (gpuplane [^#\n]*)", re.MULTILINE)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_commands_in_the_docs_run(doc: Path) -> None:
    commands = CONSOLE_COMMAND.findall(doc.read_text())
    assert commands, f"{doc.name} shows no gpuplane command"
    for command in commands:
        args = command.split()[1:]
        run = subprocess.run(
            [sys.executable, "-m", "gpuplane.cli.app", *args],
            cwd=REPO,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert run.returncode == 0, (command, run.stderr)
