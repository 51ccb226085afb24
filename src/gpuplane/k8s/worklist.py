"""What a controller pass may have to act on, kept from the informer cache's changes.

The scheduling session is fed only with what changed (see :mod:`gpuplane.k8s.live_session`); the
steps that carry a plan out would still look at every cached object on each pass: which jobs lack a
Workload, which evicted Workloads still hold quota, which admitted jobs are not released yet or have
pods not bound. A :class:`Worklist` keeps, from the keys the cache notes as changed
(:meth:`Cache.take_changes`):

- the pod index: pod keys by namespace and what ties them to a Workload (workload label, pod-group
  label, name), and bound pod keys by node;
- what ties each Workload to its job and pods (its job-uid label, its owner references), so that a
  changed job or pod names the Workloads it belongs to;
- the evicted Workloads that still hold their admission (each needs work on every pass until it
  gives its quota back);
- the devices each admitted Workload's recorded plan gives its pods, by node: a plan holds its
  devices from the moment it is made, before any pod of it is bound (or even exists), so the
  devices chosen at bind time for another Workload's pod leave them alone;
- candidates: Workloads that may need a release or bindings, jobs and pod groups that may need a
  Workload. A step looks at its candidates and drops those that need nothing; a change of the object
  or of one tied to it makes it a candidate again.

A full sweep (every object a candidate, the indexes rebuilt from the whole cache) is the safety net:
the controller asks for one whenever its scheduling session is rebuilt (the first pass, a leader
change, a change of queues or priority classes, and the session's periodic resync) and when a
Workload is deleted (the job it belonged to may need a new one).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuplane.k8s.informer import object_key
from gpuplane.k8s.spot import interruption
from gpuplane.model import labels as keys
from gpuplane.model.conditions import ConditionType, condition_true
from gpuplane.model.labels import PLACEMENT_ANNOTATION
from gpuplane.model.objects import WARM_BUFFER_LABEL
from gpuplane.model.records import recorded_placement

Get = Callable[[str, str], dict[str, Any] | None]
Items = Callable[[str], list[dict[str, Any]]]

PodTie = tuple[str, str, str]  # (namespace, "workload" | "group" | "name", value)
_POD_TIES = (("workload", keys.WORKLOAD_LABEL), ("group", keys.POD_GROUP_LABEL))


def gated(pod: Mapping[str, Any]) -> bool:
    """Whether the pod waits behind gpuplane's admission gate."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return any(g.get("name") == keys.ADMISSION_GATE for g in gates)


def pod_group(pod: Mapping[str, Any]) -> tuple[str, str]:
    """The pod's group for a Workload of plain pods: (namespace, group label or else its name)."""
    meta = pod["metadata"]
    return str(meta.get("namespace", "")), str(
        (meta.get("labels") or {}).get(keys.POD_GROUP_LABEL) or meta["name"]
    )


def _pod_ties(pod: Mapping[str, Any]) -> list[PodTie]:
    meta = pod["metadata"]
    ns = str(meta.get("namespace", ""))
    labels = meta.get("labels") or {}
    ties = [(ns, "name", str(meta["name"]))]
    ties += [(ns, tie, str(labels[label])) for tie, label in _POD_TIES if labels.get(label)]
    return ties


def _workload_ties(wl: Mapping[str, Any]) -> set[tuple[str, ...]]:
    """What ties a Workload to its job: its job-uid label, and its owners by namespace and name."""
    meta = wl.get("metadata") or {}
    ties: set[tuple[str, ...]] = set()
    uid = (meta.get("labels") or {}).get(keys.JOB_UID_LABEL)
    if uid:
        ties.add(("uid", str(uid)))
    for ref in meta.get("ownerReferences") or []:
        if ref.get("name"):
            ties.add(("owner", str(meta.get("namespace", "")), str(ref["name"])))
    return ties


def _planned_devices(wl: Mapping[str, Any]) -> dict[str, list[str]]:
    """The devices the recorded plan of an admitted, not evicted, not finished Workload gives its
    pods, by node (one entry per pod); empty for any other Workload, or one without a plan."""
    if (
        not (wl.get("status") or {}).get("admission")
        or condition_true(wl, ConditionType.EVICTED)
        or condition_true(wl, ConditionType.FINISHED)
    ):
        return {}
    annotations = (wl.get("metadata") or {}).get("annotations") or {}
    planned = recorded_placement(annotations.get(PLACEMENT_ANNOTATION))
    out: dict[str, list[str]] = {}
    for slots in (planned or {}).values():
        for node, devices in slots:
            out.setdefault(node, []).append(devices)
    return out


def _add(index: dict[Any, set[str]], tie: Any, key: str) -> None:
    index.setdefault(tie, set()).add(key)


def _drop(index: dict[Any, set[str]], tie: Any, key: str) -> None:
    held = index.get(tie)
    if held is not None:
        held.discard(key)
        if not held:
            del index[tie]


@dataclass
class Worklist:
    """The controller's indexes and candidates, kept from the cache's changes (module docstring)."""

    job_kinds: tuple[str, ...]
    pods_by: dict[PodTie, set[str]] = field(default_factory=dict)
    pods_on: dict[str, set[str]] = field(default_factory=dict)
    evicted: set[str] = field(default_factory=set)  # admitted Workloads marked Evicted
    to_bind: set[str] = field(default_factory=set)  # Workloads that may need a release or bindings
    # Workloads whose job or pods changed: they may have ended (the finishing step's own set, which
    # the release step's discards never empty).
    to_finish: set[str] = field(default_factory=set)
    to_create: set[tuple[str, str]] = field(default_factory=set)  # (kind, key) of jobs
    groups: set[tuple[str, str]] = field(default_factory=set)  # gated pod groups
    placeholders: set[str] = field(default_factory=set)  # warm-buffer placeholder pods
    signalled: dict[str, str] = field(default_factory=dict)  # nodes being taken back: their signal
    requested: set[str] = field(default_factory=set)  # Workloads asked for a checkpoint
    planned_on: dict[str, set[str]] = field(default_factory=dict)  # node -> Workloads planned there
    plans: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # Workload -> node -> devices
    sweep_due: bool = True
    _pod_entry: dict[str, tuple[list[PodTie], str | None, tuple[str, str]]] = field(default_factory=dict)
    _wl_ties: dict[str, set[tuple[str, ...]]] = field(default_factory=dict)
    _by_tie: dict[tuple[str, ...], set[str]] = field(default_factory=dict)

    # --- keeping up ------------------------------------------------------------------------------

    def sweep(self, items: Items) -> None:
        """Rebuild everything from the whole cache: every object a candidate."""
        self.pods_by, self.pods_on, self._pod_entry = {}, {}, {}
        self._wl_ties, self._by_tie, self.evicted = {}, {}, set()
        self.planned_on, self.plans = {}, {}
        self.groups, self.placeholders, self.requested = set(), set(), set()
        self.signalled = {n["metadata"]["name"]: s for n in items("Node") if (s := interruption(n))}
        for pod in items("Pod"):
            self._set_pod(object_key(pod), pod)
            if gated(pod):
                self.groups.add(pod_group(pod))
        self.to_bind, self.to_finish = set(), set()
        for wl in items("Workload"):
            key = object_key(wl)
            self._set_workload(key, wl)
            self._candidates((key,))
        self.to_create = {(kind, object_key(job)) for kind in self.job_kinds for job in items(kind)}
        self.sweep_due = False

    def note(self, changes: Mapping[str, Iterable[str]], get: Get) -> None:
        """Take in the keys the cache noted as changed (by kind)."""
        for name in changes.get("Node", ()):
            node = get("Node", name)
            signal = interruption(node) if node is not None else None
            if signal:
                self.signalled[name] = signal
            else:
                self.signalled.pop(name, None)
        for key in changes.get("Pod", ()):
            self._pod_changed(key, get("Pod", key))
        for key in changes.get("Workload", ()):
            wl = get("Workload", key)
            if wl is None:
                self.sweep_due = True  # its job may need a Workload again
            self._set_workload(key, wl)
            self._candidates((key,))
        for kind in self.job_kinds:
            for key in changes.get(kind, ()):
                self.to_create.add((kind, key))
                ns, _, name = key.rpartition("/")
                self._candidates(self._by_tie.get(("owner", ns, name), ()))
                job = get(kind, key)
                uid = (job or {}).get("metadata", {}).get("uid")
                if uid:
                    self._candidates(self._by_tie.get(("uid", str(uid)), ()))

    def _candidates(self, keys: Iterable[str]) -> None:
        """Workloads that may need work: a release or bindings, and a look at whether they ended."""
        for key in keys:
            self.to_bind.add(key)
            self.to_finish.add(key)

    def _pod_changed(self, key: str, pod: dict[str, Any] | None) -> None:
        old = self._pod_entry.get(key)
        self._set_pod(key, pod)
        new = self._pod_entry.get(key)
        for entry in (old, new):
            if entry is None:
                continue
            ties, _, group = entry
            self.groups.add(group)
            for ns, tie, value in ties:
                if tie == "workload":
                    self._candidates((f"{ns}/{value}",))
                else:  # plain pods and pod groups: the Workload whose job-uid label is the value
                    self._candidates(
                        k for k in self._by_tie.get(("uid", value), ()) if k.startswith(f"{ns}/")
                    )

    def _set_pod(self, key: str, pod: dict[str, Any] | None) -> None:
        old = self._pod_entry.pop(key, None)
        self.placeholders.discard(key)
        if old is not None:
            for tie in old[0]:
                _drop(self.pods_by, tie, key)
            if old[1]:
                _drop(self.pods_on, old[1], key)
        if pod is None:
            return
        ties = _pod_ties(pod)
        if WARM_BUFFER_LABEL in (pod["metadata"].get("labels") or {}):
            self.placeholders.add(key)
        node = (pod.get("spec") or {}).get("nodeName") or None
        self._pod_entry[key] = (ties, node, pod_group(pod))
        for tie in ties:
            _add(self.pods_by, tie, key)
        if node:
            _add(self.pods_on, node, key)

    def _set_workload(self, key: str, wl: dict[str, Any] | None) -> None:
        for tie in self._wl_ties.pop(key, ()):
            _drop(self._by_tie, tie, key)
        for node in self.plans.pop(key, {}):
            _drop(self.planned_on, node, key)
        self.evicted.discard(key)
        self.requested.discard(key)
        if wl is None:
            return
        if keys.CHECKPOINT_REQUESTED_ANNOTATION in ((wl.get("metadata") or {}).get("annotations") or {}):
            self.requested.add(key)
        ties = _workload_ties(wl)
        self._wl_ties[key] = ties
        for tie in ties:
            _add(self._by_tie, tie, key)
        if (
            (wl.get("status") or {}).get("admission")
            and condition_true(wl, ConditionType.EVICTED)
            and not condition_true(wl, ConditionType.FINISHED)
        ):
            self.evicted.add(key)
        plan = _planned_devices(wl)
        if plan:
            self.plans[key] = plan
            for node in plan:
                _add(self.planned_on, node, key)

    # --- reading ---------------------------------------------------------------------------------

    def owned(self, uid: str) -> bool:
        """Whether some Workload carries ``uid`` as its job-uid label."""
        return ("uid", uid) in self._by_tie

    def pod_keys(self, node: str) -> list[str]:
        """The keys of the pods bound to ``node`` (assumed bindings included)."""
        return sorted(self.pods_on.get(node, ()))

    def plans_on(self, node: str) -> dict[str, list[str]]:
        """The admitted Workloads whose recorded plans place pods on ``node``: the devices of each
        of those pods (as the plan wrote them), by Workload key."""
        return {key: list(self.plans[key][node]) for key in sorted(self.planned_on.get(node, ()))}
