"""Helpers for the web console tests: a real uvicorn server on loopback, and headless Chromium.

The browser is Debian's ``chromium`` driven through Debian's ``chromedriver`` by Selenium; no
browser is downloaded. Screenshots go to ``$GPUPLANE_ARTIFACTS/web`` when that is set, else to
pytest's temporary directory, and every test that takes one names the file it wrote.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

CHROMIUM = os.environ.get("GPUPLANE_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("GPUPLANE_CHROMEDRIVER", "/usr/bin/chromedriver")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """Run ``app`` with uvicorn in a thread; yields its base URL; stops it on exit."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the console server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def browser_available() -> bool:
    return Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()


def require_browser() -> None:
    """Skip outside CI when Chromium is missing; in CI a missing browser is a failure."""
    if browser_available():
        return
    message = f"headless Chromium needs {CHROMIUM} and {CHROMEDRIVER} (Debian: chromium, chromium-driver)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


@contextmanager
def chromium(width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A headless Chromium session (Selenium WebDriver) on the system browser."""
    from selenium import webdriver  # noqa: PLC0415  # only the browser tests need it
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        f"--window-size={width},{height}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get("GPUPLANE_ARTIFACTS")
    folder = Path(base) / "web" if base else tmp_path_factory.mktemp("web-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def screenshot(driver: Any, folder: Path, name: str) -> Path:
    """A full-page PNG of what the browser shows now."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    width = driver.execute_script("return document.documentElement.scrollWidth")
    driver.set_window_size(max(1400, int(width)), min(max(800, int(height) + 120), 6000))
    path = folder / f"{name}.png"
    driver.save_screenshot(str(path))
    return path


def console_errors(driver: Any) -> list[str]:
    """Browser console errors (CSP violations and script errors show up here)."""
    return [e["message"] for e in driver.get_log("browser") if e.get("level") == "SEVERE"]


def which(name: str) -> str | None:
    return shutil.which(name)
