"""Malformed cluster state ends as one located InputError, and as one line on stderr with exit status 2.

Each case is a small file (or two) with one defect. The loader must name the file, the document index
(when the file parsed far enough to have documents), the object, the field path, and say what is wrong;
``gpuplane schedule`` must print exactly that one line and exit 2, never a traceback.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from gpuplane.model.errors import InputError
from gpuplane.model.loader import load_files
from manifests import (
    Manifest,
    cluster_queue,
    cohort,
    documents,
    list_of,
    local_queue,
    namespace,
    node,
    pod_spec,
    resource_flavor,
    workload,
)

# What the `gpuplane` console script runs. (`python -m gpuplane.cli.app` would not: app.py has no
# `__main__` block.) The test interpreter is used so that the CLI sees the same installation.
GPUPLANE = (
    sys.executable,
    "-c",
    "import sys; from gpuplane.cli.app import main; sys.argv[0] = 'gpuplane'; main()",
)

QUOTA = "spec.resourceGroups[0].flavors[0].resources[0]"
POD_SET = "spec.podSets[0]"
REQUESTS = f"{POD_SET}.template.spec.containers[0].resources.requests"


@dataclass(frozen=True)
class BadInput:
    """Files to load, in order (the defect is in the last one), and what the error must say."""

    files: tuple[tuple[str, str | bytes], ...]
    want_document: int | None
    want_object: str | None
    want_field: str | None
    want_message: str
    strict: bool = False


def bad(
    text: str | bytes,
    *,
    name: str = "state.yaml",
    earlier: tuple[tuple[str, str], ...] = (),
    want_document: int | None,
    want_object: str | None,
    want_field: str | None,
    want_message: str,
    strict: bool = False,
) -> BadInput:
    return BadInput((*earlier, (name, text)), want_document, want_object, want_field, want_message, strict)


def team_queue() -> Manifest:
    return cluster_queue("q").flavor("default", cpu="10")


def team_workload() -> Manifest:
    return workload("w", "team-a").queue("lq").podset(count=2, cpu="1")


def billion_laughs(levels: int = 9, refs: int = 9) -> str:
    """A YAML alias bomb: ``levels`` anchors, each a list of ``refs`` aliases of the one before."""
    lines = ['l0: &l0 "lol"']
    for level in range(1, levels + 1):
        aliases = ", ".join([f"*l{level - 1}"] * refs)
        lines.append(f"l{level}: &l{level} [{aliases}]")
    return "\n".join(lines) + "\n"


NAMESPACE_TEXT = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team-a\n"

BAD_INPUTS = [
    # --- broken YAML -------------------------------------------------------------------------------
    pytest.param(
        bad(
            NAMESPACE_TEXT + "   labels: {}\n",
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="invalid YAML at line 5, column 10: mapping values are not allowed",
        ),
        id="yaml-bad-indentation",
    ),
    pytest.param(
        bad(
            'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: "team-a\n',
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="invalid YAML at line 5",
        ),
        id="yaml-unclosed-quote",
    ),
    pytest.param(
        bad(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n\tname: team-a\n",
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="invalid YAML at line 4, column 1: found character that cannot start any token",
        ),
        id="yaml-tab-indentation",
    ),
    pytest.param(
        bad(
            NAMESPACE_TEXT + "---\n" + NAMESPACE_TEXT + "---\nkind: [Namespace\n",
            want_document=2,
            want_object=None,
            want_field=None,
            want_message="invalid YAML at line 12, column 1: did not find expected ',' or ']'",
        ),
        id="yaml-broken-third-document",
    ),
    pytest.param(
        bad(
            "apiVersion: v1\nkind: Namespace\nmetadata: {name: team-a\x00}\n",
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="invalid YAML: unacceptable character #x0000",
        ),
        id="yaml-control-character",
    ),
    pytest.param(
        bad(
            "apiVersion: v1\nkind: Namespace\nmetadata: *meta\n",
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="found undefined alias 'meta'",
        ),
        id="yaml-undefined-alias",
    ),
    # --- broken JSON: one document, so the location is the line and column -------------------------
    pytest.param(
        bad(
            '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"},}',
            name="state.json",
            want_document=None,
            want_object=None,
            want_field=None,
            want_message="invalid JSON at line 1, column 74",
        ),
        id="json-trailing-comma",
    ),
    pytest.param(
        bad(
            '{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ',
            name="state.json",
            want_document=None,
            want_object=None,
            want_field=None,
            want_message="invalid JSON at line 1",
        ),
        id="json-truncated",
    ),
    pytest.param(
        bad(
            '{"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}, '
            + '"status": {"allocatable": {"cpu": '
            + "9" * 5000
            + "}}}",
            name="state.json",
            want_document=None,
            want_object=None,
            want_field=None,
            want_message="invalid JSON: cannot decode a value",
        ),
        id="json-number-of-5000-digits",
    ),
    # --- objects the loader does not know, or that are not objects ---------------------------------
    pytest.param(
        bad(
            "apiVersion: v1\nkind: Gadget\nmetadata: {name: g}\n",
            want_document=0,
            want_object="Gadget/g",
            want_field="kind",
            want_message="unknown kind 'Gadget'",
        ),
        id="unknown-kind",
    ),
    pytest.param(
        bad(
            documents(team_queue().set("apiVersion", "kueue.x-k8s.io/v1alpha9")),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="apiVersion",
            want_message="unsupported apiVersion kueue.x-k8s.io/v1alpha9",
        ),
        id="unknown-kueue-version",
    ),
    pytest.param(
        bad(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, namespace: team-a}\n",
            want_document=0,
            want_object="Deployment/team-a/d",
            want_field="apiVersion",
            want_message="unsupported apiVersion apps/v1",
        ),
        id="unknown-api-group",
    ),
    pytest.param(
        bad(
            "kind: Namespace\nmetadata: {name: team-a}\n",
            want_document=0,
            want_object="Namespace/team-a",
            want_field="apiVersion",
            want_message="required field is missing",
        ),
        id="missing-api-version",
    ),
    pytest.param(
        bad(
            NAMESPACE_TEXT + "---\n- 1\n- 2\n",
            want_document=1,
            want_object=None,
            want_field="items[0]",
            want_message="expected a Kubernetes object, got number",
        ),
        id="document-is-a-list-of-scalars",
    ),
    pytest.param(
        bad(
            "just some words\n",
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="expected a Kubernetes object, got string",
        ),
        id="document-is-a-scalar",
    ),
    pytest.param(
        bad(
            documents(list_of(namespace("team-a"), resource_flavor("default").drop("metadata.name"))),
            want_document=0,
            want_object="ResourceFlavor",
            want_field="items[1].metadata.name",
            want_message="required field is missing",
        ),
        id="list-item-without-name",
    ),
    # --- required fields ---------------------------------------------------------------------------
    pytest.param(
        bad(
            documents(namespace("team-a"), resource_flavor("default").drop("metadata.name")),
            want_document=1,
            want_object="ResourceFlavor",
            want_field="metadata.name",
            want_message="required field is missing",
        ),
        id="missing-metadata-name",
    ),
    pytest.param(
        bad(
            documents(team_queue(), local_queue("lq", "team-a", "q").drop("spec.clusterQueue")),
            want_document=1,
            want_object="LocalQueue/team-a/lq",
            want_field="spec.clusterQueue",
            want_message="required field is missing",
        ),
        id="local-queue-without-cluster-queue",
    ),
    pytest.param(
        bad(
            documents(team_queue().drop(f"{QUOTA}.nominalQuota")),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field=f"{QUOTA}.nominalQuota",
            want_message="required field is missing",
        ),
        id="missing-nominal-quota",
    ),
    pytest.param(
        bad(
            documents(team_workload().drop("spec.podSets")),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field="spec.podSets",
            want_message="required field is missing",
        ),
        id="workload-without-pod-sets",
    ),
    pytest.param(
        bad(
            documents(team_workload().drop(f"{POD_SET}.template")),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field=f"{POD_SET}.template",
            want_message="required field is missing",
        ),
        id="pod-set-without-template",
    ),
    # --- quantities --------------------------------------------------------------------------------
    pytest.param(
        bad(
            documents(team_queue().set(f"{QUOTA}.nominalQuota", "-5")),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field=f"{QUOTA}.nominalQuota",
            want_message="negative quantity for cpu",
        ),
        id="negative-nominal-quota",
    ),
    pytest.param(
        bad(
            documents(team_queue().set(f"{QUOTA}.nominalQuota", "12Gx")),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field=f"{QUOTA}.nominalQuota",
            want_message="invalid quantity '12Gx'",
        ),
        id="quantity-unknown-suffix",
    ),
    pytest.param(
        bad(
            documents(node("n1").allocatable(memory="abc")),
            want_document=0,
            want_object="Node/n1",
            want_field="status.allocatable.memory",
            want_message="invalid quantity 'abc'",
        ),
        id="quantity-not-a-number",
    ),
    pytest.param(
        bad(
            documents(team_workload().set(f"{REQUESTS}.cpu", "1.2.3")),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field=f"{REQUESTS}.cpu",
            want_message="invalid quantity '1.2.3'",
        ),
        id="quantity-two-decimal-points",
    ),
    # --- wrong types -------------------------------------------------------------------------------
    pytest.param(
        bad(
            documents(team_workload().set(f"{POD_SET}.count", "3")),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field=f"{POD_SET}.count",
            want_message="expected an integer, got string",
        ),
        id="count-is-a-string",
    ),
    pytest.param(
        bad(
            documents(namespace("team-a").label("team", 5)),
            want_document=0,
            want_object="Namespace/team-a",
            want_field="metadata.labels.team",
            want_message="expected a string, got number",
        ),
        id="label-value-is-a-number",
    ),
    pytest.param(
        bad(
            documents(team_queue().set("spec.resourceGroups", {"coveredResources": ["cpu"]})),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="spec.resourceGroups",
            want_message="expected a list, got object",
        ),
        id="resource-groups-is-a-mapping",
    ),
    pytest.param(
        bad(
            documents(namespace("team-a\nb").label("team", 5)),
            want_document=0,
            want_object="Namespace/team-a\nb",
            want_field="metadata.labels.team",
            want_message="expected a string, got number",
        ),
        id="name-with-a-line-break-stays-one-line",
    ),
    # --- references and structure across objects ---------------------------------------------------
    pytest.param(
        bad(
            documents(cohort("a", parent="b"), cohort("b", parent="a")),
            want_document=0,
            want_object="Cohort/a",
            want_field="spec.parentName",
            want_message="cohort cycle: a -> b -> a",
        ),
        id="cohort-cycle",
    ),
    pytest.param(
        bad(
            documents(resource_flavor("default"), cohort("a", parent="a")),
            want_document=1,
            want_object="Cohort/a",
            want_field="spec.parentName",
            want_message="cohort cycle: a -> a",
        ),
        id="cohort-self-loop",
    ),
    pytest.param(
        bad(
            documents(team_queue(), team_queue()),
            want_document=1,
            want_object="ClusterQueue/q",
            want_field="metadata.name",
            want_message="duplicate ClusterQueue 'q'",
        ),
        id="duplicate-cluster-queue",
    ),
    pytest.param(
        bad(
            documents(team_workload(), namespace("team-a"), team_workload()),
            want_document=2,
            want_object="Workload/team-a/w",
            want_field="metadata.name",
            want_message="duplicate Workload 'team-a/w'",
        ),
        id="duplicate-workload",
    ),
    pytest.param(
        bad(
            documents(team_queue()),
            name="b.yaml",
            earlier=(("a.yaml", documents(resource_flavor("default"), team_queue())),),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="metadata.name",
            want_message="a.yaml document 1",
        ),
        id="duplicate-across-two-files",
    ),
    pytest.param(
        bad(
            documents(team_queue().set(f"{QUOTA}.borrowingLimit", "5")),
            strict=True,
            want_document=0,
            want_object="ClusterQueue/q",
            want_field=f"{QUOTA}.borrowingLimit",
            want_message="borrowingLimit for 'cpu' needs the ClusterQueue to be in a cohort",
        ),
        id="strict-borrowing-limit-without-cohort",
    ),
    pytest.param(
        bad(
            documents(
                team_queue().set(
                    "spec.resourceGroups[0].flavors[0].resources[1]",
                    {"name": "memory", "nominalQuota": "1Gi"},
                )
            ),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="spec.resourceGroups[0].flavors[0].resources[1].name",
            want_message="resource 'memory' is not listed in coveredResources",
        ),
        id="resource-not-in-covered-resources",
    ),
    pytest.param(
        bad(
            documents(
                cluster_queue("q").cohort("team").flavor("default", cpu="10").set("spec.cohort", "team")
            ),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="spec.cohort",
            want_message="not served in v1beta2; use 'cohortName'",
        ),
        id="v1beta2-cluster-queue-with-v1beta1-cohort-field",
    ),
    pytest.param(
        bad(
            documents(team_queue().fungibility(whenCanBorrow="Borrow")),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="spec.flavorFungibility.whenCanBorrow",
            want_message="unsupported value 'Borrow'",
        ),
        id="v1beta2-cluster-queue-with-v1beta1-borrow-policy",
    ),
    # --- hostile input -----------------------------------------------------------------------------
    pytest.param(
        bad(
            billion_laughs(),
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="YAML aliases expand to too many nodes (possible alias bomb)",
        ),
        id="yaml-alias-bomb",
    ),
    pytest.param(
        bad(
            "[" * 100_000,
            name="deep.json",
            want_document=None,
            want_object=None,
            want_field=None,
            want_message="document is nested too deeply",
        ),
        id="json-nested-100000-deep",
    ),
    pytest.param(
        bad(
            "x: " + "[" * 100_000 + "]" * 100_000 + "\n",
            want_document=0,
            want_object=None,
            want_field=None,
            want_message="document is nested too deeply",
        ),
        id="yaml-nested-100000-deep",
    ),
    pytest.param(
        bad(
            NAMESPACE_TEXT.encode() + b"  labels: {team: caf\xe9}\n",
            want_document=None,
            want_object=None,
            want_field=None,
            want_message="file is not UTF-8 text (byte 76)",
        ),
        id="non-utf8-bytes",
    ),
    # --- values Kubernetes or Kueue would refuse ---------------------------------------------------
    pytest.param(
        bad(
            documents(team_workload().created("yesterday")),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field="metadata.creationTimestamp",
            want_message="invalid RFC 3339 timestamp 'yesterday'",
        ),
        id="invalid-timestamp",
    ),
    pytest.param(
        bad(
            documents(team_workload()).replace(
                "metadata:\n", "metadata:\n  creationTimestamp: 2026-13-45T00:00:00Z\n"
            ),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field="metadata.creationTimestamp",
            want_message="invalid RFC 3339 timestamp '2026-13-45T00:00:00Z'",
        ),
        id="unquoted-timestamp-with-month-13",
    ),
    pytest.param(
        bad(
            documents(node("n1").allocatable(cpu="8").taint("gpu", "true", "Sometimes")),
            want_document=0,
            want_object="Node/n1",
            want_field="spec.taints[0].effect",
            want_message="unsupported value 'Sometimes'",
        ),
        id="taint-with-unknown-effect",
    ),
    pytest.param(
        bad(
            documents(
                team_queue().namespace_selector({"matchExpressions": [{"key": "team", "operator": "In"}]})
            ),
            want_document=0,
            want_object="ClusterQueue/q",
            want_field="spec.namespaceSelector.matchExpressions[0].values",
            want_message="operator In needs at least one value",
        ),
        id="in-operator-without-values",
    ),
    pytest.param(
        bad(
            documents(
                workload("w", "team-a").podset(
                    count=1,
                    spec=pod_spec().container(cpu="1").affinity_term({"key": "zone", "operator": "Gt"}),
                )
            ),
            want_document=0,
            want_object="Workload/team-a/w",
            want_field=(
                f"{POD_SET}.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
                ".nodeSelectorTerms[0].matchExpressions[0].values"
            ),
            want_message="operator Gt needs exactly one value",
        ),
        id="gt-operator-without-value",
    ),
]


def write_files(directory: Path, files: Sequence[tuple[str, str | bytes]]) -> list[str]:
    paths = []
    for name, content in files:
        path = directory / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        paths.append(str(path))
    return paths


def one_line(text: str) -> str:
    """What InputError prints for text that may hold line breaks."""
    return text.replace("\n", "\\n")


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_loader_names_file_document_object_and_field(case: BadInput, tmp_path: Path) -> None:
    paths = write_files(tmp_path, case.files)

    with pytest.raises(InputError) as caught:
        load_files(paths, strict=case.strict)

    err = caught.value
    assert (err.source, err.document, err.obj, err.field) == (
        paths[-1],
        case.want_document,
        case.want_object,
        case.want_field,
    )
    assert case.want_message in err.message
    where = [
        paths[-1],
        None if case.want_document is None else f"document {case.want_document}",
        case.want_object,
        case.want_field,
    ]
    line = str(err)
    assert line.startswith(one_line(": ".join(part for part in where if part is not None)) + ": ")
    assert case.want_message in line
    assert "\n" not in line


@pytest.fixture(scope="module")
def schedule_command() -> tuple[str, ...]:
    """The `gpuplane schedule` command line, or a skip while the command does not exist yet."""
    probe = subprocess.run(
        [*GPUPLANE, "schedule", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    if probe.returncode != 0:
        pytest.skip(
            "gpuplane.cli.schedule does not define a `schedule` command yet "
            "(`gpuplane schedule --help` fails)"
        )
    return (*GPUPLANE, "schedule")


def run_schedule(
    command: tuple[str, ...], paths: Sequence[str], *flags: str
) -> subprocess.CompletedProcess[str]:
    argv = [*command, *(arg for path in paths for arg in ("-f", path)), *flags]
    return subprocess.run(
        argv, capture_output=True, text=True, encoding="utf-8", errors="replace", timeout=60, check=False
    )


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_cli_prints_one_line_and_exits_2(
    case: BadInput, tmp_path: Path, schedule_command: tuple[str, ...]
) -> None:
    paths = write_files(tmp_path, case.files)

    run = run_schedule(schedule_command, paths, *(["--strict"] if case.strict else []))

    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert "Traceback" not in run.stderr
    assert (run.returncode, len(lines), run.stdout) == (2, 1, ""), run.stderr
    assert paths[-1] in lines[0]
    assert case.want_message in lines[0]
    if case.want_field is not None:
        assert case.want_field in lines[0]


def test_alias_bomb_fails_fast(tmp_path: Path) -> None:
    (path,) = write_files(tmp_path, [("bomb.yaml", billion_laughs(levels=9, refs=9))])

    started = time.perf_counter()
    with pytest.raises(InputError, match="alias"):
        load_files([path])

    assert time.perf_counter() - started < 2.0


EMPTY_FILES = [
    pytest.param("", id="empty"),
    pytest.param("  \n\n   \n", id="whitespace-only"),
    pytest.param("---\n---\n...\n", id="document-markers-only"),
    pytest.param("# nothing here yet\n", id="comment-only"),
    pytest.param("null\n---\n~\n", id="null-documents"),
]


@pytest.mark.parametrize("text", EMPTY_FILES)
def test_empty_input_is_refused_with_one_line(text: str, tmp_path: Path) -> None:
    (path,) = write_files(tmp_path, [("empty.yaml", text)])

    with pytest.raises(InputError, match="no Kubernetes objects in the input") as caught:
        load_files([path])

    assert caught.value.source == path


def test_an_empty_file_next_to_a_full_one_is_fine(tmp_path: Path) -> None:
    paths = write_files(tmp_path, [("empty.yaml", ""), ("state.yaml", NAMESPACE_TEXT)])

    assert list(load_files(paths).namespaces) == ["team-a"]


def test_cli_refuses_an_empty_input_with_one_line(tmp_path: Path, schedule_command: tuple[str, ...]) -> None:
    (path,) = write_files(tmp_path, [("empty.yaml", "")])

    run = run_schedule(schedule_command, [path], "--output", "json")

    assert (run.returncode, run.stdout) == (2, "")
    assert run.stderr.splitlines() == [f"error: {path}: no Kubernetes objects in the input"]


BORROWING_WITHOUT_COHORT = documents(
    resource_flavor("default"), team_queue().set(f"{QUOTA}.borrowingLimit", "5")
)


def test_borrowing_limit_without_cohort_is_a_warning_unless_strict(tmp_path: Path) -> None:
    (path,) = write_files(tmp_path, [("state.yaml", BORROWING_WITHOUT_COHORT)])
    warnings: list[str] = []

    state = load_files([path], warnings=warnings)

    assert state.cluster_queues["q"].resource_groups[0].flavors[0].resources["cpu"].borrowing_limit == 5000
    assert warnings == [
        f"{path}: document 1: ClusterQueue/q: {QUOTA}.borrowingLimit: "
        "borrowingLimit for 'cpu' needs the ClusterQueue to be in a cohort (set spec.cohortName)"
    ]


def test_cli_warns_about_borrowing_limit_without_cohort_and_goes_on(
    tmp_path: Path, schedule_command: tuple[str, ...]
) -> None:
    (path,) = write_files(tmp_path, [("state.yaml", BORROWING_WITHOUT_COHORT)])

    run = run_schedule(schedule_command, [path], "--output", "json")

    assert run.returncode == 0, run.stderr
    assert f"{path}: document 1: ClusterQueue/q: {QUOTA}.borrowingLimit" in run.stderr


HUGE_GPUS = "9999999999999999999999999999999999999999999999999999999999999999999999Ei"


def test_a_node_with_an_absurd_device_count_is_refused_in_a_moment(
    tmp_path: Path, schedule_command: tuple[str, ...]
) -> None:
    # A broken device plugin's count used to make the core build that many devices: minutes, and
    # memory without bound. Now one line, exit 2, well under a second of scheduling.
    huge = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "huge"},
        "status": {"allocatable": {"cpu": "64", "pods": "110", "nvidia.com/gpu": HUGE_GPUS}},
    }
    (path,) = write_files(tmp_path, [("cluster.yaml", yaml.safe_dump(huge))])
    started = time.perf_counter()
    run = run_schedule(schedule_command, [path])
    elapsed = time.perf_counter() - started
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert (run.returncode, len(lines)) == (2, 1), run.stderr
    assert "Node/huge" in lines[0]
    assert "status.allocatable[nvidia.com/gpu]" in lines[0]
    assert "not schedulable" in lines[0]
    assert elapsed < 10.0, "the process starts and stops; the refusal itself is immediate"
