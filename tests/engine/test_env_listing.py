"""``WorkflowEnvironment.list_executions`` takes what ``Durable.list_executions`` takes: a start
time as a datetime (naive means UTC) or epoch seconds. It used to pass a datetime on unconverted
and fail with a TypeError as soon as one execution existed."""

from __future__ import annotations

from datetime import UTC, datetime

from celery import Celery

from celery_durable import Durable
from celery_durable.testing.env import WorkflowEnvironment

durable = Durable(Celery("env-listing-tests", set_as_current=False), store="memory://")


@durable.workflow
def noop() -> int:
    return 1


def test_list_executions_by_start_time_takes_datetimes() -> None:
    env = WorkflowEnvironment(durable)
    h = env.start(noop, _workflow_id="listed-1")
    started = env.clock.now()
    before, after = datetime.fromtimestamp(started - 60, UTC), datetime.fromtimestamp(started + 60, UTC)
    assert [e.id for e in env.list_executions(started_after=before).executions] == [h.id]
    assert env.list_executions(started_after=after).executions == ()
    naive = after.replace(tzinfo=None)  # naive means UTC
    assert [e.id for e in env.list_executions(started_before=naive).executions] == [h.id]
    assert [e.id for e in env.list_executions(started_after=started - 60).executions] == [h.id]
