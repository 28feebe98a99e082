"""An activity that fails for good is a failed Celery task (issue 25), as Flower and the worker's
log show any task: real ``celery worker`` processes, run eagerly (the default) or delivered.

Found by a newcomer: the activity was a SUCCESS with result None to Celery and Flower, Flower's
"Failed" filter was empty, and no log line at any level named the exception."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.engine.documents.schema import result_id
from celery_durable.errors import WorkflowFailedError
from tests.apps import eager
from tests.integration.task_events import Events
from tests.plugins.workers import wait_until

pytestmark = pytest.mark.worker

APP = "tests.apps.eager"


@pytest.fixture
def fx(cluster: Any, tmp_path: Path) -> Iterator[Any]:
    with cluster.client_of(eager, tmp_path / "marks") as durable:
        yield durable


def _ran(marks: Path, order: str) -> int:
    path = marks / f"label-{order}"
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.parametrize(
    ("pool", "eager_on"), [("prefork", True), ("threads", True), ("prefork", False)], ids=["prefork", "threads", "sent"]
)
def test_an_activity_that_fails_for_good_is_a_failed_task(
    cluster: Any, fx: Any, tmp_path: Path, pool: str, eager_on: bool
) -> None:
    worker = cluster.start_worker(
        app=APP, pool=pool, extra=["-E"], env={"TEST_EAGER_ACTIVITIES": "10" if eager_on else "0"}
    )
    order = uuid.uuid4().hex[:8]
    with Events(eager.app) as events:
        h = eager.label.start(order, False)
        with pytest.raises(WorkflowFailedError, match="out of paper"):
            h.result(timeout=60)
        task_id = f"{h.id}:2"
        wait_until(lambda: "task-failed" in events.types(task_id), timeout=30, what=f"task-failed of {task_id}")
        failed = [e for e in events.of(task_id) if e["type"] == "task-failed"][0]
        assert "label printer is out of paper" in failed["exception"]
        assert 'raise NonRetryableError("label printer is out of paper")' in failed["traceback"]
        assert "task-succeeded" not in events.types(task_id)
        # its step before it succeeded as a task
        wait_until(lambda: "task-succeeded" in events.types(f"{h.id}:1"), timeout=30, what="step 1's task-succeeded")
    # the worker's log: Celery's own ERROR line with the traceback, and the workflow's end once
    wait_until(lambda: "raised unexpected: NonRetryableError" in worker.log(), timeout=30, what="the ERROR line")
    log = worker.log()
    assert 'raise NonRetryableError("label printer is out of paper")' in log
    assert log.count(f"workflow eager.label ({h.id}) failed") == 1, log[-3000:]
    # the stored error keeps the line that raised
    outcome = fx.store.read(h.id, result_id(2))
    assert outcome is not None and "in out_of_paper" in outcome["error"]["traceback"]
    assert _ran(tmp_path / "marks", order) == 1  # nothing ran again for it


def test_an_activity_out_of_retries_is_retried_then_failed(cluster: Any, fx: Any, tmp_path: Path) -> None:
    cluster.start_worker(app=APP, extra=["-E"])
    order = uuid.uuid4().hex[:8]
    with Events(eager.app) as events:
        h = eager.label.start(order, True)
        with pytest.raises(WorkflowFailedError, match="carrier API is down"):
            h.result(timeout=60)
        task_id = f"{h.id}:2"
        wait_until(lambda: "task-failed" in events.types(task_id), timeout=30, what=f"task-failed of {task_id}")
        kinds = events.types(task_id)
        assert "task-retried" in kinds and kinds.index("task-retried") < kinds.index("task-failed"), kinds
        assert "task-succeeded" not in kinds
    assert _ran(tmp_path / "marks", order) == 2  # the first attempt and its one retry
