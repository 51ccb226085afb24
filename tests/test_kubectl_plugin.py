"""`kubectl gpuplane` (the console script ``kubectl-gpuplane``) through the real kubectl.

kubectl finds the plugin on the ``PATH`` and hands it the words after ``kubectl gpuplane`` and its
environment. The end-to-end test runs on the API-server double, and unchanged on a real control
plane with ``GPUPLANE_E2E_KUBECONFIG`` (scripts/test.sh runs it there too): a job that fits runs, a
job that does not waits, and ``why job/NAME``, ``queue`` and ``top`` answer about them.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller_harness import Scene, wait_until
from gpuplane.cli import kubectl_plugin
from gpuplane.cli.kubectl_plugin import (
    PluginError,
    build_plugin,
    busy_by_team,
    kubeconfig_path,
    target,
    top_rows,
)
from prometheus import PrometheusFactory
from test_chargeback import history

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"


# --- the flags, as kubectl resolves them -----------------------------------------------------------


def _kubeconfig(path: Path, namespace: str | None = None) -> Path:
    context: dict[str, Any] = {"cluster": "c", "user": "u"}
    if namespace is not None:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [
            {"name": "main", "context": context},
            {"name": "other", "context": {**context, "namespace": "o"}},
        ],
        "current-context": "main",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_console_script_is_declared() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, function = scripts["kubectl-gpuplane"].partition(":")
    assert (module, function) == (kubectl_plugin.__name__, "main")


def test_kubeconfig_is_the_flag_then_the_environment_then_home(tmp_path: Path) -> None:
    flag = _kubeconfig(tmp_path / "flag")
    env = _kubeconfig(tmp_path / "env")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    _kubeconfig(home / ".kube" / "config")
    assert kubeconfig_path(str(flag), {"KUBECONFIG": str(env)}) == str(flag)
    listed = f"{tmp_path / 'missing'}{os.pathsep}{env}"
    assert kubeconfig_path(None, {"KUBECONFIG": listed, "HOME": str(home)}) == str(env)
    assert kubeconfig_path(None, {"HOME": str(home)}) == str(home / ".kube" / "config")
    with pytest.raises(PluginError, match="no such file"):
        kubeconfig_path(str(tmp_path / "nope"), {})
    with pytest.raises(PluginError, match="no kubeconfig"):
        kubeconfig_path(None, {"HOME": str(tmp_path / "empty")})


def test_namespace_is_the_flag_then_the_context_then_default(tmp_path: Path) -> None:
    config = str(_kubeconfig(tmp_path / "config", namespace="team-a"))
    assert target(config, None, None, False).namespace == "team-a"
    assert target(config, "other", None, False).namespace == "o"
    assert target(config, None, "team-b", False).namespace == "team-b"
    assert target(config, None, None, True).namespace is None
    plain = str(_kubeconfig(tmp_path / "plain"))
    assert target(plain, None, None, False).namespace == "default"
    with pytest.raises(PluginError, match="not both"):
        target(config, None, "team-b", True)
    with pytest.raises(PluginError, match='context "nope" does not exist'):
        target(config, "nope", None, False)


def test_bad_flags_are_one_line_and_status_2(tmp_path: Path) -> None:
    config = str(_kubeconfig(tmp_path / "config"))
    runner = CliRunner()
    cases = [
        (["why", "job/x", "-A", "--kubeconfig", config], "not -A"),
        (["queue", "-n", "a", "-A", "--kubeconfig", config], "not both"),
        (["top", "--window", "soon", "--kubeconfig", config], "--window"),
        (["queue", "--kubeconfig", str(tmp_path / "none")], "no such file"),
    ]
    for args, message in cases:
        result = runner.invoke(build_plugin(), args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.stderr
        assert "Traceback" not in result.output


def test_top_rows_join_allocated_and_busy() -> None:
    rows = top_rows({"a": (4.0, 2), "b": (1.5, 1)}, {"a": 2.25, "c": 0.5})
    assert rows == [
        {"team": "a", "pods": 2, "gpusAllocated": 4.0, "gpusBusy": 2.25},
        {"team": "b", "pods": 1, "gpusAllocated": 1.5, "gpusBusy": 0.0},
        {"team": "c", "pods": 0, "gpusAllocated": 0.0, "gpusBusy": 0.5},
    ]
    assert top_rows({"a": (1.0, 1)}, None)[0]["gpusBusy"] is None


def test_busy_gpus_per_team_from_the_recording_rule(prometheus_factory: PrometheusFactory) -> None:
    """The chargeback's backfilled history on a real Prometheus: at its end, team alpha's two pods
    keep 1.5 and 0.25 GPUs busy, beta's one pod 1.0; averaged over 5 minutes, and in one namespace."""
    end = (int(time.time()) // 60) * 60 - 600
    prom = prometheus_factory(backfill=history(end))
    assert busy_by_team(prom.url, None, "5m", end) == pytest.approx({"alpha": 1.75, "beta": 1.0})
    assert busy_by_team(prom.url, "ml-b", "5m", end) == pytest.approx({"beta": 1.0})
    assert busy_by_team(prom.url, "nobody", "5m", end) == {}


# --- through the real kubectl ----------------------------------------------------------------------


@pytest.fixture
def plugin_path(tmp_path: Path) -> Path:
    """A folder holding ``kubectl-gpuplane`` for this checkout (the console script runs the same
    ``main``), for kubectl to find on the ``PATH``."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "kubectl-gpuplane"
    script.write_text(
        f'#!/bin/sh\nPYTHONPATH="{SRC}" exec "{sys.executable}" -m gpuplane.cli.kubectl_plugin "$@"\n'
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _kubectl_gpuplane(
    plugin_path: Path, home: Path, args: list[str], kubeconfig: str | None
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("kubectl")
    assert binary is not None
    home.mkdir(parents=True, exist_ok=True)
    env = {
        "HOME": str(home),
        "PATH": f"{plugin_path}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    return subprocess.run(
        [binary, "gpuplane", *args], capture_output=True, text=True, env=env, timeout=60, check=False
    )


@pytest.mark.timeout(90)
def test_why_queue_and_top_through_kubectl(scene: Scene, plugin_path: Path, tmp_path: Path) -> None:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (scripts/test.sh installs the Debian package `kubectl`)")
    scene.setup(nodes=1)
    scene.kubectl("label", "namespace", scene.namespace, "team=vision")
    scene.job_controller()
    scene.controller(leader_election=False)
    scene.submit(scene.job("fits", gpus=6))
    wait_until(lambda: scene.bound("fits", 1), 30, "the first job bound")
    scene.submit(scene.job("train", gpus=4))  # 4 more GPUs do not fit in 8
    wait_until(lambda: "train" in scene.workloads(), 30, "the Workload of Job train")
    workload = scene.workloads()["train"]["metadata"]["name"]
    home = tmp_path / "home"

    def run(*args: str, kubeconfig: str | None = scene.kubeconfig) -> subprocess.CompletedProcess[str]:
        result = _kubectl_gpuplane(plugin_path, home, list(args), kubeconfig)
        assert result.returncode == 0, f"kubectl gpuplane {' '.join(args)}:\n{result.stderr}"
        return result

    # why job/train: KUBECONFIG from kubectl's environment, -n as kubectl takes it.
    answer = json.loads(run("why", "job/train", "-n", scene.namespace, "-o", "json").stdout)
    assert answer["workload"] == f"{scene.namespace}/{workload}"
    assert answer["positionInClusterQueue"] == 1
    assert answer["reason"]
    table = run("why", "job/train", "--namespace", scene.namespace).stdout
    assert workload in table
    assert "fix" in table
    # --kubeconfig given after the plugin's name, with no KUBECONFIG in the environment.
    flagged = run(
        "why", "job/train", "-n", scene.namespace, "--kubeconfig", scene.kubeconfig, kubeconfig=None
    )
    assert workload in flagged.stdout

    queued = json.loads(run("queue", "-n", scene.namespace, "-o", "json").stdout)["items"]
    assert [(r["workload"], r["positionInClusterQueue"]) for r in queued] == [(workload, 1)]
    assert queued[0]["localQueue"] == "queue"
    # No -n: the namespace of the context, the current one or the one --context names.
    config = yaml.safe_load(Path(scene.kubeconfig).read_text())
    (entry,) = [c for c in config["contexts"] if c["name"] == config["current-context"]]
    config["contexts"].append({"name": "team", "context": {**entry["context"], "namespace": scene.namespace}})
    teamed = tmp_path / "teamed-kubeconfig"
    teamed.write_text(yaml.safe_dump(config))

    def names(*args: str) -> list[tuple[str, str]]:
        items = json.loads(run("queue", "-o", "json", *args, kubeconfig=str(teamed)).stdout)["items"]
        return [(r["namespace"], r["workload"]) for r in items]

    assert names("--context", "team") == [(scene.namespace, workload)]
    config["current-context"] = "team"
    teamed.write_text(yaml.safe_dump(config))
    assert names() == [(scene.namespace, workload)]
    everywhere = run("queue", "-A").stdout
    assert "NAMESPACE" in everywhere
    assert workload in everywhere
    assert scene.namespace in everywhere

    top = json.loads(run("top", "-n", scene.namespace, "-o", "json").stdout)["items"]
    assert top == [{"team": "vision", "pods": 1, "gpusAllocated": 6.0, "gpusBusy": None}]
    assert "vision" in run("top", "-A").stdout

    missing = _kubectl_gpuplane(
        plugin_path, home, ["why", "job/absent", "-n", scene.namespace], scene.kubeconfig
    )
    assert missing.returncode == 2
    assert "absent" in missing.stderr
