"""Breaker: an activity that fails for good, its outcome recorded in ``after_return``.

Deliveries are eager ``task.apply`` with the step header a worker receives (as in
tests/engine/test_delivery_proof.py). The store is down while the outcome is recorded once.
"""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, Task

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable.engine.documents.schema import marker_id, result_id
from celery_durable.errors import StoreUnavailable
from celery_durable.glue.durable_activity import DURABLE_HEADER
from celery_durable.stores.memory import MemoryStore

app = Celery("breaker-failed", broker="memory://", set_as_current=False)
# the memory broker is one per process: a queue of its own, so no later test's worker consumes
# what these workflows send
app.conf.task_default_queue = "breaker-failed"
store = MemoryStore()
durable = Durable(app, store=store)
ran: list[str] = []


@durable_activity(name="bf.broken")
def broken(v: str) -> str:
    ran.append(v)
    raise NonRetryableError("broken for good")


@durable_activity(name="bf.fine")
def fine(v: str) -> str:
    ran.append(v)
    return v


class Alerting(Task):  # type: ignore[misc]
    """A user's task base whose failure hook fails (its alerting endpoint is down)."""

    def on_failure(self, exc: Any, task_id: Any, args: Any, kwargs: Any, einfo: Any) -> None:
        raise RuntimeError("the alerting webhook is down")


@durable_activity
@app.task(name="bf.alerting", base=Alerting)
def alerting(v: str) -> str:
    ran.append(v)
    raise NonRetryableError("broken for good")


@durable.workflow(name="bf.alerts")
def alerts(v: str) -> str:
    return alerting(v)


@durable.workflow(name="bf.fails")
def fails(v: str) -> str:
    return broken(v)


@durable.workflow(name="bf.works")
def works(v: str) -> str:
    return fine(v)


def message(eid: str, seq: int) -> tuple[list[Any], dict[str, Any]]:
    marker = store.read(eid, marker_id(seq))
    assert marker is not None
    meta: dict[str, Any] = {"e": eid, "s": seq, "r": 0, "w": "?"}
    if marker.get("token") is not None:
        meta["t"] = marker["token"]
    return list(marker["input"]["args"]), {DURABLE_HEADER: meta}


@pytest.fixture(autouse=True)
def _clean() -> None:
    ran.clear()


def _outage_once(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    real = durable.engine.activities.complete
    calls: list[int] = []

    def complete(*a: Any, **k: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise StoreUnavailable("store down (breaker)")
        return real(*a, **k)

    monkeypatch.setattr(durable.engine.activities, "complete", complete)
    return calls


def test_control_a_succeeding_activity_keeps_its_outcome_through_an_outage_under_apply(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    h = works.start("ok")
    durable.engine.drive(h.id)
    _outage_once(monkeypatch)
    args, headers = message(h.id, 1)
    app.tasks["bf.fine"].apply(args=args, headers=headers)
    assert ran == ["ok"]
    assert store.read(h.id, result_id(1)) is not None  # recorded by the eager re-delivery


def test_a_failed_activity_keeps_its_outcome_through_an_outage_under_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Promise: a store outage while recording never loses the outcome (the message is re-sent
    with the outcome sealed in it) and task.apply() behaves. Under apply() the re-delivery is a
    Retry that record_failure swallows in after_return: Celery's apply() never runs it."""
    h = fails.start("x")
    durable.engine.drive(h.id)
    calls = _outage_once(monkeypatch)
    args, headers = message(h.id, 1)
    res = app.tasks["bf.broken"].apply(args=args, headers=headers)
    assert res.state == "FAILURE"
    assert ran == ["x"]
    assert len(calls) >= 1
    # the outcome must not be lost: recorded (by the re-delivery the outage asked for)
    assert store.read(h.id, result_id(1)) is not None, "the failed outcome was lost"


def test_a_failed_activity_outcome_lost_under_apply_runs_the_function_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The consequence: the step is left to run again, its function re-run (promise: never run
    again because of the outage)."""
    h = fails.start("y")
    durable.engine.drive(h.id)
    _outage_once(monkeypatch)
    args, headers = message(h.id, 1)
    app.tasks["bf.broken"].apply(args=args, headers=headers)
    monkeypatch.undo()
    args, headers = message(h.id, 1)  # what the recovery scan sends for the step left due
    app.tasks["bf.broken"].apply(args=args, headers=headers)
    assert ran == ["y"], "the failed activity's function ran again"


def test_a_failing_on_failure_hook_does_not_lose_the_outcome() -> None:
    """A user's on_failure that raises (or the result backend failing to store FAILURE: the same
    spot in Celery's trace) skips after_return, where the outcome is recorded now: the outcome is
    lost and the function runs again when the step is re-sent."""
    h = alerts.start("z")
    durable.engine.drive(h.id)
    args, headers = message(h.id, 1)
    try:
        app.tasks["bf.alerting"].apply(args=args, headers=headers)
    except RuntimeError:
        pass  # an eager apply() re-raises the hook's error; a worker logs it as an internal error
    assert ran == ["z"]
    assert store.read(h.id, result_id(1)) is not None, "the failed outcome was not recorded"
