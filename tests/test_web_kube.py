"""The web console on the real control plane, in headless Chromium, as alice, bob and carol.

The scenario (``web_scenario``) is created in fresh namespaces with a unique prefix on every
cluster-scoped name. RBAC is granted here: alice's group may list Workloads in her team's and
the serving namespace and list Nodes; bob's group his team's namespace; carol nothing. The
console authenticates every token with TokenReview and authorizes with SubjectAccessReview.
What each user sees is checked against ``gpuplane schedule`` on the same objects read back
from the API server. The overview's GPU history comes from a real Prometheus that scraped
(and was backfilled with) dcgm-exporter's series.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dcgm_fixture import DcgmExporter
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.web.app import create_app
from gpuplane.web.auth import KubeAuthenticator
from gpuplane.web.prometheus import ALLOCATED_BY_NAMESPACE, HistoryCache, PrometheusClient
from gpuplane.web.sources import KubeSource, SnapshotHub
from manifests import documents, workload
from prometheus import PrometheusFactory
from realkube import RealKube
from web_harness import artifacts_dir, chromium, console_errors, require_browser, screenshot, serve
from web_scenario import NAMESPACES, _at, scenario
from web_tables import element_text, table_rows, workload_rows

pytestmark = pytest.mark.slow
CRDS = Path(__file__).resolve().parent.parent / "deploy" / "crds"
KUEUE_KINDS = ("clusterqueues", "localqueues", "resourceflavors", "cohorts", "workloads")


DOCS = Path(__file__).resolve().parent.parent / "docs" / "web.md"


def docs_rbac() -> list[dict[str, Any]]:
    """The read-only role and binding that docs/web.md shows (so the docs' example is tested)."""
    text = DOCS.read_text()
    block = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    return list(yaml.safe_load_all(block))


def rbac(prefix: str, ns: dict[str, str]) -> str:
    role, binding = docs_rbac()
    assert (role["kind"], binding["kind"]) == ("ClusterRole", "RoleBinding")
    role["metadata"]["name"] = reader = f"{prefix}{role['metadata']['name']}"
    docs: list[dict[str, Any]] = [
        role,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{prefix}node-reader"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{prefix}team-a-nodes"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": f"{prefix}node-reader",
            },
            "subjects": [{"kind": "Group", "name": "team-a", "apiGroup": "rbac.authorization.k8s.io"}],
        },
    ]
    for group, namespace in (("team-a", ns["team-a"]), ("team-a", ns["serving"]), ("team-b", ns["team-b"])):
        copy = json.loads(json.dumps(binding))
        copy["metadata"] = {"name": f"{group}-reads-workloads", "namespace": namespace}
        copy["roleRef"]["name"] = reader
        copy["subjects"][0]["name"] = group
        docs.append(copy)
    return yaml.safe_dump_all(docs)


@pytest.fixture(scope="module")
def cluster(real_kube: RealKube) -> Iterator[dict[str, Any]]:
    for user in ("alice", "bob", "carol"):
        real_kube.token(user)  # skips on a cluster given by GPUPLANE_E2E_KUBECONFIG (no token users)
    real_kube.kubectl("apply", "-f", str(CRDS))
    real_kube.kubectl("wait", "--for=condition=established", "--timeout=60s", "-f", str(CRDS))
    ns = {name: real_kube.namespace(f"web-{name}") for name in NAMESPACES}
    prefix = f"web{os.getpid()}-"
    objects = scenario(prefix, ns)
    real_kube.kubectl("apply", "-f", "-", input=documents(*objects))
    for obj in objects:
        if obj.body["kind"] == "Node":
            status = {
                "capacity": obj.body["status"]["allocatable"],
                "allocatable": obj.body["status"]["allocatable"],
            }
            real_kube.kubectl(
                "patch",
                "node",
                obj.body["metadata"]["name"],
                "--subresource=status",
                "--type=merge",
                "-p",
                json.dumps({"status": status}),
            )
    real_kube.kubectl("apply", "-f", "-", input=rbac(prefix, ns))
    # An Event about a workload, as the controller records one.
    real_kube.kubectl(
        "-n",
        ns["team-b"],
        "create",
        "-f",
        "-",
        input=yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": "sweep-1.pending", "namespace": ns["team-b"]},
                "involvedObject": {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "Workload",
                    "name": "sweep-1",
                    "namespace": ns["team-b"],
                },
                "reason": "Pending",
                "message": "waiting for quota in the research cohort",
                "type": "Normal",
                "firstTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "count": 1,
                "source": {"component": "gpuplane-controller"},
            }
        ),
    )
    api = KubeApi(load_api_client(str(real_kube.kubeconfig)))
    hub = SnapshotHub()
    source = KubeSource(api, hub, watch_timeout=5)
    source.start()
    try:
        yield {"kube": real_kube, "ns": ns, "prefix": prefix, "api": api, "hub": hub, "source": source}
    finally:
        source.stop()
        for kind in ("clusterrolebinding", "clusterrole"):
            for name in (
                (f"{prefix}team-a-nodes",)
                if kind == "clusterrolebinding"
                else (f"{prefix}workload-reader", f"{prefix}node-reader")
            ):
                real_kube.kubectl("delete", kind, name, "--wait=false", check=False)
        for obj in objects:
            meta = obj.body["metadata"]
            if "namespace" not in meta:
                real_kube.kubectl(
                    "delete",
                    f"{obj.body['kind'].lower()}s.{obj.body['apiVersion'].split('/')[0]}"
                    if "/" in obj.body["apiVersion"]
                    else obj.body["kind"].lower(),
                    meta["name"],
                    "--wait=false",
                    check=False,
                )


@pytest.fixture(scope="module")
def console(cluster: dict[str, Any]) -> Iterator[str]:
    auth = KubeAuthenticator(cluster["api"], cluster["source"].namespaces)
    with serve(create_app(cluster["hub"], auth, heartbeat=1.0)) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return artifacts_dir(tmp_path_factory)


def mine(cluster: dict[str, Any]) -> list[dict[str, Any]]:
    """This module's objects, read back from the API server, for `gpuplane schedule`."""
    api: KubeApi = cluster["api"]
    ns = set(cluster["ns"].values())
    prefix = cluster["prefix"]
    out: list[dict[str, Any]] = []
    for res in (
        k8s.NAMESPACES,
        k8s.NODES,
        k8s.RESOURCE_FLAVORS,
        k8s.COHORTS,
        k8s.CLUSTER_QUEUES,
        k8s.LOCAL_QUEUES,
        k8s.WORKLOADS,
    ):
        for obj in api.list(res).get("items", []):
            meta = obj["metadata"]
            keep = (
                meta.get("namespace") in ns
                if res.namespaced
                else (meta["name"].startswith(prefix) or meta["name"] in ns)
            )
            if keep:
                out.append({**obj, "kind": res.kind, "apiVersion": res.api_version})
    return out


def cli_plan(cluster: dict[str, Any], folder: Path) -> dict[str, Any]:
    state = folder / "from-cluster.json"
    state.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": mine(cluster)}))
    result = subprocess.run(
        [sys.executable, "-m", "gpuplane", "schedule", "-f", str(state), "--output", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    plan: dict[str, Any] = json.loads(result.stdout)
    return plan


def wait_for_snapshot(cluster: dict[str, Any], keys: set[str], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        snap = cluster["hub"].current()
        seen = {wl.key for wl in snap.state.workloads} if snap else set()
        if keys <= seen and snap is not None and snap.explanations is not None:
            return
        assert time.monotonic() < deadline, f"the console never saw {sorted(keys - seen)}"
        time.sleep(0.1)


def sign_in(browser: Any, url: str, token: str) -> None:
    browser.get(url + "/login")
    browser.delete_all_cookies()
    browser.add_cookie({"name": "gpuplane_token", "value": token, "path": "/", "sameSite": "Strict"})


def status_of(url: str, token: str | None) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        with err:
            return int(err.code)


def test_without_a_token_every_page_is_401(console: str, cluster: dict[str, Any]) -> None:
    ns = cluster["ns"]["team-a"]
    for path in ("/", "/queues", "/nodes", "/reports", f"/workloads/{ns}/pretrain", "/events"):
        assert status_of(console + path, None) == 401, path
        assert status_of(console + path, "not-a-kubernetes-token") == 401, path


def test_alice_sees_her_namespaces_with_the_clis_numbers(
    console: str, cluster: dict[str, Any], browser: Any, shots: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    ns = cluster["ns"]
    wait_for_snapshot(cluster, {f"{ns['team-a']}/huge", f"{ns['secret']}/secret-job"})
    plan = cli_plan(cluster, tmp_path)
    kube: RealKube = cluster["kube"]
    sign_in(browser, console, kube.token("alice"))
    for path, name in (
        ("/", "overview"),
        ("/queues", "queues"),
        ("/nodes", "nodes"),
        ("/reports", "reports"),
        (f"/workloads/{ns['team-a']}/huge", "workload-pending"),
        (f"/workloads/{ns['team-a']}/pretrain", "workload-admitted"),
    ):
        browser.get(console + path)
        assert "Sign in" not in browser.title, path
        assert element_text(browser, "[data-test=user]") == "alice"
        assert console_errors(browser) == [], path
        screenshot(browser, shots, f"kube-alice-{name}")

    visible = {ns["team-a"], ns["serving"]}
    want = {p["workload"]: p for p in plan["pending"] if p["workload"].split("/")[0] in visible}
    assert want, "the scenario leaves work pending in alice's namespaces"
    browser.get(console + "/queues")
    shown = workload_rows(browser)
    mine_shown = {k: v for k, v in shown.items() if k.split("/")[0] in set(ns.values())}
    assert set(mine_shown) == set(want)  # team-b's and secret's pending work is absent
    for key, p in want.items():
        assert mine_shown[key][0] == str(p["localQueuePosition"]), key
        assert mine_shown[key][1] == str(p["position"]), key
        assert mine_shown[key][6] == p["reason"], key
    assert ns["secret"] not in browser.page_source
    assert ns["team-b"] not in browser.page_source

    key = f"{ns['team-a']}/huge"
    why = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplane",
            "why",
            "huge",
            "-n",
            ns["team-a"],
            "-f",
            str(tmp_path / "from-cluster.json"),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    explained = json.loads(why.stdout)
    browser.get(console + f"/workloads/{key}")
    assert browser.find_element(By.CSS_SELECTOR, "[data-test=position]").text == str(want[key]["position"])
    assert browser.find_element(By.CSS_SELECTOR, "[data-test=reason]").text == explained["reason"]
    assert browser.find_element(By.CSS_SELECTOR, "[data-test=fix]").text == explained["fix"]

    token = kube.token("alice")
    assert status_of(console + f"/workloads/{ns['secret']}/secret-job", token) == 403
    assert status_of(console + f"/workloads/{ns['team-b']}/sweep-1", token) == 403
    assert status_of(console + "/nodes", token) == 200


def test_bob_sees_only_his_team_and_its_events(
    console: str, cluster: dict[str, Any], browser: Any, shots: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    ns = cluster["ns"]
    plan = cli_plan(cluster, tmp_path)
    kube: RealKube = cluster["kube"]
    sign_in(browser, console, kube.token("bob"))
    browser.get(console + "/queues")
    shown = {k: v for k, v in workload_rows(browser).items() if k.split("/")[0] in set(ns.values())}
    want = {p["workload"]: p for p in plan["pending"] if p["workload"].startswith(ns["team-b"] + "/")}
    assert set(shown) == set(want)
    for key, p in want.items():
        assert (shown[key][1], shown[key][6]) == (str(p["position"]), p["reason"]), key
    browser.get(console + f"/workloads/{ns['team-b']}/sweep-1")
    events = browser.find_element(By.CSS_SELECTOR, "[data-test=events]").text
    assert "waiting for quota in the research cohort" in events
    screenshot(browser, shots, "kube-bob-workload-events")
    token = kube.token("bob")
    assert status_of(console + "/nodes", token) == 403  # bob may not list nodes
    assert status_of(console + f"/workloads/{ns['team-a']}/huge", token) == 403


def test_carol_without_rbac_sees_no_workload(console: str, cluster: dict[str, Any], browser: Any) -> None:

    ns = cluster["ns"]
    kube: RealKube = cluster["kube"]
    sign_in(browser, console, kube.token("carol"))
    browser.get(console + "/queues")
    assert not [k for k in workload_rows(browser) if k.split("/")[0] in set(ns.values())]
    browser.get(console + "/")
    assert element_text(browser, "[data-test=user]") == "carol"
    assert status_of(console + f"/workloads/{ns['team-a']}/huge", kube.token("carol")) == 403


def test_a_new_workload_appears_on_an_open_page_without_a_reload(
    console: str, cluster: dict[str, Any], browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    ns = cluster["ns"]
    kube: RealKube = cluster["kube"]
    sign_in(browser, console, kube.token("alice"))
    browser.get(console + "/queues")
    browser.execute_script("window.notReloaded = true;")
    deadline = time.monotonic() + 15
    while "on" not in (browser.find_element(By.ID, "live").get_attribute("class") or ""):
        assert time.monotonic() < deadline, "the event stream did not connect"
        time.sleep(0.05)
    late = workload("late", ns["team-a"]).queue("train").created(_at(40)).podset("main", 1, cpu="1", gpu=16)
    kube.kubectl("apply", "-f", "-", input=late.yaml())
    key = f"{ns['team-a']}/late"
    deadline = time.monotonic() + 30
    while not browser.find_elements(By.CSS_SELECTOR, f'tr[data-workload="{key}"]'):
        assert time.monotonic() < deadline, "the new workload never reached the page"
        time.sleep(0.1)
    assert browser.execute_script("return window.notReloaded === true;")
    screenshot(browser, shots, "kube-alice-queues-live")


def test_overview_draws_gpu_history_and_idle_holders_from_prometheus(
    cluster: dict[str, Any], browser: Any, shots: Path, prometheus_factory: PrometheusFactory
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    ns = cluster["ns"]
    a, b = ns["team-a"], ns["team-b"]
    node = f"{cluster['prefix']}h100-3"
    # (gpu, namespace, pod, utilization %, exported spelling)
    gpus = [
        (0, a, "pretrain-0", 85.0, False),
        (1, a, "pretrain-0", 75.0, False),
        (2, a, "notebook-0", 1.0, False),
        (3, b, "finetune-0", 40.0, True),
        (4, None, None, 0.0, False),
    ]
    now = int(time.time())
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for minute in range(360, 0, -5):
        for gpu, namespace, pod, util, exported in gpus:
            if gpu == 4 and minute > 120:
                continue  # this GPU was installed two hours ago
            labels = f'gpu="{gpu}",Hostname="{node}"'
            value = 0.0
            if pod is not None and not (gpu == 3 and minute > 180):  # finetune started three hours ago
                prefix = "exported_" if exported else ""
                labels += f',{prefix}namespace="{namespace}",{prefix}pod="{pod}"'
                value = util
            lines.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value} {now - minute * 60}")
    with DcgmExporter() as dcgm:
        for gpu, namespace, pod, util, exported in gpus:
            dcgm.set(
                "DCGM_FI_DEV_GPU_UTIL",
                util,
                gpu=gpu,
                node=node,
                namespace=namespace,
                pod=pod,
                exported=exported,
            )
        prom = prometheus_factory(scrape_targets=[dcgm.target], backfill="\n".join(lines) + "\n")
        prom.wait_for("DCGM_FI_DEV_GPU_UTIL")
        history = HistoryCache(PrometheusClient(prom.url))
        auth = KubeAuthenticator(cluster["api"], cluster["source"].namespaces)
        with serve(create_app(cluster["hub"], auth, history=history)) as url:
            sign_in(browser, url, cluster["kube"].token("alice"))
            browser.get(url + "/")
            charts = browser.find_elements(By.CSS_SELECTOR, "svg.tchart")
            assert len(charts) == 2  # cluster-wide, and per namespace
            assert len(charts[0].find_elements(By.TAG_NAME, "polyline")) == 3  # installed, allocated, busy
            legend = charts[1].text
            assert f"{a} allocated" in legend
            assert b not in legend  # only alice's namespaces
            idle = table_rows(browser, "[data-test=idle] tbody tr")
            assert [row[:3] for row in idle] == [[a, "notebook-0", "1"], [a, "pretrain-0", "2"]]
            assert idle[0][3] == "1.0 %"
            measured = {cells[0]: cells[1] for cells in table_rows(browser, "[data-test=measured] tbody tr")}
            direct = {r["metric"]["namespace"]: r["value"][1] for r in prom.query(ALLOCATED_BY_NAMESPACE)}
            assert measured == {a: direct[a]}  # b's row is not alice's to see
            assert direct[b] == "1"  # the exported spelling is read too
            screenshot(browser, shots, "kube-alice-overview-prometheus")
