"""Live checks of Kueue's guardrails, for the command-line tools (``why``, ``doctor``).

With the user's own credentials, never the controller's (the controller's RBAC grants none of
this):

* :func:`bypassed_job`: the job a ``why`` NAME points at, when it names a queue but runs
  unsuspended, so it went around gpuplane;
* :func:`registered_webhooks` and :func:`probe_webhook`: the MutatingWebhookConfigurations, and
  whether the API server really calls gpuplane's webhook, seen through server-side dry runs (the
  same path a real create takes, so it works from outside the cluster, and writes nothing).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpuplane.insight.webhook_doctor import WebhookProbe
from gpuplane.k8s import integrations
from gpuplane.k8s.api import JOBS, PODS, ApiError, KubeApi, Resource
from gpuplane.model import labels as keys
from gpuplane.model.jobs import queue_name

MUTATING_WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
_KINDS = {kind.lower(): kind for kind in integrations.INTEGRATIONS}


@dataclass(frozen=True, slots=True)
class BypassedJob:
    kind: str
    key: str  # namespace/name
    queue: str


def _get(api: KubeApi, res: Resource, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return api.get(res, name, namespace)
    except ApiError as err:
        if err.not_found or err.status == 403:
            return None
        raise


def _unsuspended_queued(kind: str, obj: dict[str, Any]) -> BypassedJob | None:
    meta = obj.get("metadata") or {}
    queue = queue_name(meta.get("labels") or {}, meta.get("annotations") or {})
    if not queue or integrations.INTEGRATIONS[kind].suspend is None or integrations.is_suspended(kind, obj):
        return None
    return BypassedJob(kind, f"{meta.get('namespace', '')}/{meta.get('name', '')}", queue)


def bypassed_job(api: KubeApi, kind: str, name: str, namespace: str) -> BypassedJob | None:
    """The job behind ``why``'s ``kind/name`` (kubectl's lower-case kind; a pod stands for the job
    that controls it) when it names a queue and is not suspended. Called once ``why`` found no
    Workload for it: such a job was created unsuspended and no webhook suspended it. None when it
    does not exist, cannot be read, or is not such a job."""
    if kind == "pod":
        pod = _get(api, PODS, name, namespace)
        owners = ((pod or {}).get("metadata") or {}).get("ownerReferences") or []
        owner = next(
            (o for o in owners if o.get("controller") and o.get("kind") in integrations.INTEGRATIONS), None
        )
        if owner is None:
            return None
        kind, name = str(owner["kind"]).lower(), str(owner.get("name", ""))
    full = _KINDS.get(kind)
    if full is None:
        return None
    obj = _get(api, integrations.INTEGRATIONS[full].resource, name, namespace)
    return None if obj is None else _unsuspended_queued(full, obj)


def _message(err: ApiError) -> str:
    """The API server's own message of a failed request (its Status), else the error's text."""
    try:
        status = json.loads(err.body)
    except ValueError:
        status = None
    message = status.get("message") if isinstance(status, dict) else None
    return str(message or err).splitlines()[0]


def registered_webhooks(api: KubeApi) -> list[dict[str, Any]]:
    """Every MutatingWebhookConfiguration of the cluster."""
    return list(api.list(MUTATING_WEBHOOKS).get("items", []))


PROBE_NAME = "gpuplane-doctor-probe"


def probe_webhook(api: KubeApi, namespace: str) -> WebhookProbe:
    """Dry-run creates (``dryRun=All``: admission runs, nothing is stored) of a queued pod and a
    queued Job, unsuspended, in ``namespace``; gpuplane's webhook answers the pod with its scheduler
    name and the Job with ``suspend: true``."""
    labels = {keys.QUEUE_NAME_LABEL: PROBE_NAME}
    pod_spec = {"containers": [{"name": "probe", "image": "gpuplane-doctor-probe"}], "restartPolicy": "Never"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": PROBE_NAME, "labels": labels},
        "spec": pod_spec,
    }
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": PROBE_NAME, "labels": labels},
        "spec": {"template": {"spec": pod_spec}},
    }
    try:
        created_pod = api.request("POST", PODS.path(namespace), {"dryRun": "All"}, body=pod)
        created_job = api.request("POST", JOBS.path(namespace), {"dryRun": "All"}, body=job)
    except ApiError as err:
        if err.status in (401, 403, 404):  # not allowed to, or no such namespace: nothing learnt
            return WebhookProbe(namespace, None, None, _message(err))
        # e.g. a failurePolicy Fail webhook that does not answer fails the create
        return WebhookProbe(namespace, None, None, _message(err), refused=True)
    return WebhookProbe(
        namespace,
        (created_pod.get("spec") or {}).get("schedulerName") == keys.SCHEDULER_NAME,
        (created_job.get("spec") or {}).get("suspend") is True,
    )
