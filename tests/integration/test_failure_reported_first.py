"""An activity that fails for good is reported by Celery before its workflow is seen to end
(issue 25, ``../shared/repro/operable/newcomer_flower_failed_is_success.py``).

Failed before (about 1 run in 3 of the reproducer): the outcome was recorded *and the workflow
driven to its end* before the task raised, so a caller waiting on ``result()`` could see the
workflow failed before Celery's ``task_failure`` fired. Now the outcome is recorded first (never
lost), Celery reports the failure, and the workflow is driven on in ``after_return``. Checked
deterministically: when ``task_failure`` fires, the execution is still running.

A real worker (the pytest plugin's ``durable_worker``: threads pool, filesystem broker, SQLite)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.signals import task_failure

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable.errors import WorkflowFailedError

pytestmark = pytest.mark.worker

app = Celery("failure-reported-first", set_as_current=False, broker="memory://")
durable = Durable(app, store="memory://")
seen: list[tuple[str, str | None]] = []


@durable_activity(name="frf.print_label", app=app)
def print_label(order_id: str) -> str:
    raise NonRetryableError("label printer is out of paper")


@durable_activity(name="frf.refund", app=app)
def refund(order_id: str) -> str:
    return "refunded " + order_id


@durable.workflow(name="frf.label")
def label(order_id: str) -> str:
    return print_label(order_id)  # its failure ends the workflow at once


@durable.workflow(name="frf.compensated")
def compensated(order_id: str) -> str:
    try:
        return print_label(order_id)
    except Exception:
        refund(order_id)  # run by the drive that follows Celery's report
        raise


@pytest.fixture
def durable_app() -> Durable:
    return durable


def _on_failure(sender: Any = None, task_id: str | None = None, **_: Any) -> None:
    if getattr(sender, "name", None) == "frf.print_label":
        ex = durable.store.read(str(task_id).rsplit(":", 1)[0], "exec")
        seen.append(("failure", None if ex is None else ex.get("status")))


def test_task_failure_fires_while_the_workflow_is_still_running(durable_worker: Any) -> None:
    seen.clear()
    task_failure.connect(_on_failure, weak=False)
    try:
        h = label.start("o-1", _workflow_id="frf-1")
        with pytest.raises(WorkflowFailedError, match="out of paper"):
            h.result(timeout=30)
    finally:
        task_failure.disconnect(_on_failure)
    assert seen == [("failure", "running")]
    assert [(s.name, s.state) for s in durable.describe("frf-1").steps] == [("frf.print_label", "failed")]


def test_the_drive_after_the_report_runs_the_compensation(durable_worker: Any) -> None:
    h = compensated.start("o-2", _workflow_id="frf-2")
    with pytest.raises(WorkflowFailedError, match="out of paper"):
        h.result(timeout=30)
    steps = [(s.name, s.state) for s in durable.describe("frf-2").steps]
    assert steps == [("frf.print_label", "failed"), ("frf.refund", "ok")]
