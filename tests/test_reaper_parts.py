"""The reaper's parts without a cluster: the webhook sender, dcgm-exporter label reading, which
resources count as GPUs, the command's bad input."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.main import get_command

from gpuplane.cli.app import build_app
from gpuplane.core.session import DeviceConfig
from gpuplane.insight import idle
from gpuplane.reaper.cluster import ACCELERATOR_PREFIXES, accelerator_prefixes, pod_gpus
from gpuplane.reaper.notify import IdleNotice, Retry, SlackNotifier, slack_body
from gpuplane.reaper.prometheus import device_of, pod_of
from reaper_scene import slack, wait_until

ROOT = Path(__file__).resolve().parent.parent
NOTICE = IdleNotice("team-a", "nb-0", "Notebook", "nb", 2, 9000.0, 1_800_000_000.0)


def test_slack_body_names_pod_owner_gpus_idle_time_reclaim_time_and_how_to_keep() -> None:
    body = slack_body(NOTICE)
    assert body["text"].startswith("team-a/nb-0 (Notebook nb) has left 2 GPU(s) idle for 2h30m")
    fields = [f["text"] for f in body["blocks"][1]["fields"]]
    assert fields == [
        "*Pod*\nteam-a/nb-0",
        "*Owner*\nNotebook nb",
        "*GPUs*\n2",
        "*Idle for*\n2h30m",
        f"*Reclaim at*\n{idle.format_time(1_800_000_000.0)}",
    ]
    assert idle.KEEP_UNTIL_ANNOTATION in body["blocks"][2]["elements"][0]["text"]
    assert slack_body(replace(NOTICE, reclaimed=True))["text"].startswith("Reclaimed 2 idle GPU(s)")


def test_the_accelerators_counted_are_the_device_configurations_plus_other_vendors() -> None:
    assert set(ACCELERATOR_PREFIXES) == {
        "nvidia.com/gpu",
        "nvidia.com/mig-",
        "amd.com/gpu",
        "habana.ai/",
        "google.com/tpu",
    }
    pod = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "4"}}},
                {"resources": {"requests": {"nvidia.com/mig-1g.10gb": "1", "habana.ai/gaudi": "1"}}},
            ]
        }
    }
    assert pod_gpus(pod) == 4
    other = accelerator_prefixes(
        DeviceConfig(whole_resources=("example.com/accel",), mig_prefix="example.com/mig-")
    )
    vendor = {
        "spec": {"containers": [{"resources": {"limits": {"example.com/accel": "3", "nvidia.com/gpu": "1"}}}]}
    }
    assert pod_gpus(vendor, other) == 3, "the configured resources, not a vendor's"


def test_send_never_blocks_and_429_is_retried_after_retry_after() -> None:
    with slack(["429", "500"]) as receiver:
        notifier = SlackNotifier(receiver.url, timeout=2.0, retry=Retry(backoff=0.1))
        try:
            notifier.send(NOTICE)
            notifier.send(NOTICE)
            wait_until(lambda: len(receiver.bodies) == 2, timeout=20, message="both delivered")
        finally:
            notifier.close()
    assert receiver.answers == ["429", "500", "200", "200"]
    assert (notifier.sent, notifier.attempts, notifier.dropped) == (2, 4, 0)


def test_a_hanging_receiver_times_out_and_the_message_is_sent_again() -> None:
    with slack(["hang"]) as receiver:
        notifier = SlackNotifier(receiver.url, timeout=0.5, retry=Retry(backoff=0.1))
        try:
            notifier.send(NOTICE)
            assert notifier.sent == 0  # send() returned while the receiver hangs
            wait_until(lambda: receiver.bodies, timeout=20, message="delivered after the hang")
        finally:
            notifier.close()
    assert receiver.answers[:2] == ["hang", "200"]


def test_max_attempts_bounds_the_retries() -> None:
    with slack(["500"] * 5) as receiver:
        notifier = SlackNotifier(receiver.url, timeout=2.0, retry=Retry(backoff=0.05, max_attempts=2))
        try:
            notifier.send(NOTICE)
            wait_until(lambda: notifier.dropped == 1, timeout=20, message="given up")
        finally:
            notifier.close()
    assert receiver.bodies == []
    assert receiver.answers == ["500", "500"]


@pytest.mark.parametrize(
    ("labels", "want_pod", "want_device"),
    [
        ({"pod": "p", "namespace": "a", "UUID": "GPU-1", "gpu": "0"}, ("a", "p"), "GPU-1"),
        ({"exported_pod": "p", "exported_namespace": "a", "uuid": "GPU-2"}, ("a", "p"), "GPU-2"),
        ({"pod": "p", "namespace": "a", "UUID": "GPU-3", "GPU_I_ID": "4"}, ("a", "p"), "GPU-3/mig-4"),
        ({"pod": "p", "namespace": "a", "hostname": "n1", "gpu": "7"}, ("a", "p"), "n1/7"),
        ({"UUID": "GPU-4", "gpu": "1"}, None, "GPU-4"),
    ],
    ids=["plain", "exported-and-old-uuid", "mig", "no-uuid", "no-pod"],
)
def test_dcgm_labels(labels: dict[str, str], want_pod: tuple[str, str] | None, want_device: str) -> None:
    assert pod_of(labels) == want_pod
    assert device_of(labels) == want_device


def reaper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane", "reaper", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (["--window", "2x"], "--window: invalid duration '2x'"),
        (["--threshold", "5"], "--threshold: 5 is not a ratio in 0..1"),
        (["--at", "yesterday"], "--at: 'yesterday' is not an RFC 3339 time"),
        (["--kubeconfig", "/nonexistent/kubeconfig"], "cannot reach the Kubernetes API"),
    ],
    ids=["window", "threshold", "at", "kubeconfig"],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], want: str) -> None:
    run = reaper("--prometheus", "http://127.0.0.1:9", "--once", *args)
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert want in lines[0]
    assert "Traceback" not in run.stderr


# --- deploy/reaper ----------------------------------------------------------------------------------


def test_reaper_deployment_runs_a_command_gpuplane_accepts_as_a_dry_run() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy" / "reaper" / "reaper.yaml").read_text()))
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpuplane-reaper"
    (container,) = pod["containers"]
    argv = [*container["command"], *container["args"]]
    assert argv[:2] == ["gpuplane", "reaper"]
    command = getattr(get_command(build_app()), "commands", {})["reaper"]
    with command.make_context("reaper", argv[2:]) as ctx:
        params = ctx.params
    assert params["enforce"] is False
    assert idle.parse_duration(params["window"]) == 7200
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e for e in container["env"]}
    assert env["GPUPLANE_NOTIFY_URL"]["valueFrom"]["secretKeyRef"]["optional"] is True
    binding = next(d for d in docs if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpuplane-reaper", "namespace": "gpuplane-system"}
    ]
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["apiGroups"] + rule["resources"] + rule["verbs"]
