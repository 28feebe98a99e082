"""The web UI shows ``timed_out`` and ``scheduled`` executions with the actions that apply: resume
for a timed-out one (a timeout is a cancel), cancel and signal for a scheduled one; their counts
are in the list's header and its status filter finds them."""

from __future__ import annotations

import re

from starlette.testclient import TestClient

from celery_durable.testing.env import WorkflowEnvironment
from tests.ui import flows
from tests.ui.conftest import login


def _shown_forms(html: str) -> set[str]:
    """The actions whose form the page shows (not ``hidden``)."""
    forms = re.findall(r'<form method="post" action="/actions/(\w+)"[^>]*?( hidden)?>', html)
    return {name for name, hidden in forms if not hidden}


def test_timed_out_and_scheduled_executions_in_the_ui(env: WorkflowEnvironment, client: TestClient) -> None:
    login(client)
    timed = env.start(flows.order.options(timeout=60, workflow_id="ui-timed"), "book")
    env.advance(3600)  # past the 5 min sleep's start: the deadline ends it in the sleep
    assert timed.status() == "timed_out"
    later = env.start(flows.echo.options(start_delay=3600, workflow_id="ui-later"), "hi")
    assert later.status() == "scheduled"

    page = client.get("/executions").text
    assert re.search(r'data-status="timed_out" data-count="1"', page), page[:2000]
    assert re.search(r'data-status="scheduled" data-count="1"', page)
    assert re.findall(r'<tr class="execution" data-id="([^"]*)"', client.get("/executions?status=scheduled").text) == [
        "ui-later"
    ]

    timed_page = client.get("/executions/ui-timed").text
    assert "st-timed_out" in timed_page
    assert "resume" in _shown_forms(timed_page) and "cancel" not in _shown_forms(timed_page)
    later_page = client.get("/executions/ui-later").text
    assert "st-scheduled" in later_page
    assert {"cancel", "signal"} <= _shown_forms(later_page) and "resume" not in _shown_forms(later_page)
