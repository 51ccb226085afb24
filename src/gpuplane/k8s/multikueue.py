"""MultiKueue on the manager cluster: Kueue's flow, with gpuplane's dispatcher beside Kueue's.

For every Workload that holds quota in a ClusterQueue with a MultiKueue AdmissionCheck
(``controllerName: kueue.x-k8s.io/multikueue``), one pass of :class:`MultiKueue`::

    local finished, or quota released ---------> delete its copies on every worker
    a copy Finished on a worker ----------------> copy the worker Job's status, finish the local one,
                                                  delete the copies
    the admitted copy evicted on its worker ----> check Retry (quota released, dispatched again)
    a copy admitted on a worker ----------------> delete the other copies; create the Job there
                                                  (label kueue.x-k8s.io/prebuilt-workload-name,
                                                  managedBy cleared); check Ready,
                                                  status.clusterName; sync the Job's status back
    check Ready, the admitting worker lost -----> wait workerLostTimeout from the disconnect,
                                                  then Retry
    check Pending ------------------------------> nominate (status.nominatedClusterNames) and
                                                  copy the Workload to the nominated workers

The local Job carries ``spec.managedBy: kueue.x-k8s.io/multikueue``, so the Job controller of the
manager leaves it alone; once the check is Ready the core admits the Workload with no placement
(its nodes are on the worker) and the job is released as any other. Copies on a worker carry the
label ``kueue.x-k8s.io/multikueue-origin``; every ``gc_interval`` the copies whose local Workload
is gone are deleted. The manager keeps no state a restart loses: the nomination's start is the
check's Pending time, and a worker's loss is counted from when this process saw it fail.

It also keeps each MultiKueueCluster's ``Active`` condition and each MultiKueue AdmissionCheck's
``Active`` condition as Kueue does (``SomeActiveClusters`` / ``NoUsableClusters`` / ``BadConfig``).
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from gpuplane.insight.dispatch import ClusterView, DispatchPolicy, Nomination, nominate
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.k8s.leader import micro_time
from gpuplane.k8s.multikueue_workers import (
    DEFAULT_WORKER_BURST,
    DEFAULT_WORKER_QPS,
    RemoteObjects,
    WorkerLink,
    fit_views,
    kubeconfig_text,
)
from gpuplane.model import labels as keys
from gpuplane.model.conditions import ConditionType, condition, with_conditions
from gpuplane.model.errors import InputError
from gpuplane.model.fields import lenient_timestamp
from gpuplane.model.multikueue import (
    MULTIKUEUE_CONTROLLER,
    LocationType,
    MultiKueueConfig,
    WorkerCluster,
    config_of_check,
    parse_config,
    parse_worker_cluster,
)

log = logging.getLogger(__name__)

MULTIKUEUE_CLUSTERS = k8s.MULTIKUEUE_CLUSTERS
MULTIKUEUE_CONFIGS = k8s.MULTIKUEUE_CONFIGS

# Annotations on the manager's Workload: gpuplane's dispatcher's data-locality selector
# (``key=value,...``: a worker's MultiKueueCluster must carry these labels) and spill-over order.
CLUSTER_SELECTOR_ANNOTATION = "gpuplane.dev/cluster-selector"
SPILL_ORDER_ANNOTATION = "gpuplane.dev/cluster-order"
# On a copy: the QuotaReserved time of the manager's reservation it was made for.
SLOW_PASS_SECONDS = 1.0  # a pass longer than this is logged with where its time went
RESERVATION_ANNOTATION = "gpuplane.dev/multikueue-reservation"

# Job template labels the Job controller sets; a copy made from them would not validate.
_JOB_CONTROLLER_LABELS = (
    "controller-uid",
    "batch.kubernetes.io/controller-uid",
    "job-name",
    "batch.kubernetes.io/job-name",
)


@dataclass(frozen=True, slots=True)
class MultiKueueSettings:
    """How the manager dispatches (Kueue's Configuration ``multiKueue`` block, and gpuplane's own).

    ``dispatcher``: gpuplane's, which asks each worker first and nominates one, is the default;
    Kueue's default is AllAtOnce. ``worker_qps``/``worker_burst``: the client's rate per worker."""

    origin: str = "multikueue"
    namespace: str = "gpuplane-system"  # where the workers' kubeconfig Secrets are
    worker_lost_timeout: float = 900.0
    gc_interval: float = 60.0
    dispatcher: DispatchPolicy = "gpuplane"
    worker_qps: float = DEFAULT_WORKER_QPS
    worker_burst: int = DEFAULT_WORKER_BURST
    refresh_seconds: float = 5.0  # how often the MultiKueue objects are listed again
    write_workers: int = 16  # workloads whose steps (writes) run at once


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
        self.clock = clock
        self.monotonic = monotonic
        self.event = event
        self.settings = settings or MultiKueueSettings()
        self.links: dict[str, WorkerLink] = {}
        self.clusters: dict[str, WorkerCluster] = {}
        self.cluster_objects: dict[str, dict[str, Any]] = {}
        self.configs: dict[str, MultiKueueConfig] = {}
        self.problems: dict[str, str] = {}  # object -> its error, for the Active conditions
        self.counters: dict[str, int] = {
            "dispatched": 0,
            "remote_jobs_created": 0,
            "requeued": 0,
            "gc_deleted": 0,
        }
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(self.settings.write_workers, thread_name_prefix="multikueue")
        self._listed_at = -1e18
        self._gc_at = -1e18
        self._served = True

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for link in self.links.values():
            link.close()
        self.links.clear()

    # --- one pass ------------------------------------------------------------------------------

    def reconcile(self) -> None:
        checks = self._checks()
        if not checks:
            return
        now = self.monotonic()
        if now - self._listed_at >= self.settings.refresh_seconds:
            self._list_objects()
            self._listed_at = now
        wanted = {c for cfg in self.configs.values() for c in cfg.clusters}
        self._connect(wanted)
        started = time.monotonic()
        remotes = {
            name: link.observe(self.settings.origin) for name, link in self.links.items() if name in wanted
        }
        observed = time.monotonic()
        self._write_cluster_conditions(wanted)
        self._write_check_conditions(checks)
        found: list[tuple[dict[str, Any], Mapping[str, Any], MultiKueueConfig]] = []
        for wl in self.cache.items("Workload"):
            for state in (wl.get("status") or {}).get("admissionChecks") or []:
                cfg = self.configs.get(checks.get(state.get("name"), "") or "")
                if cfg is not None:
                    found.append((wl, state, cfg))
                    break
        # Workloads are independent: their steps (writes on the manager and the workers) go at once.
        waits = list(
            self._pool.map(lambda item: self._reconcile_workload(item[0], item[1], item[2], remotes), found)
        )
        dispatching = [
            (wl, str(state["name"]), cfg) for (wl, state, cfg), w in zip(found, waits, strict=True) if w
        ]
        stepped = time.monotonic()
        if dispatching:
            self._nominate(dispatching, remotes)
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
            self._collect_orphans(remotes)

    def _checks(self) -> dict[str, str]:
        """MultiKueue AdmissionCheck name -> its MultiKueueConfig name."""
        out = {}
        for ac in self.cache.items("AdmissionCheck"):
            try:
                cfg = config_of_check(ac)
            except InputError as err:
                self.problems[f"AdmissionCheck/{ac['metadata']['name']}"] = err.message
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
        self.cluster_objects = {c["metadata"]["name"]: c for c in clusters}
        self.clusters, self.configs = {}, {}
        for obj in clusters:
            try:
                self.clusters[obj["metadata"]["name"]] = parse_worker_cluster(obj)
            except InputError as err:
                self.problems[f"MultiKueueCluster/{obj['metadata'].get('name')}"] = err.message
        for obj in configs:
            try:
                cfg = parse_config(obj)
            except InputError as err:
                self.problems[f"MultiKueueConfig/{obj['metadata'].get('name')}"] = err.message
                continue
            self.configs[cfg.name] = cfg

    def _connect(self, wanted: set[str]) -> None:
        for name in list(self.links):
            link = self.links[name]
            if name not in wanted or self.clusters.get(name) != link.cluster:
                link.close()
                del self.links[name]
        for name in sorted(wanted):
            cluster = self.clusters.get(name)
            if cluster is None or name in self.links:
                continue
            try:
                text = kubeconfig_text(cluster, self._secret(cluster), self.settings.namespace)
                self.links[name] = WorkerLink(
                    cluster,
                    text,
                    qps=self.settings.worker_qps,
                    burst=self.settings.worker_burst,
                    clock=self.monotonic,
                )
                self.problems.pop(f"MultiKueueCluster/{name}", None)
            except InputError as err:
                self.problems[f"MultiKueueCluster/{name}"] = err.message
            except Exception as err:
                self.problems[f"MultiKueueCluster/{name}"] = f"BadConfig: {err}".splitlines()[0]

    def _secret(self, cluster: WorkerCluster) -> dict[str, Any] | None:
        if cluster.location_type != LocationType.SECRET:
            return None
        try:
            return self.api.get(k8s.SECRETS, cluster.location, self.settings.namespace)
        except ApiError as err:
            if err.not_found:
                return None
            raise InputError(f"cannot read the Secret: {err.status} {err.reason}") from None

    # --- one workload --------------------------------------------------------------------------

    def _reconcile_workload(  # noqa: PLR0911, PLR0912 - one return per step of Kueue's flow
        self,
        wl: dict[str, Any],
        acs: Mapping[str, Any],
        cfg: MultiKueueConfig,
        remotes: Mapping[str, RemoteObjects | None],
    ) -> bool:
        """Carry one workload's flow a step (module docstring); True when it waits for nomination."""
        key = object_key(wl)
        check = str(acs["name"])
        mine = {c: r for c, r in remotes.items() if c in cfg.clusters}
        copies = {c: r.workloads[key] for c, r in mine.items() if r is not None and key in r.workloads}
        if _true(wl, "Evicted") and not _true(wl, "Finished"):
            self._stop_local_job(wl)  # it runs nowhere now: the eviction may give its quota back
        if _true(wl, "Finished") or not _true(wl, "QuotaReserved"):
            for cluster in copies:
                self._delete_remote(cluster, wl)
            return False
        self._drop_duplicates(wl, copies)
        done = next(((c, w) for c, w in sorted(copies.items()) if _true(w, "Finished")), None)
        if done is not None:
            cluster, remote = done
            self._sync_job(cluster, wl, mine[cluster], final=True)
            self._finish_local(wl, remote, cluster)
            for c in copies:
                self._delete_remote(c, wl)
            return False
        state = acs.get("state")
        cluster_name = (wl.get("status") or {}).get("clusterName")
        if state == "Ready":
            evicted = next((c for c, w in copies.items() if _true(w, "Evicted")), None)
            if evicted is not None:
                self._set_check(
                    wl,
                    check,
                    "Retry",
                    f"Workload evicted on worker cluster: {evicted!r}, resetting for re-admission",
                )
                self._count("requeued")
                return False
        admitting = next((c for c, w in sorted(copies.items()) if _true(w, "Admitted")), None)
        if admitting is None and state == "Ready":
            link = self.links.get(str(cluster_name or ""))
            if cluster_name and link is not None and not link.connected:
                lost_for = self.monotonic() - (link.lost_since or self.monotonic())
                if lost_for < self.settings.worker_lost_timeout:
                    return False  # keep it: the worker may be back before the timeout
                message = f"Admitting remote lost: {cluster_name} unreachable for {lost_for:.0f}s"
            else:
                message = "Admitting remote no longer exists"
            self._set_check(wl, check, "Retry", message)
            self._count("requeued")
            return False
        if admitting is not None:
            for c in copies:
                if c != admitting:
                    self._delete_remote(c, wl)
            objects = mine[admitting]
            assert objects is not None
            self._ensure_job(admitting, wl, objects)
            self._sync_job(admitting, wl, objects, final=False)
            said = str(acs.get("message") or "")
            message = f'The workload was admitted on "{admitting}"'
            if state == "Ready":
                message = said  # written once; the dispatch reason stays in it
            elif said.startswith("nominated"):
                message += f" ({said})"
            self._set_check(wl, check, "Ready", message, cluster_name=admitting)
            return False
        return state == "Pending"

    def _drop_duplicates(self, wl: Mapping[str, Any], copies: dict[str, dict[str, Any]]) -> None:
        """Delete (and forget) the copies made for an earlier reservation (a worker lost past the
        timeout, then back): each copy records the reservation it was made for, on the manager's clock."""
        reserved = _reserved_stamp(wl)
        for cluster, remote_wl in list(copies.items()):
            made_for = _annotation(remote_wl, RESERVATION_ANNOTATION)
            if made_for and made_for != reserved:
                self._delete_remote(cluster, wl)
                del copies[cluster]

    def _nominate(
        self,
        waiting: list[tuple[dict[str, Any], str, MultiKueueConfig]],
        remotes: Mapping[str, RemoteObjects | None],
    ) -> None:
        """Nominate the waiting workloads' workers and copy them there (the gpuplane dispatcher asks
        each worker about the whole batch at once)."""
        now = self.clock()
        views: dict[str, dict[str, ClusterView]] = {}
        if self.settings.dispatcher == "gpuplane":
            todo = [wl for wl, _, _ in waiting if not (wl.get("status") or {}).get("nominatedClusterNames")]
            views = self._fit_views(todo, [cfg for _, _, cfg in waiting], now)
        list(self._pool.map(lambda item: self._nominate_one(item, views, remotes, now), waiting))

    def _nominate_one(
        self,
        item: tuple[dict[str, Any], str, MultiKueueConfig],
        views: Mapping[str, Mapping[str, ClusterView]],
        remotes: Mapping[str, RemoteObjects | None],
        now: float,
    ) -> None:
        """Nominate one workload's workers (its views given) and copy it there."""
        wl, check, cfg = item
        key = object_key(wl)
        status = wl.get("status") or {}
        already = list(status.get("nominatedClusterNames") or [])
        if self.settings.dispatcher == "gpuplane" and already:
            nomination = Nomination(tuple(already), "")
        else:
            cluster_views = [
                views.get(c, {}).get(key) or self._plain_view(c) for c in cfg.clusters if c in self.clusters
            ]
            nomination = nominate(
                self.settings.dispatcher,
                cluster_views,
                since_first_nomination_s=max(0.0, now - _pending_since(wl, check, now)),
                cluster_selector=_selector(wl),
                spill_order=_spill_order(wl),
            )
        chosen = list(nomination.clusters)
        said = _check_message(wl, check)
        if (
            chosen != already or (nomination.reason and nomination.reason != said)
        ) and not self._write_nomination(wl, check, chosen, nomination.reason or said):
            return
        for cluster in cfg.clusters:
            remote = remotes.get(cluster)
            if remote is None:
                continue
            present = key in remote.workloads
            if cluster in chosen and not present:
                self._create_remote_workload(cluster, wl)
            elif cluster not in chosen and present:
                self._delete_remote(cluster, wl)

    def _fit_views(
        self, todo: list[dict[str, Any]], configs: list[MultiKueueConfig], now: float
    ) -> dict[str, dict[str, ClusterView]]:
        """Where each workload of ``todo`` would be admitted now, packing the batch worker by worker
        in the configs' order (the most preferred first, as a MultiKueueConfig lists them): each
        worker is asked about the workloads no earlier worker takes now, in their queue order. A
        workload that fits nowhere now has its predicted start on every worker it was asked of."""
        order = list(
            dict.fromkeys(c for cfg in sorted(set(configs), key=lambda c: c.name) for c in cfg.clusters)
        )
        views: dict[str, dict[str, ClusterView]] = {}
        remaining = list(todo)
        for name in order:
            link = self.links.get(name)
            labels = _labels(self.cluster_objects.get(name))
            asked = [wl for wl in remaining if _matches(_selector(wl), labels)]
            if link is None or not asked:
                continue
            views[name] = fit_views(link, asked, labels, now)
            taken = {key for key, view in views[name].items() if view.fits_now}
            remaining = [wl for wl in remaining if object_key(wl) not in taken]
        return views

    def _plain_view(self, name: str) -> ClusterView:
        link = self.links.get(name)
        return ClusterView(
            name,
            _labels(self.cluster_objects.get(name)),
            active=link is not None and link.connected,
            note="" if link is None else link.message,
        )

    # --- writes on the manager -----------------------------------------------------------------

    def _set_check(
        self, wl: dict[str, Any], check: str, state: str, message: str, *, cluster_name: str | None = None
    ) -> None:
        status = wl.get("status") or {}
        current: Mapping[str, Any] = next(
            (s for s in status.get("admissionChecks") or [] if s.get("name") == check), {}
        )
        if (
            current.get("state") == state
            and current.get("message") == message
            and (cluster_name is None or status.get("clusterName") == cluster_name)
        ):
            return
        body = copy.deepcopy(wl)
        new_status = body.setdefault("status", {})
        entry = {
            "name": check,
            "state": state,
            "message": message[:32768],
            "lastTransitionTime": current.get("lastTransitionTime")
            if current.get("state") == state
            else micro_time(self.clock()),
        }
        new_status["admissionChecks"] = [
            entry if s.get("name") == check else s for s in new_status.get("admissionChecks") or []
        ]
        if cluster_name is not None and state == "Ready":
            new_status["clusterName"] = cluster_name
            new_status.pop("nominatedClusterNames", None)
        if state == "Retry":
            new_status.pop("nominatedClusterNames", None)
        try:
            written = self.api.replace(k8s.WORKLOADS, body, sub="status")
        except ApiError as err:
            log.debug("check %s of %s not written: %s", check, object_key(wl), err)
            return
        self.cache.upsert("Workload", written)
        if state != current.get("state"):
            self.event(written, "Normal" if state == "Ready" else "Warning", "MultiKueue", message)

    def _write_nomination(self, wl: dict[str, Any], check: str, chosen: list[str], reason: str) -> bool:
        """``status.nominatedClusterNames`` and, as the check's (still Pending) message, why: one write."""
        body = copy.deepcopy(wl)
        status = body.setdefault("status", {})
        if chosen:
            status["nominatedClusterNames"] = chosen
        else:
            status.pop("nominatedClusterNames", None)
        for entry in status.get("admissionChecks") or []:
            if entry.get("name") == check:
                entry["message"] = reason[:32768]
        try:
            written = self.api.replace(k8s.WORKLOADS, body, sub="status")
        except ApiError as err:
            log.debug("nomination of %s not written: %s", object_key(wl), err)
            return False
        self.cache.upsert("Workload", written)
        return True

    def _finish_local(self, wl: dict[str, Any], remote: Mapping[str, Any], cluster: str) -> None:
        done = next(c for c in remote["status"]["conditions"] if c.get("type") == "Finished")
        body = copy.deepcopy(wl)
        status = body.setdefault("status", {})
        status["conditions"] = with_conditions(
            status.get("conditions", []),
            condition(
                ConditionType.FINISHED,
                str(done.get("reason") or "Succeeded"),
                micro_time(self.clock()),
                f"From {cluster}: {done.get('message', '')}"[:32768],
            ),
        )
        try:
            written = self.api.replace(k8s.WORKLOADS, body, sub="status")
        except ApiError as err:
            log.debug("finish of %s not written: %s", object_key(wl), err)
            return
        self.cache.upsert("Workload", written)

    # --- writes on the workers -----------------------------------------------------------------

    def _create_remote_workload(self, cluster: str, wl: Mapping[str, Any]) -> None:
        meta = wl["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != keys.JOB_UID_LABEL}
        labels[keys.MULTIKUEUE_ORIGIN_LABEL] = self.settings.origin
        annotations = dict(meta.get("annotations") or {})
        annotations[keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION] = str(meta.get("uid", ""))
        annotations[RESERVATION_ANNOTATION] = _reserved_stamp(wl)
        body = {
            "apiVersion": k8s.WORKLOADS.api_version,
            "kind": "Workload",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
            },
            "spec": copy.deepcopy(wl.get("spec") or {}),
        }
        try:
            self.links[cluster].api.create(k8s.WORKLOADS, body, meta["namespace"])
            self._count("dispatched")
        except ApiError as err:
            if not err.conflict:
                log.info("copy of %s to %s not created: %s", object_key(wl), cluster, err)
        except Exception as err:
            self.links[cluster].lost(str(err).splitlines()[0][:300])

    def _delete_remote(self, cluster: str, wl: Mapping[str, Any]) -> None:
        link = self.links.get(cluster)
        if link is None:
            return
        meta = wl["metadata"]
        for res, name in ((k8s.JOBS, _owner_job_name(wl)), (k8s.WORKLOADS, meta["name"])):
            if name is None:
                continue
            try:
                link.api.delete(res, name, meta["namespace"], propagationPolicy="Background")
            except ApiError as err:
                if not err.not_found:
                    log.info("copy of %s on %s not deleted: %s", object_key(wl), cluster, err)
            except Exception as err:
                link.lost(str(err).splitlines()[0][:300])
                return

    def _ensure_job(self, cluster: str, wl: Mapping[str, Any], remote: RemoteObjects) -> None:
        local = self._local_job(wl)
        if local is None:
            return
        key = object_key(local)
        if key in remote.jobs:
            return
        meta = local["metadata"]
        labels = dict(meta.get("labels") or {})
        labels[keys.PREBUILT_WORKLOAD_LABEL] = wl["metadata"]["name"]
        labels[keys.MULTIKUEUE_ORIGIN_LABEL] = self.settings.origin
        annotations = dict(meta.get("annotations") or {})
        annotations[keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION] = str(meta.get("uid", ""))
        spec = copy.deepcopy(local.get("spec") or {})
        spec.pop("selector", None)
        spec.pop("managedBy", None)
        template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
        for label in _JOB_CONTROLLER_LABELS:
            template_labels.pop(label, None)
        body = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "labels": labels,
                "annotations": annotations,
            },
            "spec": spec,
        }
        try:
            created = self.links[cluster].api.create(k8s.JOBS, body, meta["namespace"])
            remote.jobs[key] = created
            self._count("remote_jobs_created")
        except ApiError as err:
            if not err.conflict:
                log.info("job of %s not created on %s: %s", object_key(wl), cluster, err)
        except Exception as err:
            self.links[cluster].lost(str(err).splitlines()[0][:300])

    def _sync_job(
        self, cluster: str, wl: Mapping[str, Any], remote: RemoteObjects | None, *, final: bool
    ) -> None:
        """Copy the worker Job's status to the local Job: while the local one runs (unsuspended),
        and once the remote one has finished (Kueue's rule: never a running status on a suspended Job)."""
        local = self._local_job(wl)
        if local is None or remote is None:
            return
        theirs = remote.jobs.get(object_key(local))
        if theirs is None:
            return
        suspended = bool((local.get("spec") or {}).get("suspend"))
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (theirs.get("status") or {}).get("conditions") or []
        )
        if suspended and not (final and finished):
            return
        status = copy.deepcopy(theirs.get("status") or {})
        if status == (local.get("status") or {}):
            return
        body = copy.deepcopy(local)
        body["status"] = status
        try:
            written = self.api.replace(k8s.JOBS, body, sub="status")
        except ApiError as err:
            log.debug("status of job %s not synced from %s: %s", object_key(local), cluster, err)
            return
        self.cache.upsert("Job", written)

    def _stop_local_job(self, wl: Mapping[str, Any]) -> None:
        """The manager's suspended Job of an evicted workload counts no active pods: its pods ran on a
        worker, and the manager, which manages this Job (``managedBy``), says they stopped here."""
        local = self._local_job(wl)
        if local is None or not (local.get("spec") or {}).get("suspend"):
            return
        status = local.get("status") or {}
        if not status.get("active") and not status.get("ready"):
            return
        body = copy.deepcopy(local)
        body["status"]["active"] = 0
        body["status"].pop("ready", None)
        try:
            written = self.api.replace(k8s.JOBS, body, sub="status")
        except ApiError as err:
            log.debug("status of job %s not reset: %s", object_key(local), err)
            return
        self.cache.upsert("Job", written)

    def _local_job(self, wl: Mapping[str, Any]) -> dict[str, Any] | None:
        name = _owner_job_name(wl)
        if name is None:
            return None
        return self.cache.get("Job", f"{wl['metadata']['namespace']}/{name}")

    def _collect_orphans(self, remotes: Mapping[str, RemoteObjects | None]) -> None:
        """Delete the copies on workers whose local Workload is gone (Kueue's gcInterval)."""
        for cluster, remote in sorted(remotes.items()):
            if remote is None:
                continue
            link = self.links[cluster]
            for key, obj in sorted(remote.workloads.items()):
                if self.cache.get("Workload", key) is None:
                    self._delete(link, k8s.WORKLOADS, obj)
            for _key, job in sorted(remote.jobs.items()):
                prebuilt = (job["metadata"].get("labels") or {}).get(keys.PREBUILT_WORKLOAD_LABEL)
                ns = job["metadata"]["namespace"]
                if prebuilt and self.cache.get("Workload", f"{ns}/{prebuilt}") is None:
                    self._delete(link, k8s.JOBS, job)

    def _delete(self, link: WorkerLink, res: k8s.Resource, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        try:
            link.api.delete(res, meta["name"], meta["namespace"], propagationPolicy="Background")
            self._count("gc_deleted")
            log.info(
                "orphan %s %s/%s deleted on %s", res.kind, meta["namespace"], meta["name"], link.cluster.name
            )
        except ApiError as err:
            if not err.not_found:
                log.info("orphan %s/%s not deleted: %s", meta["namespace"], meta["name"], err)
        except Exception as err:
            link.lost(str(err).splitlines()[0][:300])

    # --- Active conditions ---------------------------------------------------------------------

    def _write_cluster_conditions(self, wanted: set[str]) -> None:
        for name, obj in sorted(self.cluster_objects.items()):
            link = self.links.get(name)
            problem = self.problems.get(f"MultiKueueCluster/{name}")
            if link is not None and link.connected:
                cond = ("True", "Active", "Connected")
            elif problem is not None:
                cond = ("False", "BadConfig", problem)
            elif name not in wanted:
                continue
            else:
                cond = ("False", "ClientConnectionFailed", link.message if link else "not connected")
            self._write_active(MULTIKUEUE_CLUSTERS, obj, *cond)

    def _write_check_conditions(self, checks: Mapping[str, str]) -> None:
        for ac in self.cache.items("AdmissionCheck"):
            name = ac["metadata"]["name"]
            if name not in checks:
                continue
            cfg = self.configs.get(checks[name])
            if cfg is None:
                cond = (
                    "False",
                    "BadConfig",
                    f"Cannot load the AdmissionChecks parameters: MultiKueueConfig {checks[name]} not found",
                )
            else:
                missing = [c for c in cfg.clusters if c not in self.clusters]
                inactive = [
                    c
                    for c in cfg.clusters
                    if c in self.clusters and not (c in self.links and self.links[c].connected)
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
                self.cluster_objects[obj["metadata"]["name"]] = written
            else:
                written = self.api.replace(k8s.ADMISSION_CHECKS, body, sub="status")
        except ApiError as err:
            log.debug("Active of %s %s not written: %s", res.kind, obj["metadata"]["name"], err)
            return None
        return written


def _true(obj: Mapping[str, Any], ctype: str) -> bool:
    return any(
        c.get("type") == ctype and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _owner_job_name(wl: Mapping[str, Any]) -> str | None:
    for ref in (wl.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("kind") == "Job":
            return str(ref["name"])
    return None


def _labels(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def _annotation(wl: Mapping[str, Any], name: str) -> str:
    return str(((wl.get("metadata") or {}).get("annotations") or {}).get(name, ""))


def _selector(wl: Mapping[str, Any]) -> dict[str, str]:
    text = _annotation(wl, CLUSTER_SELECTOR_ANNOTATION)
    pairs = [p.split("=", 1) for p in text.split(",") if "=" in p]
    return {k.strip(): v.strip() for k, v in pairs}


def _matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _spill_order(wl: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(c.strip() for c in _annotation(wl, SPILL_ORDER_ANNOTATION).split(",") if c.strip())


def _check_message(wl: Mapping[str, Any], check: str) -> str:
    for state in (wl.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            return str(state.get("message") or "")
    return ""


def _reserved_stamp(wl: Mapping[str, Any]) -> str:
    for cond in (wl.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "QuotaReserved" and cond.get("status") == "True":
            return str(cond.get("lastTransitionTime", ""))
    return ""


def _pending_since(wl: Mapping[str, Any], check: str, now: float) -> float:
    for state in (wl.get("status") or {}).get("admissionChecks") or []:
        if state.get("name") == check:
            return lenient_timestamp(state.get("lastTransitionTime")) or now
    return now


__all__ = ["MULTIKUEUE_CONTROLLER", "MultiKueue", "MultiKueueSettings"]
