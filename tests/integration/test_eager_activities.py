"""Eager activities with real ``celery worker`` processes (``durable_eager_activities``, issue 15):
a worker that finishes an activity runs the next one its drive schedules itself, through
Celery's tracer, instead of sending it; what it cannot run as a delivery would is sent."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.apps import eager
from tests.integration.eager_logs import attempts as _attempts
from tests.integration.eager_logs import eager_steps as _eager_steps

pytestmark = pytest.mark.worker

APP = "tests.apps.eager"


@pytest.fixture
def fx(cluster: Any, tmp_path: Path) -> Iterator[Any]:
    with cluster.client_of(eager, tmp_path / "marks") as durable:
        yield durable


def test_a_sequential_workflow_runs_its_next_steps_without_messages(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": "3"})
    h = eager.steps.start(8)
    assert h.result(timeout=60) == 8
    ran = _eager_steps(worker, h.id)
    # the drive message's delivery runs the first 3 (its budget) and sends the 4th; that
    # delivery runs the next 3 and sends the 8th: every step once, 6 of them without a message
    assert _attempts(worker, h.id) == list(range(1, 9))
    assert ran == [1, 2, 3, 5, 6, 7], ran
    assert eager.steps.start(3).result(timeout=60) == 3


def test_turned_off_every_activity_is_delivered(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP, env={"TEST_EAGER_ACTIVITIES": "0"})
    h = eager.steps.start(4)
    assert h.result(timeout=60) == 4
    assert _eager_steps(worker, h.id) == []
    assert _attempts(worker, h.id) == [1, 2, 3, 4]


def test_a_retry_inside_an_eager_activity_is_a_real_celery_retry(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP)
    key = uuid.uuid4().hex[:8]
    h = eager.retry_inside.start(key)
    assert h.result(timeout=60) == 12  # inc(0)=1, flaky: 11 on its second attempt, inc: 12
    assert 2 in _eager_steps(worker, h.id)  # flaky's first attempt ran eagerly ...
    assert (fx_marks := (eager.MARKS / f"flaky-{key}").read_text().splitlines()) and len(fx_marks) == 2
    assert "Retry in" in worker.log()  # ... and its autoretry went through Celery's retry (a message)
    ex = eager.durable.store.read(h.id, "r:000002")
    assert ex is not None and ex["attempts"] == 2


def test_an_activity_routed_to_another_queue_is_sent_there(cluster: Any, fx: Any) -> None:
    other = f"{cluster.queue}-other"
    env = {"TEST_OTHER_QUEUE": other}
    worker = cluster.start_worker(app=APP, env=env, extra=["-Q", f"{cluster.queue},{other}"])
    eager.app.conf.task_routes = {eager.elsewhere.name: {"queue": other}}  # the client routes it as the worker does
    h = eager.routed.start()
    assert h.result(timeout=60) == 102
    ran = _eager_steps(worker, h.id)
    assert 2 not in ran, ran  # elsewhere was sent to its queue
    assert _attempts(worker, h.id) == [1, 2, 3]


def test_no_eager_run_where_a_time_limit_applies(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP, env={"TEST_TIME_LIMIT": "120"})
    h = eager.steps.start(3)
    assert h.result(timeout=60) == 3
    assert _eager_steps(worker, h.id) == []


def test_a_worker_killed_in_an_eager_activity_is_recovered(cluster: Any, fx: Any) -> None:
    env = {"TEST_LEASE_TTL": "3", "TEST_HEARTBEAT": "1", "TEST_RECOVERY_INTERVAL": "1"}
    worker = cluster.start_worker(app=APP, env=env)
    cluster.workers.start_beat(app=APP, env=env)
    key = uuid.uuid4().hex[:8]
    h = eager.crash.start(key)
    assert h.result(timeout=90) == 1002  # inc(0)=1, crash_once: 1001 on its second attempt, inc
    assert 2 in _eager_steps(worker, h.id)  # the attempt that died ran eagerly
    assert len((eager.MARKS / f"crash-{key}").read_text().splitlines()) == 2


def test_the_activities_a_timer_and_a_drive_message_schedule_run_in_their_delivery(cluster: Any, fx: Any) -> None:
    worker = cluster.start_worker(app=APP)
    h = eager.after_sleep.start(0.2)
    assert h.result(timeout=60) == 2
    # step 1 is the timer: its fire_clock delivery drives, then runs steps 2 and 3 itself
    assert _eager_steps(worker, h.id) == [2, 3]
    assert _attempts(worker, h.id) == [2, 3]
