"""Breakers: the list's "waiting on" column (celery_durable/engine/admin/waiting.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_durable import Durable, durable_activity
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.waiting import activity_states
from celery_durable.engine.documents.schema import EXEC_ID, marker_id, result_id
from celery_durable.stores.base import strip_reserved
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.testing.env import WorkflowEnvironment
from tests.ui.conftest import page_as_operator

app = Celery("breaker-waiting", set_as_current=False)
durable = Durable(app, store="memory://")


@durable_activity(name="brk.later", autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=60)
def later(x: int) -> int:
    raise ConnectionError("not yet")


@durable.workflow(name="brk.waits")
def waits(x: int) -> int:
    return later(x)


@pytest.fixture
def env(tmp_path: Path) -> WorkflowEnvironment:
    return WorkflowEnvironment(durable, store=SqliteStore(str(tmp_path / "w.db")))


def _waiting_kid(env: WorkflowEnvironment) -> tuple[str, dict[str, Any]]:
    h = env.start(waits, 1, _workflow_id="k")  # attempt 1 fails: 60 s backoff
    ex = env.engine.store.read("k", EXEC_ID)
    assert ex is not None and ex["status"] == "running"
    assert [w.get("kind") for w in ex["waiting"]] == ["activity"], ex.get("waiting")
    marker = env.engine.store.read(h.id, marker_id(ex["waiting"][0]["seq"], 0))
    assert marker is not None
    return h.id, marker


@pytest.mark.parametrize(
    "bad",
    [{"attempts": "two"}, {"lease": {"holder": "w1", "expires": "soon"}}],
    ids=["attempts-not-a-number", "lease-expiry-not-a-number"],
)
def test_a_malformed_step_marker_does_not_take_the_execution_list_down(
    env: WorkflowEnvironment, bad: dict[str, Any]
) -> None:
    eid, marker = _waiting_kid(env)
    env.engine.store.replace(strip_reserved(marker) | bad, if_match=marker["_etag"])
    r = page_as_operator(env.engine, "/executions")
    assert r.status_code == 200, (
        f"one malformed step marker ({bad}) of a listed execution makes the whole list a {r.status_code}: "
        "activity_states catches CorruptDocument only around read_many, and _state's count_of/lease_live "
        "raise on a field of the wrong type"
    )


def test_a_finished_activity_is_not_shown_as_queued(env: WorkflowEnvironment) -> None:
    """Attempt 2 succeeds and records its outcome with ``defer=True`` (what a prefork worker's
    task body does; glue/durable_activity.py ``after_return`` drives next, or recovery after
    ``drive_timeout`` if that drive is lost): until that drive, the exec still lists the step."""
    eid, marker = _waiting_kid(env)
    env.clock.advance(61)  # the backoff is over; the retry is taken by hand below
    eng = env.engine
    attempt, why = eng.activities.begin(eid, marker["seq"], 0)
    assert attempt is not None, why
    assert eng.activities.complete(attempt, eng.activities.result_doc(attempt, value=2), defer=True) == "deferred"
    assert eng.store.read(eid, result_id(marker["seq"], 0)) is not None  # the outcome is recorded
    summary = Admin(eng).describe(eid).summary
    assert [w.get("kind") for w in summary.waiting] == ["activity"]  # not driven yet
    ((item,),) = activity_states(eng.store, [summary], env.clock.now()).values()
    assert item.get("state") not in ("queued", "running", "backoff"), (
        f"an activity whose attempt 2 succeeded (outcome recorded) is listed as {item.get('state')!r} "
        f"({item}): activity_states reads only the step marker, never the step's result"
    )
