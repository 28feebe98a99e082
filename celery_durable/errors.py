"""The library's error tree.

Backend exceptions (sqlite3, azure-cosmos) are translated into these at the store boundary
(``raise StoreUnavailable(...) from exc``) so the engine and user code never see a raw SDK
error. Engine control flow that user code must not swallow lives in ``engine`` as
``BaseException`` subclasses, not here.
"""

from __future__ import annotations

__all__ = [
    "DurableError",
    "OperationRefused",
    "ConfigurationError",
    "StoreError",
    "ConflictError",
    "NotFoundError",
    "DocumentTooLarge",
    "PayloadTooLarge",
    "StoreUnavailable",
    "Throttled",
    "CorruptDocument",
    "PayloadValidationError",
    "UnknownWorkflowError",
    "InvalidWorkflowId",
    "InvalidSearchAttribute",
    "NonDeterminismError",
    "WorkflowFailedError",
    "WorkflowCancelledError",
    "WorkflowTimedOutError",
    "ActivityError",
    "HeartbeatTimeoutError",
    "ChildWorkflowError",
    "ExternalSignalError",
    "NonRetryableError",
    "DurableTimeoutError",
    "IdempotencyConflict",
    "DuplicateStart",
    "LaneFull",
    "QueryFailedError",
    "UnknownQueryError",
    "HistoryUnavailableError",
    "UpdateRejectedError",
    "UpdateFailedError",
    "UpdateRefusedError",
    "ExecutionEndedError",
]


class DurableError(Exception):
    """Base class of every error raised by celery_durable."""


class ConfigurationError(DurableError, ValueError):
    """A setting or URL is invalid."""


# --- store errors -------------------------------------------------------------------------


class StoreError(DurableError):
    """Base class of storage errors."""


class ConflictError(StoreError):
    """An optimistic-concurrency check failed (stale etag, missing document, or id taken)."""


class NotFoundError(StoreError):
    """The document does not exist."""


class DocumentTooLarge(StoreError):
    """The document exceeds the store's size limit (2 MB, Cosmos' limit, on every backend)."""

    def __init__(self, doc_id: str, size: int, limit: int) -> None:
        super().__init__(f"document {doc_id!r} is {size} bytes; the limit is {limit} bytes")
        self.doc_id = doc_id
        self.size = size
        self.limit = limit


class PayloadTooLarge(DocumentTooLarge):
    """A payload (activity or workflow result, workflow input, signal value, effect payload) is
    larger than ``durable_max_payload``, even offloaded into chunk documents. Recorded as a
    non-retryable failure of the activity or workflow; raised in the caller of ``start()`` or
    ``signal()``."""

    def __init__(self, doc_id: str, size: int, limit: int) -> None:
        super().__init__(doc_id, size, limit)
        self.args = (f"document {doc_id!r} is {size} bytes, over durable_max_payload ({limit} bytes)",)


class StoreUnavailable(StoreError):
    """The store could not be reached or answered with a server error; the operation may be retried."""


class Throttled(StoreUnavailable):
    """The store asked us to slow down (Cosmos 429) and retries were exhausted."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class CorruptDocument(StoreError):
    """A stored document could not be decoded."""


# --- workflow errors ----------------------------------------------------------------------


class PayloadValidationError(DurableError, ValueError):
    """A payload, signal value or effect payload does not match its declared type.

    Raised in the caller (``start()``, ``signal()``, ``enqueue()``) before anything is stored.
    """


class InvalidSearchAttribute(DurableError, ValueError):
    """A search attribute (``start(..., _search=)``, ``wf.upsert_search``, a listing filter) or a
    memo cannot be used: a key that is not an identifier of at most 64 characters, a value that is
    not a string (at most 256 characters), a safe integer, a finite float, a bool or a list of
    strings, or a memo over its size limit. Raised in the caller before anything is stored."""


class InvalidWorkflowId(DurableError, ValueError):
    """A workflow id given to ``start()`` or ``start_child()`` cannot be used (empty, not a string,
    too long, a control character, a reserved prefix or the form of a derived child id).

    Raised in the caller before anything is stored; the rules are in the README ("Workflow ids")."""


class UnknownWorkflowError(DurableError):
    """No workflow of that name is registered in this process."""


class NonDeterminismError(DurableError):
    """Replay met a different step than the one recorded in the history."""


class WorkflowFailedError(DurableError):
    """The workflow ended with an error; ``type_name`` and ``message`` describe the cause."""

    def __init__(self, workflow_id: str, type_name: str, message: str) -> None:
        super().__init__(f"workflow {workflow_id!r} failed: {type_name}: {message}")
        self.workflow_id = workflow_id
        self.type_name = type_name
        self.message = message


class WorkflowCancelledError(DurableError):
    """The workflow was cancelled (raised by ``handle.result()``, and inside the workflow)."""


class HeartbeatTimeoutError(DurableError):
    """An activity attempt did not call ``activity.heartbeat()`` within its ``heartbeat_timeout``.

    What the attempt fails with (an ``Exception``: Celery's ``autoretry_for`` retries it like any
    other failure); the workflow sees it as an :class:`ActivityError` of this type once retries end.
    """


class WorkflowTimedOutError(WorkflowCancelledError):
    """The workflow's deadline passed (``options(timeout=)``): raised inside the workflow at its
    suspension point, as a cancel is (compensations run), and by ``handle.result()`` once it ended
    ``timed_out``. A :class:`WorkflowCancelledError`, so code that cleans up on a cancel cleans up
    on a timeout too (docs/guides/deadlines.md)."""


class ActivityError(DurableError):
    """An activity failed after its retries; raised inside the workflow at the call site.

    Carries the original exception's type name and message so the workflow can decide to
    compensate without importing the activity's exception classes.
    """

    def __init__(self, activity: str, type_name: str, message: str, attempts: int) -> None:
        super().__init__(f"activity {activity!r} failed after {attempts} attempt(s): {type_name}: {message}")
        self.activity = activity
        self.type_name = type_name
        self.message = message
        self.attempts = attempts


class ChildWorkflowError(DurableError):
    """A child workflow failed; raised in the parent at the point it waits for the child."""

    def __init__(self, workflow: str, child_id: str, type_name: str, message: str) -> None:
        super().__init__(f"child workflow {workflow!r} ({child_id}) failed: {type_name}: {message}")
        self.workflow = workflow
        self.child_id = child_id
        self.type_name = type_name
        self.message = message


class ExternalSignalError(DurableError):
    """``wf.signal_external`` could not deliver: the target does not exist, has ended, or does not
    declare the signal. Raised inside the sending workflow at the call site."""

    def __init__(self, signal: str, target: str, type_name: str, message: str) -> None:
        super().__init__(f"signal {signal!r} to {target!r} failed: {type_name}: {message}")
        self.signal = signal
        self.target = target
        self.type_name = type_name
        self.message = message


class NonRetryableError(DurableError):
    """Raise (or subclass) in an activity to fail at once, skipping Celery's autoretry."""


class DurableTimeoutError(DurableError, TimeoutError):
    """Waiting for a result took longer than the caller allowed (also a builtin ``TimeoutError``)."""


class IdempotencyConflict(DurableError):
    """An effect id was enqueued again with a different type, key or payload (as Stripe refuses an
    idempotency key reused with different parameters). The first enqueue stands.

    ``pending`` is True when that first enqueue has not finished (its row is not written yet):
    it may still fail and free the id."""

    def __init__(self, message: str, pending: bool = False) -> None:
        super().__init__(message)
        self.pending = pending


class DuplicateStart(DurableError):
    """A start with a dedup key (``options(dedup_key=...)``) found an execution with that key still
    running, and its ``on_conflict`` is ``"reject"``. ``existing`` is that execution's id."""

    def __init__(self, message: str, key: str, existing: str) -> None:
        super().__init__(message)
        self.key = key
        self.existing = existing


class LaneFull(DurableError):
    """A key has as many live effects as it may hold (``durable_outbox_max_lane_backlog``, or the
    size its lane's head document may reach in the store). Nothing was written."""


# --- queries ---------------------------------------------------------------------------------


class QueryFailedError(DurableError):
    """A query (``handle.query(name, ...)``) could not be answered: its handler raised (``type_name``
    and ``message`` say what, the original exception is chained), or the workflow could not be
    replayed to answer it. Nothing was written or sent either way."""

    def __init__(self, workflow_id: str, query: str, type_name: str, message: str) -> None:
        super().__init__(f"query {query!r} of workflow {workflow_id!r} failed: {type_name}: {message}")
        self.workflow_id = workflow_id
        self.query = query
        self.type_name = type_name
        self.message = message


class UnknownQueryError(QueryFailedError, LookupError):
    """The workflow registered no query handler of that name (by the point its history reaches);
    ``registered`` lists the names it did register."""

    def __init__(self, workflow_id: str, query: str, registered: list[str]) -> None:
        names = ", ".join(repr(n) for n in registered) or "none"
        super().__init__(
            workflow_id, query, "UnknownQueryError", f"no query handler named {query!r} (registered: {names})"
        )
        self.registered = registered


class HistoryUnavailableError(QueryFailedError):
    """The execution's history is no longer complete (pruned, or rewritten while it was read), so
    it cannot be replayed to answer a query. Its status, result and custom status stay readable
    with ``handle.poll()``."""

    def __init__(self, workflow_id: str, query: str, message: str) -> None:
        super().__init__(workflow_id, query, "HistoryUnavailableError", message)


# --- updates ---------------------------------------------------------------------------------


class UpdateRejectedError(DurableError):
    """An update (``handle.update(name, ...)``) was rejected by the workflow: its validator
    raised, its arguments did not fit the handler, or the workflow has no handler of that name.
    Nothing of it entered the workflow's history."""

    def __init__(self, workflow_id: str, update: str, type_name: str, message: str) -> None:
        super().__init__(f"update {update!r} of workflow {workflow_id!r} was rejected: {type_name}: {message}")
        self.workflow_id = workflow_id
        self.update = update
        self.type_name = type_name
        self.message = message


class UpdateFailedError(DurableError):
    """An accepted update's handler raised (``type_name``, ``message``): it is part of the
    workflow's history, and whatever the handler changed before raising stays changed."""

    def __init__(self, workflow_id: str, update: str, type_name: str, message: str) -> None:
        super().__init__(f"update {update!r} of workflow {workflow_id!r} failed: {type_name}: {message}")
        self.workflow_id = workflow_id
        self.update = update
        self.type_name = type_name
        self.message = message


class UpdateRefusedError(DurableError):
    """An update cannot be delivered: the execution had ended when it was sent, or ended (not by
    continue-as-new) before it handled the request."""

    def __init__(self, workflow_id: str, update: str, reason: str) -> None:
        super().__init__(f"update {update!r} of workflow {workflow_id!r} refused: {reason}")
        self.workflow_id = workflow_id
        self.update = update
        self.reason = reason


class ExecutionEndedError(DurableError):
    """A signal-with-start found its execution ended: nothing was started, the signal was not
    recorded (ids are never reused; start another id)."""

    def __init__(self, workflow_id: str, reason: str) -> None:
        super().__init__(f"workflow {workflow_id!r}: {reason}")
        self.workflow_id = workflow_id
        self.reason = reason


class OperationRefused(DurableError, ValueError):
    """An operator operation (retry, resume, reset, cancel, purge) does not apply to the
    execution in its current state, or its input (``by``, ``reason``, ...) cannot be recorded as
    given: nothing was written. Also importable from ``celery_durable.engine.admin.operator``."""
