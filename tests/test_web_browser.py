"""The web console in headless Chromium, on a state file: every page, the CLI's numbers, live updates.

One server and one browser for the whole module. The state is ``web_scenario``; the numbers
on the pages are checked against ``gpuplane schedule --output json`` on the same file.
Screenshots of every page are saved (see ``web_harness.artifacts_dir``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.web.app import create_app
from gpuplane.web.auth import TokenFileAuthenticator
from gpuplane.web.pages import duration
from gpuplane.web.sources import FileSource, SnapshotHub
from manifests import workload
from web_harness import artifacts_dir, chromium, console_errors, require_browser, screenshot, serve
from web_scenario import _at, scenario_yaml
from web_tables import element_text, table_rows, workload_rows

TOKEN = "alice-token-0123456789"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("web-file")
    state = folder / "state.yaml"
    state.write_text(scenario_yaml())
    tokens = folder / "tokens.csv"
    tokens.write_text(f'{TOKEN},alice,1,"team-a"\n')
    report = folder / "report"
    subprocess.run(
        [sys.executable, "-m", "gpuplane", "simulate", "--days", "0.25", "--report", str(report)],
        capture_output=True,
        check=True,
        timeout=110,
    )
    hub = SnapshotHub()
    source = FileSource([state], hub)
    source.load()
    app = create_app(hub, TokenFileAuthenticator(tokens), reports=[report], heartbeat=1.0)
    with serve(app) as url:
        yield {"url": url, "state": state, "source": source, "report": report}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return artifacts_dir(tmp_path_factory)


def cli_plan(state: Path) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "gpuplane", "schedule", "-f", str(state), "--output", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def cli_why(state: Path, workload_key: str) -> dict[str, Any]:
    namespace, name = workload_key.split("/")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuplane",
            "why",
            name,
            "-n",
            namespace,
            "-f",
            str(state),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_without_a_token_the_console_refuses(console: dict[str, Any]) -> None:
    for path in ("/", "/queues", "/nodes", "/reports", "/workloads/team-a/huge", "/events"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(console["url"] + path, timeout=10)
        with refused.value:
            assert refused.value.code == 401, path
            assert refused.value.headers["WWW-Authenticate"].startswith("Bearer")


def test_sign_in_and_every_page_renders(console: dict[str, Any], browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    browser.get(console["url"] + "/")
    assert "Sign in" in browser.title  # the 401 page is the sign-in form
    screenshot(browser, shots, "file-login")
    browser.find_element(By.ID, "token").send_keys(TOKEN)
    browser.find_element(By.CSS_SELECTOR, "#login button").click()
    deadline = time.monotonic() + 10
    while "Overview" not in browser.title and time.monotonic() < deadline:
        time.sleep(0.05)
    assert element_text(browser, "[data-test=user]") == "alice"
    console_errors(browser)  # the sign-in page's own 401 is logged: drop it
    for path, name, title in (
        ("/", "overview", "Overview"),
        ("/queues", "queues", "Queues"),
        ("/nodes", "nodes", "Nodes"),
        ("/reports", "reports", "Reports"),
        ("/workloads/team-b/sweep-1", "workload-pending", "team-b/sweep-1"),
        ("/workloads/team-a/pretrain", "workload-admitted", "team-a/pretrain"),
        ("/workloads/serving/llm-small", "workload-mig", "serving/llm-small"),
    ):
        browser.get(console["url"] + path)
        assert title in browser.title, path
        assert console_errors(browser) == [], path  # no CSP violation, no script error
        screenshot(browser, shots, f"file-{name}")


def test_numbers_on_the_pages_equal_the_schedule_command(console: dict[str, Any], browser: Any) -> None:

    plan = cli_plan(console["state"])
    browser.get(console["url"] + "/")
    assert int(element_text(browser, "[data-test=pending-count]")) == len(plan["pending"])
    reasons: dict[str, int] = {}
    for p in plan["pending"]:
        reasons[p["reason"]] = reasons.get(p["reason"], 0) + 1
    shown = {cells[0]: int(cells[1]) for cells in table_rows(browser, "[data-test=reasons] tbody tr")}
    assert shown == reasons

    browser.get(console["url"] + "/queues")
    queue_eta = {}
    shown_rows = workload_rows(browser)
    for p in plan["pending"]:
        cells = shown_rows[p["workload"]]
        assert cells[0] == str(p["localQueuePosition"]), p["workload"]
        assert cells[1] == str(p["position"]), p["workload"]
        assert cells[6] == p["reason"], p["workload"]
        queue_eta[p["workload"]] = cells[5]  # the ETA range, checked against `gpuplane why` below
    admitted = {a["workload"]: a for a in plan["admitted"]}
    gpus_used = {
        cq: sum(
            len(where["devices"])
            for a in plan["admitted"]
            if a["clusterQueue"] == cq
            for ps in a["podSets"]
            for where in ps.get("placement", [])
            if ps["flavors"].get("nvidia.com/gpu")
        )
        for cq in ("team-a", "team-b")
    }
    for cq, used in gpus_used.items():
        line = f'[data-name="{cq}"] tr[data-flavor="h100"][data-resource="nvidia.com/gpu"] [data-test=used]'
        assert int(element_text(browser, line)) == used, cq

    for p in plan["pending"]:
        why = cli_why(console["state"], p["workload"])
        browser.get(console["url"] + f"/workloads/{p['workload']}")
        assert element_text(browser, "[data-test=position]") == str(p["position"])
        assert element_text(browser, "[data-test=reason]") == why["reason"]
        assert element_text(browser, "[data-test=message]") == why["message"]
        assert element_text(browser, "[data-test=fix]") == why["fix"]
        assert element_text(browser, "[data-test=eta-basis]") == why["eta"]["basis"]
        eta = why["eta"]
        want_eta = (
            "not by itself" if eta["seconds"] is None else f"{duration(eta['low'])}-{duration(eta['high'])}"
        )
        assert element_text(browser, "[data-test=eta]") == want_eta
        assert queue_eta[p["workload"]] == want_eta
        cells = table_rows(browser, "[data-test=blockers] tbody tr")
        assert [c[1] for c in cells if len(c) == 3] == [b["name"] for b in why["blockers"][:12]]
    key = "team-a/pretrain"
    browser.get(console["url"] + f"/workloads/{key}")
    placed = [(cells[1], cells[3]) for cells in table_rows(browser, "[data-test=placement] tbody tr")]
    want = [(w["node"], ", ".join(w["devices"])) for w in admitted[key]["podSets"][0]["placement"]]
    assert placed == want


def test_a_simulation_report_is_browsable(console: dict[str, Any], browser: Any, shots: Path) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    summary = json.loads((console["report"] / "summary.json").read_text())
    browser.get(console["url"] + "/reports")
    images = browser.find_elements(By.CSS_SELECTOR, "[data-test=report] img")
    assert len(images) == 4
    assert all(browser.execute_script("return arguments[0].naturalWidth", img) > 0 for img in images)
    for name, config in summary["configurations"].items():
        teams = table_rows(browser, f'[data-test="teams-{name}"] tbody tr')
        assert teams, name
        shown = {cells[0]: cells[1] for cells in teams}
        want = {team: str(t["allocatedGpuHours"]) for team, t in config["teams"].items()}
        assert shown == want, name
        bill = [float(cells[7].rstrip(" %")) for cells in teams]
        assert abs(sum(bill) - 100) < 0.5, name  # the shares of the bill add up
    screenshot(browser, shots, "file-reports")


def test_a_changed_state_file_reaches_the_open_page_without_a_reload(
    console: dict[str, Any], browser: Any, shots: Path
) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    browser.get(console["url"] + "/queues")
    browser.execute_script("window.notReloaded = true;")
    deadline = time.monotonic() + 10
    while "on" not in (browser.find_element(By.ID, "live").get_attribute("class") or ""):
        assert time.monotonic() < deadline, "the event stream did not connect"
        time.sleep(0.05)
    extra = workload("late", "team-b").queue("dev").created(_at(30)).podset("main", 1, cpu="1", gpu=1)
    state: Path = console["state"]
    state.write_text(state.read_text() + "---\n" + extra.yaml())
    assert console["source"].reload_if_changed()
    deadline = time.monotonic() + 20
    while not browser.find_elements(By.CSS_SELECTOR, 'tr[data-workload="team-b/late"]'):
        assert time.monotonic() < deadline, "the new workload never appeared"
        time.sleep(0.1)
    assert browser.execute_script("return window.notReloaded === true;")
    plan = cli_plan(state)
    late = next(p for p in plan["pending"] if p["workload"] == "team-b/late")
    cells = workload_rows(browser)["team-b/late"]
    assert (cells[1], cells[6]) == (str(late["position"]), late["reason"])
    screenshot(browser, shots, "file-queues-after-change")
