"""The console's Fleet panel in headless Chromium: what a person sees of a MultiKueue manager's
workers, where each workload runs, and the panel following a new summary on an open page.

The manager is a state file (``web_fleet_scene``); its MultiKueueClusters are swapped into the hub
as the cluster source does. Screenshots go where ``web_harness.artifacts_dir`` says."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuplane.web.app import create_app
from gpuplane.web.auth import TokenFileAuthenticator
from gpuplane.web.fleet import fleet_of
from gpuplane.web.sources import FileSource, SnapshotHub
from web_fleet_scene import BIG, SMALL, fleet_objects, manager_yaml, worker_cluster
from web_harness import artifacts_dir, chromium, console_errors, require_browser, screenshot, serve
from web_tables import element_text, table_rows

TOKEN = "fleet-admin-token-0123456789"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    folder = tmp_path_factory.mktemp("web-fleet")
    state = folder / "manager.yaml"
    state.write_text(manager_yaml())
    tokens = folder / "tokens.csv"
    tokens.write_text(f"{TOKEN},admin,1\n")
    hub = SnapshotHub()
    FileSource([state], hub).load()
    hub.publish_fleet(fleet_of(fleet_objects()))
    app = create_app(hub, TokenFileAuthenticator(tokens), heartbeat=1.0, poll=0.1)
    with serve(app) as url:
        yield {"url": url, "hub": hub}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    require_browser()
    with chromium() as driver:
        yield driver


def cells(driver: Any, css: str) -> list[str]:
    """The cells' text of the one row ``css`` matches (an empty list when none does yet)."""
    rows = table_rows(driver, css)
    assert len(rows) <= 1, css
    return rows[0] if rows else []


def sign_in(driver: Any, url: str) -> None:
    from selenium.webdriver.common.by import By  # noqa: PLC0415

    driver.get(url + "/")
    driver.find_element(By.ID, "token").send_keys(TOKEN)
    driver.find_element(By.CSS_SELECTOR, "#login button").click()
    deadline = time.monotonic() + 10
    while "Overview" not in driver.title and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "Overview" in driver.title
    console_errors(driver)  # the sign-in page's own 401 is logged: drop it


def test_the_fleet_panel_and_where_workloads_run(
    console: dict[str, Any], browser: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    shots: Path = artifacts_dir(tmp_path_factory)
    sign_in(browser, console["url"])
    assert cells(browser, 'tr[data-worker="small"]') == [
        "small",
        "Active",
        "12/16",
        "cpu 4/64 · nvidia.com/gpu 12/16",
        str(SMALL["pendingWorkloads"]),
        str(SMALL["admittedWorkloads"]),
    ]
    big = cells(browser, 'tr[data-worker="big"]')
    assert big[:4] == ["big", "Inactive: connection refused", "-", "not known"]
    assert big[4:] == [str(BIG["pendingWorkloads"]), str(BIG["admittedWorkloads"])]
    holders = {row[0]: row[2] for row in table_rows(browser, "[data-test=holders] tbody tr")}
    assert holders == {"default/runs": "small", "default/dispatching": "nominated: small, big"}
    assert console_errors(browser) == []  # no CSP violation, no script error
    screenshot(browser, shots, "fleet-overview")

    browser.get(console["url"] + "/workloads/default/dispatching")
    assert element_text(browser, "[data-test=runs-on]") == "nominated: small, big"
    assert console_errors(browser) == []
    screenshot(browser, shots, "fleet-workload")


def test_an_open_page_follows_a_new_summary(console: dict[str, Any], browser: Any) -> None:
    browser.get(console["url"] + "/")
    assert cells(browser, 'tr[data-worker="small"]')[2] == "12/16"
    full = {**SMALL, "usage": {"cpu": "4", "nvidia.com/gpu": "16"}}
    console["hub"].publish_fleet(
        fleet_of([worker_cluster("small", full, ("True", "Connected")), *fleet_objects()[1:]])
    )
    assert _shown_within(browser, 'tr[data-worker="small"]', 2, "16/16")  # no reload: the event stream


def _shown_within(driver: Any, css: str, column: int, want: str, timeout: float = 15) -> bool:
    """Whether the row's cell reads ``want`` within ``timeout`` (the page swaps its content in
    place; each read sees the whole row at one instant)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cells(driver, css)[column : column + 1] == [want]:
            return True
        time.sleep(0.1)
    return False
