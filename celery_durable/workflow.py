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
from typing import Any, Literal, TypeVar, overload

from celery_durable.codecs import ValueCodec
from celery_durable.engine.documents import search
from celery_durable.engine.documents.schema import StepKind
from celery_durable.engine.replay import events, updates, versioning
from celery_durable.engine.replay.context import ContinueAsNew, DurableFuture, in_workflow, require_context
from celery_durable.engine.signals import channels

__all__ = [
    "now",
    "uuid4",
    "random",
    "gather",
    "sleep",
    "sleep_until",
    "start_timer",
    "wait_signal",
    "wait_any",
    "signal_external",
    "continue_as_new",
    "emit",
    "Saga",
    "in_workflow",
    "DurableFuture",
    "execution_id",
    "set_query_handler",
    "query",
    "set_status",
    "upsert_search",
    "patched",
    "deprecate_patch",
    "publish",
    "set_event",
    "set_update_handler",
    "update",
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


def publish(topic: str, value: Any) -> None:
    """Append ``value`` (JSON) to the stream ``topic`` of this execution, read outside with
    ``handle.stream(topic)`` (live); recorded once, as a step (engine/replay/events.py)."""
    events.record(require_context("durable.publish()"), StepKind.PUBLISH, topic, value)


def set_event(key: str, value: Any) -> None:
    """Set the event ``key`` of this execution to ``value`` (JSON): ``handle.get_event(key)``
    outside reads the latest set; recorded once, as a step (engine/replay/events.py)."""
    events.record(require_context("durable.set_event()"), StepKind.EVENT, key, value)


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


def wait_any(
    *names: str, types: dict[str, Any] | None = None, timeout: timedelta | float | None = None
) -> tuple[str, Any]:
    """Wait for the first value sent on any of ``names``; return ``(name, value)``.

    The oldest valid value across the names (arrival order) is consumed, recorded as one decision
    (replay returns the same pair); values of the other names stay for later waits. Types come
    from ``types`` or the workflow's declared ``signals``. With ``timeout``, raises
    :class:`DurableTimeoutError` when its timer fires before any value was sent."""
    ctx = require_context("durable.wait_any()")
    given = types or {}
    codecs = {n: ValueCodec(given.get(n, ctx.signal_types.get(n, Any))) for n in names}
    timeout_at = None if timeout is None else ctx.now + _seconds(timeout)
    return channels.wait_any(ctx, list(names), codecs, timeout_at)


def signal_external(workflow_id: str, name: str, value: Any = None) -> None:
    """Send signal ``name`` with ``value`` to execution ``workflow_id``, exactly once (a durable step).

    Sent after this drive's commit with an id derived from this execution, run and step, so a
    retried send is recorded once by the receiver. Returns once the receiver recorded it; raises
    :class:`ExternalSignalError` if the target does not exist, has ended, or does not declare
    ``name``."""
    ctx = require_context("durable.signal_external()")
    channels.signal_external(ctx, workflow_id, name, value).result()


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


F = TypeVar("F", bound=Callable[..., Any])


def set_query_handler(name: str, handler: Callable[..., Any]) -> None:
    """Register ``handler`` to answer ``handle.query(name, *args)`` with this workflow's state.

    Call it in the workflow body (again on every replay, as the code runs from the top); a query
    replays the history read-only and calls the handler registered by then with the query's
    arguments (checked against its type hints). A handler only reads: a durable call in it
    raises. Its result goes through its return hint's codec, as any result does."""
    ctx = require_context("durable.set_query_handler()")
    if not isinstance(name, str) or not name:
        raise ValueError(f"a query name must be a non-empty string, not {name!r}")
    if not callable(handler):
        raise TypeError(f"query handler {name!r} is not callable: {handler!r}")
    ctx.refuse_in_query(f"wf.set_query_handler({name!r})")
    ctx.query_handlers[name] = handler


@overload
def query(name: str) -> Callable[[F], F]: ...
@overload
def query(name: F) -> F: ...
def query(name: Any) -> Any:
    """Decorator form of :func:`set_query_handler` inside the workflow body: ``@wf.query("stage")``
    (or bare ``@wf.query``: the function's name)."""
    if callable(name):
        set_query_handler(name.__name__, name)
        return name

    def register(fn: F) -> F:
        set_query_handler(name, fn)
        return fn

    return register


def set_update_handler(name: str, handler: Callable[..., Any], *, validator: Callable[..., Any] | None = None) -> None:
    """Register ``handler`` for ``handle.update(name, *args)``: a request into this running
    workflow, answered with the handler's result once the workflow handled it.

    Call it in the workflow body, before the workflow first waits (again on every replay, as
    with query handlers). A request is decided where the workflow waits (a step's result):
    ``validator(*args)`` runs first (arguments checked against the handler's type hints) and, by
    raising, *rejects* it (:class:`UpdateRejectedError` for the caller; nothing is recorded in
    the history); otherwise ``handler(*args)`` runs — it may change the workflow's local state —
    and the update is recorded as a step, so a replay applies it again at the same point. Both
    are synchronous: a durable call in them raises ``RuntimeError``. See engine/replay/updates.py."""
    ctx = require_context("durable.set_update_handler()")
    updates.register(ctx, name, handler, validator)


def update(name: str, *, validator: Callable[..., Any] | None = None) -> Callable[[F], F]:
    """Decorator form of :func:`set_update_handler` inside the workflow body:
    ``@wf.update("add_item", validator=check)``."""

    def register(fn: F) -> F:
        set_update_handler(name, fn, validator=validator)
        return fn

    return register


def set_status(value: Any) -> None:
    """Set this execution's custom status (any JSON value), shown by ``handle.poll().custom_status``
    and ``celery durable show``. Recorded with the drive's commit when it changed; a replay
    recomputes it, so it always matches the history."""
    ctx = require_context("durable.set_status()")
    ctx.refuse_in_query("wf.set_status()")
    ctx.custom_status = ValueCodec(Any).encode(value, "custom status")
    ctx.status_set = True


def upsert_search(**attrs: Any) -> None:
    """Set (or, with ``None``, remove) this execution's search attributes, listed by
    ``durable.list_executions(search=...)`` and ``celery durable list --search``. Values: str,
    int, float, bool or a list of str (README "Search attributes and memo"); a bad one raises
    :class:`InvalidSearchAttribute` here. Recorded with the drive's commit when they change; a
    replay recomputes them, so they always match the history."""
    search.upsert(require_context("durable.upsert_search()"), attrs)


def patched(change_id: str) -> bool:
    """Versioning: True where this execution runs the new code of ``change_id``, False when
    replaying a history recorded before the change (take the old branch there). The first True
    records a marker step, so later replays answer True too; a history without it keeps its step
    numbers. See README "Versioning"."""
    return versioning.patched(require_context("durable.patched()"), change_id)


def deprecate_patch(change_id: str) -> None:
    """Versioning: the old branch of ``change_id`` is gone; histories that recorded its marker
    still replay (the marker is consumed here), new executions record nothing."""
    versioning.deprecate_patch(require_context("durable.deprecate_patch()"), change_id)


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
        from celery_durable.errors import ActivityError

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
