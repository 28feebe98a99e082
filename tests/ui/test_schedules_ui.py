"""The Schedules page: managed schedules and those declared in code, listed with their next fire,
last run and status; pause, resume and trigger behind the token and the CSRF check."""

from __future__ import annotations

from datetime import timedelta

from starlette.testclient import TestClient

from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app
from tests.ui import flows
from tests.ui.conftest import TOKEN, login


def test_the_page_lists_schedules_and_its_buttons_act(env: WorkflowEnvironment) -> None:
    code = {
        "x": {"args": ["from-code", "ui.echo", {"args": ["c"], "kwargs": {}}, 3600.0], "schedule": timedelta(hours=1)}
    }
    env.schedules.create("hourly-echo", flows.echo, "hi", every=timedelta(hours=1))
    env.advance(timedelta(hours=1))
    with TestClient(create_app(env.engine, TOKEN, code_schedules=lambda: code), follow_redirects=False) as client:
        page = client.get("/schedules").text
        assert 'data-name="hourly-echo" data-paused="no"' in page and 'data-name="from-code"' in page
        assert "every 1:00:00" in page and "ui.echo" in page
        last = env.schedules.get("hourly-echo").last_execution  # type: ignore[union-attr]
        assert last is not None and last in page and "st-completed" in page
        assert "/schedules/actions/pause" not in page  # no buttons before the token is given

        assert client.post("/schedules/actions/pause", data={"name": "hourly-echo"}).status_code == 403
        csrf = login(client)
        page = client.get("/schedules").text
        assert page.count("/schedules/actions/pause") == 1  # the managed one only
        r = client.post("/schedules/actions/pause", data={"name": "hourly-echo", "csrf": csrf})
        assert r.status_code == 303 and r.headers["location"] == "/schedules?msg=paused"
        assert env.schedules.get("hourly-echo").paused  # type: ignore[union-attr]
        page = client.get("/schedules?msg=paused").text
        assert 'data-name="hourly-echo" data-paused="yes"' in page and "no tick fires until resumed" in page
        r = client.post("/schedules/actions/trigger", data={"name": "hourly-echo", "csrf": csrf})
        assert r.headers["location"] == "/schedules?msg=triggered"
        assert env.schedules.get("hourly-echo").counts["started"] == 2  # type: ignore[union-attr]
        r = client.post("/schedules/actions/resume", data={"name": "hourly-echo", "csrf": csrf})
        assert r.headers["location"] == "/schedules?msg=resumed"
        assert not env.schedules.get("hourly-echo").paused  # type: ignore[union-attr]
        actions = [a["action"] for a in env.schedules.get("hourly-echo").actions]  # type: ignore[union-attr]
        assert actions == ["create", "pause", "trigger", "resume"]

        refused = client.post("/schedules/actions/pause", data={"name": "from-code", "csrf": csrf})
        assert refused.status_code == 400 and "declared in code" in refused.text
        assert client.post("/schedules/actions/pause", data={"name": "nope", "csrf": csrf}).status_code == 404
        assert client.post("/schedules/actions/delete", data={"name": "hourly-echo", "csrf": csrf}).status_code == 404


def test_no_schedules_says_so(client: TestClient) -> None:
    page = client.get("/schedules")
    assert page.status_code == 200 and 'id="no-schedules"' in page.text
