"""A MultiKueue manager's watch of a worker (gpuplane.k8s.multikueue_watch): an informer that lists and
watches only what a label selector selects; the worker's copies read from the watch, not listed each pass;
nothing read before every informer has listed; a change on the worker wakes the manager; the worker's state
as a scheduling pass reads it; a workload stepped again only when what it reads changed; and a status write
that meets a newer Workload retried at once.

On the API-server double, and with ``GPUPLANE_E2E_KUBECONFIG`` on a real cluster.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest

from controller_harness import gpu_job, install_crds, wait_until
from gpuplane.k8s import api as k8s
from gpuplane.k8s.informer import Cache, Informer
from gpuplane.k8s.multikueue import MultiKueue, MultiKueueSettings
from gpuplane.k8s.multikueue_fleet import Fleet
from gpuplane.k8s.multikueue_flow import WorkloadFlow
from gpuplane.k8s.multikueue_jobs import REMOTE_OWNER_RESOURCES
from gpuplane.k8s.multikueue_watch import WorkerWatch
from gpuplane.k8s.multikueue_workers import RemoteObjects, WorkerLink, fit_views
from gpuplane.model import labels as keys
from gpuplane.model.multikueue import MultiKueueConfig
from manifests import cluster_queue, local_queue, node, resource_flavor

pytestmark = pytest.mark.timeout(120)

CONFIG_MAPS = k8s.Resource("", "v1", "configmaps", "ConfigMap")
ORIGIN = "mgr-test"
_names = itertools.count(1)


def _config_map(name: str, ns: str, labels: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": ns, "labels": labels}, "data": {"k": "v"}}


def _workload(name: str, ns: str, *, origin: str | None) -> dict[str, object]:
    labels = {keys.MULTIKUEUE_ORIGIN_LABEL: origin} if origin else {}
    return {
        "apiVersion": k8s.WORKLOADS.api_version,
        "kind": "Workload",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": {
            "queueName": "queue",
            "podSets": [
                {
                    "name": "main",
                    "count": 1,
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "c",
                                    "image": "x",
                                    "resources": {"requests": {"nvidia.com/gpu": "1"}},
                                }
                            ]
                        }
                    },
                }
            ],
        },
    }


def test_an_informer_with_a_label_selector_keeps_only_what_it_selects(
    api: k8s.KubeApi, namespace: str
) -> None:
    api.create(CONFIG_MAPS, _config_map("before-in", namespace, {"pick": "yes"}), namespace)
    api.create(CONFIG_MAPS, _config_map("before-out", namespace, {"pick": "no"}), namespace)
    cache = Cache()
    informer = Informer(api, CONFIG_MAPS, cache, label_selector="pick=yes")
    informer.start()
    try:
        wait_until(informer.synced.is_set, 30, "the informer listed")
        api.create(CONFIG_MAPS, _config_map("after-in", namespace, {"pick": "yes"}), namespace)
        api.create(CONFIG_MAPS, _config_map("after-out", namespace, {"pick": "no"}), namespace)
        wait_until(lambda: cache.get("ConfigMap", f"{namespace}/after-in"), 30, "the watch delivered it")
        mine = {key for key in (cache.objects.get("ConfigMap") or {}) if key.startswith(f"{namespace}/")}
        assert mine == {f"{namespace}/before-in", f"{namespace}/after-in"}
    finally:
        informer.stop()


def test_a_worker_watch_reads_the_managers_copies_once_listed_and_wakes_the_manager(
    api: k8s.KubeApi, namespace: str
) -> None:
    install_crds(api)
    api.create(k8s.WORKLOADS, _workload("mine", namespace, origin=ORIGIN), namespace)
    api.create(k8s.WORKLOADS, _workload("other-origin", namespace, origin="someone-else"), namespace)
    api.create(k8s.WORKLOADS, _workload("local", namespace, origin=None), namespace)
    job = gpu_job("job-mine", namespace, "queue", pods=1, gpus=1).to_dict()
    job["metadata"].setdefault("labels", {})[keys.MULTIKUEUE_ORIGIN_LABEL] = ORIGIN
    api.create(k8s.JOBS, job, namespace)
    api.create(k8s.JOBS, gpu_job("job-local", namespace, "queue", pods=1, gpus=1).to_dict(), namespace)

    wake = threading.Event()
    watch = WorkerWatch(api, ORIGIN, REMOTE_OWNER_RESOURCES, wake)
    assert not watch.synced()  # nothing is read before the informers have listed
    watch.start()
    try:
        wait_until(lambda: watch.synced(state=True), 60, "every informer listed")
        workloads, owners = watch.copies()
        assert {k for k in workloads if k.startswith(f"{namespace}/")} == {f"{namespace}/mine"}
        assert {k for k in owners["Job"] if k.startswith(f"{namespace}/")} == {f"{namespace}/job-mine"}
        assert set(owners) == {res.kind for res in REMOTE_OWNER_RESOURCES}

        wake.clear()
        api.create(k8s.WORKLOADS, _workload("mine-2", namespace, origin=ORIGIN), namespace)
        wait_until(wake.is_set, 30, "a change on the worker woke the manager")
        wait_until(lambda: f"{namespace}/mine-2" in watch.copies()[0], 30, "the new copy seen")
    finally:
        watch.stop()
    assert all(not informer._thread or not informer._thread.is_alive() for informer in watch.informers)


def test_the_watched_state_is_what_a_scheduling_pass_reads(api: k8s.KubeApi, namespace: str) -> None:
    install_crds(api)
    flavor, cq = f"{namespace}-gpu", f"{namespace}-cq"
    api.create(
        k8s.NODES, node(f"{namespace}-n0").allocatable(cpu="8", memory="64Gi", pods="110", gpu=8).to_dict()
    )
    api.create(k8s.RESOURCE_FLAVORS, resource_flavor(flavor).to_dict())
    api.create(k8s.CLUSTER_QUEUES, cluster_queue(cq).flavor(flavor, cpu="8", gpu=8).to_dict())
    api.create(k8s.LOCAL_QUEUES, local_queue("queue", namespace, cq).to_dict(), namespace)
    api.create(k8s.WORKLOADS, _workload("w", namespace, origin=None), namespace)
    watch = WorkerWatch(api, ORIGIN, REMOTE_OWNER_RESOURCES, threading.Event()).start()
    try:
        wait_until(lambda: watch.synced(state=True), 60, "every informer listed")
        wait_until(
            lambda: any(o["metadata"]["name"] == cq for o in watch.objects() if o["kind"] == "ClusterQueue"),
            30,
            "the ClusterQueue seen",
        )
        objects = watch.objects()
        kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
        assert ("Node", f"{namespace}-n0") in kinds
        assert ("ResourceFlavor", flavor) in kinds
        assert ("LocalQueue", "queue") in kinds
        assert ("Workload", "w") in kinds
        assert all(o.get("apiVersion") for o in objects)

        # The dispatcher's question on this worker: a copy that already holds quota here is taken
        # here (the plan admits only new ones), so it is never moved away from where it runs.
        link = cast(
            WorkerLink, SimpleNamespace(connected=True, watch=watch, cluster=SimpleNamespace(name="w1"))
        )
        held = api.get(k8s.WORKLOADS, "w", namespace)
        held["status"] = {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "True",
                    "reason": "QuotaReserved",
                    "message": "reserved",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ],
            "admission": {
                "clusterQueue": cq,
                "podSetAssignments": [
                    {
                        "name": "main",
                        "count": 1,
                        "flavors": {"nvidia.com/gpu": flavor},
                        "resourceUsage": {"nvidia.com/gpu": "1"},
                    }
                ],
            },
        }
        api.replace(k8s.WORKLOADS, held, sub="status")
        wait_until(
            lambda: (watch.remote.get("Workload", f"{namespace}/w") or {}).get("status", {}).get("admission"),
            30,
            "the reservation seen",
        )
        fresh = _workload("c1", namespace, origin=None)
        views = fit_views(link, [held, fresh], {}, time.time(), eta=False)
        assert views[f"{namespace}/w"].fits_now
        assert views[f"{namespace}/c1"].fits_now
    finally:
        watch.stop()
        for res, name in (
            (k8s.CLUSTER_QUEUES, cq),
            (k8s.RESOURCE_FLAVORS, flavor),
            (k8s.NODES, f"{namespace}-n0"),
        ):
            api.delete(res, name)


def test_a_workload_is_stepped_again_only_when_what_it_reads_changed() -> None:
    """The manager's pass carries a workload's flow a step only when the Workload, its job, or its
    copy or job on a worker changed, or while one of its workers is lost (time counts then)."""
    mk = MultiKueue(
        cast(k8s.KubeApi, None), Cache(), clock=lambda: 0.0, monotonic=lambda: 0.0, event=lambda *_: None
    )
    steps: list[str] = []

    def step(wl: dict[str, Any], *_: object) -> bool:
        steps.append(wl["metadata"]["resourceVersion"])
        return True

    mk.flow.reconcile_workload = step  # type: ignore[method-assign]
    link = SimpleNamespace(connected=True, close=lambda: None)
    mk.fleet.links = {"w1": cast(WorkerLink, link)}
    cfg = MultiKueueConfig("cfg", ("w1",))
    remote = RemoteObjects({}, {"Job": {}})
    wl: dict[str, Any] = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "1"}}

    assert mk._step(wl, {}, cfg, {"w1": remote}) is True
    assert mk._step(wl, {}, cfg, {"w1": remote}) is True  # the last answer, not a second step
    assert steps == ["1"]
    wl["metadata"]["resourceVersion"] = "2"
    mk._step(wl, {}, cfg, {"w1": remote})
    assert steps == ["1", "2"]
    remote.workloads["ns/a"] = {"metadata": {"name": "a", "namespace": "ns", "resourceVersion": "7"}}
    mk._step(wl, {}, cfg, {"w1": remote})
    assert steps == ["1", "2", "2"]
    link.connected = False
    mk._step(wl, {}, cfg, {"w1": remote})
    mk._step(wl, {}, cfg, {"w1": remote})
    assert len(steps) == 5
    mk.close()


def test_a_status_write_that_meets_a_newer_workload_is_retried_at_once(
    api: k8s.KubeApi, namespace: str
) -> None:
    """The manager's status writes carry the cached resourceVersion; the core's own writes race them. A
    409 reads the Workload again and applies the change once more, instead of losing a pass."""
    install_crds(api)
    created = api.create(k8s.WORKLOADS, _workload("w", namespace, origin=None), namespace)
    created["status"] = {
        "admissionChecks": [
            {"name": "mk", "state": "Pending", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]
    }
    stale = api.replace(k8s.WORKLOADS, created, sub="status")
    newer = copy.deepcopy(stale)
    newer["metadata"].setdefault("annotations", {})["touched"] = "yes"  # someone else writes meanwhile
    api.replace(k8s.WORKLOADS, newer)

    fleet = Fleet(api, Cache(), lambda: 0.0, lambda: 0.0, lambda *_: None, MultiKueueSettings())
    flow = WorkloadFlow(fleet)
    assert flow.write_nomination(stale, "mk", ["worker-a"], "nominated worker-a: it fits there now")
    assert fleet.counters["status_conflicts_retried"] == 1
    written = api.get(k8s.WORKLOADS, "w", namespace)
    assert written["status"]["nominatedClusterNames"] == ["worker-a"]
    assert written["metadata"]["annotations"]["touched"] == "yes"
    assert fleet.cache.get("Workload", f"{namespace}/w") is not None

    # Decided meanwhile (the check is no longer Pending): nothing is written.
    decided = api.get(k8s.WORKLOADS, "w", namespace)
    decided["status"]["admissionChecks"][0]["state"] = "Ready"
    api.replace(k8s.WORKLOADS, decided, sub="status")
    assert not flow.write_nomination(stale, "mk", ["worker-b"], "nominated worker-b")
    assert api.get(k8s.WORKLOADS, "w", namespace)["status"]["nominatedClusterNames"] == ["worker-a"]
