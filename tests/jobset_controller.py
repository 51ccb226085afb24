"""The JobSet controller, reduced to what the tests need, and the JobSet CRD it serves.

The test clusters (the double and ``scripts/kube-up.sh``'s real control planes) have no JobSet
controller. :class:`JobSetController` stands for it in one namespace: for each unsuspended JobSet
it makes ``replicas`` batch Jobs of each replicated job, named ``<jobset>-<replicatedjob>-<index>``,
labelled (the Jobs and their pod templates) as the real controller labels them, and owned by the
JobSet; it reports the Jobs' counts per replicated job in the JobSet's status, and ``Completed``
once every Job is complete (``Failed`` once one failed); a JobSet suspended again loses its Jobs.
Like the real one it leaves alone a JobSet whose ``spec.managedBy`` names another controller (a
MultiKueue manager's). The Jobs' pods come from the Job controller (the tests' on the double,
kube-controller-manager's on a real plane).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections import defaultdict
from typing import Any

from urllib3.exceptions import HTTPError

from apiserver.crds import custom_resource_definition
from controller_harness import wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations
from gpuplane.k8s.api import ApiError, KubeApi

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
REPLICATED_JOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOBSET_CONTROLLER = "jobset.sigs.k8s.io/jobset-controller"  # the default spec.managedBy
CRDS = k8s.Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)


def install_jobset_crd(api: KubeApi) -> None:
    """The JobSet CRD (served at jobset.x-k8s.io/v1alpha2, any fields, a status subresource), where
    missing; left installed afterwards, as Kueue's CRDs are."""
    crd = custom_resource_definition("jobset.x-k8s.io", "JobSet", versions=("v1alpha2",))
    try:
        api.get(CRDS, crd["metadata"]["name"])
    except ApiError as err:
        if not err.not_found:
            raise
        with contextlib.suppress(ApiError):  # 409: created meanwhile
            api.create(CRDS, crd)

    def served() -> bool:
        try:
            api.list(k8s.JOBSETS, limit=1)
        except ApiError:
            return False
        return True

    wait_until(served, 30, "jobsets served")


def child_jobs(jobset: dict[str, Any]) -> list[dict[str, Any]]:
    """The batch Jobs the JobSet controller makes for ``jobset``, unsuspended."""
    meta = jobset["metadata"]
    out = []
    for rjob in jobset["spec"].get("replicatedJobs") or []:
        replicas = int(rjob.get("replicas", 1))
        for index in range(replicas):
            labels = {
                JOBSET_NAME: meta["name"],
                REPLICATED_JOB_NAME: rjob["name"],
                REPLICATED_JOB_REPLICAS: str(replicas),
                JOB_INDEX: str(index),
            }
            template = copy.deepcopy(rjob.get("template") or {})
            spec = template.get("spec") or {}
            pod_meta = spec.setdefault("template", {}).setdefault("metadata", {})
            pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
            pod_meta["annotations"] = {**(pod_meta.get("annotations") or {}), **labels}
            spec["suspend"] = False
            out.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": f"{meta['name']}-{rjob['name']}-{index}",
                        "namespace": meta["namespace"],
                        "labels": {**((template.get("metadata") or {}).get("labels") or {}), **labels},
                        "annotations": dict(labels),
                        "ownerReferences": [
                            {
                                "apiVersion": k8s.JOBSETS.api_version,
                                "kind": "JobSet",
                                "name": meta["name"],
                                "uid": meta["uid"],
                                "controller": True,
                                "blockOwnerDeletion": True,
                            }
                        ],
                    },
                    "spec": spec,
                }
            )
    return out


class JobSetController:
    """Stands for the JobSet controller in one namespace (module docstring); owns its thread and
    its stop flag. Errors from the API server end a pass; the next one retries."""

    def __init__(self, api: KubeApi, namespace: str, period: float = 0.2) -> None:
        self.api = api
        self.namespace = namespace
        self.period = period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-jobset-controller", daemon=True)

    def start(self) -> JobSetController:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(ApiError, OSError, ValueError, HTTPError):
                self.sync()
            self._stop.wait(self.period)

    def sync(self) -> None:
        jobsets = self.api.list(k8s.JOBSETS, self.namespace).get("items") or []
        if not jobsets:
            return
        jobs = self.api.list(k8s.JOBS, self.namespace).get("items") or []
        owned: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for job in jobs:
            for ref in job["metadata"].get("ownerReferences") or []:
                if ref.get("kind") == "JobSet":
                    owned[ref.get("uid", "")].append(job)
        for js in jobsets:
            if js["spec"].get("managedBy", JOBSET_CONTROLLER) != JOBSET_CONTROLLER:
                continue  # another controller's (a MultiKueue manager's)
            if integrations.outcome("JobSet", js) is not None:
                continue  # Completed or Failed: left as it is
            mine = [j for j in owned[js["metadata"]["uid"]] if not j["metadata"].get("deletionTimestamp")]
            if js["spec"].get("suspend"):
                for job in mine:
                    with contextlib.suppress(ApiError):
                        self.api.delete(
                            k8s.JOBS, job["metadata"]["name"], self.namespace, propagationPolicy="Background"
                        )
                self._report(js, [])
                continue
            have = {j["metadata"]["name"] for j in mine}
            for job in child_jobs(js):
                if job["metadata"]["name"] not in have:
                    with contextlib.suppress(ApiError):  # 409: made meanwhile
                        mine.append(self.api.create(k8s.JOBS, job, self.namespace))
            self._report(js, mine)

    def _report(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        """The JobSet's status: per replicated job, its Jobs by state; Completed once all Jobs are
        complete, Failed once one failed."""
        by_rjob: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for job in jobs:
            by_rjob[(job["metadata"].get("labels") or {}).get(REPLICATED_JOB_NAME, "")].append(job)
        counts = []
        for rjob in js["spec"].get("replicatedJobs") or []:
            ends = [integrations.outcome("Job", j) for j in by_rjob[rjob["name"]]]
            succeeded = sum(1 for e in ends if e is not None and e.succeeded)
            failed = sum(1 for e in ends if e is not None and not e.succeeded)
            active = len(ends) - succeeded - failed
            counts.append(
                {
                    "name": rjob["name"],
                    "ready": active,
                    "succeeded": succeeded,
                    "failed": failed,
                    "active": active,
                    "suspended": 0,
                }
            )
        status = dict(js.get("status") or {})
        status["replicatedJobsStatus"] = counts
        expected = sum(int(r.get("replicas", 1)) for r in js["spec"].get("replicatedJobs") or [])
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ended = None
        if any(c["failed"] for c in counts):
            ended = ("Failed", "FailedJobs", "jobset failed due to one or more job failures")
        elif expected and sum(c["succeeded"] for c in counts) == expected:
            ended = ("Completed", "AllJobsCompleted", "jobset completed successfully")
        if ended is not None:
            ctype, reason, message = ended
            status["conditions"] = [
                *(status.get("conditions") or []),
                {
                    "type": ctype,
                    "status": "True",
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": stamp,
                },
            ]
            status["terminalState"] = ctype
        if status == (js.get("status") or {}):
            return
        with contextlib.suppress(ApiError):  # 409: changed meanwhile, the next pass writes again
            self.api.replace(k8s.JOBSETS, {**js, "status": status}, sub="status")
