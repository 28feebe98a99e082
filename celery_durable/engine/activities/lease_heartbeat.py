"""One heartbeat thread per process for every lease the process holds (docs/architecture.md §8).

Activity attempts (``leases.LeaseKeeper``) and running effect handlers
(``outbox.runtime.EffectKeeper``) register as *beaters*: each says when it next wants to beat
(or that it is idle) and does its renewals in :meth:`Beater.beat`. The thread sleeps until the
earliest beat wanted, or until :meth:`Heartbeat.wake` says something new is tracked; with nothing
tracked it looks again every ``idle_check`` seconds. It starts on first use (so also in a forked
pool child, where the parent's thread does not exist) and :meth:`Heartbeat.stop` ends it (worker
shutdown, ``Durable.shutdown()``).

Why ``wake(at)`` and ``idle_check``: a wake-up is a thread switch, and a pool child tracks one
attempt per activity it runs. Waking the thread for each (it re-planned and slept again) cost
the activity a GIL hand-off in the middle of its store calls. Now :meth:`Heartbeat.wake` skips
the wake-up when the thread already plans to look again by ``at``; an engine's heartbeat idles
at the lease renewal interval, so an attempt tracked while it idles (the renewal it wants is an
interval away) never needs to wake it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Protocol

__all__ = ["Beater", "Heartbeat"]

log = logging.getLogger("celery_durable.heartbeat")

#: longest sleep with nothing to renew (by default)
_IDLE_CHECK = 60.0


class Beater(Protocol):
    def next_beat(self, now: float) -> float | None:
        """Monotonic time of the next beat wanted, or None when there is nothing to renew."""
        ...

    def beat(self) -> None:
        """Renew, time out, notice cancellations: one round."""
        ...


class Heartbeat:
    def __init__(self, name: str = "celery-durable-heartbeat", idle_check: float = _IDLE_CHECK) -> None:
        self.name = name
        self.idle_check = idle_check
        #: monotonic time by which the thread looks at its beaters again (None: not planned)
        self._planned: float | None = None
        self._beaters: list[Beater] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: the running thread and the event that stops it (one per thread: a stopped heartbeat
        #: starts a new thread on the next wake, while the old one finishes its round)
        self._thread: threading.Thread | None = None
        self._stop_thread = threading.Event()
        self._disabled = False
        self._pid = os.getpid()

    def add(self, beater: Beater) -> None:
        with self._lock:
            self._beaters.append(beater)

    def wake(self, at: float | None = None) -> None:
        """Something was tracked (or changed): start the thread if needed, re-plan the next beat.

        ``at`` (monotonic) is when the change wants its first beat, if known: a running thread
        that plans to look again by then is left asleep. The thread plans under ``_lock``, after
        the beaters' state it reads, so a change made before this call is either seen by that
        planning or meets the plan here.
        """
        with self._lock:
            if self._disabled:
                return
            alive = self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()
            if not alive:  # never started, stopped, or lost in a fork
                self._pid = os.getpid()
                self._planned = None
                self._stop_thread = threading.Event()
                self._thread = threading.Thread(
                    target=self._run, args=(self._stop_thread,), name=self.name, daemon=True
                )
                self._thread.start()
            elif at is not None and self._planned is not None and self._planned <= at:
                return
        self._wake.set()

    def stop(self, timeout: float = 2.0) -> None:
        """End the thread (it finishes the round it is in); a later :meth:`wake` starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
            self._stop_thread.set()
        self._wake.set()
        if thread is not None and thread is not threading.current_thread() and self._pid == os.getpid():
            thread.join(timeout)

    def disable(self) -> None:
        """Never run a thread (the simulation renews leases itself, as a scheduled action)."""
        self._disabled = True
        self.stop()

    @property
    def running(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive() and self._pid == os.getpid()

    def _run(self, stopped: threading.Event) -> None:
        while not stopped.is_set():
            now = time.monotonic()
            with self._lock:
                wanted = [(b, b.next_beat(now)) for b in self._beaters]
                due = [b for b, at in wanted if at is not None and at <= now]
                pending = [at for _, at in wanted if at is not None]
                # while beating, the stale plan (in the past) lets every wake() through; a beat
                # is followed by a fresh plan anyway
                if not due:
                    self._planned = min(pending) if pending else now + self.idle_check
            for beater in due:
                try:
                    beater.beat()
                except Exception:  # a heartbeat must outlive any one failure
                    log.exception("heartbeat round failed")
            if due:
                continue  # re-plan from the new state
            self._wake.wait(min(pending) - now if pending else self.idle_check)
            self._wake.clear()
