"""A Celery app for the pool tests: ``celery -A tests.apps.pools worker -P <pool>``.

Configured from the environment like ``tests.apps.effects``. Each handler loops until it is
stopped and appends ``{"id", "event", "exc"}`` to ``$TEST_MARKS_DIR/pools.log`` in a ``finally``
block, so a test sees that the loop itself observed the interrupt (and which one).

``TEST_OS_QUEUE`` routes the effects that need an OS-thread interrupt to that queue
(``task_routes``), so a gevent/eventlet worker that consumes only the default queue may start.
``TEST_MONKEY=gevent`` monkey-patches the process before anything else is imported.
"""

from __future__ import annotations

import os

if os.environ.get("TEST_MONKEY") == "gevent":  # must run before threading is used
    from gevent import monkey

    monkey.patch_all()

import json  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from celery_durable import Durable  # noqa: E402
from celery_durable.glue.outbox import effect_context  # noqa: E402
from tests.apps._common import env_app, env_float  # noqa: E402

app = env_app("pools", durable_outbox_cancel_poll=env_float("TEST_OUTBOX_CANCEL_POLL", "1"))
#: the effects a cancel or timeout must interrupt (an OS-thread pool only)
INTERRUPTED = ("pl.spin", "pl.spin_timeout")
if os.environ.get("TEST_OS_QUEUE"):
    app.conf.task_routes = {f"celery_durable.effect.{t}": {"queue": os.environ["TEST_OS_QUEUE"]} for t in INTERRUPTED}
durable = Durable(app)


def note(event: str, exc: BaseException | None = None) -> None:
    folder = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))
    folder.mkdir(parents=True, exist_ok=True)
    line = {"id": effect_context().effect_id, "event": event, "exc": type(exc).__name__ if exc else None}
    with (folder / "pools.log").open("a") as fh:
        fh.write(json.dumps(line) + "\n")


def _spin(seconds: float = 60.0) -> None:
    """A pure-Python loop that never yields or checks for cancellation."""
    note("start")
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            sum(range(1000))
    except BaseException as exc:
        note("stopped", exc)
        raise
    note("end")


@durable.effect("pl.spin")
def spin(payload: dict[str, float]) -> None:
    _spin()


@durable.effect("pl.spin_timeout", timeout=1.0, max_attempts=1)
def spin_timeout(payload: dict[str, float]) -> None:
    _spin()


@durable.effect("pl.coop", interruptible=False)
def coop(payload: dict[str, float]) -> None:
    """Stops only at its cooperative check: ``effect_context().sleep()``."""
    note("start")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            effect_context().sleep(0.05)
    except BaseException as exc:
        note("stopped", exc)
        raise
    note("end")
