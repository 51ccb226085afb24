"""The image recipe (Dockerfile) against what it installs and what deploy/ runs.

No image is built here (there is no container runtime); scripts/check-wheel.sh installs the same
wheel with the same pins in a fresh environment, and CI runs it. These checks keep the recipe, its
pins, the package's metadata and the manifests in step.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml
from typer.testing import CliRunner

import gpuplane
from gpuplane.cli.app import build_app

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
CONSTRAINTS = ROOT / "deploy" / "image" / "constraints.txt"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuation lines joined), one list per stage."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    stages: list[list[str]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def _pins() -> dict[str, str]:
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = PIN.match(line.strip())
        assert match, f"{CONSTRAINTS.name}: not NAME==VERSION: {line!r}"
        pins[_normal(match.group(1))] = match.group(2)
    return pins


def test_gpuplane_version_flag() -> None:
    result = CliRunner().invoke(build_app(), ["--version"])
    assert result.exit_code == 0
    assert result.stdout.strip() == f"gpuplane {gpuplane.__version__}"


def test_every_dependency_is_pinned_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = _pins()
    wanted = {_normal(re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0]) for d in project["dependencies"]}
    assert wanted <= set(pins), f"not pinned: {sorted(wanted - set(pins))}"
    assert "gpuplane" not in pins
    lines = [x for x in CONSTRAINTS.read_text().splitlines() if x and not x.startswith("#")]
    assert len(lines) == len(pins), "a package is pinned twice"


def test_two_stages_wheel_then_runtime_with_the_pins() -> None:
    builder, runtime = _stages()
    assert any("pip wheel" in i and "--no-deps" in i for i in builder)
    (install,) = [i for i in runtime if i.startswith("RUN ") and "pip install" in i]
    assert "from=wheel" in install
    assert "deploy/image/constraints.txt" in install
    assert "--constraint /constraints.txt" in install
    assert "gpuplane --version" in install  # the image refuses to build with a broken install


def test_the_base_is_the_python_the_pins_were_checked_on() -> None:
    (arg,) = [line for line in DOCKERFILE.read_text().splitlines() if line.startswith("ARG PYTHON_IMAGE=")]
    version = re.search(r"python:(\d+)\.(\d+)", arg)
    assert version is not None
    # scripts/check-wheel.sh makes and checks the pins with the python3 that runs the tests.
    assert (int(version.group(1)), int(version.group(2))) == sys.version_info[:2]


def test_runtime_is_non_root_and_writes_only_under_tmp() -> None:
    runtime = _stages()[-1]
    (user,) = [i for i in runtime if i.startswith("USER ")]
    assert user == "USER ${UID}:${UID}"
    (uid,) = [i for i in runtime if i.startswith("ARG UID=")]
    assert uid == "ARG UID=65532"
    env = " ".join(i for i in runtime if i.startswith("ENV "))
    for name in ("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "MPLCONFIGDIR"):
        value = re.search(rf"\b{name}=(\S+)", env)
        assert value is not None, name
        assert value.group(1).startswith("/tmp"), name
    assert "PYTHONDONTWRITEBYTECODE=1" in env


def _containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(file, pod spec, container) of every container that runs the gpuplane image in deploy/."""
    found = []
    for path in sorted((ROOT / "deploy").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict) or doc.get("kind") != "Deployment":
                continue
            pod = doc["spec"]["template"]["spec"]
            found.extend(
                (path.name, pod, c)
                for c in pod["containers"]
                if str(c.get("image", "")).split(":")[0] == "gpuplane"
            )
    return found


def test_manifests_run_the_image_as_its_user_read_only_at_the_package_version() -> None:
    containers = _containers()
    assert len(containers) >= 2
    for name, pod, container in containers:
        assert container["image"] == f"gpuplane:{gpuplane.__version__}", name
        assert container["command"] == ["gpuplane"], name
        user = (container.get("securityContext") or {}).get("runAsUser")
        user = user if user is not None else (pod.get("securityContext") or {}).get("runAsUser")
        assert user == 65532, name  # the Dockerfile's UID
        assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
    kustomization = yaml.safe_load((ROOT / "deploy" / "kustomization.yaml").read_text())
    (image,) = kustomization["images"]
    assert (image["name"], image["newTag"]) == ("gpuplane", gpuplane.__version__)


def test_dockerignore_lets_in_what_the_build_copies() -> None:
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = set()
    for stage in _stages():
        for instruction in stage:
            if instruction.startswith("COPY ") and "--from" not in instruction:
                copied.update(instruction.split()[1:-1])
            copied.update(re.findall(r"type=bind,source=([^,\s]+)", instruction))
    assert copied == allowed
