"""MultiKueue on a manager: the fleet as the manager shows it. Each MultiKueueCluster's and each
MultiKueue AdmissionCheck's ``Active`` condition (as Kueue writes them), and each worker's summary
(health, quota, usage, workloads; kueue #9988) as an annotation of its MultiKueueCluster."""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Mapping
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.leader import micro_time
from gpuplane.k8s.multikueue_fleet import (
    MULTIKUEUE_CLUSTERS,
    SUMMARY_ANNOTATION,
    FleetPart,
    annotation_of,
)
from gpuplane.k8s.multikueue_workers import WorkerSummary, summarize

log = logging.getLogger(__name__)


class FleetStatus(FleetPart):
    """Writes the Active conditions and the workers' summaries (owns no state: the summaries are
    kept in the shared :class:`Fleet`)."""

    def summarize(self, wanted: set[str]) -> None:
        """Each worker's summary (health, quota, usage, workloads), kept for the metrics and written
        as an annotation of its MultiKueueCluster for the console, ``gpuplane why`` and kubectl."""
        for name in sorted(wanted):
            link = self.fleet.links.get(name)
            if link is None:
                problem = self.fleet.problems.get(f"MultiKueueCluster/{name}", "not connected")
                summary = WorkerSummary(name, False, problem, {}, {}, 0, 0)
            else:
                summary = summarize(link)
            self.fleet.summaries[name] = summary
            obj = self.fleet.cluster_objects.get(name)
            text = json.dumps(summary.to_json(), sort_keys=True)
            if obj is None or annotation_of(obj, SUMMARY_ANNOTATION) == text:
                continue
            try:
                self.fleet.cluster_objects[name] = self.api.patch(
                    MULTIKUEUE_CLUSTERS, name, {"metadata": {"annotations": {SUMMARY_ANNOTATION: text}}}
                )
            except ApiError as err:
                log.debug("summary of worker %s not written: %s", name, err)

    def write_cluster_conditions(self, wanted: set[str]) -> None:
        for name, obj in sorted(self.fleet.cluster_objects.items()):
            link = self.fleet.links.get(name)
            problem = self.fleet.problems.get(f"MultiKueueCluster/{name}")
            if link is not None and link.connected:
                cond = ("True", "Active", "Connected")
            elif problem is not None:
                cond = ("False", "BadConfig", problem)
            elif name not in wanted:
                continue
            else:
                cond = ("False", "ClientConnectionFailed", link.message if link else "not connected")
            self._write_active(MULTIKUEUE_CLUSTERS, obj, *cond)

    def write_check_conditions(self, checks: Mapping[str, str]) -> None:
        for ac in self.cache.items("AdmissionCheck"):
            name = ac["metadata"]["name"]
            if name not in checks:
                continue
            cfg = self.fleet.configs.get(checks[name])
            if cfg is None:
                cond = (
                    "False",
                    "BadConfig",
                    f"Cannot load the AdmissionChecks parameters: MultiKueueConfig {checks[name]} not found",
                )
            else:
                missing = [c for c in cfg.clusters if c not in self.fleet.clusters]
                inactive = [
                    c
                    for c in cfg.clusters
                    if c in self.fleet.clusters
                    and not (c in self.fleet.links and self.fleet.links[c].connected)
                ]
                parts = ([f"Missing clusters: {missing}"] if missing else []) + (
                    [f"Inactive clusters: {inactive}"] if inactive else []
                )
                if len(missing) + len(inactive) == len(cfg.clusters):
                    cond = ("False", "NoUsableClusters", ", ".join(parts))
                elif parts:
                    cond = ("True", "SomeActiveClusters", ", ".join(parts))
                else:
                    cond = ("True", "Active", "The admission check is active")
            written = self._write_active(k8s.ADMISSION_CHECKS, ac, *cond)
            if written is not None:
                self.cache.upsert("AdmissionCheck", written)

    def _write_active(
        self, res: k8s.Resource, obj: Mapping[str, Any], status: str, reason: str, message: str
    ) -> dict[str, Any] | None:
        """Write the ``Active`` condition of a MultiKueueCluster or an AdmissionCheck (nothing when
        it already reads so); the object as written, or None."""
        conditions = (obj.get("status") or {}).get("conditions") or []
        current: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Active"), {})
        if (
            current.get("status") == status
            and current.get("reason") == reason
            and current.get("message") == message
        ):
            return None
        body = copy.deepcopy(dict(obj))
        new = {
            "type": "Active",
            "status": status,
            "reason": reason,
            "message": message[:32768],
            "lastTransitionTime": current.get("lastTransitionTime")
            if current.get("status") == status
            else micro_time(self.clock()).split(".")[0] + "Z",
            "observedGeneration": (obj.get("metadata") or {}).get("generation", 0),
        }
        body.setdefault("status", {})["conditions"] = [c for c in conditions if c.get("type") != "Active"] + [
            new
        ]
        try:
            if res is MULTIKUEUE_CLUSTERS:
                written = self.api.replace(MULTIKUEUE_CLUSTERS, body, sub="status")
                self.fleet.cluster_objects[obj["metadata"]["name"]] = written
            else:
                written = self.api.replace(k8s.ADMISSION_CHECKS, body, sub="status")
        except ApiError as err:
            log.debug("Active of %s %s not written: %s", res.kind, obj["metadata"]["name"], err)
            return None
        return written
