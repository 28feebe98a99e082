"""A test app for the breaks of eager activities: ``celery -A tests.apps.eager_breaker worker``.
Configured from the environment like tests.apps.eager."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery_durable import Durable, durable_activity
from tests.apps._common import env_app, env_float, gate_in, mark_in

app = env_app(
    "eager_breaker",
    durable_eager_activities=int(os.environ.get("TEST_EAGER_ACTIVITIES", "16")),
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
)
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def mark(name: str) -> int:
    return mark_in(MARKS, name)


def _gate(name: str) -> None:
    gate_in(MARKS, name)


@durable_activity
def inc(x: int) -> int:
    return x + 1


@durable_activity
def target(key: str, x: int) -> int:
    mark(f"ran-{key}")
    return x + 5


@durable.workflow(name="bk.commit_gate")
def commit_gate(key: str) -> int:
    return inc(target(key, inc(0)))


@durable_activity(autoretry_for=(ConnectionError,), max_retries=3, default_retry_delay=0)
def flaky(key: str, x: int) -> int:
    if mark(f"flaky-{key}") == 1:
        raise ConnectionError("first attempt fails")
    return x + 10


@durable.workflow(name="bk.retry")
def retry_wf(key: str) -> int:
    return inc(flaky(key, inc(0)))


@durable_activity
def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


@durable.workflow(name="bk.fail")
def fail_wf() -> str:
    try:
        boom(inc(0))
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__
    return "no"


@durable_activity
def slow(key: str, seconds: float, x: int) -> int:
    mark(f"slow-{key}")
    time.sleep(seconds)
    return x + 1


@durable.workflow(name="bk.long")
def long_wf(key: str, seconds: float) -> int:
    return inc(slow(key, seconds, inc(0)))


@durable_activity
def gated(key: str, step: int, x: int) -> int:
    mark(f"start-{key}-{step}")
    _gate(f"gate-{key}-{step}")
    mark(f"end-{key}-{step}")
    return x + 1


@durable.workflow(name="bk.gated")
def gated_steps(key: str, n: int) -> int:
    x = 0
    for step in range(1, n + 1):
        x = gated(key, step, x)
    return x


if os.environ.get("TEST_GATE_COMMIT"):
    # after the commit that schedules ``target`` (and, with eager on, claims its lease) and
    # before its sends go out: mark, then wait for the test's gate
    from celery_durable.engine.dispatcher import ActivityRequest
    from celery_durable.engine.drive import driver as _driver

    _orig_apply = _driver.Driver._apply

    def _gated_apply(self, d, ops, replay):  # type: ignore[no-untyped-def]
        _orig_apply(self, d, ops, replay)
        for req in replay.sends:
            if isinstance(req, ActivityRequest) and req.name == target.name:
                key = req.args[0]
                if mark(f"committed-{key}") == 1:
                    with (MARKS / f"holder-{key}").open("w") as fh:
                        fh.write(str(req.holder))
                    _gate(f"gate-commit-{key}")

    _driver.Driver._apply = _gated_apply  # type: ignore[method-assign]


@durable_activity
def tick(x: int) -> int:
    return x + 1


@durable.workflow(name="bk.ticks")
def ticks(n: int) -> int:
    x = inc(0)
    for _ in range(n):
        x = tick(x)
    return x


@durable_activity
def nap(seconds: float, x: int) -> int:
    time.sleep(seconds)
    return x + 1


@durable.workflow(name="bk.naps")
def naps(seconds: float) -> int:
    return nap(seconds, inc(0))


from celery.signals import task_revoked  # noqa: E402


@task_revoked.connect(weak=False)
def _on_revoked(sender: object = None, request: object = None, terminated: object = None, **_: object) -> None:
    task_id = getattr(request, "id", None)
    if task_id:
        mark(f"revoked-signal-{task_id.replace(':', '_')}")


from celery_durable import workflow as _wf  # noqa: E402


@durable_activity
def fan(key: str, i: int) -> int:
    mark(f"fan-{key}-{i}")
    time.sleep(0.3)
    return i


@durable.workflow(name="bk.fanout")
def fanout(key: str, n: int) -> int:
    inc(0)
    return sum(_wf.gather(*(fan.s(key, i) for i in range(n))))
