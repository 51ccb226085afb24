"""`gpuplane doctor`'s webhook checks: is gpuplane's mutating webhook registered, and does it answer?

Without it a queued job created unsuspended runs at once under kube-scheduler, and an admitted
job's pods keep the default scheduler name, so gangs end half placed (:mod:`gpuplane.insight.bypass`).
Pure functions over what the driver read: the cluster's MutatingWebhookConfigurations, and the
outcome of a dry-run create of a queued pod and a queued Job (:class:`WebhookProbe`).

* ``webhook-not-registered`` (error): no configuration of gpuplane's (labelled
  ``app.kubernetes.io/name: gpuplane``, or with a webhook named ``*.gpuplane.dev``);
* ``webhook-misses-pods`` / ``webhook-misses-jobs`` (error): registered, but not for the CREATE
  of pods, or of batch Jobs; ``webhook-misses-job-kinds`` (warning): not for another job kind
  gpuplane suspends;
* ``webhook-not-answering`` (error): the API server stored a dry-run queued pod or Job unchanged,
  or refused it because the webhook failed;
* ``webhook-not-probed`` (warning): the probe could not be made (permissions, say), so whether
  the webhook answers is unknown.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplane.insight.doctor import Finding

NAME_SUFFIX = ".gpuplane.dev"
APP_LABEL = "app.kubernetes.io/name"
DOCS = "docs/deploy.md, 'The webhook'"
# (API group, resource) of the job kinds the webhook suspends, batch Jobs first.
JOB_RESOURCES: tuple[tuple[str, str], ...] = (
    ("batch", "jobs"),
    ("jobset.x-k8s.io", "jobsets"),
    ("kubeflow.org", "pytorchjobs"),
    ("trainer.kubeflow.org", "trainjobs"),
    ("ray.io", "rayjobs"),
)


@dataclass(frozen=True, slots=True)
class WebhookProbe:
    """What the API server did with a dry-run queued pod and a dry-run queued Job in ``namespace``:
    whether gpuplane's webhook changed each (the pod got its scheduler name, the Job
    ``suspend: true``). None: not learnt, and ``problem`` says why (``refused``: the create
    itself failed, e.g. a failurePolicy Fail webhook that does not answer)."""

    namespace: str
    pod_mutated: bool | None
    job_suspended: bool | None
    problem: str = ""
    refused: bool = False


def _ours(configs: Iterable[Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """gpuplane's webhooks as (configuration name, webhook)."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    for config in configs:
        meta = config.get("metadata") or {}
        labelled = (meta.get("labels") or {}).get(APP_LABEL) == "gpuplane"
        found.extend(
            (str(meta.get("name", "")), hook)
            for hook in config.get("webhooks") or []
            if labelled or str(hook.get("name", "")).endswith(NAME_SUFFIX)
        )
    return found


def _covers(hook: Mapping[str, Any], group: str, resource: str) -> bool:
    """Whether one of the webhook's rules sends the CREATE of ``group``/``resource`` to it."""
    for rule in hook.get("rules") or []:
        groups = rule.get("apiGroups") or []
        resources = rule.get("resources") or []
        operations = rule.get("operations") or []
        if (
            (group in groups or "*" in groups)
            and (resource in resources or "*" in resources)
            and ("CREATE" in operations or "*" in operations)
        ):
            return True
    return False


def _endpoint(hook: Mapping[str, Any]) -> str:
    client = hook.get("clientConfig") or {}
    service = client.get("service")
    if isinstance(service, Mapping):
        return f"Service {service.get('namespace')}/{service.get('name')}:{service.get('port', 443)}"
    return str(client.get("url", "no endpoint"))


def registration_findings(configs: Sequence[Mapping[str, Any]]) -> list[Finding]:
    """Whether gpuplane's webhook is registered for the CREATE of pods and of each job kind."""
    ours = _ours(configs)
    if not ours:
        return [
            Finding(
                "error",
                "webhook-not-registered",
                ("MutatingWebhookConfiguration",),
                "gpuplane's mutating webhook is not registered: queued Jobs created without "
                "suspend: true run at once under kube-scheduler, and admitted jobs' pods are bound "
                "by kube-scheduler, not by gpuplane",
                f"deploy it with `kubectl apply -k deploy`, or in development run "
                f"`gpuplane webhook` and register it ({DOCS})",
            )
        ]
    names = tuple(sorted({f"MutatingWebhookConfiguration/{name}" for name, _ in ours}))
    findings = []
    if not any(_covers(hook, "", "pods") for _, hook in ours):
        findings.append(
            Finding(
                "error",
                "webhook-misses-pods",
                names,
                "no webhook of gpuplane's is called when a pod is created, so admitted jobs' pods keep "
                "the default scheduler name and kube-scheduler binds them",
                f"re-apply the webhook configuration of this release ({DOCS})",
            )
        )
    missing = [(g, r) for g, r in JOB_RESOURCES if not any(_covers(hook, g, r) for _, hook in ours)]
    if ("batch", "jobs") in missing:
        findings.append(
            Finding(
                "error",
                "webhook-misses-jobs",
                names,
                "no webhook of gpuplane's is called when a Job is created, so a queued Job created "
                "without suspend: true bypasses its queue",
                f"re-apply the webhook configuration of this release ({DOCS})",
            )
        )
    others = [f"{r}.{g}" for g, r in missing if g != "batch"]
    if others:
        findings.append(
            Finding(
                "warning",
                "webhook-misses-job-kinds",
                names,
                f"created unsuspended, these queued kinds are not suspended: {', '.join(others)}",
                f"re-apply the webhook configuration of this release ({DOCS})",
            )
        )
    return findings


def probe_findings(configs: Sequence[Mapping[str, Any]], probe: WebhookProbe) -> list[Finding]:
    """Whether gpuplane's webhook answered the dry-run creates (``configs``: to name its endpoint)."""
    ours = _ours(configs)
    endpoints = ", ".join(sorted({_endpoint(hook) for _, hook in ours})) or "no endpoint"
    where = (f"Namespace/{probe.namespace}",)
    if probe.refused:
        return [
            Finding(
                "error",
                "webhook-not-answering",
                where,
                f"the API server refused a dry-run queued pod or Job: {probe.problem}",
                f"check that the webhook runs and is reachable at {endpoints}, and that the "
                f"configuration's caBundle signed its certificate ({DOCS})",
            )
        ]
    if probe.pod_mutated is None or probe.job_suspended is None:
        return [
            Finding(
                "warning",
                "webhook-not-probed",
                where,
                f"whether the webhook answers was not checked: {probe.problem or 'no answer'}",
                "run doctor with rights to create pods and jobs (dry run only, nothing is stored) in "
                "a namespace the webhook serves, given with --probe-namespace",
            )
        ]
    unchanged = [what for what, ok in (("pod", probe.pod_mutated), ("Job", probe.job_suspended)) if not ok]
    if not unchanged:
        return []
    return [
        Finding(
            "error",
            "webhook-not-answering",
            where,
            f"a dry-run queued {' and a dry-run queued '.join(unchanged)} came back unchanged: the "
            "webhook is registered but did not act (with failurePolicy Ignore, a webhook that is "
            "down or unreachable is skipped without a word), or this namespace is outside its "
            "namespaceSelector",
            f"check that the webhook runs and is reachable at {endpoints}, that the caBundle signed "
            f"its certificate, and that its namespaceSelector covers this namespace ({DOCS})",
        )
    ]
