"""Decoding of individual Kubernetes and Kueue objects into frozen model types.

Each ``parse_*`` function takes one decoded document (a mapping) and its API version
and returns a model object, raising :class:`InputError` with the field path on bad
input. Cross-object checks (references, cycles, duplicates) live in
:mod:`gpuplane.model.validate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuplane.model import dra, jobs
from gpuplane.model import fields as f
from gpuplane.model import labels as keys
from gpuplane.model.admission_checks import cluster_queue_checks, workload_check_states
from gpuplane.model.errors import InputError
from gpuplane.model.labels import (
    PREFERRED_TOPOLOGY,
    PRIORITY_CLASS_LABEL,
    REQUIRED_TOPOLOGY,
)
from gpuplane.model.objects import (
    WARM_NODE_GPUS_ANNOTATION,
    WARM_NODES_ANNOTATION,
    Admission,
    ClusterQueue,
    Cohort,
    Condition,
    FlavorFungibility,
    FlavorQuotas,
    KueueConfiguration,
    LabelSelector,
    LocalQueue,
    Namespace,
    Node,
    NodeSelectorTerm,
    Pod,
    PodSet,
    PodSetAssignment,
    PodTemplate,
    PreemptionPolicy,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    SelectorRequirement,
    Taint,
    Toleration,
    Topology,
    Workload,
    WorkloadPriorityClass,
    frozen_map,
)

KUEUE_GROUP = keys.KUEUE_GROUP
KUEUE_VERSIONS = ("v1beta1", "v1beta2")

SELECTOR_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")

Doc = Mapping[str, Any]


# ---------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------


def metadata_name(doc: Doc) -> str:
    meta = f.get_map(doc, "metadata", "", required=True)
    return f.req_str(meta, "name", "metadata")


def metadata_namespace(doc: Doc, default: str = "default") -> str:
    meta = f.get_map(doc, "metadata", "")
    ns = f.get_str(meta, "namespace", "metadata")
    return ns or default


def _requirements(raw: Sequence[Any], path: str, operators: Sequence[str]) -> tuple[SelectorRequirement, ...]:
    out = []
    for i, item in enumerate(raw):
        here = f.join(path, i)
        req = f.as_map(item, here)
        key = f.req_str(req, "key", here)
        op = f.get_enum(req, "operator", here, operators, None)
        if op is None:
            raise InputError("required field is missing", field=f.join(here, "operator"))
        values = tuple(
            f.as_str(v, f.join(f.join(here, "values"), j))
            for j, v in enumerate(f.get_list(req, "values", here))
        )
        if op in ("In", "NotIn") and not values:
            raise InputError(f"operator {op} needs at least one value", field=f.join(here, "values"))
        if op in ("Exists", "DoesNotExist") and values:
            raise InputError(f"operator {op} takes no values", field=f.join(here, "values"))
        if op in ("Gt", "Lt"):
            if len(values) != 1:
                raise InputError(f"operator {op} needs exactly one value", field=f.join(here, "values"))
            try:
                int(values[0])
            except ValueError:
                raise InputError(
                    f"operator {op} needs an integer value", field=f.join(here, "values")
                ) from None
        out.append(SelectorRequirement(key=key, operator=op, values=values))
    return tuple(out)


def label_selector(raw: Doc, path: str) -> LabelSelector:
    return LabelSelector(
        match_labels=frozen_map(f.string_map(raw, "matchLabels", path)),
        match_expressions=_requirements(
            f.get_list(raw, "matchExpressions", path), f.join(path, "matchExpressions"), SELECTOR_OPERATORS
        ),
    )


def taints(raw: Sequence[Any], path: str) -> tuple[Taint, ...]:
    out = []
    for i, item in enumerate(raw):
        here = f.join(path, i)
        t = f.as_map(item, here)
        effect = f.get_enum(t, "effect", here, TAINT_EFFECTS, None)
        if effect is None:
            raise InputError("required field is missing", field=f.join(here, "effect"))
        out.append(
            Taint(key=f.req_str(t, "key", here), value=f.get_str(t, "value", here) or "", effect=effect)
        )
    return tuple(out)


def tolerations(raw: Sequence[Any], path: str) -> tuple[Toleration, ...]:
    out = []
    for i, item in enumerate(raw):
        here = f.join(path, i)
        t = f.as_map(item, here)
        op = f.get_enum(t, "operator", here, ("Equal", "Exists"), "Equal")
        effect = f.get_enum(t, "effect", here, ("", *TAINT_EFFECTS), "")
        assert op is not None
        assert effect is not None
        out.append(
            Toleration(
                key=f.get_str(t, "key", here) or "",
                operator=op,
                value=f.get_str(t, "value", here) or "",
                effect=effect,
            )
        )
    return tuple(out)


def _container_requests(container: Doc, path: str) -> tuple[dict[str, int], list[str]]:
    resources = f.get_map(container, "resources", path)
    rpath = f.join(path, "resources")
    requests = f.resource_list(resources, "requests", rpath)
    limits = f.resource_list(resources, "limits", rpath)
    below: list[str] = []
    for name, limit in limits.items():
        if name not in requests:
            # Kubernetes defaults a missing request to its limit.
            requests[name] = limit
        elif requests[name] > limit:
            below.append(name)
    return requests, below


def pod_template(spec: Doc, path: str, meta: Doc | None = None) -> PodTemplate:
    """Effective per-pod requests and placement constraints of a pod spec."""
    total: dict[str, int] = {}
    below: list[str] = []
    containers = f.get_list(spec, "containers", path)
    cpath = f.join(path, "containers")
    for i, raw in enumerate(containers):
        here = f.join(cpath, i)
        req, bad = _container_requests(f.as_map(raw, here), here)
        below += bad
        for k, v in req.items():
            total[k] = total.get(k, 0) + v
    init_peak: dict[str, int] = {}
    sidecars: dict[str, int] = {}
    ipath = f.join(path, "initContainers")
    for i, raw in enumerate(f.get_list(spec, "initContainers", path)):
        here = f.join(ipath, i)
        container = f.as_map(raw, here)
        req, bad = _container_requests(container, here)
        below += bad
        if f.get_str(container, "restartPolicy", here) == "Always":
            # A sidecar runs beside the regular containers and every later init container.
            for k, v in req.items():
                sidecars[k] = sidecars.get(k, 0) + v
            continue
        for k, v in req.items():
            init_peak[k] = max(init_peak.get(k, 0), v + sidecars.get(k, 0))
    for k, v in sidecars.items():
        total[k] = total.get(k, 0) + v
    for k, v in init_peak.items():
        total[k] = max(total.get(k, 0), v)
    for k, v in f.resource_list(spec, "overhead", path).items():
        total[k] = total.get(k, 0) + v

    node_terms: tuple[NodeSelectorTerm, ...] | None = None
    affinity = f.get_map(spec, "affinity", path)
    node_affinity = f.get_map(affinity, "nodeAffinity", f.join(path, "affinity"))
    napath = f.join(f.join(path, "affinity"), "nodeAffinity")
    required = f.get_map(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution", napath)
    if required:
        rpath = f.join(napath, "requiredDuringSchedulingIgnoredDuringExecution")
        terms = []
        for i, raw in enumerate(f.get_list(required, "nodeSelectorTerms", rpath, required=True)):
            here = f.join(f.join(rpath, "nodeSelectorTerms"), i)
            term = f.as_map(raw, here)
            terms.append(
                NodeSelectorTerm(
                    _requirements(
                        f.get_list(term, "matchExpressions", here),
                        f.join(here, "matchExpressions"),
                        NODE_OPERATORS,
                    )
                )
            )
        node_terms = tuple(terms)
    meta = meta or {}
    return PodTemplate(
        requests=frozen_map(total),
        limits_below_requests=tuple(sorted(set(below))),
        node_selector=frozen_map(f.string_map(spec, "nodeSelector", path)),
        required_node_terms=node_terms,
        tolerations=tolerations(f.get_list(spec, "tolerations", path), f.join(path, "tolerations")),
        labels=frozen_map(f.string_map(meta, "labels", "metadata")),
        annotations=frozen_map(f.string_map(meta, "annotations", "metadata")),
        active_deadline=_active_deadline(spec, path),
        claims=dra.parse_pod_claims(spec, path),
    )


def _active_deadline(spec: Doc, path: str) -> int | None:
    """``activeDeadlineSeconds`` of a pod spec, if set: a positive whole number of seconds."""
    seconds = f.get_int(spec, "activeDeadlineSeconds", path)
    if seconds is not None and seconds <= 0:
        raise InputError(
            f"must be positive, got {seconds}",
            field=f.join(path, "activeDeadlineSeconds"),
            invalid_value=True,
        )
    return seconds


def _template(raw: Doc, path: str) -> PodTemplate:
    meta = f.get_map(raw, "metadata", path)
    spec = f.get_map(raw, "spec", path)
    tpl = pod_template(spec, f.join(path, "spec"), None)
    labels = f.string_map(meta, "labels", f.join(path, "metadata"))
    annotations = f.string_map(meta, "annotations", f.join(path, "metadata"))
    return PodTemplate(
        requests=tpl.requests,
        limits_below_requests=tpl.limits_below_requests,
        node_selector=tpl.node_selector,
        required_node_terms=tpl.required_node_terms,
        tolerations=tpl.tolerations,
        labels=frozen_map(labels),
        annotations=frozen_map(annotations),
        active_deadline=tpl.active_deadline,
        claims=tpl.claims,
    )


def _resource_groups(spec: Doc, path: str, *, required: bool) -> tuple[ResourceGroup, ...]:
    gpath = f.join(path, "resourceGroups")
    raw_groups = f.get_list(spec, "resourceGroups", path, required=required)
    groups = [_resource_group(raw, f.join(gpath, gi)) for gi, raw in enumerate(raw_groups)]
    seen_res: set[str] = set()
    seen_flavor: set[str] = set()
    for gi, group in enumerate(groups):
        for r in group.covered_resources:
            if r in seen_res:
                raise InputError(
                    f"resource {r!r} is covered by more than one resource group", field=f.join(gpath, gi)
                )
            seen_res.add(r)
        for fl in group.flavors:
            if fl.name in seen_flavor:
                raise InputError(
                    f"flavor {fl.name!r} appears in more than one resource group", field=f.join(gpath, gi)
                )
            seen_flavor.add(fl.name)
    return tuple(groups)


def _resource_group(raw: object, here: str) -> ResourceGroup:
    group_doc = f.as_map(raw, here)
    covered_raw = f.get_list(group_doc, "coveredResources", here, required=True)
    covered = tuple(
        f.as_str(v, f.join(f.join(here, "coveredResources"), i)) for i, v in enumerate(covered_raw)
    )
    if len(set(covered)) != len(covered):
        raise InputError("duplicate resource name", field=f.join(here, "coveredResources"))
    fpath = f.join(here, "flavors")
    flavors = [
        _flavor_quotas(fraw, f.join(fpath, fi), covered)
        for fi, fraw in enumerate(f.get_list(group_doc, "flavors", here, required=True))
    ]
    if not flavors:
        raise InputError("a resource group needs at least one flavor", field=fpath)
    return ResourceGroup(covered_resources=covered, flavors=tuple(flavors))


def _flavor_quotas(fraw: object, fhere: str, covered: tuple[str, ...]) -> FlavorQuotas:
    flavor = f.as_map(fraw, fhere)
    fname = f.req_str(flavor, "name", fhere)
    quotas: dict[str, ResourceQuota] = {}
    rpath = f.join(fhere, "resources")
    for ri, rraw in enumerate(f.get_list(flavor, "resources", fhere, required=True)):
        rhere = f.join(rpath, ri)
        res = f.as_map(rraw, rhere)
        rname = f.req_str(res, "name", rhere)
        if rname not in covered:
            raise InputError(
                f"resource {rname!r} is not listed in coveredResources", field=f.join(rhere, "name")
            )
        if rname in quotas:
            raise InputError(f"duplicate resource {rname!r}", field=f.join(rhere, "name"))
        quotas[rname] = _resource_quota(res, rname, rhere)
    missing = [r for r in covered if r not in quotas]
    if missing:
        raise InputError(
            f"flavor {fname!r} has no quota for covered resource(s) {', '.join(missing)}", field=rpath
        )
    return FlavorQuotas(name=fname, resources=frozen_map(quotas))


def _resource_quota(res: Doc, rname: str, rhere: str) -> ResourceQuota:
    nominal_raw = f.get(res, "nominalQuota", rhere, required=True)
    nominal = f.quantity(rname, nominal_raw, f.join(rhere, "nominalQuota"))
    borrowing = res.get("borrowingLimit")
    lending = res.get("lendingLimit")
    quota = ResourceQuota(
        nominal=nominal,
        borrowing_limit=None
        if borrowing is None
        else f.quantity(rname, borrowing, f.join(rhere, "borrowingLimit")),
        lending_limit=None if lending is None else f.quantity(rname, lending, f.join(rhere, "lendingLimit")),
    )
    if quota.lending_limit is not None and quota.lending_limit > nominal:
        raise InputError("lendingLimit must not exceed nominalQuota", field=f.join(rhere, "lendingLimit"))
    return quota


def _fair_weight(spec: Doc, path: str) -> float:
    fs = f.get_map(spec, "fairSharing", path)
    weight = fs.get("weight")
    if weight is None:
        return 1.0
    milli = f.quantity("cpu", weight, f.join(f.join(path, "fairSharing"), "weight"))
    return milli / 1000.0


# ---------------------------------------------------------------------------
# Kueue kinds
# ---------------------------------------------------------------------------


def parse_cluster_queue(doc: Doc, version: str) -> ClusterQueue:
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "", required=True)
    path = "spec"
    if version == "v1beta2" and "cohort" in spec:
        raise InputError("field 'cohort' is not served in v1beta2; use 'cohortName'", field="spec.cohort")
    cohort = f.get_str(spec, "cohortName", path) if version == "v1beta2" else f.get_str(spec, "cohort", path)
    if version == "v1beta1" and cohort is None:
        cohort = f.get_str(spec, "cohortName", path)
    selector_raw = spec.get("namespaceSelector")
    # Kueue: "Defaults to null which is a nothing selector (no namespaces eligible)."
    selector = (
        LabelSelector(nothing=True)
        if selector_raw is None
        else label_selector(f.as_map(selector_raw, "spec.namespaceSelector"), "spec.namespaceSelector")
    )
    strategy = f.get_enum(spec, "queueingStrategy", path, ("BestEffortFIFO", "StrictFIFO"), "BestEffortFIFO")
    pre = f.get_map(spec, "preemption", path)
    ppath = "spec.preemption"
    bwc = f.get_map(pre, "borrowWithinCohort", ppath)
    bpath = f.join(ppath, "borrowWithinCohort")
    preemption = PreemptionPolicy(
        within_cluster_queue=f.get_enum(
            pre, "withinClusterQueue", ppath, ("Never", "LowerPriority", "LowerOrNewerEqualPriority"), "Never"
        )
        or "Never",
        reclaim_within_cohort=f.get_enum(
            pre, "reclaimWithinCohort", ppath, ("Never", "LowerPriority", "Any"), "Never"
        )
        or "Never",
        borrow_within_cohort=f.get_enum(bwc, "policy", bpath, ("Never", "LowerPriority"), "Never") or "Never",
        max_priority_threshold=f.get_int(bwc, "maxPriorityThreshold", bpath),
    )
    ff = f.get_map(spec, "flavorFungibility", path)
    fpath = "spec.flavorFungibility"
    borrow_values: tuple[str, ...] = ("MayStopSearch", "TryNextFlavor")
    preempt_values: tuple[str, ...] = ("MayStopSearch", "TryNextFlavor")
    if version == "v1beta1":
        borrow_values = ("Borrow", *borrow_values)
        preempt_values = ("Preempt", *preempt_values)
    when_borrow = f.get_enum(ff, "whenCanBorrow", fpath, borrow_values, "MayStopSearch") or "MayStopSearch"
    when_preempt = f.get_enum(ff, "whenCanPreempt", fpath, preempt_values, "TryNextFlavor") or "TryNextFlavor"
    fungibility = FlavorFungibility(
        when_can_borrow="MayStopSearch" if when_borrow == "Borrow" else when_borrow,
        when_can_preempt="MayStopSearch" if when_preempt == "Preempt" else when_preempt,
        preference=f.get_enum(
            ff, "preference", fpath, ("BorrowingOverPreemption", "PreemptionOverBorrowing"), None
        ),
    )
    groups = _resource_groups(spec, path, required=False)
    return ClusterQueue(
        name=name,
        resource_groups=groups,
        cohort=cohort or None,
        namespace_selector=selector,
        queueing_strategy=strategy or "BestEffortFIFO",
        preemption=preemption,
        flavor_fungibility=fungibility,
        fair_weight=_fair_weight(spec, path),
        stop_policy=f.get_enum(spec, "stopPolicy", path, ("None", "Hold", "HoldAndDrain"), "None") or "None",
        admission_checks=cluster_queue_checks(spec, path),
    )


def parse_cohort(doc: Doc, version: str) -> Cohort:
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "")
    parent = f.get_str(spec, "parentName", "spec")
    if parent is None and version == "v1beta1":
        parent = f.get_str(spec, "parent", "spec")
    return Cohort(
        name=name,
        parent=parent or None,
        resource_groups=_resource_groups(spec, "spec", required=False),
        fair_weight=_fair_weight(spec, "spec"),
    )


def parse_resource_flavor(doc: Doc, version: str) -> ResourceFlavor:
    del version
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "")
    return ResourceFlavor(
        name=name,
        node_labels=frozen_map(f.string_map(spec, "nodeLabels", "spec")),
        node_taints=taints(f.get_list(spec, "nodeTaints", "spec"), "spec.nodeTaints"),
        tolerations=tolerations(f.get_list(spec, "tolerations", "spec"), "spec.tolerations"),
        topology_name=f.get_str(spec, "topologyName", "spec"),
        warm_nodes=_annotation_int(doc, WARM_NODES_ANNOTATION),
        warm_node_gpus=_annotation_int(doc, WARM_NODE_GPUS_ANNOTATION),
    )


def _annotation_int(doc: Doc, key: str) -> int:
    """A non-negative integer annotation (0 when absent)."""
    meta = f.get_map(doc, "metadata", "")
    text = f.string_map(meta, "annotations", "metadata").get(key)
    if text is None:
        return 0
    if not text.isdigit():
        raise InputError(
            f"expected a non-negative integer, got {text!r}", field=f"metadata.annotations.{key}"
        )
    return int(text)


def parse_local_queue(doc: Doc, version: str) -> LocalQueue:
    del version
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "", required=True)
    return LocalQueue(
        namespace=metadata_namespace(doc),
        name=name,
        cluster_queue=f.req_str(spec, "clusterQueue", "spec"),
        stop_policy=f.get_enum(spec, "stopPolicy", "spec", ("None", "Hold", "HoldAndDrain"), "None")
        or "None",
    )


def parse_priority_class(doc: Doc, version: str) -> WorkloadPriorityClass:
    del version
    name = metadata_name(doc)
    value = f.get_int(doc, "value", "", required=True)
    assert value is not None
    return WorkloadPriorityClass(name=name, value=value)


def parse_topology(doc: Doc, version: str) -> Topology:
    del version
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "", required=True)
    levels = []
    for i, raw in enumerate(f.get_list(spec, "levels", "spec", required=True)):
        here = f"spec.levels[{i}]"
        levels.append(f.req_str(f.as_map(raw, here), "nodeLabel", here))
    if not levels:
        raise InputError("a topology needs at least one level", field="spec.levels")
    if len(set(levels)) != len(levels):
        raise InputError("duplicate topology level", field="spec.levels")
    return Topology(name=name, levels=tuple(levels))


def _conditions(status: Doc) -> tuple[Condition, ...]:
    out = []
    for i, raw in enumerate(f.get_list(status, "conditions", "status")):
        here = f"status.conditions[{i}]"
        cond = f.as_map(raw, here)
        st = f.get_enum(cond, "status", here, ("True", "False", "Unknown"), None)
        if st is None:
            raise InputError("required field is missing", field=f.join(here, "status"))
        ts = cond.get("lastTransitionTime")
        out.append(
            Condition(
                type=f.req_str(cond, "type", here),
                status=st == "True",
                reason=f.get_str(cond, "reason", here) or "",
                message=f.get_str(cond, "message", here) or "",
                last_transition=0.0 if ts is None else f.timestamp(ts, f.join(here, "lastTransitionTime")),
            )
        )
    return tuple(out)


def _admission(status: Doc, pod_sets: Sequence[PodSet]) -> Admission | None:
    raw = status.get("admission")
    if raw is None:
        return None
    path = "status.admission"
    adm = f.as_map(raw, path)
    cq = f.req_str(adm, "clusterQueue", path)
    by_name = {ps.name: ps for ps in pod_sets}
    assignments = []
    apath = f.join(path, "podSetAssignments")
    for i, item in enumerate(f.get_list(adm, "podSetAssignments", path, required=True)):
        here = f.join(apath, i)
        psa = f.as_map(item, here)
        name = f.req_str(psa, "name", here)
        if name not in by_name:
            raise InputError(f"no pod set named {name!r} in spec.podSets", field=f.join(here, "name"))
        count = f.get_int(psa, "count", here)
        if count is None:
            count = by_name[name].count
        if count < 0:
            raise InputError("must not be negative", field=f.join(here, "count"))
        flavors = f.string_map(psa, "flavors", here)
        usage = f.resource_list(psa, "resourceUsage", here)
        if not usage:
            per_pod = by_name[name].template.quota_requests
            usage = {r: per_pod.get(r, 0) * count for r in flavors}
        assignments.append(
            PodSetAssignment(
                name=name, count=count, flavors=frozen_map(flavors), resource_usage=frozen_map(usage)
            )
        )
    return Admission(cluster_queue=cq, pod_set_assignments=tuple(assignments))


def _pod_sets(spec: Doc, path: str) -> tuple[PodSet, ...]:
    out = []
    ppath = f.join(path, "podSets")
    raw_sets = f.get_list(spec, "podSets", path, required=True)
    if not raw_sets:
        raise InputError("a workload needs at least one pod set", field=ppath)
    names: set[str] = set()
    for i, raw in enumerate(raw_sets):
        here = f.join(ppath, i)
        ps = f.as_map(raw, here)
        name = f.get_str(ps, "name", here) or "main"
        if name in names:
            raise InputError(f"duplicate pod set name {name!r}", field=f.join(here, "name"))
        names.add(name)
        count = f.get_int(ps, "count", here)
        count = 1 if count is None else count
        if count < 0:
            raise InputError("must not be negative", field=f.join(here, "count"), invalid_value=True)
        min_count = f.get_int(ps, "minCount", here)
        if min_count is not None and not 0 <= min_count <= count:
            raise InputError(
                f"minCount must be between 0 and count ({count})",
                field=f.join(here, "minCount"),
                invalid_value=True,
            )
        template = _template(f.get_map(ps, "template", here, required=True), f.join(here, "template"))
        topo = f.get_map(ps, "topologyRequest", here)
        tpath = f.join(here, "topologyRequest")
        required_topo = f.get_str(topo, "required", tpath) or template.annotations.get(REQUIRED_TOPOLOGY)
        preferred_topo = f.get_str(topo, "preferred", tpath) or template.annotations.get(PREFERRED_TOPOLOGY)
        out.append(
            PodSet(
                name=name,
                count=count,
                template=template,
                min_count=min_count,
                required_topology=required_topo,
                preferred_topology=preferred_topo,
            )
        )
    return tuple(out)


def parse_workload(doc: Doc, version: str, priorities: Mapping[str, int]) -> Workload:
    name = metadata_name(doc)
    meta = f.get_map(doc, "metadata", "")
    spec = f.get_map(doc, "spec", "", required=True)
    pod_sets = _pod_sets(spec, "spec")
    priority = f.get_int(spec, "priority", "spec")
    pc_name = f.get_str(spec, "priorityClassName", "spec")
    ref = f.get_map(spec, "priorityClassRef", "spec")
    if ref:
        pc_name = f.get_str(ref, "name", "spec.priorityClassRef")
    if priority is None:
        priority = priorities.get(pc_name, 0) if pc_name else 0
    status = f.get_map(doc, "status", "")
    created = meta.get("creationTimestamp")
    del version
    return Workload(
        namespace=metadata_namespace(doc),
        name=name,
        uid=f.get_str(meta, "uid", "metadata") or name,
        creation=0.0 if created is None else f.timestamp(created, "metadata.creationTimestamp"),
        priority=priority,
        pod_sets=pod_sets,
        queue_name=f.get_str(spec, "queueName", "spec"),
        priority_class=pc_name,
        admission=_admission(status, pod_sets),
        conditions=_conditions(status),
        active=f.get_bool(spec, "active", "spec", True),
        labels=frozen_map(f.string_map(meta, "labels", "metadata")),
        annotations=frozen_map(f.string_map(meta, "annotations", "metadata")),
        check_states=workload_check_states(status),
        reclaimable=frozen_map(_reclaimable(status, pod_sets)),
        cluster_name=f.get_str(status, "clusterName", "status"),
        nominated_clusters=tuple(
            str(c) for c in f.get_list(status, "nominatedClusterNames", "status") if isinstance(c, str)
        ),
    )


def _reclaimable(status: Mapping[str, Any], pod_sets: Sequence[PodSet]) -> dict[str, int]:
    """``status.reclaimablePods``: per pod set, how many of its pods will not run again (at most
    the pod set's count)."""
    counts = {ps.name: ps.count for ps in pod_sets}
    out: dict[str, int] = {}
    for i, item in enumerate(f.get_list(status, "reclaimablePods", "status")):
        path = f"status.reclaimablePods[{i}]"
        entry = f.as_map(item, path)
        name = f.req_str(entry, "name", path)
        count = f.get_int(entry, "count", path, required=True)
        if name not in counts:
            raise InputError(f"no pod set named {name!r}", field=f.join(path, "name"))
        if count is None or count < 0:
            raise InputError("must be at least 0", field=f.join(path, "count"))
        if count:
            out[name] = min(count, counts[name])
    return out


def parse_configuration(doc: Doc, version: str) -> KueueConfiguration:
    del version
    fs = f.get_map(doc, "fairSharing", "")
    strategies_raw = f.get_list(fs, "preemptionStrategies", "fairSharing")
    allowed = ("LessThanOrEqualToFinalShare", "LessThanInitialShare")
    strategies = []
    for i, s in enumerate(strategies_raw):
        here = f"fairSharing.preemptionStrategies[{i}]"
        value = f.as_str(s, here)
        if value not in allowed:
            raise InputError(
                f"unsupported strategy {value!r}; expected one of {', '.join(allowed)}", field=here
            )
        strategies.append(value)
    gates_raw = f.get_map(doc, "featureGates", "")
    gates = {k: f.as_bool(v, f"featureGates.{k}") for k, v in gates_raw.items()}
    enabled = f.get_bool(fs, "enable", "fairSharing", False)
    # The v1beta2 API turns fair sharing on by the presence of the section.
    if "fairSharing" in doc and "enable" not in fs and fs:
        enabled = True
    return KueueConfiguration(
        fair_sharing=enabled,
        preemption_strategies=tuple(strategies) if strategies else KueueConfiguration().preemption_strategies,
        feature_gates=frozen_map(gates),
        device_class_mappings=frozen_map(dra.parse_device_class_mappings(doc)),
        device_class_sources=frozen_map(dra.parse_quota_sources(doc)),
    )


# ---------------------------------------------------------------------------
# Core kinds
# ---------------------------------------------------------------------------


def parse_namespace(doc: Doc, version: str) -> Namespace:
    del version
    meta = f.get_map(doc, "metadata", "", required=True)
    return Namespace(name=metadata_name(doc), labels=frozen_map(f.string_map(meta, "labels", "metadata")))


def parse_node(doc: Doc, version: str) -> Node:
    del version
    name = metadata_name(doc)
    meta = f.get_map(doc, "metadata", "")
    spec = f.get_map(doc, "spec", "")
    status = f.get_map(doc, "status", "")
    return Node(
        name=name,
        allocatable=frozen_map(f.resource_list(status, "allocatable", "status")),
        labels=frozen_map(f.string_map(meta, "labels", "metadata")),
        taints=taints(f.get_list(spec, "taints", "spec"), "spec.taints"),
        unschedulable=f.get_bool(spec, "unschedulable", "spec", False),
        annotations=frozen_map(f.string_map(meta, "annotations", "metadata")),
    )


def parse_pod(doc: Doc, version: str) -> Pod:
    del version
    name = metadata_name(doc)
    meta = f.get_map(doc, "metadata", "")
    spec = f.get_map(doc, "spec", "", required=True)
    status = f.get_map(doc, "status", "")
    return Pod(
        namespace=metadata_namespace(doc),
        name=name,
        template=pod_template(spec, "spec", meta),
        node_name=f.get_str(spec, "nodeName", "spec"),
        phase=f.get_str(status, "phase", "status") or "Pending",
        scheduler_name=f.get_str(spec, "schedulerName", "spec"),
    )


def job_workload_name(namespace: str, job_name: str, uid: str = "") -> str:
    """The name of the Workload that stands for a queued Job: the controller's name
    (:func:`gpuplane.model.jobs.workload_name`), with ``namespace/name`` for a missing uid."""
    return jobs.workload_name("Job", job_name, uid or f"{namespace}/{job_name}")


def workload_identity(doc: Doc, kind: str) -> tuple[str, str, str | None] | None:
    """Namespace, name and queue of a Workload or queued Job, read leniently.

    ``None`` when the object is too malformed to name (so it cannot be reported on its own).
    """
    try:
        namespace = metadata_namespace(doc)
        name = metadata_name(doc)
        meta = f.get_map(doc, "metadata", "")
        if kind == "Job":
            labels = f.string_map(meta, "labels", "metadata")
            annotations = f.string_map(meta, "annotations", "metadata")
            return (
                namespace,
                job_workload_name(namespace, name, f.get_str(meta, "uid", "metadata") or ""),
                jobs.queue_name(labels, annotations),
            )
        spec = f.get_map(doc, "spec", "")
        return namespace, name, f.get_str(spec, "queueName", "spec")
    except InputError:
        return None


def workload_from_job(doc: Doc, priorities: Mapping[str, int]) -> Workload | None:
    """Derive the Workload Kueue creates for a batch/v1 Job with a queue-name label.

    Returns ``None`` for a Job that Kueue does not manage (no queue-name label). The name, pod
    count, minCount (job-min-parallelism) and queue follow :mod:`gpuplane.model.jobs`, as the
    controller's do; this function adds strict checks with located errors.
    """
    meta = f.get_map(doc, "metadata", "", required=True)
    name = metadata_name(doc)
    labels = f.string_map(meta, "labels", "metadata")
    annotations = f.string_map(meta, "annotations", "metadata")
    queue = jobs.queue_name(labels, annotations)
    if not queue:
        return None
    spec = f.get_map(doc, "spec", "", required=True)
    parallelism = f.get_int(spec, "parallelism", "spec")
    if parallelism is not None and parallelism < 0:
        raise InputError("must not be negative", field="spec.parallelism", invalid_value=True)
    count = jobs.job_pod_count(parallelism, f.get_int(spec, "completions", "spec"))
    template = _template(f.get_map(spec, "template", "spec", required=True), "spec.template")
    min_count = jobs.job_min_count(annotations, count)
    pc_name = labels.get(PRIORITY_CLASS_LABEL)
    if pc_name is not None and pc_name not in priorities:
        raise InputError(
            f"WorkloadPriorityClass {pc_name!r} not found",
            field=f"metadata.labels[{PRIORITY_CLASS_LABEL}]",
            invalid_value=True,
        )
    namespace = metadata_namespace(doc)
    uid = f.get_str(meta, "uid", "metadata") or ""
    wl_name = job_workload_name(namespace, name, uid)
    created = meta.get("creationTimestamp")
    pod_set = PodSet(
        name="main",
        count=count,
        template=template,
        min_count=min_count,
        required_topology=template.annotations.get(REQUIRED_TOPOLOGY),
        preferred_topology=template.annotations.get(PREFERRED_TOPOLOGY),
    )
    return Workload(
        namespace=namespace,
        name=wl_name,
        uid=uid or wl_name,
        creation=0.0 if created is None else f.timestamp(created, "metadata.creationTimestamp"),
        priority=priorities.get(pc_name, 0) if pc_name else 0,
        pod_sets=(pod_set,),
        queue_name=queue,
        priority_class=pc_name,
        labels=frozen_map(labels),
        annotations=frozen_map(annotations),
    )
