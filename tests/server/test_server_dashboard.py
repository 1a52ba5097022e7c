"""The dashboard in headless Chromium shows the pool while requests run (DOM check + screenshot).

Set PAGEDLLM_UPDATE_SCREENSHOT=1 to also copy the screenshot to docs/images/dashboard.png.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import fake_config
from fake_serving_engine import FakeEngine
from server_harness import RunningServer, start_server

INSTALL = Path(__file__).parent / "install_chromium.sh"
DOCS_IMAGE = Path(__file__).resolve().parents[2] / "docs" / "images" / "dashboard.png"


def find_chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def ensure_chromium() -> str:
    """The Chromium binary, installed on first use; skips (saying why) only where it cannot be installed."""
    if find_chromium() is None:
        try:
            subprocess.run(["bash", str(INSTALL)], capture_output=True, timeout=600)
        except (OSError, subprocess.TimeoutExpired):
            pass
    path = find_chromium()
    if path is None:
        pytest.skip("headless Chromium is not installed and tests/server/install_chromium.sh could not "
                    "install it here (needs root or sudo and Debian's apt)")
    return path


@pytest.fixture(scope="module")
def chromium() -> str:
    return ensure_chromium()


def chromium_args(chromium: str, profile: Path) -> list[str]:
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage",
            f"--user-data-dir={profile}", "--virtual-time-budget=2500", "--hide-scrollbars"]


def keep_busy(server: RunningServer, count: int) -> list[threading.Thread]:
    def one(i: int) -> None:
        body = {"prompt": f"a shared prompt for the dashboard, number {i}", "max_tokens": 150,
                "ignore_eos": True, "n": 1 + i % 2}
        try:
            httpx.post(server.base_url + "/v1/completions", json=body, timeout=30)
        except httpx.HTTPError:
            pass  # the server stops under it at the end of the test

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    return threads


@pytest.fixture(scope="module")
def busy_server() -> RunningServer:
    engine = FakeEngine(fake_config(num_blocks=160, max_num_seqs=4), step_delay=0.05)
    server = start_server(engine, shutdown_timeout=0.2)
    keep_busy(server, 8)
    deadline = time.monotonic() + 10
    while server.stats().num_running < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    yield server
    server.stop()


def test_dashboard_dom_shows_the_pool(chromium: str, busy_server: RunningServer, tmp_path: Path) -> None:
    args = chromium_args(chromium, tmp_path / "profile") + ["--dump-dom", busy_server.base_url + "/dashboard"]
    dom = subprocess.run(args, capture_output=True, text=True, timeout=90).stdout
    num_blocks = busy_server.stats().num_blocks
    assert dom.count('data-id="') == num_blocks, dom[-3000:]
    assert 'data-state="used"' in dom
    assert re.search(r'class="blk used shared"', dom), "no shared block drawn"
    assert re.search(r'<div class="fill" style="width: \d', dom), "no filled slots drawn"
    running = re.search(r'id="running">(\d+)<', dom)
    assert running and int(running.group(1)) > 0
    assert re.search(r'id="waste"><tr>', dom), "waste table empty"


def test_dashboard_screenshot(chromium: str, busy_server: RunningServer, tmp_path: Path) -> None:
    shot = tmp_path / "dashboard.png"
    args = chromium_args(chromium, tmp_path / "profile") + [
        "--window-size=1400,720", f"--screenshot={shot}", busy_server.base_url + "/dashboard"]
    subprocess.run(args, capture_output=True, timeout=90)
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    if os.environ.get("PAGEDLLM_UPDATE_SCREENSHOT"):
        DOCS_IMAGE.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMAGE)
