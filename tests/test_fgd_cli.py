"""`gpuplane simulate --protocol fgd` as a user runs it: output, reproducibility, bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

NODES = """sn,cpu_milli,memory_mib,gpu,model
n-a,64000,262144,2,T4
n-b,96000,393216,8,G2
n-c,16000,65536,1,V100
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos
p-0,4000,8192,1,500,,LS
p-1,8000,16384,1,1000,,LS
p-2,12000,32768,0,0,,BE
p-3,2000,4096,1,250,T4|G2,LS
p-4,16000,65536,2,1000,,LS
p-5,3000,4096,1,810,,LS
"""


def gpuplane(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes, pods = tmp_path / "nodes.csv", tmp_path / "pods.csv"
    nodes.write_text(NODES)
    pods.write_text(PODS)
    return nodes, pods


def simulate(nodes: Path, pods: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return gpuplane("simulate", "--protocol", "fgd", "--nodes", str(nodes), "--pods", str(pods), *extra)


@pytest.mark.parametrize(
    "policy", ["random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd", "gpuplane"]
)
def test_json_document(trace: tuple[Path, Path], policy: str) -> None:
    run = simulate(*trace, "--policy", policy, "--seed", "3", "--output", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert {
        "protocol",
        "policy",
        "seed",
        "gpusTotal",
        "allocationPct",
        "fragmentationPct",
        "wallSeconds",
    } <= set(doc)
    assert (doc["protocol"], doc["policy"], doc["seed"], doc["gpusTotal"]) == ("fgd", policy, 3, 11)
    assert list(doc["allocationPct"]) == [str(k) for k in range(131)]
    assert list(doc["fragmentationPct"]) == [str(k) for k in range(131)]
    assert doc["arrived"] >= 6
    assert 0 <= doc["failed"] <= doc["arrived"]


def test_seeded_run_is_reproducible_and_the_default_policy_is_gpuplane(trace: tuple[Path, Path]) -> None:
    def document(seed: str) -> dict[str, object]:
        run = simulate(*trace, "--seed", seed, "-o", "json")
        assert run.returncode == 0, run.stderr
        doc: dict[str, object] = json.loads(run.stdout)
        del doc["wallSeconds"]
        return doc

    first = document("11")
    assert first["policy"] == "gpuplane"
    assert document("11") == first


def test_arrival_and_node_rank_files(trace: tuple[Path, Path], tmp_path: Path) -> None:
    arrivals = tmp_path / "arrivals.csv.gz"
    arrivals.write_bytes(gzip.compress(b"seed,position,source_pod\n5,1,p-1\n5,0,p-0\n6,0,p-4\n"))
    ranks = tmp_path / "ranks.csv"
    ranks.write_text("seed,node_sn,sim_node_name\n5,n-a,0002-n-a\n5,n-b,0001-n-b\n5,n-c,0000-n-c\n")
    run = simulate(
        *trace,
        "--policy",
        "bestfit",
        "--seed",
        "5",
        "--arrivals",
        str(arrivals),
        "--node-rank",
        str(ranks),
        "-o",
        "json",
    )
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["arrived"], doc["failed"]) == (2, 0)


def test_table_summary(trace: tuple[Path, Path]) -> None:
    run = simulate(*trace, "--policy", "fgd")
    assert run.returncode == 0, run.stderr
    for text in ("allocation at 50 % arrived", "allocation at 130 % arrived", "pods failed", "wall time"):
        assert text in run.stdout


@pytest.mark.parametrize(
    ("which", "content", "want_message"),
    [
        pytest.param("nodes", None, "cannot read", id="missing node file"),
        pytest.param(
            "nodes", "sn,cpu,gpu\nx,1,1\n", "missing column(s) cpu_milli, memory_mib", id="bad header"
        ),
        pytest.param(
            "pods",
            PODS.replace("p-1,8000", "p-1,lots"),
            "line 3: column cpu_milli: not an integer: 'lots'",
            id="bad number",
        ),
        pytest.param("pods", PODS + "p-0,1,1,0,0,,LS\n", "duplicate pod name", id="duplicate pod"),
        pytest.param("pods", b"\xff\xfe", "cannot read", id="not text"),
        pytest.param("pods", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\n", "no pods", id="no pods"),
        pytest.param(
            "nodes", "sn,cpu_milli,memory_mib,gpu,model\nx,1000,1000,0,\n", "no node has a GPU", id="no GPUs"
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    trace: tuple[Path, Path], which: str, content: str | bytes | None, want_message: str
) -> None:
    path = trace[0] if which == "nodes" else trace[1]
    if content is None:
        path.unlink()
    elif isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    run = simulate(*trace, "--policy", "bestfit")
    assert run.returncode == 2
    assert run.stderr.count("\n") == 1, run.stderr
    assert want_message in run.stderr
    assert "Traceback" not in run.stderr


def test_unknown_policy_is_exit_2_naming_the_valid_ones(trace: tuple[Path, Path]) -> None:
    run = simulate(*trace, "--policy", "tetris")
    assert run.returncode == 2
    assert "unknown placement policy 'tetris'; valid: random, dotprod" in run.stderr


def test_unknown_source_pod_in_arrivals_is_exit_2(trace: tuple[Path, Path], tmp_path: Path) -> None:
    arrivals = tmp_path / "arrivals.csv"
    arrivals.write_text("seed,position,source_pod\n42,0,nobody\n")
    run = simulate(*trace, "--arrivals", str(arrivals))
    assert run.returncode == 2
    assert "source_pod 'nobody' is not in the pod list" in run.stderr


def test_protocol_needs_its_files() -> None:
    run = gpuplane("simulate", "--protocol", "fgd")
    assert run.returncode == 2
    assert "needs --nodes and --pods" in run.stderr


def test_cpu_only_workload_is_not_tuned_forever(trace: tuple[Path, Path]) -> None:
    trace[1].write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\nc-0,1000,1024,0,0\nc-1,2000,1024,0,0\n")
    run = simulate(*trace, "--policy", "bestfit", "-o", "json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert (doc["arrived"], doc["failed"], doc["allocationPct"]["0"]) == (2, 0, 0.0)
