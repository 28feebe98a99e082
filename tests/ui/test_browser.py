"""The UI in a real headless Chromium, against a real ``celery worker`` and the real command.

``celery -A tests.apps.basic durable ui`` runs as a subprocess on the cluster's store; Debian's
``/usr/bin/chromium`` is driven by Playwright (no browser download). A missing browser fails
the test: .ci/run installs it. Screenshots go to ``$TEST_ARTIFACTS`` (or the test's tmp dir).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic
from tests.plugins.workers import REPO, wait_until
from tests.ui.conftest import TOKEN

pytestmark = pytest.mark.worker
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _up(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


@pytest.fixture
def ui_server(cluster: Any, tmp_path: Path) -> Iterator[str]:
    port = _free_port()
    log = tmp_path / "ui.log"
    env = dict(os.environ) | cluster.workers.env | {"DURABLE_UI_TOKEN": TOKEN}
    cmd = [sys.executable, "-m", "celery", "-A", "tests.apps.basic", "durable", "ui", "--port", str(port)]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(f"the UI exited with {proc.returncode}:\n{log.read_text()}")
            return _up(base + "/healthz")

        wait_until(ready, timeout=60, what="the UI server")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    text = log.read_text()
    assert TOKEN not in text, "the token given by the environment must never be printed"


@pytest.fixture
def artifacts() -> Path:
    # not under tmp_path: pytest keeps only its last few base temp dirs (other runs rotate them)
    root = os.environ.get("TEST_ARTIFACTS") or tempfile.mkdtemp(prefix="celery-durable-artifacts-")
    folder = Path(root) / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nUI screenshots: {folder}")
    return folder


@contextmanager
def _chromium_page() -> Iterator[tuple[Any, list[str]]]:
    """A page of Debian's headless Chromium (missing, the test fails: .ci/run installs it), and
    the page and console errors it reports (the caller asserts none); confirmations accepted."""
    if not (Path(CHROMIUM).exists() and shutil.which(CHROMIUM)):
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(f"{msg.text} {msg.location}") if msg.type == "error" else None)
            page.on("dialog", lambda dialog: dialog.accept())
            yield page, errors
        finally:
            browser.close()


def test_the_timeline_in_a_real_browser(cluster: Any, ui_server: str, artifacts: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    cluster.start_worker()
    gate = tmp_path / "gate"
    gated = basic.shifty.start(str(tmp_path / "no-flag"), str(gate))  # right(), then blocks on the gate
    waiting = basic.sleeper.start("ui", 3600.0)  # sleeps an hour: cancelled from the page

    with _chromium_page() as (page, errors):
        page.goto(ui_server + "/executions")
        row = page.locator(f'tr.execution[data-id="{gated.id}"]')
        expect(row).to_be_visible()
        expect(page.locator(f'tr.execution[data-id="{waiting.id}"]')).to_have_attribute("data-status", "running")
        page.screenshot(path=str(artifacts / "1-list.png"), full_page=True)

        row.locator("a").click()
        expect(page.locator("#status")).to_have_attribute("data-status", "running")
        # the gate activity runs on the worker: the poll shows it, then its end, with no reload
        gate_step = page.locator('tr.step[data-seq="2"]')
        expect(gate_step).to_have_attribute("data-state", "running", timeout=30_000)
        expect(page.locator('tr.step[data-seq="1"]')).to_have_attribute("data-state", "ok")
        page.evaluate("window.__same_page = true")
        page.screenshot(path=str(artifacts / "2-running.png"), full_page=True)
        gate.write_text("open")
        expect(page.locator("#status")).to_have_attribute("data-status", "completed", timeout=30_000)
        expect(gate_step).to_have_attribute("data-state", "ok")
        expect(page.locator("#result")).to_contain_text('"right"')
        assert page.evaluate("window.__same_page") is True, "the page reloaded instead of refreshing live"
        assert page.locator("svg.chart rect.bar.state-ok").count() == 2
        page.screenshot(path=str(artifacts / "3-completed.png"), full_page=True)

        # cancel from the page: unlock with the token, then the cancel button (POST + CSRF)
        page.goto(ui_server + f"/executions/{waiting.id}")
        expect(page.locator("#cancel-button")).to_have_count(0)
        page.locator("#actions a").click()
        page.fill("#token", TOKEN)
        page.click("#login-button")
        expect(page.locator("#cancel-button")).to_be_visible()
        page.click("#cancel-button")
        expect(page.locator("#message")).to_have_text("cancel requested")
        expect(page.locator("#status")).to_have_attribute("data-status", "cancelled", timeout=30_000)
        expect(page.locator("#cancel-button")).to_be_hidden()
        page.screenshot(path=str(artifacts / "4-cancelled.png"), full_page=True)
        assert errors == [], errors
    wait_until(lambda: waiting.status() == "cancelled", timeout=10, what="the cancel to be recorded")
    assert gated.status() == "completed"
    print(f"UI screenshots saved in {artifacts}")


def test_selected_executions_are_cancelled_together(cluster: Any, ui_server: str, artifacts: Path) -> None:
    """Issue 25: selection in the list for batch actions. Logged in, each row has a checkbox;
    "cancel" acts on the selected executions only, each recorded as its own action, and the
    result page says what happened to each."""
    from playwright.sync_api import expect

    cluster.start_worker()
    picked = [basic.sleeper.start(f"batch-{i}", 3600.0) for i in range(2)]
    left = basic.sleeper.start("batch-left", 3600.0)
    with _chromium_page() as (page, errors):
        page.goto(ui_server + "/executions")
        expect(page.locator('input[type="checkbox"][name="id"]')).to_have_count(0)  # not logged in
        page.locator("p.hint a").click()
        page.fill("#token", TOKEN)
        page.click("#login-button")
        page.goto(ui_server + "/executions?status=running")
        for h in picked:
            page.locator(f'tr.execution[data-id="{h.id}"] input[type="checkbox"]').check()
        expect(page.locator("table.executions thead")).to_contain_text("custom status")
        # what each waits on, from its exec alone: the sleeper's timer and when it fires
        expect(page.locator(f'tr.execution[data-id="{left.id}"] td.waiting')).to_contain_text("timer until 20")
        page.screenshot(path=str(artifacts / "5-selected.png"), full_page=True)
        page.click('#batch button[value="cancel"]')
        expect(page.locator("tr.batch-result.ok")).to_have_count(2)
        for h in picked:
            expect(page.locator(f'tr.batch-result[data-id="{h.id}"]')).to_contain_text("cancel requested")
        page.screenshot(path=str(artifacts / "6-batch-cancelled.png"), full_page=True)
        assert errors == [], errors
    for h in picked:
        wait_until(lambda h=h: h.status() == "cancelled", timeout=30, what=f"{h.id} cancelled")
    assert left.status() == "running"
