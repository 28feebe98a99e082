"""The UI in a real headless Chromium, against a real ``celery worker`` and the real command.

``celery -A tests.apps.basic durable ui`` runs as a subprocess on the cluster's store; Debian's
``/usr/bin/chromium`` is driven by Playwright (no browser download). A missing browser fails
the test: .ci/run installs it. Screenshots go to ``$TEST_ARTIFACTS`` (or the test's tmp dir).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic
from tests.plugins.workers import wait_until
from tests.ui.chromium import chromium_page
from tests.ui.conftest import TOKEN

pytestmark = pytest.mark.worker


def test_the_timeline_in_a_real_browser(cluster: Any, ui_server: str, artifacts: Path, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    cluster.start_worker()
    gate = tmp_path / "gate"
    gated = basic.shifty.start(str(tmp_path / "no-flag"), str(gate))  # right(), then blocks on the gate
    waiting = basic.sleeper.start("ui", 3600.0)  # sleeps an hour: cancelled from the page

    with chromium_page() as (page, errors):
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
    with chromium_page() as (page, errors):
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
