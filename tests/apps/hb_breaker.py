"""Test app of tests/breakers/test_heartbeat_breaks.py (the worker tests): a compensation that
awaits an activity the cancel left running, and a compensation that runs on while a second
cancel is requested. Gates are marks files the test creates (``gate_in``)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from celery_durable import Durable, activity, durable_activity
from celery_durable import workflow as wf
from celery_durable.errors import WorkflowCancelledError
from tests.apps._common import env_app, mark_in

app = env_app(
    "hb_breaker",
    durable_recovery_interval=float(os.environ.get("TEST_RECOVERY_INTERVAL", "15")),
    durable_drive_timeout=float(os.environ.get("TEST_DRIVE_TIMEOUT", "30")),
    durable_activity_queue_timeout=float(os.environ.get("TEST_QUEUE_TIMEOUT", "300")),
)
durable = Durable(app)
MARKS = Path(os.environ.get("TEST_MARKS_DIR", "/tmp/celery_durable_marks"))


def mark(name: str) -> int:
    return mark_in(MARKS, name)


@durable_activity(name="hb_breaker.background")
def background(key: str) -> str:
    # heartbeats while it waits for its gate too (gate_in polls; heartbeat in between)
    mark(f"bg-start-{key}")
    try:
        while not (MARKS / f"bg-go-{key}").exists():
            activity.heartbeat()
            time.sleep(0.05)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            activity.heartbeat()
            time.sleep(0.05)
    except activity.ActivityCancelled:
        mark(f"bg-cancelled-{key}")
        raise
    mark(f"bg-done-{key}")
    return "done"


@durable.workflow(name="hb_breaker.compensation_awaits")
def compensation_awaits(key: str) -> str:
    pending = background.start(key)
    try:
        wf.sleep(3600)
    except WorkflowCancelledError:
        mark(f"comp-awaited-{key}-{pending.result()}")  # the compensation awaits the running activity
        raise
    return "slept"


@durable_activity(name="hb_breaker.long")
def long_job(key: str) -> str:
    mark(f"long-start-{key}")
    try:
        while True:
            activity.heartbeat()
            time.sleep(0.05)
    except activity.ActivityCancelled:
        mark(f"long-cancelled-{key}")
        raise


@durable_activity(name="hb_breaker.compensate")
def compensate(key: str) -> str:
    mark(f"comp-start-{key}")
    try:
        while not (MARKS / f"comp-go-{key}").exists():
            activity.heartbeat()
            time.sleep(0.05)
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            activity.heartbeat()
            time.sleep(0.05)
    except activity.ActivityCancelled:
        mark(f"comp-cancelled-{key}")
        raise
    mark(f"comp-done-{key}")
    return "done"


@durable.workflow(name="hb_breaker.compensated")
def compensated(key: str) -> str:
    try:
        return long_job(key)
    except WorkflowCancelledError:
        compensate(key)
        raise


@durable_activity(name="hb_breaker.child_work")
def child_work(key: str) -> str:
    """Heartbeats for up to 15 s, or until cancelled."""
    mark(f"child-start-{key}")
    end = time.monotonic() + 15
    try:
        while time.monotonic() < end:
            activity.heartbeat()
            time.sleep(0.05)
    except activity.ActivityCancelled:
        mark(f"child-cancelled-{key}")
        raise
    mark(f"child-done-{key}")
    return "done"


@durable.workflow(name="hb_breaker.child")
def child(key: str) -> str:
    return child_work(key)


@durable.workflow(name="hb_breaker.parent")
def parent(key: str) -> str:
    return child(key)


@durable_activity(name="hb_breaker.never_beats", heartbeat_timeout=0.3)
def never_beats(key: str) -> str:
    """Never heartbeats; marks after how many seconds it was interrupted (``stall-after-<s>``)."""
    began = time.monotonic()
    try:
        while time.monotonic() - began < 20:
            pass
    except BaseException:
        mark(f"stall-{key}-after-{round(time.monotonic() - began)}")
        raise
    return "never interrupted"


@durable_activity(name="hb_breaker.quick")
def quick(key: str) -> str:
    return key


@durable.workflow(name="hb_breaker.stalls")
def stalls(key: str) -> str:
    quick(key)  # an activity before, in the same process: its heartbeat thread runs, idle
    try:
        return never_beats(key)
    except Exception as exc:
        return getattr(exc, "type_name", type(exc).__name__)
