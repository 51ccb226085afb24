"""The idle reaper end to end: the real control plane, real Prometheus with backfilled DCGM history and a
live DCGM stand-in, the ``gpuplane reaper`` command, and a Slack stand-in.

The policy takes a clock, so a pass runs "as of" a chosen time (``--at``): the first pass at the present
warns, the second one grace later reclaims, without waiting for either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dcgm_fixture import DcgmExporter
from gpuplane.insight import idle
from gpuplane.k8s.api import load_api_client
from gpuplane.reaper.cluster import ClusterApi
from gpuplane.reaper.loop import IDLE_REASON, Reaper, ReaperConfig
from gpuplane.reaper.notify import Retry, SlackNotifier
from gpuplane.reaper.prometheus import PrometheusClient
from prometheus import Prometheus, PrometheusFactory
from realkube import RealKube
from reaper_scene import GpuScene, history, install_notebook_crd, reaper_user, slack, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parent.parent
HOUR = 3600.0
GRACE = 300.0  # the namespace's grace, overriding the command line's 30m


def busy(_t: float) -> float:
    return 0.7


def zero(_t: float) -> float:
    return 0.0


@pytest.fixture
def scene(real_kube: RealKube) -> Iterator[GpuScene]:
    install_notebook_crd(real_kube)
    ns = real_kube.namespace("reaper")
    real_kube.kubectl("annotate", "namespace", ns, f"{idle.GRACE_ANNOTATION}=5m")
    built = GpuScene(real_kube, ns)
    try:
        yield built
    finally:
        built.close()


@pytest.fixture
def reaper_kubeconfig(scene: GpuScene) -> Iterator[Path]:
    """A user holding only the reaper's ClusterRole (deploy/reaper/reaper.yaml), as the reaper runs."""
    with reaper_user(scene.kube, scene.namespace) as kubeconfig:
        yield kubeconfig


def reaper_cli(
    scene: GpuScene, prom: Prometheus, at: float, *args: str, kubeconfig: Path | None = None
) -> list[dict[str, Any]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplane",
            "reaper",
            "--kubeconfig",
            str(kubeconfig or scene.kube.kubeconfig),
            "--namespace",
            scene.namespace,
            "--prometheus",
            prom.url,
            "--once",
            "--output",
            "json",
            "--grace",
            "30m",
            "--at",
            idle.format_time(at),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    decisions: list[dict[str, Any]] = json.loads(result.stdout)
    return decisions


def by_pod(decisions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {d["pod"]: d for d in decisions}


def _check_dry_run(dry: dict[str, dict[str, Any]], pods: dict[str, str], now: float) -> None:
    """The dry run's decision for each pod of the scene, and what it says of the idle notebook."""
    want = {
        "idle": ("warn", "Idle"),
        "busy": ("keep", "Busy"),
        "optout": ("keep", "OptedOut"),
        "nometrics": ("keep", "NoMetrics"),
        "sts": ("warn", "Idle"),
        "train": ("keep", "NotASession"),
        "hub": ("warn", "Idle"),
    }
    assert {k: (dry[p]["action"], dry[p]["reason"]) for k, p in pods.items()} == want
    idle_nb = dry[pods["idle"]]
    assert idle_nb["owner"] == {"kind": "Notebook", "name": "idle-nb"}
    assert idle_nb["gpus"] == 1
    assert idle_nb["idleSeconds"] >= 2 * HOUR
    assert idle_nb["reclaimAt"] == idle.format_time(now + GRACE)
    assert dry[pods["sts"]]["owner"] == {"kind": "StatefulSet", "name": "desk"}
    assert dry[pods["train"]]["owner"] == {"kind": "Job", "name": "train"}
    assert dry[pods["hub"]]["owner"] == {"kind": "Pod", "name": "jupyter-alice"}
    assert "missing metrics are never idle" in dry[pods["nometrics"]]["message"]


def _check_reclaimed(scene: GpuScene, later: dict[str, dict[str, Any]], pods: dict[str, str]) -> None:
    """After the grace: the idle sessions reclaimed, each the way its owner stops, and no other."""
    assert later[pods["idle"]]["action"] == "reclaim"
    assert later[pods["busy"]]["action"] == "keep"
    notebook = scene.get("notebook", "idle-nb")
    notes = notebook["metadata"]["annotations"]
    assert "kubeflow-resource-stopped" in notes
    assert idle.RECLAIM_AT_ANNOTATION not in notes
    for name in ("busy-nb", "optout-nb", "nometrics-nb"):
        assert "kubeflow-resource-stopped" not in (
            scene.get("notebook", name)["metadata"].get("annotations") or {}
        )
    desk = scene.get("statefulset", "desk")
    assert desk["spec"]["replicas"] == 0
    assert desk["metadata"]["annotations"]["gpuplane.dev/replicas-before-reclaim"] == "1"
    reclaimed = {(e.involved_object.kind, e.involved_object.name) for e in scene.events(IDLE_REASON)}
    assert {("Notebook", "idle-nb"), ("StatefulSet", "desk"), ("Pod", pods["idle"])} <= reclaimed
    assert scene.get("job", "train")["spec"].get("suspend") in (None, False)


def test_idle_notebook_is_warned_then_reclaimed_and_others_are_kept(
    scene: GpuScene, prometheus_factory: PrometheusFactory, reaper_kubeconfig: Path
) -> None:
    pods = {
        "idle": scene.notebook("idle-nb"),
        "busy": scene.notebook("busy-nb"),
        "optout": scene.notebook("optout-nb", {idle.OPT_OUT_ANNOTATION: "disabled"}),
        "nometrics": scene.notebook("nometrics-nb"),
        "sts": scene.statefulset("desk", labels={idle.SESSION_LABEL: "true"}),
        "train": scene.job("train"),
        "hub": scene.bare_pod("jupyter-alice", {"component": "singleuser-server", "app": "jupyterhub"}),
    }
    start = float(int(time.time()))
    metric = idle.GR_ENGINE_ACTIVE
    shape = {"idle": zero, "busy": busy, "optout": zero, "sts": zero, "train": zero, "hub": zero}
    backfill = history(
        {(metric, pods[k]): f for k, f in shape.items()},
        namespace=scene.namespace,
        node=scene.node,
        start=start - 3 * HOUR,
        end=start - 60,
    )
    with DcgmExporter() as dcgm:
        # The present comes from a live exporter: the busy notebook is still at work.
        index = {pod: i for i, pod in enumerate(sorted(pods[k] for k in shape))}
        for key, f in shape.items():
            dcgm.set(
                metric,
                f(start),
                gpu=index[pods[key]] * 8,
                node=scene.node,
                namespace=scene.namespace,
                pod=pods[key],
            )
        prom = prometheus_factory(scrape_targets=[dcgm.target], backfill=backfill)
        prom.wait_for(f'{metric}{{pod="{pods["busy"]}"}}')
        now = float(int(time.time()))  # the live exporter has been scraped by now

        # --- a dry run writes nothing and decides what the enforcing run then does ------------------
        before = scene.versions()
        dry = by_pod(reaper_cli(scene, prom, now, kubeconfig=reaper_kubeconfig))
        assert scene.versions() == before

        _check_dry_run(dry, pods, now)
        idle_nb = dry[pods["idle"]]

        # The busy notebook was warned earlier, and its user came back since.
        scene.kube.kubectl(
            "-n",
            scene.namespace,
            "annotate",
            "notebook",
            "busy-nb",
            f"{idle.RECLAIM_AT_ANNOTATION}={idle.format_time(now)}",
        )
        with slack() as receiver:
            # --- warn -----------------------------------------------------------------------------
            enforced = by_pod(
                reaper_cli(
                    scene, prom, now, "--enforce", "--notify-url", receiver.url, kubeconfig=reaper_kubeconfig
                )
            )
            assert {p: (d["action"], d["reason"], d["reclaimAt"]) for p, d in enforced.items()} == {
                p: (d["action"], d["reason"], d["reclaimAt"]) for p, d in dry.items()
            }
            notebook = scene.get("notebook", "idle-nb")
            assert notebook["metadata"]["annotations"][idle.RECLAIM_AT_ANNOTATION] == idle_nb["reclaimAt"]
            warned = {(e.involved_object.kind, e.involved_object.name) for e in scene.events("IdleGPU")}
            assert {("Pod", pods["idle"]), ("Notebook", "idle-nb"), ("StatefulSet", "desk")} <= warned
            assert ("Pod", "jupyter-alice") in warned
            assert not {name for _, name in warned} & {pods[k] for k in ("busy", "optout", "nometrics")}
            busy_notes = scene.get("notebook", "busy-nb")["metadata"].get("annotations") or {}
            assert idle.RECLAIM_AT_ANNOTATION not in busy_notes
            wait_until(lambda: len(receiver.bodies) >= 3, message="three webhook messages")
            body = next(b for b in receiver.bodies if pods["idle"] in b["text"])
            fields = " ".join(f["text"] for f in body["blocks"][1]["fields"])
            for text in (pods["idle"], "Notebook idle-nb", "*GPUs*\n1", idle_nb["reclaimAt"], "*Idle for*"):
                assert text in fields
            assert idle.KEEP_UNTIL_ANNOTATION in json.dumps(body["blocks"][2])

            # A second pass at the same time repeats nothing.
            count = len(scene.events("IdleGPU"))
            reaper_cli(
                scene, prom, now, "--enforce", "--notify-url", receiver.url, kubeconfig=reaper_kubeconfig
            )
            assert len(scene.events("IdleGPU")) == count

            # --- reclaim, grace later --------------------------------------------------------------
            later = by_pod(
                reaper_cli(
                    scene,
                    prom,
                    now + GRACE,
                    "--enforce",
                    "--notify-url",
                    receiver.url,
                    kubeconfig=reaper_kubeconfig,
                )
            )
        _check_reclaimed(scene, later, pods)
        # The notebook's pod is still there (no Kubeflow controller here): the next pass sees the
        # stop already asked for and repeats nothing.
        counts = (len(scene.events("IdleGPU")), len(scene.events(IDLE_REASON)))
        reaper_cli(scene, prom, now + GRACE + 60, "--enforce", kubeconfig=reaper_kubeconfig)
        assert (len(scene.events("IdleGPU")), len(scene.events(IDLE_REASON))) == counts
        # JupyterHub's server pod has no controller: deleted (its grace is 0, so it is gone).
        assert not scene.pods("component=singleuser-server")


def test_a_slow_or_failing_webhook_delays_no_reclaim_and_loses_no_warning(
    scene: GpuScene, prometheus_factory: PrometheusFactory
) -> None:
    pods = [scene.notebook(f"nb-{i}") for i in range(3)]
    now = float(int(time.time()))
    metric = idle.GR_ENGINE_ACTIVE
    backfill = history(
        {(metric, p): zero for p in pods},
        namespace=scene.namespace,
        node=scene.node,
        start=now - 3 * HOUR,
        end=now,
    )
    prom = prometheus_factory(backfill=backfill)
    api = ClusterApi(load_api_client(str(scene.kube.kubeconfig)))
    # First a hang past the sender's timeout, then 429 twice, then 500, then success.
    with slack(["hang", "429", "429", "500"]) as receiver:
        # A timeout long enough that a busy machine's slow 200 is rarely retried; delivery is at least
        # once, so a retried 200 may still arrive twice, one after the other.
        notifier = SlackNotifier(receiver.url, timeout=3.0, retry=Retry(backoff=0.2))
        reaper = Reaper(
            api,
            PrometheusClient(prom.url),
            ReaperConfig(
                defaults=idle.IdleSettings(grace=GRACE), enforce=True, namespaces=(scene.namespace,)
            ),
            notify=notifier.send,
        )
        try:
            warned = reaper.run_once(now)
            # The pass finished while the receiver still hangs on the first message.
            assert receiver.bodies == []
            assert [r.decision.action for r in warned] == [idle.Action.WARN] * 3
            reclaimed = reaper.run_once(now + GRACE)
            assert [r.decision.action for r in reclaimed] == [idle.Action.RECLAIM] * 3
            labels = {"namespace": scene.namespace, "owner_kind": "Notebook"}
            registry = reaper.metrics.registry
            assert registry.get_sample_value("gpuplane_reaper_reclaimed_total", labels) == 3
            freed = registry.get_sample_value("gpuplane_reaper_reclaimed_gpu_hours_total", labels)
            idle_hours = sum(r.decision.idle_seconds or 0 for r in reclaimed) / 3600
            assert freed == pytest.approx(idle_hours)
            assert freed > 3 * 2  # three one-GPU sessions, each idle past the 2 h window
            for i in range(3):
                assert (
                    "kubeflow-resource-stopped" in scene.get("notebook", f"nb-{i}")["metadata"]["annotations"]
                )
            # Three warnings and three reclaim notices, all delivered in the end, in order.
            wait_until(lambda: len(_once(receiver.bodies)) == 6, timeout=30, message="six webhook messages")
        finally:
            notifier.close()
    assert receiver.answers[:4] == ["hang", "429", "429", "500"]
    texts = [b["text"] for b in _once(receiver.bodies)]
    assert len(set(texts)) == 6
    assert [t.startswith("Reclaimed") for t in texts] == [False] * 3 + [True] * 3
    assert notifier.dropped == 0


def _once(bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The delivered bodies with a retried delivery's second copy (the one right after it) dropped."""
    return [b for i, b in enumerate(bodies) if i == 0 or b != bodies[i - 1]]


def test_data_stall_hint_fires_on_the_stall_and_not_on_the_busy_job(
    scene: GpuScene, prometheus_factory: PrometheusFactory, reaper_kubeconfig: Path
) -> None:
    stalled, steady = scene.job("stalled"), scene.job("steady")
    # The stalled job is queue-managed: its Workload gets the condition (Kueue's CRDs where missing;
    # never deleted).
    scene.kube.kubectl("apply", "-f", str(ROOT / "deploy" / "crds"))
    scene.kube.kubectl("wait", "--for=condition=Established", "crd/workloads.kueue.x-k8s.io")
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {
            "name": "job-stalled",
            "namespace": scene.namespace,
            "labels": {"kueue.x-k8s.io/job-uid": scene.uid("job", "stalled")},
        },
        "spec": {
            "queueName": "queue",
            "podSets": [
                {"name": "main", "count": 1, "template": {"spec": {"containers": [{"name": "main"}]}}}
            ],
        },
    }
    scene.apply(workload)
    end = float(int(time.time()))
    now = end - HOUR  # the stall lasts until an hour ago; the last hour is steady
    series = {
        (idle.SM_ACTIVE, stalled): lambda t: 0.06 if t <= now else 0.8,
        (idle.GPU_UTIL, stalled): lambda _t: 97.0,
        (idle.SM_ACTIVE, steady): lambda _t: 0.82,
        (idle.GPU_UTIL, steady): lambda _t: 100.0,
    }
    backfill = history(series, namespace=scene.namespace, node=scene.node, start=end - 2 * HOUR, end=end)
    prom = prometheus_factory(backfill=backfill)
    api = ClusterApi(load_api_client(str(reaper_kubeconfig)))
    reaper = Reaper(
        api, PrometheusClient(prom.url), ReaperConfig(enforce=True, namespaces=(scene.namespace,))
    )
    reports = {r.subject.name: r.as_json() for r in reaper.run_once(now)}
    assert reports[stalled]["action"] == "keep"
    assert reports[stalled]["dataStall"]["lowSmShare"] == "1.00"
    assert "dataStall" not in reports[steady]
    flagged = {(e.involved_object.kind, e.involved_object.name) for e in scene.events("DataStallSuspected")}
    assert flagged == {("Pod", stalled), ("Workload", "job-stalled")}

    def stall_condition() -> dict[str, Any]:
        conditions = scene.get("workload", "job-stalled")["status"]["conditions"]
        return next(c for c in conditions if c["type"] == idle.DATA_STALL_CONDITION)

    cond = stall_condition()
    assert (cond["status"], cond["reason"]) == ("True", "LowSMActivity")
    assert "lowSmShare=1.00" in cond["message"]
    assert "window=30m" in cond["message"]
    # Once per episode: a second pass writes nothing new.
    reaper.run_once(now)
    assert len(scene.events("DataStallSuspected")) == 2
    # An hour later the input keeps up: the episode ends, and the condition says so.
    later = {r.subject.name: r.as_json() for r in reaper.run_once(end)}
    assert "dataStall" not in later[stalled]
    cond = stall_condition()
    assert (cond["status"], cond["reason"]) == ("False", "NoDataStall")
    assert len(scene.events("DataStallSuspected")) == 2
    # The hint never acts: both jobs keep running.
    for name in ("stalled", "steady"):
        assert not scene.get("job", name)["spec"].get("suspend")


def test_an_owner_with_two_pods_is_warned_once_and_only_when_both_are_idle(
    scene: GpuScene, prometheus_factory: PrometheusFactory
) -> None:
    both = scene.statefulset("pair-idle", labels={idle.SESSION_LABEL: "true"}, replicas=2).split(",")
    half = scene.statefulset("pair-half", labels={idle.SESSION_LABEL: "true"}, replicas=2).split(",")
    now = float(int(time.time()))
    shape = {both[0]: zero, both[1]: zero, half[0]: zero, half[1]: busy}
    backfill = history(
        {(idle.GR_ENGINE_ACTIVE, pod): f for pod, f in shape.items()},
        namespace=scene.namespace,
        node=scene.node,
        start=now - 3 * HOUR,
        end=now,
    )
    prom = prometheus_factory(backfill=backfill)
    api = ClusterApi(load_api_client(str(scene.kube.kubeconfig)))
    config = ReaperConfig(
        defaults=idle.IdleSettings(grace=GRACE), enforce=True, namespaces=(scene.namespace,)
    )
    with slack() as receiver:
        notifier = SlackNotifier(receiver.url, timeout=2.0, retry=Retry(backoff=0.1))
        reaper = Reaper(api, PrometheusClient(prom.url), config, notify=notifier.send)
        try:
            reports = {r.subject.name: r for r in reaper.run_once(now)}
            wait_until(lambda: receiver.bodies, message="the warning delivered")
        finally:
            notifier.close(drain=10)
    assert [reports[p].decision.action for p in both] == [idle.Action.WARN] * 2
    assert [reports[p].decision.action for p in half] == [idle.Action.KEEP] * 2  # one pod is busy
    assert {reports[p].decision.reason for p in half} == {idle.Reason.BUSY}
    owners = [
        e.involved_object.name for e in scene.events("IdleGPU") if e.involved_object.kind == "StatefulSet"
    ]
    assert owners == ["pair-idle"]
    assert len(receiver.bodies) == 1
    assert "*GPUs*\\n2" in json.dumps(receiver.bodies[0])

    reaper = Reaper(api, PrometheusClient(prom.url), config)
    reaper.run_once(now + GRACE)
    assert scene.get("statefulset", "pair-idle")["spec"]["replicas"] == 0
    assert scene.get("statefulset", "pair-half")["spec"]["replicas"] == 2
    labels = {"namespace": scene.namespace, "owner_kind": "StatefulSet"}
    assert reaper.metrics.registry.get_sample_value("gpuplane_reaper_reclaimed_total", labels) == 1
