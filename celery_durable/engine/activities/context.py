"""What a running activity attempt can know and say: heartbeats, their details, cancellation.

An attempt runs inside an :class:`ActivityContext` (entered by whoever runs it: the worker's
task, the test environment). ``activity.heartbeat(details)`` only records in memory, so it is
cheap enough to call in a tight loop. The process's one heartbeat thread
(engine/activities/leases.py) does the rest with the lease renewal it makes anyway, every
``durable_heartbeat_interval``: it writes the latest details into the step's marker (no store
call of its own; a retry's release writes them too) and, reading the marker, the step's outcome
and the exec in one ``read_many``, notices that the attempt should stop — the workflow was
cancelled (the cancel records the outcome of every step it waits on), ended or continued as new,
the step was reset, another attempt holds it. The next ``heartbeat()`` then raises
:class:`ActivityCancelled`; with ``cancellation="interrupt"`` it is raised at once, inside the
attempt's thread (an asynchronous exception, as for effect handlers).

``heartbeat_timeout``: an attempt that has not called ``heartbeat()`` for that long is stalled.
The heartbeat thread raises :class:`ActivityStalled` inside it (converted by the runner into
:class:`~celery_durable.errors.HeartbeatTimeoutError`, retried by the activity's retry options)
and stops renewing its lease, so an attempt stuck where no exception can land (a blocking C call)
still loses the step after ``durable_lease_ttl`` and the recovery scan sends it again.

Why ``BaseException``: a user's ``except Exception`` around a loop body must not swallow a
cancel, as with ``asyncio.CancelledError`` and DBOS's and Temporal's cancellations.
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from celery_durable.engine.activities.interrupts import async_raise
from celery_durable.errors import ConfigurationError, DurableError
from celery_durable.stores.base import utf8_json

if TYPE_CHECKING:
    from celery_durable.engine.documents.model import Attempt

__all__ = [
    "ActivityCancelled",
    "ActivityContext",
    "ActivityInfo",
    "ActivityInterrupt",
    "ActivityStalled",
    "CANCELLATION_MODES",
    "check_activity_options",
    "current",
    "heartbeat",
    "heartbeat_record",
    "info",
    "is_cancelled",
    "last_heartbeat_details",
]

#: raise :class:`ActivityCancelled` at the attempt's next ``heartbeat()`` (the default)
ON_HEARTBEAT = "heartbeat"
#: raise it at once inside the attempt's thread
INTERRUPT = "interrupt"
CANCELLATION_MODES = (ON_HEARTBEAT, INTERRUPT)


class ActivityInterrupt(BaseException):  # noqa: N818 - control flow, like KeyboardInterrupt
    """Raised inside a running activity attempt to stop it (never caught by ``except Exception``)."""


class ActivityCancelled(ActivityInterrupt):
    """The attempt should stop: its workflow was cancelled or ended, or the step was reset.

    Let it propagate (after cleaning up): nothing is recorded for the attempt beyond what the
    cancel recorded. An activity may also catch it and return a value, which is offered as the
    step's result (first writer wins: a cancel already recorded stays).
    """

    def __init__(self, reason: str = "cancelled") -> None:
        super().__init__(reason)
        self.reason = reason


class ActivityStalled(ActivityInterrupt):
    """The attempt sent no heartbeat within its ``heartbeat_timeout`` (the runner records or
    retries it as :class:`~celery_durable.errors.HeartbeatTimeoutError`)."""


def check_activity_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``heartbeat_timeout``, ``cancellation`` and ``pause_on_failure`` of ``@durable_activity``,
    checked at declaration."""
    out: dict[str, Any] = {}
    timeout = options.get("heartbeat_timeout")
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf"):
            raise ConfigurationError(f"heartbeat_timeout must be a number of seconds > 0, not {timeout!r}")
        out["heartbeat_timeout"] = float(timeout)
    mode = options.get("cancellation", ON_HEARTBEAT)
    if mode not in CANCELLATION_MODES:
        raise ConfigurationError(
            f"cancellation must be one of {', '.join(map(repr, CANCELLATION_MODES))}, not {mode!r}"
        )
    out["cancellation"] = mode
    hold = options.get("pause_on_failure")
    if hold is not None:
        if not isinstance(hold, bool):
            raise ConfigurationError(f"pause_on_failure must be True or False, not {hold!r}")
        if hold:
            out["pause_on_failure"] = True
    return out


@dataclass(frozen=True)
class ActivityInfo:
    """The running attempt (``activity.info()``)."""

    execution_id: str
    #: the step number in its workflow's run
    step: int
    run: int
    name: str
    #: 1 for the first attempt
    attempt: int
    heartbeat_timeout: float | None
    cancellation: str
    #: the last details an earlier attempt of this step sent with ``heartbeat()`` (None: none)
    heartbeat_details: Any


_NOTHING: Any = object()
#: the largest heartbeat details (their JSON, UTF-8): a cursor or a count, not the work itself
MAX_DETAILS_BYTES = 64 * 1024


def _check_json(details: Any) -> None:
    """JSON the store keeps as given, small: refuse here, in the caller, not later in the
    heartbeat thread (whose write would then fail with every renewal)."""
    try:
        text = utf8_json(json.dumps(details, allow_nan=False, ensure_ascii=False), "heartbeat details")
    except (TypeError, ValueError) as exc:  # ConfigurationError is a ValueError
        raise TypeError(f"heartbeat details must be JSON (lists, dicts, str, finite numbers …): {exc}") from exc
    size = len(text.encode("utf-8"))
    if size > MAX_DETAILS_BYTES:
        raise ValueError(f"heartbeat details are {size} bytes as JSON: at most {MAX_DETAILS_BYTES} (keep a cursor)")


def heartbeat_record(details: Any, now: float, attempt: int) -> dict[str, Any]:
    """The marker's ``heartbeat`` field: the details, when, from which attempt (a renewal writes
    it, and a retry's release)."""
    return {"details": details, "at": now, "attempt": attempt}


_current: contextvars.ContextVar[ActivityContext | None] = contextvars.ContextVar(
    "celery_durable_activity", default=None
)


class StallWatch(Protocol):
    """Who checks a context's stall deadline (engine/activities/stalls.py)."""

    def add(self, ctx: ActivityContext) -> None: ...

    def remove(self, ctx: ActivityContext) -> None: ...


class ActivityContext:
    """One attempt's heartbeat state; also the guard that lets it be interrupted."""

    def __init__(self, attempt: Attempt, info: ActivityInfo, stalls: StallWatch | None = None) -> None:
        self.attempt = attempt
        self.info = info
        self._stalls = stalls if info.heartbeat_timeout is not None else None
        self._lock = threading.Lock()
        #: the details no write carried yet, and the latest sent (what a retry's release writes)
        self._pending: Any = _NOTHING
        self._latest: Any = _NOTHING
        self._last_beat = time.monotonic()
        self.cancel_reason: str | None = None
        self.stalled = False
        self._thread: int | None = None
        self._active = False
        self._interrupted = False
        #: an ``async def`` activity's task and loop: interrupted by cancelling the task (at its
        #: next await), not by an exception into the loop's thread
        self._task: Any = None
        self._loop: Any = None
        #: the engine running the attempt (the library's own activities act on its store: batch.py)
        self.engine: Any = None
        #: values this attempt published (``activity.publish``: engine/activities/publish.py)
        self.published = 0
        self.publishing = threading.Lock()

    # --- the attempt's side ----------------------------------------------------------------

    def heartbeat(self, details: Any = None) -> None:
        if details is not None:
            _check_json(details)
        with self._lock:
            self._last_beat = time.monotonic()
            if details is not None:
                self._pending = self._latest = details
            reason = self.cancel_reason
        if reason is not None:
            raise ActivityCancelled(reason)

    def cancelled(self) -> bool:
        return self.cancel_reason is not None

    # --- the heartbeat thread's side -------------------------------------------------------

    def take_details(self) -> Any:
        """The details to write with the next renewal (``_NOTHING``: none new), taken."""
        with self._lock:
            pending, self._pending = self._pending, _NOTHING
            return pending

    def give_back(self, details: Any) -> None:
        """A renewal that could not write ``details``: keep them for the next, unless newer came."""
        with self._lock:
            if self._pending is _NOTHING:
                self._pending = details

    def latest_details(self) -> Any:
        """The latest details this attempt sent (``_NOTHING``: none), written or not: a retry's
        release writes them whatever a renewal in flight does with them."""
        with self._lock:
            return self._latest

    def deadline(self) -> float | None:
        """Monotonic time at which the attempt counts as stalled (None: no timeout, or stalled)."""
        timeout = self.info.heartbeat_timeout
        if timeout is None or self.stalled or not self._active:
            return None
        return self._last_beat + timeout

    def stall_if_due(self, now: float) -> bool:
        """Stop the attempt if its heartbeat deadline passed (once; no I/O)."""
        with self._lock:
            deadline = self.deadline()
            if deadline is None or now < deadline:
                return False
            self.stalled = True
        self._interrupt(ActivityStalled)
        return True

    def cancel(self, reason: str) -> None:
        """The attempt should stop: raise at its next heartbeat, or now (``interrupt`` mode)."""
        with self._lock:
            if self.cancel_reason is not None:
                return
            self.cancel_reason = reason
        if self.info.cancellation == INTERRUPT:
            self._interrupt(ActivityCancelled)

    def interruption(self) -> ActivityInterrupt | None:
        """What an ``async def`` activity's cancelled task raises instead (None: not interrupted)."""
        if self.stalled:
            return ActivityStalled()
        if self._interrupted and self.cancel_reason is not None:
            return ActivityCancelled(self.cancel_reason)
        return None

    def bind_task(self, task: Any, loop: Any) -> None:
        """The attempt runs as ``task`` on ``loop`` (an ``async def`` activity, maybe in a helper
        thread): interrupts cancel the task."""
        with self._lock:
            self._task, self._loop = task, loop
            pending = self._interrupted
        if pending:  # interrupted before its task existed
            loop.call_soon_threadsafe(task.cancel)

    def _interrupt(self, exc_type: type[BaseException]) -> None:
        with self._lock:
            if not self._active or self._interrupted or self._thread is None:
                return
            self._interrupted = True
            if self._task is not None:
                self._loop.call_soon_threadsafe(self._task.cancel)
            else:
                async_raise(self._thread, exc_type, f"activity {self.info.name}")

    # --- the guard around the call -----------------------------------------------------------

    def __enter__(self) -> ActivityContext:
        self._token = _current.set(self)
        with self._lock:
            self._thread = threading.get_ident()
            self._active = True
            self._last_beat = time.monotonic()
        if self._stalls is not None:
            self._stalls.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._stalls is not None:
                self._stalls.remove(self)
            with self._lock:
                self._active = False
                if self._interrupted and self._thread is not None and self._task is None:
                    async_raise(self._thread, None)  # drop an interrupt that has not landed yet
        finally:  # an interrupt landing in here must not leave this thread inside the attempt
            _current.reset(self._token)


def current() -> ActivityContext | None:
    """The attempt running in this thread (None outside an activity)."""
    return _current.get()


def _require(what: str) -> ActivityContext:
    ctx = _current.get()
    if ctx is None:
        raise DurableError(f"activity.{what}() is called from a durable activity's attempt (none runs here)")
    return ctx


def heartbeat(details: Any = None) -> None:
    """Say the attempt is alive; ``details`` (JSON, not None) are kept for the next attempt.
    Raises :class:`ActivityCancelled` when the attempt should stop. Outside an activity: a no-op,
    so a function can also be called as a plain function or task."""
    ctx = _current.get()
    if ctx is not None:
        ctx.heartbeat(details)
    elif details is not None:
        _check_json(details)  # the same refusal everywhere


def last_heartbeat_details(default: Any = None) -> Any:
    """The details the last earlier attempt of this step sent (``default``: none, or outside an
    activity, so the function also runs as a plain call)."""
    ctx = _current.get()
    details = None if ctx is None else ctx.info.heartbeat_details
    return default if details is None else details


def info() -> ActivityInfo:
    """What the running attempt is: its execution, step, attempt number, options."""
    return _require("info").info


def is_cancelled() -> bool:
    """Whether the attempt was asked to stop (``heartbeat()`` would raise)."""
    ctx = _current.get()
    return ctx is not None and ctx.cancelled()
