"""MIG geometry: profile names per GPU family, which instances coexist, packing, repartitioning.

The expected values come from NVIDIA's placement table (``nvidia-smi mig -lgipp``) as restated in
the domain fact sheet, not from the code under test: every GPU of the A100/H100/H200/B200 family has
8 memory slots, and a profile class has fixed start slots and a fixed size on that axis.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplane.core.placement.devices import DeviceConfig, DeviceGrant, NodeState, node_state, pod_needs
from gpuplane.model.mig import (
    Instance,
    MigError,
    MigProfile,
    free_starts,
    is_valid_layout,
    layout_problem,
    pack,
    parse_layout,
    parse_profile,
)
from gpuplane.model.objects import Node, PodTemplate

# The placement table, restated independently of the code: class -> (compute, size, start slots).
TABLE = {
    "1g-small": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g-small+me": (1, 1, (0, 1, 2, 3, 4, 5, 6)),
    "1g-large": (1, 2, (0, 2, 4, 6)),
    "2g": (2, 2, (0, 2, 4)),
    "3g": (3, 4, (0, 4)),
    "4g": (4, 4, (0,)),
    "7g": (7, 8, (0,)),
}
ALLOWED = {(c, s): starts for c, s, starts in TABLE.values()}


@dataclass(frozen=True)
class Family:
    """One GPU's MIG profile names, in TABLE order, and its memory (GB, as the node label gives it)."""

    name: str
    gpu_gb: float
    profiles: tuple[str, str, str, str, str, str, str]


FAMILIES = [
    Family(
        "A100-40GB",
        40960 / 1024,
        ("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
    ),
    Family(
        "A100-80GB",
        81920 / 1024,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    ),
    Family(
        "H100-80GB",
        81559 / 1024,
        ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
    ),
    Family(
        "H100-NVL",
        95830 / 1024,
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
    ),
    Family(
        "H100-96GB",
        97871 / 1024,
        ("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
    ),
    Family(
        "H200-141GB",
        143771 / 1024,
        ("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
    ),
    Family(
        "GH200-144GB",
        146944 / 1024,
        ("1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"),
    ),
    Family(
        "B200",
        183359 / 1024,
        ("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
    ),
    Family(
        "GB200",
        189471 / 1024,
        ("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
    ),
    Family(
        "B300",
        275040 / 1024,
        ("1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),
    ),
    Family(
        "GB300",
        284208 / 1024,
        ("1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"),
    ),
]

GPU_80 = 80.0


def layout_of(text: str, gpu_gb: float = GPU_80) -> list[Instance]:
    """``"4g.40gb@0,3g.40gb@4"`` as instances, without validating them (invalid layouts included)."""
    out = []
    for part in text.split(","):
        name, _, start = part.partition("@")
        out.append(Instance(parse_profile(name, gpu_gb), int(start)))
    return out


def oracle_valid(instances: Sequence[Instance]) -> bool:
    """The coexistence rule, straight from the table: allowed starts, no overlap, one ``+me`` at most."""
    used: set[int] = set()
    for inst in instances:
        p = inst.profile
        if inst.start not in ALLOWED[(p.compute, p.size)]:
            return False
        slots = set(range(inst.start, inst.start + p.size))
        if slots & used:
            return False
        used |= slots
    return sum(inst.profile.media for inst in instances) <= 1


# --- profile names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.name)
@pytest.mark.parametrize("klass", list(TABLE), ids=str)
def test_profile_geometry_per_family(family: Family, klass: str) -> None:
    name = family.profiles[list(TABLE).index(klass)]
    want_compute, want_size, want_starts = TABLE[klass]
    profile = parse_profile(name, family.gpu_gb)
    assert (profile.compute, profile.size, profile.media) == (want_compute, want_size, klass.endswith("+me"))
    assert profile.name == name
    assert free_starts([], profile) == list(want_starts)


@dataclass(frozen=True)
class ProfileCase:
    name: str
    text: str
    gpu_gb: float | None
    want_name: str
    want_size: int
    want_media: bool = False
    want_resource: str | None = None


PROFILE_CASES = [
    ProfileCase("1g.10gb-is-one-slot-on-80gb", "1g.10gb", 80, "1g.10gb", 1),
    ProfileCase("1g.10gb-is-two-slots-on-40gb", "1g.10gb", 40, "1g.10gb", 2),
    ProfileCase("1g.20gb-is-two-slots-on-80gb", "1g.20gb", 80, "1g.20gb", 2),
    ProfileCase("1g.5gb-is-one-slot-on-40gb", "1g.5gb", 40, "1g.5gb", 1),
    ProfileCase("plus-me", "1g.10gb+me", 80, "1g.10gb+me", 1, True, "nvidia.com/mig-1g.10gb.me"),
    ProfileCase("dot-me-is-the-resource-spelling", "1g.10gb.me", 80, "1g.10gb+me", 1, True),
    ProfileCase("me-on-40gb-stays-one-slot", "1g.5gb+me", 40, "1g.5gb+me", 1, True),
    ProfileCase(
        "resource-name-prefix", "nvidia.com/mig-3g.40gb", 80, "3g.40gb", 4, False, "nvidia.com/mig-3g.40gb"
    ),
    ProfileCase("resource-name-with-me", "nvidia.com/mig-1g.18gb.me", 141, "1g.18gb+me", 1, True),
    ProfileCase("short-prefix", "mig-7g.80gb", 80, "7g.80gb", 8),
    ProfileCase("known-small-without-memory", "1g.5gb", None, "1g.5gb", 1),
    ProfileCase("known-small-h200-without-memory", "1g.18gb", None, "1g.18gb", 1),
    ProfileCase("known-large-without-memory", "1g.20gb", None, "1g.20gb", 2),
    ProfileCase("known-large-b200-without-memory", "1g.45gb", None, "1g.45gb", 2),
    ProfileCase("2g-needs-no-memory", "2g.35gb", None, "2g.35gb", 2),
    ProfileCase("3g-needs-no-memory", "3g.71gb", None, "3g.71gb", 4),
    ProfileCase("4g-needs-no-memory", "4g.90gb", None, "4g.90gb", 4),
    ProfileCase("7g-needs-no-memory", "7g.141gb", None, "7g.141gb", 8),
]


@pytest.mark.parametrize("case", PROFILE_CASES, ids=lambda c: c.name)
def test_parse_profile(case: ProfileCase) -> None:
    profile = parse_profile(case.text, case.gpu_gb)
    assert (profile.name, profile.size, profile.media) == (case.want_name, case.want_size, case.want_media)
    if case.want_resource is not None:
        assert profile.resource == case.want_resource


@pytest.mark.parametrize(
    ("text", "gpu_gb"),
    [
        pytest.param("", None, id="empty"),
        pytest.param("3g", None, id="no-memory"),
        pytest.param("3g.40", None, id="no-unit"),
        pytest.param("3g.40gib", None, id="wrong-unit"),
        pytest.param("5g.50gb", 80, id="no-5g-profile"),
        pytest.param("6g.60gb", 80, id="no-6g-profile"),
        pytest.param("8g.80gb", 80, id="no-8g-profile"),
        pytest.param("0g.10gb", 80, id="zero-compute"),
        pytest.param("3g.40gb+me", 80, id="media-only-on-1g"),
        pytest.param("1g.10gb+gfx", 80, id="unknown-extension"),
        pytest.param("1g.7gb", None, id="unknown-1g-without-memory"),
        pytest.param("nvidia.com/gpu", None, id="whole-gpu-resource"),
        pytest.param("nvidia.com/mig-", None, id="empty-profile"),
        pytest.param("3g.40gb@0", 80, id="placement-is-not-a-name"),
    ],
)
def test_bad_profile_names_raise(text: str, gpu_gb: float | None) -> None:
    with pytest.raises(MigError):
        parse_profile(text, gpu_gb)


# --- which instances coexist -------------------------------------------------------------------------


@dataclass(frozen=True)
class LayoutCase:
    name: str
    layout: str
    want_valid: bool
    gpu_gb: float = GPU_80
    want_problem: str = ""


LAYOUT_CASES = [
    LayoutCase("empty", "", True),
    LayoutCase("4g@0+3g@4", "4g.40gb@0,3g.40gb@4", True),
    LayoutCase("2g@0+2g@2+3g@4", "2g.20gb@0,2g.20gb@2,3g.40gb@4", True),
    LayoutCase("3g@0+3g@4", "3g.40gb@0,3g.40gb@4", True),
    LayoutCase("4x1g-large", "1g.20gb@0,1g.20gb@2,1g.20gb@4,1g.20gb@6", True),
    LayoutCase("7x1g-small", ",".join(f"1g.10gb@{s}" for s in range(7)), True),
    LayoutCase("all-balanced-80gb", "1g.10gb@0,1g.10gb@1,2g.20gb@2,3g.40gb@4", True),
    LayoutCase("all-balanced-40gb", "1g.5gb@0,1g.5gb@1,2g.10gb@2,3g.20gb@4", True, gpu_gb=40),
    LayoutCase("4g@0+2g@4+1g@6", "4g.40gb@0,2g.20gb@4,1g.10gb@6", True),
    LayoutCase("4g@0+2g@4+1g-large@6", "4g.40gb@0,2g.20gb@4,1g.20gb@6", True),
    LayoutCase("7g-alone", "7g.80gb@0", True),
    LayoutCase(
        "one-me-among-small", "1g.10gb+me@3," + ",".join(f"1g.10gb@{s}" for s in (0, 1, 2, 4, 5, 6)), True
    ),
    LayoutCase("2x4g", "4g.40gb@0,4g.40gb@4", False, want_problem="may start at 0"),
    LayoutCase("2x4g-same-start", "4g.40gb@0,4g.40gb@0", False, want_problem="overlaps"),
    LayoutCase("3g@0+4g@0", "3g.40gb@0,4g.40gb@0", False, want_problem="overlaps"),
    LayoutCase("1g-small-at-slot-7", "1g.10gb@7", False, want_problem="starts at slot 7"),
    LayoutCase("8x1g-small", ",".join(f"1g.10gb@{s}" for s in range(8)), False),
    LayoutCase("two-me", "1g.10gb+me@0,1g.10gb+me@1", False, want_problem="+me"),
    LayoutCase("3g-at-slot-2", "3g.40gb@2", False, want_problem="may start at 0,4"),
    LayoutCase("2g-at-slot-6", "2g.20gb@6", False, want_problem="may start at 0,2,4"),
    LayoutCase("1g-large-at-odd-slot", "1g.20gb@1", False),
    LayoutCase("7g-with-anything", "7g.80gb@0,1g.10gb@6", False, want_problem="overlaps"),
    LayoutCase("2g-over-1g", "1g.10gb@3,2g.20gb@2", False, want_problem="overlaps"),
    LayoutCase("negative-start", "1g.10gb@-1", False),
]


@pytest.mark.parametrize("case", LAYOUT_CASES, ids=lambda c: c.name)
def test_layout_validity(case: LayoutCase) -> None:
    instances = layout_of(case.layout, case.gpu_gb) if case.layout else []
    problem = layout_problem(instances)
    assert is_valid_layout(instances) is case.want_valid
    assert (problem is None) is case.want_valid, problem
    assert oracle_valid(instances) is case.want_valid  # the test's own table agrees with the case
    assert case.want_problem in (problem or "")


@pytest.mark.parametrize("case", [c for c in LAYOUT_CASES if c.layout], ids=lambda c: c.name)
def test_parse_layout_accepts_valid_and_refuses_invalid(case: LayoutCase) -> None:
    if case.want_valid:
        assert parse_layout(case.layout, case.gpu_gb) == layout_of(case.layout, case.gpu_gb)
    else:
        with pytest.raises(MigError):
            parse_layout(case.layout, case.gpu_gb)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        pytest.param("3g.40gb,4g.40gb", "4g.40gb@0,3g.40gb@4", id="packed-largest-first"),
        pytest.param("3g.40gb@0,2g.20gb", "3g.40gb@0,2g.20gb@4", id="unplaced-beside-placed"),
        pytest.param("7g.80gb", "7g.80gb@0", id="whole-gpu-instance"),
        pytest.param(" 3g.40gb@4 , ", "3g.40gb@4", id="blanks-and-empty-parts"),
    ],
)
def test_parse_layout_packs_unplaced_profiles(text: str, want: str) -> None:
    assert sorted(map(str, parse_layout(text, GPU_80))) == sorted(map(str, layout_of(want)))


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("4g.40gb,4g.40gb", id="two-4g-cannot-pack"),
        pytest.param("3g.40gb@0,3g.40gb@4,1g.10gb", id="full-gpu-has-no-room"),
        pytest.param("3g.40gb@x", id="start-not-a-number"),
        pytest.param("3g.40gb@0,4g.40gb@4", id="4g-only-starts-at-0"),
        pytest.param("garbage", id="not-a-profile"),
    ],
)
def test_parse_layout_errors(text: str) -> None:
    with pytest.raises(MigError):
        parse_layout(text, GPU_80)


# --- free start slots ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FreeCase:
    name: str
    layout: str
    profile: str
    want: list[int]


FREE_CASES = [
    FreeCase("empty-1g-small", "", "1g.10gb", [0, 1, 2, 3, 4, 5, 6]),
    FreeCase("empty-me", "", "1g.10gb+me", [0, 1, 2, 3, 4, 5, 6]),
    FreeCase("empty-1g-large", "", "1g.20gb", [0, 2, 4, 6]),
    FreeCase("empty-2g", "", "2g.20gb", [0, 2, 4]),
    FreeCase("empty-3g", "", "3g.40gb", [0, 4]),
    FreeCase("empty-4g", "", "4g.40gb", [0]),
    FreeCase("empty-7g", "", "7g.80gb", [0]),
    # One 3g.40gb drops 1g.10gb availability from 7 of 7 to 3 of 7 (slot 7 is never a 1g start).
    FreeCase("3g@0-leaves-three-1g", "3g.40gb@0", "1g.10gb", [4, 5, 6]),
    FreeCase("3g@4-leaves-four-1g", "3g.40gb@4", "1g.10gb", [0, 1, 2, 3]),
    FreeCase("3g@4-leaves-1g-large-low", "3g.40gb@4", "1g.20gb", [0, 2]),
    FreeCase("4g@0-leaves-3g@4", "4g.40gb@0", "3g.40gb", [4]),
    FreeCase("4g@0-leaves-no-4g", "4g.40gb@0", "4g.40gb", []),
    FreeCase("3g@4-leaves-4g@0", "3g.40gb@4", "4g.40gb", [0]),
    FreeCase("3g@0-leaves-no-4g", "3g.40gb@0", "4g.40gb", []),
    FreeCase("anything-blocks-7g", "1g.10gb@6", "7g.80gb", []),
    FreeCase("1g@0-blocks-2g@0", "1g.10gb@0", "2g.20gb", [2, 4]),
    FreeCase("1g@0-blocks-3g@0", "1g.10gb@0", "3g.40gb", [4]),
    FreeCase("1g@6-blocks-1g-large@6", "1g.10gb@6", "1g.20gb", [0, 2, 4]),
    FreeCase("second-me-never-fits", "1g.10gb+me@0", "1g.10gb+me", []),
    FreeCase("plain-1g-beside-me", "1g.10gb+me@0", "1g.10gb", [1, 2, 3, 4, 5, 6]),
    FreeCase("full-gpu", "3g.40gb@0,3g.40gb@4", "1g.10gb", []),
]


@pytest.mark.parametrize("case", FREE_CASES, ids=lambda c: c.name)
def test_free_starts(case: FreeCase) -> None:
    instances = layout_of(case.layout) if case.layout else []
    profile = parse_profile(case.profile, GPU_80)
    assert free_starts(instances, profile) == case.want
    want = [
        s
        for s in ALLOWED[(profile.compute, profile.size)]
        if oracle_valid([*instances, Instance(profile, s)])
    ]
    assert case.want == want


# --- packing ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PackCase:
    name: str
    profiles: list[str]
    keep: str
    want_fits: bool


PACK_CASES = [
    PackCase("nothing", [], "", True),
    PackCase("3g+4g", ["3g.40gb", "4g.40gb"], "", True),
    PackCase("2x4g", ["4g.40gb", "4g.40gb"], "", False),
    PackCase("7g+1g", ["7g.80gb", "1g.10gb"], "", False),
    PackCase("7x1g-small", ["1g.10gb"] * 7, "", True),
    PackCase("8x1g-small", ["1g.10gb"] * 8, "", False),
    PackCase("4x1g-large", ["1g.20gb"] * 4, "", True),
    PackCase("5x1g-large", ["1g.20gb"] * 5, "", False),
    PackCase("all-balanced", ["1g.10gb", "1g.10gb", "2g.20gb", "3g.40gb"], "", True),
    PackCase("4g+2g+1g", ["1g.10gb", "2g.20gb", "4g.40gb"], "", True),
    PackCase("3x2g+1g-large", ["2g.20gb", "2g.20gb", "2g.20gb", "1g.20gb"], "", True),
    PackCase("3x2g+3g", ["2g.20gb", "2g.20gb", "2g.20gb", "3g.40gb"], "", False),
    PackCase("two-me", ["1g.10gb+me", "1g.10gb+me"], "", False),
    PackCase("me-and-six-1g", ["1g.10gb+me", *["1g.10gb"] * 6], "", True),
    PackCase("4g-beside-3g@4", ["4g.40gb"], "3g.40gb@4", True),
    PackCase("4g-beside-3g@0", ["4g.40gb"], "3g.40gb@0", False),
    PackCase("3g-beside-1g@0", ["3g.40gb"], "1g.10gb@0", True),
    PackCase("two-3g-beside-1g@0", ["3g.40gb", "3g.40gb"], "1g.10gb@0", False),
    PackCase("1g-large-must-avoid-kept-1g@1", ["1g.20gb"] * 3, "1g.10gb@1", True),
    PackCase("1g-large-blocked-by-kept-1g@1-and-@3", ["1g.20gb"] * 3, "1g.10gb@1,1g.10gb@3", False),
]


@pytest.mark.parametrize("case", PACK_CASES, ids=lambda c: c.name)
def test_pack(case: PackCase) -> None:
    profiles = [parse_profile(p, GPU_80) for p in case.profiles]
    keep = layout_of(case.keep) if case.keep else []
    packed = pack(profiles, keep)
    assert (packed is not None) is case.want_fits
    if packed is not None:
        assert oracle_valid(packed)
        assert all(inst in packed for inst in keep)
        assert Counter(i.profile.name for i in packed) == Counter(
            [*case.profiles, *(i.profile.name for i in keep)]
        )


# --- properties of pack -------------------------------------------------------------------------------

PROFILES_80 = [parse_profile(name, GPU_80) for name in FAMILIES[1].profiles]
profiles_80 = st.lists(st.sampled_from(PROFILES_80), max_size=8)


def brute_force(profiles: Sequence[MigProfile], keep: Sequence[Instance]) -> list[Instance] | None:
    """Every start slot of every profile, in the given order, checked with the test's own table."""
    if sum(p.size for p in profiles) + sum(i.profile.size for i in keep) > 8:
        return None  # more memory slots than a GPU has: no layout at all

    def search(i: int, layout: list[Instance]) -> list[Instance] | None:
        if i == len(profiles):
            return layout
        for start in ALLOWED[(profiles[i].compute, profiles[i].size)]:
            candidate = [*layout, Instance(profiles[i], start)]
            if oracle_valid(candidate):
                found = search(i + 1, candidate)
                if found is not None:
                    return found
        return None

    return search(0, list(keep)) if oracle_valid(keep) else None


@st.composite
def kept_layouts(draw: st.DrawFn, min_size: int = 0) -> list[Instance]:
    """A valid layout found by the brute force, so that ``keep`` does not depend on ``pack``."""
    profiles = draw(st.lists(st.sampled_from(PROFILES_80), min_size=min_size, max_size=4))
    return brute_force(profiles, []) or brute_force(profiles[:1], []) or []


@settings(max_examples=300, deadline=None)
@given(profiles=profiles_80, keep=kept_layouts())
def test_pack_returns_valid_layouts_with_exactly_the_requested_profiles(
    profiles: list[MigProfile], keep: list[Instance]
) -> None:
    packed = pack(profiles, keep)
    if packed is None:
        return
    assert oracle_valid(packed)
    assert is_valid_layout(packed)
    assert Counter(packed) >= Counter(keep)  # kept instances stay where they are
    assert Counter(i.profile for i in packed) == Counter([*profiles, *(i.profile for i in keep)])


@settings(max_examples=300, deadline=None)
@given(profiles=st.lists(st.sampled_from(PROFILES_80), max_size=6), keep=kept_layouts())
def test_pack_is_complete(profiles: list[MigProfile], keep: list[Instance]) -> None:
    want = brute_force(profiles, keep)
    got = pack(profiles, keep)
    assert (got is not None) == (want is not None), (profiles, keep, want)


# --- repartitioning on a node ---------------------------------------------------------------------------

REPARTITION = DeviceConfig(mig_repartition=True)
MIB_80 = "81920"


def mig_node(layouts: Sequence[Sequence[Instance]], gpus: int) -> Node:
    """A mixed-strategy MIG node: the first GPUs carry ``layouts``, the rest have no instances yet."""
    counts = Counter(i.profile.resource for layout in layouts for i in layout)
    annotation = ";".join(f"{g}=" + ",".join(map(str, layout)) for g, layout in enumerate(layouts))
    return Node(
        name="m",
        allocatable={**counts, "pods": 110},
        labels={"nvidia.com/gpu.memory": MIB_80, "nvidia.com/gpu.count": str(gpus)},
        annotations={"gpuplane.dev/mig-layout": annotation},
    )


def mig_request(profiles: dict[str, int]) -> PodTemplate:
    return PodTemplate(requests={f"nvidia.com/mig-{p}": n for p, n in profiles.items()})


def held_instances_stay(state: NodeState, held: dict[str, list[DeviceGrant]]) -> None:
    for owner, grants in held.items():
        for g in grants:
            slots = [s for s in state.devices[g.device].mig if s.instance == g.instance]
            assert [s.used_by for s in slots] == [owner], (owner, str(g.instance))


def layouts_valid(state: NodeState) -> None:
    for d in state.devices:
        assert layout_problem(s.instance for s in d.mig) is None, [str(s.instance) for s in d.mig]


@st.composite
def mig_nodes(draw: st.DrawFn) -> Node:
    first = draw(kept_layouts(min_size=1))
    second = draw(kept_layouts())
    layouts = [first, second] if second else [first]
    return mig_node(layouts, gpus=len(layouts) + draw(st.integers(0, 1)))


operations = st.lists(
    st.one_of(
        st.tuples(st.just("place"), st.sampled_from(PROFILES_80), st.integers(1, 2)),
        st.tuples(st.just("release"), st.integers(0, 7), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=150, deadline=None)
@given(node=mig_nodes(), ops=operations)
def test_repartition_keeps_layouts_valid_and_never_moves_used_instances(
    node: Node, ops: list[tuple[str, object, int]]
) -> None:
    state = node_state(node, REPARTITION)
    held: dict[str, list[DeviceGrant]] = {}
    needs_of = {}
    for step, (op, arg, count) in enumerate(ops):
        if op == "place":
            assert isinstance(arg, MigProfile)
            needs = pod_needs(PodTemplate(requests={arg.resource: count}), REPARTITION)
            grants = state.fit(needs, repartition=True)
            if grants is None:
                continue
            assert len(grants) == count
            owner = f"pod-{step}"
            state.take(owner, needs, grants)
            held[owner], needs_of[owner] = list(grants), needs
            assert all(g.instance is not None and g.instance.profile.name == arg.name for g in grants)
        elif held:
            assert isinstance(arg, int)
            owner = sorted(held)[arg % len(held)]
            state.give_back(owner, needs_of.pop(owner), held.pop(owner))
        layouts_valid(state)
        held_instances_stay(state, held)


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(",".join(f"1g.10gb@{s}" for s in range(7)), id="free-1g-instances"),
        pytest.param("3g.40gb@4", id="static-3g-kept-free"),
    ],
)
def test_repartition_for_two_profiles_in_one_pod_keeps_the_layout_valid(layout: str) -> None:
    state = node_state(mig_node([layout_of(layout)], gpus=1), REPARTITION)
    needs = pod_needs(mig_request({"2g.20gb": 1, "3g.40gb": 1}), REPARTITION)
    grants = state.fit(needs, repartition=True)
    assert grants is not None  # 3g@0 + 2g@4 (or 3g@4 + 2g@0) is a valid answer
    state.take("pod", needs, grants)
    layouts_valid(state)


def test_repartition_reuses_a_free_static_instance_first() -> None:
    state = node_state(mig_node([layout_of("3g.40gb@0,3g.40gb@4")], gpus=2), REPARTITION)
    grants = state.fit(pod_needs(mig_request({"3g.40gb": 1}), REPARTITION), repartition=True)
    assert grants is not None
    assert [(g.device, str(g.instance), g.repartition) for g in grants] == [(0, "3g.40gb@0", None)]


def test_repartition_cuts_a_new_instance_from_an_empty_gpu() -> None:
    state = node_state(mig_node([layout_of("7g.80gb@0")], gpus=2), REPARTITION)
    assert [d.sharing for d in state.devices] == ["mig", "mig"]
    needs = pod_needs(mig_request({"7g.80gb": 1}), REPARTITION)
    state.take("first", needs, state.fit(needs) or [])
    grants = state.fit(pod_needs(mig_request({"3g.40gb": 1}), REPARTITION), repartition=True)
    assert grants is not None
    (grant,) = grants
    assert grant.device == 1
    assert grant.repartition is not None
    assert grant.instance in grant.repartition
    assert state.fit(pod_needs(mig_request({"3g.40gb": 1}), REPARTITION), repartition=False) is None
