"""Kueue admission checks: the ``AdmissionCheck`` kind, a ClusterQueue's references to
checks, and a Workload's per-check states.

Kueue's semantics, mirrored here and in :mod:`gpuplane.core.check_gate`:

- A ClusterQueue names its checks either in ``spec.admissionChecks`` (every workload) or in
  ``spec.admissionChecksStrategy.admissionChecks[] {name, onFlavors}`` (a check with
  ``onFlavors`` applies only to a workload assigned one of those flavors). Only one of the two
  may be set.
- A Workload records one ``status.admissionChecks[] {name, state, message}`` entry per check;
  the states are ``Pending``, ``Ready``, ``Retry`` and ``Rejected``.
- An AdmissionCheck is usable when its controller marked it ``Active``; a ClusterQueue that
  names a missing or inactive check is inactive.

This module has no Kueue object of its own to hold: the frozen types below are attached to
:class:`~gpuplane.model.objects.ClusterQueue`, :class:`~gpuplane.model.objects.Workload` and
:class:`~gpuplane.model.objects.ClusterState`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gpuplane.model import fields as f
from gpuplane.model.errors import InputError
from gpuplane.model.labels import MULTIKUEUE_CONTROLLER

PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
"""The controller name of Kueue's ProvisioningRequest check, which gpuplane implements."""

# MULTIKUEUE_CONTROLLER (from model.labels) names Kueue's MultiKueue check: a workload it applies
# to runs on a worker cluster, so the manager reserves its quota and never places it on its nodes.

IMPLEMENTED_CONTROLLERS = (PROVISIONING_CONTROLLER,)
__all__ = ["IMPLEMENTED_CONTROLLERS", "MULTIKUEUE_CONTROLLER", "PROVISIONING_CONTROLLER"]


class CheckState(StrEnum):
    """A check's verdict on one workload (Kueue's ``CheckState``)."""

    PENDING = "Pending"
    READY = "Ready"
    RETRY = "Retry"
    REJECTED = "Rejected"


@dataclass(frozen=True, slots=True)
class AdmissionCheck:
    """A cluster-scoped ``AdmissionCheck``.

    ``active`` is the ``Active`` condition its controller sets. A check whose controller
    gpuplane runs itself (the ProvisioningRequest check) counts as active without it.
    """

    name: str
    controller_name: str
    parameters_kind: str | None = None
    parameters_name: str | None = None
    active: bool = False

    @property
    def usable(self) -> bool:
        return self.active or self.controller_name in IMPLEMENTED_CONTROLLERS


@dataclass(frozen=True, slots=True)
class CheckRef:
    """One check a ClusterQueue requires; ``on_flavors`` empty means every workload."""

    name: str
    on_flavors: tuple[str, ...] = ()

    def applies_to(self, flavors: frozenset[str]) -> bool:
        return not self.on_flavors or bool(flavors.intersection(self.on_flavors))


@dataclass(frozen=True, slots=True)
class CheckStatus:
    """One entry of a Workload's ``status.admissionChecks``."""

    name: str
    state: CheckState
    message: str = ""


def parse_admission_check(doc: Mapping[str, Any], version: str) -> AdmissionCheck:
    del version
    meta = f.get_map(doc, "metadata", "", required=True)
    name = f.req_str(meta, "name", "metadata")
    spec = f.get_map(doc, "spec", "", required=True)
    controller = f.req_str(spec, "controllerName", "spec")
    if not controller:
        raise InputError("must not be empty", field="spec.controllerName")
    params = f.get_map(spec, "parameters", "spec")
    active = False
    status = f.get_map(doc, "status", "")
    for i, raw in enumerate(f.get_list(status, "conditions", "status")):
        cond = f.as_map(raw, f"status.conditions[{i}]")
        if cond.get("type") == "Active":
            active = cond.get("status") == "True"
    return AdmissionCheck(
        name=name,
        controller_name=controller,
        parameters_kind=f.get_str(params, "kind", "spec.parameters"),
        parameters_name=f.get_str(params, "name", "spec.parameters"),
        active=active,
    )


def cluster_queue_checks(spec: Mapping[str, Any], path: str) -> tuple[CheckRef, ...]:
    """The checks named by a ClusterQueue spec (either form, not both)."""
    plain = f.get_list(spec, "admissionChecks", path)
    strategy = f.get_map(spec, "admissionChecksStrategy", path)
    if plain and strategy:
        raise InputError(
            "only one of admissionChecks and admissionChecksStrategy may be set",
            field=f.join(path, "admissionChecksStrategy"),
        )
    refs: list[CheckRef] = []
    for i, raw in enumerate(plain):
        refs.append(CheckRef(f.as_str(raw, f.join(f.join(path, "admissionChecks"), i))))
    spath = f.join(path, "admissionChecksStrategy")
    for i, raw in enumerate(f.get_list(strategy, "admissionChecks", spath)):
        here = f.join(f.join(spath, "admissionChecks"), i)
        rule = f.as_map(raw, here)
        on = f.get_list(rule, "onFlavors", here)
        flavors = tuple(f.as_str(v, f.join(f.join(here, "onFlavors"), j)) for j, v in enumerate(on))
        refs.append(CheckRef(f.req_str(rule, "name", here), flavors))
    names = [r.name for r in refs]
    if len(set(names)) != len(names):
        raise InputError("an admission check is named twice", field=f.join(path, "admissionChecks"))
    return tuple(refs)


_CHECK_STATES = tuple(s.value for s in CheckState)  # read once: iterating an Enum is slow


def workload_check_states(status: Mapping[str, Any]) -> tuple[CheckStatus, ...]:
    """A Workload's ``status.admissionChecks``."""
    out = []
    for i, raw in enumerate(f.get_list(status, "admissionChecks", "status")):
        here = f"status.admissionChecks[{i}]"
        entry = f.as_map(raw, here)
        state = f.get_enum(entry, "state", here, _CHECK_STATES, None)
        if state is None:
            raise InputError("required field is missing", field=f.join(here, "state"))
        out.append(
            CheckStatus(
                name=f.req_str(entry, "name", here),
                state=CheckState(state),
                message=f.get_str(entry, "message", here) or "",
            )
        )
    return tuple(out)
