"""Batch operations (``durable batch ACTION --workflow W --status S --search k=v --since 1d``).

An operator action applied to every execution a query selects, run as a durable workflow of its
own (``celery_durable.batch``: glue/batch.py), so it survives a killed worker, reports its
progress as its custom status and can be rate limited. This module is its engine side: the
checked description of a batch (:func:`batch_spec`) and one page of it (:func:`apply_page`): list
one page of the query (newest first, by the store's cursor), apply the action to each execution
with the operator's name, and say what happened to each (done, refused: why).

Each execution is acted on as ``durable <action> <id>`` would, recorded with the operator
``<by>@batch:<batch id>``: a refusal (a retry of an execution that is not failed, a cancel of one
that ended) is counted and named, never stops the batch. A page re-run after a crash (or a store
outage, which fails the page for its retry) skips the executions whose record says this batch
acted on them already, counting them done, so nothing is acted on twice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.codecs import ValueCodec
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.admin.pause import pause, unpause
from celery_durable.engine.admin.pending_ops import MAX_BY, check_field, check_signal_name
from celery_durable.engine.admin.terminate import terminate
from celery_durable.engine.documents.schema import Status
from celery_durable.errors import ConfigurationError, DurableError, StoreUnavailable

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
    check_field(ConfigurationError, "by", by)  # what every execution would refuse, refused here
    if len(by) > MAX_BY - 48:  # "@batch:<its id>" is added to it on each execution
        raise ConfigurationError(f"a batch's by is at most {MAX_BY - 48} characters, not {len(by)}")
    check_field(ConfigurationError, "reason", reason)
    if action == "signal" and signal:
        try:
            check_signal_name(signal)
        except DurableError as exc:
            raise ConfigurationError(str(exc)) from None
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
    if rate is not None:  # a page is acted on at once: at most a second's worth
        page_size = min(page_size, max(1, math.floor(rate)))
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
        actor = f"{options['by']}@batch:{me}"  # recorded on each target: "done by this batch"
        try:
            changed = _acted(engine, summary.id, actor) or _act(engine, admin, action, summary.id, options, actor)
        except StoreUnavailable:
            raise  # the page is retried (its activity's autoretry): acting again is safe (_acted)
        except Exception as exc:  # noqa: BLE001 - refused, purged, malformed: counted, named, never the end
            changed, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = "" if changed else "nothing to do (already so)"
        if changed:
            done += 1
        else:
            refused += 1
            errors = [*errors, [summary.id, why]][-MAX_ERRORS:]
    return {"cursor": page.cursor, "matched": matched, "done": done, "refused": refused, "errors": errors}


def _acted(engine: Engine, eid: str, actor: str) -> bool:
    """Did this batch act on ``eid`` already (a page acted on again after a killed worker)? Each
    action records its operator (``op:<n>``, ``by``) in the batch that acts: a retried page finds it
    and acts no second time (a second retry of an execution that failed again would re-run it)."""
    return any(d.get("type") == "operation" and d.get("by") == actor for d in engine.store.query_partition(eid).docs)


def _act(engine: Engine, admin: Admin, action: str, eid: str, options: Mapping[str, Any], by: str) -> bool:
    reason = options.get("reason")
    if action == "cancel":
        return engine.cancel(eid, by=by, reason=reason)
    if action == "terminate":
        return terminate(engine, eid, by, reason)
    if action == "pause":
        return pause(engine, eid, by, reason)
    if action == "unpause":
        return unpause(engine, eid, by, reason)
    if action == "signal":
        return _signal(engine, eid, str(options["signal"]), options.get("value"), by)
    if action == "retry":
        admin.retry(eid, by=by, reason=reason)
    elif action == "resume":
        admin.resume(eid, by=by, reason=reason)
    else:
        admin.reset(eid, int(options["step"]), by=by, reason=reason)
    return True


def _signal(engine: Engine, eid: str, name: str, value: Any, by: str) -> bool:
    """Send the batch's signal once: its id is the batch's and the target's, so a page acted on
    again (a killed worker) finds it recorded and sends nothing twice. Its value is checked against
    the workflow's declared type first, as ``durable signal`` checks it (a send with an id is not)."""
    check_signal_name(name)
    ex = engine.read_exec(eid)
    definition = engine.registry.workflow(str(ex.get("workflow")))
    declared = definition.signals.get(name) if definition is not None else None
    if declared is not None:
        ValueCodec(declared).encode(value, f"signal {name!r}")
    return engine.signals.signal(eid, name, value, signal_id=f"{by}:{eid}", by=by)
