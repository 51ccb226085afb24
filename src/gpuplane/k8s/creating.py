"""The controller's first write path: queued jobs and gated pod groups get their Workload.

A job labelled ``kueue.x-k8s.io/prebuilt-workload-name`` (a MultiKueue manager's copy on a worker)
gets no new Workload: it adopts the one of that name, made for it in advance, by becoming its
owner (an owner reference and the job-uid label), as Kueue does. Until that Workload exists the
job waits.

A new Workload is not sent at once. It is assumed in the cache, so that the pass's scheduling
sees it, and sent once the pass has decided: one that the pass admits is created by its admission
write, carrying its placement (:meth:`WorkloadCreation.take`), which spares the placement patch;
:meth:`WorkloadCreation.flush` creates the others, before any later step of the pass writes them."""

from __future__ import annotations

from functools import partial
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations as jobs
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.bind_writes import workload_create_writes
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.writing import Tools
from gpuplane.model import labels as keys

# At most this many new Workloads a pass: the pass writes them, with the admissions it makes of them,
# before it releases any job, so a burst of thousands of queued jobs taken in one pass would hold
# every release back until all are written. The oldest go first; the rest wait for the next pass.
PASS_CREATES = 500


def _created(obj: dict[str, Any] | None) -> str:
    return str(((obj or {}).get("metadata") or {}).get("creationTimestamp") or "")


class WorkloadCreation:
    """Creates the Workloads of queued jobs and gated pod groups that have none (owns only the
    Workloads it assumed and has not sent yet: its candidates are the worklist's ``to_create`` and
    ``groups``)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.work = tools.work
        # Assumed in the cache, not sent yet: the Workload by key (see the module docstring).
        self.unsent: dict[str, dict[str, Any]] = {}

    def run(self) -> None:
        """Create the Workloads of queued jobs and gated pod groups that have none.

        Only the worklist's candidates are looked at (jobs and pod groups that changed, or whose
        Workload is still being created); one that needs no Workload leaves the list."""
        candidates = []
        for kind, key in sorted(self.work.to_create):
            job = self.cache.get(kind, key)
            prebuilt = ((job or {}).get("metadata", {}).get("labels") or {}).get(keys.PREBUILT_WORKLOAD_LABEL)
            if job is not None and prebuilt:
                if self._adopt(kind, job, str(prebuilt)):
                    self.work.to_create.discard((kind, key))
                continue
            candidates.append((kind, key, job))
        candidates.sort(key=lambda c: (_created(c[2]), c[0], c[1]))
        by = self.work.pods_by

        def members(ns: str, name: str) -> list[dict[str, Any]]:
            keys_ = sorted(by.get((ns, "group", name), set()) | by.get((ns, "name", name), set()))
            return [p for key in keys_ if (p := self.cache.get("Pod", key)) is not None]

        groups = ((group, members(*group)) for group in sorted(self.work.groups))  # read as needed
        creations = workload_create_writes(
            candidates, groups, self.work.owned, self.priorities(), limit=PASS_CREATES
        )
        self.work.to_create -= creations.settled_jobs
        self.work.groups -= creations.settled_groups
        created = self.tools.now_seconds()  # the order it queues in until the server's copy comes
        for write in creations.writes:  # at most PASS_CREATES: the rest stay candidates, for the next pass
            body = {**write.body, "metadata": {**write.body["metadata"], "creationTimestamp": created}}
            self.unsent[write.workload] = body
            self.cache.assume("Workload", body)

    def take(self, key: str) -> dict[str, Any] | None:
        """The Workload ``key`` if it is assumed and not sent yet, now for the caller to create
        (its admission write); None otherwise."""
        return self.unsent.pop(key, None)

    def flush(self) -> None:
        """Create every Workload assumed and not sent yet, all at once."""
        bodies, self.unsent = list(self.unsent.values()), {}
        self.tools.each(partial(self._create, body) for body in bodies)

    def priorities(self) -> dict[str, int]:
        """The value of each cached WorkloadPriorityClass, by name."""
        out = {}
        for pc in self.cache.items("WorkloadPriorityClass"):
            value = pc.get("value")
            if isinstance(value, int):
                out[pc["metadata"]["name"]] = value
        return out

    def _adopt(self, kind: str, job: dict[str, Any], workload: str) -> bool:
        """Make ``job`` the owner of its prebuilt Workload; False while that Workload is missing
        (or the write failed: the job stays a candidate). True once it is owned by the job."""
        meta = job["metadata"]
        wl = self.cache.get("Workload", f"{meta['namespace']}/{workload}")
        if wl is None:
            return False
        wl_meta = wl.get("metadata") or {}
        owners = wl_meta.get("ownerReferences") or []
        if any(ref.get("uid") == meta.get("uid") for ref in owners):
            return True
        owner = {
            "apiVersion": job.get("apiVersion") or jobs.INTEGRATIONS[kind].resource.api_version,
            "kind": kind,
            "name": meta["name"],
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        patch = {
            "metadata": {
                "resourceVersion": wl_meta.get("resourceVersion"),
                "ownerReferences": [*owners, owner],
                "labels": {keys.JOB_UID_LABEL: meta["uid"]},
            }
        }
        try:
            adopted = self.api.patch(k8s.WORKLOADS, workload, patch, meta["namespace"])
        except ApiError:
            self.tools.counters.add("write_failures")
            return False
        self.cache.upsert("Workload", adopted)
        self.tools.counters.add("prebuilt_workloads_adopted")
        return True

    def _create(self, body: dict[str, Any]) -> None:
        try:
            created = self.api.create(k8s.WORKLOADS, body, body["metadata"]["namespace"])
        except ApiError as err:
            if not err.conflict:
                self.tools.counters.add("write_failures")
            self.cache.forget("Workload", object_key(body))
            return
        except BaseException:
            self.cache.forget("Workload", object_key(body))
            raise
        self.cache.upsert("Workload", created)
        self.tools.counters.add("workloads_created")
