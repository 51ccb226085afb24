"""Nodes and their devices, as placement sees them.

Every node keeps what is placed on it, per device, so fractions add up per GPU and
never per node. A device is one physical accelerator in one of four sharing modes:

* ``exclusive``: whole-GPU requests take it entirely; fractional requests
  (``gpuplane.dev/gpu-fraction``, ``gpuplane.dev/gpu-memory``, KAI's ``gpu-fraction``)
  share it by milli-GPU and memory;
* ``mig``: a MIG layout (see :mod:`gpuplane.model.mig`) whose instances are taken one
  by one; with repartitioning on, a new layout may be chosen for a GPU whose affected
  slots hold no running instance;
* ``time-slicing`` / ``mps``: ``replicas`` slots per GPU.

Resource names come from :class:`DeviceConfig`; nothing assumes one vendor.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from gpuplane.model import labels as keys
from gpuplane.model import mig
from gpuplane.model.errors import InputError
from gpuplane.model.gpu_share import FRACTION_RESOURCE, fraction_milli
from gpuplane.model.objects import Node, PodTemplate, Taint
from gpuplane.model.quantity import parse_resource_quantity

MILLI = 1000
# More accelerators than any node has (16 GPUs, each cut in up to 7 MIG instances or shared by a few
# dozen time slices, stays far below): a count above it is a broken device plugin or a typo, and
# building that many devices would hang the scheduler. Such a node's accelerators are refused.
MAX_DEVICES_PER_NODE = 4096


@dataclass(frozen=True, slots=True)
class DeviceConfig:
    """Which resource names and labels describe accelerators."""

    whole_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
    shared_suffix: str = ".shared"
    mig_prefix: str = "nvidia.com/mig-"
    model_label: str = "nvidia.com/gpu.product"
    memory_label: str = "nvidia.com/gpu.memory"  # MiB per GPU
    count_label: str = "nvidia.com/gpu.count"
    replicas_label: str = "nvidia.com/gpu.replicas"
    sharing_label: str = "nvidia.com/gpu.sharing-strategy"
    mig_config_state_label: str = "nvidia.com/mig.config.state"
    present_label: str = "nvidia.com/gpu.present"  # GPU Feature Discovery: the node has accelerators
    layout_annotation: str = "gpuplane.dev/mig-layout"
    fraction_annotations: tuple[str, ...] = keys.GPU_FRACTION_ANNOTATIONS
    memory_annotations: tuple[str, ...] = keys.GPU_MEMORY_ANNOTATIONS
    mig_repartition: bool = False

    def labels_accelerators(self, labels: Mapping[str, str]) -> bool:
        """Whether a node's labels say it has accelerators (its model, count or presence label)."""
        return self.model_label in labels or self.count_label in labels or self.present_label in labels

    def is_device_resource(self, name: str) -> bool:
        return (
            name in self.whole_resources
            or name.startswith(self.mig_prefix)
            or any(name == r + self.shared_suffix for r in self.whole_resources)
        )


@dataclass(frozen=True, slots=True)
class PodNeeds:
    """What one pod asks of a node: plain resources plus device needs."""

    resources: Mapping[str, int]
    whole: int = 0
    whole_resource: str = ""
    fraction_milli: int = 0
    fraction_memory_mib: int = 0
    mig: Mapping[str, int] = field(default_factory=dict)
    shared: int = 0
    shared_resource: str = ""

    @property
    def gpu_milli(self) -> int:
        """GPU demand in milli-GPU (MIG instances count by compute slices of 7)."""
        slices = sum(mig.parse_profile(p).compute * n for p, n in self.mig.items())
        return self.whole * MILLI + self.fraction_milli + slices * MILLI // 7 + self.shared * MILLI

    @property
    def uses_devices(self) -> bool:
        return bool(self.whole or self.fraction_milli or self.fraction_memory_mib or self.mig or self.shared)


def pod_needs(template: PodTemplate, config: DeviceConfig) -> PodNeeds:
    """Split a pod's requests into plain resources and device needs."""
    plain: dict[str, int] = {}
    whole = shared = 0
    whole_resource = shared_resource = ""
    migs: dict[str, int] = {}
    for name, q in template.requests.items():
        if name in config.whole_resources:
            whole += q
            whole_resource = name
        elif name.startswith(config.mig_prefix):
            migs[mig.parse_profile(name).name] = q
        elif config.is_device_resource(name):
            shared += q
            shared_resource = name
        elif q:
            plain[name] = q
    fraction, memory = _fraction_and_memory(template, config)
    if (fraction or memory) and whole == 1:
        whole = 0  # a fractional pod may also ask for the whole-GPU resource; the fraction wins
    if memory and not fraction:
        fraction = 1  # a memory-only request still takes a share of one GPU
    plain["pods"] = plain.get("pods", 0) + 1
    return PodNeeds(plain, whole, whole_resource, fraction, memory, migs, shared, shared_resource)


def _fraction_and_memory(template: PodTemplate, config: DeviceConfig) -> tuple[int, int]:
    """The share of one GPU (thousandths) and the GPU memory (MiB) a pod's annotations ask for."""
    fraction = fraction_milli(template.annotations, config.fraction_annotations)
    memory = 0
    for key in config.memory_annotations:
        if key in template.annotations:
            memory = parse_resource_quantity("memory", template.annotations[key]) // (1024 * 1024)
            break
    return fraction, memory


def device_resource(requests: Iterable[str], config: DeviceConfig) -> str:
    """The accelerator resource a pod's quota requests name, whose flavor places it (the first by
    name): a device resource, or the charge of a GPU share (``gpuplane.dev/gpu-fraction``)."""
    return next(
        (name for name in sorted(requests) if name == FRACTION_RESOURCE or config.is_device_resource(name)),
        "",
    )


class NeedsMemo:
    """:func:`pod_needs` (and :func:`device_resource`) per template object, for one device
    configuration.

    A template is immutable (a frozen dataclass over read-only mappings), so what it needs never
    changes; the memo keeps the template itself, so no other object can take its identity while
    it is remembered. Past ``size`` templates it starts afresh. A template whose needs cannot be
    read raises ``ValueError`` each time, as :func:`pod_needs` does, and is not remembered. The
    :class:`PodNeeds` returned is shared: callers read it and never change it.
    """

    def __init__(self, config: DeviceConfig, size: int = 4096) -> None:
        self.config = config
        self.size = size
        self._known: dict[int, tuple[PodTemplate, PodNeeds]] = {}
        self._devices: dict[int, tuple[PodTemplate, str]] = {}

    def of(self, template: PodTemplate) -> PodNeeds:
        known = self._known.get(id(template))
        if known is not None and known[0] is template:
            return known[1]
        needs = pod_needs(template, self.config)
        if len(self._known) >= self.size:
            self._known.clear()
        self._known[id(template)] = (template, needs)
        return needs

    def device_resource(self, template: PodTemplate) -> str:
        known = self._devices.get(id(template))
        if known is not None and known[0] is template:
            return known[1]
        name = device_resource(template.quota_requests, self.config)
        if len(self._devices) >= self.size:
            self._devices.clear()
        self._devices[id(template)] = (template, name)
        return name


@dataclass(slots=True)
class MigSlot:
    instance: mig.Instance
    used_by: str | None = None


@dataclass(slots=True)
class Device:
    index: int
    model: str
    memory_mib: int
    sharing: str = "exclusive"  # exclusive | mig | time-slicing | mps
    replicas: int = 1
    whole_by: str | None = None
    milli_used: int = 0
    memory_used: int = 0
    slots_used: int = 0
    mig: list[MigSlot] = field(default_factory=list)
    shared_resource: str = ""  # the resource name pods use for this device's slots

    @property
    def free_whole(self) -> bool:
        return self.sharing == "exclusive" and self.whole_by is None and self.milli_used == 0

    @property
    def milli_free(self) -> int:
        if self.sharing != "exclusive" or self.whole_by is not None:
            return 0
        return MILLI - self.milli_used

    @property
    def memory_free(self) -> int:
        return self.memory_mib - self.memory_used if self.memory_mib else 1 << 40


@dataclass(frozen=True, slots=True)
class DeviceGrant:
    """What one pod got on one device; ``describe`` is what the plan prints."""

    device: int
    kind: str  # whole | fraction | mig | shared
    amount: int = 0  # milli for fractions, slots for shared
    memory_mib: int = 0
    instance: mig.Instance | None = None
    repartition: tuple[mig.Instance, ...] | None = None  # new layout chosen for the GPU

    def describe(self) -> str:
        if self.kind == "whole":
            return str(self.device)
        if self.kind == "fraction":
            text = f"{self.device}:{self.amount}m"
            return text + (f"/{self.memory_mib}Mi" if self.memory_mib else "")
        if self.kind == "mig":
            return f"{self.device}:{self.instance}"
        return f"{self.device}:{self.amount}x"


@dataclass(slots=True)
class NodeState:
    """One node: allocatable plain resources, what is used, and its devices."""

    node: Node
    allocatable: dict[str, int]
    used: dict[str, int] = field(default_factory=dict)
    devices: list[Device] = field(default_factory=list)
    mig_ready: bool = True
    # Free MIG instances a repartition dropped, to restore when the new one is given back.
    undo: dict[tuple[str, int, mig.Instance], list[MigSlot]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.name

    @property
    def labels(self) -> Mapping[str, str]:
        return self.node.labels

    @property
    def taints(self) -> tuple[Taint, ...]:
        return self.node.taints

    def free_whole(self) -> int:
        # Device.free_whole, inlined: read after every take and give-back.
        return sum(
            1 for d in self.devices if d.sharing == "exclusive" and d.whole_by is None and d.milli_used == 0
        )

    def free_gpu_milli(self) -> int:
        total = 0
        for d in self.devices:
            sharing = d.sharing
            if sharing == "exclusive":
                if d.whole_by is None:  # Device.milli_free, inlined
                    total += MILLI - d.milli_used
            elif sharing == "mig":
                total += MILLI * sum(s.instance.profile.compute for s in d.mig if s.used_by is None) // 7
            else:
                total += MILLI * (d.replicas - d.slots_used) // max(d.replicas, 1)
        return total

    def _exclusive(self) -> bool:
        return any(d.sharing == "exclusive" for d in self.devices)

    def _slots_named(self, resource: str) -> list[Device]:
        return [
            d for d in self.devices if d.sharing in ("time-slicing", "mps") and d.shared_resource == resource
        ]

    def advertises(self, needs: PodNeeds) -> bool:
        if needs.whole and not self._exclusive() and not self._slots_named(needs.whole_resource):
            return False
        if (needs.fraction_milli or needs.fraction_memory_mib) and not self._exclusive():
            return False
        if needs.shared and not self._slots_named(needs.shared_resource):
            return False
        if needs.mig and not any(d.sharing == "mig" for d in self.devices):
            return False
        return not any(name not in self.allocatable for name in needs.resources if name != "pods")

    # --- fitting --------------------------------------------------------------

    def plain_fits(self, needs: PodNeeds) -> bool:
        used, allocatable = self.used, self.allocatable
        for name, q in needs.resources.items():
            if used.get(name, 0) + q > allocatable.get(name, 0 if name != "pods" else 110):
                return False
        return True

    def fit(self, needs: PodNeeds, repartition: bool = False) -> list[DeviceGrant] | None:
        """Devices for one pod on this node (without taking them), or ``None``."""
        if not self.plain_fits(needs):
            return None
        grants = self._fit_whole(needs)
        if grants is None:
            return None
        if needs.fraction_milli or needs.fraction_memory_mib:
            share = self._fit_fraction(needs)
            if share is None:
                return None
            grants.append(share)
        if needs.shared:
            slots = self._fit_slots(needs.shared, needs.shared_resource)
            if slots is None:
                return None
            grants += slots
        if not needs.mig:
            return grants
        taken = self._fit_migs(needs.mig, repartition)
        return None if taken is None else grants + taken

    def _fit_migs(self, wanted: Mapping[str, int], repartition: bool) -> list[DeviceGrant] | None:
        """The MIG instances of one pod, largest profile first."""
        taken: list[DeviceGrant] = []
        order = list(wanted.items())
        if len(order) > 1:  # one profile (the common case) needs no sizes read
            order.sort(key=lambda kv: -mig.parse_profile(kv[0]).size)
        for profile_name, count in order:
            mig_grants = self._fit_mig(profile_name, count, repartition, taken)
            if mig_grants is None:
                return None
            taken += mig_grants
        return taken

    def _fit_whole(self, needs: PodNeeds) -> list[DeviceGrant] | None:
        """Whole GPUs: free exclusive devices, or slots of a time-sliced node that kept the plain
        resource name."""
        if not needs.whole:
            return []
        # Device.free_whole, inlined: read for every whole-GPU fit. A free one is exclusive, so the
        # node's devices are scanned again only when none is free.
        free = [
            d.index
            for d in self.devices
            if d.sharing == "exclusive" and d.whole_by is None and d.milli_used == 0
        ]
        if free or self._exclusive():
            if len(free) < needs.whole:
                return None
            return [DeviceGrant(i, "whole") for i in free[: needs.whole]]
        return self._fit_slots(needs.whole, needs.whole_resource)

    def _fit_fraction(self, needs: PodNeeds) -> DeviceGrant | None:
        """A share of one GPU: best fit, the most used device that still holds the fraction."""
        best: Device | None = None
        for d in self.devices:
            fits = d.milli_free >= needs.fraction_milli and d.memory_free >= needs.fraction_memory_mib
            if fits and (best is None or d.milli_free < best.milli_free):
                best = d
        if best is None:
            return None
        return DeviceGrant(best.index, "fraction", needs.fraction_milli, needs.fraction_memory_mib)

    def _fit_slots(self, count: int, resource: str) -> list[DeviceGrant] | None:
        left = count
        grants: list[DeviceGrant] = []
        for d in sorted(self._slots_named(resource), key=lambda d: (d.replicas - d.slots_used, d.index)):
            take = min(left, d.replicas - d.slots_used)
            if take > 0:
                grants.append(DeviceGrant(d.index, "shared", take))
                left -= take
            if left == 0:
                return grants
        return None if left else grants

    def _fit_mig(
        self, profile_name: str, count: int, repartition: bool, taken: Sequence[DeviceGrant]
    ) -> list[DeviceGrant] | None:
        """``count`` instances of a profile, beside the instances ``taken`` for the same pod."""
        if not self.mig_ready:
            return None
        grants: list[DeviceGrant] = []

        def claimed(device: int) -> list[mig.Instance]:
            return [g.instance for g in (*taken, *grants) if g.device == device and g.instance is not None]

        for d in self.devices:
            if d.sharing != "mig":
                continue
            for slot in d.mig:
                if len(grants) == count:
                    return grants
                if slot.used_by is not None or slot.instance.profile.name != profile_name:
                    continue
                busy = {s for i in claimed(d.index) for s in i.slots}
                if not busy & set(slot.instance.slots):
                    grants.append(DeviceGrant(d.index, "mig", instance=slot.instance))
        if len(grants) == count:
            return grants
        if not repartition:
            return None
        return self._repartition_mig(profile_name, count, grants, claimed)

    def _repartition_mig(
        self,
        profile_name: str,
        count: int,
        grants: list[DeviceGrant],
        claimed: Callable[[int], list[mig.Instance]],
    ) -> list[DeviceGrant] | None:
        """Choose new layouts for GPUs whose affected slots hold no running instance, until
        ``grants`` holds ``count`` instances (``claimed``: the instances already picked per GPU)."""
        while len(grants) < count:
            for d in self.devices:
                if d.sharing != "mig":
                    continue
                profile = mig.parse_profile(profile_name, d.memory_mib / 1024 if d.memory_mib else None)
                keep = [s.instance for s in d.mig if s.used_by is not None]
                keep += [i for i in claimed(d.index) if i not in keep]
                layout = mig.pack([profile], keep)
                if layout is None:
                    continue
                new = next(i for i in layout if i not in keep)
                grants.append(DeviceGrant(d.index, "mig", instance=new, repartition=tuple(layout)))
                break
            else:
                return None
        return grants

    # --- taking and giving back -------------------------------------------------

    def take(self, owner: str, needs: PodNeeds, grants: Sequence[DeviceGrant]) -> None:
        for name, q in needs.resources.items():
            self.used[name] = self.used.get(name, 0) + q
        for g in grants:
            d = self.devices[g.device]
            if g.kind == "whole":
                d.whole_by = owner
            elif g.kind == "fraction":
                d.milli_used += g.amount
                d.memory_used += g.memory_mib
            elif g.kind == "shared":
                d.slots_used += g.amount
            elif g.instance is not None:
                if not any(s.instance == g.instance for s in d.mig):
                    # Repartition: drop free instances that clash with the new one, and keep
                    # them to restore when the new instance is given back.
                    clash = set(g.instance.slots)
                    dropped = [s for s in d.mig if s.used_by is None and clash & set(s.instance.slots)]
                    d.mig = [s for s in d.mig if s not in dropped]
                    d.mig.append(MigSlot(g.instance))
                    self.undo[(owner, g.device, g.instance)] = dropped
                for s in d.mig:
                    if s.instance == g.instance and s.used_by is None:
                        s.used_by = owner
                        break

    def give_back(self, owner: str, needs: PodNeeds, grants: Sequence[DeviceGrant]) -> None:
        for name, q in needs.resources.items():
            self.used[name] = self.used.get(name, 0) - q
        for g in grants:
            d = self.devices[g.device]
            if g.kind == "whole" and d.whole_by == owner:
                d.whole_by = None
            elif g.kind == "fraction":
                d.milli_used -= g.amount
                d.memory_used -= g.memory_mib
            elif g.kind == "shared":
                d.slots_used -= g.amount
            elif g.instance is not None:
                for s in d.mig:
                    if s.instance == g.instance and s.used_by == owner:
                        s.used_by = None
                        break
                dropped = self.undo.pop((owner, g.device, g.instance), None)
                if dropped is not None:
                    # Restore the replaced instances that still fit beside what others hold now.
                    d.mig = [s for s in d.mig if s.instance != g.instance]
                    for s in dropped:
                        if mig.is_valid_layout([*(x.instance for x in d.mig), s.instance]):
                            d.mig.append(MigSlot(s.instance))
                    d.mig.sort(key=lambda s: s.instance.start)


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    value = labels.get(key)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        return None


def _check_device_counts(node: Node, config: DeviceConfig) -> None:
    """Refuse a node that advertises more devices than any node has (:data:`MAX_DEVICES_PER_NODE`),
    naming the resource, before anything is built for it."""
    for res, count in sorted(node.allocatable.items()):
        if count > MAX_DEVICES_PER_NODE and config.is_device_resource(res):
            raise InputError(
                f"{count} devices of {res} on one node, more than the {MAX_DEVICES_PER_NODE} gpuplane "
                "accepts: its accelerators are not schedulable (a broken device plugin?)",
                obj=f"Node/{node.name}",
                field=f"status.allocatable[{res}]",
            )


def node_state(node: Node, config: DeviceConfig) -> NodeState:
    """Build a node's device inventory from allocatable, GFD labels and annotations (raises
    :class:`InputError` for a node that advertises more devices than any node has)."""
    _check_device_counts(node, config)
    labels = node.labels
    model = labels.get(config.model_label, "")
    memory = _int_label(labels, config.memory_label) or 0
    plain = {k: v for k, v in node.allocatable.items() if not config.is_device_resource(k)}
    devices: list[Device] = []
    replicas = max(1, _int_label(labels, config.replicas_label) or 1)
    strategy = labels.get(config.sharing_label, "none")
    for res in config.whole_resources:
        count = node.allocatable.get(res, 0)
        shared_count = node.allocatable.get(res + config.shared_suffix, 0)
        if shared_count or (count and replicas > 1 and strategy in ("time-slicing", "mps")):
            slots = shared_count or count
            mode = strategy if strategy in ("time-slicing", "mps") else "time-slicing"
            name = res + config.shared_suffix if shared_count else res
            for _ in range(max(1, slots // replicas)):
                devices.append(Device(len(devices), model, memory, mode, replicas, shared_resource=name))
            if not shared_count:
                continue
        for _ in range(count):
            devices.append(Device(len(devices), model, memory))
    mig_counts = {
        k.removeprefix(config.mig_prefix): v
        for k, v in node.allocatable.items()
        if k.startswith(config.mig_prefix) and v
    }
    if mig_counts:
        gpu_gb = memory / 1024 if memory else None
        try:
            layouts = _mig_layouts(node, config, mig_counts, gpu_gb)
        except mig.MigError as err:
            where = (
                f"metadata.annotations[{config.layout_annotation}]"
                if config.layout_annotation in node.annotations
                else "status.allocatable"
            )
            raise InputError(f"invalid MIG layout: {err}", obj=f"Node/{node.name}", field=where) from None
        for layout in layouts:
            devices.append(Device(len(devices), model, memory, "mig", mig=[MigSlot(inst) for inst in layout]))
        total = _int_label(labels, config.count_label)
        if config.mig_repartition and total is not None:
            while len(devices) < total:
                devices.append(Device(len(devices), model, memory, "mig"))
    ready = labels.get(config.mig_config_state_label, "success") == "success"
    return NodeState(node=node, allocatable=plain, devices=devices, mig_ready=ready)


def _mig_layouts(
    node: Node, config: DeviceConfig, counts: Mapping[str, int], gpu_gb: float | None
) -> list[list[mig.Instance]]:
    """Per-GPU layouts: from the layout annotation, else packed from the advertised counts."""
    text = node.annotations.get(config.layout_annotation)
    if text:
        given = []
        for part in text.split(";"):
            _, _, spec = part.strip().rpartition("=")
            given.append(mig.parse_layout(spec, gpu_gb))
        return given
    remaining = [mig.parse_profile(name, gpu_gb) for name, n in sorted(counts.items()) for _ in range(n)]
    remaining.sort(key=lambda p: (-p.size, p.name))
    layouts: list[list[mig.Instance]] = []
    for profile in remaining:
        for layout in layouts:
            packed = mig.pack([profile], layout)
            if packed is not None:
                layout[:] = packed
                break
        else:
            packed = mig.pack([profile])
            if packed is None:
                raise mig.MigError(f"profile {profile.name} does not fit an empty GPU")
            layouts.append(packed)
    return layouts


def recorded_grants(state: NodeState, text: str) -> list[DeviceGrant] | None:
    """The grants a devices annotation records (``DeviceGrant.describe``, comma-separated), if
    every one of them is free on ``state`` now; ``None`` when one names a device this node lacks,
    a whole GPU or MIG instance already taken, or more of a GPU than is left of it."""
    grants = []
    for token in text.split(","):
        index_text, _, detail = token.partition(":")
        if not index_text.isdigit() or int(index_text) >= len(state.devices):
            return None
        device = state.devices[int(index_text)]
        grant = _recorded_grant(device, detail)
        if grant is None:
            return None
        grants.append(grant)
    return grants


def _recorded_grant(device: Device, detail: str) -> DeviceGrant | None:
    if not detail:
        return DeviceGrant(device.index, "whole") if device.free_whole else None
    if detail.endswith("x") and detail[:-1].isdigit():
        slots = int(detail[:-1])
        left = device.replicas - device.slots_used
        return DeviceGrant(device.index, "shared", slots) if left >= slots else None
    if match := _FRACTION.fullmatch(detail):
        milli, memory = int(match[1]), int(match[2] or 0)
        if device.milli_free < milli or device.memory_free < memory:
            return None
        return DeviceGrant(device.index, "fraction", milli, memory)
    free = (s.instance for s in device.mig if s.used_by is None and str(s.instance) == detail)
    instance = next(free, None)
    return None if instance is None else DeviceGrant(device.index, "mig", instance=instance)


_FRACTION = re.compile(r"(\d+)m(?:/(\d+)Mi)?")
