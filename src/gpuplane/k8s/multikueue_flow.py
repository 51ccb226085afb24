"""MultiKueue on a manager, one workload at a time: the steps of Kueue's flow (the table in
:mod:`gpuplane.k8s.multikueue`) and their writes, on the manager and on the workers."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.leader import micro_time
from gpuplane.k8s.multikueue_fleet import (
    RESERVATION_ANNOTATION,
    FleetPart,
    annotation_of,
    reserved_stamp,
)
from gpuplane.k8s.multikueue_jobs import KINDS, JobKind, owner_of
from gpuplane.k8s.multikueue_workers import RemoteObjects, WorkerLink
from gpuplane.model import labels as keys
from gpuplane.model.conditions import ConditionType, condition, condition_true, with_conditions
from gpuplane.model.multikueue import MultiKueueConfig

log = logging.getLogger(__name__)


class WorkloadFlow(FleetPart):
    """Carries each dispatched workload's flow a step per pass (owns no state: what it reads is the
    cache and the workers' objects, what it keeps is in the shared :class:`Fleet`)."""

    def reconcile_workload(  # noqa: PLR0911, PLR0912 - one return per step of Kueue's flow
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
        if condition_true(wl, "Evicted") and not condition_true(wl, "Finished"):
            self._stop_local_job(wl)  # it runs nowhere now: the eviction may give its quota back
        if condition_true(wl, "Finished") or not condition_true(wl, "QuotaReserved"):
            for cluster in copies:
                self.delete_remote(cluster, wl)
            return False
        if not copies and self._reject_unmanaged(wl, check):
            return False
        self._drop_duplicates(wl, copies)
        done = next(((c, w) for c, w in sorted(copies.items()) if condition_true(w, "Finished")), None)
        if done is not None:
            cluster, remote = done
            self._sync_job(cluster, wl, mine[cluster], final=True)
            self._finish_local(wl, remote, cluster)
            for c in copies:
                self.delete_remote(c, wl)
            return False
        state = acs.get("state")
        cluster_name = (wl.get("status") or {}).get("clusterName")
        if state == "Ready":
            evicted = next((c for c, w in copies.items() if condition_true(w, "Evicted")), None)
            if evicted is not None:
                self._set_check(
                    wl,
                    check,
                    "Retry",
                    f"Workload evicted on worker cluster: {evicted!r}, resetting for re-admission",
                )
                self.fleet.count("requeued")
                return False
        admitting = next((c for c, w in sorted(copies.items()) if condition_true(w, "Admitted")), None)
        if admitting is None and state == "Ready":
            link = self.fleet.links.get(str(cluster_name or ""))
            if cluster_name and link is not None and not link.connected:
                lost_for = self.monotonic() - (link.lost_since or self.monotonic())
                if lost_for < self.settings.worker_lost_timeout:
                    return False  # keep it: the worker may be back before the timeout
                message = f"Admitting remote lost: {cluster_name} unreachable for {lost_for:.0f}s"
            else:
                message = "Admitting remote no longer exists"
            self._set_check(wl, check, "Retry", message)
            self.fleet.count("requeued")
            return False
        if admitting is not None:
            for c in copies:
                if c != admitting:
                    self.delete_remote(c, wl)
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

    def _reject_unmanaged(self, wl: dict[str, Any], check: str) -> bool:
        """Reject the check of a workload whose job is not left to MultiKueue (its ``managedBy``, where
        its kind keeps it, is not Kueue's MultiKueue controller), as Kueue does: the core then releases
        its quota and deactivates it. True when rejected."""
        found = self._local_owner(wl)
        if found is None or found[0].multikueue_managed(found[1]):
            return False
        kind, local = found
        self._set_check(
            wl,
            check,
            "Rejected",
            "The owner is not managed by Kueue: Expecting "
            f'{".".join(kind.managed_by_path)} to be "{keys.MULTIKUEUE_CONTROLLER}" '
            f'not "{kind.managed_by(local) or ""}"',
        )
        return True

    def _drop_duplicates(self, wl: Mapping[str, Any], copies: dict[str, dict[str, Any]]) -> None:
        """Delete (and forget) the copies made for an earlier reservation (a worker lost past the
        timeout, then back): each copy records the reservation it was made for, on the manager's clock."""
        reserved = reserved_stamp(wl)
        for cluster, remote_wl in list(copies.items()):
            made_for = annotation_of(remote_wl, RESERVATION_ANNOTATION)
            if made_for and made_for != reserved:
                self.delete_remote(cluster, wl)
                del copies[cluster]

    def _set_check(
        self, wl: dict[str, Any], check: str, state: str, message: str, *, cluster_name: str | None = None
    ) -> None:
        status = wl.get("status") or {}
        current: Mapping[str, Any] = _check_of(wl, check)
        if (
            current.get("state") == state
            and current.get("message") == message
            and (cluster_name is None or status.get("clusterName") == cluster_name)
        ):
            return
        was = current.get("state")

        def set_state(body: dict[str, Any]) -> bool:
            new_status = body.setdefault("status", {})
            now = _check_of(body, check)
            if not now:
                return False  # the check is gone from the Workload meanwhile
            entry = {
                "name": check,
                "state": state,
                "message": message[:32768],
                "lastTransitionTime": now.get("lastTransitionTime")
                if now.get("state") == state
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
            return True

        written = self._write_workload_status(wl, set_state, f"check {check}")
        if written is not None and state != was:
            self.event(written, "Normal" if state == "Ready" else "Warning", "MultiKueue", message)

    def write_nomination(self, wl: dict[str, Any], check: str, chosen: list[str], reason: str) -> bool:
        """``status.nominatedClusterNames`` and, as the check's (still Pending) message, why: one write."""

        def nominate(body: dict[str, Any]) -> bool:
            status = body.setdefault("status", {})
            if _check_of(body, check).get("state") != "Pending":
                return False  # decided meanwhile: no nomination to write
            if chosen:
                status["nominatedClusterNames"] = chosen
            else:
                status.pop("nominatedClusterNames", None)
            for entry in status.get("admissionChecks") or []:
                if entry.get("name") == check:
                    entry["message"] = reason[:32768]
            return True

        return self._write_workload_status(wl, nominate, "nomination") is not None

    def _finish_local(self, wl: dict[str, Any], remote: Mapping[str, Any], cluster: str) -> None:
        done = next(c for c in remote["status"]["conditions"] if c.get("type") == "Finished")

        def finish(body: dict[str, Any]) -> bool:
            if condition_true(body, "Finished"):
                return False
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
            return True

        self._write_workload_status(wl, finish, "finish")

    def _write_workload_status(
        self, wl: Mapping[str, Any], change: Callable[[dict[str, Any]], bool], what: str
    ) -> dict[str, Any] | None:
        """Write ``change`` (applied to a copy; False: nothing to write) to the Workload's status. On a
        conflict (the Workload changed since it was cached: the core's own writes race these) it is
        read again and the change applied once more, instead of waiting for the next pass."""
        body = copy.deepcopy(dict(wl))
        for attempt in range(2):
            if not change(body):
                return None
            try:
                written = self.api.replace(k8s.WORKLOADS, body, sub="status")
            except ApiError as err:
                if err.conflict and attempt == 0:
                    self.fleet.count("status_conflicts_retried")
                    meta = wl["metadata"]
                    try:
                        body = self.api.get(k8s.WORKLOADS, meta["name"], meta["namespace"])
                    except ApiError:
                        return None
                    continue
                log.debug("%s of %s not written: %s", what, object_key(wl), err)
                return None
            self.cache.upsert("Workload", written)
            return written
        return None

    def create_remote_workload(self, cluster: str, wl: Mapping[str, Any]) -> None:
        meta = wl["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != keys.JOB_UID_LABEL}
        labels[keys.MULTIKUEUE_ORIGIN_LABEL] = self.settings.origin
        annotations = dict(meta.get("annotations") or {})
        annotations[keys.MULTIKUEUE_ORIGIN_UID_ANNOTATION] = str(meta.get("uid", ""))
        annotations[RESERVATION_ANNOTATION] = reserved_stamp(wl)
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
            self.fleet.links[cluster].api.create(k8s.WORKLOADS, body, meta["namespace"])
            self.fleet.count("dispatched")
        except ApiError as err:
            if not err.conflict:
                log.info("copy of %s to %s not created: %s", object_key(wl), cluster, err)
        except Exception as err:
            self.fleet.links[cluster].lost(str(err).splitlines()[0][:300])

    def delete_remote(self, cluster: str, wl: Mapping[str, Any]) -> None:
        link = self.fleet.links.get(cluster)
        if link is None:
            return
        meta = wl["metadata"]
        owner = owner_of(wl)
        targets = [(owner[0].resource, owner[1])] if owner is not None else []
        for res, name in (*targets, (k8s.WORKLOADS, meta["name"])):
            try:
                link.api.delete(res, name, meta["namespace"], propagationPolicy="Background")
            except ApiError as err:
                if not err.not_found:
                    log.info("copy of %s on %s not deleted: %s", object_key(wl), cluster, err)
            except Exception as err:
                link.lost(str(err).splitlines()[0][:300])
                return

    def _ensure_job(self, cluster: str, wl: Mapping[str, Any], remote: RemoteObjects) -> None:
        """Create the job on the worker whose copy of ``wl`` was admitted, once (any kind in
        :data:`~gpuplane.k8s.multikueue_jobs.KINDS`)."""
        found = self._local_owner(wl)
        if found is None:
            return
        kind, local = found
        key = object_key(local)
        theirs = remote.owners.setdefault(kind.kind, {})
        if key in theirs:
            return
        body = kind.remote_copy(local, wl["metadata"]["name"], self.settings.origin)
        try:
            created = self.fleet.links[cluster].api.create(kind.resource, body, body["metadata"]["namespace"])
            theirs[key] = created
            self.fleet.count("remote_jobs_created")
        except ApiError as err:
            if not err.conflict:
                log.info("%s of %s not created on %s: %s", kind.kind, object_key(wl), cluster, err)
        except Exception as err:
            self.fleet.links[cluster].lost(str(err).splitlines()[0][:300])

    def _sync_job(
        self, cluster: str, wl: Mapping[str, Any], remote: RemoteObjects | None, *, final: bool
    ) -> None:
        """Copy the worker job's status to the local job: while the local one runs (unsuspended),
        and once the remote one has finished (Kueue's rule: never a running status on a suspended job)."""
        found = self._local_owner(wl)
        if found is None or remote is None:
            return
        kind, local = found
        theirs = remote.owners.get(kind.kind, {}).get(object_key(local))
        if theirs is None:
            return
        status = kind.synced_status(local, theirs, final=final)
        if status is not None:
            self._write_status(kind, local, status, f"synced from {cluster}")

    def _stop_local_job(self, wl: Mapping[str, Any]) -> None:
        """The manager's suspended job of an evicted workload counts no active pods (or Jobs): they
        ran on a worker, and the manager, which manages this job (``managedBy``), says they stopped."""
        found = self._local_owner(wl)
        if found is None:
            return
        kind, local = found
        status = kind.stopped_status(local)
        if status is not None:
            self._write_status(kind, local, status, "reset")

    def _write_status(
        self, kind: JobKind, local: Mapping[str, Any], status: dict[str, Any], what: str
    ) -> None:
        body = copy.deepcopy(dict(local))
        body["status"] = status
        try:
            written = self.api.replace(kind.resource, body, sub="status")
        except ApiError as err:
            log.debug("status of %s %s not %s: %s", kind.kind, object_key(local), what, err)
            return
        self.cache.upsert(kind.kind, written)

    def _local_owner(self, wl: Mapping[str, Any]) -> tuple[JobKind, dict[str, Any]] | None:
        owner = owner_of(wl)
        if owner is None:
            return None
        kind, name = owner
        local = self.cache.get(kind.kind, f"{wl['metadata']['namespace']}/{name}")
        return None if local is None else (kind, local)

    def local_job(self, wl: Mapping[str, Any]) -> dict[str, Any] | None:
        """The manager's job that owns ``wl`` (a batch Job or a JobSet), as cached; None if none."""
        found = self._local_owner(wl)
        return None if found is None else found[1]

    def collect_orphans(self, remotes: Mapping[str, RemoteObjects | None]) -> None:
        """Delete the copies on workers whose local Workload is gone (Kueue's gcInterval): Workloads by
        their origin label, jobs of every kind by their prebuilt-workload label."""
        for cluster, remote in sorted(remotes.items()):
            if remote is None:
                continue
            link = self.fleet.links[cluster]
            for key, obj in sorted(remote.workloads.items()):
                if self.cache.get("Workload", key) is None:
                    self._delete(link, k8s.WORKLOADS, obj)
            for kind_name, owners in sorted(remote.owners.items()):
                kind = KINDS.get(kind_name)
                if kind is None:
                    continue
                for _key, job in sorted(owners.items()):
                    prebuilt = (job["metadata"].get("labels") or {}).get(keys.PREBUILT_WORKLOAD_LABEL)
                    ns = job["metadata"]["namespace"]
                    if prebuilt and self.cache.get("Workload", f"{ns}/{prebuilt}") is None:
                        self._delete(link, kind.resource, job)

    def _delete(self, link: WorkerLink, res: k8s.Resource, obj: Mapping[str, Any]) -> None:
        meta = obj["metadata"]
        try:
            link.api.delete(res, meta["name"], meta["namespace"], propagationPolicy="Background")
            self.fleet.count("gc_deleted")
            log.info(
                "orphan %s %s/%s deleted on %s", res.kind, meta["namespace"], meta["name"], link.cluster.name
            )
        except ApiError as err:
            if not err.not_found:
                log.info("orphan %s/%s not deleted: %s", meta["namespace"], meta["name"], err)
        except Exception as err:
            link.lost(str(err).splitlines()[0][:300])


def _check_of(wl: Mapping[str, Any], check: str) -> Mapping[str, Any]:
    """The Workload's state of admission check ``check`` (empty when it has none)."""
    return next(
        (s for s in (wl.get("status") or {}).get("admissionChecks") or [] if s.get("name") == check), {}
    )
