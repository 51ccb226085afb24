"""Parsing the ``resource.k8s.io/v1`` kinds into :mod:`gpuplane.model.dra`'s frozen types.

Each ``parse_*`` takes one decoded object and returns its frozen form, or raises
:class:`~gpuplane.model.errors.InputError` with the field path; the loader adds the file, the
document and the object's ``Kind/namespace/name``.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from gpuplane.model import fields as f
from gpuplane.model.dra import (
    ALL,
    EXACT_COUNT,
    AllocatedDevice,
    AttributeValue,
    CapacityPolicy,
    ClaimSpec,
    Device,
    DeviceClass,
    DeviceConstraint,
    DeviceRequest,
    DeviceTaint,
    DeviceTaintRule,
    DeviceToleration,
    ExactRequest,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    Version,
    check_names,
)
from gpuplane.model.errors import InputError
from gpuplane.model.kinds import NODE_OPERATORS, _requirements, metadata_name, metadata_namespace
from gpuplane.model.objects import NodeSelectorTerm, frozen_map
from gpuplane.model.quantity import QuantityError, parse_quantity

Doc = Mapping[str, Any]
_SEMVER = re.compile(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?")
_DEVICE_TAINT_EFFECTS = ("NoSchedule", "NoExecute")
_TAINT_EFFECTS_READ = (*_DEVICE_TAINT_EFFECTS, "None")  # None: informational, never repels
# A request asks for at most this many devices (Kubernetes' AllocationResultsMaxSize).
MAX_COUNT = 32


def _quantity(value: object, path: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise InputError(f"expected a quantity, got {f.type_name(value)}", field=path)
    try:
        q = parse_quantity(value)
    except QuantityError as err:
        raise InputError(str(err), field=path) from None
    if q < 0:
        raise InputError("must not be negative", field=path)
    return q


def _node_terms(raw: Doc, path: str) -> tuple[NodeSelectorTerm, ...]:
    terms = []
    tpath = f.join(path, "nodeSelectorTerms")
    for i, item in enumerate(f.get_list(raw, "nodeSelectorTerms", path, required=True)):
        here = f.join(tpath, i)
        term = f.as_map(item, here)
        exprs = f.get_list(term, "matchExpressions", here)
        terms.append(NodeSelectorTerm(_requirements(exprs, f.join(here, "matchExpressions"), NODE_OPERATORS)))
    return tuple(terms)


def _attribute(raw: object, path: str) -> AttributeValue:
    value = f.as_map(raw, path)
    kinds = [k for k in ("int", "bool", "string", "version") if k in value]
    if len(kinds) != 1:
        raise InputError("exactly one of int, bool, string and version must be set", field=path)
    kind = kinds[0]
    here = f.join(path, kind)
    if kind == "int":
        return f.as_int(value[kind], here)
    if kind == "bool":
        return f.as_bool(value[kind], here)
    text = f.as_str(value[kind], here)
    if kind == "version":
        if not _SEMVER.fullmatch(text):
            raise InputError(f"invalid semantic version {text!r}", field=here)
        return Version(text)
    return text


def _qualify(name: str, driver: str, path: str) -> str:
    if not name or name.count("/") > 1 or name.endswith("/") or name.startswith("/"):
        raise InputError(f"invalid qualified name {name!r}", field=path)
    return name if "/" in name else f"{driver}/{name}"


def _counter_sets(raw: object, path: str) -> dict[str, Mapping[str, Fraction]]:
    out: dict[str, Mapping[str, Fraction]] = {}
    for i, item in enumerate(f.as_list(raw, path)):
        here = f.join(path, i)
        cs = f.as_map(item, here)
        name = f.req_str(cs, "name", here)
        if name in out:
            raise InputError(f"duplicate counter set {name!r}", field=f.join(here, "name"))
        out[name] = _counters(cs, here)
    return out


def _counters(raw: Doc, path: str) -> Mapping[str, Fraction]:
    counters = f.get_map(raw, "counters", path)
    cpath = f.join(path, "counters")
    out: dict[str, Fraction] = {}
    for name, value in counters.items():
        here = f.join(cpath, name)
        out[name] = _quantity(
            f.get(f.as_map(value, here), "value", here, required=True), f.join(here, "value")
        )
    return frozen_map(out)


MAX_VALID_VALUES = 10


def _request_policy(policy: Mapping[str, Any], here: str) -> tuple[Fraction | None, CapacityPolicy | None]:
    """A capacity's ``requestPolicy``: its default, and its valid values or range, checked as the
    API server checks them (one of the two at most; with either, a default that it allows)."""
    raw_default = policy.get("default")
    default = None if raw_default is None else _quantity(raw_default, f.join(here, "default"))
    values_raw = f.get_list(policy, "validValues", here)
    span = f.get_map(policy, "validRange", here)
    if values_raw and span:
        raise InputError("set at most one of validValues and validRange", field=here)
    if not values_raw and not span:
        return default, None
    if default is None:
        raise InputError("required with validValues or validRange", field=f.join(here, "default"))
    if values_raw:
        vpath = f.join(here, "validValues")
        if len(values_raw) > MAX_VALID_VALUES:
            raise InputError(f"at most {MAX_VALID_VALUES} values", field=vpath)
        values = tuple(_quantity(v, f.join(vpath, i)) for i, v in enumerate(values_raw))
        if any(a >= b for a, b in itertools.pairwise(values)):
            raise InputError("must be sorted in ascending order, without repeats", field=vpath)
        if default not in values:
            raise InputError("must be one of validValues", field=f.join(here, "default"))
        return default, CapacityPolicy(valid_values=values)
    rpath = f.join(here, "validRange")
    low = _quantity(f.get(span, "min", rpath, required=True), f.join(rpath, "min"))
    high = None if span.get("max") is None else _quantity(span["max"], f.join(rpath, "max"))
    step = None if span.get("step") is None else _quantity(span["step"], f.join(rpath, "step"))
    if high is not None and high < low:
        raise InputError("must not be below min", field=f.join(rpath, "max"))
    if step is not None and step <= 0:
        raise InputError("must be above zero", field=f.join(rpath, "step"))
    rule = CapacityPolicy(minimum=low, maximum=high, step=step)
    if rule.round(default) != default:
        raise InputError("must lie in validRange (on a step from min)", field=f.join(here, "default"))
    return default, rule


def _device(raw: object, path: str, driver: str) -> Device:
    dev = f.as_map(raw, path)
    name = f.req_str(dev, "name", path)
    if "basic" in dev:
        raise InputError(
            "resource.k8s.io/v1 devices have no 'basic' (that is v1beta1)", field=f.join(path, "basic")
        )
    apath = f.join(path, "attributes")
    attributes = {
        _qualify(k, driver, f.join(apath, k)): _attribute(v, f.join(apath, k))
        for k, v in f.get_map(dev, "attributes", path).items()
    }
    capacity: dict[str, Fraction] = {}
    defaults: dict[str, Fraction] = {}
    policies: dict[str, CapacityPolicy] = {}
    cpath = f.join(path, "capacity")
    for k, v in f.get_map(dev, "capacity", path).items():
        here = f.join(cpath, k)
        cap = f.as_map(v, here)
        qname = _qualify(k, driver, here)
        capacity[qname] = _quantity(f.get(cap, "value", here, required=True), f.join(here, "value"))
        if cap.get("requestPolicy") is not None:
            if not f.get_bool(dev, "allowMultipleAllocations", path, False):
                raise InputError(
                    "a requestPolicy needs allowMultipleAllocations: true",
                    field=f.join(here, "requestPolicy"),
                )
            default, rule = _request_policy(
                f.get_map(cap, "requestPolicy", here), f.join(here, "requestPolicy")
            )
            if default is not None:
                defaults[qname] = default
            if rule is not None:
                policies[qname] = rule
    consumes: dict[str, Mapping[str, Fraction]] = {}
    ccpath = f.join(path, "consumesCounters")
    for i, item in enumerate(f.get_list(dev, "consumesCounters", path)):
        here = f.join(ccpath, i)
        use = f.as_map(item, here)
        counter_set = f.req_str(use, "counterSet", here)
        if counter_set in consumes:
            raise InputError(f"duplicate counterSet {counter_set!r}", field=f.join(here, "counterSet"))
        consumes[counter_set] = _counters(use, here)
    taints = []
    tpath = f.join(path, "taints")
    for i, item in enumerate(f.get_list(dev, "taints", path)):
        here = f.join(tpath, i)
        t = f.as_map(item, here)
        effect = f.get_enum(t, "effect", here, _TAINT_EFFECTS_READ, None)
        if effect is None:
            raise InputError("required field is missing", field=f.join(here, "effect"))
        taints.append(DeviceTaint(f.req_str(t, "key", here), f.get_str(t, "value", here) or "", effect))
    selector = f.get_map(dev, "nodeSelector", path)
    return Device(
        name=name,
        attributes=frozen_map(attributes),
        capacity=frozen_map(capacity),
        capacity_default=frozen_map(defaults),
        capacity_policy=frozen_map(policies),
        consumes=frozen_map(consumes),
        allow_multiple=f.get_bool(dev, "allowMultipleAllocations", path, False),
        taints=tuple(taints),
        node_name=f.get_str(dev, "nodeName", path),
        node_terms=_node_terms(selector, f.join(path, "nodeSelector")) if selector else None,
        all_nodes=f.get_bool(dev, "allNodes", path, False),
    )


def parse_taint_rule(doc: Doc, version: str) -> DeviceTaintRule:
    """A DeviceTaintRule (v1alpha3, v1beta2 or v1): a device selector by driver, pool and device
    name, and one taint. v1alpha3's class and CEL selectors are refused (later versions dropped them)."""
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "", required=True)
    raw = f.get_map(spec, "taint", "spec", required=True)
    here = "spec.taint"
    effect = f.get_enum(raw, "effect", here, _TAINT_EFFECTS_READ, None)
    if effect is None:
        raise InputError("required field is missing", field=f.join(here, "effect"))
    taint = DeviceTaint(f.req_str(raw, "key", here), f.get_str(raw, "value", here) or "", effect)
    if spec.get("deviceSelector") is None:
        return DeviceTaintRule(name, taint, selects=False)
    selector = f.get_map(spec, "deviceSelector", "spec")
    spath = "spec.deviceSelector"
    for dropped in ("deviceClassName", "selectors"):
        if selector.get(dropped):
            raise InputError(
                f"{dropped} is not supported ({version} only; resource.k8s.io/v1beta2 and v1 select "
                "by driver, pool and device)",
                field=f.join(spath, dropped),
            )
    return DeviceTaintRule(
        name,
        taint,
        driver=f.get_str(selector, "driver", spath),
        pool=f.get_str(selector, "pool", spath),
        device=f.get_str(selector, "device", spath),
    )


def parse_resource_slice(doc: Doc, version: str) -> ResourceSlice:
    del version
    name = metadata_name(doc)
    spec = f.get_map(doc, "spec", "", required=True)
    driver = f.req_str(spec, "driver", "spec")
    pool = f.get_map(spec, "pool", "spec", required=True)
    ppath = "spec.pool"
    generation = f.get_int(pool, "generation", ppath) or 0
    count = f.get_int(pool, "resourceSliceCount", ppath, required=True)
    assert count is not None
    if count <= 0:
        raise InputError("must be greater than zero", field="spec.pool.resourceSliceCount")
    if generation < 0:
        raise InputError("must not be negative", field="spec.pool.generation")
    node_name = f.get_str(spec, "nodeName", "spec")
    selector = f.get_map(spec, "nodeSelector", "spec")
    all_nodes = f.get_bool(spec, "allNodes", "spec", False)
    per_device = f.get_bool(spec, "perDeviceNodeSelection", "spec", False)
    devices_raw = f.get_list(spec, "devices", "spec")
    if sum(1 for x in (node_name, selector, all_nodes, per_device) if x) > 1:
        raise InputError(
            "at most one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection may be set",
            field="spec",
        )
    if devices_raw and not (node_name or selector or all_nodes or per_device):
        raise InputError(
            "one of nodeName, nodeSelector, allNodes and perDeviceNodeSelection must be set", field="spec"
        )
    devices = tuple(_device(d, f.join("spec.devices", i), driver) for i, d in enumerate(devices_raw))
    check_names([d.name for d in devices], "device", "spec.devices")
    counters = f.get(spec, "sharedCounters", "spec")
    return ResourceSlice(
        name=name,
        driver=driver,
        pool=f.req_str(pool, "name", ppath),
        generation=generation,
        slice_count=count,
        devices=devices,
        node_name=node_name,
        node_terms=_node_terms(selector, "spec.nodeSelector") if selector else None,
        all_nodes=all_nodes,
        per_device_nodes=per_device,
        shared_counters=frozen_map(_counter_sets(counters, "spec.sharedCounters") if counters else {}),
    )


def _selectors(raw: Doc, path: str) -> tuple[str, ...]:
    out = []
    spath = f.join(path, "selectors")
    for i, item in enumerate(f.get_list(raw, "selectors", path)):
        here = f.join(spath, i)
        cel = f.get_map(f.as_map(item, here), "cel", here, required=True)
        out.append(f.req_str(cel, "expression", f.join(here, "cel")))
    return tuple(out)


def parse_device_class(doc: Doc, version: str) -> DeviceClass:
    del version
    spec = f.get_map(doc, "spec", "")
    drivers = []
    cpath = "spec.config"
    for i, item in enumerate(f.get_list(spec, "config", "spec")):
        here = f.join(cpath, i)
        opaque = f.get_map(f.as_map(item, here), "opaque", here)
        if opaque:
            drivers.append(f.req_str(opaque, "driver", f.join(here, "opaque")))
    return DeviceClass(
        name=metadata_name(doc),
        selectors=_selectors(spec, "spec"),
        config_drivers=tuple(drivers),
        extended_resource_name=f.get_str(spec, "extendedResourceName", "spec"),
    )


def _tolerations(raw: Doc, path: str) -> tuple[DeviceToleration, ...]:
    out = []
    tpath = f.join(path, "tolerations")
    for i, item in enumerate(f.get_list(raw, "tolerations", path)):
        here = f.join(tpath, i)
        t = f.as_map(item, here)
        op = f.get_enum(t, "operator", here, ("Equal", "Exists"), "Equal")
        effect = f.get_enum(t, "effect", here, ("", *_DEVICE_TAINT_EFFECTS), "")
        assert op is not None
        assert effect is not None
        out.append(
            DeviceToleration(f.get_str(t, "key", here) or "", op, f.get_str(t, "value", here) or "", effect)
        )
    return tuple(out)


def _exact(raw: Doc, path: str, name: str) -> ExactRequest:
    mode = f.get_enum(raw, "allocationMode", path, (EXACT_COUNT, ALL), EXACT_COUNT)
    assert mode is not None
    count = f.get_int(raw, "count", path)
    if mode == ALL and count is not None:
        raise InputError("count must not be set with allocationMode All", field=f.join(path, "count"))
    count = 1 if count is None else count
    if not 1 <= count <= MAX_COUNT:
        raise InputError(f"must be between 1 and {MAX_COUNT}", field=f.join(path, "count"))
    if f.get_bool(raw, "adminAccess", path, False):
        raise InputError("adminAccess is not supported", field=f.join(path, "adminAccess"))
    capacity = f.get_map(raw, "capacity", path)
    cpath = f.join(path, "capacity")
    requests = f.get_map(capacity, "requests", cpath)
    rpath = f.join(cpath, "requests")
    return ExactRequest(
        name=name,
        device_class=f.req_str(raw, "deviceClassName", path),
        selectors=_selectors(raw, path),
        mode=mode,
        count=count,
        # Qualified at allocation time: the driver's domain depends on the device.
        capacity=frozen_map({k: _quantity(v, f.join(rpath, k)) for k, v in requests.items()}),
        tolerations=_tolerations(raw, path),
    )


def _request(raw: object, path: str) -> DeviceRequest:
    req = f.as_map(raw, path)
    name = f.req_str(req, "name", path)
    exactly = f.get_map(req, "exactly", path)
    first = f.get_list(req, "firstAvailable", path)
    if bool(exactly) == bool(first):
        raise InputError("exactly one of exactly and firstAvailable must be set", field=path)
    if exactly:
        return DeviceRequest(name, (_exact(exactly, f.join(path, "exactly"), name),))
    alternatives = []
    fpath = f.join(path, "firstAvailable")
    for i, item in enumerate(first):
        here = f.join(fpath, i)
        sub = f.as_map(item, here)
        alternatives.append(_exact(sub, here, f"{name}/{f.req_str(sub, 'name', here)}"))
    check_names([a.name for a in alternatives], "subrequest", fpath)
    return DeviceRequest(name, tuple(alternatives))


def claim_spec(spec: Doc, path: str) -> ClaimSpec:
    """``spec`` of a ResourceClaim: its ``devices`` requests and constraints."""
    devices = f.get_map(spec, "devices", path)
    dpath = f.join(path, "devices")
    requests = tuple(
        _request(r, f.join(f.join(dpath, "requests"), i))
        for i, r in enumerate(f.get_list(devices, "requests", dpath))
    )
    check_names([r.name for r in requests], "request", f.join(dpath, "requests"))
    known = {r.name for r in requests} | {a.name for r in requests for a in r.alternatives}
    constraints = []
    cpath = f.join(dpath, "constraints")
    for i, item in enumerate(f.get_list(devices, "constraints", dpath)):
        here = f.join(cpath, i)
        c = f.as_map(item, here)
        names = tuple(
            f.as_str(n, f.join(f.join(here, "requests"), j))
            for j, n in enumerate(f.get_list(c, "requests", here))
        )
        for j, n in enumerate(names):
            if n not in known:
                raise InputError(f"no request named {n!r}", field=f.join(f.join(here, "requests"), j))
        match = f.get_str(c, "matchAttribute", here)
        distinct = f.get_str(c, "distinctAttribute", here)
        if (match is None) == (distinct is None):
            raise InputError("exactly one of matchAttribute and distinctAttribute must be set", field=here)
        constraints.append(DeviceConstraint(names, match, distinct))
    return ClaimSpec(requests, tuple(constraints))


def _allocation(status: Doc) -> tuple[AllocatedDevice, ...] | None:
    allocation = f.get_map(status, "allocation", "status")
    if not allocation:
        return None
    apath = "status.allocation"
    devices = f.get_map(allocation, "devices", apath)
    dpath = f.join(apath, "devices")
    out = []
    for i, item in enumerate(f.get_list(devices, "results", dpath)):
        here = f.join(f.join(dpath, "results"), i)
        r = f.as_map(item, here)
        consumed = f.get_map(r, "consumedCapacity", here)
        cpath = f.join(here, "consumedCapacity")
        out.append(
            AllocatedDevice(
                request=f.req_str(r, "request", here),
                driver=f.req_str(r, "driver", here),
                pool=f.req_str(r, "pool", here),
                device=f.req_str(r, "device", here),
                consumed=frozen_map({k: _quantity(v, f.join(cpath, k)) for k, v in consumed.items()}),
            )
        )
    return tuple(out)


def parse_resource_claim(doc: Doc, version: str) -> ResourceClaim:
    del version
    spec = f.get_map(doc, "spec", "", required=True)
    status = f.get_map(doc, "status", "")
    reserved = []
    rpath = "status.reservedFor"
    for i, item in enumerate(f.get_list(status, "reservedFor", "status")):
        here = f.join(rpath, i)
        reserved.append(f.req_str(f.as_map(item, here), "name", here))
    return ResourceClaim(
        namespace=metadata_namespace(doc),
        name=metadata_name(doc),
        spec=claim_spec(spec, "spec"),
        allocation=_allocation(status),
        reserved_for=tuple(reserved),
    )


def parse_claim_template(doc: Doc, version: str) -> ResourceClaimTemplate:
    del version
    spec = f.get_map(doc, "spec", "", required=True)
    inner = f.get_map(spec, "spec", "spec", required=True)
    return ResourceClaimTemplate(
        namespace=metadata_namespace(doc), name=metadata_name(doc), spec=claim_spec(inner, "spec.spec")
    )
