"""The /effects page (issue 25): failed effects and stuck lanes across every key, each linked to
its lane; an empty state; a store outage is a 503 (tests/ui/test_outage_breaks.py)."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from celery_durable.testing.env import WorkflowEnvironment


def _bounce(env: WorkflowEnvironment, effect_id: str, key: str, to: str) -> None:
    core = env.engine.outbox
    body = core.effect_body("ui.bounce", to, key=key, effect_id=effect_id, available_at=None,
                            replay_safe=True, max_attempts=1)  # fmt: skip
    core.admit(body)


def _rows(html: str, cls: str) -> list[str]:
    return re.findall(rf'<tr class="{cls}"[^>]*>.*?</tr>', html, re.S)


def test_an_empty_overview_says_so(client: TestClient) -> None:
    r = client.get("/effects")
    assert r.status_code == 200
    assert 'id="no-failed"' in r.text and 'id="no-stuck"' in r.text
    assert '<a href="/effects">Effects</a>' in r.text  # in the nav of every page
    assert '<a href="/effects">Effects</a>' in client.get("/executions").text


def test_the_page_lists_the_failed_effect_and_the_stuck_lane(env: WorkflowEnvironment, client: TestClient) -> None:
    _bounce(env, "b-1", "mail <1>", "<script>alert(1)</script>@example.com")
    env.run_until_idle()  # its one attempt fails
    _bounce(env, "b-2", "mail-2", "ops@example.com")
    env.dispatcher.queue.clear()  # its message is lost
    queue_timeout = env.engine.outbox.settings.queue_timeout
    env.clock.advance(queue_timeout + 1)  # due, no scan yet: within the grace, not stuck
    html = client.get("/effects").text
    assert len(_rows(html, "effect")) == 1 and _rows(html, "stuck") == [] and 'id="no-stuck"' in html
    env.clock.advance(2 * env.engine.settings.outbox_scan_interval)  # and still no beat
    r = client.get("/effects")
    assert r.status_code == 200
    (failed,) = _rows(r.text, "effect")
    assert 'data-id="b-1"' in failed and '<a href="/lanes?key=mail%20%3C1%3E">' in failed
    assert "ui.bounce" in failed and "1/1" in failed
    assert "mailbox &lt;script&gt;alert(1)&lt;/script&gt;@example.com is full" in failed
    (stuck,) = _rows(r.text, "stuck")
    assert '<a href="/lanes?key=mail-2">' in stuck and "unclaimed" in stuck and "b-2" in stuck
    assert "<script>alert(1)" not in r.text
    for raw in ("_etag", "fxq:", "due_kind", '"pk"'):  # what the page shows is words, not documents
        assert raw not in r.text, raw
    # the scan resends the lost message and b-2 runs: the lane leaves the list
    env.engine.outbox.scan()
    env.run_until_idle()
    assert _rows(client.get("/effects").text, "stuck") == []


def test_a_retried_effect_leaves_the_page_and_its_lane_says_by_what(
    env: WorkflowEnvironment, client: TestClient
) -> None:
    _bounce(env, "b-3", "mail-3", "x@example.com")
    env.run_until_idle()
    assert 'data-id="b-3"' in client.get("/effects").text
    assert env.engine.outbox.retried("b-3", "b-3:retry1")
    assert 'id="no-failed"' in client.get("/effects").text
    lane = client.get("/lanes", params={"key": "mail-3"}).text
    assert "retried as <code>b-3:retry1</code>" in lane
