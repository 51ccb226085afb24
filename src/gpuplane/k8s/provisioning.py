"""The ProvisioningRequest admission check: one autoscaler request per gang, all or nothing.

Kueue's check controller ``kueue.x-k8s.io/provisioning-request``, as gpuplane runs it. For a
workload that holds quota in a ClusterQueue with such a check::

    check Pending, gang has a place on existing nodes ----------> Ready (no request needed)
    check Pending, no place ---> PodTemplates + ProvisioningRequest (attempt N), one per gang
        request Provisioned=True -------------------------------> Ready, pods get
                                                                  consume-provisioning-request
        request Failed=True, or BookingExpired before admission -> Retry (quota released, requeued;
                                                                  attempt N+1 after a backoff)
        attempts exhausted -------------------------------------> Rejected (deactivated)
    check Ready, admitted, request CapacityRevoked=True --------> Retry (evicted)

The autoscaler (Cluster Autoscaler, or a test playing it) sets the request's conditions and adds
the Nodes; the core admits the gang only once every check is Ready *and* every pod has a place.

Names follow Kueue: the request is ``<workload>-<check>-<attempt>`` and each pod set's template
``ppt-<request>-<pod set>``; both are owned by the Workload, so they go when it goes. The attempt
number is read back from the requests that exist, so a restarted controller carries on.

Every write here is idempotent: a request that already exists (409) is taken as made, and a
check state already written is not written again.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplane.core.session import AdmissionDecision, CheckEviction, Plan, Reason
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.k8s.leader import micro_time
from gpuplane.model import labels as keys
from gpuplane.model.admission_checks import PROVISIONING_CONTROLLER, CheckState
from gpuplane.model.conditions import ConditionType, condition, with_conditions
from gpuplane.model.fields import lenient_timestamp

log = logging.getLogger(__name__)

CONSUME_ANNOTATION = keys.CONSUME_PROVISIONING_REQUEST_ANNOTATION
CLASS_ANNOTATION = keys.PROVISIONING_CLASS_ANNOTATION
ATOMIC_SCALE_UP = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
WORKLOAD_LABEL = keys.PROVISIONING_WORKLOAD_LABEL
CHECK_LABEL = keys.PROVISIONING_CHECK_LABEL
ATTEMPT_LABEL = keys.PROVISIONING_ATTEMPT_LABEL
# The QuotaReserved time of the reservation a request was made for: a failed request of an
# earlier reservation calls for a new attempt, one of the current reservation for a Retry.
RESERVATION_ANNOTATION = keys.RESERVED_AT_ANNOTATION


@dataclass(frozen=True, slots=True)
class RetryStrategy:
    """Kueue's defaults: three retries, backoff 60 s doubling up to 1800 s."""

    backoff_limit: int = 3
    base_seconds: float = 60.0
    max_seconds: float = 1800.0

    def backoff(self, failed_attempts: int) -> float:
        return min(self.max_seconds, self.base_seconds * 2.0 ** max(0, failed_attempts - 1))


@dataclass(frozen=True, slots=True)
class ProvisioningConfig:
    """A ``ProvisioningRequestConfig``: what the check's requests look like."""

    class_name: str = ATOMIC_SCALE_UP
    parameters: Mapping[str, str] | None = None
    managed_resources: tuple[str, ...] = ()
    retry: RetryStrategy = RetryStrategy()


def parse_config(obj: Mapping[str, Any] | None) -> ProvisioningConfig:
    """A ProvisioningRequestConfig object (or Kueue's defaults when there is none)."""
    if obj is None:
        return ProvisioningConfig()
    spec = obj.get("spec") or {}
    retry = spec.get("retryStrategy") or {}
    defaults = RetryStrategy()
    return ProvisioningConfig(
        class_name=str(spec.get("provisioningClassName") or ATOMIC_SCALE_UP),
        parameters={str(k): str(v) for k, v in (spec.get("parameters") or {}).items()},
        managed_resources=tuple(str(r) for r in spec.get("managedResources") or ()),
        retry=RetryStrategy(
            backoff_limit=int(retry.get("backoffLimitCount", defaults.backoff_limit)),
            base_seconds=float(retry.get("backoffBaseSeconds", defaults.base_seconds)),
            max_seconds=float(retry.get("backoffMaxSeconds", defaults.max_seconds)),
        ),
    )


def request_name(workload: str, check: str, attempt: int) -> str:
    """Kueue's name for the ``attempt``-th request of a workload's check (at most 253 chars)."""
    suffix = f"-{check}-{attempt}"
    return workload[: 253 - len(suffix)] + suffix


def _true(obj: Mapping[str, Any], ctype: str) -> dict[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == ctype and cond.get("status") == "True":
            return dict(cond)
    return None


def check_states(wl: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((wl.get("status") or {}).get("admissionChecks") or [])


def pod_set_updates(wl: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Annotations per pod set that the workload's Ready checks ask its pods to carry."""
    out: dict[str, dict[str, str]] = {}
    for state in check_states(wl):
        if state.get("state") != "Ready":
            continue
        for update in state.get("podSetUpdates") or []:
            out.setdefault(update["name"], {}).update(update.get("annotations") or {})
    return out


def awaiting_checks(wl: Mapping[str, Any]) -> bool:
    """Whether the workload holds quota but is not admitted for its admission checks: some check
    is not Ready yet, or all are and the core has not placed it yet."""
    states = check_states(wl)
    return bool(states) and (
        any(s.get("state") != "Ready" for s in states) or not _true(wl, ConditionType.ADMITTED)
    )


def checks_passed(wl: Mapping[str, Any], decision: AdmissionDecision) -> bool:
    """Whether ``decision`` admits a workload that holds quota and is not admitted yet (its
    checks have all passed); any other decision about a reserved workload is old news."""
    return (
        not decision.checks and not _true(wl, ConditionType.ADMITTED) and not _true(wl, ConditionType.EVICTED)
    )


def pending_checks(names: tuple[str, ...], now: str) -> list[dict[str, Any]]:
    """``status.admissionChecks`` of a fresh reservation: every check Pending."""
    return [{"name": n, "state": "Pending", "message": "", "lastTransitionTime": now} for n in names]


def evicted_by_check(wl: Mapping[str, Any], eviction: CheckEviction, now: str) -> dict[str, Any]:
    """``wl`` marked Evicted by an admission check (reason ``AdmissionCheck`` for Retry,
    ``Deactivated`` for Rejected); the admission stays until its job has stopped."""
    updated: dict[str, Any] = json.loads(json.dumps(wl))
    status = updated.setdefault("status", {})
    verb = "rejected the workload" if eviction.state == CheckState.REJECTED else "asked to retry"
    message = f"admission check {eviction.check} {verb}" + (
        f": {eviction.message}" if eviction.message else ""
    )
    reason = Reason.ADMISSION_CHECK if eviction.state == CheckState.RETRY else Reason.DEACTIVATED
    status["conditions"] = with_conditions(
        status.get("conditions", []), condition(ConditionType.EVICTED, reason, now, message)
    )
    return updated


def annotated_templates(kind: str, job: dict[str, Any], wl: Mapping[str, Any]) -> dict[str, Any]:
    """The job with each pod set's template annotated as its Ready checks ask (the request a
    pod consumes); the job unchanged when there is nothing to add."""
    updates = pod_set_updates(wl)
    if not updates:
        return job
    out = copy.deepcopy(job)
    for ps in jobs.INTEGRATIONS[kind].pod_sets(job):
        node: Any = out
        try:
            for step in ps.template:
                node = node[step]
        except (KeyError, IndexError, TypeError):
            continue  # a kind whose pods come from elsewhere (TrainJob): nothing to annotate
        node.setdefault("metadata", {}).setdefault("annotations", {}).update(updates.get(ps.name, {}))
    return out


class Provisioner:
    """Carries out the ProvisioningRequest checks for one controller (one pass at a time)."""

    def __init__(
        self,
        api: KubeApi,
        cache: Cache,
        clock: Callable[[], float],
        event: Callable[[dict[str, Any], str, str, str], None],
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self.event = event
        self.failures = 0

    # --- one pass -----------------------------------------------------------------------------

    def reconcile(self, plan: Plan) -> None:
        checks = {
            ac["metadata"]["name"]: ac
            for ac in self.cache.items("AdmissionCheck")
            if (ac.get("spec") or {}).get("controllerName") == PROVISIONING_CONTROLLER
        }
        if not checks:
            return
        placeable = {r.workload for r in plan.reserved if r.placeable}
        todo = [
            wl
            for wl in self.cache.items("Workload")
            if (wl.get("status") or {}).get("admission")
            and not _true(wl, ConditionType.EVICTED)
            and not _true(wl, ConditionType.FINISHED)
            and any(s.get("name") in checks for s in check_states(wl))
        ]
        if not todo:
            return
        try:
            requests = self.api.list(k8s.PROVISIONING_REQUESTS).get("items", [])
        except ApiError as err:
            log.warning("cannot list ProvisioningRequests (is the CRD installed?): %s", err)
            self.failures += 1
            return
        by_owner: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for req in requests:
            labels = req["metadata"].get("labels") or {}
            owner = labels.get(WORKLOAD_LABEL)
            if owner:
                owner_key = (f"{req['metadata']['namespace']}/{owner}", str(labels.get(CHECK_LABEL, "")))
                by_owner.setdefault(owner_key, []).append(req)
        for wl in todo:
            wl_key = object_key(wl)
            for state in check_states(wl):
                name = str(state.get("name", ""))
                if name not in checks:
                    continue
                attempts = sorted(by_owner.get((wl_key, name), []), key=_attempt)
                self._reconcile_check(wl, state, checks[name], attempts, wl_key in placeable)

    def _reconcile_check(
        self,
        wl: dict[str, Any],
        state: dict[str, Any],
        check: dict[str, Any],
        attempts: list[dict[str, Any]],
        placeable: bool,
    ) -> None:
        name = state["name"]
        latest = attempts[-1] if attempts else None
        if state.get("state") == "Ready":
            if latest is not None:
                self._recheck_ready(wl, name, latest)
            return
        if state.get("state") != "Pending":
            return
        config = self._config(check)
        if latest is None or self._spent(latest, wl):
            self._next_attempt(wl, name, config, attempts, placeable=placeable)
        else:
            self._follow(wl, name, config, attempts)

    def _recheck_ready(self, wl: dict[str, Any], name: str, latest: dict[str, Any]) -> None:
        """A Ready check goes back to Retry when its capacity is revoked after admission, or its
        booking expires before it."""
        admitted = _true(wl, ConditionType.ADMITTED) is not None
        revoked = _true(latest, "CapacityRevoked")
        expired = _true(latest, "BookingExpired")
        if revoked is not None and admitted:
            self._set_state(wl, name, "Retry", f"capacity revoked: {revoked.get('message', '')}".strip())
        elif expired is not None and not admitted:
            self._set_state(wl, name, "Retry", f"booking expired: {expired.get('message', '')}".strip())

    def _next_attempt(
        self,
        wl: dict[str, Any],
        name: str,
        config: ProvisioningConfig,
        attempts: list[dict[str, Any]],
        *,
        placeable: bool,
    ) -> None:
        """No request, or the latest one ended: nothing to provision, no retries left, a back-off
        still running, or a new request."""
        latest = attempts[-1] if attempts else None
        failed = sum(1 for a in attempts if _true(a, "Failed") or _true(a, "BookingExpired"))
        if latest is None and placeable:
            self._set_state(wl, name, "Ready", "the gang has a place on existing nodes; nothing to provision")
            return
        if failed > config.retry.backoff_limit:
            self._set_state(wl, name, "Rejected", f"{failed} ProvisioningRequests failed; no retries left")
            return
        if latest is not None:
            ended = _ended_at(latest)
            wait = config.retry.backoff(failed)
            if ended is not None and self.clock() < ended + wait:
                message = f"retrying after a backoff of {wait:g}s (attempt {failed + 1})"
                self._set_state(wl, name, "Pending", message)
                return
        self._create(wl, name, config, _attempt(latest) + 1 if latest is not None else 1)

    def _follow(
        self, wl: dict[str, Any], name: str, config: ProvisioningConfig, attempts: list[dict[str, Any]]
    ) -> None:
        """The latest request is under way: the check's state follows its conditions."""
        latest = attempts[-1]
        provisioned = _true(latest, "Provisioned")
        failed_cond = _true(latest, "Failed")
        if provisioned is not None:
            req_name = latest["metadata"]["name"]
            updates = [
                {
                    "name": ps["name"],
                    "annotations": {CONSUME_ANNOTATION: req_name, CLASS_ANNOTATION: config.class_name},
                }
                for ps in (wl.get("spec") or {}).get("podSets") or []
            ]
            self._set_state(wl, name, "Ready", f"ProvisioningRequest {req_name} is Provisioned", updates)
        elif failed_cond is not None:
            failed = sum(1 for a in attempts if _true(a, "Failed") or _true(a, "BookingExpired"))
            message = (
                f"ProvisioningRequest {latest['metadata']['name']} failed: {failed_cond.get('message', '')}"
            )
            verdict = "Rejected" if failed > config.retry.backoff_limit else "Retry"
            self._set_state(wl, name, verdict, message.strip())
        elif _true(latest, "BookingExpired") is not None:
            self._set_state(
                wl, name, "Retry", f"ProvisioningRequest {latest['metadata']['name']} booking expired"
            )
        else:
            accepted = _true(latest, "Accepted")
            message = f"ProvisioningRequest {latest['metadata']['name']} " + (
                "accepted; waiting for capacity" if accepted else "created; waiting for the autoscaler"
            )
            self._set_state(wl, name, "Pending", message)

    def _spent(self, request: dict[str, Any], wl: dict[str, Any]) -> bool:
        """A request made for an earlier reservation of the workload that ended (failed or
        expired): the check needs a new attempt."""
        if _true(request, "Failed") is None and _true(request, "BookingExpired") is None:
            return False
        made_for = (request["metadata"].get("annotations") or {}).get(RESERVATION_ANNOTATION)
        return made_for != _reserved_at(wl)

    # --- objects ------------------------------------------------------------------------------

    def _config(self, check: dict[str, Any]) -> ProvisioningConfig:
        params = (check.get("spec") or {}).get("parameters") or {}
        if params.get("kind") != "ProvisioningRequestConfig" or not params.get("name"):
            return ProvisioningConfig()
        try:
            return parse_config(self.api.get(k8s.PROVISIONING_CONFIGS, str(params["name"])))
        except ApiError:
            return ProvisioningConfig()
        except (TypeError, ValueError):
            log.warning("invalid ProvisioningRequestConfig %s; using defaults", params["name"])
            return ProvisioningConfig()

    def _create(self, wl: dict[str, Any], check: str, config: ProvisioningConfig, attempt: int) -> None:
        meta = wl["metadata"]
        ns, wl_name = meta["namespace"], meta["name"]
        req_name = request_name(wl_name, check, attempt)
        owner = {
            "apiVersion": wl.get("apiVersion") or k8s.WORKLOADS.api_version,
            "kind": "Workload",
            "name": wl_name,
            "uid": meta.get("uid", ""),
            "controller": True,
        }
        labels = {WORKLOAD_LABEL: wl_name[:63], CHECK_LABEL: check[:63], ATTEMPT_LABEL: str(attempt)}
        annotations = {RESERVATION_ANNOTATION: _reserved_at(wl)}
        admission = (wl.get("status") or {}).get("admission") or {}
        counts = {psa["name"]: int(psa.get("count", 0)) for psa in admission.get("podSetAssignments", [])}
        pod_sets = []
        for ps in (wl.get("spec") or {}).get("podSets") or []:
            template = copy.deepcopy(ps.get("template") or {})
            requests = _requests(template)
            if config.managed_resources and not set(requests) & set(config.managed_resources):
                continue
            tmpl_name = f"ppt-{req_name}-{ps['name']}"[:253]
            body = {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {
                    "name": tmpl_name,
                    "namespace": ns,
                    "labels": labels,
                    "ownerReferences": [owner],
                },
                "template": template,
            }
            if not self._make(k8s.POD_TEMPLATES, body, ns):
                return
            pod_sets.append(
                {"podTemplateRef": {"name": tmpl_name}, "count": counts.get(ps["name"], ps.get("count", 1))}
            )
        if not pod_sets:
            self._set_state(
                wl, check, "Ready", "no pod set requests a managed resource; nothing to provision"
            )
            return
        spec: dict[str, Any] = {"provisioningClassName": config.class_name, "podSets": pod_sets}
        if config.parameters:
            spec["parameters"] = dict(config.parameters)
        body = {
            "apiVersion": k8s.PROVISIONING_REQUESTS.api_version,
            "kind": "ProvisioningRequest",
            "metadata": {
                "name": req_name,
                "namespace": ns,
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner],
            },
            "spec": spec,
        }
        if self._make(k8s.PROVISIONING_REQUESTS, body, ns):
            self._set_state(
                wl, check, "Pending", f"ProvisioningRequest {req_name} created; waiting for the autoscaler"
            )
            self.event(wl, "Normal", "ProvisioningRequestCreated", f"created ProvisioningRequest {req_name}")

    def _make(self, res: k8s.Resource, body: dict[str, Any], ns: str) -> bool:
        try:
            self.api.create(res, body, ns)
        except ApiError as err:
            if err.conflict:  # made before (by us, before a restart): the same object
                return True
            log.warning("cannot create %s %s: %s", res.kind, body["metadata"]["name"], err)
            self.failures += 1
            return False
        return True

    def _set_state(
        self,
        wl: dict[str, Any],
        check: str,
        state: str,
        message: str,
        updates: list[dict[str, Any]] | None = None,
    ) -> None:
        """Write one check's state on the workload (nothing when it already reads so)."""
        current = next((s for s in check_states(wl) if s.get("name") == check), {})
        if (
            current.get("state") == state
            and current.get("message") == message
            and (updates is None or current.get("podSetUpdates") == updates)
        ):
            return
        updated: dict[str, Any] = json.loads(json.dumps(wl))
        entry: dict[str, Any] = {"name": check, "state": state, "message": message[:32768]}
        entry["lastTransitionTime"] = (
            current.get("lastTransitionTime") if current.get("state") == state else None
        ) or micro_time(self.clock())
        if updates is not None:
            entry["podSetUpdates"] = updates
        elif current.get("podSetUpdates") and state == current.get("state"):
            entry["podSetUpdates"] = current["podSetUpdates"]
        status = updated.setdefault("status", {})
        status["admissionChecks"] = [
            entry if s.get("name") == check else s for s in status.get("admissionChecks") or []
        ]
        try:
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
        except ApiError as err:
            log.debug("check %s of %s not written: %s", check, object_key(wl), err)
            self.failures += 1
            return
        self.cache.upsert("Workload", written)
        if state != current.get("state"):
            self.event(
                written,
                "Normal" if state in ("Ready", "Pending") else "Warning",
                f"AdmissionCheck{state}",
                f"{check}: {message}",
            )


def _reserved_at(wl: Mapping[str, Any]) -> str:
    reserved = _true(wl, ConditionType.QUOTA_RESERVED)
    return str(reserved.get("lastTransitionTime", "")) if reserved is not None else ""


def _attempt(request: Mapping[str, Any] | None) -> int:
    if request is None:
        return 0
    labels = request.get("metadata", {}).get("labels") or {}
    try:
        return int(labels.get(ATTEMPT_LABEL, "0"))
    except ValueError:
        return 0


def _ended_at(request: Mapping[str, Any]) -> float | None:
    """When a request failed or its booking expired (seconds since the epoch)."""
    for ctype in ("Failed", "BookingExpired"):
        cond = _true(request, ctype)
        if cond is not None:
            return lenient_timestamp(str(cond.get("lastTransitionTime", "")))
    return None


def _requests(template: Mapping[str, Any]) -> set[str]:
    names: set[str] = set()
    for container in (template.get("spec") or {}).get("containers") or []:
        names |= set(((container.get("resources") or {}).get("requests") or {}).keys())
    return names
