"""Dynamic Resource Allocation on a live cluster: the kinds served, claims allocated, claims released.

* :func:`served_resources`: the ``resource.k8s.io/v1`` kinds the API server serves, from its
  discovery document; asked before the first claim is written (the controller's informers watch
  the kinds on every cluster: one that does not serve them shows none).
* :class:`ClaimWrites`: when a pod of an admitted workload is bound, its ResourceClaims (its own,
  made by kube-controller-manager from a template and named in ``status.resourceClaimStatuses``,
  or a shared one) are allocated on its node by the core
  (:class:`~gpuplane.core.session.ClaimAllocation`), the devices the Workload's placement record
  planned for them while those still fit (else others, counted as ``replanned_devices``), and
  written first: the finalizer
  ``resource.kubernetes.io/delete-protection`` (as kube-scheduler sets it), then through the status
  subresource ``status.allocation`` (``devices.results[]`` with request, driver, pool and device,
  and a node selector for the node) with the pod in ``status.reservedFor``; the Binding follows
  only when they were accepted. A gang whose claims do not all fit (or are not created yet) is not
  bound this pass. A claim already allocated keeps its devices (after a restart they are read
  back from the claim, and held against every other pod).
* :meth:`ClaimWrites.release_ended`: deallocation as upstream does it: a pod that ended leaves
  ``reservedFor``; a claim reserved for nobody loses its allocation and its finalizer.
  kube-controller-manager's resource-claim controller does the same (and deletes the claims made
  for pods that ended); whichever writes first wins, the other gets a conflict and looks again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from gpuplane.core.session import ClaimAllocation
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi, Resource
from gpuplane.k8s.clusterstate import typed
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.writing import Tools
from gpuplane.model import labels as keys
from gpuplane.model.dra import AllocatedDevice
from gpuplane.model.errors import InputError
from gpuplane.model.loader import state_from_objects
from gpuplane.model.records import recorded_claims

log = logging.getLogger(__name__)

DRA_RESOURCES = (
    k8s.DEVICE_CLASSES,
    k8s.RESOURCE_SLICES,
    k8s.RESOURCE_CLAIMS,
    k8s.RESOURCE_CLAIM_TEMPLATES,
    k8s.DEVICE_TAINT_RULES,
)
DRA_KIND_NAMES = tuple(res.kind for res in DRA_RESOURCES)
PROTECTION = "resource.kubernetes.io/delete-protection"  # kube-scheduler's finalizer on claims it allocates
ENDED = ("Succeeded", "Failed")
ClaimWrite = tuple[dict[str, Any], dict[str, Any]]  # a claim as observed, and as to write


def served_resources(api: KubeApi) -> tuple[Resource, ...]:
    """The DRA kinds ``resource.k8s.io/v1`` serves on this API server (none when it serves no such
    group version, or its discovery cannot be read: the cluster is then watched without them)."""
    try:
        doc = api.request("GET", f"/apis/{k8s.DRA}/v1")
    except ApiError as err:
        if not err.not_found:
            log.warning("DRA discovery failed, ResourceClaims are not watched: %s", err)
        return ()
    names = {r.get("name") for r in doc.get("resources") or [] if isinstance(r, dict)}
    return tuple(res for res in DRA_RESOURCES if res.plural in names)


def pod_claims(pod: dict[str, Any]) -> list[tuple[str, str | None]]:
    """Each entry of the pod's ``spec.resourceClaims``: its name and the ResourceClaim it uses (a
    shared claim by name, or the one made from a template as ``status.resourceClaimStatuses``
    names it; ``None`` while it is not made yet)."""
    made = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(s, dict)
    }
    out: list[tuple[str, str | None]] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("name", "")
        out.append((name, entry.get("resourceClaimName") or made.get(name)))
    return out


def allocation_status(devices: Sequence[AllocatedDevice], node: str) -> dict[str, Any]:
    """``status.allocation`` for ``devices`` on ``node``."""
    results = []
    for d in devices:
        result: dict[str, Any] = d.as_dict()
        if d.consumed:
            result["consumedCapacity"] = {k: _quantity(v) for k, v in sorted(d.consumed.items())}
        results.append(result)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
    return {"devices": {"results": results}, "nodeSelector": {"nodeSelectorTerms": [term]}}


def _quantity(value: object) -> str:
    text = str(value)
    return text if "/" not in text else f"{float(value):g}"  # type: ignore[arg-type]


def _reserved_for(claim: dict[str, Any]) -> list[dict[str, Any]]:
    return list((claim.get("status") or {}).get("reservedFor") or [])


class ClaimWrites:
    """Claim allocations at bind time and claim releases (module docstring). Owns, for one pass, the
    allocation built from the cache at its first gang with claims (each gang's claims are taken in
    it, so the next gang is fitted beside them); :meth:`release_ended` ends the pass and drops it."""

    def __init__(self, tools: Tools, *, served: bool | None = None) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.served = served  # whether the API server serves ResourceClaims (None: not asked yet)
        self._pass_allocation: ClaimAllocation | None = None

    # --- allocation at bind time ------------------------------------------------------------------

    def _allocation(self) -> ClaimAllocation:
        """This pass's allocation: the published devices with every claim of the cache held."""
        if self._pass_allocation is not None:
            return self._pass_allocation
        docs = [typed(n, "Node") for n in self.cache.items("Node")]
        docs += [typed(obj, kind) for kind in DRA_KIND_NAMES for obj in self.cache.items(kind)]
        skipped: list[InputError] = []
        state = state_from_objects(docs, skipped=skipped)
        for problem in skipped:
            log.debug("DRA object left out at bind time: %s", problem)
        self._pass_allocation = ClaimAllocation(state.dra, state.nodes)
        return self._pass_allocation

    def for_gang(self, binds: Sequence[tuple[str, str]]) -> dict[str, Callable[[], bool]] | None:
        """For each pod to bind (key, node) whose claims need writing, the write to run before its
        Binding (True: accepted); every claim is assumed in the cache. ``None`` when the gang's
        claims cannot all be allocated now (nothing assumed: the gang waits for a later pass)."""
        wanted = []
        for key, node in binds:
            pod = self.cache.get("Pod", key)
            claims = pod_claims(pod) if pod is not None else []
            if pod is not None and claims:
                wanted.append((key, node, pod, claims))
        if not wanted:
            return {}
        if not self.served:  # asked again while it says no: a cluster may be upgraded meanwhile
            self.served = k8s.RESOURCE_CLAIMS in served_resources(self.api)
        if not self.served:
            self._wait(wanted[0][0], "the API server serves no resource.k8s.io/v1 ResourceClaims")
            return None
        alloc = self._allocation()
        planned: list[tuple[str, list[ClaimWrite]]] = []
        for key, node, pod, claims in wanted:
            writes = self._pod_writes(alloc, key, node, pod, claims)
            if isinstance(writes, str):
                for done, _ in planned:
                    alloc.give_back(done)
                alloc.give_back(key)
                self._wait(key, writes)
                return None
            planned.append((key, writes))
        out: dict[str, Callable[[], bool]] = {}
        for key, writes in planned:
            for _, new in writes:
                self.cache.assume("ResourceClaim", new)
            if writes:
                out[key] = partial(self._write_claims, writes)
        return out

    def _pod_writes(
        self,
        alloc: ClaimAllocation,
        key: str,
        node: str,
        pod: dict[str, Any],
        claims: list[tuple[str, str | None]],
    ) -> list[ClaimWrite] | str:
        """The claim writes (as observed, as to write) one pod needs on ``node``, its claims taken
        in ``alloc``; or why they cannot be allocated now."""
        namespace = key.partition("/")[0]
        parsed = alloc.allocator.objects.claims
        uses = []
        for name, claim_name in claims:
            claim = self.cache.get("ResourceClaim", f"{namespace}/{claim_name}") if claim_name else None
            model = parsed.get(f"{namespace}/{claim_name}")
            if claim is None or model is None:
                return f"pod claim {name}: its ResourceClaim is not made yet"
            uses.append((name, model, claim))
        before = alloc.replanned
        got = alloc.allocate(key, [(n, m) for n, m, _ in uses], node, self._planned(pod, node))
        if got is None:
            return alloc.why_not
        if alloc.replanned > before:
            self.tools.counters.add("replanned_devices")
            log.info("pod %s: the devices planned for its claims on %s are taken: chosen again", key, node)
        devices = dict(got)
        ref = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"].get("uid", "")}
        writes = []
        for name, model, claim in uses:
            reserved = _reserved_for(claim)
            if any(r.get("uid") == ref["uid"] and r.get("name") == ref["name"] for r in reserved):
                continue  # written before (a restart between the claim and the Binding)
            status = dict(claim.get("status") or {})
            if model.allocation is None:
                status["allocation"] = allocation_status(devices[name], node)
            status["reservedFor"] = [*reserved, ref]
            writes.append((claim, {**claim, "status": status}))
        return writes

    def _planned(self, pod: dict[str, Any], node: str) -> dict[str, list[tuple[AllocatedDevice, ...]]]:
        """Per pod claim, the devices the plan recorded for the pods of this pod's pod set on
        ``node`` (one option per planned pod; the allocator gives the first that is still free)."""
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        workload = labels.get(keys.WORKLOAD_LABEL)
        wl = self.cache.get("Workload", f"{meta.get('namespace', '')}/{workload}") if workload else None
        if wl is None:
            return {}
        record = (wl["metadata"].get("annotations") or {}).get(keys.PLACEMENT_ANNOTATION)
        out: dict[str, list[tuple[AllocatedDevice, ...]]] = {}
        for on, claims in recorded_claims(record).get(labels.get(keys.PODSET_LABEL, "main"), []):
            if on == node:
                for name, devices in claims.items():
                    out.setdefault(name, []).append(devices)
        return out

    def _wait(self, key: str, why: str) -> None:
        self.tools.counters.add("claim_waits")
        log.info("pod %s waits for its ResourceClaims: %s", key, why)

    def _write_claims(self, writes: list[ClaimWrite]) -> bool:
        """The finalizer (on a claim not allocated yet), then the status, of each claim; False at
        the first refusal (the pod is then not bound; its claims are looked at again next pass)."""
        for claim, new in writes:
            key = object_key(claim)
            try:
                current = claim
                finalizers = list(claim["metadata"].get("finalizers") or [])
                if "allocation" not in (claim.get("status") or {}) and PROTECTION not in finalizers:
                    meta = {**claim["metadata"], "finalizers": [*finalizers, PROTECTION]}
                    current = self.api.replace(k8s.RESOURCE_CLAIMS, {**claim, "metadata": meta})
                    self.cache.upsert("ResourceClaim", current)
                body = {**current, "status": new["status"]}
                written = self.api.replace(k8s.RESOURCE_CLAIMS, body, sub="status")
            except ApiError as err:
                self.cache.forget("ResourceClaim", key)
                self.tools.counters.add("write_failures")
                log.info("ResourceClaim %s not written: %s", key, err)
                return False
            self.cache.upsert("ResourceClaim", written)
            self.tools.counters.add("claims_allocated")
        return True

    # --- release ----------------------------------------------------------------------------------

    def release_ended(self) -> None:
        """Take the pods of gpuplane's that ended out of the claims reserved for them; a claim
        reserved for nobody is deallocated (its allocation and finalizer removed). It ends the pass:
        the next one allocates from the cache as it is then."""
        self._pass_allocation = None
        writes = []
        for claim in self.cache.items("ResourceClaim"):
            reserved = _reserved_for(claim)
            if not reserved or "allocation" not in (claim.get("status") or {}):
                continue
            namespace = claim["metadata"].get("namespace", "")
            keep = [r for r in reserved if not self._ended(namespace, r)]
            if len(keep) < len(reserved):
                writes.append(partial(self._release, claim, keep))
        self.tools.each(writes)

    def _ended(self, namespace: str, ref: dict[str, Any]) -> bool:
        if ref.get("resource") != "pods":
            return False
        pod = self.cache.get("Pod", f"{namespace}/{ref.get('name')}")
        if pod is None or (pod.get("spec") or {}).get("schedulerName") != keys.SCHEDULER_NAME:
            return False  # gone (kube-controller-manager sees to it) or not gpuplane's
        if pod["metadata"].get("uid") != ref.get("uid"):
            return False
        return (pod.get("status") or {}).get("phase") in ENDED

    def _release(self, claim: dict[str, Any], keep: list[dict[str, Any]]) -> None:
        key = object_key(claim)
        status = dict(claim.get("status") or {})
        status["reservedFor"] = keep
        if not keep:
            status.pop("allocation", None)
            status.pop("reservedFor", None)
        try:
            written = self.api.replace(k8s.RESOURCE_CLAIMS, {**claim, "status": status}, sub="status")
            finalizers = list(written["metadata"].get("finalizers") or [])
            if not keep and PROTECTION in finalizers:
                meta = {**written["metadata"], "finalizers": [f for f in finalizers if f != PROTECTION]}
                written = self.api.replace(k8s.RESOURCE_CLAIMS, {**written, "metadata": meta})
        except ApiError as err:
            if not (err.conflict or err.not_found):  # kube-controller-manager released it first
                self.tools.counters.add("write_failures")
            log.info("ResourceClaim %s not released: %s", key, err)
            return
        self.cache.upsert("ResourceClaim", written)
        self.tools.counters.add("claims_released")
