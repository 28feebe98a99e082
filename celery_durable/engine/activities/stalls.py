"""Stall deadlines of running activity attempts (``heartbeat_timeout``), on a thread of their own.

The heartbeat thread renews leases one store call after another; a call that hangs (a failover,
a connection waiting for its timeout) must not hold a stall back — a store outage is when stalled
attempts most need noticing. This thread never does I/O: it sleeps until the earliest deadline,
stops the attempts past theirs (an interrupt, no store call) and tells the lease keeper to stop
renewing them. It runs only while a tracked attempt has a deadline ahead and then ends by itself
(nothing to stop at shutdown), as the effect outbox's deadline thread does.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from celery_durable.engine.activities.context import ActivityContext

__all__ = ["Stalls"]

log = logging.getLogger("celery_durable.heartbeat")


class Stalls:
    def __init__(self, on_stall: Callable[[ActivityContext], None], name: str = "celery-durable-stalls") -> None:
        self.name = name
        self._on_stall = on_stall
        self._cond = threading.Condition()
        self._contexts: dict[int, ActivityContext] = {}
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, ctx: ActivityContext) -> None:
        with self._cond:
            self._contexts[id(ctx)] = ctx
            thread = self._thread
            if thread is None or not thread.is_alive() or self._pid != os.getpid():  # or lost in a fork
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()
            self._cond.notify()  # re-plan: this deadline may be the earliest

    def remove(self, ctx: ActivityContext) -> None:
        with self._cond:
            self._contexts.pop(id(ctx), None)

    def _run(self) -> None:
        while True:
            with self._cond:
                now = time.monotonic()
                # a heartbeat moves a deadline later: looked at again when the old one passes
                planned = {key: ctx.deadline() for key, ctx in self._contexts.items()}
                due = [self._contexts.pop(key) for key, at in planned.items() if at is None or at <= now]
                ahead = [at for key, at in planned.items() if at is not None and at > now]
                if not due:
                    if not ahead:
                        self._thread = None  # under the lock: the next add starts a new thread
                        return
                    self._cond.wait(min(ahead) - now)
                    continue
            for ctx in due:  # outside the lock: an add or remove never waits for an interrupt
                try:
                    if ctx.stall_if_due(now):
                        self._on_stall(ctx)
                except Exception:  # the other attempts' deadlines must outlive any one failure
                    log.exception("stopping the stalled attempt of %s failed", ctx.info.name)
