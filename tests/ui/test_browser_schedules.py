"""The Schedules page in a real headless Chromium, against the real ``durable ui`` command and a
real worker: a managed schedule is listed, paused and triggered from its buttons (the trigger's
confirmation accepted), with no console or CSP error."""

from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic
from tests.ui.chromium import chromium_page
from tests.ui.conftest import TOKEN

pytestmark = pytest.mark.worker


def test_a_schedule_paused_and_triggered_from_the_page(cluster: Any, ui_server: str, artifacts: Path) -> None:
    from playwright.sync_api import expect

    cluster.start_worker()
    name = f"ui-{uuid.uuid4().hex[:6]}"
    basic.durable.schedules.create(name, basic.ticker, name, every=timedelta(days=1))
    row = f'tr.schedule[data-name="{name}"]'
    with chromium_page() as (page, errors):
        page.goto(ui_server + "/schedules")
        expect(page.locator(row)).to_have_attribute("data-paused", "no")
        expect(page.locator(f"{row} button")).to_have_count(0)  # no buttons before the token
        page.goto(ui_server + "/login?next=/schedules")
        page.fill("#token", TOKEN)
        page.click("#login-button")
        page.goto(ui_server + "/schedules")
        page.locator(f'{row} button:has-text("pause")').click()
        expect(page.locator("#message")).to_have_text("paused: no tick fires until resumed")
        expect(page.locator(row)).to_have_attribute("data-paused", "yes")
        page.locator(f'{row} button:has-text("trigger")').click()
        expect(page.locator("#message")).to_have_text("started one execution")
        page.screenshot(path=str(artifacts / "schedules.png"), full_page=True)
        assert errors == [], errors
    info = basic.durable.schedules.get(name)
    assert info is not None and info.paused and info.last_execution is not None
    assert basic.durable.handle(info.last_execution).result(timeout=30) == 1  # run by the worker
