"""Handles: what ``start()`` returns and ``Durable.handle(id)`` builds."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from celery_durable.codecs import ValueCodec
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.oplog import actor
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.documents.model import CANCELLED, COMPLETED
from celery_durable.engine.documents.records import count_of
from celery_durable.engine.documents.schema import TERMINAL, Status
from celery_durable.engine.replay import events
from celery_durable.engine.replay.queries import answer_query
from celery_durable.engine.signals.updates import check_timeout
from celery_durable.errors import WorkflowCancelledError, WorkflowFailedError, WorkflowTimedOutError

if TYPE_CHECKING:
    from celery_durable.engine.admin.timeline import StepRecord
    from celery_durable.engine.core import Engine
    from celery_durable.engine.registry import WorkflowDef

__all__ = ["WorkflowHandle", "ExecutionInfo"]

R = TypeVar("R")


@dataclass(frozen=True)
class ExecutionInfo:
    """A snapshot of an execution (``handle.poll()``)."""

    id: str
    workflow: str
    status: str
    result: Any
    error: dict[str, Any] | None
    last_error: str | None
    steps: int
    cancel_requested: bool
    created_at: float
    updated_at: float
    #: the JSON value the workflow last set with ``wf.set_status`` (None if never)
    custom_status: Any = None
    #: the parent execution's id, for a child workflow
    parent_id: str | None = None
    #: its search attributes (``_search=`` at start, ``wf.upsert_search``) and memo (``_memo=``)
    search: dict[str, Any] = field(default_factory=dict)
    memo: Any = None
    #: when it times out (``options(timeout=)``, capped by a parent's; None: no deadline)
    deadline_at: float | None = None
    #: when a ``scheduled`` execution (``options(start_delay=)``) starts, or started
    start_at: float | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


class WorkflowHandle(Generic[R]):
    """Refers to one execution by id; cheap to create, safe to share."""

    def __init__(self, engine: Engine, workflow_id: str, definition: WorkflowDef | None = None) -> None:
        self._engine = engine
        self.id = workflow_id
        self._definition = definition

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.id}>"

    def poll(self) -> ExecutionInfo:
        """Read the execution's current state (one point read)."""
        doc = self._engine.read_exec(self.id)
        return ExecutionInfo(
            id=self.id,
            workflow=str(doc.get("workflow")),
            status=str(doc.get("status")),
            result=doc.get("result"),
            error=cast("dict[str, Any] | None", doc.get("error")),
            last_error=doc.get("last_error"),
            steps=count_of(doc, "steps"),
            cancel_requested=bool(doc.get("cancel_requested")),
            created_at=float(doc.get("created_at") or 0),
            updated_at=float(doc.get("updated_at") or 0),
            custom_status=doc.get("custom_status"),
            parent_id=str(parent["pk"]) if isinstance(parent := doc.get("parent"), dict) and parent.get("pk") else None,
            search=dict(search) if isinstance(search := doc.get("search"), dict) else {},
            memo=doc.get("memo"),
            deadline_at=_number(doc.get("deadline_at")),
            start_at=_number(doc.get("start_at")),
        )

    def query(self, name: str, *args: Any) -> Any:
        """Answer query ``name(*args)`` from the handler the workflow registered
        (``wf.set_query_handler``), on the state its history reaches. Read-only: the workflow is
        replayed in this process (its module must be imported here), nothing is written or sent.
        Raises :class:`UnknownQueryError` (naming the registered ones), :class:`QueryFailedError`
        (the handler raised; chained), :class:`HistoryUnavailableError` (history pruned)."""
        eng = self._engine
        return answer_query(eng.store, eng.registry, eng.settings, eng.clock, self.id, name, args)

    def status(self) -> str:
        """``scheduled``, ``queued``, ``running``, ``completed``, ``failed``, ``cancelled`` or ``timed_out``."""
        return self.poll().status

    def result(self, timeout: float | None = None) -> R:
        """Wait for the end; return the typed result or raise why it did not complete."""
        doc = self._engine.wait(self.id, timeout=timeout)
        status = doc.get("status")
        if status == COMPLETED:
            definition = self._definition or self._engine.registry.workflow(str(doc.get("workflow")))
            if definition is None:
                raw: R = doc.get("result")  # type: ignore[assignment]  # untyped: JSON as stored
                return raw
            decoded: R = definition.codec.decode_result(doc.get("result"))
            return decoded
        err = doc.get("error") or {}
        if status == Status.TIMED_OUT:
            raise WorkflowTimedOutError(f"workflow {self.id!r} timed out: its deadline passed")
        if status == CANCELLED:
            raise WorkflowCancelledError(f"workflow {self.id!r} was cancelled")
        raise WorkflowFailedError(self.id, str(err.get("type", "Error")), str(err.get("message", "")))

    def stream(self, topic: str, offset: int = 0, timeout: float | None = None) -> Iterator[Any]:
        """The values the workflow publishes on ``topic`` (``wf.publish``), from position
        ``offset``, followed live until the execution ends (``timeout``: at most that long with
        nothing new, then :class:`DurableTimeoutError`)."""
        return events.follow(self._engine.store, self.id, topic, events.check_reader(topic, offset), timeout)

    def get_event(self, key: str, timeout: float | None = None) -> Any:
        """The latest value the workflow set for event ``key`` (``wf.set_event``), waiting up to
        ``timeout`` s for its first; :class:`DurableTimeoutError` when it is not set."""
        return events.latest(self._engine.store, self.id, key, timeout)

    def signal(self, name: str, value: Any) -> bool:
        """Send signal ``name``; validated against the declared type here and kept until a wait
        consumes it (each wait takes the next value). False when the execution has ended."""
        return self._engine.signal(self.id, name, value)

    def update(
        self,
        name: str,
        *args: Any,
        timeout: float | None = None,
        update_id: str | None = None,
        result_type: Any = None,
    ) -> Any:
        """Send update ``name(*args)`` to the running workflow and return its handler's result
        once the workflow handled it (``wf.set_update_handler``): its JSON form, or decoded as
        ``result_type`` (the handler's return type: a model, a datetime, ...) when given. Raises
        :class:`UpdateRejectedError` (its validator refused it, or no such handler: nothing was
        recorded), :class:`UpdateFailedError` (the handler raised), :class:`UpdateRefusedError`
        (the execution has ended, or ended before handling it), :class:`DurableTimeoutError`
        after ``timeout`` s (the request stays and may still be handled). ``update_id``: a resend
        with the same id waits for the first request instead of sending another."""
        check_timeout(timeout)  # before the request is sent
        n = self._engine.updates.send(self.id, name, args, update_id=update_id)
        return answer_as(self._engine.updates.outcome(self.id, n, timeout), result_type)

    def reset(self, step: int, *, by: str | None = None, reason: str | None = None) -> list[StepRecord]:
        """Operator: re-run this failed or cancelled execution from step ``step`` (steps before it
        keep their outcomes); recorded as an action (``by``: who, default ``user@host``). Returns
        the steps that run again. Raises :class:`OperationRefused` when it does not apply."""
        return Admin(self._engine).reset(self.id, step, by=by, reason=reason)

    def terminate(self, *, by: str | None = None, reason: str | None = None) -> bool:
        """End the execution now, running nothing more (``Durable.terminate``); False if it had ended."""
        return terminate(self._engine, self.id, actor() if by is None else by, reason)

    def cancel(self, *, by: str | None = None, reason: str | None = None) -> bool:
        """Request cancellation; False if the execution had already ended. Recorded as an
        operator action (``by``: who, default ``user@host``)."""
        return self._engine.cancel(self.id, by=actor() if by is None else by, reason=reason)


def answer_as(answer: Any, result_type: Any) -> Any:
    """An update's answer (JSON) decoded as ``result_type``, or as it is when None."""
    if result_type is None:
        return answer
    return ValueCodec(result_type).decode(answer, "update answer")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None
