"""The controller's one long-lived scheduling session, fed with what changed in the informer cache.

A pass used to parse every cached object and build a fresh :class:`Session`. Now the session lives
as long as the controller leads, and each pass hands it only the objects that changed since the
last pass (the cache notes them, see :meth:`Cache.take_changes`), each parsed once, as events:

=========================================  ===================================================
change in the cache                        event
=========================================  ===================================================
new Workload, not admitted                 ``submit``
pending Workload, spec/labels changed      ``update`` (queued again with its new spec)
pending Workload, only status changed      nothing (a pending condition the controller wrote)
admitted Workload the session holds        ``update`` (its object: annotations, conditions)
Workload finished                          ``finish`` (admitted) or ``withdraw`` (pending)
pending Workload deleted                   ``withdraw``
Node labels, taints, schedulability        ``node_changed``
pod bound, or ended, of a held Workload    nothing (the Workload holds its planned devices)
warm-buffer placeholder pod                nothing (the core never counts them)
Job                                        nothing (the state holds Workloads, not Jobs)
=========================================  ===================================================

Anything else rebuilds the session from the whole cache, as every pass did before: the first pass
and each one after a leader change, a change of a queue, flavor, cohort, priority class, topology,
admission check, namespace, DRA object (DeviceClass, ResourceSlice, ResourceClaim,
ResourceClaimTemplate) or of Kueue's Configuration, a node added, removed or resized, a pod that
holds devices outside a Workload the session holds, a Workload whose admission the cluster and the
session disagree on (an admission written by someone else, or lost; an eviction), a Workload with
admission checks, an invalid Workload, time running backwards, and every ``resync_seconds``. The
controller also asks for one after a pass whose plan the cluster does not show yet in full: one that
preempted (victims hold their quota until their jobs stop, which only the cluster shows), one with a
failed write, and one that chose other devices at bind time than the plan did.

The parsed objects are kept, so :meth:`LiveSession.state` assembles the cluster state (for the
pass observers: metrics, visibility, ETA) without parsing anything again.

Parked workloads (those that did not fit) are tried again only when capacity is freed, as in
Kueue's queues; after passes that took capacity, the first pass that sees no change looks at
them once more (at most once every ``reconsider_seconds``: a look costs one cycle per parked
workload), so the reasons shown on pending Workloads are those of the cluster as it is.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from gpuplane.core.session import Reason, SchedulerConfig, Session
from gpuplane.k8s.clusterstate import state_objects, typed
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.integrations import recorded_reclaimable
from gpuplane.model import labels as keys
from gpuplane.model.conditions import condition_true
from gpuplane.model.dra_quota import charge_claims
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects
from gpuplane.model.objects import ClusterState, Node, Pod, Workload

log = logging.getLogger(__name__)

Get = Callable[[str, str], dict[str, Any] | None]
Items = Callable[[str], list[dict[str, Any]]]

# Kinds fed to the session as events; a change of any other kind the state reads rebuilds it.
_FED = frozenset(("Workload", "Pod", "Node"))
_STATE_KINDS = frozenset(
    (
        "Namespace",
        "ResourceFlavor",
        "Cohort",
        "ClusterQueue",
        "LocalQueue",
        "WorkloadPriorityClass",
        "Topology",
        "AdmissionCheck",
        "NodePool",
        # Dynamic Resource Allocation: devices published, classes, claims allocated or released.
        "DeviceClass",
        "ResourceSlice",
        "ResourceClaim",
        "ResourceClaimTemplate",
        "DeviceTaintRule",
        # Kueue's Configuration, from its ConfigMap (device class mappings among others).
        "Configuration",
    )
)
_HOLDING_PHASES = (None, "Pending", "Running")


def _kind_of(why: str) -> str:
    """A rebuild's reason without the object it names: ``workload evicted: ns/a`` -> ``workload evicted``."""
    return why.partition(":")[0]


class Rebuild(Exception):  # noqa: N818 (a signal, not an error: the change is not fed, the session rebuilt)
    """A change the session cannot take as an event: rebuild from the whole cache."""


def _holds_devices(pod: Mapping[str, Any] | None) -> bool:
    """Whether the cluster state counts the pod (bound to a node, not terminated)."""
    return (
        pod is not None
        and bool((pod.get("spec") or {}).get("nodeName"))
        and (pod.get("status") or {}).get("phase") in _HOLDING_PHASES
    )


def _spec_of(obj: Mapping[str, Any]) -> tuple[Any, ...]:
    """What of a pending Workload object the core reads, less its status."""
    meta = obj.get("metadata") or {}
    return (obj.get("spec"), meta.get("labels"), meta.get("annotations"), meta.get("creationTimestamp"))


class LiveSession:
    """One :class:`Session` kept across passes and fed with the cache's changes (module docstring)."""

    def __init__(self, config_for: Callable[[ClusterState], SchedulerConfig], resync_seconds: float = 300.0):
        self.config_for = config_for
        self.resync_seconds = resync_seconds
        self.session: Session | None = None
        self.rebuilds = 0  # passes that built the session from the whole cache
        self.rebuilds_seen = 0  # for the caller: the rebuilds it has logged the skipped objects of
        self.fed = 0  # passes that fed it the changes only
        self.last_rebuild_reason = ""
        self.rebuild_reasons: Counter[str] = Counter()  # why, by the reason's kind (its words, less names)
        # Set by the caller after a pass that admitted something: once a pass sees no change, the
        # parked workloads are looked at again, so the reasons shown are those of the cluster now.
        self.settle = False
        # A look costs a cycle per parked workload: at most one per this many seconds.
        self.reconsider_seconds = 10.0
        self._reconsidered_at = -math.inf
        self.skipped: list[InputError] = []  # invalid objects left out at the last rebuild
        self._stale: str | None = "first pass"
        self._built_at = 0.0
        self._base = ClusterState()
        self._workloads: dict[str, Workload] = {}
        self._specs: dict[str, tuple[Any, ...]] = {}
        self._pods: dict[str, Pod] = {}
        self._nodes: dict[str, Node] = {}
        self._invalid: set[str] = set()
        self._priorities: dict[str, dict[str, Any]] = {}

    def invalidate(self, why: str) -> None:
        """Make the next :meth:`sync` rebuild (the first reason given is kept)."""
        if self._stale is None:
            self._stale = why

    # --- one pass ------------------------------------------------------------------------------

    def sync(
        self,
        items: Items,
        get: Get,
        changes: Mapping[str, set[str]],
        now: float,
    ) -> Session:
        """The session, up to date with the cache: fed ``changes`` (keys by kind, from the cache; a
        relist notes the keys that differ from the copy it replaced),
        or rebuilt from ``items`` when they cannot be fed. Raises :class:`InputError` when the
        cluster's state as a whole is refused (the session is then rebuilt on the next call)."""
        why = self._stale
        session = self.session
        if why is None:
            if session is None:
                why = "no session"
            elif now < session.now:
                why = "the clock went back"
            elif now - self._built_at >= self.resync_seconds:
                why = "periodic resync"
            elif changed := sorted(set(changes) & _STATE_KINDS):
                why = f"queues, flavors or namespaces changed: {changed[0]}"
        if why is None and session is not None:
            try:
                self._feed(session, get, changes, now)
            except Rebuild as reason:
                why = str(reason)
            except (InputError, ValueError) as err:
                why = f"event refused: {err}"
            else:
                self.fed += 1
                quiet = not any(changes.values())
                if self.settle and quiet and now - self._reconsidered_at >= self.reconsider_seconds:
                    # Nothing changed since a pass that took capacity: the parked workloads were
                    # last tried before it was taken, and their reasons may be stale.
                    session.reconsider(now)
                    self.settle = False
                    self._reconsidered_at = now
                return session
        return self._rebuild(items, now, why or "no session")

    def _rebuild(self, items: Items, now: float, why: str) -> Session:
        self.session = None
        self._stale = "the last rebuild failed"
        skipped: list[InputError] = []
        state = state_from_objects(state_objects(items), skipped=skipped)
        self.skipped = skipped
        self.session, state = self._session_without_bad_nodes(state, now)
        self._base = replace(state, workloads=(), pods=(), nodes=())
        self._workloads = {wl.key: wl for wl in state.workloads}
        self._specs = {object_key(wl): _spec_of(wl) for wl in items("Workload")}
        self._pods = {pod.key: pod for pod in state.pods}
        self._nodes = {node.name: node for node in state.nodes}
        self._invalid = {bad.key for bad in state.invalid_workloads}
        self._priorities = {pc["metadata"]["name"]: pc for pc in items("WorkloadPriorityClass")}
        self._built_at = now
        self._stale = None
        self.rebuilds += 1
        self.last_rebuild_reason = why
        self.rebuild_reasons[_kind_of(why)] += 1
        log.debug("scheduling session rebuilt: %s", why)
        return self.session

    def _session_without_bad_nodes(self, state: ClusterState, now: float) -> tuple[Session, ClusterState]:
        """A session on ``state``; a Node the core refuses (a device count no node has, a MIG layout
        that cannot be) is left out, its error kept in :attr:`skipped`, and the rest is scheduled."""
        while True:
            try:
                return Session(state, self.config_for(state), now, track_reasons=False), state
            except InputError as err:
                bad = (err.obj or "").removeprefix("Node/")
                if not (err.obj or "").startswith("Node/") or all(n.name != bad for n in state.nodes):
                    raise
                self.skipped.append(err)
                state = replace(state, nodes=tuple(n for n in state.nodes if n.name != bad))

    # --- feeding -------------------------------------------------------------------------------

    def _parse(self, kind: str, objects: Sequence[dict[str, Any]]) -> ClusterState:
        """The changed objects of one kind, parsed by the same loader as a rebuild (Workloads with
        the priority classes they name)."""
        if not objects:
            return ClusterState()
        docs = [typed(obj, kind) for obj in objects]
        if kind == "Workload":
            docs = [typed(pc, "WorkloadPriorityClass") for pc in self._priorities.values()] + docs
        skipped: list[InputError] = []
        state = state_from_objects(docs, skipped=skipped)
        if kind == "Workload" and self._base.configuration.device_class_mappings:
            # Claims are charged as a rebuild charges them: with the cluster's mappings and templates.
            state = charge_claims(replace(state, configuration=self._base.configuration, dra=self._base.dra))
        if skipped or state.invalid_workloads:
            raise Rebuild(f"invalid object: {kind}")
        return state

    def _feed(self, session: Session, get: Get, changes: Mapping[str, set[str]], now: float) -> None:
        for name in sorted(changes.get("Node", ())):
            self._feed_node(session, name, get("Node", name), now)
        # The objects to parse are parsed together, in one call of the loader.
        workloads = []
        for key in sorted(changes.get("Workload", ())):
            obj = get("Workload", key)
            if self._workload_event(session, key, obj, now) and obj is not None:
                workloads.append(obj)
        for wl, obj in zip(self._parse("Workload", workloads).workloads, workloads, strict=True):
            if session.holds(wl.key) or wl.key in self._workloads:
                session.update(wl, now)
            else:
                session.submit(wl, now)
            self._workloads[wl.key] = wl
            self._specs[wl.key] = _spec_of(obj)
        pods = []
        for key in sorted(changes.get("Pod", ())):
            obj = get("Pod", key)
            if self._pod_event(session, key, obj) and obj is not None:
                pods.append(obj)
        for pod in self._parse("Pod", pods).pods:
            self._pods[pod.key] = pod

    def _feed_node(self, session: Session, name: str, obj: dict[str, Any] | None, now: float) -> None:
        known = self._nodes.get(name)
        if obj is None or known is None:
            raise Rebuild(f"node {'removed' if obj is None else 'added'}: {name}")
        (node,) = self._parse("Node", [obj]).nodes
        if node == known:
            return
        if dict(node.allocatable) != dict(known.allocatable):
            raise Rebuild(f"node resized: {name}")
        session.node_changed(node, now)
        self._nodes[name] = node

    def _workload_event(self, session: Session, key: str, obj: dict[str, Any] | None, now: float) -> bool:
        """Feed a Workload's finish or removal; True when it is to be parsed and submitted or
        updated."""
        if key in self._invalid:
            raise Rebuild(f"invalid workload changed: {key}")
        held = session.holds(key)
        if obj is None or condition_true(obj, "Finished"):
            if held and obj is None:
                raise Rebuild(f"admitted workload deleted: {key}")  # its pods may still run
            if held:
                session.finish(key, now, Reason.FINISHED)
            else:
                session.withdraw(key, now)
            self._workloads.pop(key, None)
            self._specs.pop(key, None)
            return False
        status = obj.get("status") or {}
        if status.get("admissionChecks"):
            raise Rebuild(f"workload with admission checks: {key}")
        admitted = bool(status.get("admission"))
        if admitted != held:
            raise Rebuild(f"the cluster {'shows' if admitted else 'lacks'} an admission: {key}")
        if admitted and condition_true(obj, "Evicted"):
            raise Rebuild(f"workload evicted: {key}")
        known = self._workloads.get(key)
        if admitted and known is not None and recorded_reclaimable(obj) != dict(known.reclaimable):
            raise Rebuild(f"pods of an admitted workload ended: {key}")  # its quota and devices shrink
        # A pending one whose status alone changed (the pending condition the controller wrote):
        # nothing to tell the session.
        return admitted or key not in self._workloads or self._specs.get(key) != _spec_of(obj)

    def _pod_event(self, session: Session, key: str, obj: dict[str, Any] | None) -> bool:
        """Check a pod's change; True when it holds devices now and is to be parsed."""
        known = self._pods.get(key)
        if known is None and not _holds_devices(obj):
            return False  # neither counted before nor now: a pod not bound yet, or ended
        labels = dict(known.template.labels) if known is not None else {}
        if obj is not None:
            labels.update((obj.get("metadata") or {}).get("labels") or {})
        if keys.WARM_BUFFER_LABEL not in labels:
            owner = labels.get(keys.WORKLOAD_LABEL)
            namespace = key.partition("/")[0]
            if not owner or not session.holds(f"{namespace}/{owner}"):
                raise Rebuild(f"pod holds devices outside an admitted workload: {key}")
        if obj is None or not _holds_devices(obj):
            self._pods.pop(key, None)
            return False
        return True

    # --- views ---------------------------------------------------------------------------------

    def claim_charges(self, workload: str, pod_set: str) -> Mapping[str, int] | None:
        """What one pod of ``workload``'s pod set is charged against quota, where its claims are
        charged (Kueue's deviceClassMappings, the extended-resource path); else ``None``."""
        wl = self._workloads.get(workload)
        for ps in wl.pod_sets if wl is not None else ():
            if ps.name == pod_set and (ps.template.claim_quota or ps.template.claim_replaced):
                return ps.template.quota_requests
        return None

    def state(self) -> ClusterState:
        """The cluster state the session stands for, assembled from the parsed objects."""
        return replace(
            self._base,
            workloads=tuple(self._workloads[k] for k in sorted(self._workloads)),
            nodes=tuple(self._nodes[k] for k in sorted(self._nodes)),
            pods=tuple(self._pods[k] for k in sorted(self._pods)),
        )
