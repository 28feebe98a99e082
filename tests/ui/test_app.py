"""The web UI over a SQLite store with executions run by ``WorkflowEnvironment`` (TestClient)."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from celery_durable.engine.admin.operator import Admin
from celery_durable.stores.base import ExecFilter
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app
from tests.ui import flows
from tests.ui.conftest import TOKEN, login


def _ids(html: str) -> list[str]:
    return re.findall(r'<tr class="execution" data-id="([^"]*)"', html)


def test_list_pages_through_the_read_model_and_filters(env: WorkflowEnvironment, client: TestClient) -> None:
    for i in range(5):
        env.start(flows.echo, f"e{i}", _workflow_id=f"echo-{i}")
    env.advance(timedelta(hours=2))
    waiting = env.start(flows.order, "book", _workflow_id="order-1")
    limits: list[int] = []
    counted: set[str | None] = set()
    real = env.store.list_execs

    def spy(flt: ExecFilter, limit: int, cursor: str | None = None) -> Any:
        if flt.status is None:  # the page's listing (the header's counts ask per status)
            limits.append(limit)
        else:
            counted.add(flt.status)
        return real(flt, limit, cursor)

    env.store.list_execs = spy  # type: ignore[method-assign]
    seen: list[str] = []
    url: str | None = "/executions?limit=2"
    while url:
        r = client.get(url)
        assert r.status_code == 200, r.text
        rows = _ids(r.text)
        assert 1 <= len(rows) <= 2
        seen += rows
        m = re.search(r'id="next-page" href="([^"]*)"', r.text)
        url = m.group(1).replace("&amp;", "&") if m else None
    # newest first, every execution once, each page one store query of the page's size
    assert seen[0] == waiting.id and sorted(seen) == sorted(["order-1", *(f"echo-{i}" for i in range(5))])
    assert limits and set(limits) == {2}
    assert counted == {"scheduled", "queued", "running", "completed", "failed", "cancelled", "timed_out"}
    second = client.get("/executions?limit=2").text.split('id="next-page" href="')[1].split('"')[0]
    assert 'id="first-page" href="/executions?limit=2"' in client.get(second.replace("&amp;", "&")).text

    by_name = _ids(client.get("/executions", params={"workflow": "ui.echo"}).text)
    assert sorted(by_name) == [f"echo-{i}" for i in range(5)]
    running = _ids(client.get("/executions", params={"status": "running"}).text)
    assert running == ["order-1"]  # waits for a timer; its child has not started yet
    assert sorted(_ids(client.get("/executions", params={"newer_than": "1h"}).text)) == ["order-1"]
    assert len(_ids(client.get("/executions", params={"older_than": "1h"}).text)) == 5

    bad = client.get("/executions", params={"newer_than": "soon", "status": "sleepy"})
    assert bad.status_code == 400
    assert "is not an age like" in bad.text and "unknown status" in bad.text
    assert client.get("/executions", params={"limit": "0"}).status_code == 400


def _run_order(env: WorkflowEnvironment) -> Any:
    h = env.start(flows.order, "book", _workflow_id="order-1")
    env.advance(timedelta(minutes=6))  # the timer fires, the child runs, then it waits for the signal
    return h


def test_execution_page_draws_the_timeline(env: WorkflowEnvironment, client: TestClient) -> None:
    h = _run_order(env)
    r = client.get(f"/executions/{h.id}")
    assert r.status_code == 200
    html = r.text
    states = re.findall(r'<tr class="step" data-seq="(\d+)" data-kind="([^"]+)" data-state="([^"]+)"', html)
    kinds = [(k, s) for _, k, s in states]
    assert [k for k, _ in kinds] == ["activity", "activity", "emit", "sleep", "child", "signal"], kinds
    assert kinds[3] == ("sleep", "ok") and kinds[5] == ("signal", "waiting")
    # the retried activity: three attempts, said in the table and the chart
    assert "3 attempts (retried)" in html and 'class="mark retry"' in html
    # a bar per activity, timer, child and wait; the emit is a point (its effect is in the lane);
    # the retried activity's failed attempts and backoff are bars of their own, and the wait's
    # deadline (a day ahead) is a dashed bar to the chart's edge
    assert html.count('<rect class="bar') == 8 and html.count('class="mark emit"') == 1
    for cls in ("earlier", "backoff", "timer-fired", "human", "planned"):
        assert html.count(f'<rect class="bar {cls}"') == 1, cls
    # the timer's and the wait's deadlines are marked; the wait's says when it times out
    assert html.count('class="mark deadline"') == 2
    assert re.search(r"#6 signal approve: times out at \d{4}-\d\d-\d\d", html)
    assert re.search(r'<small class="deadline">times out \d{4}-', html)
    # a wait for a person is not drawn as a timer
    assert 'class="bar timer"' not in html and 'class="bar state-waiting"' not in html
    # the child is linked to its own page, which links back to its parent
    assert 'href="/executions/order-1-kid"' in html
    kid_page = client.get("/executions/order-1-kid").text
    assert 'href="/executions/order-1"' in kid_page and 'data-state="ok"' in kid_page
    # the lane the effect went to, with its row
    assert "mail-book" in html and 'class="effect" data-status="succeeded"' in html
    assert flows.MAILS == ["book@example.com"]
    lane = client.get("/lanes", params={"key": "mail-book"})
    assert lane.status_code == 200 and "ui.mail" in lane.text and "succeeded" in lane.text
    assert '"book@example.com"' in html.replace("&#34;", '"')

    env.signal(h, "approve", True)
    data = client.get(f"/api/executions/{h.id}").json()
    assert data["status"] == "completed" and data["result"]["approved"] is True
    assert [s["state"] for s in data["signals"]] == ["consumed"]
    assert 'class="mark sig-consumed"' in data["html"] and 'id="result"' in data["html"]
    assert client.get("/executions/no-such-id").status_code == 404
    assert client.get("/api/executions/no-such-id").status_code == 404


def test_every_payload_is_escaped(env: WorkflowEnvironment, client: TestClient) -> None:
    evil = "<script>alert('pwned')</script>"
    h = env.start(flows.echo, evil, _workflow_id=f"x{evil}/y?z#")
    pages = [
        client.get("/executions"),
        client.get("/executions/" + "x%3Cscript%3Ealert('pwned')%3C%2Fscript%3E%2Fy%3Fz%23"),
        client.get("/lanes", params={"key": evil}),
    ]
    for page in pages:
        assert page.status_code == 200, page.text
        assert "<script>alert" not in page.text
        assert "&lt;script&gt;alert(" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
    assert 'href="/executions/x%3Cscript%3Ealert%28%27pwned%27%29%3C%2Fscript%3E%2Fy%3Fz%23"' in pages[0].text
    data = client.get("/api/executions/" + h.id.replace("?", "%3F").replace("#", "%23")).json()
    assert data["result"] == evil and "<script>alert" not in data["html"]
    # the only scripts are the app's own file
    assert re.findall(r"<script[^>]*>", pages[1].text) == ['<script src="/static/ui.js" defer>']


def test_actions_need_the_token_and_a_csrf_token(env: WorkflowEnvironment, client: TestClient) -> None:
    h = _run_order(env)
    assert client.get("/actions/cancel").status_code == 405
    assert client.get("/actions/cancel", params={"id": h.id}).status_code == 405
    assert client.post("/actions/cancel", data={"id": h.id}).status_code == 403  # no token at all
    bad_bearer = client.post("/actions/cancel", data={"id": h.id}, headers={"Authorization": "Bearer nope"})
    assert bad_bearer.status_code == 403 and bad_bearer.json() == {"ok": False, "error": "invalid token"}
    assert client.post("/login", data={"token": "wrong-token-wrong-token"}).status_code == 403
    assert h.poll().cancel_requested is False

    csrf = login(client)
    assert client.post("/actions/cancel", data={"id": h.id}).status_code == 403  # session, no CSRF field
    assert client.post("/actions/cancel", data={"id": h.id, "csrf": "0" * 64}).status_code == 403
    cross = client.post("/actions/cancel", data={"id": h.id, "csrf": csrf}, headers={"Origin": "http://evil.test"})
    assert cross.status_code == 403
    assert h.poll().cancel_requested is False
    # a session of another token (a restarted UI with a new token) is worthless
    other = TestClient(create_app(env.engine, "another-token-0123456789"), follow_redirects=False)
    other.cookies = client.cookies
    assert other.post("/actions/cancel", data={"id": h.id, "csrf": csrf}).status_code == 403

    ok = client.post("/actions/cancel", data={"id": h.id, "csrf": csrf}, headers={"Origin": "http://testserver"})
    assert ok.status_code == 303 and ok.headers["location"] == f"/executions/{h.id}?msg=cancel-requested"
    env.run_until_idle()
    assert h.status() == "cancelled"
    assert "cancel requested" in client.get(ok.headers["location"]).text


def test_signal_retry_and_resume_with_a_bearer_token(env: WorkflowEnvironment, client: TestClient) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    h = _run_order(env)
    wrong = client.post("/actions/signal", data={"id": h.id, "name": "approve", "value": '"perhaps"'}, headers=auth)
    assert wrong.status_code == 400 and "approve" in wrong.json()["error"]
    not_json = client.post("/actions/signal", data={"id": h.id, "name": "approve", "value": "{"}, headers=auth)
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]
    sent = client.post("/actions/signal", data={"id": h.id, "name": "approve", "value": "true"}, headers=auth)
    assert sent.json() == {"ok": True, "message": "signal delivered"}
    env.run_until_idle()
    assert h.status() == "completed"

    failed = env.start(flows.fails, "card declined", _workflow_id="fails-1")
    assert failed.status() == "failed"
    refused = client.post("/actions/retry", data={"id": h.id}, headers=auth)
    assert refused.status_code == 400 and "not failed" in refused.json()["error"]
    assert client.post("/actions/retry", data={"id": "fails-1"}, headers=auth).json()["ok"] is True
    env.run_until_idle()
    assert failed.status() == "failed" and failed.poll().steps == 1  # the step ran again and failed again
    assert client.post("/actions/resume", data={"id": h.id}, headers=auth).status_code == 400  # completed
    assert client.post("/actions/cancel", data={"id": "nope"}, headers=auth).status_code == 404
    assert client.post("/actions/launch", data={"id": h.id}, headers=auth).status_code == 404


def test_the_token_is_long_enough(env: WorkflowEnvironment) -> None:
    with pytest.raises(ValueError, match="at least 16 characters"):
        create_app(env.engine, "short")


def test_the_ui_command() -> None:
    from celery.bin.celery import celery as celery_cli

    runner = CliRunner()
    out = runner.invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "--help"])
    assert out.exit_code == 0 and "ui" in out.output
    short = runner.invoke(celery_cli, ["-A", "tests.apps.basic", "durable", "ui", "--token", "short"])
    assert short.exit_code == 2 and "at least 16 characters" in short.output


def test_rejected_and_consumed_signals_are_drawn(env: WorkflowEnvironment, client: TestClient) -> None:
    h = env.start(flows.counts, _workflow_id="counts-1")
    env.signal(h, "n", "not a number")
    env.signal(h, "n", 5)
    assert env.result(h) == 5
    html = client.get("/executions/counts-1").text
    assert re.findall(r'<tr class="signal" data-state="([^"]+)"', html) == ["rejected", "consumed"]
    assert 'class="mark sig-rejected"' in html and 'class="mark sig-consumed"' in html
    assert "not a number" in html


def test_serve_prints_a_random_token_once_and_it_unlocks_actions(
    env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io
    from types import SimpleNamespace

    import uvicorn

    from celery_durable.ui import serve

    served: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: served.update(app=app, **kw))
    out = io.StringIO()
    serve(SimpleNamespace(engine=env.engine), out=out)  # type: ignore[arg-type]
    assert served["host"] == "127.0.0.1" and served["port"] == 8765
    token = out.getvalue().split("actions token (shown once): ", 1)[1].split()[0]
    assert len(token) >= 32 and out.getvalue().count(token) == 1
    # addressed as a browser on this machine does (on loopback other Host names are refused)
    with TestClient(served["app"], base_url="http://127.0.0.1:8765", follow_redirects=False) as c:
        assert c.post("/login", data={"token": token}).status_code == 303
    out = io.StringIO()
    serve(SimpleNamespace(engine=env.engine), host="0.0.0.0", token=TOKEN, out=out)  # type: ignore[arg-type]
    assert TOKEN not in out.getvalue() and "every page, the API and the actions need the token" in out.getvalue()
    out = io.StringIO()
    serve(SimpleNamespace(engine=env.engine), host="0.0.0.0", token=TOKEN, out=out, public_read=True)  # type: ignore[arg-type]
    assert TOKEN not in out.getvalue() and "anyone who reaches it can read" in out.getvalue()


def test_list_filters_by_search_attributes(env: WorkflowEnvironment, client: TestClient) -> None:
    """Issue 13 item 5: the executions list takes ``attr=value`` pairs, as `durable list --search`."""
    env.start(flows.echo, "a", _workflow_id="s-a", _search={"customer": "c-42", "priority": 3})
    env.start(flows.echo, "b", _workflow_id="s-b", _search={"customer": "c 7", "priority": 3})
    env.start(flows.echo, "c", _workflow_id="s-c")
    assert _ids(client.get("/executions", params={"search": "customer=c-42"}).text) == ["s-a"]
    assert sorted(_ids(client.get("/executions", params={"search": "priority=3"}).text)) == ["s-a", "s-b"]
    assert _ids(client.get("/executions", params={"search": "customer='c 7' priority=3"}).text) == ["s-b"]
    page = client.get("/executions", params={"search": "priority=3", "limit": "1"}).text
    assert "search=priority%3D3" in page  # the next page keeps the filter
    bad = client.get("/executions", params={"search": "no pair"})
    assert bad.status_code == 400 and "search:" in bad.text and "attr=value" in bad.text


def test_the_ui_serves_prometheus_metrics_of_its_store_calls(env: WorkflowEnvironment, client: TestClient) -> None:
    # issue 14: metrics "servable from the worker or the UI process"
    env.start(flows.echo, "m", _workflow_id="metrics-1")

    def reads() -> float:
        r = client.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        found = re.findall(r"^celery_durable_store_call_seconds_count\{[^}]*\} ([0-9.e+]+)$", r.text, re.M)
        return sum(float(v) for v in found)

    before = reads()
    assert client.get("/executions/metrics-1").status_code == 200  # the page reads the store
    assert reads() > before


def test_superseded_steps_and_operator_actions_are_drawn(env: WorkflowEnvironment, client: TestClient) -> None:
    """After a retry that forgot a refund that ran, the page lists the retry (by the UI and the
    client's address) and the refund as superseded, with its value (issue 23, item 4)."""
    flows.REFUNDS.clear()
    flows.LABEL_BROKEN[0] = True
    auth = {"Authorization": f"Bearer {TOKEN}"}
    h = env.start(flows.saga, "o-9", _workflow_id="saga-1")
    assert h.status() == "failed" and flows.REFUNDS == ["o-9"]
    flows.LABEL_BROKEN[0] = False
    assert client.post("/actions/retry", data={"id": h.id}, headers=auth).json()["ok"] is True
    env.run_until_idle()
    assert h.status() == "completed"
    html = client.get(f"/executions/{h.id}").text
    assert '<tr class="operation" data-action="retry">' in html and "ui:testclient" in html
    rows = re.findall(r'<tr class="superseded" data-seq="(\d+)" data-state="([^"]+)">', html)
    assert rows == [("2", "failed"), ("3", "ok")]
    assert "ui.refund" in html and "refunded o-9" in html.replace("&#34;", '"')
    data = client.get(f"/api/executions/{h.id}").json()
    assert [(s["name"], s["state"], s["value"]) for s in data["superseded"]][1] == ("ui.refund", "ok", "refunded o-9")
    assert [(o["action"], o["by"]) for o in data["operations"]] == [("retry", "ui:testclient")]


def test_a_batch_acts_on_each_selected_execution_and_says_what_each_got(
    env: WorkflowEnvironment, client: TestClient
) -> None:
    """Issue 25: batch retry/cancel from the list's selection (POST /actions/batch, ``id``
    repeated): each execution is its own action; one refused does not stop the others."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for n in (1, 2):
        env.start(flows.fails, "card declined", _workflow_id=f"fails-b{n}")
    done = _run_order(env)
    ids = ["fails-b1", done.id, "fails-b2", "nope", "fails-b1"]  # a repeat counts once
    got = client.post("/actions/batch", data={"action": "retry", "id": ids}, headers=auth)
    assert got.status_code == 200, got.text
    results = {r["id"]: (r["ok"], r["message"]) for r in got.json()["results"]}
    assert len(got.json()["results"]) == 4
    assert results["fails-b1"] == results["fails-b2"] == (True, "retrying from the failed step")
    assert results[done.id][0] is False and "not failed" in results[done.id][1]
    assert results["nope"] == (False, "no execution with id 'nope'")
    ops = [op["action"] for op in Admin(env.engine).describe("fails-b2").operations]
    assert ops == ["retry"]
    # refused as a whole: no token or CSRF, an action that is not a batch one, nothing selected
    assert client.post("/actions/batch", data={"action": "retry", "id": ["fails-b1"]}).status_code == 403
    assert client.post("/actions/batch", data={"action": "signal", "id": ["fails-b1"]}, headers=auth).status_code == 400
    assert client.post("/actions/batch", data={"action": "cancel"}, headers=auth).status_code == 400


def test_pause_and_unpause_from_the_page_and_the_api(env: WorkflowEnvironment, client: TestClient) -> None:
    """The execution page offers pause on a running execution and shows it paused, then offers
    unpause; a signal sent while paused is recorded and taken in after the unpause."""
    auth = {"Authorization": f"Bearer {TOKEN}"}
    h = _run_order(env)
    login(client)  # the page shows its action forms to a logged-in session
    assert 'action="/actions/pause"' in client.get(f"/executions/{h.id}").text
    assert client.post("/actions/pause", data={"id": h.id}, headers=auth).json() == {
        "ok": True,
        "message": "paused: nothing of it runs until unpaused",
    }
    assert client.post("/actions/pause", data={"id": h.id}, headers=auth).json()["message"] == "already paused"
    page = client.get(f"/executions/{h.id}").text
    assert 'id="paused"' in page and 'action="/actions/unpause"' in page
    sent = client.post("/actions/signal", data={"id": h.id, "name": "approve", "value": "true"}, headers=auth)
    assert sent.json()["ok"]
    env.run_until_idle()
    assert h.status() == "running"  # recorded, not taken in
    assert client.post("/actions/unpause", data={"id": h.id}, headers=auth).json()["message"] == "unpaused: driven now"
    env.run_until_idle()
    assert h.status() == "completed"
