"""Reserving a pod's planned devices on one node at bind time (``core.session.reserve_devices``).

The node's devices in use are rebuilt from what the driver observes (bound pods, their recorded
devices, the plans not bound yet); the answer is the planned devices while they are free, else
devices fitted afresh, or a typed refusal.
"""

from __future__ import annotations

from gpuplane.core.placement.reserve import Reservation
from gpuplane.core.session import (
    DeviceConfig,
    NodeUse,
    PodOnNode,
    Refusal,
    RefusalReason,
    reserve_devices,
)
from gpuplane.model.objects import Node, PodTemplate

CONFIG = DeviceConfig()
GPU = "nvidia.com/gpu"
NODE = Node("n1", {"cpu": 64_000, "memory": 512 * 1024**3, "pods": 110, GPU: 4})


def gpus(count: int) -> PodTemplate:
    return PodTemplate(requests={"cpu": 1000, GPU: count})


def bound(key: str, devices: str | None, workload: str | None = None, *, ended: bool = False) -> PodOnNode:
    template = None if ended else gpus(len(devices.split(",")) if devices else 1)
    return PodOnNode(key, template, devices, workload)


def test_the_planned_devices_are_reserved_while_they_are_free() -> None:
    answer = reserve_devices(gpus(2), "2,3", NodeUse(NODE), CONFIG)
    assert isinstance(answer, Reservation)
    assert answer.devices == "2,3"
    assert [g.describe() for g in answer.grants] == ["2", "3"]
    assert not answer.replanned


def test_taken_planned_devices_are_fitted_again_and_say_so() -> None:
    use = NodeUse(NODE, (bound("ns/other", "2"),))
    answer = reserve_devices(gpus(2), "2,3", use, CONFIG)
    assert isinstance(answer, Reservation)
    assert (answer.devices, answer.replanned) == ("0,1", True)


def test_no_room_left_is_a_refusal() -> None:
    use = NodeUse(NODE, (bound("ns/a", "0,1"), bound("ns/b", "2")))
    assert reserve_devices(gpus(2), "2,3", use, CONFIG) == Refusal(RefusalReason.NO_ROOM, replanned=True)
    assert reserve_devices(gpus(2), None, use, CONFIG) == Refusal(RefusalReason.NO_ROOM, replanned=False)


def test_a_node_not_known_is_a_refusal() -> None:
    assert reserve_devices(gpus(1), "0", None, CONFIG) == Refusal(RefusalReason.NODE_GONE)


def test_a_pod_without_devices_reserves_none() -> None:
    answer = reserve_devices(PodTemplate(requests={"cpu": 500}), None, NodeUse(NODE), CONFIG)
    assert answer == Reservation(None)


def test_a_pod_that_cannot_be_read_is_a_refusal() -> None:
    broken = PodTemplate(requests={"cpu": 500}, annotations={"gpuplane.dev/gpu-memory": "lots"})
    assert reserve_devices(broken, "0", NodeUse(NODE), CONFIG) == Refusal(RefusalReason.UNREADABLE)


def test_other_workloads_unbound_plans_hold_their_devices_and_the_own_plan_does_not() -> None:
    plans = {"ns/other": ["0,1"], "ns/mine": ["2,3"]}
    use = NodeUse(NODE, (), plans)
    answer = reserve_devices(gpus(2), "0,1", use, CONFIG, owner="ns/mine")
    assert isinstance(answer, Reservation)
    assert (answer.devices, answer.replanned) == ("2,3", True)
    # The gang's own slots still to bind on this node are held too.
    assert reserve_devices(gpus(2), "0,1", use, CONFIG, owner="ns/mine", reserved=["2,3"]) == Refusal(
        RefusalReason.NO_ROOM, replanned=True
    )


def test_a_bound_pod_fills_its_workloads_planned_slot() -> None:
    # ns/other planned 0,1 and 2; its pod bound on 2 fills that slot, so 0,1 stays held and 3 is free.
    use = NodeUse(NODE, (bound("ns/other-0", "2", "ns/other"),), {"ns/other": ["0,1", "2"]})
    answer = reserve_devices(gpus(1), "0", use, CONFIG)
    assert isinstance(answer, Reservation)
    assert (answer.devices, answer.replanned) == ("3", True)


def test_an_ended_pod_holds_no_devices_but_fills_its_slot() -> None:
    use = NodeUse(NODE, (bound("ns/other-0", "0,1", "ns/other", ended=True),), {"ns/other": ["0,1"]})
    answer = reserve_devices(gpus(2), "0,1", use, CONFIG)
    assert isinstance(answer, Reservation)
    assert (answer.devices, answer.replanned) == ("0,1", False)


def test_a_pod_bound_without_a_record_gets_a_best_guess() -> None:
    use = NodeUse(NODE, (PodOnNode("ns/foreign", gpus(3)),))
    answer = reserve_devices(gpus(1), "0", use, CONFIG)
    assert isinstance(answer, Reservation)
    assert (answer.devices, answer.replanned) == ("3", True)
