"""`gpuplane doctor`'s webhook checks: registered for pods and jobs, and answering.

The registration and probe checks are pure (tables below); the live command runs against the
``apiserver`` fixture: on a real control plane (``GPUPLANE_E2E_KUBECONFIG``) with the test webhook
registered, where the dry-run probe goes through the API server's admission chain for real.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from controller_harness import Scene
from gpuplane.cli.app import build_app
from gpuplane.insight.webhook_doctor import WebhookProbe, probe_findings, registration_findings

DEPLOYED = next(
    d
    for d in yaml.safe_load_all((Path(__file__).resolve().parents[1] / "deploy" / "webhook.yaml").read_text())
    if d and d["kind"] == "MutatingWebhookConfiguration"
)


def config(name: str, *hooks: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels or {}}, "webhooks": list(hooks)}


def hook(name: str, *resources: tuple[str, str], operations: tuple[str, ...] = ("CREATE",)) -> dict[str, Any]:
    rules = [
        {"apiGroups": [g], "apiVersions": ["*"], "operations": list(operations), "resources": [r]}
        for g, r in resources
    ]
    return {"name": name, "rules": rules, "clientConfig": {"url": "https://127.0.0.1:9443/"}}


ALL_JOBS = (("batch", "jobs"), ("jobset.x-k8s.io", "jobsets"), ("kubeflow.org", "pytorchjobs"))
ALL_JOBS += (("trainer.kubeflow.org", "trainjobs"), ("ray.io", "rayjobs"))


def pods_only(config: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(config)
    out["webhooks"] = [h for h in out["webhooks"] if "jobs" not in h["name"]]
    return out


@pytest.mark.parametrize(
    ("configs", "want"),
    [
        pytest.param([], [("error", "webhook-not-registered")], id="none"),
        pytest.param(
            [config("kueue", hook("mpod.kb.io", ("", "pods"), ("batch", "jobs")))],
            [("error", "webhook-not-registered")],
            id="someone-elses",
        ),
        pytest.param([DEPLOYED], [], id="deploy-webhook-yaml"),
        pytest.param(
            [pods_only(DEPLOYED)],
            [("error", "webhook-misses-jobs"), ("warning", "webhook-misses-job-kinds")],
            id="before-jobs-were-registered",
        ),
        pytest.param(
            [config("x", hook("jobs.gpuplane.dev", *ALL_JOBS))],
            [("error", "webhook-misses-pods")],
            id="jobs-only",
        ),
        pytest.param(
            [
                config(
                    "gp",
                    hook("a.example.com", ("", "pods"), ("batch", "jobs")),
                    labels={"app.kubernetes.io/name": "gpuplane"},
                )
            ],
            [("warning", "webhook-misses-job-kinds")],
            id="labelled-batch-only",
        ),
        pytest.param(
            [config("x", hook("all.gpuplane.dev", ("*", "*")))],
            [],
            id="wildcards",
        ),
        pytest.param(
            [config("x", hook("p.gpuplane.dev", ("", "pods"), *ALL_JOBS, operations=("UPDATE",)))],
            [
                ("error", "webhook-misses-pods"),
                ("error", "webhook-misses-jobs"),
                ("warning", "webhook-misses-job-kinds"),
            ],
            id="update-only",
        ),
    ],
)
def test_registration(configs: list[dict[str, Any]], want: list[tuple[str, str]]) -> None:
    found = registration_findings(configs)
    assert [(f.severity, f.check) for f in found] == want
    assert all(f.fix for f in found)


@pytest.mark.parametrize(
    ("probe", "want"),
    [
        pytest.param(WebhookProbe("default", True, True), [], id="answers"),
        pytest.param(
            WebhookProbe("default", True, False), [("error", "webhook-not-answering")], id="job-unchanged"
        ),
        pytest.param(
            WebhookProbe("default", False, False), [("error", "webhook-not-answering")], id="both-unchanged"
        ),
        pytest.param(
            WebhookProbe("default", None, None, "failed calling webhook: connection refused", refused=True),
            [("error", "webhook-not-answering")],
            id="refused",
        ),
        pytest.param(
            WebhookProbe("default", None, None, "pods is forbidden"),
            [("warning", "webhook-not-probed")],
            id="forbidden",
        ),
    ],
)
def test_probe(probe: WebhookProbe, want: list[tuple[str, str]]) -> None:
    found = probe_findings([DEPLOYED], probe)
    assert [(f.severity, f.check) for f in found] == want
    for f in found:
        assert f.objects == ("Namespace/default",)
        if f.severity == "error":
            assert "Service gpuplane-system/gpuplane-webhook:443" in f.fix


# --- the live command ---------------------------------------------------------------------------------


def doctor(scene: Scene, namespace: str) -> tuple[int, list[str]]:
    args = ["doctor", "--kubeconfig", scene.kubeconfig, "--probe-namespace", namespace]
    result = CliRunner().invoke(build_app(), args)
    return result.exit_code, [line for line in result.stdout.splitlines() if "webhook" in line]


@pytest.mark.timeout(60)
def test_doctor_checks_the_webhook_of_a_live_cluster(scene: Scene) -> None:
    scene.setup(nodes=1)
    code, lines = doctor(scene, scene.namespace)
    if not scene.real:  # the double serves no admissionregistration API: nothing can be checked
        assert len(lines) == 1
        assert lines[0].startswith("[warning] webhook-not-probed")
        return
    assert lines == [], "registered for pods and jobs, and it answers in the scene's namespace"
    # A namespace outside the registered webhook's selector: the dry runs come back unchanged.
    code, lines = doctor(scene, "default")
    assert code == 1
    assert len(lines) == 1
    assert lines[0].startswith("[error] webhook-not-answering: Namespace/default: a dry-run queued pod and")
    assert "https://127.0.0.1:" in lines[0]  # the test webhook's URL
