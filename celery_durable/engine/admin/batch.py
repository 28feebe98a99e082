"""Batch operations (``durable batch ACTION --workflow W --status S --search k=v --since 1d``).

An operator action applied to every execution a query selects, run as a durable workflow of its
own (``celery_durable.batch``: glue/batch.py), so it survives a killed worker, reports its
progress as its custom status and can be rate limited. This module is its engine side: the
checked description of a batch (:func:`batch_spec`) and one page of it (:func:`apply_page`): list
one page of the query (newest first, by the store's cursor), apply the action to each execution
with the operator's name, and say what happened to each (done, refused: why).

Each execution is acted on as ``durable <action> <id>`` would: a refusal (a retry of an execution
that is not failed, a cancel of one that ended) is counted and named, never stops the batch. A
page re-run after a crash acts again on what it listed: every action is safe to repeat (a second
cancel or pause changes nothing; a second retry or resume is refused: it runs already).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.codecs import ValueCodec
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.admin.pending_ops import check_signal_name
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.documents.schema import Status
from celery_durable.errors import ConfigurationError, DurableError

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine

__all__ = ["ACTIONS", "BATCH_WORKFLOW", "MAX_ERRORS", "batch_spec", "apply_page"]

BATCH_WORKFLOW = "celery_durable.batch"
ACTIONS = ("cancel", "terminate", "retry", "resume", "reset", "pause", "unpause", "signal")
#: the refusals a batch keeps (the latest), with their execution ids
MAX_ERRORS = 20
MAX_PAGE = 500


def batch_spec(
    action: str,
    workflow: str | None = None,
    status: str | None = None,
    search: Mapping[str, Any] | None = None,
    since: float | None = None,
    *,
    by: str,
    reason: str | None = None,
    step: int | None = None,
    signal: str | None = None,
    value: Any = None,
    rate: float | None = None,
    page_size: int = 100,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(query, options)`` of a batch, checked in the caller (ConfigurationError) before it starts."""
    if action not in ACTIONS:
        raise ConfigurationError(f"a batch action is one of {', '.join(ACTIONS)}, not {action!r}")
    if status is not None and status not in {str(s) for s in Status}:
        raise ConfigurationError(f"unknown status {status!r}")
    if action == "reset" and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise ConfigurationError("a batch reset needs the step to reset to (an int >= 1)")
    if action == "signal" and not signal:
        raise ConfigurationError("a batch signal needs the signal's name")
    if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1e6):
        raise ConfigurationError(f"rate is executions per second, > 0, not {rate!r}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or not 1 <= page_size <= MAX_PAGE:
        raise ConfigurationError(f"page_size is 1-{MAX_PAGE}, not {page_size!r}")
    query = {"workflow": workflow, "status": status, "search": dict(search) if search else None, "since": since}
    options = {"by": by, "reason": reason, "step": step, "signal": signal, "value": value, "rate": rate}
    return query, options | {"page_size": page_size}


def apply_page(
    engine: Engine, action: str, query: Mapping[str, Any], cursor: str | None, options: Mapping[str, Any], me: str
) -> dict[str, Any]:
    """Act on one page of the query (after ``cursor``); ``me``: the batch's own execution id (never
    acted on). ``{"cursor": next or None, "matched", "done", "refused", "errors": [[id, why]…]}``."""
    admin = Admin(engine)
    page = admin.executions(
        workflow=query.get("workflow"),
        status=query.get("status"),
        created_after=query.get("since"),
        search=query.get("search"),
        limit=int(options.get("page_size") or 100),
        cursor=cursor,
    )
    done = refused = matched = 0
    errors: list[list[str]] = []
    for summary in page.executions:
        if summary.id == me or (summary.workflow == BATCH_WORKFLOW and query.get("workflow") != BATCH_WORKFLOW):
            continue  # a batch never acts on itself, nor on other batches unless asked to
        matched += 1
        try:
            changed = _act(engine, admin, action, summary.id, options, me)
        except DurableError as exc:  # refused, unknown (purged meanwhile): counted, named
            changed, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = "" if changed else "nothing to do (already so)"
        if changed:
            done += 1
        else:
            refused += 1
            errors = [*errors, [summary.id, why]][-MAX_ERRORS:]
    return {"cursor": page.cursor, "matched": matched, "done": done, "refused": refused, "errors": errors}


def _act(engine: Engine, admin: Admin, action: str, eid: str, options: Mapping[str, Any], me: str) -> bool:
    by, reason = str(options["by"]), options.get("reason")
    if action == "cancel":
        return engine.cancel(eid, by=by, reason=reason)
    if action == "terminate":
        return terminate(engine, eid, by, reason)
    if action == "pause":
        return pause(engine, eid, by, reason)
    if action == "unpause":
        return unpause(engine, eid, by, reason)
    if action == "signal":
        return _signal(engine, eid, str(options["signal"]), options.get("value"), by, me)
    if action == "retry":
        admin.retry(eid, by=by, reason=reason)
    elif action == "resume":
        admin.resume(eid, by=by, reason=reason)
    else:
        admin.reset(eid, int(options["step"]), by=by, reason=reason)
    return True


def _signal(engine: Engine, eid: str, name: str, value: Any, by: str, me: str) -> bool:
    """Send the batch's signal once: its id is the batch's and the target's, so a page acted on
    again (a killed worker) finds it recorded and sends nothing twice. Its value is checked against
    the workflow's declared type first, as ``durable signal`` checks it (a send with an id is not)."""
    check_signal_name(name)
    ex = engine.read_exec(eid)
    definition = engine.registry.workflow(str(ex.get("workflow")))
    declared = definition.signals.get(name) if definition is not None else None
    if declared is not None:
        ValueCodec(declared).encode(value, f"signal {name!r}")
    return engine.signals.signal(eid, name, value, signal_id=f"batch:{me}:{eid}", by=by)
