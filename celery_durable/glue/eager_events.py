"""Celery's task events for an eager activity, so Flower and ``celery events`` show it as a task.

A delivered task's events (``task-received``, ``-started``, ``-succeeded``, ``-failed``,
``-retried``, ``-revoked``) are sent by the worker's main process, which never sees an eager run
(glue/eager_activities.py). The process that runs it sends the same events with the same fields,
under the worker's hostname, when the worker sends task events (``-E``, ``worker_send_task_events``
or ``enable_events`` from Flower: glue/pool_board.py tells a prefork child) and the task does
(``Task.send_events``). One event dispatcher per process, on its own broker connection. An event
that cannot be sent is logged and dropped: monitoring never fails an activity.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from billiard.einfo import ExceptionWithTraceback
from celery import states
from celery.exceptions import Retry
from celery.utils.saferepr import saferepr
from celery.utils.serialization import get_pickled_exception

from celery_durable.glue import pool_board

__all__ = ["send_event", "send_traced"]

log = logging.getLogger("celery_durable.activity")

#: (pid, hostname) -> this process's dispatcher
_DISPATCHERS: dict[tuple[int, str | None], Any] = {}
_LOCK = threading.Lock()


def _dispatcher(app: Any, hostname: str | None) -> Any:
    key = (os.getpid(), hostname)
    with _LOCK:
        found = _DISPATCHERS.get(key)
        if found is None:
            if any(pid != key[0] for pid, _ in _DISPATCHERS):
                _DISPATCHERS.clear()  # a forked copy: its parent's connections are not ours
            found = app.events.Dispatcher(app.connection_for_write(), hostname=hostname, enabled=True)
            _DISPATCHERS[key] = found
        return found


def events_on(source: tuple[str | None, Any]) -> bool:
    """Whether the worker sends task events for ``source`` = (worker hostname, task)."""
    board = pool_board.board()
    return board is not None and board.task_events and bool(getattr(source[1], "send_events", True))


def send_event(source: tuple[str | None, Any], type_: str, **fields: Any) -> None:
    """Send one task event for an eager run of ``source`` = (worker hostname, task)."""
    hostname, task = source
    if not events_on(source):
        return
    try:
        _dispatcher(task.app, hostname).send(type_, **fields)
    except Exception as exc:  # noqa: BLE001 - the broker down: the activity runs all the same
        log.warning("could not send %s for eager activity %s: %s", type_, fields.get("uuid"), exc)


def send_traced(source: tuple[str | None, Any], task_id: str, traced: Any) -> None:
    """The event that ends a run, from what Celery's tracer returned (``trace_ok_t``)."""
    retval, info, runtime, retstr = traced
    if info is None:
        send_event(source, "task-succeeded", uuid=task_id, result=retstr, runtime=runtime)
        return
    state = getattr(info, "state", None)
    einfo = retval
    exc = getattr(einfo, "exception", getattr(info, "retval", None))
    # as the worker's Request does: the exception itself, not billiard's ExceptionWithTraceback,
    # and for a retry the exception it retries for (Retry.exc)
    if isinstance(exc, ExceptionWithTraceback):
        exc = exc.exc
    if state == states.RETRY and isinstance(exc, Retry) and exc.exc is not None:
        exc = exc.exc
    exception = saferepr(get_pickled_exception(exc))
    traceback = str(getattr(einfo, "traceback", "") or "")
    if state == states.RETRY:
        send_event(source, "task-retried", uuid=task_id, exception=exception, traceback=traceback)
    elif state == states.FAILURE:
        send_event(source, "task-failed", uuid=task_id, exception=exception, traceback=traceback)
