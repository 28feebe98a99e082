"""Issue 26 §2: an activity's latest heartbeat details are shown on its execution's page
(``durable show``: tests/engine/test_cli_json.py)."""

from __future__ import annotations

import html
import json
import re

from starlette.testclient import TestClient

from celery_durable.testing.env import WorkflowEnvironment
from tests.ui import flows
from tests.ui.conftest import login


def test_the_step_table_shows_the_latest_heartbeat(env: WorkflowEnvironment, client: TestClient) -> None:
    handle = env.start(flows.importing.options(workflow_id="imp-1"), "k")
    assert handle.status() == "running"  # in the retry's hour of backoff
    login(client)
    page = html.unescape(client.get("/executions/imp-1").text)
    row = re.search(r'<tr class="step" data-seq="\d+" data-kind="activity".*?</tr>', page, re.S)
    assert row is not None, page[:2000]
    beat = re.search(r"heartbeat [^<]* \(attempt 1\): <code>(.*?)</code>", row.group(0), re.S)
    assert beat is not None, row.group(0)
    assert json.loads(beat.group(1)) == {"row": 7, "of": 10}
