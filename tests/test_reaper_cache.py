"""The reaper reads through an informer cache: the API calls of a pass do not grow with the pods.

On the API-server double: N GPU pods, each owned by its own Job, in a namespace with reaper settings.
The first pass lists and starts a watch for each kind it reads; later passes make no read call at
all, for 10 pods as for 100. Without the cache (``gpuplane reaper --once``) the reads grow with the
pods. The calls are counted at the client (:meth:`KubeApi.request`: every call but a watch).
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s_client

from calls import count_calls
from gpuplane.cli.reaper import start_in_controller
from gpuplane.insight import idle
from gpuplane.kube.client import KubeApi
from gpuplane.reaper.cluster import ClusterApi
from gpuplane.reaper.loop import Reaper, ReaperConfig
from gpuplane.reaper.prometheus import Samples


class NoSamples:
    """A Prometheus with no DCGM samples (owns nothing): every pod reads as missing metrics."""

    def samples(self, now: float, lookback: float) -> Samples:
        del now, lookback
        return {}


def _scene(api: k8s_client.ApiClient, namespace: str, pods: int) -> None:
    core, batch = k8s_client.CoreV1Api(api), k8s_client.BatchV1Api(api)
    core.create_namespace({"metadata": {"name": namespace, "annotations": {idle.WINDOW_ANNOTATION: "1h"}}})
    template = {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}}
    for i in range(pods):
        job = batch.create_namespaced_job(
            namespace,
            {"metadata": {"name": f"job-{i}"}, "spec": {"template": template, "suspend": True}},
        )
        owner = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": job.metadata.name,
            "uid": job.metadata.uid,
            "controller": True,
        }
        gpu = {"limits": {"nvidia.com/gpu": "1"}}
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": f"job-{i}-pod", "ownerReferences": [owner]},
                "spec": {"nodeName": "n1", "containers": [{"name": "c", "image": "x", "resources": gpu}]},
            },
        )


def _calls_per_pass(
    monkeypatch: pytest.MonkeyPatch, api: k8s_client.ApiClient, namespace: str, *, watch: bool
) -> tuple[int, int]:
    """(calls of the first pass, calls of the third) for a reaper over ``namespace``."""
    cluster = ClusterApi(api, watch=watch)
    reaper = Reaper(cluster, NoSamples(), ReaperConfig(namespaces=(namespace,)))  # type: ignore[arg-type]
    calls = count_calls(monkeypatch, KubeApi, "request")
    try:
        reports = reaper.run_once(time.time())
        first = calls["count"]
        assert reports, "the pods are seen"
        reaper.run_once(time.time())
        calls["count"] = 0
        assert len(reaper.run_once(time.time())) == len(reports)
        return first, calls["count"]
    finally:
        monkeypatch.undo()
        cluster.close()


def test_a_pass_makes_the_same_calls_for_10_pods_as_for_100(
    monkeypatch: pytest.MonkeyPatch, double: Any, kube_client: k8s_client.ApiClient
) -> None:
    del double  # the double itself: this test counts calls on it, not on a shared real cluster
    _scene(kube_client, "ten", 10)
    _scene(kube_client, "hundred", 100)
    first_10, later_10 = _calls_per_pass(monkeypatch, kube_client, "ten", watch=True)
    first_100, later_100 = _calls_per_pass(monkeypatch, kube_client, "hundred", watch=True)
    assert later_10 == later_100 == 0, (later_10, later_100)
    assert first_10 == first_100, (first_10, first_100)  # one list per kind read, however many pods

    _, direct_10 = _calls_per_pass(monkeypatch, kube_client, "ten", watch=False)
    _, direct_100 = _calls_per_pass(monkeypatch, kube_client, "hundred", watch=False)
    assert direct_100 >= 10 * direct_10 // 2, (direct_10, direct_100)  # without the cache: per pod
    print(
        f"calls per pass: cached 10 pods {later_10}, 100 pods {later_100} (first pass {first_10}, "
        f"{first_100}); direct 10 pods {direct_10}, 100 pods {direct_100}"
    )


def test_a_write_is_seen_by_the_next_pass_before_its_watch_event(
    double: Any, kube_client: k8s_client.ApiClient
) -> None:
    del double
    _scene(kube_client, "writes", 1)
    cluster = ClusterApi(kube_client, watch=True)
    try:
        pod = cluster.gpu_pods(("writes",))[0]
        patched = cluster.merge_patch(pod, {"metadata": {"annotations": {"example.com/seen": "yes"}}})
        cached = cluster.get("v1", "Pod", "job-0-pod", "writes")
        assert cached is not None
        assert cached["metadata"]["annotations"]["example.com/seen"] == "yes"
        assert cached["metadata"]["resourceVersion"] == patched["metadata"]["resourceVersion"]
        kube_client_core = k8s_client.CoreV1Api(kube_client)
        kube_client_core.delete_namespaced_pod("job-0-pod", "writes", grace_period_seconds=0)
        deadline = time.monotonic() + 10
        while cluster.gpu_pods(("writes",)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not cluster.gpu_pods(("writes",)), "the watch removed the deleted pod"
    finally:
        cluster.close()


def test_the_reaper_inside_the_controller_passes_only_while_the_controller_leads(
    double: Any, kube_client: k8s_client.ApiClient, tmp_path: Path
) -> None:
    """``gpuplane controller --reaper-prometheus``: a pass a minute in a thread, only while
    ``acting()`` (the leader); a URL that is not http(s) is refused before anything starts."""
    del kube_client
    kubeconfig = str(double.write_kubeconfig(tmp_path / "kubeconfig"))
    with pytest.raises(ValueError, match="not an http"):
        start_in_controller(
            kubeconfig, None, "ftp://x", enforce=False, acting=lambda: True, stop=threading.Event()
        )
    for leads in (False, True):
        stop = threading.Event()
        thread = start_in_controller(
            kubeconfig, None, "http://127.0.0.1:9", enforce=False, acting=lambda v=leads: v, stop=stop
        )
        try:
            if leads:
                deadline = time.monotonic() + 10
                while not double.requests.find(verb="list", resource="pods") and time.monotonic() < deadline:
                    time.sleep(0.05)
                assert double.requests.find(verb="list", resource="pods"), "the leader's reaper passes"
            else:
                time.sleep(0.5)
                assert not double.requests.find(verb="list", resource="pods"), "no pass off the leader"
        finally:
            stop.set()  # ends the wait between passes at once
            thread.join(10)
        assert not thread.is_alive()
