"""Helpers for end-to-end tests of the controller against an API server: the double, or a real one.

The pieces a cluster would have, reduced to what the controller needs around it:

- :class:`Scene`: one test's corner of the cluster. Unique names (namespace, Nodes, flavor,
  ClusterQueue), the Kueue CRDs from ``deploy/crds`` (installed where missing, never deleted: other
  tests share them), Nodes with GPUs, queues, and Jobs submitted with the real ``kubectl apply``. It
  deletes what it created, so the tests run unchanged against a real API server
  (``GPUPLANE_E2E_KUBECONFIG``), where Nodes and cluster-scoped objects outlive the test.
- On the double, :class:`JobController` is kube-controller-manager's Job controller, reduced: every
  unsuspended Job gets its pods from its template (after the mutating webhook,
  :func:`gpuplane.k8s.webhook.review`, since the double calls no webhooks); a suspended Job loses them.
  On a real server the real Job controller does this, the webhook is registered for real
  (:class:`RegisteredWebhook`: ``gpuplane webhook`` over TLS with a test CA) and the API server calls
  it; :class:`RealJobController` only holds pods back when a test asks. No kubelet: a pod is bound
  once ``spec.nodeName`` is set, and pods are deleted with grace period 0.
- :class:`RunningController`: a :class:`~gpuplane.k8s.controller.Controller` in a background thread,
  talking through the official client to the kubeconfig's server, that can be stopped cleanly or killed
  at any API call (:class:`KillableApi`).
- Invariant checks over the double's request log and the objects: :func:`quota_violations`,
  :func:`double_bindings`, :func:`admission_episodes`, :func:`devices_overlap`.

Nothing here sleeps for timing: :func:`wait_until` polls a condition every 20 ms up to a deadline.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from urllib3.exceptions import HTTPError

import testca
from apiserver.fixtures import E2E_KUBECONFIG, Cluster, Kubectl, manifest
from apiserver.patch import json_patch
from apiserver.server import ApiServerDouble
from fake_kubelet import FakeKubelet
from gpuplane.core.config import config_from_kueue
from gpuplane.core.plan import Plan
from gpuplane.core.scheduler import schedule
from gpuplane.k8s import api as k8s
from gpuplane.k8s import integrations
from gpuplane.k8s.api import ApiError, KubeApi, Resource, load_api_client
from gpuplane.k8s.controller import Controller, ControllerConfig
from gpuplane.k8s.kueue_config import DEFAULT_SOURCE, KueueConfigSource
from gpuplane.k8s.webhook import review
from gpuplane.model import labels as keys
from gpuplane.model.loader import state_from_objects
from gpuplane.model.quantity import parse_resource_quantity
from manifests import GPU, Manifest, cluster_queue, job, local_queue, node, pod_spec, resource_flavor

T = TypeVar("T")

POLL = 0.02  # seconds between two looks at a condition
POOL_LABEL = "gpuplane.dev/e2e-pool"  # marks a test's Nodes; its flavor selects them
CRD_DIR = Path(__file__).resolve().parent.parent / "deploy" / "crds"
CONTROLLER_AGENT = "gpuplane-controller"  # user agent prefix of every controller replica
CRDS = Resource("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False)
WORKLOAD_RESOURCE = "workloads"
E2E_LABEL = "gpuplane.dev/e2e"  # on a scene's namespace: the registered webhook acts there only
WEBHOOKS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    False,
)
QUOTAS = Resource("", "v1", "resourcequotas", "ResourceQuota")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, message: str = "") -> T:
    """Poll ``predicate`` every :data:`POLL` seconds until it returns something true; return that.

    Raises AssertionError (with ``message``) when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {message or predicate!r}")
        pause.wait(POLL)


# --- the cluster side of one test ------------------------------------------------------------------


def gpu_job(
    name: str,
    namespace: str,
    queue: str,
    *,
    pods: int = 1,
    gpus: int = 1,
    priority_class: str | None = None,
    grace: int = 0,
    devices: Mapping[str, int] | None = None,
    annotations: Mapping[str, str] | None = None,
) -> Manifest:
    """A suspended, queued batch Job of ``pods`` pods with ``gpus`` GPUs each, ready for kubectl.

    ``devices`` adds other device requests (e.g. a MIG profile), and ``annotations`` go on the pod
    template (e.g. a GPU fraction). Its pods have ``grace`` seconds to terminate (none by default:
    without kubelets, a pod with a grace period goes only when the double's clock moves on).
    """
    limits: dict[str, object] = {GPU: gpus} if gpus else {}
    limits.update(devices or {})
    spec = pod_spec().container(limits=limits, cpu="100m", **limits).to_dict()
    spec["restartPolicy"] = "Never"
    spec["terminationGracePeriodSeconds"] = grace
    built = job(name, namespace).queue(queue).parallelism(pods).completions(pods)
    built.body["spec"]["template"]["spec"] = spec
    if annotations:
        built.body["spec"]["template"].setdefault("metadata", {})["annotations"] = dict(annotations)
    built.set("spec.suspend", True)
    return built if priority_class is None else built.priority_class(priority_class)


class Scene:
    """One test's objects in the cluster: a unique namespace, its Nodes, flavor and queues.

    Cluster-scoped objects carry the scene's ``prefix`` in their names, and everything created is
    deleted by :meth:`cleanup` (CRDs only when this scene installed them).
    """

    def __init__(self, cluster: Cluster, kubectl: Kubectl) -> None:
        assert cluster.kubeconfig_path is not None
        self.cluster = cluster
        self.kubeconfig = str(cluster.kubeconfig_path)
        self.kubectl = kubectl
        self.prefix = f"e2e-{uuid.uuid4().hex[:6]}"
        self.namespace = self.prefix
        self.flavor = f"{self.prefix}-gpu"
        self.api = KubeApi(load_api_client(self.kubeconfig), qps=None)
        self.api.api_client.user_agent = "gpuplane-e2e-test"
        self.real = not isinstance(cluster, ApiServerDouble)  # a real API server, not the double
        self._created: list[tuple[Resource, str]] = []  # cluster-scoped, deleted in reverse order
        self._runs: list[RunningController] = []
        self._job_controllers: list[JobController | RealJobController] = []
        self._kubelets: list[FakeKubelet] = []

    # --- setup -----------------------------------------------------------------------------------

    def _create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        created = self.api.create(res, body, namespace)
        if not res.namespaced:
            self._created.append((res, created["metadata"]["name"]))
        return created

    def install_crds(self) -> None:
        """Install Kueue's CRDs (:func:`install_crds`); they stay, for the tests that follow."""
        install_crds(self.api)

    def setup(
        self,
        *,
        nodes: int,
        gpus_per_node: int = 8,
        quota_gpus: int | None = None,
        preemption: Mapping[str, str] | None = None,
        quota: Mapping[str, int] | None = None,
    ) -> str:
        """CRDs, the namespace, ``nodes`` GPU Nodes, a flavor for them, and one ClusterQueue (quota:
        ``quota_gpus``, all the GPUs by default, and ``quota`` for other resources; ``preemption``
        policy) with a LocalQueue called ``queue``; returns the ClusterQueue's name."""
        self.install_crds()
        self.api.create(k8s.NAMESPACES, {"metadata": {"name": self.namespace, "labels": {E2E_LABEL: "true"}}})
        self._created.append((k8s.NAMESPACES, self.namespace))
        self.add_nodes(nodes, gpus_per_node)
        self._create(
            k8s.RESOURCE_FLAVORS,
            resource_flavor(self.flavor).set("spec.nodeLabels", {POOL_LABEL: self.prefix}).to_dict(),
        )
        cq = f"{self.prefix}-cq"
        gpu_quota = nodes * gpus_per_node if quota_gpus is None else quota_gpus
        queue = cluster_queue(cq).flavor(self.flavor, cpu="1000", gpu=gpu_quota, **(quota or {}))
        if preemption:
            queue.set("spec.preemption", dict(preemption))
        self._create(k8s.CLUSTER_QUEUES, queue.to_dict())
        self.api.create(k8s.LOCAL_QUEUES, local_queue("queue", self.namespace, cq).to_dict(), self.namespace)
        return cq

    def add_nodes(self, count: int, gpus: int = 8, devices: Mapping[str, int] | None = None) -> list[str]:
        """``count`` Nodes of the scene's pool, each with ``gpus`` H100 GPUs and ``devices`` (other
        device resources, e.g. MIG instances); returns their names."""
        start = sum(1 for res, _ in self._created if res is k8s.NODES)
        names = []
        for i in range(start, start + count):
            name = f"{self.prefix}-n{i}"
            body = (
                node(name)
                .allocatable(cpu="64", memory="512Gi", pods="110", gpu=gpus, **(devices or {}))
                .label(POOL_LABEL, self.prefix)
                .label("kubernetes.io/hostname", name)
                .label("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")
                .to_dict()
            )
            self._create(k8s.NODES, body)
            names.append(name)
        return names

    def priority_class(self, name: str, value: int) -> str:
        full = f"{self.prefix}-{name}"
        body = {
            "apiVersion": f"{k8s.KUEUE}/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": full},
            "value": value,
        }
        self._create(k8s.PRIORITY_CLASSES, body)
        return full

    def job(self, name: str, **options: Any) -> Manifest:
        return gpu_job(name, self.namespace, "queue", **options)

    def submit(self, *jobs: Manifest) -> None:
        """``kubectl apply`` the jobs, all in one multi-document stream. On a real server the API
        server calls the registered webhook, which suspends a queued job at creation; the double
        calls no webhooks, so there the webhook's patch is applied here (:func:`webhook_admit`)."""
        bodies = [j.to_dict() for j in jobs]
        if not self.real:
            bodies = [webhook_admit(body) for body in bodies]
        self.kubectl("apply", "-f", "-", input=manifest(*bodies))

    def delete_job(self, name: str) -> None:
        """``kubectl delete job`` and, since no kubelet ends them, its pods at grace period 0 (a pod
        the garbage collector took first is fine), then its Workload; returns once they are gone."""
        self.kubectl("delete", "job", name, "-n", self.namespace, "--wait=false")

        def pods_gone() -> bool:
            # Deleted on every look: a job controller that listed the job just before it went may
            # still create one more pod for it, and on the double no garbage collector removes it.
            pods = self.pods(name)
            for pod in pods:
                with contextlib.suppress(ApiError):  # 404: already deleted with the job
                    self.api.delete(k8s.PODS, pod["metadata"]["name"], self.namespace, gracePeriodSeconds=0)
            return not pods

        wait_until(pods_gone, 20, f"the pods of job {name} gone")

        def workload_gone() -> bool:
            # The garbage collector's stand-in, as for the pods: on a control plane started moments
            # ago, kube-controller-manager's collector only watches the Workload CRD after its next
            # discovery resync (up to 30 s), and until then the job's Workload keeps its quota.
            workload = self.workloads().get(name)
            if workload is not None:
                with contextlib.suppress(ApiError):  # 404: the collector got there first
                    self.api.delete(k8s.WORKLOADS, workload["metadata"]["name"], self.namespace)
            return workload is None

        wait_until(workload_gone, 20, f"the Workload of job {name} gone")

    # --- what runs against it --------------------------------------------------------------------

    def controller(self, *, loop: bool = True, **options: Any) -> RunningController:
        """Start a controller replica (see :class:`RunningController`); it is stopped at cleanup."""
        options.setdefault("lease_namespace", self.namespace)
        run = RunningController(self.kubeconfig, **options)
        self._runs.append(run)
        return run.start(loop=loop)

    def job_controller(self) -> JobController | RealJobController:
        """What creates the pods of unsuspended Jobs: the reduced Job controller on the double; on a
        real server kube-controller-manager does, and this only holds pods back on request."""
        api = KubeApi(load_api_client(self.kubeconfig), qps=None)
        jc = RealJobController(api, self.namespace) if self.real else JobController(api, self.namespace)
        self._job_controllers.append(jc)
        return jc.start()

    def kubelet(self, *, speedup: float = 1.0) -> FakeKubelet:
        """Start the kubelets' stand-in for this scene's pods (:class:`fake_kubelet.FakeKubelet`): bound
        pods run for the time their annotations give and end; it is stopped at cleanup."""
        kubelet = FakeKubelet(
            KubeApi(load_api_client(self.kubeconfig), qps=None), [self.namespace], speedup=speedup
        )
        self._kubelets.append(kubelet)
        return kubelet.start()

    def admit(self, pod: dict[str, Any]) -> dict[str, Any]:
        """A pod as the test submits it: on the double with the webhook's patch applied (the double
        calls no webhooks); unchanged on a real server, whose API server calls the webhook."""
        return pod if self.real else webhook_admit(pod)

    # --- reading the cluster ---------------------------------------------------------------------

    def list(self, res: Resource) -> list[dict[str, Any]]:
        return list(self.api.list(res, self.namespace if res.namespaced else None).get("items", []))

    def workloads(self) -> dict[str, dict[str, Any]]:
        """This scene's Workloads by the name of the job that owns them."""
        out = {}
        for wl in self.list(k8s.WORKLOADS):
            owners = wl["metadata"].get("ownerReferences") or [{"name": wl["metadata"]["name"]}]
            out[owners[0]["name"]] = wl
        return out

    def pods(self, job_name: str | None = None) -> list[dict[str, Any]]:
        pods = self.list(k8s.PODS)
        if job_name is None:
            return pods
        return [p for p in pods if (p["metadata"].get("labels") or {}).get("job-name") == job_name]

    def admitted(self, job_name: str) -> bool:
        """Whether the job's Workload holds an admission."""
        wl = self.workloads().get(job_name)
        return bool(wl and (wl.get("status") or {}).get("admission"))

    def bound(self, job_name: str, count: int) -> bool:
        """Whether the job has ``count`` live pods, every one of them bound."""
        pods = [p for p in self.pods(job_name) if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == count and all(p["spec"].get("nodeName") for p in pods)

    def jobs(self) -> dict[str, dict[str, Any]]:
        return {j["metadata"]["name"]: j for j in self.list(k8s.JOBS)}

    def events(self, reason: str) -> list[dict[str, Any]]:
        return [e for e in self.list(k8s.EVENTS) if e.get("reason") == reason]

    def state(self) -> list[dict[str, Any]]:
        """This scene's part of the cluster as ``gpuplane schedule`` reads it (kind and apiVersion set)."""
        objects: list[dict[str, Any]] = [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
        ]
        mine = {
            k8s.NODES: lambda o: (o["metadata"].get("labels") or {}).get(POOL_LABEL) == self.prefix,
            k8s.RESOURCE_FLAVORS: lambda o: o["metadata"]["name"].startswith(self.prefix),
            k8s.CLUSTER_QUEUES: lambda o: o["metadata"]["name"].startswith(self.prefix),
            k8s.PRIORITY_CLASSES: lambda o: o["metadata"]["name"].startswith(self.prefix),
            k8s.LOCAL_QUEUES: lambda _o: True,
            k8s.WORKLOADS: lambda _o: True,
            k8s.PODS: lambda o: bool(o["spec"].get("nodeName")),
        }
        for res, keep in mine.items():
            objects += [
                {**o, "kind": res.kind, "apiVersion": res.api_version} for o in self.list(res) if keep(o)
            ]
        return objects

    def core_plan(self) -> Plan:
        """What the core decides on this scene's objects as they are now (``gpuplane schedule``):
        cycles until nothing changes, as a controller pass does when nothing is preempted."""
        state = state_from_objects(self.state())
        return schedule(state, config_from_kueue(state.configuration), time.time(), cycles=None)

    # --- teardown --------------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Stop what runs, then delete what was created, even when stopping a replica fails.

        Jobs go first (so nothing makes pods again), then pods with grace period 0 (without a
        kubelet nothing else ends them), then the namespace and the cluster-scoped objects.
        """
        try:
            for run in self._runs:
                run.stop()
        finally:
            for kubelet in self._kubelets:
                kubelet.stop()
            for jc in self._job_controllers:
                jc.stop()
            with contextlib.suppress(ApiError):
                for job in self.list(k8s.JOBS):
                    self.api.delete(
                        k8s.JOBS, job["metadata"]["name"], self.namespace, propagationPolicy="Background"
                    )
                for pod in self.list(k8s.PODS):
                    self.api.delete(k8s.PODS, pod["metadata"]["name"], self.namespace, gracePeriodSeconds=0)
            for res, name in reversed(self._created):
                with contextlib.suppress(ApiError):
                    self.api.delete(res, name)
            self.api.api_client.close()  # type: ignore[no-untyped-call]


def make_scene(cluster: Cluster, kubectl: Kubectl) -> Iterator[Scene]:
    """Body of the tests' ``scene`` fixtures: a Scene, cleaned up after the test."""
    built = Scene(cluster, kubectl)
    try:
        yield built
    finally:
        built.cleanup()


def install_crds(api: KubeApi) -> None:
    """Install Kueue's CRDs from ``deploy/crds`` where missing, and wait until they are served.

    They are never deleted: the next test (or another suite on the same server) uses them, and a
    CRD that is still terminating cannot be created again.
    """
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        try:
            api.get(CRDS, crd["metadata"]["name"])
        except ApiError as err:
            if not err.not_found:
                raise
            with contextlib.suppress(ApiError):  # 409: created meanwhile by another suite
                api.create(CRDS, crd)
    for res in (k8s.WORKLOADS, k8s.CLUSTER_QUEUES, k8s.LOCAL_QUEUES, k8s.RESOURCE_FLAVORS):
        wait_until(lambda res=res: _served(api, res), 30, f"{res.plural} served")


def _served(api: KubeApi, res: Resource) -> bool:
    try:
        api.list(res, limit=1)
    except ApiError:
        return False
    return True


# --- kube-controller-manager's Job controller, reduced ----------------------------------------------


def webhook_admit(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (a pod or a job; its kind is the object's, a Pod when unset) as the mutating webhook
    chain would store it at creation: gpuplane's review() patch applied."""
    group, _, version = str(obj.get("apiVersion", "v1")).rpartition("/")
    kind = {"group": group, "version": version, "kind": obj.get("kind", "Pod")}
    answer = review(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {"uid": "e2e", "kind": kind, "operation": "CREATE", "object": obj},
        }
    )["response"]
    if not answer.get("patch"):
        return obj
    patched: dict[str, Any] = json_patch(obj, json.loads(base64.b64decode(answer["patch"])))
    return patched


class JobController:
    """Creates the pods of every unsuspended Job in one namespace, and deletes them on suspension.

    One pass (:meth:`sync`) lists Pods, then Jobs, and brings each Job's live pods to its parallelism
    (capped by :attr:`pod_limit` when a test holds a gang back; none for the jobs named in
    :attr:`held`, whose pods a test holds back until it lets them through). Pod names never repeat
    (``<job>-<n>`` with a counter per Job), so a pod name means one pod for the whole test. Errors
    from the API server end the pass; the next one retries.
    """

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.pod_limit: int | None = None
        self.held: set[str] = set()
        self._counters: dict[str, itertools.count[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fake-job-controller", daemon=True)

    def start(self) -> JobController:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.api.api_client.close()  # type: ignore[no-untyped-call]

    def _loop(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(ApiError, OSError, ValueError, HTTPError):
                self.sync()  # a failed pass is retried, as kube-controller-manager would
            self._stop.wait(POLL)

    def sync(self) -> None:
        # Pods are listed before Jobs. The two lists are two moments: a Job listed first could
        # still show as running while its pods, listed after, are already gone because the Job
        # was suspended (or deleted) and its pods evicted in between; the pass would then start
        # replacements for a Job that no longer runs. Listed in this order, pods that are gone
        # were removed before the Jobs were read, so a Job suspended before its pods were evicted
        # shows suspended.
        pods = self.api.list(k8s.PODS, self.namespace).get("items", [])
        jobs = self.api.list(k8s.JOBS, self.namespace).get("items", [])
        owned: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for pod in pods:
            for ref in pod["metadata"].get("ownerReferences") or []:
                owned[ref.get("uid", "")].append(pod)
        for obj in jobs:
            uid = obj["metadata"]["uid"]
            if integrations.outcome("Job", obj) is not None:
                continue  # Complete or Failed: the Job controller leaves it alone
            live = [p for p in owned[uid] if not p["metadata"].get("deletionTimestamp")]
            phases = Counter((p.get("status") or {}).get("phase") for p in live)
            running = [p for p in live if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]
            if obj["spec"].get("suspend"):
                for pod in running:
                    with contextlib.suppress(ApiError):
                        self.api.delete(k8s.PODS, pod["metadata"]["name"], self.namespace)
                self._ended(obj, phases["Succeeded"], phases["Failed"])
                continue
            if self._ended(obj, phases["Succeeded"], phases["Failed"]):
                continue
            completions = obj["spec"].get("completions") or 1
            want = min(integrations.batch_job(obj)[0].count, completions - phases["Succeeded"])
            if obj["metadata"]["name"] in self.held:
                want = 0
            if self.pod_limit is not None:
                want = min(want, self.pod_limit)
            # An Indexed Job gives each new pod the lowest completion index no live pod has.
            index_key = "batch.kubernetes.io/job-completion-index"
            taken = {
                (p["metadata"].get("annotations") or {}).get(index_key)
                for p in live
                if (p.get("status") or {}).get("phase") != "Failed"
            }
            free = (str(i) for i in range(completions) if str(i) not in taken)
            for _ in range(want - len(running)):
                index = next(free, None) if obj["spec"].get("completionMode") == "Indexed" else None
                self.api.create(k8s.PODS, self._pod(obj, index), self.namespace)

    def _ended(self, obj: dict[str, Any], succeeded: int, failed: int) -> bool:
        """Write the Job's status as the Job controller would (the succeeded and failed counts, and
        ``Complete`` once its completions succeeded or ``Failed`` past its backoff limit); whether it
        has ended."""
        spec, status = obj["spec"], dict(obj.get("status") or {})
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        conditions = list(status.get("conditions") or [])
        ended = False
        if succeeded >= (spec.get("completions") or 1):
            conditions += [
                {"type": t, "status": "True", "reason": "CompletionsReached", "lastTransitionTime": stamp}
                for t in ("SuccessCriteriaMet", "Complete")
            ]
            status["completionTime"] = stamp
            ended = True
        elif failed > spec.get("backoffLimit", 6):
            conditions += [
                {
                    "type": t,
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                    "lastTransitionTime": stamp,
                }
                for t in ("FailureTarget", "Failed")
            ]
            ended = True
        # ``active`` is left alone: tests set it to stand for a Job controller that lags behind.
        counts = {"succeeded": succeeded, "failed": failed}
        if ended or any(status.get(k, 0) != v for k, v in counts.items()):
            status.update(counts, conditions=conditions)
            with contextlib.suppress(ApiError):  # 409: changed meanwhile, the next pass writes again
                self.api.replace(k8s.JOBS, {**obj, "status": status}, sub="status")
        return ended

    def _pod(self, obj: dict[str, Any], index: str | None = None) -> dict[str, Any]:
        meta, template = obj["metadata"], obj["spec"]["template"]
        counter = self._counters.setdefault(meta["uid"], itertools.count())
        labels = {
            **(template.get("metadata", {}).get("labels") or {}),
            "job-name": meta["name"],
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": meta["uid"],
        }
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{meta['name']}-{next(counter)}",
                "namespace": self.namespace,
                "labels": labels,
                "annotations": {
                    **(template.get("metadata", {}).get("annotations") or {}),
                    **({"batch.kubernetes.io/job-completion-index": index} if index is not None else {}),
                },
                "ownerReferences": [
                    {
                        "apiVersion": "batch/v1",
                        "kind": "Job",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": json.loads(json.dumps(template["spec"])),
        }
        return webhook_admit(pod)


# --- on a real server: kube-controller-manager's Job controller and the registered webhook ------------


class RealJobController:
    """Stands where :class:`JobController` stands on the double, when kube-controller-manager's real Job
    controller makes the pods. Setting :attr:`pod_limit` caps the namespace's pods with a
    ResourceQuota (the Job controller retries what the quota refused once it is lifted)."""

    QUOTA = "e2e-pod-limit"

    def __init__(self, api: KubeApi, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self._limit: int | None = None

    def start(self) -> RealJobController:
        return self

    @property
    def pod_limit(self) -> int | None:
        return self._limit

    @pod_limit.setter
    def pod_limit(self, limit: int | None) -> None:
        self._limit = limit
        with contextlib.suppress(ApiError):
            self.api.delete(QUOTAS, self.QUOTA, self.namespace)
        if limit is None:
            return
        body = {"metadata": {"name": self.QUOTA}, "spec": {"hard": {"pods": str(limit)}}}
        self.api.create(QUOTAS, body, self.namespace)
        # The quota admits pods only once the quota controller has filled in what it counts.
        wait_until(
            lambda: (self.api.get(QUOTAS, self.QUOTA, self.namespace).get("status") or {}).get("hard"),
            20,
            "the pod quota counted",
        )

    def stop(self) -> None:
        if self._limit is not None:
            self.pod_limit = None
        self.api.api_client.close()  # type: ignore[no-untyped-call]


class RegisteredWebhook:
    """``gpuplane webhook`` served over TLS on loopback (its own process) and registered with a real
    API server as a MutatingWebhookConfiguration for Pods and for the job kinds it suspends (as
    deploy/webhook.yaml registers it), with a URL and a test CA bundle.

    It acts only in namespaces labelled :data:`E2E_LABEL`, so it never touches anything else on the
    server, and fails closed there (a pod the webhook could not see would go to kube-scheduler, a
    queued job it could not see would run unsuspended).
    """

    NAME = "gpuplane-e2e"

    def __init__(self, kubeconfig: str, directory: Path, name: str = NAME) -> None:
        self.name = name  # another name registers a second configuration beside the tests' own
        self.api = KubeApi(load_api_client(kubeconfig), qps=None)
        self.certs = testca.issue(directory)
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> RegisteredWebhook:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuplane",
                "webhook",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--cert",
                str(self.certs.cert),
                "--key",
                str(self.certs.key),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_until(self._answers, 30, "gpuplane webhook serving TLS")
        body = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": self.name},
            "webhooks": [
                self._entry("pods.gpuplane.dev", [k8s.PODS]),
                self._entry(
                    "jobs.gpuplane.dev",
                    [i.resource for i in integrations.INTEGRATIONS.values() if i.suspend is not None],
                ),
            ],
        }
        with contextlib.suppress(ApiError):
            self.api.delete(WEBHOOKS, self.name)
        self.api.create(WEBHOOKS, body)
        self._wait_effective()
        return self

    def _entry(self, name: str, resources: list[Resource]) -> dict[str, Any]:
        """One webhook of the configuration: CREATE of ``resources``, in e2e namespaces only."""
        return {
            "name": name,
            "clientConfig": {
                "url": f"https://127.0.0.1:{self.port}/mutate",
                "caBundle": base64.b64encode(self.certs.ca_pem).decode(),
            },
            "rules": [
                {
                    "apiGroups": [res.group],
                    "apiVersions": [res.version],
                    "operations": ["CREATE"],
                    "resources": [res.plural],
                    "scope": "Namespaced",
                }
                for res in resources
            ],
            "namespaceSelector": {"matchLabels": {E2E_LABEL: "true"}},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
            "reinvocationPolicy": "IfNeeded",
        }

    def _answers(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.certs.ca))
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as raw:
                context.wrap_socket(raw, server_hostname="127.0.0.1").close()
        except OSError:
            return False
        return True

    def _wait_effective(self) -> None:
        """Until the API server calls the webhook: a dry-run pod in a labelled namespace comes back
        with gpuplane's scheduler name, and a dry-run queued Job comes back suspended (the server
        picks a new configuration up within a second or so)."""
        namespace = f"e2e-webhook-{uuid.uuid4().hex[:6]}"
        self.api.create(k8s.NAMESPACES, {"metadata": {"name": namespace, "labels": {E2E_LABEL: "true"}}})
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "labels": {keys.QUEUE_NAME_LABEL: "probe"}},
            "spec": {"containers": [{"name": "c", "image": "none"}]},
        }

        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "probe", "labels": {keys.QUEUE_NAME_LABEL: "probe"}},
            "spec": {"template": {"spec": {**pod["spec"], "restartPolicy": "Never"}}},
        }

        def gated() -> bool:
            created = self.api.request("POST", k8s.PODS.path(namespace), {"dryRun": "All"}, body=pod)
            if created["spec"].get("schedulerName") != keys.SCHEDULER_NAME:
                return False
            created = self.api.request("POST", k8s.JOBS.path(namespace), {"dryRun": "All"}, body=job)
            return created["spec"].get("suspend") is True

        try:
            wait_until(gated, 30, "the API server calling the registered webhook")
        finally:
            self.api.delete(k8s.NAMESPACES, namespace)

    def stop(self) -> None:
        # The server may be gone already (a control plane stopped before this): nothing to undo there.
        with contextlib.suppress(ApiError, HTTPError, OSError):
            self.api.delete(WEBHOOKS, self.name)
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.api.api_client.close()  # type: ignore[no-untyped-call]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Webhooks:
    """The webhooks this session registered, one per real API server (by kubeconfig)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._running: dict[str, RegisteredWebhook] = {}

    def ensure(self, kubeconfig: str) -> RegisteredWebhook:
        """The webhook registered with the server of ``kubeconfig``, started on first use."""
        if kubeconfig not in self._running:
            webhook = RegisteredWebhook(kubeconfig, self._tmp.mktemp("webhook-tls"))
            self._running[kubeconfig] = webhook
            webhook.start()
        return self._running[kubeconfig]

    def stop(self) -> None:
        for webhook in self._running.values():
            webhook.stop()
        self._running.clear()


@pytest.fixture(scope="session")
def webhooks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhooks]:
    """Registers the webhook with a real API server on request (:meth:`Webhooks.ensure`); every one is
    unregistered and stopped when the session ends."""
    registry = Webhooks(tmp_path_factory)
    try:
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def registered_webhook(webhooks: Webhooks) -> RegisteredWebhook | None:
    """On a real server (``GPUPLANE_E2E_KUBECONFIG``), the webhook registered for the whole session;
    None on the double, which calls no webhooks."""
    kubeconfig = os.environ.get(E2E_KUBECONFIG)
    return webhooks.ensure(kubeconfig) if kubeconfig else None


_namespaces = itertools.count(1)


@pytest.fixture(name="api")
def kube_api(apiserver: Cluster) -> Iterator[k8s.KubeApi]:
    """A gpuplane client (no rate limit) for ``apiserver``; closed after the test."""
    client = k8s.load_api_client(str(apiserver.kubeconfig_path))
    try:
        yield k8s.KubeApi(client, qps=None)
    finally:
        client.close()  # type: ignore[no-untyped-call]


@pytest.fixture(name="namespace")
def fresh_namespace(api: k8s.KubeApi, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of its own for the test (named after its module), deleted after it."""
    prefix = request.module.__name__.rsplit(".", 1)[-1].removeprefix("test_").replace("_", "-")[:20]
    name = f"{prefix}-{int(time.time() * 1000) % 10**8}-{next(_namespaces)}"
    api.create(k8s.NAMESPACES, {"metadata": {"name": name}})
    yield name
    api.delete(k8s.NAMESPACES, name)


@pytest.fixture
def scene(
    apiserver: Cluster, kubectl: Kubectl, registered_webhook: RegisteredWebhook | None
) -> Iterator[Scene]:
    """One test's :class:`Scene` on the ``apiserver`` fixture (the double, or a real server with the
    webhook registered, which its API server then calls; the double calls none). A test module that
    needs another variant (the double only, say) defines its own ``scene``."""
    del registered_webhook
    yield from make_scene(apiserver, kubectl)


# --- the controller under test -------------------------------------------------------------------


class Killed(Exception):  # noqa: N818 (it names what happened to the process, as SIGKILL would)
    """The controller's process is gone: its API calls fail from now on."""


class KillableApi(KubeApi):
    """The controller's client. :meth:`kill` makes every later call raise :class:`Killed`.

    ``kill_after`` kills it on its Nth call: before sending that request, or just after the server
    answered it when ``after_send`` is set (the process died before it read the answer).
    """

    def __init__(self, api_client: Any, *, kill_after: int | None = None, after_send: bool = False) -> None:
        super().__init__(api_client, timeout=10.0)
        self.kill_after = kill_after
        self.after_send = after_send
        self.calls = 0
        self.killed = threading.Event()
        self._lock = threading.Lock()
        self._streams: list[Any] = []

    def _call(
        self, method: str, path: str, query: Mapping[str, object] | None = None, *args: Any, **kw: Any
    ) -> Any:
        with self._lock:
            if self.killed.is_set():
                raise Killed(path)
            self.calls += 1
            last = self.kill_after is not None and self.calls >= self.kill_after
            if last and not self.after_send:
                self.killed.set()
                raise Killed(path)
        response = super()._call(method, path, query, *args, **kw)
        if last:
            self.kill()
            raise Killed(path)
        if (query or {}).get("watch"):
            with self._lock:
                self._streams.append(response)
        return response

    def kill(self) -> None:
        """Fail every later call and cut the open watch streams."""
        with self._lock:
            self.killed.set()
            streams, self._streams = self._streams, []
        for response in streams:
            with contextlib.suppress(Exception):
                response.response.shutdown()


class ObservedController(Controller):
    """A Controller that counts its reconcile passes and remembers whether it led in the last one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.passes = 0
        self.leading = False

    def reconcile(self) -> Any:
        plan = super().reconcile()
        self.leading = not self.config.leader_election or self.elector.is_leader
        self.passes += 1
        return plan


class RunningController:
    """One controller replica in a background thread, with its own client and informers.

    ``stop()`` is a clean shutdown (the lease is released); ``kill()`` is abrupt: from the next API
    call on, the replica is gone, mid-pass if it was in one, and its lease is left to expire. Both
    wait until every thread of the replica has ended, so a killed replica's last request has been
    answered before the test goes on (as with a dead process).
    """

    def __init__(
        self,
        kubeconfig: str,
        *,
        identity: str = "gpuplane-0",
        dry_run: bool = True,
        leader_election: bool = True,
        lease_namespace: str = "gpuplane-system",
        lease_duration: float = 15.0,
        clock: Callable[[], float] = time.time,
        interval: float = 0.05,
        watch_timeout: int = 5,
        kill_after: int | None = None,
        after_send: bool = False,
        kueue_config: KueueConfigSource = DEFAULT_SOURCE,
    ) -> None:
        self.identity = identity
        client = load_api_client(kubeconfig)
        client.user_agent = self.user_agent  # tells the replicas apart in the request log
        self.api = KillableApi(client, kill_after=kill_after, after_send=after_send)
        config = ControllerConfig(
            dry_run_preemption=dry_run,
            leader_election=leader_election,
            identity=identity,
            lease_namespace=lease_namespace,
            lease_duration=lease_duration,
            kueue_config=kueue_config,
        )
        self.controller = ObservedController(self.api, config, clock)
        for informer in self.controller.informers:
            informer.watch_timeout = watch_timeout
            informer.sleep = informer.stopped.wait  # a back-off ends when the replica stops
        self.interval = interval
        self.failure: BaseException | None = None
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._stopped = False

    @property
    def user_agent(self) -> str:
        return f"{CONTROLLER_AGENT}/{self.identity}"

    @property
    def passes(self) -> int:
        return self.controller.passes

    def start(self, *, loop: bool = True) -> RunningController:
        """Start the informers and, with ``loop``, the reconcile loop once they have synced (without
        it, the test calls ``controller.reconcile()`` itself)."""
        for informer in self.controller.informers:
            self._threads.append(
                threading.Thread(target=informer.run, daemon=True, name=f"i-{informer.kind}")
            )
        if loop:
            self._threads.append(threading.Thread(target=self._main, daemon=True, name=self.identity))
        for thread in self._threads:
            thread.start()
        return self

    def _main(self) -> None:
        try:
            while not all(i.synced.is_set() for i in self.controller.informers):
                if self._stopping.wait(POLL):
                    return
            self.controller.run(self._stopping.is_set, self.interval)
        except Killed:
            pass
        except BaseException as err:  # surfaced by stop()/kill() instead of a thread warning
            self.failure = err

    def wait_passes(self, count: int, timeout: float = 10.0) -> None:
        """Wait until ``count`` more reconcile passes have finished."""
        target = self.passes + count
        wait_until(lambda: self.passes >= target, timeout, f"{count} reconcile passes of {self.identity}")

    def stop(self) -> None:
        """Clean shutdown: finish the pass in progress, release the lease, end the informers."""
        if self._stopped:
            return
        self._stopping.set()
        for thread in self._threads:
            if thread.name == self.identity:
                thread.join(timeout=10)
        if not self.api.killed.is_set():
            self.controller.stop()
        self._finish()

    def kill(self) -> None:
        """Abrupt end, at the replica's next API call."""
        if self._stopped:
            return
        self.api.kill()  # first: no request of the replica gets through from here on
        self._stopping.set()
        self._finish()

    def _finish(self) -> None:
        for informer in self.controller.informers:
            informer.stopped.set()
        self.api.kill()  # cuts the watch streams, so the informers see their stop flag at once
        for thread in self._threads:
            thread.join(timeout=10)
            assert not thread.is_alive(), f"{thread.name} of {self.identity} did not end"
        self.controller.close()  # its writer threads end once their last call has failed
        self._stopped = True
        self.api.api_client.close()  # type: ignore[no-untyped-call]
        if self.failure is not None:
            raise AssertionError(f"controller {self.identity} failed") from self.failure


# --- invariants ---------------------------------------------------------------------------------


def _quantity(resource: str, value: object) -> Fraction:
    return Fraction(parse_resource_quantity(resource, str(value)))


def quota_violations(
    workloads: Iterable[Mapping[str, Any]], cluster_queues: Iterable[Mapping[str, Any]]
) -> list[str]:
    """ClusterQueues whose admitted workloads use more of a flavor's resource than its quota allows.

    The limit is nominal + borrowingLimit; a queue in a cohort without a borrowing limit is bounded
    by the cohort's total nominal instead.
    """
    limits, cohort_of, cohort_nominal = _quota_limits(cluster_queues)
    used = _admitted_usage(workloads)
    problems = []
    cohort_used: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    for (cq, flavor, res), amount in sorted(used.items()):
        limit = limits.get((cq, flavor, res), Fraction(0))
        if limit is not None and amount > limit:
            problems.append(f"{cq}: {flavor}/{res} uses {amount}, more than {limit}")
        if cq in cohort_of:
            cohort_used[(cohort_of[cq], flavor, res)] += amount
    for key, amount in sorted(cohort_used.items()):
        if amount > cohort_nominal[key]:
            problems.append(
                f"cohort {key[0]}: {key[1]}/{key[2]} uses {amount}, more than {cohort_nominal[key]}"
            )
    return problems


def _quota_limits(
    cluster_queues: Iterable[Mapping[str, Any]],
) -> tuple[dict[tuple[str, str, str], Fraction | None], dict[str, str], dict[tuple[str, str, str], Fraction]]:
    """Per (queue, flavor, resource): nominal + borrowingLimit (None: bounded by the cohort only);
    each queue's cohort; per (cohort, flavor, resource): the cohort's total nominal."""
    limits: dict[tuple[str, str, str], Fraction | None] = {}
    cohort_of: dict[str, str] = {}
    cohort_nominal: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    for cq in cluster_queues:
        name = cq["metadata"]["name"]
        spec = cq.get("spec") or {}
        cohort = spec.get("cohortName") or spec.get("cohort")
        if cohort:
            cohort_of[name] = cohort
        for group in spec.get("resourceGroups") or []:
            for flavor in group.get("flavors") or []:
                for res in flavor.get("resources") or []:
                    nominal = _quantity(res["name"], res.get("nominalQuota", 0))
                    key = (name, flavor["name"], res["name"])
                    borrowing = res.get("borrowingLimit")
                    if borrowing is not None:
                        limits[key] = nominal + _quantity(res["name"], borrowing)
                    else:
                        limits[key] = None if cohort else nominal
                    if cohort:
                        cohort_nominal[(cohort, flavor["name"], res["name"])] += nominal
    return limits, cohort_of, cohort_nominal


def _admitted_usage(workloads: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, str], Fraction]:
    """Per (queue, flavor, resource): what the admitted workloads use. A finished workload keeps its
    ``status.admission`` (as in Kueue) but no longer holds its quota, and the pods of
    ``status.reclaimablePods`` no longer hold theirs."""
    used: dict[tuple[str, str, str], Fraction] = defaultdict(Fraction)
    for wl in workloads:
        admission = (wl.get("status") or {}).get("admission")
        finished = any(
            c.get("type") == "Finished" and c.get("status") == "True"
            for c in (wl.get("status") or {}).get("conditions") or []
        )
        if not admission or finished:
            continue
        # Pods that ended and will not run again (status.reclaimablePods) give their share back.
        ended = {r["name"]: int(r["count"]) for r in (wl.get("status") or {}).get("reclaimablePods") or []}
        for psa in admission.get("podSetAssignments") or []:
            count = int(psa.get("count") or 0)
            share = Fraction(count - ended.get(psa.get("name", ""), 0), count) if count else Fraction(1)
            for res, amount in (psa.get("resourceUsage") or {}).items():
                flavor = (psa.get("flavors") or {}).get(res, "")
                used[(admission["clusterQueue"], flavor, res)] += _quantity(res, amount) * share
    return used


def double_bindings(log: Iterable[Any]) -> list[str]:
    """Pods with more than one successful binding in the request log (as "namespace/name")."""
    counts = Counter(
        f"{e.request.namespace}/{e.request.name}"
        for e in log
        if e.request.verb == "create" and e.request.subresource == "binding" and 200 <= e.status < 300
    )
    return sorted(pod for pod, n in counts.items() if n > 1)


def admission_episodes(log: Iterable[Any]) -> tuple[dict[str, int], list[str]]:
    """Per workload, how many times an admission was written; and the workloads admitted twice.

    Successful writes of a Workload's status are read in order: each one either carries an admission
    or not (pending, released after an eviction). A write that marks an admitted workload Evicted
    keeps its admission (Kueue keeps the quota until the job stops) and starts no episode. Writing
    an admission while the last written status already carried one means the workload was admitted
    twice in one episode.
    """
    last: dict[str, bool] = {}
    episodes: dict[str, int] = defaultdict(int)
    twice: list[str] = []
    for e in log:
        request = e.request
        if request.resource != WORKLOAD_RESOURCE or request.subresource != "status":
            continue
        if request.verb not in ("update", "patch") or not 200 <= e.status < 300:
            continue
        key = f"{request.namespace}/{request.name}"
        status = (request.body or {}).get("status") or {}
        admitted = bool(status.get("admission"))
        evicted = any(
            c.get("type") == "Evicted" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        if admitted and evicted:
            continue
        if admitted:
            if last.get(key):
                twice.append(key)
            episodes[key] += 1
        last[key] = admitted
    return dict(episodes), twice


@dataclass
class QuotaSampler:
    """Checks the quota invariant at sampled points while a test runs (reads the double's store)."""

    read: Callable[[], tuple[list[dict[str, Any]], list[dict[str, Any]]]]
    samples: int = 0
    problems: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        workloads, queues = self.read()
        self.problems += quota_violations(workloads, queues)
        self.samples += 1

    def __enter__(self) -> QuotaSampler:
        def loop() -> None:
            while not self._stop.wait(POLL):
                self.sample()

        self._thread = threading.Thread(target=loop, daemon=True, name="quota-sampler")
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def bound_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if (p.get("spec") or {}).get("nodeName")
    }


def devices_overlap(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Devices recorded (``gpuplane.dev/devices``) for more than one live pod on the same node."""
    taken: dict[tuple[str, str], str] = {}
    clashes = []
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        devices = ((pod.get("metadata") or {}).get("annotations") or {}).get("gpuplane.dev/devices")
        if not node_name or not devices or pod["metadata"].get("deletionTimestamp"):
            continue
        for device in devices.split(","):
            other = taken.setdefault((node_name, device), pod["metadata"]["name"])
            if other != pod["metadata"]["name"]:
                clashes.append(f"{node_name}/{device}: {other} and {pod['metadata']['name']}")
    return clashes


def device_clashes(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Devices handed out twice among live bound pods: a whole GPU or MIG instance held by two pods, a
    whole GPU also shared, or fractions of one GPU that add up to more than one GPU."""
    whole: dict[tuple[str, str], list[str]] = {}
    fractions: dict[tuple[str, str], int] = Counter()
    problems = []
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue  # ended: its devices are free again
        recorded = (pod["metadata"].get("annotations") or {}).get("gpuplane.dev/devices")
        if not node_name or not recorded or pod["metadata"].get("deletionTimestamp"):
            continue
        for token in recorded.split(","):
            index, _, detail = token.partition(":")
            if detail.endswith("m"):
                fractions[(node_name, index)] += int(detail[:-1])
                whole.setdefault((node_name, index), [])
            else:
                whole.setdefault((node_name, token), []).append(pod["metadata"]["name"])
    for (node_name, device), holders in sorted(whole.items()):
        if len(holders) > 1:
            problems.append(f"{node_name}/{device} held by {holders}")
        if holders and fractions.get((node_name, device)):
            problems.append(f"{node_name}/{device} whole and shared")
    problems += [f"{n}/{d}: {m}m of one GPU" for (n, d), m in sorted(fractions.items()) if m > 1000]
    return problems
