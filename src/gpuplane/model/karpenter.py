"""Karpenter's ``NodePool`` (``karpenter.sh/v1``), as far as scheduling needs it.

A NodePool launches nodes from ``spec.template``: its ``metadata.labels``, its
``spec.requirements`` (node selector requirements; a node gets one value of each ``In``
requirement as a label), its ``spec.taints``; ``spec.limits`` caps the pool's total capacity
(a ResourceList); ``spec.weight`` orders pools. Nodes a pool launched carry the label
``karpenter.sh/nodepool: <name>``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.model import fields as f
from gpuplane.model import labels as keys
from gpuplane.model.errors import InputError
from gpuplane.model.objects import EMPTY, SelectorRequirement, Taint, frozen_map

KARPENTER_GROUP = "karpenter.sh"
NODEPOOL_LABEL = keys.KARPENTER_NODEPOOL_LABEL
DISRUPTED_TAINT = keys.KARPENTER_DISRUPTED_TAINT
DO_NOT_DISRUPT = keys.KARPENTER_DO_NOT_DISRUPT
NODE_OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Gte", "Lte")


@dataclass(frozen=True, slots=True)
class NodePool:
    name: str
    labels: Mapping[str, str] = field(default_factory=lambda: EMPTY)
    requirements: tuple[SelectorRequirement, ...] = ()
    taints: tuple[Taint, ...] = ()
    limits: Mapping[str, int] = field(default_factory=lambda: frozen_map({}))
    weight: int = 0


def parse_node_pool(doc: Mapping[str, Any], version: str) -> NodePool:
    if version != "v1":
        raise InputError(
            f"unsupported apiVersion karpenter.sh/{version}; expected karpenter.sh/v1", field="apiVersion"
        )
    meta = f.get_map(doc, "metadata", "", required=True)
    name = f.req_str(meta, "name", "metadata")
    spec = f.get_map(doc, "spec", "", required=True)
    template = f.get_map(spec, "template", "spec", required=True)
    tmeta = f.get_map(template, "metadata", "spec.template")
    tspec = f.get_map(template, "spec", "spec.template", required=True)
    path = "spec.template.spec.requirements"
    requirements = []
    for i, raw in enumerate(f.get_list(tspec, "requirements", "spec.template.spec")):
        here = f.join(path, i)
        req = f.as_map(raw, here)
        op = f.get_enum(req, "operator", here, NODE_OPERATORS, None)
        if op is None:
            raise InputError("required field is missing", field=f.join(here, "operator"))
        values = tuple(
            f.as_str(v, f.join(f.join(here, "values"), j))
            for j, v in enumerate(f.get_list(req, "values", here))
        )
        requirements.append(SelectorRequirement(f.req_str(req, "key", here), op, values))
    taints = []
    for i, raw in enumerate(f.get_list(tspec, "taints", "spec.template.spec")):
        here = f"spec.template.spec.taints[{i}]"
        t = f.as_map(raw, here)
        taints.append(
            Taint(f.req_str(t, "key", here), f.get_str(t, "value", here) or "", f.req_str(t, "effect", here))
        )
    return NodePool(
        name=name,
        labels=frozen_map(f.string_map(tmeta, "labels", "spec.template.metadata")),
        requirements=tuple(requirements),
        taints=tuple(taints),
        limits=frozen_map(f.resource_list(spec, "limits", "spec")),
        weight=f.get_int(spec, "weight", "spec") or 0,
    )
