"""The order in which one cycle decides its entries when an entry passes over a flavor whose nodes
cannot hold it.

Kueue orders a cycle's entries by their nominated assignments (not borrowing first, then queue
time). Its topology-aware assignment only nominates a flavor whose nodes fit; gpuplane nominates
by quota and asks the nodes at the entry's turn, moving on to the next flavor when they cannot hold
the gang. The entry then takes the place in the order that the later flavor's assignment gives it.
"""

from __future__ import annotations

import pytest

from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.model.loader import load_state
from manifests import (
    Manifest,
    cluster_queue,
    documents,
    local_queue,
    namespace,
    node,
    resource_flavor,
    workload,
)

HOST = "kubernetes.io/hostname"


def gpu_node(name: str, pool: str, gpus: int) -> Manifest:
    return node(name).allocatable(cpu="64", memory="512Gi", gpu=gpus).label(HOST, name).label("pool", pool)


def cluster(*, small_a_node: bool) -> list[Manifest]:
    """Two flavors: ``a``, whose one node has 4 GPUs (or 8 with ``small_a_node=False``), and
    ``b``, whose one node has 8. Queue ``s`` has 16 GPUs of ``a`` and none of ``b``; ``v`` has
    none of either; ``lender`` lends 8 of ``b``. So ``s`` borrows nothing on ``a`` but borrows
    on ``b``, and ``v`` borrows on both."""
    objects: list[Manifest] = [
        resource_flavor("a").set("spec.nodeLabels", {"pool": "a"}),
        resource_flavor("b").set("spec.nodeLabels", {"pool": "b"}),
        gpu_node("a-1", "a", 4 if small_a_node else 8),
        gpu_node("b-1", "b", 8),
    ]
    nominal = {"s": (16, 0), "v": (0, 0), "lender": (0, 8)}
    for name, (on_a, on_b) in nominal.items():
        objects += [
            namespace(name),
            cluster_queue(name)
            .cohort("org")
            .flavor("a", cpu=64, memory="512Gi", gpu=on_a)
            .flavor("b", cpu=64, memory="512Gi", gpu=on_b),
            local_queue("q", name, name),
        ]
    return objects


def gang(ns: str, second: int) -> Manifest:
    """One pod of 8 GPUs, queued at ``second``."""
    return (
        workload("gang", ns)
        .queue("q")
        .created(f"2026-01-01T00:00:{second:02}Z")
        .podset(count=1, cpu="1", gpu=8)
    )


def admitted(*objects: Manifest, cycles: int | None = 1) -> dict[str, str]:
    state = load_state([("state.yaml", documents(*objects))])
    plan = schedule(state, config_from_kueue(state.configuration), 1_767_225_700.0, cycles=cycles)
    return {d.workload: d.pod_sets[0].flavors["nvidia.com/gpu"] for d in plan.admitted}


@pytest.mark.parametrize("cycles", [1, None])
def test_an_entry_that_passes_over_a_flavor_is_ordered_by_the_flavor_it_moves_to(cycles: int | None) -> None:
    # v queued first. On a, s borrows nothing and goes first; a's node cannot hold either gang,
    # so both move on to b, where both borrow: there v, queued first, comes first and takes the
    # only room.
    got = admitted(*cluster(small_a_node=True), gang("v", 1), gang("s", 2), cycles=cycles)
    assert got == {"v/gang": "b"}


def test_an_entry_that_fits_its_first_flavor_keeps_its_place() -> None:
    # a's node holds a gang: s, borrowing nothing there, goes first and takes a; v, borrowing,
    # finds a full and moves on to b.
    got = admitted(*cluster(small_a_node=False), gang("v", 1), gang("s", 2))
    assert got == {"s/gang": "a", "v/gang": "b"}


def test_on_the_later_flavor_the_entry_queued_first_goes_first() -> None:
    # With s queued first, it comes first on b too (both borrow there).
    got = admitted(*cluster(small_a_node=True), gang("s", 1), gang("v", 2))
    assert got == {"s/gang": "b"}
