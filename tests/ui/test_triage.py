"""What an operator triages with in the UI (issue 25). Full stack traces: the traceback stored with a failed
step (its innermost frames: the line of the activity that raised) is on the execution page
(folded), in ``describe()`` and under the step in ``durable show``."""

from __future__ import annotations

from starlette.testclient import TestClient

from celery_durable.engine.admin.operator import Admin
from celery_durable.testing.env import WorkflowEnvironment
from tests.ui import flows
from tests.ui.conftest import TOKEN, login

RAISE_LINE = "raise NonRetryableError(why)"


def test_a_failed_steps_traceback_is_shown_with_the_line_that_raised(
    env: WorkflowEnvironment, client: TestClient
) -> None:
    h = env.start(flows.fails, "card declined", _workflow_id="tb-1")
    assert h.status() == "failed"
    (step,) = Admin(env.engine).describe("tb-1").steps
    assert step.state == "failed" and step.traceback is not None
    assert RAISE_LINE in step.traceback and "card declined" in step.traceback
    page = client.get("/executions/tb-1").text
    assert '<details class="tb">' in page and RAISE_LINE in page
    assert 'id="error-traceback"' in page  # the workflow's own error, folded the same way


def test_durable_show_prints_the_traceback_under_the_step(env: WorkflowEnvironment, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from click.testing import CliRunner

    from celery_durable.cli.commands import durable as durable_cli

    env.start(flows.fails, "card declined", _workflow_id="tb-2")
    admin = Admin(env.engine)
    monkeypatch.setattr("celery_durable.cli.commands._durable", lambda ctx: admin_facade(admin))
    out = CliRunner().invoke(durable_cli, ["show", "tb-2"])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  step 1: NonRetryableError"))
    assert any(RAISE_LINE in line and line.startswith("    ") for line in lines[at + 1 :])


def admin_facade(admin: Admin):  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    return SimpleNamespace(describe=admin.describe)


def test_the_signal_form_shows_each_declared_signals_schema_and_a_bad_value_reads_clearly(
    env: WorkflowEnvironment, client: TestClient
) -> None:
    """The signal form lists the declared names with their value's JSON Schema; a value of the
    wrong type is refused with pydantic's reason, naming the signal, on a readable page."""
    from tests.ui.conftest import login

    h = env.start(flows.order, "o-s", _workflow_id="sig-1")
    assert h.status() == "running"
    csrf = login(client)
    page = client.get("/executions/sig-1").text
    assert 'id="signal-schemas"' in page and "<dt>approve</dt>" in page
    assert "&#34;type&#34;: &#34;boolean&#34;" in page or '"type": "boolean"' in page
    bad = client.post("/actions/signal", data={"id": "sig-1", "name": "approve", "value": '"perhaps"', "csrf": csrf})
    assert bad.status_code == 400 and "approve" in bad.text and "bool" in bad.text.lower()


def test_no_store_fields_reach_the_operator(env: WorkflowEnvironment, client: TestClient) -> None:
    """Failed before: the JSON API and ``show --json`` carried each operation record's ``pk``,
    ``type`` and ``_etag`` (the store's, not the operator's)."""
    env.start(flows.fails, "card declined", _workflow_id="raw-1")
    Admin(env.engine).retry("raw-1", by="alice", reason="printer fixed")
    env.run_until_idle()
    data = client.get("/api/executions/raw-1").json()
    (op,) = data["operations"]
    assert (op["action"], op["by"], op["reason"]) == ("retry", "alice", "printer fixed")

    def keys(v: object) -> set[str]:
        if isinstance(v, dict):
            return set(v) | {k for x in v.values() for k in keys(x)}
        if isinstance(v, list):
            return {k for x in v for k in keys(x)}
        return set()

    found = keys({k: v for k, v in data.items() if k != "html"})
    assert not {k for k in found if k in ("pk", "_etag") or k.startswith("_")}, found


def test_the_list_counts_executions_by_status_with_a_cap(env: WorkflowEnvironment, client: TestClient) -> None:
    """Issue 25: counts by status in the list's header (each a link to those executions), over
    the same paged listing, exact up to a cap and "cap+" beyond."""
    from celery_durable.engine.admin.counts import status_counts

    for n in range(3):
        env.start(flows.fails, "card declined", _workflow_id=f"cnt-f{n}")
    env.start(flows.order, "o-c", _workflow_id="cnt-r")
    page = client.get("/executions").text
    assert 'data-status="failed" data-count="3"' in page and 'data-status="running" data-count="1"' in page
    assert 'href="/executions?status=failed"' in page
    narrowed = client.get("/executions?workflow=ui.order").text
    assert 'data-status="failed" data-count="0"' in narrowed
    assert 'href="/executions?workflow=ui.order&amp;status=running"' in narrowed
    capped = {c.status: (c.count, c.more) for c in status_counts(env.engine.store, cap=2)}
    assert capped["failed"] == (2, True) and capped["running"] == (1, False) and capped["completed"] == (0, False)


def test_terminate_from_the_page_and_from_a_selection(env: WorkflowEnvironment, client: TestClient) -> None:
    """Terminate (issue 25): a button for a running execution, and a batch action of the list."""
    auth = {"Authorization": "Bearer " + TOKEN}
    one = env.start(flows.order, "o-t1", _workflow_id="term-1")
    two = env.start(flows.order, "o-t2", _workflow_id="term-2")
    login(client)
    assert 'id="terminate-button"' in client.get("/executions/term-1").text
    done = client.post("/actions/terminate", data={"id": "term-1"}, headers=auth)
    assert done.json() == {"ok": True, "message": "terminated: nothing more runs"}
    assert one.status() == "failed" and "WorkflowTerminated" in str(one.poll().error)
    again = client.post("/actions/batch", data={"action": "terminate", "id": ["term-1", "term-2"]}, headers=auth)
    outcome = {r["id"]: r["message"] for r in again.json()["results"]}
    assert outcome == {"term-1": "already finished: nothing to terminate", "term-2": "terminated: nothing more runs"}
    assert two.status() == "failed"
