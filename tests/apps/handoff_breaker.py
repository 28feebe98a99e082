"""A test app for the breaker of limit hand-offs on real workers:
``celery -A tests.apps.handoff_breaker worker``. Configured from the environment like tests.apps.basic."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery_durable import ActivityError, Durable, Limit, durable_activity
from celery_durable import workflow as wf
from tests.apps._common import env_app, env_float

app = env_app(
    "handoff_breaker",
    durable_eager_activities=int(os.environ.get("TEST_EAGER_ACTIVITIES", "16")),
    durable_recovery_interval=env_float("TEST_RECOVERY_INTERVAL", "15"),
    durable_activity_queue_timeout=env_float("TEST_QUEUE_TIMEOUT", "300"),
    durable_drive_timeout=env_float("TEST_DRIVE_TIMEOUT", "30"),
)
durable = Durable(app)

MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def span(key: str, what: str, tag: str) -> None:
    """One line ``what time pid tag`` in the marks file ``hspan-<key>``."""
    MARKS.mkdir(parents=True, exist_ok=True)
    with open(MARKS / f"hspan-{key}", "a") as f:
        f.write(f"{what} {time.time()!r} {os.getpid()} {tag}\n")


@durable_activity(limit=Limit("hb-one", max_running=1, key=lambda key, tag, seconds, fail=False: key))
def one(key: str, tag: str, seconds: float, fail: bool = False) -> str:
    """The only one of its key running at once; fails for good when ``fail``."""
    span(key, "start", tag)
    time.sleep(seconds)
    span(key, "end", tag)
    if fail:
        raise ValueError(f"step {tag} fails for good")
    return tag


@durable_activity
def stamp(key: str, what: str, tag: str) -> None:
    span(key, what, tag)


@durable.workflow(name="hb.catcher")
def catcher(key: str, tag: str, seconds: float) -> str:
    """Its limited step fails; it catches the failure and stamps the moment it learnt it."""
    try:
        one(key, tag, seconds, True)
    except ActivityError:
        stamp(key, "caught", tag)
        return "caught"
    return "not failed"


@durable.workflow(name="hb.single")
def single(key: str, tag: str, seconds: float) -> str:
    return one(key, tag, seconds)


@durable_activity(limit=Limit("hb-rate", max_running=1, rate="2/s", key=lambda key, tag, seconds: key))
def rated(key: str, tag: str, seconds: float) -> str:
    span(key, "start", tag)
    time.sleep(seconds)
    span(key, "end", tag)
    return tag


@durable.workflow(name="hb.rated_fan")
def rated_fan(key: str, n: int, seconds: float) -> list[str]:
    return wf.gather(rated.s(key, f"r{i}", seconds) for i in range(n))


@durable.workflow(name="hb.fan")
def fan(key: str, n: int, seconds: float) -> list[str]:
    return wf.gather(one.s(key, f"f{i}", seconds) for i in range(n))
