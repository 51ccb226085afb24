"""Fluent builders for the Kubernetes and Kueue manifests that tests feed to the loader.

A builder holds one object as plain data and renders it as YAML or JSON text, so a test states only
what matters to it::

    cluster_queue("q").cohort("team").flavor("default", cpu="10", gpu=8)
    workload("w", "team-a").queue("lq").podset(count=4, gpu=8)

Keyword amounts are resource names; ``gpu`` stands for ``nvidia.com/gpu`` and ``gpu_fraction`` for
``gpuplane.dev/gpu-fraction``. ``set`` and ``drop`` take a dotted path such as
``spec.podSets[0].count`` and plant one defect in an otherwise valid object.
"""

from __future__ import annotations

import copy
import itertools
import json
import re
from collections.abc import Mapping
from typing import Any, Self

import yaml

KUEUE = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
QUEUE_NAME = "kueue.x-k8s.io/queue-name"
PRIORITY_CLASS = "kueue.x-k8s.io/priority-class"
MIN_PARALLELISM = "kueue.x-k8s.io/job-min-parallelism"

_SHORT_NAMES = {"gpu": GPU, "gpu_fraction": "gpuplane.dev/gpu-fraction"}
_PATH_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def resources(**amounts: object) -> dict[str, object]:
    """Keyword amounts keyed by resource name (``gpu`` -> ``nvidia.com/gpu``)."""
    return {_SHORT_NAMES.get(name, name): amount for name, amount in amounts.items()}


def _steps(path: str) -> list[str | int]:
    return [int(index) if index else key for key, index in _PATH_STEP.findall(path)]


class Manifest:
    """One Kubernetes object under construction; every method returns the builder."""

    def __init__(self, api_version: str, kind: str, name: str | None, namespace: str | None = None) -> None:
        metadata: dict[str, Any] = {}
        if name is not None:
            metadata["name"] = name
        if namespace is not None:
            metadata["namespace"] = namespace
        self.body: dict[str, Any] = {"apiVersion": api_version, "kind": kind, "metadata": metadata}

    def label(self, key: str, value: object) -> Self:
        self.body["metadata"].setdefault("labels", {})[key] = value
        return self

    def annotate(self, key: str, value: object) -> Self:
        self.body["metadata"].setdefault("annotations", {})[key] = value
        return self

    def set(self, path: str, value: object) -> Self:
        """Set the value at ``path``, creating the mappings and lists on the way."""
        steps = _steps(path)
        node: Any = self.body
        for step, following in itertools.pairwise(steps):
            if isinstance(step, int):
                node = node[step]
            else:
                node = node.setdefault(step, [] if isinstance(following, int) else {})
        last = steps[-1]
        if isinstance(last, int) and last == len(node):
            node.append(value)
        else:
            node[last] = value
        return self

    def drop(self, path: str) -> Self:
        """Remove the value at ``path``."""
        *parents, last = _steps(path)
        node: Any = self.body
        for step in parents:
            node = node[step]
        del node[last]
        return self

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)

    def yaml(self) -> str:
        return yaml.safe_dump(self.body, sort_keys=False)

    def json(self) -> str:
        return json.dumps(self.body)


def documents(*manifests: Manifest) -> str:
    """A multi-document YAML file."""
    return "---\n".join(m.yaml() for m in manifests)


def list_of(*manifests: Manifest) -> Manifest:
    """A ``kind: List`` holding the manifests."""
    return Manifest("v1", "List", None).drop("metadata").set("items", [m.to_dict() for m in manifests])


# ---------------------------------------------------------------------------
# Pod specs
# ---------------------------------------------------------------------------


def _container(
    name: str, requests: Mapping[str, object] | None, limits: Mapping[str, object] | None
) -> dict[str, Any]:
    res: dict[str, Any] = {}
    if requests:
        res["requests"] = dict(requests)
    if limits:
        res["limits"] = dict(limits)
    return {"name": name, "image": "busybox", "resources": res}


class PodSpec:
    """A pod spec: containers, init containers, overhead, tolerations and node constraints."""

    def __init__(self) -> None:
        self.body: dict[str, Any] = {"containers": []}

    def container(self, *, limits: Mapping[str, object] | None = None, **requests: object) -> Self:
        name = f"c{len(self.body['containers'])}"
        self.body["containers"].append(_container(name, resources(**requests), limits))
        return self

    def init_container(
        self, *, sidecar: bool = False, limits: Mapping[str, object] | None = None, **requests: object
    ) -> Self:
        inits = self.body.setdefault("initContainers", [])
        item = _container(f"init{len(inits)}", resources(**requests), limits)
        if sidecar:
            item["restartPolicy"] = "Always"
        inits.append(item)
        return self

    def overhead(self, **amounts: object) -> Self:
        self.body["overhead"] = resources(**amounts)
        return self

    def toleration(self, **fields: str) -> Self:
        self.body.setdefault("tolerations", []).append(dict(fields))
        return self

    def node_selector(self, key: str, value: str) -> Self:
        self.body.setdefault("nodeSelector", {})[key] = value
        return self

    def affinity_term(self, *expressions: Mapping[str, object]) -> Self:
        """Add one required node selector term; terms are ORed, its expressions ANDed."""
        required = (
            self.body.setdefault("affinity", {})
            .setdefault("nodeAffinity", {})
            .setdefault("requiredDuringSchedulingIgnoredDuringExecution", {"nodeSelectorTerms": []})
        )
        required["nodeSelectorTerms"].append({"matchExpressions": [dict(e) for e in expressions]})
        return self

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.body)


def pod_spec() -> PodSpec:
    return PodSpec()


def expression(key: str, operator: str, *values: str) -> dict[str, object]:
    """One ``matchExpressions`` entry."""
    item: dict[str, object] = {"key": key, "operator": operator}
    if values:
        item["values"] = list(values)
    return item


# ---------------------------------------------------------------------------
# Core kinds
# ---------------------------------------------------------------------------


def namespace(name: str) -> Manifest:
    return Manifest("v1", "Namespace", name)


class NodeManifest(Manifest):
    def allocatable(self, **amounts: object) -> Self:
        self.body.setdefault("status", {})["allocatable"] = resources(**amounts)
        return self

    def taint(self, key: str, value: str | None, effect: str) -> Self:
        item = {"key": key, "effect": effect}
        if value is not None:
            item["value"] = value
        self.body.setdefault("spec", {}).setdefault("taints", []).append(item)
        return self


def node(name: str) -> NodeManifest:
    return NodeManifest("v1", "Node", name)


class JobManifest(Manifest):
    def __init__(self, name: str, ns: str) -> None:
        super().__init__("batch/v1", "Job", name, ns)
        self.body["spec"] = {"template": {"spec": pod_spec().container(cpu="1").to_dict()}}

    def queue(self, local_queue: str) -> Self:
        return self.label(QUEUE_NAME, local_queue)

    def priority_class(self, name: str) -> Self:
        return self.label(PRIORITY_CLASS, name)

    def parallelism(self, n: int) -> Self:
        self.body["spec"]["parallelism"] = n
        return self

    def completions(self, n: int) -> Self:
        self.body["spec"]["completions"] = n
        return self

    def pod(self, spec: PodSpec) -> Self:
        self.body["spec"]["template"]["spec"] = spec.to_dict()
        return self


def job(name: str, ns: str = "default") -> JobManifest:
    return JobManifest(name, ns)


# ---------------------------------------------------------------------------
# Kueue kinds
# ---------------------------------------------------------------------------


def resource_flavor(name: str) -> Manifest:
    return Manifest(KUEUE, "ResourceFlavor", name).set("spec", {})


class ClusterQueueManifest(Manifest):
    """A ClusterQueue that admits from every namespace (``namespaceSelector: {}``) until told otherwise."""

    def __init__(self, name: str, version: str) -> None:
        super().__init__(f"kueue.x-k8s.io/{version}", "ClusterQueue", name)
        self.version = version
        self.body["spec"] = {"namespaceSelector": {}, "resourceGroups": []}

    def cohort(self, name: str) -> Self:
        self.body["spec"]["cohortName" if self.version == "v1beta2" else "cohort"] = name
        return self

    def group(self) -> Self:
        """Start a new resource group; ``flavor`` adds to the last one."""
        self.body["spec"]["resourceGroups"].append({"coveredResources": [], "flavors": []})
        return self

    def flavor(self, name: str, **nominal: object) -> Self:
        """Add a flavor with these nominal quotas to the last resource group."""
        if not self.body["spec"]["resourceGroups"]:
            self.group()
        group = self.body["spec"]["resourceGroups"][-1]
        quotas = resources(**nominal)
        for resource in quotas:
            if resource not in group["coveredResources"]:
                group["coveredResources"].append(resource)
        group["flavors"].append(
            {"name": name, "resources": [{"name": r, "nominalQuota": q} for r, q in quotas.items()]}
        )
        return self

    def fungibility(self, **policy: str) -> Self:
        self.body["spec"]["flavorFungibility"] = dict(policy)
        return self

    def namespace_selector(self, selector: Mapping[str, object] | None) -> Self:
        """Set the selector; ``None`` leaves the field out (Kueue: no namespace)."""
        if selector is None:
            self.body["spec"].pop("namespaceSelector", None)
        else:
            self.body["spec"]["namespaceSelector"] = dict(selector)
        return self


def cluster_queue(name: str, version: str = "v1beta2") -> ClusterQueueManifest:
    return ClusterQueueManifest(name, version)


def cohort(name: str, parent: str | None = None) -> Manifest:
    built = Manifest(KUEUE, "Cohort", name).set("spec", {})
    return built if parent is None else built.set("spec.parentName", parent)


def local_queue(name: str, ns: str, cluster_queue_name: str) -> Manifest:
    return Manifest(KUEUE, "LocalQueue", name, ns).set("spec.clusterQueue", cluster_queue_name)


def priority_class(name: str, value: int) -> Manifest:
    return Manifest(KUEUE, "WorkloadPriorityClass", name).set("value", value)


class WorkloadManifest(Manifest):
    def __init__(self, name: str, ns: str) -> None:
        super().__init__(KUEUE, "Workload", name, ns)
        self.body["spec"] = {"podSets": []}

    def queue(self, local_queue_name: str) -> Self:
        self.body["spec"]["queueName"] = local_queue_name
        return self

    def priority(self, value: int) -> Self:
        self.body["spec"]["priority"] = value
        return self

    def created(self, timestamp: str) -> Self:
        self.body["metadata"]["creationTimestamp"] = timestamp
        return self

    def podset(
        self,
        name: str = "main",
        count: int = 1,
        *,
        min_count: int | None = None,
        spec: PodSpec | None = None,
        **requests: object,
    ) -> Self:
        """Add a pod set of ``count`` pods, each with ``spec`` or one container requesting ``requests``."""
        pods = spec if spec is not None else pod_spec().container(**requests)
        item: dict[str, Any] = {"name": name, "count": count, "template": {"spec": pods.to_dict()}}
        if min_count is not None:
            item["minCount"] = min_count
        self.body["spec"]["podSets"].append(item)
        return self

    def admitted(self, cluster_queue_name: str, *assignments: Mapping[str, object]) -> Self:
        """Record ``status.admission`` with these podSetAssignments."""
        self.body.setdefault("status", {})["admission"] = {
            "clusterQueue": cluster_queue_name,
            "podSetAssignments": [dict(a) for a in assignments],
        }
        return self

    def pod_annotation(self, key: str, value: str) -> Self:
        """Annotate the pods of the last pod set (e.g. ``gpuplane.dev/gpu-fraction``)."""
        template = self.body["spec"]["podSets"][-1]["template"]
        template.setdefault("metadata", {}).setdefault("annotations", {})[key] = value
        return self

    def topology(self, *, required: str | None = None, preferred: str | None = None) -> Self:
        """Set the last pod set's ``topologyRequest`` (a node label key per level)."""
        request = {k: v for k, v in (("required", required), ("preferred", preferred)) if v is not None}
        self.body["spec"]["podSets"][-1]["topologyRequest"] = request
        return self


def workload(name: str, ns: str = "default") -> WorkloadManifest:
    return WorkloadManifest(name, ns)
