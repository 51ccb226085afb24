"""The warm buffer: per flavor, N idle nodes kept ready by low-priority placeholder pods.

This is the cluster-overprovisioning pattern. A ResourceFlavor annotated
``gpuplane.dev/warm-nodes: "N"`` gets N placeholder pods (``warm-<flavor>-<i>``, in the
controller's namespace, label ``gpuplane.dev/warm-buffer: <flavor>``), each requesting one node's
worth of accelerators (``gpuplane.dev/warm-node-gpus``, default 8) with the flavor's node labels
and tolerations. They are scheduled by the default scheduler, so the cluster autoscaler or
Karpenter keeps N nodes of the flavor up for them.

Any real workload takes their place at once: the core does not count placeholders as using
their node, and before gpuplane binds a gang's pod to a node it deletes the placeholders there
(grace 0). The next pass makes the placeholder again; it is pending until the autoscaler brings
a new node, and the buffer is whole again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from gpuplane.core.session import DeviceConfig
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.model.objects import WARM_BUFFER_LABEL, WARM_NODE_GPUS_ANNOTATION, WARM_NODES_ANNOTATION

log = logging.getLogger(__name__)

PLACEHOLDER_IMAGE = "registry.k8s.io/pause:3.10"
# The accelerator a placeholder asks for: the first whole-device resource of the device
# configuration (the default one's unless the controller is given another).
DEFAULT_RESOURCE = DeviceConfig().whole_resources[0]
DEFAULT_NODE_GPUS = 8


def _count(annotations: dict[str, str], key: str, default: int) -> int:
    text = annotations.get(key, "")
    return int(text) if text.isdigit() else default


def placeholder_resource(devices: DeviceConfig) -> str:
    """The resource a placeholder requests under ``devices``: its first whole-device resource."""
    return devices.whole_resources[0] if devices.whole_resources else DEFAULT_RESOURCE


def placeholder(
    flavor: dict[str, Any], index: int, namespace: str, resource: str = DEFAULT_RESOURCE
) -> dict[str, Any]:
    """The ``index``-th placeholder pod of a flavor, asking for a node's worth of ``resource``."""
    name = flavor["metadata"]["name"]
    annotations = flavor["metadata"].get("annotations") or {}
    gpus = _count(annotations, WARM_NODE_GPUS_ANNOTATION, DEFAULT_NODE_GPUS)
    spec = flavor.get("spec") or {}
    amount = {resource: str(gpus)}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"warm-{name}-{index}"[:253],
            "namespace": namespace,
            "labels": {WARM_BUFFER_LABEL: name[:63]},
        },
        "spec": {
            "nodeSelector": dict(spec.get("nodeLabels") or {}),
            "tolerations": list(spec.get("tolerations") or []),
            "terminationGracePeriodSeconds": 0,
            "automountServiceAccountToken": False,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65535,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": "placeholder",
                    "image": PLACEHOLDER_IMAGE,
                    "resources": {"requests": amount, "limits": amount},
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                }
            ],
        },
    }


class WarmBuffer:
    """Keeps the placeholder pods of every flavor in line with its annotation (owns the number of
    placeholders wanted per flavor, :attr:`sizes`)."""

    def __init__(
        self,
        api: KubeApi,
        cache: Cache,
        namespace: str,
        event: Callable[[dict[str, Any], str, str, str], None],
        resource: str = DEFAULT_RESOURCE,
    ) -> None:
        self.api = api
        self.cache = cache
        self.namespace = namespace
        self.event = event
        self.resource = resource  # the accelerator each placeholder requests
        self.sizes: dict[str, int] = {}  # flavor -> placeholders wanted (for metrics and why)
        # The keys of the cached placeholder pods, when the caller keeps them (from the cache's
        # changes); else every cached pod is looked at.
        self.keys: Callable[[], Iterable[str]] | None = None

    def placeholders(self) -> list[dict[str, Any]]:
        if self.keys is None:
            pods = self.cache.items("Pod")
        else:
            pods = [p for key in sorted(self.keys()) if (p := self.cache.get("Pod", key)) is not None]
        return [
            p
            for p in pods
            if WARM_BUFFER_LABEL in (p["metadata"].get("labels") or {})
            and not p["metadata"].get("deletionTimestamp")
        ]

    def reconcile(self) -> None:
        wanted: dict[str, dict[str, Any]] = {}
        self.sizes = {}
        for flavor in self.cache.items("ResourceFlavor"):
            n = _count(flavor["metadata"].get("annotations") or {}, WARM_NODES_ANNOTATION, 0)
            if n:
                self.sizes[flavor["metadata"]["name"]] = n
            for i in range(n):
                pod = placeholder(flavor, i, self.namespace, self.resource)
                wanted[pod["metadata"]["name"]] = pod
        have = {
            p["metadata"]["name"]: p
            for p in self.placeholders()
            if p["metadata"]["namespace"] == self.namespace
        }
        for name, pod in wanted.items():
            if name in have:
                continue
            try:
                self.cache.upsert("Pod", self.api.create(k8s.PODS, pod, self.namespace))
            except ApiError as err:
                if not err.conflict:
                    log.warning("cannot create warm-buffer placeholder %s: %s", name, err)
        self._delete(p for name, p in have.items() if name not in wanted)

    def clear(self, nodes: Iterable[str]) -> None:
        """Make room: delete the placeholders bound to ``nodes`` (a real pod goes there next)."""
        targets = set(nodes)
        self._delete(p for p in self.placeholders() if (p.get("spec") or {}).get("nodeName") in targets)

    def _delete(self, pods: Iterable[dict[str, Any]]) -> None:
        for pod in pods:
            meta = pod["metadata"]
            try:
                self.api.delete(k8s.PODS, meta["name"], meta["namespace"], gracePeriodSeconds=0)
            except ApiError as err:
                if not err.not_found:
                    log.warning("cannot delete warm-buffer placeholder %s: %s", object_key(pod), err)
                    continue
            self.cache.remove("Pod", pod)
