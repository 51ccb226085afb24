"""MultiKueue on the manager cluster: Kueue's flow, with gpuplane's dispatcher beside Kueue's.

For every Workload that holds quota in a ClusterQueue with a MultiKueue AdmissionCheck
(``controllerName: kueue.x-k8s.io/multikueue``), one pass of :class:`MultiKueue`::

    local finished, or quota released ---------> delete its copies on every worker
    a copy Finished on a worker ----------------> copy the worker job's status, finish the local one,
                                                  delete the copies
    the admitted copy evicted on its worker ----> check Retry (quota released, dispatched again)
    a copy admitted on a worker ----------------> delete the other copies; create the job there
                                                  (label kueue.x-k8s.io/prebuilt-workload-name,
                                                  managedBy cleared); check Ready,
                                                  status.clusterName; sync the job's status back
    check Ready, the admitting worker lost -----> wait workerLostTimeout from the disconnect,
                                                  then Retry
    the local job not left to MultiKueue -------> check Rejected (its managedBy is not
                                                  kueue.x-k8s.io/multikueue)
    check Pending ------------------------------> nominate (status.nominatedClusterNames) and
                                                  copy the Workload to the nominated workers

The local job (a batch Job, JobSet, PyTorchJob, TrainJob or RayJob:
:mod:`gpuplane.k8s.multikueue_jobs`) carries ``managedBy: kueue.x-k8s.io/multikueue``, so its
controller on the manager leaves it alone; once the check is Ready the core admits the Workload
with no placement (its nodes are on the worker) and the job is released as any other. Copies on a
worker carry the label ``kueue.x-k8s.io/multikueue-origin``; every ``gc_interval`` the copies whose
local Workload is gone are deleted. The manager keeps no state a restart loses: the nomination's start is the
check's Pending time, and a worker's loss is counted from when this process saw it fail.

It also keeps each MultiKueueCluster's ``Active`` condition and each MultiKueue AdmissionCheck's
``Active`` condition as Kueue does (``SomeActiveClusters`` / ``NoUsableClusters`` / ``BadConfig``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.k8s.multikueue_dispatch import Nominations
from gpuplane.k8s.multikueue_fleet import (
    MULTIKUEUE_CLUSTERS,
    MULTIKUEUE_CONFIGS,
    Fleet,
    MultiKueueSettings,
)
from gpuplane.k8s.multikueue_flow import WorkloadFlow
from gpuplane.k8s.multikueue_jobs import owner_of
from gpuplane.k8s.multikueue_status import FleetStatus
from gpuplane.k8s.multikueue_workers import RemoteObjects, WorkerLink, WorkerSummary, kubeconfig_text
from gpuplane.model.errors import InputError
from gpuplane.model.multikueue import (
    MULTIKUEUE_CONTROLLER,
    LocationType,
    MultiKueueConfig,
    WorkerCluster,
    config_of_check,
    parse_config,
    parse_worker_cluster,
)

__all__ = ["MULTIKUEUE_CONTROLLER", "MultiKueue", "MultiKueueSettings"]

log = logging.getLogger(__name__)

SLOW_PASS_SECONDS = 1.0  # a pass longer than this is logged with where its time went


class MultiKueue:
    """The MultiKueue admission check on a manager (owns the worker links and the objects
    listed from the manager: configs and clusters; the Workloads come from the controller's cache)."""

    def __init__(  # noqa: PLR0913, PLR0917 - the controller's parts, each passed in
        self,
        api: KubeApi,
        cache: Cache,
        clock: Callable[[], float],
        monotonic: Callable[[], float],
        event: Callable[[dict[str, Any], str, str, str], None],
        settings: MultiKueueSettings | None = None,
    ) -> None:
        self.api = api
        self.cache = cache
        self.monotonic = monotonic
        self.settings = settings or MultiKueueSettings()
        self.fleet = Fleet(api, cache, clock, monotonic, event, self.settings)
        self._pool = ThreadPoolExecutor(self.settings.write_workers, thread_name_prefix="multikueue")
        self.flow = WorkloadFlow(self.fleet)
        self.nominations = Nominations(self.fleet, self.flow, self._pool)
        self.status = FleetStatus(self.fleet)
        self._listed_at = -1e18
        # Per workload: the versions of what its last step read, and whether it then waited for a
        # nomination (see _step); cleared every refresh_seconds.
        self._stepped: dict[str, tuple[tuple[str, ...], bool]] = {}
        self._gc_at = -1e18
        self._served = True

    def snapshot(self) -> tuple[dict[str, WorkerSummary], dict[str, int]]:
        """Each worker's last summary and the counters, copied (for the metrics, at scrape time)."""
        with self.fleet.lock:
            return dict(self.fleet.summaries), dict(self.fleet.counters)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for link in self.fleet.links.values():
            link.close()
        self.fleet.links.clear()

    # --- one pass ------------------------------------------------------------------------------

    def reconcile(self) -> None:
        checks = self._checks()
        if not checks:
            return
        now = self.monotonic()
        refresh = now - self._listed_at >= self.settings.refresh_seconds
        if refresh:
            self._list_objects()
            self._listed_at = now
        wanted = {c for cfg in self.fleet.configs.values() for c in cfg.clusters}
        self._connect(wanted)
        started = time.monotonic()
        remotes = {
            name: link.observe(self.settings.origin)
            for name, link in self.fleet.links.items()
            if name in wanted
        }
        observed = time.monotonic()
        self.status.write_cluster_conditions(wanted)
        if refresh:
            self.status.summarize(wanted)
        self.status.write_check_conditions(checks)
        found: list[tuple[dict[str, Any], Mapping[str, Any], MultiKueueConfig]] = []
        for wl in self.cache.items("Workload"):
            for state in (wl.get("status") or {}).get("admissionChecks") or []:
                cfg = self.fleet.configs.get(checks.get(state.get("name"), "") or "")
                if cfg is not None:
                    found.append((wl, state, cfg))
                    break
        if refresh:
            self._stepped.clear()  # every workload stepped again now and then: a write that failed is retried
        # Workloads are independent: their steps (writes on the manager and the workers) go at once.
        waits = list(self._pool.map(lambda item: self._step(item[0], item[1], item[2], remotes), found))
        for key in set(self._stepped) - {object_key(wl) for wl, _, _ in found}:
            del self._stepped[key]
        dispatching = [
            (wl, str(state["name"]), cfg) for (wl, state, cfg), w in zip(found, waits, strict=True) if w
        ]
        stepped = time.monotonic()
        if dispatching:
            self.nominations.nominate(dispatching, remotes)
        done = time.monotonic()
        if done - started > SLOW_PASS_SECONDS:
            log.info(
                "multikueue pass: %d workloads (%d to nominate): workers read in %.2fs, steps %.2fs, "
                "nominations %.2fs",
                len(found),
                len(dispatching),
                observed - started,
                stepped - observed,
                done - stepped,
            )
        if now - self._gc_at >= self.settings.gc_interval:
            self._gc_at = now
            self.flow.collect_orphans(remotes)

    def _step(
        self,
        wl: dict[str, Any],
        state: Mapping[str, Any],
        cfg: MultiKueueConfig,
        remotes: Mapping[str, RemoteObjects | None],
    ) -> bool:
        """Carry one workload's flow a step, unless nothing it reads changed since its last step (the
        flow is a function of the objects' versions, and of time only while a worker is lost)."""
        key = object_key(wl)
        seen = _versions(wl, cfg, remotes, self.fleet.links, self.flow.local_job(wl))
        last = self._stepped.get(key)
        if seen is not None and last is not None and last[0] == seen:
            return last[1]
        waits = self.flow.reconcile_workload(wl, state, cfg, remotes)
        if seen is not None:
            self._stepped[key] = (seen, waits)
        return waits

    def _checks(self) -> dict[str, str]:
        """MultiKueue AdmissionCheck name -> its MultiKueueConfig name."""
        out = {}
        for ac in self.cache.items("AdmissionCheck"):
            try:
                cfg = config_of_check(ac)
            except InputError as err:
                self.fleet.problems[f"AdmissionCheck/{ac['metadata']['name']}"] = err.message
                continue
            if cfg is not None:
                out[ac["metadata"]["name"]] = cfg
        return out

    def _list_objects(self) -> None:
        try:
            clusters = self.api.list(MULTIKUEUE_CLUSTERS).get("items") or []
            configs = self.api.list(MULTIKUEUE_CONFIGS).get("items") or []
        except ApiError as err:
            if err.not_found and self._served:
                log.warning("the MultiKueue CRDs are not installed (kubectl apply -k deploy/crds)")
                self._served = False
            return
        self._served = True
        self.fleet.cluster_objects = {c["metadata"]["name"]: c for c in clusters}
        self.fleet.clusters, self.fleet.configs = {}, {}
        for obj in clusters:
            try:
                self.fleet.clusters[obj["metadata"]["name"]] = parse_worker_cluster(obj)
            except InputError as err:
                self.fleet.problems[f"MultiKueueCluster/{obj['metadata'].get('name')}"] = err.message
        for obj in configs:
            try:
                cfg = parse_config(obj)
            except InputError as err:
                self.fleet.problems[f"MultiKueueConfig/{obj['metadata'].get('name')}"] = err.message
                continue
            self.fleet.configs[cfg.name] = cfg

    def _connect(self, wanted: set[str]) -> None:
        for name in list(self.fleet.links):
            link = self.fleet.links[name]
            if name not in wanted or self.fleet.clusters.get(name) != link.cluster:
                link.close()
                del self.fleet.links[name]
        for name in sorted(wanted):
            cluster = self.fleet.clusters.get(name)
            if cluster is None or name in self.fleet.links:
                continue
            try:
                text = kubeconfig_text(cluster, self._secret(cluster), self.settings.namespace)
                self.fleet.links[name] = WorkerLink(
                    cluster,
                    text,
                    qps=self.settings.worker_qps,
                    burst=self.settings.worker_burst,
                    clock=self.monotonic,
                    origin=self.settings.origin,
                    wake=self.cache.changed if self.settings.watch_workers else None,
                )
                self.fleet.problems.pop(f"MultiKueueCluster/{name}", None)
            except InputError as err:
                self.fleet.problems[f"MultiKueueCluster/{name}"] = err.message
            except Exception as err:
                self.fleet.problems[f"MultiKueueCluster/{name}"] = f"BadConfig: {err}".splitlines()[0]

    def _secret(self, cluster: WorkerCluster) -> dict[str, Any] | None:
        if cluster.location_type != LocationType.SECRET:
            return None
        try:
            return self.api.get(k8s.SECRETS, cluster.location, self.settings.namespace)
        except ApiError as err:
            if err.not_found:
                return None
            raise InputError(f"cannot read the Secret: {err.status} {err.reason}") from None


def _versions(
    wl: Mapping[str, Any],
    cfg: MultiKueueConfig,
    remotes: Mapping[str, RemoteObjects | None],
    links: Mapping[str, WorkerLink],
    local_job: Mapping[str, Any] | None,
) -> tuple[str, ...] | None:
    """The resourceVersions of what a workload's step reads: the Workload, its local job, and on each
    worker of its config its copy and the job made there; None while one of those workers is not
    connected (the step then depends on time: the lost worker's timeout)."""
    meta = wl.get("metadata") or {}
    key = object_key(wl)
    owner = owner_of(wl)
    seen = [_rv(wl), _rv(local_job)]
    for cluster in cfg.clusters:
        link, remote = links.get(cluster), remotes.get(cluster)
        if link is None or not link.connected or remote is None:
            return None
        seen.append(_rv(remote.workloads.get(key)))
        if owner is not None:
            kind, name = owner
            seen.append(_rv(remote.owners.get(kind.kind, {}).get(f"{meta.get('namespace', '')}/{name}")))
    return tuple(seen)


def _rv(obj: Mapping[str, Any] | None) -> str:
    return "" if obj is None else str((obj.get("metadata") or {}).get("resourceVersion", ""))
