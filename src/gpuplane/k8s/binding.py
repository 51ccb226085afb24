"""The controller's release-and-bind write path: admitted jobs are released (templates stamped,
then unsuspended or ungated), and the pods of admitted workloads are bound, a whole gang at a time,
to the planned nodes through the Binding API, with their devices recorded on the pod.

What to write is decided by the pure functions of :mod:`gpuplane.k8s.bind_writes`; this module
gathers their inputs from the cache and the worklist and applies them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

from gpuplane.core.session import DeviceConfig
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.bind_writes import NodeView, binding_writes, gang_plan, release_writes, waiting
from gpuplane.k8s.dra_claims import ClaimWrites
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.plan_writes import Write
from gpuplane.k8s.provisioning import awaiting_checks
from gpuplane.k8s.writing import Tools, condition, log, log_workload, owner_job, pods_of
from gpuplane.model.conditions import ConditionType


class Binder:
    """Releases admitted jobs and binds their gangs (owns the set of pods already told, by an
    Event, that they wait for the rest of their gang; its candidates are the worklist's
    ``to_bind``)."""

    def __init__(
        self,
        tools: Tools,
        *,
        devices: DeviceConfig,
        clear_warm: Callable[[Iterable[str]], None],
        claims: ClaimWrites | None = None,
    ) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.work = tools.work
        self.devices = devices
        self.clear_warm = clear_warm  # placeholders on a complete gang's nodes make room
        self.gang_noted: set[str] = set()  # pods told (by an Event) that they wait for their gang
        self.claims = claims  # the pods' ResourceClaims, allocated before their Bindings

    def run(self) -> None:
        """Release admitted jobs (all at once), then bind the pods of complete gangs (all at once).

        Devices are chosen one pod after another, each beside the pods chosen before it (each
        gang's bindings are assumed in the cache before the next gang is fitted), and only the API
        calls run in parallel.
        """
        admitted = []
        for key in sorted(self.work.to_bind):
            wl = self.cache.get("Workload", key)
            if (
                wl is None
                or not wl.get("status", {}).get("admission")
                or condition(wl, ConditionType.EVICTED)
                or condition(wl, ConditionType.FINISHED)
                or awaiting_checks(wl)
            ):
                self.work.to_bind.discard(key)  # a change of the Workload makes it a candidate again
                continue
            admitted.append((wl, wl["status"]["admission"]))
        flavors = {f["metadata"]["name"]: f for f in self.cache.items("ResourceFlavor")} if admitted else {}
        releases: list[Write] = []
        for wl, admission in admitted:
            pods = pods_of(self.cache, self.work, wl)
            release = release_writes(wl, admission, owner_job(self.cache, wl), pods, flavors)
            if not release and not waiting(pods):
                # Released, and every pod of it bound: nothing to do until it, its job or a pod
                # of it changes.
                self.work.to_bind.discard(object_key(wl))
            releases += release
        self.tools.each(partial(self._write, w.kind, w.body) for w in releases)
        bindings: list[Callable[[], None]] = []
        try:
            for wl, admission in admitted:
                bindings += self._bind_gang(wl, admission)
        except BaseException:
            # The gangs fitted before the failure are whole and assumed: send them, as planned;
            # the failing gang has forgotten its own assumptions (see _bind_gang).
            self.tools.each(bindings)
            raise
        self.tools.each(bindings)

    def _write(self, kind: str, body: dict[str, Any]) -> None:
        """Replace one Pod or job object, and cache what the server answered (a failure is retried
        next pass)."""
        try:
            if kind == "Pod":
                written = self.api.replace(k8s.PODS, body)
            else:
                written = self.api.replace(jobs.INTEGRATIONS[kind].resource, body)
        except ApiError:
            self.tools.counters.add("write_failures")
            return
        self.cache.upsert(kind, written)

    def _bind_gang(self, wl: dict[str, Any], admission: dict[str, Any]) -> list[Callable[[], None]]:
        """The bindings of every pod of the workload to its planned node, once all have arrived,
        each assumed in the cache (and the worklist) before it is written.

        While pods are missing, each one that waits gets an Event (once) saying so.
        """
        plan = gang_plan(wl, admission, pods_of(self.cache, self.work, wl), self._gang_noted_already)
        if plan.waits:
            return [partial(self._note_gang_wait, pod, message) for pod, message in plan.waits]
        if plan.nodes:  # the gang is complete: placeholders on its nodes make room
            self.clear_warm(plan.nodes)
        if not plan.pods:
            return []
        counters = self.tools.counters
        writes: list[Callable[[], None]] = []
        assumed: list[str] = []
        nodes: Counter[str] = Counter()
        try:
            binds = list(binding_writes(plan, self.node_view, self.devices))
            before: dict[str, Callable[[], bool]] = {}
            if self.claims is not None:
                got = self.claims.for_gang([(b.pod, b.node) for b in binds if b.binding is not None])
                if got is None:
                    return []  # the gang's claims are not all made, or do not fit: a later pass
                before = got
            for bind in binds:
                if bind.replanned:
                    counters.add("replanned_devices")
                    log.info(
                        "planned devices %s on %s are taken: fitting the pod again", bind.planned, bind.node
                    )
                if bind.binding is None or bind.bound is None:
                    counters.add("device_waits")
                    continue
                self.cache.assume("Pod", bind.bound)
                assumed.append(bind.pod)
                self.work.note({"Pod": [bind.pod]}, self.cache.get)  # the next gang is fitted beside it
                writes.append(partial(self._write_binding, bind.pod, bind.binding, before.get(bind.pod)))
                nodes[bind.node] += 1
        except BaseException:
            # Part of a gang is never sent: what it assumed is forgotten, and the gang is fitted
            # again, whole, on a later pass.
            for key in assumed:
                self.cache.forget("Pod", key)
            self.work.note({"Pod": assumed}, self.cache.get)
            raise
        if writes:
            where = ", ".join(f"{n} on {node}" for node, n in sorted(nodes.items()))
            log_workload("binding", object_key(wl), f"{len(writes)} pods: {where}")
        return writes

    def node_view(self, name: str) -> NodeView | None:
        """The node as the cache and the worklist show it now (``None``: not known)."""
        node = self.cache.get("Node", name)
        if node is None:
            return None
        pods = tuple(p for key in self.work.pod_keys(name) if (p := self.cache.get("Pod", key)) is not None)
        return NodeView(node, pods, self.work.plans_on(name))

    def _gang_noted_already(self, pod: dict[str, Any]) -> bool:
        return pod["metadata"].get("uid", object_key(pod)) in self.gang_noted

    def _note_gang_wait(self, pod: dict[str, Any], message: str) -> None:
        self.gang_noted.add(pod["metadata"].get("uid", object_key(pod)))
        self.tools.event({**pod, "apiVersion": "v1", "kind": "Pod"}, "Normal", "WaitingForGang", message)

    def _write_binding(
        self, key: str, binding: dict[str, Any], claims: Callable[[], bool] | None = None
    ) -> None:
        meta = binding["metadata"]
        try:
            if claims is not None and not claims():  # its ResourceClaims first; refused: not bound
                self.cache.forget("Pod", key)
                return
            self.api.request("POST", k8s.PODS.path(meta["namespace"], meta["name"], "binding"), body=binding)
        except ApiError as err:
            self.cache.forget("Pod", key)
            if not err.conflict:  # 409: already bound, by us before a restart
                self.tools.counters.add("write_failures")
            return
        except BaseException:
            self.cache.forget("Pod", key)
            raise
        self.tools.counters.add("bound")
        node = binding["target"]["name"]
        pod = self.cache.get("Pod", key) or {"metadata": meta}
        message = f"Successfully assigned {meta['namespace']}/{meta['name']} to {node}"  # as kube-scheduler
        self.tools.event({**pod, "apiVersion": "v1", "kind": "Pod"}, "Normal", "Scheduled", message)
