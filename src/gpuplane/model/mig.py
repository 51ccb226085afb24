"""NVIDIA MIG geometry: which instances can live together on one GPU.

A MIG-capable GPU (A100, H100, H200, B200 family) has 8 memory slots. A GPU instance
of a profile takes ``size`` consecutive slots starting at one of the profile's allowed
start slots. A set of instances is valid when every instance starts at an allowed
slot, no two overlap, and there is at most one media-extension (``+me``) instance;
the 7 compute slices then take care of themselves.

Profiles are named ``<N>g.<M>gb`` (``+me`` or ``.me`` for the media extension).
Whether a ``1g`` profile is the one-slot or the two-slot kind depends on the GPU's
memory: a profile with about an eighth of the GPU's memory takes one slot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

SLOTS = 8
_NAME = re.compile(r"^(\d+)g\.(\d+)gb(?:[+.](me))?$")

# (compute slices, memory slots) -> allowed start slots
_STARTS: dict[tuple[int, int], tuple[int, ...]] = {
    (1, 1): (0, 1, 2, 3, 4, 5, 6),
    (1, 2): (0, 2, 4, 6),
    (2, 2): (0, 2, 4),
    (3, 4): (0, 4),
    (4, 4): (0,),
    (7, 8): (0,),
}
_SIZE_FOR_COMPUTE = {2: 2, 3: 4, 4: 4, 7: 8}
# The one-slot 1g profile of each GPU family (when the GPU's memory is not known).
_SMALL_1G = {5, 10, 12, 18, 23, 34, 35}
_LARGE_1G = {20, 24, 36, 45, 47, 67, 70}


class MigError(ValueError):
    """A profile name or layout that is not valid MIG geometry."""


@dataclass(frozen=True, slots=True)
class MigProfile:
    name: str
    compute: int
    size: int
    memory_gb: int
    media: bool = False

    @property
    def starts(self) -> tuple[int, ...]:
        return _STARTS[(self.compute, self.size)]

    @property
    def resource(self) -> str:
        """The device plugin's mixed-strategy resource name."""
        return "nvidia.com/mig-" + self.name.replace("+", ".")


def parse_profile(name: str, gpu_memory_gb: float | None = None) -> MigProfile:
    """Parse ``3g.40gb`` (or ``1g.10gb+me``) into its geometry.

    ``gpu_memory_gb`` tells one-slot from two-slot ``1g`` profiles; without it the
    profile's memory is looked up among the known families.
    """
    match = _NAME.match(name.removeprefix("nvidia.com/mig-").removeprefix("mig-"))
    if match is None:
        raise MigError(f"not a MIG profile name: {name!r}")
    compute, memory, media = int(match.group(1)), int(match.group(2)), match.group(3) is not None
    canonical = f"{compute}g.{memory}gb" + ("+me" if media else "")
    if compute == 1:
        if media:
            size = 1
        elif gpu_memory_gb is not None:
            size = 1 if memory * SLOTS <= gpu_memory_gb * 1.3 else 2
        elif memory in _SMALL_1G:
            size = 1
        elif memory in _LARGE_1G:
            size = 2
        else:
            raise MigError(f"cannot tell the slot size of {name!r} without the GPU's memory")
    elif compute in _SIZE_FOR_COMPUTE:
        size = _SIZE_FOR_COMPUTE[compute]
    else:
        raise MigError(f"no MIG profile has {compute} compute slices: {name!r}")
    if media and compute != 1:
        raise MigError(f"only 1g profiles have a media extension: {name!r}")
    return MigProfile(canonical, compute, size, memory, media)


@dataclass(frozen=True, slots=True)
class Instance:
    profile: MigProfile
    start: int

    @property
    def slots(self) -> range:
        return range(self.start, self.start + self.profile.size)

    def __str__(self) -> str:
        return f"{self.profile.name}@{self.start}"


def layout_problem(instances: Iterable[Instance]) -> str | None:
    """Why a set of instances cannot coexist on one GPU, or ``None`` if it can."""
    used = [False] * SLOTS
    media = 0
    for inst in instances:
        if inst.start not in inst.profile.starts:
            allowed = ",".join(map(str, inst.profile.starts))
            return f"{inst} starts at slot {inst.start}; {inst.profile.name} may start at {allowed}"
        for slot in inst.slots:
            if slot >= SLOTS:
                return f"{inst} runs past slot {SLOTS - 1}"
            if used[slot]:
                return f"{inst} overlaps another instance at slot {slot}"
            used[slot] = True
        media += inst.profile.media
    if media > 1:
        return "more than one media-extension (+me) instance"
    return None


def is_valid_layout(instances: Iterable[Instance]) -> bool:
    return layout_problem(instances) is None


def free_starts(instances: Sequence[Instance], profile: MigProfile) -> list[int]:
    """Start slots where one more ``profile`` instance fits beside ``instances``."""
    return [s for s in profile.starts if is_valid_layout([*instances, Instance(profile, s)])]


def pack(profiles: Sequence[MigProfile], keep: Sequence[Instance] = ()) -> list[Instance] | None:
    """A valid layout holding ``keep`` plus one instance of each profile, or ``None``.

    Larger profiles are placed first, each at its highest free start slot, so small
    slots stay together at the low end; backtracking makes the search complete.
    """
    order = sorted(profiles, key=lambda p: (-p.size, -p.compute, p.name))

    def place(i: int, layout: list[Instance]) -> list[Instance] | None:
        if i == len(order):
            return layout
        for start in sorted(free_starts(layout, order[i]), reverse=True):
            found = place(i + 1, [*layout, Instance(order[i], start)])
            if found is not None:
                return found
        return None

    return place(0, list(keep))


def parse_layout(text: str, gpu_memory_gb: float | None = None) -> list[Instance]:
    """Parse ``3g.40gb@0,4g.40gb@4`` (``@start`` optional: packed in the given order)."""
    instances: list[Instance] = []
    unplaced: list[MigProfile] = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, start = part.partition("@")
        profile = parse_profile(name, gpu_memory_gb)
        if start:
            try:
                instances.append(Instance(profile, int(start)))
            except ValueError:
                raise MigError(f"bad start slot in {part!r}") from None
        else:
            unplaced.append(profile)
    problem = layout_problem(instances)
    if problem is not None:
        raise MigError(problem)
    if unplaced:
        packed = pack(unplaced, instances)
        if packed is None:
            raise MigError(f"no valid layout holds {text!r}")
        instances = packed
    return instances
