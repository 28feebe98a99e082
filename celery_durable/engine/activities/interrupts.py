"""Raise an exception inside another running thread (an effect handler, an activity attempt).

CPython's ``PyThreadState_SetAsyncExc``: the exception lands at the thread's next Python bytecode,
not inside a blocking C call (a ``time.sleep``, a socket read), which finishes first.
"""

from __future__ import annotations

import ctypes
import logging

__all__ = ["async_raise"]

log = logging.getLogger("celery_durable.interrupts")


def async_raise(thread_id: int, exc_type: type[BaseException] | None, what: str = "the handler") -> None:
    """Raise ``exc_type`` in thread ``thread_id`` (None: drop one set and not landed yet)."""
    found = ctypes.pythonapi.PyThreadState_SetAsyncExc(
        ctypes.c_ulong(thread_id), ctypes.py_object(exc_type) if exc_type is not None else None
    )
    if found == 0 and exc_type is not None:
        # no OS thread has this id: a green thread (gevent/eventlet) that the worker's pool check
        # did not refuse; say so rather than fail silently
        log.warning("could not interrupt %s (thread %s is not an OS thread)", what, thread_id)
