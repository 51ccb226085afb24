"""Interruptions of spot (and other reclaimed) nodes: checkpoint grace, eviction, requeue.

A node is being taken back when it carries one of the taints that Karpenter, the cloud node
termination handlers and the Kubernetes node lifecycle set (:data:`INTERRUPTION_TAINTS`), or is
cordoned. For each admitted workload with a pod on such a node::

    signal --> workload and its pods annotated gpuplane.dev/checkpoint-requested (when) and
               gpuplane.dev/checkpoint-deadline (when the grace ends): the job checkpoints
           --> grace over (or the job reported a checkpoint after the request)
           --> Evicted (reason NodeInterrupted): pods evicted, job suspended, quota given back
           --> queued again at the head of its priority band, gpuplane.dev/last-checkpoint kept;
               the core's next flavor in the queue's order may be on-demand

The grace is ``gpuplane.dev/checkpoint-grace-seconds`` on the Workload, else the controller's
default. Once the workload is queued again the request annotations are cleared, so a later
interruption starts a new grace. Every step reads the cluster and is idempotent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuplane.core.session import Reason
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.k8s.leader import micro_time
from gpuplane.model import labels as keys
from gpuplane.model.conditions import ConditionType, condition, condition_true, with_conditions
from gpuplane.model.fields import lenient_timestamp
from gpuplane.model.records import last_checkpoint

log = logging.getLogger(__name__)

INTERRUPTION_TAINTS = (
    "karpenter.sh/disrupted",  # Karpenter is disrupting the node (spot interruption, drift, ...)
    "karpenter.sh/disruption",  # older Karpenter spelling (value "disrupting")
    "node.kubernetes.io/unschedulable",  # cordoned (kubectl drain, termination handlers)
    "node.kubernetes.io/out-of-service",
    "aws-node-termination-handler/spot-itn",
    "aws-node-termination-handler/asg-lifecycle-termination",
    "aws-node-termination-handler/scheduled-maintenance",
    "cloud.google.com/impending-node-termination",
    "node.cloudprovider.kubernetes.io/shutdown",
    "ToBeDeletedByClusterAutoscaler",
)
REQUESTED = keys.CHECKPOINT_REQUESTED_ANNOTATION
DEADLINE = keys.CHECKPOINT_DEADLINE_ANNOTATION
GRACE = keys.CHECKPOINT_GRACE_ANNOTATION


def interruption(node: dict[str, Any]) -> str | None:
    """The signal that ``node`` is being taken back (a taint, or a cordon), if any."""
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("key") in INTERRUPTION_TAINTS and taint.get("effect") in ("NoSchedule", "NoExecute"):
            return f"taint {taint['key']}:{taint['effect']}"
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    return None


class InterruptionGuard:
    """Carries interruptions through for one controller (one pass at a time)."""

    def __init__(
        self,
        api: KubeApi,
        cache: Cache,
        clock: Callable[[], float],
        event: Callable[[dict[str, Any], str, str, str], None],
        default_grace: float,
    ) -> None:
        self.api = api
        self.cache = cache
        self.clock = clock
        self.event = event
        self.default_grace = default_grace
        self.evicted = 0

    def reconcile(
        self,
        *,
        signals: Mapping[str, str] | None = None,
        pods_on: Callable[[str], Iterable[str]] | None = None,
        asked: Iterable[str] = (),
    ) -> None:
        """One step for every workload with a pod on a node being taken back, and for every one
        that carries a checkpoint request.

        Without ``signals`` every cached node, pod and workload is looked at. With them (the nodes
        being taken back and their signal, kept by the caller from the cache's changes), only the
        pods on those nodes (``pods_on``: their keys), and the workloads those pods belong to or
        that carry a checkpoint request (``asked``: their keys).
        """
        if signals is None:
            signals = {n["metadata"]["name"]: s for n in self.cache.items("Node") if (s := interruption(n))}
            pods = self.cache.items("Pod") if signals else []
            workloads: list[dict[str, Any]] | None = self.cache.items("Workload")
        else:
            on = [key for node in signals for key in (pods_on(node) if pods_on else ())]
            pods = [p for key in sorted(set(on)) if (p := self.cache.get("Pod", key)) is not None]
            workloads = None
        hit: dict[str, tuple[str, list[dict[str, Any]]]] = {}
        if signals:
            for pod in pods:
                node = (pod.get("spec") or {}).get("nodeName")
                labels = pod["metadata"].get("labels") or {}
                owner = labels.get(keys.KUEUE_WORKLOAD_LABEL) or labels.get(keys.WORKLOAD_LABEL)
                if node not in signals or not owner:
                    continue
                if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                    continue
                key = f"{pod['metadata']['namespace']}/{owner}"
                hit.setdefault(key, (str(node), []))[1].append(pod)
        if workloads is None:
            names = sorted(set(hit) | set(asked))
            workloads = [wl for key in names if (wl := self.cache.get("Workload", key)) is not None]
        now = self.clock()
        for wl in workloads:
            key = object_key(wl)
            annotations = wl["metadata"].get("annotations") or {}
            admitted = bool((wl.get("status") or {}).get("admission"))
            if REQUESTED in annotations and not admitted:
                self._annotate(wl, {REQUESTED: None, DEADLINE: None})  # queued again: done
                continue
            if key not in hit or not admitted or condition_true(wl, ConditionType.EVICTED):
                continue
            node, pods = hit[key]
            if REQUESTED not in annotations:
                self._request(wl, pods, node, signals[node], now)
                continue
            deadline = lenient_timestamp(annotations.get(DEADLINE)) or now
            requested = lenient_timestamp(annotations.get(REQUESTED)) or now
            checkpointed = last_checkpoint(annotations)
            if now >= deadline or (checkpointed is not None and checkpointed >= requested):
                self._evict(wl, node, signals[node], checkpointed is not None and checkpointed >= requested)

    def _grace(self, wl: dict[str, Any]) -> float:
        text = (wl["metadata"].get("annotations") or {}).get(GRACE)
        try:
            return max(0.0, float(text)) if text is not None else self.default_grace
        except ValueError:
            return self.default_grace

    def _request(
        self, wl: dict[str, Any], pods: list[dict[str, Any]], node: str, signal: str, now: float
    ) -> None:
        grace = self._grace(wl)
        marks = {REQUESTED: micro_time(now), DEADLINE: micro_time(now + grace)}
        for pod in pods:  # the job reads its own pod's annotations (downward API)
            updated: dict[str, Any] = json.loads(json.dumps(pod))
            updated["metadata"].setdefault("annotations", {}).update(marks)
            try:
                self.cache.upsert("Pod", self.api.replace(k8s.PODS, updated))
            except ApiError as err:
                log.debug("checkpoint request on pod %s not written: %s", object_key(pod), err)
        if self._annotate(wl, marks):
            self.event(
                wl,
                "Warning",
                "CheckpointRequested",
                f"node {node} is being taken back ({signal}); checkpoint within {grace:g}s, then eviction",
            )

    def _annotate(self, wl: dict[str, Any], marks: Mapping[str, str | None]) -> bool:
        updated: dict[str, Any] = json.loads(json.dumps(wl))
        annotations = updated["metadata"].setdefault("annotations", {})
        for k, v in marks.items():
            if v is None:
                annotations.pop(k, None)
            else:
                annotations[k] = v
        try:
            written = self.api.replace(k8s.WORKLOADS, updated)
        except ApiError as err:
            log.debug("annotations of %s not written: %s", object_key(wl), err)
            return False
        self.cache.upsert("Workload", written)
        return True

    def _evict(self, wl: dict[str, Any], node: str, signal: str, checkpointed: bool) -> None:
        why = "checkpointed" if checkpointed else "checkpoint grace over"
        message = f"node {node} is being taken back ({signal}); {why}; requeued at the head of its queue"
        updated: dict[str, Any] = json.loads(json.dumps(wl))
        status = updated.setdefault("status", {})
        status["conditions"] = with_conditions(
            status.get("conditions", []),
            condition(ConditionType.EVICTED, Reason.NODE_INTERRUPTED, micro_time(self.clock()), message),
        )
        try:
            written = self.api.replace(k8s.WORKLOADS, updated, sub="status")
        except ApiError as err:
            log.debug("eviction of %s not written: %s", object_key(wl), err)
            return
        self.cache.upsert("Workload", written)
        self.evicted += 1
        self.event(written, "Warning", "EvictedDueToNodeInterruption", message)
