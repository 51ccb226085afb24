"""`gpuplane doctor`: what an experienced platform engineer would check first.

Pure checks over a :class:`ClusterState`; each finding names the objects involved and
says what to fix. The checks:

* GPU nodes (by their GPU Feature Discovery labels) that advertise no GPU: the device
  plugin is missing or broken (a node a DRA driver publishes devices for needs none);
* GPU nodes tainted with a taint that no flavor and no queued workload tolerates;
* ResourceFlavors whose node labels match no node;
* MIG nodes whose ``nvidia.com/mig.config.state`` is not ``success``;
* nodes of a topology-aware flavor that lack one of the topology's level labels;
* time-slicing on nodes where isolation is expected (a flavor or namespace labelled
  ``gpuplane.dev/isolation=required``);
* with Karpenter NodePools: pools whose nodes no flavor selects, and flavors no pool can provide.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuplane.core.analysis import provides
from gpuplane.core.session import DeviceConfig
from gpuplane.model import labels as keys
from gpuplane.model.dra import DraObjects
from gpuplane.model.objects import ClusterState, Node, ResourceFlavor, Toleration

ISOLATION_LABEL = keys.ISOLATION_LABEL
SEVERITY_ORDER = {"error": 0, "warning": 1}


@dataclass(frozen=True, slots=True)
class Finding:
    severity: str  # error | warning
    check: str
    objects: tuple[str, ...]
    message: str
    fix: str

    def line(self) -> str:
        return f"[{self.severity}] {self.check}: {', '.join(self.objects)}: {self.message}. Fix: {self.fix}"


def _is_gpu_node(node: Node, config: DeviceConfig) -> bool:
    return config.labels_accelerators(node.labels)


def _advertised_gpus(node: Node, config: DeviceConfig) -> int:
    return sum(q for name, q in node.allocatable.items() if config.is_device_resource(name))


def _flavor_nodes(flavor: ResourceFlavor, nodes: Iterable[Node]) -> list[Node]:
    return [n for n in nodes if all(n.labels.get(k) == v for k, v in flavor.node_labels.items())]


def diagnose(state: ClusterState, config: DeviceConfig | None = None) -> list[Finding]:
    """Every finding, errors first, then by check and object."""
    config = config or DeviceConfig()
    nodes = list(state.nodes)
    gpu_nodes = [n for n in nodes if _is_gpu_node(n, config)]
    published = dra_nodes(state.dra, [n.name for n in nodes])
    findings = [
        *_device_plugin([n for n in gpu_nodes if n.name not in published], config),
        *_untolerated_taints(state, gpu_nodes),
        *_flavors_without_nodes(state, nodes),
        *_mig_config(nodes, config),
        *_topology_labels(state, nodes),
        *_time_slicing(state, nodes, config),
    ]
    findings = _karpenter(state, findings)
    return sorted(findings, key=lambda f: (SEVERITY_ORDER[f.severity], f.check, f.objects))


def dra_nodes(dra: DraObjects, nodes: list[str]) -> set[str]:
    """The nodes some current ResourceSlice publishes devices for (a node-local slice or device;
    every node for a slice or device with a node selector or ``allNodes``, not resolved here)."""
    out: set[str] = set()
    for s in dra.current_slices():
        if s.node_name is not None:
            out.add(s.node_name)
        elif s.per_device_nodes and all(d.node_name is not None for d in s.devices):
            out.update(d.node_name for d in s.devices if d.node_name is not None)
        else:
            return set(nodes)
    return out


def _device_plugin(gpu_nodes: list[Node], config: DeviceConfig) -> list[Finding]:
    """GPU nodes whose allocatable advertises no GPU."""
    findings: list[Finding] = []
    findings.extend(
        Finding(
            "error",
            "device-plugin",
            (f"Node/{node.name}",),
            f"labelled as a GPU node ({node.labels.get(config.model_label, 'GPU present')}) "
            "but allocatable advertises no GPU",
            "check that the NVIDIA device plugin (or GPU Operator) runs on this node",
        )
        for node in gpu_nodes
        if _advertised_gpus(node, config) == 0
    )
    return findings


def _untolerated_taints(state: ClusterState, gpu_nodes: list[Node]) -> list[Finding]:
    """Scheduling taints on GPU nodes that no flavor and no workload tolerates."""
    findings: list[Finding] = []
    tolerations: list[Toleration] = [t for f in state.resource_flavors.values() for t in f.tolerations]
    tolerations += [t for wl in state.workloads for ps in wl.pod_sets for t in ps.template.tolerations]
    for node in gpu_nodes:
        for taint in node.taints:
            if taint.effect not in ("NoSchedule", "NoExecute"):
                continue
            if not any(t.tolerates(taint) for t in tolerations):
                findings.append(
                    Finding(
                        "warning",
                        "untolerated-taint",
                        (f"Node/{node.name}",),
                        f"taint {taint} is tolerated by no ResourceFlavor and no queued workload",
                        "add the toleration to the flavor's spec.tolerations, or remove the taint",
                    )
                )
    return findings


def _flavors_without_nodes(state: ClusterState, nodes: list[Node]) -> list[Finding]:
    """Flavors whose node labels select no node."""
    findings: list[Finding] = []
    for flavor in sorted(state.resource_flavors.values(), key=lambda f: f.name):
        if flavor.node_labels and not _flavor_nodes(flavor, nodes):
            wanted = ", ".join(f"{k}={v}" for k, v in sorted(flavor.node_labels.items()))
            findings.append(
                Finding(
                    "error",
                    "flavor-matches-no-node",
                    (f"ResourceFlavor/{flavor.name}",),
                    f"no node has the labels {wanted}",
                    "fix the flavor's nodeLabels or label the nodes it should describe",
                )
            )
    return findings


def _mig_config(nodes: list[Node], config: DeviceConfig) -> list[Finding]:
    """Nodes whose MIG configuration has not (yet) succeeded."""
    findings: list[Finding] = []
    for node in nodes:
        mig_state = node.labels.get(config.mig_config_state_label)
        if mig_state is not None and mig_state != "success":
            findings.append(
                Finding(
                    "error" if mig_state == "failed" else "warning",
                    "mig-config",
                    (f"Node/{node.name}",),
                    f"{config.mig_config_state_label} is {mig_state!r}, so its MIG capacity is not counted",
                    "wait for the MIG manager, or check its logs and the MIG configuration it was asked for",
                )
            )
    return findings


def _topology_labels(state: ClusterState, nodes: list[Node]) -> list[Finding]:
    """A flavor's nodes missing a level label of its Topology."""
    findings: list[Finding] = []
    for flavor in state.resource_flavors.values():
        topology = state.topologies.get(flavor.topology_name or "")
        if topology is None:
            continue
        for node in _flavor_nodes(flavor, nodes):
            missing = [level for level in topology.levels if level not in node.labels]
            if missing:
                findings.append(
                    Finding(
                        "warning",
                        "topology-labels",
                        (f"Node/{node.name}", f"Topology/{topology.name}", f"ResourceFlavor/{flavor.name}"),
                        f"missing topology level label(s) {', '.join(missing)}",
                        "label the node with every level of the flavor's Topology",
                    )
                )
    return findings


def _time_slicing(state: ClusterState, nodes: list[Node], config: DeviceConfig) -> list[Finding]:
    """Time-sliced GPUs where a flavor or a namespace requires isolation."""
    findings: list[Finding] = []
    isolated = [
        f for f in state.resource_flavors.values() if f.node_labels.get(ISOLATION_LABEL) == "required"
    ]
    isolated_ns = {
        ns.name for ns in state.namespaces.values() if ns.labels.get(ISOLATION_LABEL) == "required"
    }
    for node in nodes:
        if node.labels.get(config.sharing_label) != "time-slicing":
            continue
        reasons = [f"ResourceFlavor/{f.name}" for f in isolated if node in _flavor_nodes(f, [node])]
        if isolated_ns:
            reasons += [f"Namespace/{ns}" for ns in sorted(isolated_ns)]
        if reasons:
            findings.append(
                Finding(
                    "warning",
                    "time-slicing-without-isolation",
                    (f"Node/{node.name}", *reasons),
                    "GPUs are time-sliced (no memory or fault isolation) where isolation is required",
                    "use MIG or whole GPUs for these workloads, or drop the isolation requirement",
                )
            )
    return findings


def _karpenter(state: ClusterState, findings: list[Finding]) -> list[Finding]:
    """With Karpenter NodePools: a flavor with no node yet is fine when a pool can launch its
    nodes (scale from zero); add the pools whose nodes no flavor selects, and the flavors no
    pool can provide. Without NodePools, nodes are not expected to come: nothing changes."""
    if not state.node_pools:
        return findings
    flavors = state.resource_flavors
    pools = state.node_pools.values()
    out = [
        f
        for f in findings
        if not (
            f.check == "flavor-matches-no-node"
            and any(
                provides(pool, flavors[o.split("/", 1)[1]])
                for o in f.objects
                if o.startswith("ResourceFlavor/") and o.split("/", 1)[1] in flavors
                for pool in pools
            )
        )
    ]
    out += [
        Finding(
            "warning",
            "nodepool-without-flavor",
            (f"NodePool/{pool.name}",),
            "no ResourceFlavor's node labels can be on the nodes this NodePool launches, so no queue "
            "can admit work to them",
            "add a ResourceFlavor whose nodeLabels the pool's template labels or requirements give, "
            "or remove the pool",
        )
        for pool in pools
        if not any(provides(pool, flavor) for flavor in flavors.values())
    ]
    out += [
        Finding(
            "warning",
            "flavor-without-nodepool",
            (f"ResourceFlavor/{flavor.name}",),
            "no NodePool launches nodes with this flavor's node labels; its capacity cannot grow",
            "add a NodePool whose template labels or requirements give "
            + ", ".join(f"{k}={v}" for k, v in sorted(flavor.node_labels.items())),
        )
        for flavor in flavors.values()
        if flavor.node_labels and not any(provides(pool, flavor) for pool in state.node_pools.values())
    ]
    return out
