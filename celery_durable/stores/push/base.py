"""Pushed results: wake a waiter when an execution ends instead of polling the store (issues 14, 15).

The seam (docs/architecture.md §4, "Pushed results"):

* :class:`Notifier` — ``publish(execution_id)`` after the commit that ended an execution, and
  ``subscribe(execution_id)`` → a :class:`Waiter` whose ``wait(timeout)`` returns early when a
  notification for that id arrived (or the transport broke). A notification is only a *hint*:
  the waiter always re-reads the store, the truth.
* One implementation per transport: PostgreSQL ``LISTEN``/``NOTIFY``
  (:mod:`.postgres`; the ``NOTIFY`` is sent by the store *in the transaction* that writes
  the terminal exec, so it never precedes the data, and ``publish`` is a no-op), Redis pub/sub
  (:mod:`.redis`; published after the commit), and :class:`NoPush` — polling, today's
  behaviour (SQLite or Cosmos without Redis, or ``durable_result_push = "off"``).
  :func:`.selection.build_notifier` picks one.

No lost wake-up: a waiter is registered (and the transport's subscription confirmed) *before*
the caller's first read, so a notification sent after that read sets the waiter's event and the
next ``wait`` returns at once. A transport that fails (connection refused, LISTEN connection
killed) wakes its waiters and marks them not ``live``: the caller then polls on its own schedule,
and never hangs; a transport that stays down is retried in the background with a backoff, and
once it is back every waiter is woken to re-read and is pushed again.

One listener per process and notifier (one connection, one thread, shared by every waiter),
started on the first ``subscribe`` (workers that only publish never start it), restarted after
``fork()``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from celery_durable.errors import DurableTimeoutError
from celery_durable.settings import PUSH_MODES, REDIS_SCHEMES

__all__ = ["Notifier", "Waiter", "NoPush", "Hub", "payload_of", "wait_for", "PUSH_MODES", "REDIS_SCHEMES"]

log = logging.getLogger("celery_durable.push")

#: longest payload sent as is (PostgreSQL's NOTIFY payload limit is 8,000 bytes)
_MAX_PAYLOAD = 1000
#: how long a first ``subscribe`` waits for the listener to be subscribed before it polls instead
READY_TIMEOUT = 3.0
#: serialises the first ``subscribe`` of the threads of a forked child (one new state, one listener)
_FORK_LOCK = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().__setitem__("_FORK_LOCK", threading.Lock()))


def payload_of(execution_id: str) -> str:
    """What a notification for ``execution_id`` carries: the id, or for a very long one a digest."""
    if len(execution_id.encode("utf-8", "surrogatepass")) <= _MAX_PAYLOAD:
        return execution_id
    return "#" + hashlib.sha256(execution_id.encode("utf-8", "surrogatepass")).hexdigest()


class Waiter(Protocol):
    @property
    def live(self) -> bool:
        """Whether pushes reach this waiter (False: poll instead)."""
        ...

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` s; True if a notification (or a transport failure) woke it."""
        ...

    def close(self) -> None: ...


class Notifier(Protocol):
    #: ``postgres``, ``redis`` or ``off`` (logs, the bench)
    name: str

    def publish(self, execution_id: str) -> None:
        """Tell waiters ``execution_id`` changed (after the commit; never raises)."""
        ...

    def subscribe(self, execution_id: str, ready_timeout: float = READY_TIMEOUT) -> Waiter:
        """A waiter for ``execution_id``, subscribed before this returns (never raises); waits at
        most ``ready_timeout`` s for a listener that is starting (then the waiter polls)."""
        ...

    def close(self) -> None: ...


class _Sleeper:
    """A waiter without a transport: ``wait`` sleeps the whole timeout."""

    live = False

    def wait(self, timeout: float) -> bool:
        if timeout > 0:
            time.sleep(timeout)
        return False

    def close(self) -> None:
        pass


class NoPush:
    """Polling only (no transport)."""

    name = "off"

    def publish(self, execution_id: str) -> None:
        pass

    def subscribe(self, execution_id: str, ready_timeout: float = READY_TIMEOUT) -> Waiter:
        return _Sleeper()

    def close(self) -> None:
        pass


class _HubWaiter:
    def __init__(self, hub: Hub, key: str, generation: int) -> None:
        self._hub = hub
        self.key = key
        self.generation = generation
        self.event = threading.Event()

    @property
    def live(self) -> bool:
        return self.generation != 0 and self._hub.generation_live == self.generation

    def wait(self, timeout: float) -> bool:
        woken = self.event.wait(timeout) if timeout > 0 else self.event.is_set()
        # cleared after: a notification landing now is covered by the caller's next read (it was
        # sent after its commit), one landing after that read sets the event again
        self.event.clear()
        return woken

    def close(self) -> None:
        self._hub.remove(self)


class Hub:
    """The waiters of one process by payload, fed by one listener thread (:meth:`listen`).

    Subclasses implement :meth:`listen`: connect, subscribe, call ``ready()``, then pass every
    payload received to ``deliver`` until ``stopped()``; an exception means the transport broke.
    """

    name = "hub"

    def scrub(self, text: str) -> str:
        """``text`` of a transport error, safe to log (a transport with a secret in its URL hides it)."""
        return text

    def __init__(self) -> None:
        self._init_process()

    def _init_process(self) -> None:
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._waiters: dict[str, set[_HubWaiter]] = {}
        self._generation = 0
        #: the generation of the subscription that is up (0: none)
        self.generation_live = 0
        #: "idle" (no thread), "starting", "up", "down" (retrying in the background)
        self.state = "idle"
        self._stop = threading.Event()
        self._pid = os.getpid()
        self.deliveries = 0

    # --- the transport (subclasses) ----------------------------------------------------

    def listen(self, ready: Callable[[], None], deliver: Callable[[str], None], stopped: Callable[[], bool]) -> None:
        raise NotImplementedError

    # --- waiters -----------------------------------------------------------------------

    def subscribe(self, execution_id: str, ready_timeout: float = READY_TIMEOUT) -> Waiter:
        if os.getpid() != self._pid:
            with _FORK_LOCK:  # after fork: the parent's thread and waiters are not ours
                if os.getpid() != self._pid:
                    self._init_process()
        key = payload_of(execution_id)
        with self._lock:
            if self.state == "idle":
                self.state = "starting"
                name = f"celery_durable-{self.name}-listen"
                threading.Thread(target=self._run, args=(self._stop,), name=name, daemon=True).start()
            if self.state == "starting":
                # bounded by the caller's own timeout: a hung server must not outlast result(timeout=)
                self._changed.wait_for(lambda: self.state != "starting", timeout=min(READY_TIMEOUT, ready_timeout))
            waiter = _HubWaiter(self, key, self.generation_live)
            self._waiters.setdefault(key, set()).add(waiter)
        return waiter

    def remove(self, waiter: _HubWaiter) -> None:
        with self._lock:
            found = self._waiters.get(waiter.key)
            if found is not None:
                found.discard(waiter)
                if not found:
                    del self._waiters[waiter.key]

    def deliver(self, payload: str) -> None:
        with self._lock:
            self.deliveries += 1
            for waiter in self._waiters.get(payload, ()):
                waiter.event.set()

    def resync(self) -> None:
        """Wake every waiter to re-read the store (the subscription had a gap)."""
        with self._lock:
            self._wake_all()

    def _wake_all(self) -> None:
        """Every waiter re-reads the store now (held: ``_lock``)."""
        for waiters in self._waiters.values():
            for waiter in waiters:
                waiter.event.set()

    def _ready(self, stop: threading.Event) -> None:
        with self._lock:
            if stop is not self._stop:
                return  # a listener closed meanwhile
            self._generation += 1
            self.generation_live = self._generation
            self.state = "up"
            self._changed.notify_all()
            # waiters that were polling (the transport broke, or they came while it started) are
            # pushed again: woken to re-read now (what ended before this point), pushed after it
            for waiters in self._waiters.values():
                for waiter in waiters:
                    if waiter.generation != self._generation:
                        waiter.generation = self._generation
                        waiter.event.set()

    def _down(self, stop: threading.Event, state: str = "down") -> None:
        with self._lock:
            if stop is not self._stop:
                return
            self.generation_live = 0
            self.state = state
            self._changed.notify_all()
            self._wake_all()  # re-read now, then poll

    def _run(self, stop: threading.Event) -> None:
        backoff = 0.2
        while not stop.is_set():
            try:
                self.listen(lambda: self._ready(stop), self.deliver, stop.is_set)
            except Exception as exc:  # the transport broke: waiters poll until it is back
                if self.state != "down":
                    log.warning("result push (%s) unavailable, waiters poll: %s", self.name, self.scrub(str(exc)))
            if self.state == "up":
                backoff = 0.2
            self._down(stop)
            stop.wait(backoff)
            backoff = min(backoff * 2, 5.0)

    def close(self) -> None:
        """Stop the listener (its waiters poll); a later ``subscribe`` starts a new one."""
        with self._lock:  # one step: a subscribe in between would start a thread that stops at once
            stop, self._stop = self._stop, threading.Event()
            stop.set()
            self.generation_live = 0
            self.state = "idle"
            self._changed.notify_all()
            self._wake_all()  # re-read now, then poll


T = TypeVar("T")


def wait_for(
    notifier: Notifier,
    execution_id: str,
    ready: Callable[[], T | None],
    timeout: float | None,
    push_recheck: float,
    poll_max: float,
    late: Callable[[], str],
) -> T:
    """Wait until ``ready()`` (a store read) returns a value, woken by ``execution_id``'s
    notifications; raise ``DurableTimeoutError(late())`` after ``timeout`` s.

    Subscribed *before* the first read, so a change committed after any read wakes the next wait
    (no lost wake-up); a notification is only a hint: the store is read again each time. With a
    live push it is re-read every ``push_recheck`` s at least; without one (or once it failed)
    every 5% of the time waited so far (1 ms to ``poll_max``): a short wait ends within a few ms,
    a long one costs ~20 reads/s at most."""
    started = time.monotonic()
    deadline = None if timeout is None else started + timeout
    # a listener that is starting is waited for no longer than the caller's own timeout
    waiter = notifier.subscribe(execution_id, READY_TIMEOUT if timeout is None else min(READY_TIMEOUT, timeout))
    try:
        while (value := ready()) is None:
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise DurableTimeoutError(late())
            delay = push_recheck if waiter.live else min(poll_max, max(0.001, 0.05 * (now - started)))
            waiter.wait(delay if deadline is None else max(0.0, min(delay, deadline - now)))
        return value
    finally:
        waiter.close()
