"""A workflow with start options (``Workflow.options(...)``): its id, search attributes, memo,
dedup key, deadline, delay and the limit it waits on, checked before anything is stored."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar

from celery_durable.engine.limits.spec import Limit, WorkflowQueueing, declare_limit
from celery_durable.engine.registry import WorkflowDef
from celery_durable.engine.replay.context import DurableFuture, require_context
from celery_durable.engine.signals.updates import check_timeout
from celery_durable.engine.starts import with_start
from celery_durable.engine.starts.deadlines import Timing
from celery_durable.engine.starts.dedup import OnConflict, check_dedup, check_on_conflict
from celery_durable.errors import ConfigurationError
from celery_durable.handle import WorkflowHandle

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine

__all__ = ["WorkflowOptions", "dedup_of", "queueing_of"]

P = ParamSpec("P")
R = TypeVar("R")


class Workflow(Protocol[P, R]):
    """What options start: ``celery_durable.app.Workflow`` (not imported: it imports this module)."""

    name: str
    definition: WorkflowDef

    def start_child(self, *args: Any, **kwargs: Any) -> DurableFuture[R]: ...

    def handle(self, workflow_id: str) -> WorkflowHandle[R]: ...

    def _start(
        self,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        workflow_id: str | None,
        search: dict[str, Any] | None = None,
        memo: Any = None,
        dedup: tuple[str, OnConflict] | None = None,
        timing: Timing | None = None,
        queueing: WorkflowQueueing | None = None,
    ) -> WorkflowHandle[R]: ...


def queueing_of(limit: Limit | None, key: str | int | None, priority: int | None) -> WorkflowQueueing | None:
    if limit is None and key is None and priority is None:
        return None
    return WorkflowQueueing(None if limit is None else declare_limit(limit), key, priority)


def dedup_of(key: str | None, on_conflict: str) -> tuple[str, OnConflict] | None:
    if key is not None:
        return check_dedup(key, on_conflict)
    if check_on_conflict(on_conflict) != OnConflict.REJECT:  # a policy with no key would do nothing
        raise ConfigurationError(f"on_conflict={on_conflict!r} needs a dedup_key")
    return None


class WorkflowOptions(Generic[P, R]):
    """A workflow with start options (``Workflow.options(...)``); ``start``/``start_child`` as there."""

    def __init__(
        self,
        workflow: Workflow[P, R],
        workflow_id: str | None,
        search: dict[str, Any] | None = None,
        memo: Any = None,
        dedup: tuple[str, OnConflict] | None = None,
        timing: Timing | None = None,
        queueing: WorkflowQueueing | None = None,
    ) -> None:
        self.workflow = workflow
        self.workflow_id = workflow_id
        self.search = search
        self.memo = memo
        self.dedup = dedup
        #: its deadline and start delay (engine/starts/deadlines.py)
        self.timing = timing
        #: the limit it waits on, its key and priority (engine/limits/workflows.py)
        self.queueing = queueing

    def start(self, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle[R]:
        for name in ("_workflow_id", "_search", "_memo"):  # given here, they would be the function's arguments
            if name in kwargs:
                raise ConfigurationError(f"{name}= with options(): give it to options() instead")
        return self.workflow._start(
            args, dict(kwargs), self.workflow_id, self.search, self.memo, self.dedup, self.timing, self.queueing
        )

    def _with_start(self, what: str, engine: Engine | None) -> tuple[WorkflowHandle[R], dict[str, Any]]:
        if self.workflow_id is None:
            raise ConfigurationError(f"{what} needs options(workflow_id=...): the execution it starts or reaches")
        if self.dedup is not None:
            raise ConfigurationError(f"{what} takes no dedup_key: the workflow id is the key")
        start = {"search": self.search, "memo": self.memo, "timing": self.timing, "queueing": self.queueing}
        handle = self.workflow.handle(self.workflow_id)
        if engine is not None:  # WorkflowEnvironment's
            handle = WorkflowHandle(engine, self.workflow_id, self.workflow.definition)
        return handle, start

    def signal_with_start(self, signal: str, value: Any, *args: P.args, **kwargs: P.kwargs) -> WorkflowHandle[R]:
        """Start the execution ``workflow_id(*args, **kwargs)`` with signal ``signal`` already
        sent, in one store batch, or, if it runs, send it the signal (its arguments unused:
        engine/starts/with_start.py). Raises :class:`ExecutionEndedError` when it has ended
        (nothing started, nothing recorded)."""
        return self.signal_with_start_on(None, signal, value, args, dict(kwargs))

    def signal_with_start_on(
        self, engine: Engine | None, signal: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> WorkflowHandle[R]:
        handle, start = self._with_start("signal_with_start", engine)
        definition = self.workflow.definition
        with_start.signal_with_start(handle._engine, definition, handle.id, signal, value, (args, kwargs), start)
        return handle

    def update_with_start(
        self,
        update: str,
        update_args: Sequence[Any] = (),
        *,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
        timeout: float | None = None,
        update_id: str | None = None,
    ) -> tuple[WorkflowHandle[R], Any]:
        """Start the execution ``workflow_id(*args, **kwargs)`` with update request
        ``update(*update_args)`` in one store batch, or send the update to the running one; wait
        for it to be handled. Returns the handle and the handler's answer (or raises as
        ``handle.update`` does). ``update_id``: a resent call finds the first request."""
        check_timeout(timeout)  # before the request is sent
        handle, n = self.send_update_with_start(None, update, update_args, args, kwargs, update_id)
        return handle, handle._engine.updates.outcome(handle.id, n, timeout)

    def send_update_with_start(
        self,
        engine: Engine | None,
        update: str,
        update_args: Sequence[Any],
        args: Sequence[Any],
        kwargs: dict[str, Any] | None,
        update_id: str | None = None,
    ) -> tuple[WorkflowHandle[R], int]:
        """``update_with_start`` without the wait: the handle and the request's number."""
        for what, given in (("update_args", update_args), ("args", args)):
            if isinstance(given, str | bytes) or not isinstance(given, Sequence):
                raise TypeError(f"{what} is a list or tuple of arguments, not {given!r:.60}")
        handle, start = self._with_start("update_with_start", engine)
        call = (tuple(args), dict(kwargs or {}))
        definition = self.workflow.definition
        n, _ = with_start.update_with_start(
            handle._engine, definition, handle.id, update, tuple(update_args), call, start, update_id
        )
        return handle, n

    def start_child(self, *args: P.args, **kwargs: P.kwargs) -> DurableFuture[R]:
        if self.search or self.memo is not None or self.dedup is not None:
            raise ConfigurationError(
                "search attributes, a memo and a dedup key are given at start to top-level executions "
                "only: a child sets its search attributes with wf.upsert_search"
            )
        if self.timing is not None and self.timing.start_delay:
            raise ConfigurationError("start_delay is for top-level starts: a workflow sleeps (wf.sleep) before a child")
        if self.queueing is not None:
            raise ConfigurationError(
                "limit=, limit_key= and priority= are for top-level starts: a child waits on its workflow's limit="
            )
        if self.timing is None:
            return self.workflow.start_child(*args, _workflow_id=self.workflow_id, **kwargs)
        ctx = require_context(f"{self.workflow.name}.start_child()")
        return ctx.start_child(self.workflow.definition, args, kwargs, self.workflow_id, self.timing.timeout)
