"""Events and streams (issue 27 §4, first part): values a workflow records for readers outside.

``wf.publish(topic, value)`` appends to a stream and ``wf.set_event(key, value)`` sets an event
(the latest set is its value): each is a step of the workflow, recorded with the drive's commit
like ``wf.now()`` (its marker holds the value), so a replay records nothing twice and a value is
never seen that the workflow's history does not keep. Readers (``handle.stream(topic, offset)``,
``handle.get_event(key, timeout)``) read the execution's partition: a stream's values in step
order (an offset is a position in it), following it live until the execution ends. Only the
current run's values are kept: ``continue_as_new`` starts a new stream (a reader following it
goes on from the new stream's start), and a value published in the drive that continues as new
belongs to the run that ends there, which no reader sees once the new run starts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from celery_durable.codecs import ValueCodec, fresh
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.records import is_terminal, run_of
from celery_durable.engine.documents.schema import StepKind
from celery_durable.errors import DurableTimeoutError, PayloadValidationError, UnknownWorkflowError

if TYPE_CHECKING:
    from celery_durable.engine.replay.context import WorkflowContext
    from celery_durable.stores.base import Store

__all__ = ["record", "values", "follow", "latest", "check_reader", "check_name"]

_ANY = ValueCodec(Any)
MAX_NAME = 256
#: how often a reader looks again, at most (it starts at 10 ms, doubling)
POLL_MAX = 1.0


def check_name(what: str, name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise PayloadValidationError(f"a {what} is a string of 1-{MAX_NAME} characters, not {name!r:.60}")
    try:
        name.encode()
    except UnicodeEncodeError as exc:  # a surrogate: no store keeps it (the drive's commit would fail)
        raise PayloadValidationError(f"a {what} must be encodable as UTF-8: {exc}") from None
    return name


def check_reader(topic: str, offset: object) -> int:
    """A reader's topic and offset (an int >= 0), checked when it is asked for, not at its first value."""
    check_name("topic", topic)
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"a stream's offset is an int >= 0, not {offset!r:.60}")
    return offset


def record(ctx: WorkflowContext, kind: StepKind, name: str, value: Any) -> int:
    """Record ``value`` as step ``kind name`` (once: a replay finds it); its step number."""
    check_name("topic" if kind == StepKind.PUBLISH else "event key", name)
    seq, marker = ctx._step(kind, name)
    if marker is None:
        data = _ANY.encode(value, f"the value of {kind} {name!r}")
        ctx._marker(seq, kind, name, value=data)
    return seq


def values(store: Store, execution_id: str, kind: StepKind, name: str) -> tuple[list[Any], bool, int]:
    """The values recorded as ``kind name`` by the current run, in step order; whether the
    execution has ended (no more will come); the run. UnknownWorkflowError when there is no such
    execution."""
    docs = {d["id"]: d for d in store.query_partition(execution_id).docs}
    ex = docs.get(EXEC_ID)
    if ex is None:
        raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
    run = run_of(ex)
    found = sorted(
        (d for d in docs.values() if d.get("type") == "step" and d.get("kind") == kind and d.get("name") == name),
        key=lambda d: int(d.get("seq") or 0),
    )
    return [fresh(d.get("value")) for d in found if run_of(d) == run], is_terminal(ex), run


def follow(store: Store, execution_id: str, topic: str, offset: int, timeout: float | None) -> Iterator[Any]:
    """``handle.stream``: the stream's values from position ``offset``, as they are published,
    until the execution ends; DurableTimeoutError when ``timeout`` s pass with none new."""
    delay, quiet_since, following = 0.01, time.monotonic(), None
    while True:
        found, ended, run = values(store, execution_id, StepKind.PUBLISH, topic)
        if following is not None and run != following:
            offset = 0  # it continued as new: a new stream, read from its start
        following = run
        for value in found[offset:]:
            yield value
            offset += 1
            quiet_since, delay = time.monotonic(), 0.01
        if ended:
            return
        if timeout is not None and time.monotonic() - quiet_since >= timeout:
            raise DurableTimeoutError(f"nothing new on {topic!r} of {execution_id!r} for {timeout}s")
        time.sleep(delay)
        delay = min(POLL_MAX, delay * 2)


def latest(store: Store, execution_id: str, key: str, timeout: float | None) -> Any:
    """``handle.get_event``: the event's latest value, waiting for its first set up to ``timeout``
    s (``None``: no wait); DurableTimeoutError when it is still unset."""
    check_name("event key", key)
    delay, started = 0.01, time.monotonic()
    while True:
        found, ended, _ = values(store, execution_id, StepKind.EVENT, key)
        if found:
            return found[-1]
        if ended or timeout is None or time.monotonic() - started >= timeout:
            raise DurableTimeoutError(f"event {key!r} of {execution_id!r} is not set")
        time.sleep(delay)
        delay = min(POLL_MAX, delay * 2)
