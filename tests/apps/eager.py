"""A Celery app whose workers run activities eagerly (``durable_eager_activities``, issue 15):
``celery -A tests.apps.eager worker``. Configured from the environment like tests.apps.basic."""

from __future__ import annotations

import os
from pathlib import Path

from celery_durable import Durable, NonRetryableError, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app, env_float, gate_in, mark_in

app = env_app(
    "eager",
    durable_eager_activities=int(os.environ.get("TEST_EAGER_ACTIVITIES", "10")),
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
)
#: the queue ``elsewhere`` is routed to (a worker of the test consumes it too)
OTHER_QUEUE = os.environ.get("TEST_OTHER_QUEUE", "eager-other")
app.conf.task_routes = {"tests.apps.eager.elsewhere": {"queue": OTHER_QUEUE}}
if os.environ.get("TEST_TIME_LIMIT"):
    app.conf.task_time_limit = float(os.environ["TEST_TIME_LIMIT"])
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def mark(name: str) -> int:
    """Append a line to a marks file (across processes); return how many lines it now has."""
    return mark_in(MARKS, name)


@durable_activity
def inc(x: int) -> int:
    return x + 1


@durable_activity(autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
def flaky(key: str, x: int) -> int:
    if mark(f"flaky-{key}") == 1:
        raise ConnectionError("first attempt fails")
    return x + 10


@durable_activity
def elsewhere(x: int) -> int:
    return x + 100


@durable_activity
def crash_once(key: str, x: int) -> int:
    if mark(f"crash-{key}") == 1:
        os._exit(1)  # the process dies mid-attempt, as a killed worker child does
    return x + 1000


@durable.workflow(name="eager.steps")
def steps(n: int) -> int:
    x = 0
    for _ in range(n):
        x = inc(x)
    return x


@durable.workflow(name="eager.retry_inside")
def retry_inside(key: str) -> int:
    return inc(flaky(key, inc(0)))


@durable.workflow(name="eager.routed")
def routed() -> int:
    return inc(elsewhere(inc(0)))


@durable.workflow(name="eager.crash")
def crash(key: str) -> int:
    return inc(crash_once(key, inc(0)))


@durable.workflow(name="eager.after_sleep")
def after_sleep(seconds: float) -> int:
    wf.sleep(seconds)
    return inc(inc(0))


def _gate(name: str) -> None:
    gate_in(MARKS, name)


@durable_activity
def gated(key: str, step: int, x: int) -> int:
    """Marks its start (its pid), waits for the test's ``gate-{key}-{step}``, marks its end."""
    mark(f"start-{key}-{step}")
    _gate(f"gate-{key}-{step}")
    mark(f"end-{key}-{step}")
    return x + 1


@durable.workflow(name="eager.gated")
def gated_steps(key: str, n: int) -> int:
    x = 0
    for step in range(1, n + 1):
        x = gated(key, step, x)
    return x


@durable_activity
def after_kill(key: str, x: int) -> int:
    mark(f"ran-{key}")
    return x + 5


@durable.workflow(name="eager.kill_before")
def kill_before(key: str) -> int:
    return inc(after_kill(key, inc(0)))


if os.environ.get("TEST_DIE_BEFORE_START"):
    from celery.signals import task_prerun

    @task_prerun.connect(weak=False)
    def _die_before_start(sender: object = None, args: object = None, **_: object) -> None:
        """The process dies after the commit that scheduled ``after_kill`` and before its first
        attempt begins (its first run here is a kept one: the commit of ``inc`` kept it)."""
        name = getattr(sender, "name", None)
        if name == after_kill.name and isinstance(args, list | tuple) and mark(f"prerun-{args[0]}") == 1:
            os._exit(1)


@durable_activity
def out_of_paper(order: str) -> str:
    mark(f"label-{order}")
    raise NonRetryableError("label printer is out of paper")


@durable_activity(autoretry_for=(ConnectionError,), max_retries=1, default_retry_delay=0)
def carrier_down(order: str) -> str:
    mark(f"label-{order}")
    raise ConnectionError("the carrier API is down")


@durable.workflow(name="eager.label")
def label(order: str, retried: bool) -> str:
    """Fails for good at its second step (``retried``: after a retry)."""
    inc(0)
    return carrier_down(order) if retried else out_of_paper(order)
