"""Reading cluster state files: YAML (multi-document or ``kind: List``) and JSON.

``load_state(sources)`` turns a list of ``(name, text)`` pairs into one validated,
frozen :class:`ClusterState`, or raises :class:`InputError` naming the file, the
document index, the object and the field. Reading is defensive: YAML alias bombs,
deeply nested documents and non-UTF-8 bytes all end as an ``InputError``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.resolver import Resolver

from gpuplane.model import dra_kinds, kinds
from gpuplane.model import fields as f
from gpuplane.model.admission_checks import AdmissionCheck, parse_admission_check
from gpuplane.model.dra import (
    DEVICE_TAINT_RULE,
    DRA_GROUP,
    DRA_KINDS,
    DraObjects,
    with_taint_rules,
)
from gpuplane.model.dra import version_problem as dra_version_problem
from gpuplane.model.dra_extended import extended_resource_claims
from gpuplane.model.dra_quota import charge_claims
from gpuplane.model.errors import InputError
from gpuplane.model.karpenter import KARPENTER_GROUP, NodePool, parse_node_pool
from gpuplane.model.objects import (
    ClusterQueue,
    ClusterState,
    Cohort,
    InvalidWorkload,
    KueueConfiguration,
    LocalQueue,
    Namespace,
    Node,
    Pod,
    ResourceFlavor,
    Topology,
    Workload,
    WorkloadPriorityClass,
    frozen_map,
)
from gpuplane.model.validate import api_server_rejections, validate_state

# A document may expand through aliases to at most this many nodes.
MAX_EXPANDED_NODES = 2_000_000


@dataclass(frozen=True, slots=True)
class Document:
    """One decoded object with where it came from.

    ``index`` is the zero-based document number in its file; ``item`` is the
    position inside a ``kind: List`` (or a JSON array), ``None`` otherwise.
    """

    source: str
    index: int
    item: int | None
    body: Mapping[str, Any]

    def label(self) -> str:
        kind = self.body.get("kind")
        meta = self.body.get("metadata")
        name = meta.get("name") if isinstance(meta, Mapping) else None
        ns = meta.get("namespace") if isinstance(meta, Mapping) else None
        parts = [str(kind) if isinstance(kind, str) else "object"]
        if isinstance(ns, str) and ns:
            parts.append(ns)
        if isinstance(name, str) and name:
            parts.append(name)
        return "/".join(parts)

    def locate(self, err: InputError) -> InputError:
        """Fill in this document's location, prefixing the field with the List item."""
        if self.item is not None:
            err = InputError(
                err.message,
                source=err.source,
                document=err.document,
                obj=err.obj,
                field=f"items[{self.item}]" + (f".{err.field}" if err.field else ""),
            )
        return err.located(source=self.source, document=self.index, obj=self.label())


# Kubernetes timestamps are strings. Left unresolved, they reach fields.timestamp, which reports a bad
# one with its field path; PyYAML's own resolver raises a bare ValueError for a date such as
# 2026-13-45 and reads a timestamp without a zone in the machine's local time.
_RESOLVERS_WITHOUT_TIMESTAMPS = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.resolver.Resolver.yaml_implicit_resolvers.items()
}


class _GuardedLoader(yaml.SafeLoader):
    """SafeLoader that refuses documents whose aliases expand too far."""

    yaml_implicit_resolvers = _RESOLVERS_WITHOUT_TIMESTAMPS

    def construct_document(self, node: yaml.Node) -> Any:
        _check_expansion(node)
        return super().construct_document(node)


def _check_expansion(root: yaml.Node) -> None:
    sizes: dict[int, int] = {}
    # Iterative post-order walk; shared (aliased) nodes are sized once and reused.
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if key in sizes:
            continue
        children: list[yaml.Node] = []
        if isinstance(node, yaml.SequenceNode):
            children = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                children += [k, v]
        if done or not children:
            total = 1 + sum(sizes.get(id(c), 0) for c in children)
            if total > MAX_EXPANDED_NODES:
                raise InputError("YAML aliases expand to too many nodes (possible alias bomb)")
            sizes[key] = total
            continue
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


_STR_TAG = "tag:yaml.org,2002:str"
_MAP_TAG = "tag:yaml.org,2002:map"
_SEQ_TAG = "tag:yaml.org,2002:seq"
_INT_TAG = "tag:yaml.org,2002:int"

# libyaml's composer recurses in C: input nested tens of thousands deep would kill the
# interpreter, not raise. Its fast path is taken only when the nesting is provably shallow: each
# block level costs a column (or a "- " prefix) on some line, each flow level one unmatched
# bracket, so no line this long and this few non-empty brackets bound the depth.
_C_COMPOSER_MAX_LINE = 1000
_C_COMPOSER_MAX_BRACKETS = 1000
# A plain decimal int; YAML 1.1 reads a leading 0 as octal, so those take the general path.
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)")
_LONG_LINE = re.compile(rf"[^\n]{{{_C_COMPOSER_MAX_LINE}}}")


def _shallow(text: str) -> bool:
    brackets = text.count("[") - text.count("[]") + text.count("{") - text.count("{}")
    return brackets < _C_COMPOSER_MAX_BRACKETS and _LONG_LINE.search(text) is None


_CLoader: Any = None
_resolve: Callable[..., Any] = Resolver.resolve  # untyped in the stubs
if yaml.__with_libyaml__:
    from yaml._yaml import CParser

    class _CComposedLoader(CParser, SafeConstructor, Resolver):
        """libyaml's parser and composer (C), PyYAML's safe constructor with a plain-data fast path.

        Used only for text without anchors and aliases, and with shallow nesting (see
        :func:`_shallow`). Plain strings, ints, mappings and sequences are built directly; any
        other tag goes through :class:`SafeConstructor`, so errors and values are exactly those
        of ``yaml.safe_load`` (timestamps stay strings, as in :class:`_GuardedLoader`).
        """

        yaml_implicit_resolvers = _RESOLVERS_WITHOUT_TIMESTAMPS

        def __init__(self, stream: str) -> None:
            CParser.__init__(self, stream)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)
            self._scalar_tags: dict[str, str] = {}

        # The composer asks for the tag of every node; the same plain scalars (field names,
        # names, small numbers) come back again and again, and no path resolvers are set.
        def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
            if kind is yaml.ScalarNode and implicit[0]:
                tag = self._scalar_tags.get(value)
                if tag is None:
                    tag = self._scalar_tags[value] = _resolve(self, kind, value, implicit)
                return tag
            return _resolve(self, kind, value, implicit)

        def descend_resolver(self, current_node: Any, current_index: Any) -> None:
            pass

        def ascend_resolver(self) -> None:
            pass

        def construct_document(self, node: yaml.Node) -> Any:
            try:
                return self._plain(node)
            finally:
                self.constructed_objects = {}
                self.recursive_objects = {}

        def _plain(self, node: yaml.Node) -> Any:
            tag = node.tag
            if tag == _STR_TAG:
                return node.value
            if tag == _MAP_TAG:
                out: dict[Any, Any] = {}
                for key_node, value_node in node.value:
                    if key_node.tag != _STR_TAG:  # merge keys, non-string and unhashable keys
                        return self.construct_object(node, deep=True)
                    out[key_node.value] = self._plain(value_node)
                return out
            if tag == _SEQ_TAG:
                return [self._plain(item) for item in node.value]
            if tag == _INT_TAG and _DECIMAL.fullmatch(node.value):
                return int(node.value)
            return self.construct_object(node, deep=True)

    _CLoader = _CComposedLoader


def _yaml_documents(text: str) -> list[Any]:
    # Text with anchors or aliases ('&', '*': possible bombs, and PyYAML names an undefined alias)
    # or deep nesting takes the guarded pure-Python path; everything else libyaml's C composer.
    fast = _CLoader is not None and "&" not in text and "*" not in text and _shallow(text)
    loader: Any = _CLoader if fast else _GuardedLoader
    docs: list[Any] = []
    try:
        docs.extend(yaml.load_all(text, Loader=loader))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        reason = err.problem or " ".join(str(err).split())
        raise InputError(f"invalid YAML{where}: {reason}", document=len(docs)) from None
    except yaml.YAMLError as err:  # e.g. a control character; str(err) spans two lines
        raise InputError(f"invalid YAML: {' '.join(str(err).split())}", document=len(docs)) from None
    except ValueError as err:
        # From int() or datetime() on a value: 5000 digits, or an explicit !!timestamp 2026-13-45.
        reason = str(err).split(";")[0]
        raise InputError(f"invalid YAML: cannot decode a value ({reason})", document=len(docs)) from None
    except RecursionError:
        raise InputError("document is nested too deeply", document=len(docs)) from None
    except InputError as err:
        raise err.located(document=len(docs)) from None
    return docs


def decode(source: str, text: str) -> list[Document]:
    """Split one file into documents, expanding ``kind: List`` and JSON arrays."""
    try:
        raw_docs = _raw_documents(text)
    except InputError as err:
        raise err.located(source=source) from None
    out: list[Document] = []
    for index, raw in enumerate(raw_docs):
        if raw is not None:
            out += _documents_of(source, index, raw)
    return out


def _raw_documents(text: str) -> list[Any]:
    """The decoded documents of a JSON or YAML text."""
    if not text.lstrip().startswith(("{", "[")):
        return _yaml_documents(text)
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as err:
        raise InputError(f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}") from None
    except ValueError as err:  # int() refuses numbers of more than 4300 digits
        raise InputError(f"invalid JSON: cannot decode a value ({str(err).split(';')[0]})") from None
    except RecursionError:
        raise InputError("document is nested too deeply") from None


def _documents_of(source: str, index: int, raw: object) -> list[Document]:
    """One decoded document: an object, or the items of a list (a JSON array, ``kind: List``)."""
    if isinstance(raw, list):
        items: Sequence[Any] = raw
    elif isinstance(raw, Mapping) and raw.get("kind") == "List":
        try:
            items = f.get_list(raw, "items", "", required=True)
        except InputError as err:
            raise err.located(source=source, document=index) from None
    elif isinstance(raw, Mapping):
        return [Document(source, index, None, raw)]
    else:
        raise InputError(
            f"expected a Kubernetes object, got {f.type_name(raw)}", source=source, document=index
        )
    out: list[Document] = []
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise InputError(
                f"expected a Kubernetes object, got {f.type_name(item)}",
                source=source,
                document=index,
                field=f"items[{i}]",
            )
        out.append(Document(source, index, i, item))
    return out


Parser = Callable[[Mapping[str, Any], str], Any]

_KUEUE: dict[str, Parser] = {
    "ClusterQueue": kinds.parse_cluster_queue,
    "Cohort": kinds.parse_cohort,
    "ResourceFlavor": kinds.parse_resource_flavor,
    "LocalQueue": kinds.parse_local_queue,
    "WorkloadPriorityClass": kinds.parse_priority_class,
    "Topology": kinds.parse_topology,
    "AdmissionCheck": parse_admission_check,
}
_CORE: dict[str, Parser] = {
    "Namespace": kinds.parse_namespace,
    "Node": kinds.parse_node,
    "Pod": kinds.parse_pod,
}


def _api(doc: Document) -> tuple[str, str, str]:
    body = doc.body
    api_version = f.get_str(body, "apiVersion", "", required=True)
    kind = f.get_str(body, "kind", "", required=True)
    assert api_version is not None
    assert kind is not None
    group, _, version = api_version.rpartition("/")
    return group, version, kind


# Per API group: its name in messages and the kinds read from it.
_KINDS: dict[str, tuple[str, frozenset[str]]] = {
    kinds.KUEUE_GROUP: (kinds.KUEUE_GROUP, frozenset((*_KUEUE, "Workload"))),
    "config." + kinds.KUEUE_GROUP: ("config." + kinds.KUEUE_GROUP, frozenset({"Configuration"})),
    "": ("core/v1", frozenset(_CORE)),
    KARPENTER_GROUP: (KARPENTER_GROUP, frozenset({"NodePool"})),
    "batch": ("batch", frozenset({"Job"})),
    DRA_GROUP: (DRA_GROUP, frozenset(DRA_KINDS)),
}
_DRA: dict[str, Parser] = {
    "DeviceClass": dra_kinds.parse_device_class,
    "ResourceSlice": dra_kinds.parse_resource_slice,
    "ResourceClaim": dra_kinds.parse_resource_claim,
    "ResourceClaimTemplate": dra_kinds.parse_claim_template,
    DEVICE_TAINT_RULE: dra_kinds.parse_taint_rule,
}


def _check_version(group: str, version: str, kind: str) -> None:
    known = _KINDS.get(group)
    if known is None:
        raise InputError(f"unsupported apiVersion {group}/{version} (kind {kind})", field="apiVersion")
    label, known_kinds = known
    if kind not in known_kinds:
        raise InputError(f"unknown kind {kind!r} in {label}", field="kind")
    problem = _version_problem(group, version, kind)
    if problem is not None:
        raise InputError(problem, field="apiVersion")


def _version_problem(group: str, version: str, kind: str) -> str | None:
    """Why a known kind's apiVersion is not served, or None."""
    if group == kinds.KUEUE_GROUP and version not in kinds.KUEUE_VERSIONS:
        return f"unsupported apiVersion {group}/{version}; served versions are v1beta1 and v1beta2"
    if group == "config." + kinds.KUEUE_GROUP and version not in kinds.KUEUE_VERSIONS:
        return f"unsupported apiVersion {group}/{version}"
    if group == "" and version != "v1":
        return f"unsupported apiVersion {version!r} for {kind}; expected v1"
    if group == "batch" and version != "v1":
        return f"unsupported apiVersion batch/{version}; expected batch/v1"
    if group == DRA_GROUP:
        return dra_version_problem(version, kind)
    return None


class _Collector:
    """Gathers parsed objects and refuses duplicates with both locations."""

    def __init__(self) -> None:
        self.seen: dict[tuple[str, str], Document] = {}

    def claim(self, kind: str, key: str, doc: Document) -> None:
        first = self.seen.get((kind, key))
        if first is not None:
            raise InputError(
                f"duplicate {kind} {key!r} (first defined in {first.source} document {first.index})",
                field="metadata.name",
            )
        self.seen[(kind, key)] = doc


class _Parsed:
    """The objects parsed so far, by kind, with the collector that refuses duplicates."""

    def __init__(self) -> None:
        self.collector = _Collector()
        self.config = KueueConfiguration()
        self.config_seen = False
        self.namespaces: dict[str, Namespace] = {}
        self.flavors: dict[str, ResourceFlavor] = {}
        self.cohorts: dict[str, Cohort] = {}
        self.queues: dict[str, ClusterQueue] = {}
        self.local_queues: dict[str, LocalQueue] = {}
        self.priority_classes: dict[str, WorkloadPriorityClass] = {}
        self.topologies: dict[str, Topology] = {}
        self.admission_checks: dict[str, AdmissionCheck] = {}
        self.node_pools: dict[str, NodePool] = {}
        self.workloads: list[Workload] = []
        self.nodes: list[Node] = []
        self.pods: list[Pod] = []
        self.invalid: list[InvalidWorkload] = []
        self.dra: dict[str, dict[str, Any]] = {kind: {} for kind in _DRA}

    def add(self, doc: Document, group: str, version: str, kind: str) -> None:
        """Parse one document of a known kind and keep it."""
        body = doc.body
        if kind == "Configuration":
            if self.config_seen:
                raise InputError("more than one Configuration", field="kind")
            self.config_seen = True
            self.config = kinds.parse_configuration(body, version)
        elif group == kinds.KUEUE_GROUP and kind == "Workload":
            self._add_workload(kinds.parse_workload(body, version, self._priorities()), doc)
        elif group == KARPENTER_GROUP:
            pool = parse_node_pool(body, version)
            self.collector.claim(kind, pool.name, doc)
            self.node_pools[pool.name] = pool
        elif group == "batch":
            job_wl = kinds.workload_from_job(body, self._priorities())
            if job_wl is not None:
                self._add_workload(job_wl, doc)
        elif group == DRA_GROUP:
            obj = _DRA[kind](body, version)
            key = obj.name if kind in ("DeviceClass", "ResourceSlice", DEVICE_TAINT_RULE) else obj.key
            self.collector.claim(kind, key, doc)
            self.dra[kind][key] = obj
        elif group == kinds.KUEUE_GROUP:
            self._add_kueue(kind, _KUEUE[kind](body, version), doc)
        else:
            self._add_core(kind, _CORE[kind](body, version), doc)

    def _priorities(self) -> dict[str, int]:
        return {n: p.value for n, p in self.priority_classes.items()}

    def _add_workload(self, wl: Workload, doc: Document) -> None:
        self.collector.claim("Workload", wl.key, doc)
        self.workloads.append(wl)

    def _add_kueue(self, kind: str, obj: Any, doc: Document) -> None:
        if isinstance(obj, LocalQueue):
            self.collector.claim(kind, obj.key, doc)
            self.local_queues[obj.key] = obj
            return
        self.collector.claim(kind, obj.name, doc)
        by_kind: dict[str, dict[str, Any]] = {
            "ClusterQueue": self.queues,
            "Cohort": self.cohorts,
            "ResourceFlavor": self.flavors,
            "WorkloadPriorityClass": self.priority_classes,
            "Topology": self.topologies,
            "AdmissionCheck": self.admission_checks,
        }
        by_kind[kind][obj.name] = obj

    def _add_core(self, kind: str, obj: Any, doc: Document) -> None:
        if isinstance(obj, Namespace):
            self.collector.claim(kind, obj.name, doc)
            self.namespaces[obj.name] = obj
        elif isinstance(obj, Node):
            self.collector.claim(kind, obj.name, doc)
            self.nodes.append(obj)
        else:
            self.collector.claim(kind, obj.key, doc)
            self.pods.append(obj)

    def state(self) -> ClusterState:
        """The frozen state of everything parsed, with where each object came from."""
        return ClusterState(
            configuration=self.config,
            namespaces=frozen_map(self.namespaces),
            resource_flavors=frozen_map(self.flavors),
            cohorts=frozen_map(self.cohorts),
            cluster_queues=frozen_map(self.queues),
            local_queues=frozen_map(self.local_queues),
            priority_classes=frozen_map(self.priority_classes),
            topologies=frozen_map(self.topologies),
            workloads=tuple(self.workloads),
            nodes=tuple(self.nodes),
            pods=tuple(self.pods),
            invalid_workloads=tuple(self.invalid),
            admission_checks=frozen_map(self.admission_checks),
            node_pools=frozen_map(self.node_pools),
            dra=DraObjects(
                classes=frozen_map(self.dra["DeviceClass"]),
                slices=with_taint_rules(
                    tuple(self.dra["ResourceSlice"].values()), tuple(self.dra[DEVICE_TAINT_RULE].values())
                ),
                claims=frozen_map(self.dra["ResourceClaim"]),
                templates=frozen_map(self.dra["ResourceClaimTemplate"]),
            ),
            origins=frozen_map(
                {f"{kind}/{key}": (d.source, d.index) for (kind, key), d in self.collector.seen.items()}
            ),
        )


def load_state(
    sources: Iterable[tuple[str, str]], *, strict: bool = False, warnings: list[str] | None = None
) -> ClusterState:
    """Parse and validate all documents of all sources into one ClusterState.

    ``strict`` also refuses what only a real API server would refuse (see
    :func:`api_server_rejections`); otherwise those problems are appended to
    ``warnings`` as located one-line messages.
    """
    docs: list[Document] = []
    names: list[str] = []
    for source, text in sources:
        names.append(source)
        docs.extend(decode(source, text))
    if not docs:
        # Nothing to decide on is a mistake (a wrong file, an empty pipe), not an empty plan.
        raise InputError(
            "no Kubernetes objects in the input",
            source=", ".join(names) if names else None,
        )
    return build_state(docs, strict=strict, warnings=warnings)


def state_from_objects(
    objects: Iterable[Mapping[str, Any]],
    source: str = "cluster",
    *,
    strict: bool = False,
    warnings: list[str] | None = None,
    skipped: list[InputError] | None = None,
) -> ClusterState:
    """Build a ClusterState from already decoded objects (e.g. an informer cache)."""
    return build_state(
        [Document(source, i, None, obj) for i, obj in enumerate(objects)],
        strict=strict,
        warnings=warnings,
        skipped=skipped,
    )


def build_state(
    docs: Sequence[Document],
    *,
    strict: bool = False,
    warnings: list[str] | None = None,
    skipped: list[InputError] | None = None,
) -> ClusterState:
    """Parse, cross-check and freeze decoded documents.

    With ``skipped`` (a live cluster), an invalid object is left out and its error
    appended there, instead of failing the whole state.
    """

    def refuse(err: InputError) -> None:
        if skipped is None:
            raise err
        skipped.append(err)

    typed: list[tuple[Document, str, str, str]] = []
    for doc in docs:
        try:
            group, version, kind = _api(doc)
            _check_version(group, version, kind)
        except InputError as err:
            refuse(doc.locate(err))
            continue
        typed.append((doc, group, version, kind))

    parsed = _Parsed()
    collector = parsed.collector
    # Priority classes first: workloads and jobs resolve their priority through them.
    ordered = sorted(typed, key=lambda t: 0 if t[3] == "WorkloadPriorityClass" else 1)
    for doc, group, version, kind in ordered:
        try:
            parsed.add(doc, group, version, kind)
        except InputError as err:
            located = doc.locate(err)
            who = kinds.workload_identity(doc.body, kind) if err.invalid_value else None
            if who is None or kind not in {"Workload", "Job"}:
                refuse(located)
                continue
            # One workload with a value Kueue cannot use stays pending as Misconfigured;
            # it never stops the rest of the input.
            namespace, name, queue = who
            collector.claim("Workload", f"{namespace}/{name}", doc)
            parsed.invalid.append(InvalidWorkload(namespace, name, queue, str(located)))
            if warnings is not None:
                warnings.append(str(located))
    state = charge_claims(extended_resource_claims(parsed.state()))

    def locate(err: InputError) -> InputError:
        kind, _, key = (err.obj or "").partition("/")
        found = collector.seen.get((kind, key))
        if found is not None:
            return err.located(source=found.source, document=found.index)
        return err

    while True:
        try:
            validate_state(state)
            break
        except InputError as err:
            if skipped is None:
                raise locate(err) from None
            skipped.append(locate(err))
            state = _without(state, err.obj or "")
    for problem in api_server_rejections(state):
        if strict:
            raise locate(problem)
        if warnings is not None:
            warnings.append(str(locate(problem)))
    return state


def _without(state: ClusterState, obj: str) -> ClusterState:
    """The state less one LocalQueue or Cohort that failed cross-validation."""
    kind, _, key = obj.partition("/")
    if kind == "LocalQueue":
        return replace(
            state, local_queues=frozen_map({k: v for k, v in state.local_queues.items() if k != key})
        )
    if kind == "Cohort":
        return replace(state, cohorts=frozen_map({k: v for k, v in state.cohorts.items() if k != key}))
    raise InputError(f"cannot leave out {obj}", obj=obj)


def load_files(
    paths: Sequence[str],
    read: Callable[[str], bytes] | None = None,
    *,
    strict: bool = False,
    warnings: list[str] | None = None,
) -> ClusterState:
    """Read files (``-`` for standard input is handled by the caller) and load them."""
    sources: list[tuple[str, str]] = []
    for path in paths:
        try:
            data = read(path) if read is not None else Path(path).read_bytes()
        except OSError as err:
            raise InputError(f"cannot read file: {err.strerror or err}", source=path) from None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"file is not UTF-8 text (byte {err.start})", source=path) from None
        sources.append((path, text))
    return load_state(sources, strict=strict, warnings=warnings)
