"""Small ones of issue 13 (item 7): a child's future and ``poll()`` name the linked executions;
``WorkflowEnvironment.advance`` fires the ticks of ``durable.schedule`` as beat would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from celery import Celery
from celery.schedules import crontab

from celery_durable import Durable, durable_activity
from celery_durable import workflow as wf
from celery_durable.testing.env import WorkflowEnvironment

app = Celery("env-schedule-tests", set_as_current=False)
durable = Durable(app, store="memory://")
ticks: list[str] = []


@durable_activity(name="es.note")
def note(what: str) -> str:
    ticks.append(what)
    return what


@durable.workflow(name="es.report")
def report(region: str) -> str:
    return note(f"{region}@{wf.execution_id()}")


@durable.workflow(name="es.kid", signals={"go": str})
def kid(x: str) -> str:
    return x + wf.wait_signal("go")


@durable.workflow(name="es.parent")
def parent() -> list[str]:
    default = kid.start_child("a")
    named = kid.start_child("b", _workflow_id="named-kid")
    ids = [default.workflow_id, named.workflow_id]
    timer = wf.start_timer(1)
    try:
        timer.workflow_id  # noqa: B018 - only a child's future has one
    except AttributeError as exc:
        ids.append(str(exc))
    return ids + [default.result(), named.result()]


def test_a_child_future_and_poll_name_the_linked_executions() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(parent, _workflow_id="p1")
    assert env.handle("p1-c1").poll().parent_id == "p1"
    assert env.handle("named-kid").poll().parent_id == "p1"
    assert h.poll().parent_id is None
    env.signal("p1-c1", "go", "!")
    env.signal("named-kid", "go", "?")
    assert env.result(h) == [
        "p1-c1",
        "named-kid",
        "a sleep step has no workflow id: only a child workflow's future has one",
        "a!",
        "b?",
    ]


def test_advance_fires_schedule_ticks_in_the_window() -> None:
    hourly = Durable(Celery("env-schedule-hourly", set_as_current=False), store="memory://")
    flow = hourly.workflow(name="es.report")(report.__wrapped__)
    hourly.schedule("hourly", flow, timedelta(hours=1), "eu")
    start = datetime(2030, 1, 1, 9, 30, tzinfo=UTC)
    env = WorkflowEnvironment(hourly, start=start)
    ticks.clear()
    env.advance(timedelta(minutes=29))  # 09:59: no tick yet
    assert ticks == []
    env.advance(timedelta(hours=1, minutes=2))  # to 11:01: 10:00 and 11:00, each at its time
    assert ticks == ["eu@hourly@20300101T100000", "eu@hourly@20300101T110000"]
    assert env.handle("hourly@20300101T110000").poll().created_at == datetime(2030, 1, 1, 11, tzinfo=UTC).timestamp()
    env.skip_to_next_timer()  # no timer pending: nothing moves, nothing ticks
    assert len(ticks) == 2


def test_advance_fires_crontab_ticks() -> None:
    nightly = Durable(Celery("env-schedule-cron", set_as_current=False), store="memory://")
    flow = nightly.workflow(name="es.report")(report.__wrapped__)
    nightly.schedule("nightly", flow, crontab(minute="0", hour="3"), "us")
    env = WorkflowEnvironment(nightly, start=datetime(2030, 1, 1, 12, tzinfo=UTC))
    ticks.clear()
    env.advance(timedelta(days=2))
    assert ticks == ["us@nightly@20300102T030000", "us@nightly@20300103T030000"]
    with pytest.raises(ValueError, match="forward"):
        env.advance(-1)
