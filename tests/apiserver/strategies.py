"""Per-kind behaviour, shaped like the API server's registry strategies.

For each kind a :class:`Strategy` says how names are checked, which defaults decoding fills in, what
creation resets (status, generated selectors), and what validation and update validation refuse. The
store calls them in the server's order: default, prepare, validate (create) or default, validate, validate
update (update). Custom resources get a strategy built from their CRD's schema (see :mod:`.schema`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from . import schema as crd_schema
from .errors import Cause
from .resources import ResourceType
from .selectors import match_labels_selector
from .validation import (
    check_name,
    config_keys,
    dns1123_label,
    dns1123_subdomain,
    duplicate,
    forbidden,
    immutable,
    invalid_value,
    is_overcommitable,
    not_supported,
    parse_quantity,
    qualified_name,
    required,
    resource_list,
    string_map,
)

Obj = dict[str, Any]


def _noop(_obj: Obj) -> None:
    return None


def _no_causes(*_objs: Obj) -> list[Cause]:
    return []


@dataclass(frozen=True)
class Strategy:
    name_rule: Callable[[str], list[str]] = dns1123_subdomain
    default: Callable[[Obj], None] = _noop
    prepare_create: Callable[[Obj, str], None] = field(default=lambda _obj, _now: None)
    validate: Callable[[Obj], list[Cause]] = _no_causes
    validate_update: Callable[[Obj, Obj], list[Cause]] = _no_causes
    validate_status: Callable[[Obj], list[Cause]] = _no_causes


def _spec(obj: Mapping[str, Any]) -> Obj:
    spec = obj.get("spec")
    return spec if isinstance(spec, dict) else {}


def _int_at_least(path: str, value: Any, low: int) -> list[Cause]:
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [invalid_value(path, value, "must be an integer")]
    if value < low:
        word = "greater than or equal to" if low == 0 else "greater than"
        return [invalid_value(path, value, f"must be {word} {0 if low == 0 else low - 1}")]
    return []


# --- pods --------------------------------------------------------------------------------------------

RESTART_POLICIES = ("Always", "OnFailure", "Never")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POD_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")
CONDITION_STATUSES = ("True", "False", "Unknown")


def default_container(container: Obj) -> None:
    image = str(container.get("image") or "")
    tagged = ":" in image.rsplit("/", 1)[-1] or "@" in image
    latest = not tagged or image.endswith(":latest")
    container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    resources = container.setdefault("resources", {})
    # A limit with no request means the request equals the limit.
    limits = resources.get("limits") or {}
    if limits:
        requests = resources.setdefault("requests", {})
        for name, amount in limits.items():
            requests.setdefault(name, amount)


def default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            if isinstance(container, dict):
                default_container(container)


def _containers(spec: Mapping[str, Any], path: str, key: str, seen: set[str]) -> list[Cause]:
    causes: list[Cause] = []
    items = spec.get(key)
    if items is None:
        return causes
    if not isinstance(items, list):
        return [invalid_value(f"{path}.{key}", "...", "must be a list")]
    for i, container in enumerate(items):
        where = f"{path}.{key}[{i}]"
        if not isinstance(container, Mapping):
            causes.append(invalid_value(where, "...", "must be an object"))
            continue
        name = container.get("name")
        if not name:
            causes.append(required(f"{where}.name"))
        else:
            causes.extend(check_name(f"{where}.name", name, dns1123_label))
            if name in seen:
                causes.append(duplicate(f"{where}.name", name))
            seen.add(str(name))
        if not container.get("image"):
            causes.append(required(f"{where}.image"))
        for j, port in enumerate(container.get("ports") or []):
            number = port.get("containerPort") if isinstance(port, Mapping) else None
            if not isinstance(number, int) or not 1 <= number <= 65535:
                causes.append(
                    invalid_value(
                        f"{where}.ports[{j}].containerPort", number, "must be between 1 and 65535, inclusive"
                    )
                )
        causes.extend(_resources(f"{where}.resources", container.get("resources") or {}))
    return causes


def _resources(path: str, resources: Mapping[str, Any]) -> list[Cause]:
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    causes = resource_list(f"{path}.limits", limits) + resource_list(f"{path}.requests", requests)
    if causes:
        return causes
    for name, amount in requests.items():
        wanted, limit = parse_quantity(amount), parse_quantity(limits.get(name))
        item = f"{path}.requests[{name}]"
        if not is_overcommitable(name):
            if limit is None:
                causes.append(forbidden(item, "Limit must be set for non overcommitable resources"))
            elif wanted != limit:
                causes.append(invalid_value(item, amount, f"must be equal to {name} limit of {limits[name]}"))
        elif limit is not None and wanted is not None and wanted > limit:
            causes.append(
                invalid_value(item, amount, f"must be less than or equal to {name} limit of {limits[name]}")
            )
    return causes


def pod_spec(spec: Any, path: str, *, restart_policies: tuple[str, ...] = RESTART_POLICIES) -> list[Cause]:
    if not isinstance(spec, Mapping):
        return [required(path)]
    causes: list[Cause] = []
    if not spec.get("containers"):
        causes.append(required(f"{path}.containers"))
    seen: set[str] = set()
    causes.extend(_containers(spec, path, "containers", seen))
    causes.extend(_containers(spec, path, "initContainers", seen))
    policy = spec.get("restartPolicy")
    if policy not in restart_policies:
        if policy in RESTART_POLICIES or policy:
            causes.append(not_supported(f"{path}.restartPolicy", policy, restart_policies))
        else:
            causes.append(required(f"{path}.restartPolicy"))
    if spec.get("nodeName"):
        causes.extend(check_name(f"{path}.nodeName", spec["nodeName"], dns1123_subdomain))
    causes.extend(string_map(f"{path}.nodeSelector", spec.get("nodeSelector"), value_rule=None))
    causes.extend(_tolerations(f"{path}.tolerations", spec.get("tolerations") or []))
    gates: set[str] = set()
    for i, gate in enumerate(spec.get("schedulingGates") or []):
        name = gate.get("name") if isinstance(gate, Mapping) else None
        where = f"{path}.schedulingGates[{i}].name"
        if not name:
            causes.append(required(where))
            continue
        causes.extend(invalid_value(where, name, e) for e in qualified_name(name))
        if name in gates:
            causes.append(duplicate(where, name))
        gates.add(name)
    volumes: set[str] = set()
    for i, volume in enumerate(spec.get("volumes") or []):
        name = volume.get("name") if isinstance(volume, Mapping) else None
        where = f"{path}.volumes[{i}].name"
        if not name:
            causes.append(required(where))
            continue
        causes.extend(check_name(where, name, dns1123_label))
        if name in volumes:
            causes.append(duplicate(where, name))
        volumes.add(name)
    causes.extend(_int_at_least(f"{path}.activeDeadlineSeconds", spec.get("activeDeadlineSeconds"), 1))
    causes.extend(
        _int_at_least(f"{path}.terminationGracePeriodSeconds", spec.get("terminationGracePeriodSeconds"), 0)
    )
    return causes


def _tolerations(path: str, tolerations: Any) -> list[Cause]:
    causes: list[Cause] = []
    for i, toleration in enumerate(tolerations if isinstance(tolerations, list) else []):
        where = f"{path}[{i}]"
        if not isinstance(toleration, Mapping):
            causes.append(invalid_value(where, "...", "must be an object"))
            continue
        operator = toleration.get("operator") or "Equal"
        if operator not in ("Equal", "Exists"):
            causes.append(not_supported(f"{where}.operator", operator, ("Equal", "Exists")))
        if operator == "Exists" and toleration.get("value"):
            causes.append(
                invalid_value(
                    f"{where}.operator",
                    toleration["value"],
                    "value must be empty when `operator` is 'Exists'",
                )
            )
        if not toleration.get("key") and operator != "Exists":
            causes.append(
                invalid_value(
                    f"{where}.operator",
                    operator,
                    'operator must be Exists when `key` is empty, which means "match all values and all '
                    'keys"',
                )
            )
        if toleration.get("key"):
            causes.extend(
                invalid_value(f"{where}.key", toleration["key"], e) for e in qualified_name(toleration["key"])
            )
        effect = toleration.get("effect")
        if effect and effect not in TAINT_EFFECTS:
            causes.append(not_supported(f"{where}.effect", effect, TAINT_EFFECTS))
    return causes


def _qos_class(spec: Mapping[str, Any]) -> str:
    containers = [c for c in spec.get("containers") or [] if isinstance(c, Mapping)]
    compute = ("cpu", "memory")
    any_set, guaranteed = False, True
    for container in containers:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        for name in compute:
            if name in requests or name in limits:
                any_set = True
            if name not in limits or parse_quantity(requests.get(name, limits.get(name))) != parse_quantity(
                limits[name]
            ):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def _pod_default(pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    if isinstance(spec, dict):
        default_pod_spec(spec)
        spec.setdefault("serviceAccountName", "default")
        spec.setdefault("priority", 0)


def _pod_prepare(pod: Obj, _now: str) -> None:
    pod["status"] = {"phase": "Pending", "qosClass": _qos_class(_spec(pod))}


def _pod_validate(pod: Obj) -> list[Cause]:
    return pod_spec(pod.get("spec"), "spec")


_POD_UPDATE_RULE = (
    "pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,"
    "`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),"
    "`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously negative)"
)


def _pod_validate_update(new: Obj, old: Obj) -> list[Cause]:
    new_spec, old_spec = copy.deepcopy(_spec(new)), copy.deepcopy(_spec(old))
    causes: list[Cause] = []
    for spec in (new_spec, old_spec):
        for key in ("containers", "initContainers"):
            for container in spec.get(key) or []:
                if isinstance(container, dict):
                    container.pop("image", None)
    old_tolerations, new_tolerations = (
        old_spec.pop("tolerations", None) or [],
        new_spec.pop("tolerations", None) or [],
    )
    if any(t not in new_tolerations for t in old_tolerations):
        causes.append(
            forbidden(
                "spec.tolerations", "existing toleration can not be modified except its tolerationSeconds"
            )
        )
    old_gates, new_gates = (
        old_spec.pop("schedulingGates", None) or [],
        new_spec.pop("schedulingGates", None) or [],
    )
    if any(g not in old_gates for g in new_gates):
        causes.append(
            forbidden("spec.schedulingGates", "only deletion is allowed, but found new scheduling gate")
        )
    if old_gates:
        # While a pod is gated its node selector may gain terms (never lose or change them).
        old_selector, new_selector = (
            old_spec.pop("nodeSelector", None) or {},
            new_spec.pop("nodeSelector", None) or {},
        )
        if any(new_selector.get(k) != v for k, v in old_selector.items()):
            causes.append(forbidden("spec.nodeSelector", "only additions to spec.nodeSelector are allowed"))
    old_deadline, new_deadline = (
        old_spec.pop("activeDeadlineSeconds", None),
        new_spec.pop("activeDeadlineSeconds", None),
    )
    if old_deadline is not None and (new_deadline is None or new_deadline > old_deadline):
        causes.append(
            invalid_value(
                "spec.activeDeadlineSeconds", new_deadline, "must be less than or equal to previous value"
            )
        )
    if new_spec != old_spec:
        causes.append(forbidden("spec", _POD_UPDATE_RULE))
    return causes


def _conditions(path: str, conditions: Any) -> list[Cause]:
    causes: list[Cause] = []
    for i, condition in enumerate(conditions if isinstance(conditions, list) else []):
        if not isinstance(condition, Mapping) or not condition.get("type"):
            causes.append(required(f"{path}[{i}].type"))
            continue
        if condition.get("status") not in CONDITION_STATUSES:
            causes.append(not_supported(f"{path}[{i}].status", condition.get("status"), CONDITION_STATUSES))
    return causes


def _pod_validate_status(pod: Obj) -> list[Cause]:
    status = pod.get("status") or {}
    causes = _conditions("status.conditions", status.get("conditions"))
    phase = status.get("phase")
    if phase and phase not in POD_PHASES:
        causes.append(not_supported("status.phase", phase, POD_PHASES))
    return causes


# --- jobs --------------------------------------------------------------------------------------------

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def _job_default(job: Obj) -> None:
    spec = job.setdefault("spec", {})
    if not isinstance(spec, dict):
        return
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    spec.setdefault("podReplacementPolicy", "TerminatingOrFailed")
    template = spec.get("template")
    if isinstance(template, dict) and isinstance(template.get("spec"), dict):
        default_pod_spec(template["spec"])


def _job_prepare(job: Obj, _now: str) -> None:
    job["status"] = {}
    spec = _spec(job)
    if spec.get("manualSelector") or spec.get("selector"):
        return
    meta = job["metadata"]
    uid, name = meta["uid"], meta.get("name", "")
    template_meta = spec.setdefault("template", {}).setdefault("metadata", {})
    labels = template_meta.setdefault("labels", {})
    labels.update({JOB_UID_LABEL: uid, JOB_NAME_LABEL: name, "controller-uid": uid, "job-name": name})
    spec["selector"] = {"matchLabels": {JOB_UID_LABEL: uid}}


def _job_validate(job: Obj) -> list[Cause]:
    spec = _spec(job)
    causes: list[Cause] = []
    name = (job.get("metadata") or {}).get("name") or ""
    if len(name) > 63:
        causes.append(invalid_value("metadata.name", name, "must be no more than 63 characters"))
    for key in ("parallelism", "completions", "backoffLimit"):
        causes.extend(_int_at_least(f"spec.{key}", spec.get(key), 0))
    causes.extend(_int_at_least("spec.activeDeadlineSeconds", spec.get("activeDeadlineSeconds"), 1))
    mode = spec.get("completionMode", "NonIndexed")
    if mode not in ("NonIndexed", "Indexed"):
        causes.append(not_supported("spec.completionMode", mode, ("NonIndexed", "Indexed")))
    elif mode == "Indexed" and spec.get("completions") is None:
        causes.append(required("spec.completions", "when completion mode is Indexed"))
    template = spec.get("template")
    if not isinstance(template, Mapping):
        causes.append(required("spec.template"))
        return causes
    causes.extend(
        pod_spec(template.get("spec"), "spec.template.spec", restart_policies=("OnFailure", "Never"))
    )
    selector = spec.get("selector")
    if selector is None:
        causes.append(required("spec.selector"))
    else:
        labels = {"metadata": {"labels": (template.get("metadata") or {}).get("labels") or {}}}
        if not match_labels_selector(selector)(labels):
            causes.append(
                invalid_value(
                    "spec.template.metadata.labels", "...", "`selector` does not match template `labels`"
                )
            )
    return causes


# While a job is suspended and has never started, Kueue-style controllers may rewrite these.
_JOB_SCHEDULING_DIRECTIVES = ("nodeSelector", "tolerations", "affinity", "schedulingGates")


def _job_validate_update(new: Obj, old: Obj) -> list[Cause]:
    new_spec, old_spec = _spec(new), _spec(old)
    causes = [
        immutable(f"spec.{key}", new_spec.get(key))
        for key in ("selector", "completionMode", "manualSelector")
        if new_spec.get(key) != old_spec.get(key)
    ]
    if new_spec.get("completions") != old_spec.get("completions"):
        elastic = new_spec.get("completionMode") == "Indexed" and new_spec.get("completions") == new_spec.get(
            "parallelism"
        )
        if not elastic:
            causes.append(immutable("spec.completions", new_spec.get("completions")))
    new_template, old_template = (
        copy.deepcopy(new_spec.get("template")),
        copy.deepcopy(old_spec.get("template")),
    )
    never_started = bool(old_spec.get("suspend")) and not (old.get("status") or {}).get("startTime")
    if never_started and isinstance(new_template, dict) and isinstance(old_template, dict):
        for template in (new_template, old_template):
            template.setdefault("metadata", {}).pop("labels", None)
            template["metadata"].pop("annotations", None)
            for key in _JOB_SCHEDULING_DIRECTIVES:
                (template.get("spec") or {}).pop(key, None)
    if new_template != old_template:
        causes.append(immutable("spec.template", "{...}"))
    return causes


# --- the other built-in kinds ------------------------------------------------------------------------


def _node_validate(node: Obj) -> list[Cause]:
    causes: list[Cause] = []
    for i, taint in enumerate(_spec(node).get("taints") or []):
        where = f"spec.taints[{i}]"
        if not isinstance(taint, Mapping) or not taint.get("key"):
            causes.append(required(f"{where}.key"))
            continue
        causes.extend(invalid_value(f"{where}.key", taint["key"], e) for e in qualified_name(taint["key"]))
        if taint.get("effect") not in TAINT_EFFECTS:
            causes.append(not_supported(f"{where}.effect", taint.get("effect"), TAINT_EFFECTS))
    return causes + _node_validate_status(node)


def _node_validate_status(node: Obj) -> list[Cause]:
    status = node.get("status") or {}
    return (
        resource_list("status.capacity", status.get("capacity"))
        + resource_list("status.allocatable", status.get("allocatable"))
        + _conditions("status.conditions", status.get("conditions"))
    )


def _namespace_default(namespace: Obj) -> None:
    labels = namespace.setdefault("metadata", {}).setdefault("labels", {})
    if isinstance(labels, dict) and namespace["metadata"].get("name"):
        labels["kubernetes.io/metadata.name"] = namespace["metadata"]["name"]


def _namespace_prepare(namespace: Obj, _now: str) -> None:
    namespace["spec"] = {"finalizers": ["kubernetes"]}
    namespace["status"] = {"phase": "Active"}


def _configmap_validate(configmap: Obj) -> list[Cause]:
    data, binary = configmap.get("data") or {}, configmap.get("binaryData") or {}
    causes = config_keys("data", configmap.get("data")) + config_keys(
        "binaryData", configmap.get("binaryData")
    )
    for key in set(data) & set(binary):
        causes.append(invalid_value("data", key, "duplicate of key present in binaryData"))
    for key, value in data.items():
        if not isinstance(value, str):
            causes.append(invalid_value(f"data[{key}]", value, "must be a string"))
    return causes


def _configmap_validate_update(new: Obj, old: Obj) -> list[Cause]:
    if not old.get("immutable"):
        return []
    causes = []
    if not new.get("immutable"):
        causes.append(forbidden("immutable", "field is immutable when `immutable` is set"))
    causes.extend(
        forbidden(key, "field is immutable when `immutable` is set")
        for key in ("data", "binaryData")
        if (new.get(key) or {}) != (old.get(key) or {})
    )
    return causes


def _event_validate(event: Obj) -> list[Cause]:
    involved = event.get("involvedObject")
    namespace = (event.get("metadata") or {}).get("namespace", "")
    if not isinstance(involved, Mapping):
        return [required("involvedObject")]
    wanted = involved.get("namespace") or ""
    if wanted and wanted != namespace:
        return [invalid_value("involvedObject.namespace", wanted, "does not match event.namespace")]
    return []


def _lease_validate(lease: Obj) -> list[Cause]:
    spec = _spec(lease)
    return _int_at_least("spec.leaseDurationSeconds", spec.get("leaseDurationSeconds"), 1) + _int_at_least(
        "spec.leaseTransitions", spec.get("leaseTransitions"), 0
    )


# --- CustomResourceDefinitions -----------------------------------------------------------------------


def _crd_default(crd: Obj) -> None:
    spec = crd.setdefault("spec", {})
    names = spec.setdefault("names", {}) if isinstance(spec, dict) else {}
    if isinstance(names, dict) and names.get("kind"):
        names.setdefault("singular", str(names["kind"]).lower())
        names.setdefault("listKind", f"{names['kind']}List")
    if isinstance(spec, dict):
        spec.setdefault("conversion", {"strategy": "None"})


def _crd_prepare(crd: Obj, now: str) -> None:
    spec = _spec(crd)
    storage = [
        v.get("name") for v in spec.get("versions") or [] if isinstance(v, Mapping) and v.get("storage")
    ]
    crd["status"] = {
        "acceptedNames": copy.deepcopy(spec.get("names") or {}),
        "storedVersions": storage[:1],
        "conditions": [
            {"type": kind, "status": "True", "lastTransitionTime": now, "reason": reason, "message": message}
            for kind, reason, message in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ],
    }


def _crd_validate(crd: Obj) -> list[Cause]:
    spec = _spec(crd)
    causes: list[Cause] = []
    group = spec.get("group")
    names: Mapping[str, Any] = spec["names"] if isinstance(spec.get("names"), Mapping) else {}
    if not group:
        causes.append(required("spec.group"))
    elif "." not in str(group):
        causes.append(invalid_value("spec.group", group, "should be a domain with at least one dot"))
    else:
        causes.extend(check_name("spec.group", group, dns1123_subdomain))
    plural, kind = names.get("plural"), names.get("kind")
    if not plural:
        causes.append(required("spec.names.plural"))
    else:
        causes.extend(check_name("spec.names.plural", plural, dns1123_label))
    if not kind:
        causes.append(required("spec.names.kind"))
    name = (crd.get("metadata") or {}).get("name")
    if plural and group and name != f"{plural}.{group}":
        causes.append(invalid_value("metadata.name", name, 'must be spec.names.plural+"."+spec.group'))
    if spec.get("scope") not in ("Namespaced", "Cluster"):
        causes.append(not_supported("spec.scope", spec.get("scope"), ("Cluster", "Namespaced")))
    versions = spec.get("versions") or []
    if not versions:
        causes.append(required("spec.versions", "must have exactly one version marked as storage version"))
    seen: set[str] = set()
    for i, version in enumerate(versions):
        where = f"spec.versions[{i}]"
        if not isinstance(version, Mapping) or not version.get("name"):
            causes.append(required(f"{where}.name"))
            continue
        causes.extend(check_name(f"{where}.name", version["name"], dns1123_label))
        if version["name"] in seen:
            causes.append(duplicate(f"{where}.name", version["name"]))
        seen.add(version["name"])
        root = (version.get("schema") or {}).get("openAPIV3Schema")
        if not isinstance(root, Mapping):
            causes.append(required(f"{where}.schema.openAPIV3Schema", "schemas are required"))
        elif root.get("type") != "object":
            causes.append(
                invalid_value(
                    f"{where}.schema.openAPIV3Schema.type", root.get("type"), "must be object at the root"
                )
            )
    if versions and sum(1 for v in versions if isinstance(v, Mapping) and v.get("storage")) != 1:
        causes.append(
            invalid_value("spec.versions", "...", "must have exactly one version marked as storage version")
        )
    return causes


def _crd_validate_update(new: Obj, old: Obj) -> list[Cause]:
    return [
        immutable(f"spec.{key}", _spec(new).get(key))
        for key in ("group", "scope")
        if _spec(new).get(key) != _spec(old).get(key)
    ]


BUILTIN_STRATEGIES: dict[tuple[str, str], Strategy] = {
    ("", "Namespace"): Strategy(
        name_rule=dns1123_label, default=_namespace_default, prepare_create=_namespace_prepare
    ),
    ("", "Node"): Strategy(validate=_node_validate, validate_status=_node_validate_status),
    ("", "Pod"): Strategy(
        default=_pod_default,
        prepare_create=_pod_prepare,
        validate=_pod_validate,
        validate_update=_pod_validate_update,
        validate_status=_pod_validate_status,
    ),
    ("", "Event"): Strategy(validate=_event_validate),
    ("", "ConfigMap"): Strategy(validate=_configmap_validate, validate_update=_configmap_validate_update),
    ("", "Secret"): Strategy(validate=lambda secret: config_keys("data", secret.get("data"))),
    ("batch", "Job"): Strategy(
        default=_job_default,
        prepare_create=_job_prepare,
        validate=_job_validate,
        validate_update=_job_validate_update,
    ),
    ("coordination.k8s.io", "Lease"): Strategy(validate=_lease_validate),
    ("apiextensions.k8s.io", "CustomResourceDefinition"): Strategy(
        default=_crd_default,
        prepare_create=_crd_prepare,
        validate=_crd_validate,
        validate_update=_crd_validate_update,
    ),
}


def strategy_for(rt: ResourceType) -> Strategy:
    if not rt.custom:
        return BUILTIN_STRATEGIES[(rt.group, rt.kind)]
    root = rt.schema or {"type": "object", "x-kubernetes-preserve-unknown-fields": True}

    def prepare(obj: Obj, _now: str) -> None:
        if rt.has_status:
            obj.pop("status", None)

    def validate(obj: Obj) -> list[Cause]:
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        return crd_schema.validate(root, body)

    return Strategy(
        default=lambda obj: crd_schema.apply_defaults(root, obj), prepare_create=prepare, validate=validate
    )
