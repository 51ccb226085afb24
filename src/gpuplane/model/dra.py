"""Dynamic Resource Allocation (``resource.k8s.io/v1``): the frozen objects gpuplane reads.

DeviceClasses, ResourceSlices (the devices drivers publish), ResourceClaims and
ResourceClaimTemplates (what pods ask for), and the ``resourceClaims`` of a pod spec. Attribute
and capacity names are kept fully qualified (``domain/name``): a name without a domain is in the
driver's domain, as Kubernetes reads it. Capacities and counters are exact quantities
(:class:`fractions.Fraction`, in the quantity's own unit). Parsing the cluster kinds lives in
:mod:`gpuplane.model.dra_kinds`; the pod spec's claims are read here, because
:mod:`gpuplane.model.kinds` reads pod specs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuplane.model import fields as f
from gpuplane.model.errors import InputError

if TYPE_CHECKING:
    from gpuplane.model.objects import NodeSelectorTerm

DRA_GROUP = "resource.k8s.io"
DRA_VERSION = "v1"
DEVICE_TAINT_RULE = "DeviceTaintRule"
DRA_KINDS = ("DeviceClass", "ResourceSlice", "ResourceClaim", "ResourceClaimTemplate", DEVICE_TAINT_RULE)
# DeviceTaintRule is served as v1alpha3 (1.33-1.35), v1beta2 (1.36, feature gate DRADeviceTaintRules)
# and v1 (1.37); the other kinds as v1 only.
TAINT_RULE_VERSIONS = ("v1alpha3", "v1beta2", "v1")


def version_problem(version: str, kind: str) -> str | None:
    """Why ``resource.k8s.io/{version}`` is not read for ``kind``, or None."""
    served = TAINT_RULE_VERSIONS if kind == DEVICE_TAINT_RULE else (DRA_VERSION,)
    if version in served:
        return None
    wanted = " or ".join(f"{DRA_GROUP}/{v}" for v in served)
    return f"unsupported apiVersion {DRA_GROUP}/{version}; expected {wanted}"


EXACT_COUNT = "ExactCount"
ALL = "All"


@dataclass(frozen=True, slots=True)
class Version:
    """A semantic version attribute value (``version: 1.2.3``), compared by its numbers."""

    text: str

    def key(self) -> tuple[tuple[int, int, int], tuple[int, str]]:
        """Sort key: major, minor, patch, then a release before any pre-release of it."""
        core, _, pre = self.text.split("+", 1)[0].partition("-")
        parts = [int(p) for p in core.split(".")]
        while len(parts) < 3:
            parts.append(0)
        return (parts[0], parts[1], parts[2]), (0, pre) if pre else (1, "")


AttributeValue = bool | int | str | Version


def qualified(name: str, driver: str) -> str:
    """``name`` with its domain: a name without one is in the driver's domain."""
    return name if "/" in name else f"{driver}/{name}"


@dataclass(frozen=True, slots=True)
class DeviceTaint:
    """A taint a driver put on one device (``NoSchedule``, ``NoExecute``, or ``None``: only told)."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class DeviceTaintRule:
    """A DeviceTaintRule: its taint, on every published device its selector matches (a field not
    set matches any value; ``selects`` False: the rule has no selector and matches nothing)."""

    name: str
    taint: DeviceTaint
    selects: bool = True
    driver: str | None = None
    pool: str | None = None
    device: str | None = None

    def matches(self, driver: str, pool: str, device: str) -> bool:
        return (
            self.selects
            and self.driver in (None, driver)
            and self.pool in (None, pool)
            and self.device in (None, device)
        )


def with_taint_rules(
    slices: Sequence[ResourceSlice], rules: Sequence[DeviceTaintRule]
) -> tuple[ResourceSlice, ...]:
    """``slices`` with each rule's taint added to the devices it matches, as if their driver
    published it."""
    if not rules:
        return tuple(slices)
    out = []
    for s in slices:
        devices = tuple(
            replace(d, taints=(*d.taints, *added))
            if (added := tuple(r.taint for r in rules if r.matches(s.driver, s.pool, d.name)))
            else d
            for d in s.devices
        )
        out.append(s if devices == s.devices else replace(s, devices=devices))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class DeviceToleration:
    """A request's toleration of device taints (the core/v1 matching rules)."""

    key: str
    operator: str  # Equal | Exists
    value: str
    effect: str  # "" tolerates every effect

    def tolerates(self, taint: DeviceTaint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.key and self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True, slots=True)
class CapacityPolicy:
    """A capacity's ``requestPolicy``: the amounts a request may consume, as ``valid_values`` (ascending)
    or a range (``minimum``, optional ``maximum`` and ``step``); neither: any amount."""

    valid_values: tuple[Fraction, ...] = ()
    minimum: Fraction | None = None
    maximum: Fraction | None = None
    step: Fraction | None = None

    def round(self, amount: Fraction) -> Fraction | None:
        """What a request for ``amount`` consumes, rounded up as the scheduler rounds it; ``None``
        when the policy allows no such amount (the device cannot be allocated for it)."""
        if self.valid_values:
            return next((v for v in self.valid_values if v >= amount), None)
        if self.minimum is None:
            return amount
        value = max(amount, self.minimum)
        if self.step:
            steps = -(-(value - self.minimum) // self.step)  # ceiling
            value = self.minimum + steps * self.step
        if self.maximum is not None and value > self.maximum:
            return None
        return value


@dataclass(frozen=True, slots=True)
class Device:
    """One device of a ResourceSlice: attributes and capacity by qualified name, the counters it
    consumes (counter set -> counter -> amount), whether several allocations may share it, its
    taints and, with per-device node selection, where it is reachable."""

    name: str
    attributes: Mapping[str, AttributeValue] = field(default_factory=lambda: MappingProxyType({}))
    capacity: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    # requestPolicy.default per capacity: what a request without an entry for it consumes.
    capacity_default: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    # requestPolicy.validValues / validRange per capacity: how a request's amount is rounded up.
    capacity_policy: Mapping[str, CapacityPolicy] = field(default_factory=lambda: MappingProxyType({}))
    consumes: Mapping[str, Mapping[str, Fraction]] = field(default_factory=lambda: MappingProxyType({}))
    allow_multiple: bool = False
    taints: tuple[DeviceTaint, ...] = ()
    node_name: str | None = None
    node_terms: tuple[NodeSelectorTerm, ...] | None = None
    all_nodes: bool = False


@dataclass(frozen=True, slots=True)
class ResourceSlice:
    """A ResourceSlice: one driver's devices of one pool (generation, slice count), the node(s)
    they are reachable from, and the pool's shared counters (counter set -> counter -> value)."""

    name: str
    driver: str
    pool: str
    generation: int
    slice_count: int
    devices: tuple[Device, ...] = ()
    node_name: str | None = None
    node_terms: tuple[NodeSelectorTerm, ...] | None = None
    all_nodes: bool = False
    per_device_nodes: bool = False
    shared_counters: Mapping[str, Mapping[str, Fraction]] = field(
        default_factory=lambda: MappingProxyType({})
    )


@dataclass(frozen=True, slots=True)
class DeviceClass:
    """A DeviceClass: its CEL selectors, the drivers its config is for, its extended resource."""

    name: str
    selectors: tuple[str, ...] = ()
    config_drivers: tuple[str, ...] = ()
    extended_resource_name: str | None = None


@dataclass(frozen=True, slots=True)
class ExactRequest:
    """One way to satisfy a request: a class, selectors, a count (or all), capacity, tolerations.

    ``name`` is the request's name, or ``request/subrequest`` for a ``firstAvailable`` entry."""

    name: str
    device_class: str
    selectors: tuple[str, ...] = ()
    mode: str = EXACT_COUNT
    count: int = 1
    capacity: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}))
    tolerations: tuple[DeviceToleration, ...] = ()


@dataclass(frozen=True, slots=True)
class DeviceRequest:
    """A claim's request: ``alternatives`` holds ``exactly`` alone, or the ``firstAvailable``
    entries in the order they are tried."""

    name: str
    alternatives: tuple[ExactRequest, ...]


@dataclass(frozen=True, slots=True)
class DeviceConstraint:
    """``matchAttribute`` or ``distinctAttribute`` (qualified) over ``requests`` (empty: all)."""

    requests: tuple[str, ...]
    match_attribute: str | None = None
    distinct_attribute: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimSpec:
    """``spec.devices`` of a ResourceClaim (or a template's claim)."""

    requests: tuple[DeviceRequest, ...] = ()
    constraints: tuple[DeviceConstraint, ...] = ()


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One device of an allocation: ``status.allocation.devices.results[]``. Also what the
    plan reports for a pod's claim (the output contract's ``request/driver/pool/device``)."""

    request: str
    driver: str
    pool: str
    device: str
    # Consumed capacity when the device allows multiple allocations.
    consumed: Mapping[str, Fraction] = field(default_factory=lambda: MappingProxyType({}), compare=False)

    def as_dict(self) -> dict[str, str]:
        return {"request": self.request, "driver": self.driver, "pool": self.pool, "device": self.device}


@dataclass(frozen=True, slots=True)
class ResourceClaim:
    """A ResourceClaim: its spec, its allocation if any, and the consumers it is reserved for."""

    namespace: str
    name: str
    spec: ClaimSpec
    allocation: tuple[AllocatedDevice, ...] | None = None
    reserved_for: tuple[str, ...] = ()  # names of the consuming pods

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ResourceClaimTemplate:
    """A ResourceClaimTemplate: the claim spec each pod gets a claim of its own from."""

    namespace: str
    name: str
    spec: ClaimSpec

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodClaim:
    """One entry of ``pod.spec.resourceClaims``: a shared claim by name, or a template."""

    name: str
    claim_name: str | None = None
    template_name: str | None = None


@dataclass(frozen=True, slots=True)
class DraObjects:
    """Every DRA object of a cluster state. ``slices`` holds every slice read; only those of a
    pool's newest generation count (:meth:`current_slices`)."""

    classes: Mapping[str, DeviceClass] = field(default_factory=lambda: MappingProxyType({}))
    slices: tuple[ResourceSlice, ...] = ()
    claims: Mapping[str, ResourceClaim] = field(default_factory=lambda: MappingProxyType({}))
    templates: Mapping[str, ResourceClaimTemplate] = field(default_factory=lambda: MappingProxyType({}))

    def __bool__(self) -> bool:
        return bool(self.classes or self.slices or self.claims or self.templates)

    def current_slices(self) -> list[ResourceSlice]:
        """The slices of each pool's newest generation, in input order."""
        newest: dict[tuple[str, str], int] = {}
        for s in self.slices:
            key = (s.driver, s.pool)
            newest[key] = max(newest.get(key, s.generation), s.generation)
        return [s for s in self.slices if s.generation == newest[(s.driver, s.pool)]]


def parse_pod_claims(spec: Mapping[str, Any], path: str) -> tuple[PodClaim, ...]:
    """``spec.resourceClaims`` of a pod spec, checked against the containers' ``resources.claims``."""
    out: list[PodClaim] = []
    cpath = f.join(path, "resourceClaims")
    names: set[str] = set()
    for i, raw in enumerate(f.get_list(spec, "resourceClaims", path)):
        here = f.join(cpath, i)
        item = f.as_map(raw, here)
        name = f.req_str(item, "name", here)
        if name in names:
            raise InputError(f"duplicate pod claim name {name!r}", field=f.join(here, "name"))
        names.add(name)
        claim = f.get_str(item, "resourceClaimName", here)
        template = f.get_str(item, "resourceClaimTemplateName", here)
        if (claim is None) == (template is None):
            raise InputError(
                "exactly one of resourceClaimName and resourceClaimTemplateName must be set", field=here
            )
        out.append(PodClaim(name, claim, template))
    for kind in ("containers", "initContainers"):
        for i, raw in enumerate(f.get_list(spec, kind, path)):
            here = f.join(f.join(path, kind), i)
            container = f.as_map(raw, here)
            resources = f.get_map(container, "resources", here)
            rpath = f.join(here, "resources")
            for j, ref in enumerate(f.get_list(resources, "claims", rpath)):
                rhere = f.join(f.join(rpath, "claims"), j)
                ref_name = f.req_str(f.as_map(ref, rhere), "name", rhere)
                if ref_name not in names:
                    raise InputError(
                        f"claim {ref_name!r} is not in spec.resourceClaims", field=f.join(rhere, "name")
                    )
    return tuple(out)


def parse_device_class_mappings(doc: Mapping[str, Any]) -> dict[str, str]:
    """Kueue Configuration ``resources.deviceClassMappings``: DeviceClass -> the resource its
    devices are charged as against ClusterQueue quota."""
    resources = f.get_map(doc, "resources", "")
    path = "resources.deviceClassMappings"
    out: dict[str, str] = {}
    for i, raw in enumerate(f.get_list(resources, "deviceClassMappings", "resources")):
        here = f.join(path, i)
        mapping = f.as_map(raw, here)
        name = f.req_str(mapping, "name", here)
        cpath = f.join(here, "deviceClassNames")
        classes = f.get_list(mapping, "deviceClassNames", here, required=True)
        if not classes:
            raise InputError("must name at least one DeviceClass", field=cpath)
        for j, item in enumerate(classes):
            cls = f.as_str(item, f.join(cpath, j))
            if cls in out:
                raise InputError(f"DeviceClass {cls!r} is mapped twice", field=f.join(cpath, j))
            out[cls] = name
    return out


COUNTER = "counter"
CAPACITY = "capacity"
# Kueue's feature gates for the mapping sources, and their defaults (Kueue 0.19).
SOURCE_GATES = {
    COUNTER: ("KueueDRAIntegrationPartitionableDevices", True),
    CAPACITY: ("KueueDRAIntegrationConsumableCapacity", False),
}


@dataclass(frozen=True, slots=True)
class QuotaSource:
    """One entry of a mapping's ``sources``: charge the ``counter`` the matching devices consume, or
    the ``capacity`` a request asks of them, instead of the device count. ``name`` is the counter's
    name, or the capacity's qualified name (``driver/name`` when given bare); ``selector`` the
    ``deviceSelector`` CEL expression that scopes the devices (``None``: every device of ``driver``)."""

    kind: str  # COUNTER | CAPACITY
    name: str
    driver: str
    selector: str | None = None


def parse_quota_sources(doc: Mapping[str, Any]) -> dict[str, tuple[QuotaSource, ...]]:
    """Kueue Configuration ``resources.deviceClassMappings[].sources``: DeviceClass -> how its
    devices are charged when not by count. A mapping's sources are all counters or all capacities;
    each kind needs its Kueue feature gate (``featureGates``, Kueue's defaults)."""
    resources = f.get_map(doc, "resources", "")
    gates = f.get_map(doc, "featureGates", "")
    out: dict[str, tuple[QuotaSource, ...]] = {}
    path = "resources.deviceClassMappings"
    for i, raw in enumerate(f.get_list(resources, "deviceClassMappings", "resources")):
        here = f.join(path, i)
        mapping = f.as_map(raw, here)
        sources = tuple(
            _quota_source(item, f.join(f.join(here, "sources"), j), gates)
            for j, item in enumerate(f.get_list(mapping, "sources", here))
        )
        if len({s.kind for s in sources}) > 1:
            raise InputError(
                "counter and capacity sources cannot be mixed in one mapping", field=f.join(here, "sources")
            )
        for item in f.get_list(mapping, "deviceClassNames", here):
            if sources and isinstance(item, str):
                out[item] = sources
    return out


def _quota_source(raw: object, here: str, gates: Mapping[str, Any]) -> QuotaSource:
    entry = f.as_map(raw, here)
    kinds = [k for k in (COUNTER, CAPACITY) if k in entry]
    if len(kinds) != 1:
        raise InputError("must set exactly one of counter and capacity", field=here)
    kind = kinds[0]
    gate, default = SOURCE_GATES[kind]
    if not f.as_bool(gates.get(gate, default), f"featureGates.{gate}"):
        raise InputError(f"{kind} sources need the feature gate {gate}", field=f.join(here, kind))
    spath = f.join(here, kind)
    source = f.get_map(entry, kind, here)
    name = f.req_str(source, "name", spath)
    driver = f.req_str(source, "driver", spath)
    selector = None
    if "deviceSelector" in source:
        dpath = f.join(spath, "deviceSelector")
        cel = f.get_map(f.get_map(source, "deviceSelector", spath), "cel", dpath, required=True)
        selector = f.req_str(cel, "expression", f.join(dpath, "cel"))
    if kind == CAPACITY:
        if name.count("/") > 1:
            raise InputError("a capacity name has at most one '/'", field=f.join(spath, "name"))
        name = qualified(name, driver)
    return QuotaSource(kind, name, driver, selector)


def check_names(items: Sequence[str], what: str, path: str) -> None:
    """Refuse a duplicate name among ``items``."""
    seen: set[str] = set()
    for i, name in enumerate(items):
        if name in seen:
            raise InputError(f"duplicate {what} {name!r}", field=f.join(path, i))
        seen.add(name)
