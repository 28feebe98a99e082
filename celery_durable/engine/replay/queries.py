"""Queries: read a workflow's state without changing it (README "Queries and custom status").

``handle.query(name, *args)`` reads the execution's documents (one partition read), replays the
workflow over them *read-only* — exactly as a drive would, but everything the replay decides
(new steps, sends) is discarded — and calls the handler the workflow code registered with
``wf.set_query_handler`` (or ``@wf.query``) on the state the code reached. Nothing is written,
nothing is sent; the replay runs in the caller's process, so the caller must have the workflow
registered (imported). Arguments and result go through the handler's codec, as over the wire:
validated against its type hints, JSON, and never aliasing the workflow's own objects.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.codecs import CallCodec
from celery_durable.engine.documents.checks import check_partition
from celery_durable.engine.documents.model import EXEC_ID, FAILED
from celery_durable.engine.documents.records import count_of, is_terminal, maybe_exec
from celery_durable.engine.outcomes import ReplayKind
from celery_durable.engine.replay.context import ContinueAsNew, Fatal, Suspend
from celery_durable.engine.replay.history import replay
from celery_durable.errors import (
    HistoryUnavailableError,
    PayloadValidationError,
    QueryFailedError,
    UnknownQueryError,
    UnknownWorkflowError,
)

if TYPE_CHECKING:
    from celery_durable.engine.documents.model import Clock
    from celery_durable.engine.registry import Registry
    from celery_durable.settings import Settings
    from celery_durable.stores.base import Store

__all__ = ["answer_query"]

#: a replay that fails with one of these could not reproduce the history: no state to query
_UNREPLAYABLE = ("NonDeterminismError", "CorruptDocument")


def answer_query(
    store: Store,
    registry: Registry,
    settings: Settings,
    clock: Clock,
    execution_id: str,
    name: str,
    args: tuple[Any, ...],
) -> Any:
    """Answer query ``name(*args)`` of ``execution_id`` from a read-only replay; never writes or sends."""
    docs = {d["id"]: d for d in store.query_partition(execution_id).docs}
    ex = maybe_exec(docs.get(EXEC_ID))
    if ex is None:
        raise UnknownWorkflowError(f"no execution with id {execution_id!r} (never started, or purged)")
    check_partition(execution_id, docs)  # CorruptDocument names the document
    workflow = str(ex.get("workflow"))
    definition = registry.workflow(workflow)
    if definition is None:
        known = ", ".join(registry.workflow_names()) or "none"
        raise UnknownWorkflowError(
            f"workflow {workflow!r} of {execution_id!r} is not registered in this process (registered: {known}): "
            "a query replays the workflow in the caller, so import the module that defines it"
        )
    result = replay(ex, docs, definition, registry, clock.now(), settings, read_only=True)
    recorded = count_of(ex, "steps")
    # an ended run's full history decides every step it takes: a replay that records anything
    # (a cancel delivered afresh, a step taken anew; patch markers of newer code aside) lacks part of it
    invented = result.context is not None and any(d.get("kind") != "patch" for d in result.context.new_docs.values())
    ended = is_terminal(ex)
    if (ended and (result.kind == ReplayKind.SUSPENDED or (recorded and invented))) or result.steps < recorded:
        raise HistoryUnavailableError(
            execution_id,
            name,
            f"the history of run {int(ex.get('run') or 0)} is incomplete ({recorded} steps recorded, the replay "
            f"found {result.steps}): it was pruned, or rewritten while it was read (retry the query then)",
        )
    error = result.error or {}
    if result.kind == ReplayKind.FAILED and error.get("type") in _UNREPLAYABLE and ex.get("status") != FAILED:
        raise QueryFailedError(execution_id, name, str(error["type"]), str(error.get("message", "")))
    handler = result.queries.get(name)
    if handler is None:
        raise UnknownQueryError(execution_id, name, sorted(result.queries))
    codec = CallCodec(handler)
    # as over the wire: bad arguments are refused here, in the caller (PayloadValidationError)
    call_args, call_kwargs = codec.decode_args(codec.encode_args(args, {}))
    ctx = result.context
    assert ctx is not None  # a read-only replay returns it
    ctx.answering = f"query handler {name!r}"
    try:
        with ctx:
            value = handler(*call_args, **call_kwargs)
            data = codec.result.encode(value, f"result of query {name!r}", "result")
    except PayloadValidationError as exc:
        raise QueryFailedError(execution_id, name, type(exc).__name__, str(exc)) from exc
    except (Suspend, Fatal, ContinueAsNew) as exc:  # a handler waited for a step or ended the run
        raise QueryFailedError(
            execution_id, name, "RuntimeError", "a query handler cannot wait or end the workflow"
        ) from exc
    except Exception as exc:
        raise QueryFailedError(execution_id, name, type(exc).__name__, str(exc)) from exc
    return codec.result.decode(data, f"result of query {name!r}")
