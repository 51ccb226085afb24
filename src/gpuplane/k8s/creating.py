"""The controller's first write path: queued jobs and gated pod groups get their Workload."""

from __future__ import annotations

from functools import partial
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.bind_writes import workload_create_writes
from gpuplane.k8s.writing import Tools


class WorkloadCreation:
    """Creates the Workloads of queued jobs and gated pod groups that have none (owns no state: its
    candidates are the worklist's ``to_create`` and ``groups``)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.work = tools.work

    def run(self) -> None:
        """Create the Workloads of queued jobs and gated pod groups that have none.

        Only the worklist's candidates are looked at (jobs and pod groups that changed, or whose
        Workload is still being created); one that needs no Workload leaves the list."""
        candidates = [(kind, key, self.cache.get(kind, key)) for kind, key in sorted(self.work.to_create)]
        groups = []
        for group in sorted(self.work.groups):
            ns, name = group
            members = self.work.pods_by.get((ns, "group", name), set()) | self.work.pods_by.get(
                (ns, "name", name), set()
            )
            groups.append(
                (group, [p for key in sorted(members) if (p := self.cache.get("Pod", key)) is not None])
            )
        creations = workload_create_writes(candidates, groups, self.work.owned, self.priorities())
        self.work.to_create -= creations.settled_jobs
        self.work.groups -= creations.settled_groups
        self.tools.each(partial(self._create, w.body) for w in creations.writes)

    def priorities(self) -> dict[str, int]:
        """The value of each cached WorkloadPriorityClass, by name."""
        out = {}
        for pc in self.cache.items("WorkloadPriorityClass"):
            value = pc.get("value")
            if isinstance(value, int):
                out[pc["metadata"]["name"]] = value
        return out

    def _create(self, body: dict[str, Any]) -> None:
        try:
            created = self.api.create(k8s.WORKLOADS, body, body["metadata"]["namespace"])
        except ApiError as err:
            if not err.conflict:
                self.tools.counters.add("write_failures")
            return
        self.cache.upsert("Workload", created)
        self.tools.counters.add("workloads_created")
