"""The API used *inside* workflow functions (kept apart from the worker that runs them).

Everything here is deterministic under replay: values are recorded the first time and read
back afterwards. Outside a workflow these raise ``RuntimeError`` (except :func:`in_workflow`).
"""

from __future__ import annotations

import random as _random
import uuid as _uuid
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar

from .codecs import ValueCodec
from .engine.context import ContinueAsNew, DurableFuture, in_workflow, require_context

__all__ = [
    "now",
    "uuid4",
    "random",
    "gather",
    "sleep",
    "sleep_until",
    "start_timer",
    "wait_signal",
    "continue_as_new",
    "emit",
    "Saga",
    "in_workflow",
    "DurableFuture",
    "execution_id",
]

T = TypeVar("T")


def now() -> datetime:
    """The current time, recorded once (timezone-aware UTC)."""
    ctx = require_context("durable.now()")
    ts = ctx.side_effect("now", lambda: ctx.now)
    return datetime.fromtimestamp(float(ts), tz=UTC)


def uuid4() -> _uuid.UUID:
    """A random UUID, recorded once."""
    ctx = require_context("durable.uuid4()")
    return _uuid.UUID(ctx.side_effect("uuid", lambda: str(_uuid.uuid4())))


def random() -> _random.Random:
    """A ``random.Random`` seeded from a recorded seed: same numbers on every replay."""
    return require_context("durable.random()").random()


def gather(*items: Any) -> list[Any]:
    """Fan out, fan in: start every activity (signatures like ``task.s(x)`` or futures) and
    wait for all. Returns results in order; raises the first failure (by position) once all
    have finished. Accepts one iterable or several arguments."""
    ctx = require_context("durable.gather()")
    flat: Iterable[Any] = items[0] if len(items) == 1 and not _is_item(items[0]) else items
    return ctx.gather(flat)


def _is_item(obj: Any) -> bool:
    return isinstance(obj, DurableFuture) or isinstance(getattr(obj, "task", None), str)


def execution_id() -> str:
    """The id of the running execution."""
    return require_context("durable.execution_id()").execution_id


def _seconds(delay: timedelta | float) -> float:
    return delay.total_seconds() if isinstance(delay, timedelta) else float(delay)


def start_timer(delay: timedelta | float) -> DurableFuture[None]:
    """Start a durable timer and return its future (to race it against other steps)."""
    ctx = require_context("durable.start_timer()")
    return ctx.sleep_until(ctx.now + _seconds(delay))


def sleep(delay: timedelta | float) -> None:
    """Sleep durably: survives restarts; may last days (the store holds the clock, not the broker)."""
    start_timer(delay).result()


def sleep_until(when: datetime) -> None:
    """Sleep durably until ``when`` (a timezone-aware datetime; naive means UTC)."""
    ctx = require_context("durable.sleep_until()")
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    ctx.sleep_until(when.timestamp()).result()


def wait_signal(name: str, type: Any = None, timeout: timedelta | float | None = None) -> Any:  # noqa: A002
    """Wait for the next value of signal ``name`` and return it, typed by ``type`` (or the type
    declared with ``@durable.workflow(signals={...})``). Each call consumes one value, oldest
    first; a value sent before the workflow got here is kept and returned at once. With
    ``timeout``, raises :class:`DurableTimeoutError` if this wait's timer fires before a value
    was sent; the timeout ends only this wait (a later value goes to the next one)."""
    ctx = require_context("durable.wait_signal()")
    declared = type if type is not None else ctx.signal_types.get(name, Any)
    timeout_at = None if timeout is None else ctx.now + _seconds(timeout)
    return ctx.wait_signal(name, ValueCodec(declared), timeout_at).result()


def continue_as_new(*args: Any, **kwargs: Any) -> None:
    """Restart this workflow with new arguments and an empty history (same workflow id)."""
    ctx = require_context("durable.continue_as_new()")
    definition = ctx.registry.workflow(ctx.workflow)
    assert definition is not None
    raise ContinueAsNew(definition.codec.encode_args(args, kwargs))


def emit(
    type: str,  # noqa: A002
    payload: Any = None,
    *,
    key: str | None = None,
    effect_id: str | None = None,
    delay: timedelta | float = 0.0,
) -> str:
    """Enqueue an outbox effect from workflow code, exactly once (a durable step).

    ``payload`` is validated against the handler's declared type now (a bad one raises here, in
    the workflow). ``key`` is the ordering lane (default: this execution, so one workflow's
    effects run in call order); ``effect_id`` defaults to one derived from the execution and the
    step. Returns the effect id. The workflow does not wait for the effect to run.
    """
    ctx = require_context("durable.emit()")
    return ctx.emit(type, payload, key, effect_id, _seconds(delay))


class Saga:
    """Compensations that run, durably and in reverse order, when the block fails or is cancelled.

    >>> with Saga() as saga:
    ...     charge(order)
    ...     saga.add(refund, order.id)
    ...     ship(order)

    Each compensation is an activity call, hence a durable step: a crash in the middle of
    compensating resumes where it stopped. A compensation that fails is recorded and the
    others still run; the original error is re-raised afterwards.
    """

    def __init__(self) -> None:
        self._compensations: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = []
        #: errors raised by compensations (type name and message), for inspection
        self.failures: list[str] = []

    def add(self, compensation: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Register ``compensation(*args, **kwargs)`` (usually an activity) to undo a step."""
        self._compensations.append((compensation, args, kwargs))

    def compensate(self) -> None:
        """Run the registered compensations, last first."""
        from .errors import ActivityError

        for compensation, args, kwargs in reversed(self._compensations):
            try:
                compensation(*args, **kwargs)
            except ActivityError as exc:
                self.failures.append(f"{exc.type_name}: {exc.message}")

    def __enter__(self) -> Saga:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> Literal[False]:
        if exc is not None and isinstance(exc, Exception):
            self.compensate()
        return False
