"""The warm buffer's placeholder pods without a cluster: what they ask for, and from which
configuration (the end-to-end run is test_warm_buffer_realkube.py)."""

from __future__ import annotations

from typing import Any, cast

from gpuplane.core.session import DeviceConfig, SchedulerConfig
from gpuplane.k8s.api import KubeApi
from gpuplane.k8s.controller import Controller, ControllerConfig
from gpuplane.k8s.warm import placeholder, placeholder_resource
from gpuplane.model.objects import WARM_NODE_GPUS_ANNOTATION
from manifests import resource_flavor


def _flavor(**annotations: str) -> dict[str, Any]:
    body = resource_flavor("h100").set("spec.nodeLabels", {"gpu": "h100"}).to_dict()
    body["metadata"]["annotations"] = annotations
    return body


def _asks(pod: dict[str, Any]) -> dict[str, str]:
    resources: dict[str, dict[str, str]] = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == resources["limits"]
    return resources["requests"]


def test_a_placeholder_asks_for_a_node_of_the_first_configured_accelerator() -> None:
    pod = placeholder(_flavor(), 0, "gpuplane-system")
    assert pod["metadata"]["name"] == "warm-h100-0"
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert _asks(pod) == {"nvidia.com/gpu": "8"}, "the default device configuration's first resource"
    amd = placeholder_resource(DeviceConfig(whole_resources=("amd.com/gpu",)))
    assert _asks(placeholder(_flavor(**{WARM_NODE_GPUS_ANNOTATION: "4"}), 1, "ns", amd)) == {
        "amd.com/gpu": "4"
    }
    assert placeholder_resource(DeviceConfig(whole_resources=())) == "nvidia.com/gpu"


def test_the_controller_gives_the_warm_buffer_its_scheduler_configurations_accelerator() -> None:
    api = cast(KubeApi, object())  # nothing is called before start()
    default = Controller(api, ControllerConfig(leader_election=False))
    devices = DeviceConfig(whole_resources=("amd.com/gpu", "nvidia.com/gpu"))
    configured = Controller(
        api, ControllerConfig(leader_election=False, scheduler=SchedulerConfig(devices=devices))
    )
    try:
        assert default.warm.resource == "nvidia.com/gpu"
        assert configured.warm.resource == "amd.com/gpu"
        assert configured.binder.devices == devices
    finally:
        default.close()
        configured.close()
