"""The double's storage: objects, one resourceVersion counter, change history and watchers, like etcd.

Every write takes the store lock, bumps the single monotonically increasing resourceVersion, records the
change in a bounded history (the "watch window") and pushes it to the queues of open watchers, so a watch
started from a resourceVersion replays exactly the changes after it. ``compact()`` forgets the history,
after which older resourceVersions answer 410 Expired, as after an etcd compaction.

Writes follow the API server's order: decode (kind/namespace checks, unknown fields), default, prepare
(system fields, status reset), validate, admit (namespace exists and is not terminating), then commit.
Objects handed out are deep copies; stored objects are replaced, never mutated, once committed, so
history entries and queued watch events can share them.

Time comes from a :class:`VirtualClock`. Bound pods deleted with a grace period get a deletionTimestamp
in the future and disappear when ``advance()`` moves the clock past it, standing in for the kubelet.
"""

from __future__ import annotations

import base64
import copy
import json
import queue
import random
import threading
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from . import schema as crd_schema
from .errors import (
    STALE,
    ApiError,
    Cause,
    already_exists,
    bad_request,
    conflict,
    expired,
    forbidden,
    invalid,
    not_found,
)
from .resources import CRD, Registry, ResourceType
from .selectors import Predicate
from .strategies import Strategy, strategy_for
from .validation import immutable, object_meta, required

Obj = dict[str, Any]
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
BOOTSTRAP_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
KNOWN_METADATA = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
# Top-level fields of the built-in kinds; anything else is an unknown field.
TOP_LEVEL_FIELDS: dict[str, frozenset[str]] = {
    "ConfigMap": frozenset({"data", "binaryData", "immutable"}),
    "Secret": frozenset({"data", "stringData", "type", "immutable"}),
    "Event": frozenset(
        {
            "action",
            "count",
            "eventTime",
            "firstTimestamp",
            "involvedObject",
            "lastTimestamp",
            "message",
            "reason",
            "related",
            "reportingComponent",
            "reportingInstance",
            "series",
            "source",
            "type",
        }
    ),
    "Lease": frozenset({"spec"}),
}
_GENERATE_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
# Kinds whose delete answers with the deleted object rather than a Status (ReturnDeletedObject).
_RETURNS_DELETED_OBJECT = frozenset({"Pod", "Namespace", "CustomResourceDefinition"})


class VirtualClock:
    """The double's notion of now. Never reads the wall clock; tests move it with ``advance``."""

    def __init__(self, start: datetime = EPOCH) -> None:
        self._now = start

    def now(self) -> datetime:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("time does not run backwards")
        self._now += timedelta(seconds=seconds)


def timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_timestamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


@dataclass(frozen=True)
class WatchEvent:
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK or ERROR
    object: Mapping[str, Any]


@dataclass(frozen=True)
class Change:
    """One committed write, as kept in the history and queued to watchers."""

    rv: int
    key: tuple[str, str]
    type: str  # ADDED, MODIFIED, DELETED
    obj: Obj  # the object after the change (for DELETED: its last state, at the deletion's rv)
    prev: Obj | None  # the object before the change


@dataclass(frozen=True)
class _Bookmark:
    rv: int
    initial_events_end: bool = False


@dataclass(frozen=True)
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str = ""
    remaining: int | None = None


@dataclass(frozen=True)
class WriteResult:
    """An object after a write, and the HTTP status the server answers with."""

    object: Obj
    code: int = 200
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Selection:
    """What a list or watch asks for."""

    namespace: str = ""
    labels: Predicate = field(default=lambda _obj: True)
    fields: Predicate = field(default=lambda _obj: True)

    def __call__(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace and meta.get("namespace") != self.namespace:
            return False
        return self.labels(obj) and self.fields(obj)


class Watcher:
    """One open watch: a queue the store fills under its lock, read by one server thread."""

    def __init__(self, rt: ResourceType, selection: Selection, *, bookmarks: bool) -> None:
        self.rt = rt
        self.selection = selection
        self.bookmarks = bookmarks
        self._queue: queue.SimpleQueue[Change | _Bookmark | WatchEvent | None] = queue.SimpleQueue()
        self.closed = False

    def push(self, item: Change | _Bookmark | WatchEvent | None) -> None:
        self._queue.put(item)

    def next(self, timeout: float) -> WatchEvent | None:
        """The next event to send, or None when nothing came within ``timeout`` or the watch is closed."""
        deadline_left = timeout
        while not self.closed:
            try:
                item = self._queue.get(timeout=deadline_left)
            except queue.Empty:
                return None
            if item is None:
                self.closed = True
                return None
            event = self._translate(item)
            if event is not None:
                return event
            deadline_left = 0.001
        return None

    def _translate(self, item: Change | _Bookmark | WatchEvent) -> WatchEvent | None:
        if isinstance(item, WatchEvent):
            return item
        if isinstance(item, _Bookmark):
            if not self.bookmarks:
                return None
            meta: Obj = {"resourceVersion": str(item.rv)}
            if item.initial_events_end:
                meta["annotations"] = {"k8s.io/initial-events-end": "true"}
            return WatchEvent(
                "BOOKMARK", {"kind": self.rt.kind, "apiVersion": self.rt.group_version, "metadata": meta}
            )
        now_in = self.selection(item.obj)
        was_in = item.prev is not None and self.selection(item.prev)
        if item.type == "ADDED":
            return WatchEvent("ADDED", item.obj) if now_in else None
        if item.type == "DELETED":
            return WatchEvent("DELETED", item.obj) if was_in or now_in else None
        if now_in and was_in:
            return WatchEvent("MODIFIED", item.obj)
        if now_in:
            return WatchEvent("ADDED", item.obj)
        if was_in and item.prev is not None:
            # Leaving the selection looks like a deletion, carrying the old object at the new version.
            gone = copy.deepcopy(item.prev)
            gone["metadata"]["resourceVersion"] = str(item.rv)
            return WatchEvent("DELETED", gone)
        return None


def _meta(obj: Mapping[str, Any]) -> Obj:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _ident(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = _meta(obj)
    return (meta.get("namespace") or "", meta.get("name") or "")


def _without(obj: Mapping[str, Any], *keys: str) -> Obj:
    return {k: v for k, v in obj.items() if k not in keys}


class Store:
    """Thread-safe object storage with resourceVersions, history, watchers and the server's write rules."""

    def __init__(
        self, *, clock: VirtualClock | None = None, history_limit: int = 1000, seed: int = 0
    ) -> None:
        self.clock = clock or VirtualClock()
        self.history_limit = history_limit
        self._lock = threading.RLock()
        self._rng = random.Random(seed)
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self._rv = 0
        self._history: deque[Change] = deque()
        self._compacted = 0
        self._watchers: dict[tuple[str, str], set[Watcher]] = {}
        self.registry = Registry()
        namespaces = self.registry.resolve("namespaces")
        for name in BOOTSTRAP_NAMESPACES:
            self.create(namespaces, "", {"metadata": {"name": name}})

    # --- inspection (for tests) --------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        with self._lock:
            return self._rv

    def objects(self, resource: str, namespace: str = "") -> list[Obj]:
        """Stored objects of a resource (``pods``, ``jobs.batch``, ``workloads.kueue.x-k8s.io``)."""
        rt = self.registry.resolve(resource)
        with self._lock:
            found = [
                copy.deepcopy(obj)
                for (ns, _), obj in sorted(self._objects.get(rt.key, {}).items())
                if not namespace or ns == namespace
            ]
        return [self._at_version(obj, rt) for obj in found]

    def object(self, resource: str, name: str, namespace: str = "") -> Obj | None:
        rt = self.registry.resolve(resource)
        with self._lock:
            obj = self._objects.get(rt.key, {}).get((namespace if rt.namespaced else "", name))
            return self._at_version(copy.deepcopy(obj), rt) if obj is not None else None

    def history(self) -> list[Change]:
        """Retained changes, oldest first."""
        with self._lock:
            return list(self._history)

    # --- time, compaction, bookmarks ---------------------------------------------------------------

    def compact(self) -> int:
        """Forget all history: watching or continuing from any older resourceVersion now answers 410."""
        with self._lock:
            self._history.clear()
            self._compacted = self._rv
            return self._rv

    def send_bookmarks(self) -> int:
        """Send a BOOKMARK at the current resourceVersion to every watch that asked for bookmarks."""
        with self._lock:
            for watchers in self._watchers.values():
                for watcher in watchers:
                    watcher.push(_Bookmark(self._rv))
            return self._rv

    def advance(self, seconds: float) -> None:
        """Move the clock; bound pods whose grace period ran out are removed (the kubelet's part)."""
        with self._lock:
            self.clock.advance(seconds)
            pods = self.registry.resolve("pods")
            now = self.clock.now()
            for pod in list(self._objects.get(pods.key, {}).values()):
                meta = _meta(pod)
                due = meta.get("deletionTimestamp")
                if due and not meta.get("finalizers") and parse_timestamp(due) <= now:
                    self._remove(pods, pod)

    def close(self) -> None:
        """End every open watch."""
        with self._lock:
            for watchers in self._watchers.values():
                for watcher in watchers:
                    watcher.push(None)
            self._watchers.clear()

    # --- reads -------------------------------------------------------------------------------------

    def get(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        with self._lock:
            obj = self._find(rt, namespace, name)
            return self._at_version(copy.deepcopy(obj), rt)

    def list_page(
        self,
        rt: ResourceType,
        selection: Selection,
        *,
        resource_version: str = "",
        match: str = "",
        limit: int = 0,
        continue_token: str = "",
    ) -> ListResult:
        with self._lock:
            rv = self._rv
            start_after: tuple[str, str] | None = None
            if continue_token:
                rv, start_after = self._decode_continue(continue_token)
            elif match == "Exact":
                rv = self._parse_rv(resource_version)
                if rv > self._rv:
                    raise self._too_large(rv)
            elif resource_version not in ("", "0"):
                wanted = self._parse_rv(resource_version)
                if wanted > self._rv:
                    raise self._too_large(wanted)
            if rv < self._compacted:
                raise expired(f"too old resource version: {rv} ({self._compacted + 1})")
            state = self._state_at(rt.key, rv)
            keys = sorted(k for k in state if start_after is None or k > start_after)
            selected = [k for k in keys if selection(state[k])]
            page = selected[:limit] if limit > 0 else selected
            token, remaining = "", None
            if limit > 0 and len(selected) > limit:
                token = self._encode_continue(rv, page[-1])
                remaining = len(selected) - limit
            items = [self._at_version(copy.deepcopy(state[k]), rt) for k in page]
            return ListResult(items, rv, token, remaining)

    def watch(
        self,
        rt: ResourceType,
        selection: Selection,
        *,
        resource_version: str = "",
        bookmarks: bool = False,
        send_initial_events: bool | None = None,
    ) -> Watcher:
        """Open a watch. From "" or "0" (or with sendInitialEvents) it starts with the current objects.

        Raises ApiError 410 when ``resource_version`` is older than the retained history.
        """
        with self._lock:
            watcher = Watcher(rt, selection, bookmarks=bookmarks)
            initial = (
                send_initial_events if send_initial_events is not None else resource_version in ("", "0")
            )
            if initial:
                current = self._objects.get(rt.key, {})
                for key in sorted(current):
                    watcher.push(Change(self._rv, rt.key, "ADDED", current[key], None))
                if send_initial_events:
                    watcher.push(_Bookmark(self._rv, initial_events_end=True))
            else:
                since = self._parse_rv(resource_version)
                if since < self._compacted:
                    raise expired(f"too old resource version: {since} ({self._compacted + 1})")
                if since > self._rv:
                    raise self._too_large(since)
                for change in self._history:
                    if change.rv > since and change.key == rt.key:
                        watcher.push(change)
            self._watchers.setdefault(rt.key, set()).add(watcher)
            return watcher

    def stop_watch(self, watcher: Watcher) -> None:
        with self._lock:
            self._watchers.get(watcher.rt.key, set()).discard(watcher)
            watcher.closed = True

    # --- writes ------------------------------------------------------------------------------------

    def add(self, obj: Mapping[str, Any]) -> Obj:
        """Create an object straight from its manifest (apiVersion and kind pick the resource).

        Goes through the same defaulting and validation as an HTTP create; for seeding tests quickly.
        """
        rt = self.registry.by_kind(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        if rt is None:
            raise KeyError(f"no resource serves {obj.get('apiVersion')}/{obj.get('kind')}")
        namespace = _meta(obj).get("namespace") or ("default" if rt.namespaced else "")
        return self.create(rt, namespace, obj).object

    def create(
        self,
        rt: ResourceType,
        namespace: str,
        body: Any,
        *,
        dry_run: bool = False,
        field_validation: str = "",
    ) -> WriteResult:
        with self._lock:
            obj, warnings = self._decode(rt, namespace, body, field_validation)
            meta = obj["metadata"]
            if meta.get("resourceVersion"):
                raise ApiError(
                    500, "resourceVersion should not be set on objects to be created", "InternalError"
                )
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(
                    rt, meta["namespace"] if rt.namespaced else "", meta["generateName"]
                )
            for key in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
                meta.pop(key, None)
            meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
            meta["creationTimestamp"] = timestamp(self.clock.now())
            if rt.generation:
                meta["generation"] = 1
            else:
                meta.pop("generation", None)
            strategy = strategy_for(rt)
            strategy.default(obj)
            strategy.prepare_create(obj, timestamp(self.clock.now()))
            self._validate(rt, strategy, obj, creating=True)
            self._admit_namespace(rt, obj)
            if _ident(obj) in self._objects.get(rt.key, {}):
                raise already_exists(rt.plural, rt.group, meta["name"])
            if dry_run:
                return WriteResult(self._at_version(obj, rt), 201, warnings)
            self._commit(rt, obj, None)
            return WriteResult(self._at_version(copy.deepcopy(obj), rt), 201, warnings)

    def update(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        body: Any,
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "",
    ) -> WriteResult:
        with self._lock:
            old = self._find(rt, namespace, name)
            obj, warnings = self._decode(rt, namespace, body, field_validation)
            meta = obj["metadata"]
            if meta.get("name") and meta["name"] != name:
                raise bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the URL ({name})"
                )
            meta["name"] = name
            wanted_rv = meta.get("resourceVersion")
            if not wanted_rv and (rt.custom or rt.key == CRD.key):
                raise invalid(
                    rt.kind,
                    rt.group,
                    name,
                    [
                        Cause(
                            "metadata.resourceVersion",
                            "FieldValueInvalid",
                            "Invalid value: 0x0: must be specified for an update",
                        )
                    ],
                )
            if wanted_rv and wanted_rv != _meta(old)["resourceVersion"]:
                raise conflict(rt.plural, rt.group, name, STALE)
            return self._replace(rt, old, obj, subresource=subresource, dry_run=dry_run, warnings=warnings)

    def _replace(
        self,
        rt: ResourceType,
        old: Obj,
        obj: Obj,
        *,
        subresource: str,
        dry_run: bool,
        warnings: tuple[str, ...] = (),
    ) -> WriteResult:
        """Write ``obj`` over ``old`` (same identity), keeping what the endpoint may not change."""
        strategy = strategy_for(rt)
        old_meta, meta = _meta(old), obj["metadata"]
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise invalid(rt.kind, rt.group, old_meta["name"], [immutable("metadata.uid", meta["uid"])])
        if subresource == "status":
            new = copy.deepcopy(old)
            if "status" in obj:
                new["status"] = obj["status"]
            else:
                new.pop("status", None)
            obj = new
        else:
            if rt.has_status:
                if "status" in old:
                    obj["status"] = copy.deepcopy(old["status"])
                else:
                    obj.pop("status", None)
            for key in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
            ):
                if key in old_meta:
                    meta[key] = old_meta[key]
                else:
                    meta.pop(key, None)
            meta.pop("managedFields", None)
        obj["metadata"]["resourceVersion"] = old_meta["resourceVersion"]
        strategy.default(obj)
        if subresource == "status":
            causes = strategy.validate_status(obj)
            if causes:
                raise invalid(rt.kind, rt.group, old_meta["name"], causes)
        else:
            self._validate(rt, strategy, obj, creating=False)
            causes = strategy.validate_update(obj, old)
            if old_meta.get("deletionTimestamp"):
                added = [
                    f for f in meta.get("finalizers") or [] if f not in (old_meta.get("finalizers") or [])
                ]
                if added:
                    causes.append(
                        Cause(
                            "metadata.finalizers",
                            "FieldValueForbidden",
                            "Forbidden: no new finalizers can be added if the object is being deleted, "
                            f"found new finalizers {added}",
                        )
                    )
            if causes:
                raise invalid(rt.kind, rt.group, old_meta["name"], causes)
            if rt.generation and _without(obj, "metadata", "status") != _without(old, "metadata", "status"):
                meta["generation"] = int(old_meta.get("generation", 0)) + 1
        if obj == old:
            return WriteResult(self._at_version(copy.deepcopy(old), rt), 200, warnings)
        if dry_run:
            return WriteResult(self._at_version(obj, rt), 200, warnings)
        self._commit(rt, obj, old)
        if (
            obj["metadata"].get("deletionTimestamp")
            and not obj["metadata"].get("finalizers")
            and not self._waiting_for_grace(rt, obj)
        ):
            self._remove(rt, obj)
        return WriteResult(self._at_version(copy.deepcopy(obj), rt), 200, warnings)

    def patch(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        apply: Callable[[Obj], Any],
        *,
        subresource: str = "",
        dry_run: bool = False,
        field_validation: str = "",
        create_if_missing: bool = False,
    ) -> WriteResult:
        """Patch the current object with ``apply`` (a patch function) and write the result.

        A resourceVersion the patch itself carries is a precondition, as for an update.
        """
        with self._lock:
            key = (namespace if rt.namespaced else "", name)
            current = self._objects.get(rt.key, {}).get(key)
            if current is None:
                if not create_if_missing:
                    raise not_found(rt.plural, rt.group, name)
                body = apply({"apiVersion": rt.group_version, "kind": rt.kind, "metadata": {"name": name}})
                return self.create(rt, namespace, body, dry_run=dry_run, field_validation=field_validation)
            patched = apply(self._at_version(copy.deepcopy(current), rt))
            if not isinstance(patched, dict):
                raise bad_request("the patch must produce an object")
            meta: Obj = patched["metadata"] if isinstance(patched.get("metadata"), dict) else {}
            if meta.get("name", name) != name:
                raise bad_request(
                    f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
                )
            if meta.get("resourceVersion") and meta["resourceVersion"] != _meta(current)["resourceVersion"]:
                raise conflict(rt.plural, rt.group, name, STALE)
            obj, warnings = self._decode(rt, namespace, patched, field_validation)
            return self._replace(
                rt, current, obj, subresource=subresource, dry_run=dry_run, warnings=warnings
            )

    def delete(
        self,
        rt: ResourceType,
        namespace: str,
        name: str,
        options: Mapping[str, Any] | None = None,
        *,
        dry_run: bool = False,
    ) -> WriteResult:
        with self._lock:
            options = options or {}
            obj = self._find(rt, namespace, name)
            meta = _meta(obj)
            preconditions = options.get("preconditions") or {}
            if preconditions.get("uid") and preconditions["uid"] != meta["uid"]:
                raise conflict(
                    rt.plural,
                    rt.group,
                    name,
                    f"Precondition failed: UID in precondition: {preconditions['uid']}, "
                    f"UID in object meta: {meta['uid']}",
                )
            if (
                preconditions.get("resourceVersion")
                and preconditions["resourceVersion"] != meta["resourceVersion"]
            ):
                raise conflict(
                    rt.plural,
                    rt.group,
                    name,
                    "Precondition failed: ResourceVersion in precondition: "
                    f"{preconditions['resourceVersion']}, "
                    f"ResourceVersion in object meta: {meta['resourceVersion']}",
                )
            if dry_run:
                return WriteResult(self._at_version(copy.deepcopy(obj), rt), 200)
            return self._delete(rt, obj, options)

    def delete_collection(
        self, rt: ResourceType, selection: Selection, options: Mapping[str, Any] | None = None
    ) -> list[Obj]:
        with self._lock:
            doomed = [obj for obj in self._objects.get(rt.key, {}).values() if selection(obj)]
            return [self._delete(rt, obj, options or {}).object for obj in doomed]

    # --- pod subresources --------------------------------------------------------------------------

    def bind(
        self, pods: ResourceType, namespace: str, name: str, binding: Any, *, dry_run: bool = False
    ) -> None:
        """The ``pods/binding`` subresource: set spec.nodeName once, and mark the pod scheduled."""
        with self._lock:
            if not isinstance(binding, Mapping):
                raise bad_request("binding must be an object")
            target = binding.get("target") or {}
            bmeta = binding.get("metadata") or {}
            if bmeta.get("name") and bmeta["name"] != name:
                raise bad_request("name in URL does not match name in Binding object")
            if bmeta.get("namespace") and bmeta["namespace"] != namespace:
                raise bad_request("namespace in URL does not match namespace in Binding object")
            if target.get("kind") not in (None, "", "Node"):
                raise invalid(
                    "Binding",
                    "",
                    name,
                    [
                        Cause(
                            "target.kind",
                            "FieldValueNotSupported",
                            f'Unsupported value: "{target.get("kind")}": supported values: "Node"',
                        )
                    ],
                )
            node = target.get("name")
            if not node:
                raise invalid("Binding", "", name, [required("target.name")])
            pod = self._find(pods, namespace, name)
            meta, spec = _meta(pod), pod.get("spec") or {}
            if meta.get("deletionTimestamp"):
                raise conflict(
                    "pods/binding", "", name, f"pod {name} is being deleted, cannot be assigned to a host"
                )
            if spec.get("nodeName"):
                raise conflict(
                    "pods/binding", "", name, f'pod {name} is already assigned to node "{spec["nodeName"]}"'
                )
            if spec.get("schedulingGates"):
                raise conflict("pods/binding", "", name, f"pod {name} has non-empty .spec.schedulingGates")
            if dry_run:
                return
            new = copy.deepcopy(pod)
            new["spec"]["nodeName"] = node
            annotations = bmeta.get("annotations") or {}
            if annotations:
                new["metadata"].setdefault("annotations", {}).update(annotations)
            conditions = [
                c
                for c in new.setdefault("status", {}).get("conditions") or []
                if c.get("type") != "PodScheduled"
            ]
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "True",
                    "lastProbeTime": None,
                    "lastTransitionTime": timestamp(self.clock.now()),
                }
            )
            new["status"]["conditions"] = conditions
            self._commit(pods, new, pod)

    def evict(
        self, pods: ResourceType, namespace: str, name: str, eviction: Any, *, dry_run: bool = False
    ) -> None:
        """The ``pods/eviction`` subresource: delete the pod with the eviction's delete options."""
        with self._lock:
            if not isinstance(eviction, Mapping):
                raise bad_request("eviction must be an object")
            emeta = eviction.get("metadata") or {}
            if emeta.get("name") and emeta["name"] != name:
                raise bad_request("name in URL does not match name in Eviction object")
            pod = self._find(pods, namespace, name)
            if dry_run or _meta(pod).get("deletionTimestamp"):
                return
            self._delete(pods, pod, eviction.get("deleteOptions") or {})

    # --- internals ---------------------------------------------------------------------------------

    def _find(self, rt: ResourceType, namespace: str, name: str) -> Obj:
        obj = self._objects.get(rt.key, {}).get((namespace if rt.namespaced else "", name))
        if obj is None:
            raise not_found(rt.plural, rt.group, name)
        return obj

    @staticmethod
    def _at_version(obj: Obj, rt: ResourceType) -> Obj:
        obj["apiVersion"] = rt.group_version
        obj["kind"] = rt.kind
        return obj

    def _decode(
        self, rt: ResourceType, namespace: str, body: Any, field_validation: str
    ) -> tuple[Obj, tuple[str, ...]]:
        """Check a request body is an object of this endpoint, and drop (or refuse) unknown fields."""
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        obj = copy.deepcopy(body)
        api_version, kind = obj.get("apiVersion"), obj.get("kind")
        if kind and kind != rt.kind:
            raise bad_request(
                f"the kind in the body ({kind}) does not match the kind of the endpoint ({rt.kind})"
            )
        if api_version and api_version != rt.group_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API version "
                f"({rt.group_version})"
            )
        obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            if meta.get("namespace") and meta["namespace"] != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        unknown = [f"metadata.{k}" for k in meta if k not in KNOWN_METADATA]
        for key in unknown:
            meta.pop(key.removeprefix("metadata."), None)
        if rt.custom:
            unknown += [
                path.lstrip(".")
                for path in crd_schema.prune(rt.schema or {"x-kubernetes-preserve-unknown-fields": True}, obj)
            ]
        elif rt.kind in TOP_LEVEL_FIELDS:
            allowed = TOP_LEVEL_FIELDS[rt.kind] | {"apiVersion", "kind", "metadata"}
            unknown += [k for k in list(obj) if k not in allowed]
        else:
            unknown += [k for k in obj if k not in ("apiVersion", "kind", "metadata", "spec", "status")]
        for key in unknown:
            if "." not in key:
                obj.pop(key, None)
        if not unknown:
            return obj, ()
        if field_validation == "Strict":
            listed = ", ".join(f'unknown field "{k}"' for k in unknown)
            raise bad_request(f"strict decoding error: {listed}")
        if field_validation == "Ignore":
            return obj, ()
        return obj, tuple(f'unknown field "{k}"' for k in unknown)

    def _validate(self, rt: ResourceType, strategy: Strategy, obj: Obj, *, creating: bool) -> None:
        causes = object_meta(obj["metadata"], strategy.name_rule, creating=creating) + strategy.validate(obj)
        if causes:
            meta = obj["metadata"]
            raise invalid(rt.kind, rt.group, meta.get("name") or meta.get("generateName") or "", causes)

    def _admit_namespace(self, rt: ResourceType, obj: Obj) -> None:
        if not rt.namespaced:
            return
        namespace = obj["metadata"]["namespace"]
        found = self._objects.get(("", "namespaces"), {}).get(("", namespace))
        if found is None:
            raise not_found("namespaces", "", namespace)
        if _meta(found).get("deletionTimestamp"):
            raise forbidden(
                f'{rt.kind.lower()} "{obj["metadata"]["name"]}" is forbidden: unable to create new content '
                f"in namespace {namespace} because it is being terminated"
            )

    def _generate_name(self, rt: ResourceType, namespace: str, prefix: str) -> str:
        taken = self._objects.get(rt.key, {})
        while True:
            name = prefix[:58] + "".join(self._rng.choice(_GENERATE_NAME_ALPHABET) for _ in range(5))
            if (namespace, name) not in taken:
                return name

    def _next_rv(self) -> int:
        self._rv += 1
        return self._rv

    def _record(self, change: Change) -> None:
        self._history.append(change)
        while len(self._history) > self.history_limit:
            self._compacted = self._history.popleft().rv
        for watcher in self._watchers.get(change.key, ()):
            watcher.push(change)

    def _commit(self, rt: ResourceType, obj: Obj, old: Obj | None) -> None:
        rv = self._next_rv()
        obj["metadata"]["resourceVersion"] = str(rv)
        self._objects.setdefault(rt.key, {})[_ident(obj)] = obj
        self._record(Change(rv, rt.key, "MODIFIED" if old is not None else "ADDED", obj, old))
        if rt.key == CRD.key:
            self._refresh_registry()

    def _remove(self, rt: ResourceType, obj: Obj, *, orphan: bool = False) -> Obj:
        """Take an object out of storage for good, then let its dependents follow (or orphan them)."""
        ident = _ident(obj)
        stored = self._objects.get(rt.key, {}).pop(ident, None)
        if stored is None:
            return obj
        final = copy.deepcopy(stored)
        final["metadata"]["resourceVersion"] = str(self._next_rv())
        self._record(Change(self._rv, rt.key, "DELETED", final, stored))
        if rt.key == CRD.key:
            self._drop_custom_resources(stored)
        if rt.key == ("", "namespaces"):
            return final
        self._collect_garbage(_meta(stored)["uid"], orphan=orphan)
        if rt.namespaced:
            self._finish_namespace(ident[0])
        return final

    def _delete(self, rt: ResourceType, obj: Obj, options: Mapping[str, Any]) -> WriteResult:
        meta = _meta(obj)
        orphan = options.get("propagationPolicy") == "Orphan" or options.get("orphanDependents") is True
        if rt.key == ("", "namespaces"):
            return self._delete_namespace(rt, obj)
        grace = self._grace_period(rt, obj, options)
        if meta.get("finalizers") or grace > 0:
            return self._mark_deleting(rt, obj, grace)
        final = self._remove(rt, obj, orphan=orphan)
        if rt.kind in _RETURNS_DELETED_OBJECT:
            return WriteResult(self._at_version(copy.deepcopy(final), rt), 200)
        details = {"name": meta["name"], "kind": rt.plural, "uid": meta["uid"]}
        if rt.group:
            details["group"] = rt.group
        return WriteResult(
            {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details},
            200,
        )

    def _grace_period(self, rt: ResourceType, obj: Obj, options: Mapping[str, Any]) -> int:
        """Only bound, unfinished pods wait for a grace period; everything else goes at once."""
        if rt.key != ("", "pods"):
            return 0
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
            return 0
        wanted = options.get("gracePeriodSeconds")
        grace = int(wanted if wanted is not None else spec.get("terminationGracePeriodSeconds", 30))
        current = _meta(obj).get("deletionGracePeriodSeconds")
        return min(grace, current) if current is not None else max(grace, 0)

    def _waiting_for_grace(self, rt: ResourceType, obj: Obj) -> bool:
        due = _meta(obj).get("deletionTimestamp")
        return rt.key == ("", "pods") and isinstance(due, str) and parse_timestamp(due) > self.clock.now()

    def _mark_deleting(self, rt: ResourceType, obj: Obj, grace: int) -> WriteResult:
        meta = _meta(obj)
        due = timestamp(self.clock.now() + timedelta(seconds=grace))
        if meta.get("deletionTimestamp") and meta.get("deletionGracePeriodSeconds", 0) <= grace:
            return WriteResult(self._at_version(copy.deepcopy(obj), rt), 202)
        new = copy.deepcopy(obj)
        new["metadata"]["deletionTimestamp"] = due
        new["metadata"]["deletionGracePeriodSeconds"] = grace
        self._commit(rt, new, obj)
        return WriteResult(self._at_version(copy.deepcopy(new), rt), 202)

    def _delete_namespace(self, rt: ResourceType, namespace: Obj) -> WriteResult:
        """Namespaces terminate: their content is deleted, and they go once it is all gone."""
        name = _meta(namespace)["name"]
        if not _meta(namespace).get("deletionTimestamp"):
            new = copy.deepcopy(namespace)
            new["metadata"]["deletionTimestamp"] = timestamp(self.clock.now())
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            new["status"] = {"phase": "Terminating"}
            self._commit(rt, new, namespace)
            namespace = new
            for other in self.registry.all():
                if other.namespaced:
                    for (ns, _), obj in list(self._objects.get(other.key, {}).items()):
                        if ns == name:
                            self._delete(other, obj, {"gracePeriodSeconds": 0})
        if self._finish_namespace(name):
            return WriteResult(self._at_version(copy.deepcopy(namespace), rt), 200)
        return WriteResult(self._at_version(copy.deepcopy(self._objects[rt.key][("", name)]), rt), 202)

    def _finish_namespace(self, name: str) -> bool:
        """Remove a terminating namespace once nothing is left in it. True when it is gone."""
        namespaces = self._objects.get(("", "namespaces"), {})
        namespace = namespaces.get(("", name))
        if namespace is None:
            return True
        if not _meta(namespace).get("deletionTimestamp"):
            return False
        for key, objs in self._objects.items():
            rt = self.registry.by_key(key)
            if rt is not None and rt.namespaced and any(ns == name for ns, _ in objs):
                return False
        self._remove(self.registry.resolve("namespaces"), namespace)
        return True

    def _collect_garbage(self, owner_uid: str, *, orphan: bool) -> None:
        live_uids = {_meta(o)["uid"] for objs in self._objects.values() for o in objs.values()}
        for key, objs in list(self._objects.items()):
            rt = self.registry.by_key(key)
            if rt is None:
                continue
            for obj in list(objs.values()):
                refs = _meta(obj).get("ownerReferences") or []
                if not any(ref.get("uid") == owner_uid for ref in refs):
                    continue
                if orphan:
                    new = copy.deepcopy(obj)
                    new["metadata"]["ownerReferences"] = [
                        r for r in refs if r.get("uid") != owner_uid
                    ] or None
                    if new["metadata"]["ownerReferences"] is None:
                        del new["metadata"]["ownerReferences"]
                    self._commit(rt, new, obj)
                elif not any(ref.get("uid") in live_uids for ref in refs) and _ident(obj) in objs:
                    self._delete(rt, obj, {})

    def _drop_custom_resources(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        key = (spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))
        rt = self.registry.by_key(key)
        for obj in list(self._objects.get(key, {}).values()):
            if rt is not None:
                self._remove(rt, obj)
        self._objects.pop(key, None)
        self._refresh_registry()

    def _refresh_registry(self) -> None:
        crds = [
            obj for obj in self._objects.get(CRD.key, {}).values() if not _meta(obj).get("deletionTimestamp")
        ]
        self.registry = Registry(crds)

    def _state_at(self, key: tuple[str, str], rv: int) -> dict[tuple[str, str], Obj]:
        """The objects of a resource as they were at ``rv``, by undoing later changes."""
        state = dict(self._objects.get(key, {}))
        for change in reversed(self._history):
            if change.rv <= rv:
                break
            if change.key != key:
                continue
            ident = _ident(change.obj)
            if change.type == "ADDED":
                state.pop(ident, None)
            elif change.prev is not None:
                state[ident] = change.prev
        return state

    @staticmethod
    def _parse_rv(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise bad_request(f"invalid resource version: {text!r}") from None
        if value < 0:
            raise bad_request(f"invalid resource version: {text!r}")
        return value

    def _too_large(self, rv: int) -> ApiError:
        return ApiError(
            504,
            f"Too large resource version: {rv}, current: {self._rv}",
            "Timeout",
            {
                "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
                "retryAfterSeconds": 1,
            },
        )

    @staticmethod
    def _encode_continue(rv: int, last: tuple[str, str]) -> str:
        raw = json.dumps({"v": "double/v1", "rv": rv, "start": list(last)}).encode()
        return base64.urlsafe_b64encode(raw).decode()

    @staticmethod
    def _decode_continue(token: str) -> tuple[int, tuple[str, str]]:
        try:
            data = json.loads(base64.urlsafe_b64decode(token.encode()))
            return int(data["rv"]), (str(data["start"][0]), str(data["start"][1]))
        except (ValueError, KeyError, IndexError, TypeError):
            raise bad_request("continue key is not valid") from None
