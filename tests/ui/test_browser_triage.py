"""Issue 25, triage in a real headless Chromium against a real worker: what a waited-on activity
is doing (running, backing off), the timeline's honest colours (failed attempts, a retry's
backoff, a wait for a signal, a timed-out wait, a deadline ahead) and the parent/child tree."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.apps import basic
from tests.plugins.workers import wait_until
from tests.ui.chromium import chromium_page, until_shown

pytestmark = pytest.mark.worker


def _fill(page: Any, selector: str) -> str:
    return str(page.eval_on_selector(selector, "el => getComputedStyle(el).fill"))


def test_what_each_execution_is_doing_in_a_real_browser(
    cluster: Any, ui_server: str, artifacts: Path, tmp_path: Path
) -> None:
    from playwright.sync_api import expect

    cluster.start_worker()
    gate = tmp_path / "gate"
    gated = basic.shifty.start(str(tmp_path / "no-flag"), str(gate))  # right(), then blocks on the gate
    backing = basic.backing_off.start("billing")  # its activity fails, then backs off for an hour
    timed = basic.approval.start(0.5)  # nobody approves: the wait times out
    root = basic.family_tree.start(2, 3600.0)  # root -> root-c -> root-c-c (sleeps an hour)
    mailed = basic.bounces.start("ops@example.com")  # its effect fails for good
    wait_until(lambda: timed.status() == "completed", timeout=30, what="the wait to time out")

    with chromium_page() as (page, errors):
        # the list says which waited-on activity runs and which backs off (and until when)
        listing = ui_server + "/executions?status=running"
        gated_act = page.locator(f'tr.execution[data-id="{gated.id}"] td.waiting .act')
        backing_act = page.locator(f'tr.execution[data-id="{backing.id}"] td.waiting .act')
        until_shown(page, listing, lambda: gated_act.count() == 1 and "running" in gated_act.inner_text(), "running")
        expect(gated_act).to_have_text("running (attempt 1)")
        until_shown(
            page, listing, lambda: backing_act.count() == 1 and "backoff" in backing_act.inner_text(), "backoff"
        )
        expect(backing_act).to_contain_text(re.compile(r"backoff \(attempt 1 failed; next at 20\d\d-"))
        page.screenshot(path=str(artifacts / "7-activities-running-and-backing-off.png"), full_page=True)
        # the list is live: an execution started now shows up without a reload
        page.evaluate("window.__same_page = true")
        late = basic.sleeper.start("late", 3600.0)
        expect(page.locator(f'tr.execution[data-id="{late.id}"]')).to_be_visible(timeout=20_000)
        expect(page.locator("#list-state")).to_contain_text("live · checked")
        assert page.evaluate("window.__same_page") is True, "the list reloaded instead of refreshing live"

        # its page: the failed attempt and the backoff are bars of their own, in their colours
        page.goto(ui_server + f"/executions/{backing.id}")
        expect(page.locator("svg.chart rect.bar.earlier")).to_have_count(1)
        expect(page.locator("svg.chart rect.bar.backoff")).to_have_count(1)
        expect(page.locator('tr.step[data-seq="1"] small.backoff')).to_contain_text("next attempt 20")
        assert _fill(page, "svg.chart rect.bar.backoff") == "rgb(249, 168, 212)"
        page.screenshot(path=str(artifacts / "8-backoff.png"), full_page=True)

        # a timed-out wait is neither a failure nor a cancellation: its own colour, its deadline marked
        page.goto(ui_server + f"/executions/{timed.id}")
        expect(page.locator('tr.step[data-kind="signal"]')).to_have_attribute("data-state", "timed out")
        assert _fill(page, "svg.chart rect.bar.state-timed-out") == "rgb(194, 65, 12)"
        expect(page.locator("svg.chart circle.mark.deadline")).to_have_count(1)
        page.screenshot(path=str(artifacts / "9-timed-out-wait.png"), full_page=True)

        # the tree, from the middle: its parent above, itself, its child below with its status
        middle, leaf = f"{root.id}-c", f"{root.id}-c-c"
        member = page.locator(f'#family li.member[data-id="{leaf}"]')
        until_shown(page, ui_server + f"/executions/{middle}", lambda: member.count() == 1, "the family tree")
        members = page.locator("#family li.member")
        assert [members.nth(i).get_attribute("data-id") for i in range(3)] == [root.id, middle, leaf]
        assert [members.nth(i).get_attribute("data-depth") for i in range(3)] == ["0", "1", "2"]
        expect(page.locator("#family li.member.current")).to_have_attribute("data-id", middle)
        expect(member).to_have_attribute("data-status", "running")
        page.screenshot(path=str(artifacts / "10-family.png"), full_page=True)
        member.locator("a").click()  # the leaf's page: two parents above it, and its timer ahead
        expect(page.locator("#family li.member.current")).to_have_attribute("data-id", leaf)
        expect(page.locator("#family li.member")).to_have_count(3)
        expect(page.locator("svg.chart rect.bar.timer")).to_have_count(1)
        expect(page.locator("svg.chart rect.bar.planned")).to_have_count(1)
        expect(page.locator('tr.step[data-kind="sleep"] small.deadline')).to_contain_text("fires 20")
        page.screenshot(path=str(artifacts / "11-leaf-timer.png"), full_page=True)

        # the effects overview: the failed effect across every lane, linked to its lane
        failed = page.locator("tr.effect", has_text="550 mailbox ops@example.com unavailable")
        until_shown(page, ui_server + "/effects", lambda: failed.count() == 1, "the failed effect")
        expect(failed).to_contain_text("basic.bounce")
        page.screenshot(path=str(artifacts / "12-effects.png"), full_page=True)
        failed.locator("a", has_text="mail-ops@example.com").click()
        expect(page.locator('tr.effect[data-status="failed"]')).to_contain_text("ConnectionRefusedError")
        assert errors == [], errors
    assert mailed.status() == "completed"  # the workflow is not failed by its effect
    gate.write_text("open")
    wait_until(lambda: gated.status() == "completed", timeout=30, what="the gated execution to finish")
