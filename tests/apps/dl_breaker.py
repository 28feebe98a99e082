"""Test app of tests/breakers/test_deadline_breaks.py (the worker test): a workflow whose
compensation at its deadline is a child workflow (a refund that waits a few seconds, then runs an
activity). Marks go to ``$TEST_MARKS_DIR``."""

from __future__ import annotations

import os
from pathlib import Path

from celery_durable import Durable, WorkflowTimedOutError, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app, env_float, mark_in

app = env_app(
    "dl_breaker",
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_clock_interval=env_float("TEST_CLOCK_INTERVAL", "1"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
    durable_drive_timeout=env_float("TEST_DRIVE_TIMEOUT", "30"),
)
durable = Durable(app)
MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def mark(name: str) -> int:
    return mark_in(MARKS, name)


@durable_activity(name="dl_breaker.refund")
def refund(key: str) -> str:
    mark(f"refunded-{key}")
    return f"refunded {key}"


@durable.workflow(name="dl_breaker.refund_flow")
def refund_flow(key: str, wait: float) -> str:
    wf.sleep(wait)
    return refund(key)


@durable.workflow(name="dl_breaker.order")
def order(key: str) -> str:
    try:
        wf.sleep(3600)
    except WorkflowTimedOutError:
        refund_flow.options().start_child(key, 3.0).result()  # the compensation: a child workflow
        raise
    return "slept"
