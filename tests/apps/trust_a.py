"""Test app of issue 23 items 1 and 5 (tests/integration/test_delivery_proof.py): ``echo`` goes
to the ``<queue>_b`` queue and ``charge`` to ``<queue>_pay``, which a test's first worker does
not consume, so their messages stay queued while the test resets or forges."""

from __future__ import annotations

import os
from pathlib import Path

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app, mark_in

Q = os.environ.get("TEST_QUEUE", "celery")
app = env_app("trust_a")
app.conf.task_routes = {"trust_a.echo": {"queue": Q + "_b"}, "trust_a.charge": {"queue": Q + "_pay"}}
durable = Durable(app)
MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


@durable_activity(name="trust_a.fail_once")
def fail_once(key: str) -> str:
    if mark_in(MARKS, f"fail-{key}") == 1:
        raise NonRetryableError("the first attempt fails (the bug an operator then fixes)")
    return "ok"


@durable_activity(name="trust_a.echo")
def echo(v: str) -> str:
    with (MARKS / "echo").open("a") as fh:
        fh.write(v + "\n")
    return v


@durable.workflow(name="trust_a.reset_flow")
def reset_flow(key: str) -> dict[str, str]:
    t = str(wf.uuid4())  # step 1
    fb = echo.start(t)  # step 2 (the _b queue)
    fail_once(key)  # step 3: fails the first time
    return {"t": t, "echo": fb.result()}


@durable_activity(name="trust_a.charge")
def charge(amount: int) -> str:
    mark_in(MARKS, "charged")
    return f"charged {amount}"


@durable.workflow(name="trust_a.order")
def order(amount: int) -> str:
    return "order done: " + charge(amount)
