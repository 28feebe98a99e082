"""Breaker: a store outage that starts while the UI is in use is a 503 on every page and action."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from celery_durable.errors import StoreUnavailable
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.env import WorkflowEnvironment
from celery_durable.ui import create_app
from tests.ui import flows
from tests.ui.conftest import TOKEN, login

METHODS = (
    "read", "read_many", "create", "replace", "upsert", "delete", "query_partition", "batch",
    "scan_due", "scan_partitions", "list_execs",
)  # fmt: skip


class FlakyStore(MemoryStore):
    """Every call fails as an outage does while ``down`` (reads only, with ``writes_only``)."""

    down = False
    writes_only = False

    def __getattribute__(self, name: str) -> Any:
        if name in METHODS and object.__getattribute__(self, "down"):
            writes = name in ("create", "replace", "upsert", "delete", "batch")
            if writes or not object.__getattribute__(self, "writes_only"):

                def fail(*a: Any, **k: Any) -> Any:
                    raise StoreUnavailable("the database is down")

                return fail
        return object.__getattribute__(self, name)


ACTIONS = [("signal", {"name": "approve", "value": "true"}), ("cancel", {}), ("resume", {}), ("retry", {})]


# a running execution's retry with only writes failing is refused (400) before anything is written
@pytest.mark.parametrize(
    ("action", "form", "writes_only"),
    [(a, f, False) for a, f in ACTIONS] + [(a, f, True) for a, f in ACTIONS if a != "retry"],
)
def test_an_action_during_an_outage_is_a_503(action: str, form: dict[str, str], writes_only: bool) -> None:
    store = FlakyStore()
    env = WorkflowEnvironment(flows.durable, store=store)
    h = env.start(flows.order, "book", _workflow_id="o-1")
    env.run_until_idle()
    with TestClient(create_app(env.engine, TOKEN), follow_redirects=False) as c:
        csrf = login(c)
        store.down, store.writes_only = True, writes_only
        r = c.post(f"/actions/{action}", data={"csrf": csrf, "id": h.id, **form})
        assert r.status_code == 503, (r.status_code, r.text[-500:])


@pytest.mark.parametrize(
    "path", ["/executions", "/executions/o-1", "/api/executions/o-1", "/lanes?key=k", "/effects", "/healthz"]
)
def test_a_page_during_an_outage_is_a_503(path: str) -> None:
    """/lanes?key=... answers 200 with the outage shown as the lane's error (read_lane and the
    lane view catch DurableError, StoreUnavailable included)."""
    store = FlakyStore()
    env = WorkflowEnvironment(flows.durable, store=store)
    env.start(flows.order, "book", _workflow_id="o-1")
    env.run_until_idle()
    with TestClient(create_app(env.engine, TOKEN), follow_redirects=False) as c:
        assert c.get(path).status_code == 200
        store.down = True
        r = c.get(path)
        assert r.status_code == 503, (r.status_code, r.text[-500:])


def test_step_inputs_are_escaped() -> None:
    env = WorkflowEnvironment(flows.durable, store=MemoryStore())
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    env.start(flows.fails, evil, _workflow_id="xss-1")
    env.run_until_idle()
    with TestClient(create_app(env.engine, TOKEN), follow_redirects=False) as c:
        pages = [c.get(p).text for p in ("/executions/xss-1", "/executions?status=failed")]
        pages.append(c.get("/api/executions/xss-1").json()["html"])  # the JSON's own fields are data
        for path, body in enumerate(pages):
            assert "<script>alert(1)" not in body and "<img src=x" not in body, path
