"""Which resources the double serves: the built-in table plus whatever established CRDs add.

A :class:`ResourceType` is one (group, version, resource) endpoint. Objects are stored per (group,
resource), whatever version they were written at, so a CRD served at two versions shows the same objects
at both, as a real server does with the ``None`` conversion strategy.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    group: str  # "" for the core group
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    subresources: frozenset[str] = frozenset()
    # Bumps metadata.generation when anything but metadata and status changes.
    generation: bool = False
    # Set for custom resources: the CRD's schema for this version and its printer columns.
    schema: Mapping[str, Any] | None = field(default=None, compare=False)
    printer_columns: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)
    custom: bool = False

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        """Storage key: shared by every version of the resource."""
        return (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def qualified(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def api_resources(self) -> list[dict[str, Any]]:
        """This resource and its subresources as ``APIResourceList.resources`` entries."""
        main: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(VERBS),
        }
        if self.short_names:
            main["shortNames"] = list(self.short_names)
        if self.categories:
            main["categories"] = list(self.categories)
        entries = [main]
        for sub in sorted(self.subresources):
            kind, verbs = _subresource_shape(self, sub)
            entries.append(
                {
                    "name": f"{self.plural}/{sub}",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": kind,
                    "verbs": verbs,
                }
            )
        return entries


def _subresource_shape(rt: ResourceType, name: str) -> tuple[str, list[str]]:
    """The kind and verbs discovery lists for a subresource."""
    if name == "status":
        return rt.kind, ["get", "patch", "update"]
    return {"binding": "Binding", "eviction": "Eviction"}[name], ["create"]


def _builtin(
    group: str, version: str, kind: str, plural: str, namespaced: bool, **extra: Any
) -> ResourceType:
    return ResourceType(group, version, kind, plural, kind.lower(), namespaced, **extra)


BUILTIN: tuple[ResourceType, ...] = (
    _builtin(
        "", "v1", "Namespace", "namespaces", False, short_names=("ns",), subresources=frozenset({"status"})
    ),
    _builtin("", "v1", "Node", "nodes", False, short_names=("no",), subresources=frozenset({"status"})),
    _builtin(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        short_names=("po",),
        categories=("all",),
        subresources=frozenset({"status", "binding", "eviction"}),
    ),
    _builtin("", "v1", "Event", "events", True, short_names=("ev",)),
    _builtin("", "v1", "ConfigMap", "configmaps", True, short_names=("cm",)),
    _builtin("", "v1", "Secret", "secrets", True),
    _builtin(
        "batch",
        "v1",
        "Job",
        "jobs",
        True,
        categories=("all",),
        subresources=frozenset({"status"}),
        generation=True,
    ),
    _builtin("coordination.k8s.io", "v1", "Lease", "leases", True),
    _builtin(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        False,
        short_names=("crd", "crds"),
        categories=("api-extensions",),
        subresources=frozenset({"status"}),
        generation=True,
    ),
)

CRD = BUILTIN[-1]


def types_from_crd(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The endpoints an established CRD serves, one per served version."""
    spec = crd["spec"]
    names = spec["names"]
    found = []
    for version in spec.get("versions", []):
        if not version.get("served", False):
            continue
        subresources = set((version.get("subresources") or {}).keys())
        found.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                kind=names["kind"],
                plural=names["plural"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec["scope"] == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                subresources=frozenset(subresources & {"status"}),
                generation=True,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                printer_columns=tuple(version.get("additionalPrinterColumns") or ()),
                custom=True,
            )
        )
    return found


class Registry:
    """Lookup of served endpoints. Rebuilt (by the store) whenever a CRD changes."""

    def __init__(self, crds: Iterable[Mapping[str, Any]] = ()) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._versions: dict[str, list[str]] = {}  # group -> versions, preferred first
        for rt in BUILTIN:
            self._add(rt)
        for crd in crds:
            for rt in types_from_crd(crd):
                self._add(rt)
            preferred = _preferred_version(crd)
            group = crd["spec"]["group"]
            if preferred in self._versions.get(group, []):
                self._versions[group].remove(preferred)
                self._versions[group].insert(0, preferred)

    def _add(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt
        versions = self._versions.setdefault(rt.group, [])
        if rt.version not in versions:
            versions.append(rt.version)

    def lookup(self, group: str, version: str, plural: str) -> ResourceType | None:
        return self._types.get((group, version, plural))

    def by_key(self, key: tuple[str, str]) -> ResourceType | None:
        """The preferred-version endpoint of a stored resource."""
        group, plural = key
        for version in self._versions.get(group, []):
            rt = self._types.get((group, version, plural))
            if rt is not None:
                return rt
        return None

    def by_kind(self, api_version: str, kind: str) -> ResourceType | None:
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        return None

    def resolve(self, name: str) -> ResourceType:
        """A resource as kubectl names it: ``pods``, ``jobs.batch``, ``Pod``, ``workloads.kueue.x-k8s.io``."""
        plural, _, group = name.partition(".")
        for rt in self._types.values():
            if (group == rt.group or not group) and plural.lower() in (
                rt.plural,
                rt.kind.lower(),
                rt.singular,
            ):
                return self.by_key(rt.key) or rt
        raise KeyError(f"the server doesn't have a resource type {name!r}")

    def groups(self) -> dict[str, list[str]]:
        return {group: list(versions) for group, versions in self._versions.items()}

    def types(self, group: str, version: str) -> list[ResourceType]:
        return [rt for (g, v, _), rt in self._types.items() if g == group and v == version]

    def all(self) -> list[ResourceType]:
        return list(self._types.values())


def _preferred_version(crd: Mapping[str, Any]) -> str:
    """Kubernetes prefers the served version with the highest priority (GA > beta > alpha, then number)."""
    served = [v["name"] for v in crd["spec"].get("versions", []) if v.get("served")]
    return max(served, key=version_priority) if served else ""


def version_priority(version: str) -> tuple[int, int, int]:
    match = re.fullmatch(r"v(\d+)(?:(alpha|beta)(\d+))?", version)
    if match is None:
        return (0, 0, 0)
    stage = {"alpha": 1, "beta": 2, None: 3}[match.group(2)]
    return (stage, int(match.group(1)), int(match.group(3) or 0))
