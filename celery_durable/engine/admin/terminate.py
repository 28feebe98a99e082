"""Terminate: end a running execution now, running nothing more (Temporal's ``terminate``).

A cancel asks the workflow to stop: its next drive raises ``WorkflowCancelledError`` at its
suspension point and its compensations run. Terminate is for an execution that must not run
another line (a poison workflow, a runaway loop, code that cannot be fixed in time): one
etag-guarded batch makes it ``failed`` with ``WorkflowTerminated`` (who and why in the message)
and records the operator action, like any other (``op:<n>``). No compensation runs; an activity
still running finishes and its outcome is recorded late, changing nothing. Its running children
are terminated too, and its parent is told, as of any child that ended. It stays an ordinary
failed execution: ``resume`` (or ``retry``) reopens it on its recorded history, ``purge`` deletes
it (engine/admin/reopen.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from celery_durable.engine.admin.oplog import op_doc
from celery_durable.engine.admin.pause import PAUSED_FIELDS
from celery_durable.engine.admin.pending_ops import check_field
from celery_durable.engine.documents.model import DUE_EXEC, EXEC_ID, FAILED, run_of
from celery_durable.engine.documents.records import count_of, is_terminal, maybe_exec
from celery_durable.engine.documents.schema import CANCELLED_BY_PARENT, DocType, StepKind, marker_id, result_id
from celery_durable.errors import ConflictError, DurableError, OperationRefused, UnknownWorkflowError
from celery_durable.stores.base import Doc, Op, strip_reserved

__all__ = ["terminate", "TERMINATED", "keep_cancel", "reopen_terminated"]

log = logging.getLogger("celery_durable.operations")

#: the error type of a terminated execution
TERMINATED = "WorkflowTerminated"


def terminate(engine: Any, execution_id: str, by: str, reason: str | None = None) -> bool:
    """End ``execution_id`` now as failed (``WorkflowTerminated``), and its running children;
    False when it had already ended. ``by``/``reason`` are recorded with it."""
    check_field(OperationRefused, "by", by)  # before anything is written
    check_field(OperationRefused, "reason", reason)
    for _ in range(100):
        docs = {d["id"]: d for d in engine.store.query_partition(execution_id).docs}
        ex = maybe_exec(docs.get(EXEC_ID))
        if ex is None:
            raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
        if is_terminal(ex):
            return False
        now = engine.clock.now()
        message = f"terminated by {by}" + (f": {reason}" if reason else "")
        body = strip_reserved(ex)
        body.pop("waiting", None)
        body.update(
            status=FAILED,
            # "step": None: no step's failure ended it (a retry re-drives the workflow as it is)
            error={"type": TERMINATED, "message": message, "step": None, "run": run_of(ex)},
            completed_at=now,
            updated_at=now,
            lease=None,
            due_kind=None,
            due_at=None,
            operations=count_of(ex, "operations") + 1,
            **PAUSED_FIELDS,  # an ended execution is no longer paused
        )
        if ex.get("parent"):  # stays due until the parent has been told (as any child's end)
            body.update(parent_notified=False, due_kind=DUE_EXEC, due_at=now + engine.settings.drive_timeout)
        try:
            engine.store.batch(
                execution_id, [Op.replace(body, ex["_etag"]), Op.create(op_doc(ex, "terminate", by, reason, now))]
            )
        except ConflictError:
            continue  # a drive or another operator wrote meanwhile: look again
        engine.cache.invalidate(execution_id)
        engine.limits.release_execution(ex)  # its slot, or its place in its limit's queue
        log.warning(
            "workflow %s (%s) terminated by %s%s", ex.get("workflow"), execution_id, by, f": {reason}" if reason else ""
        )
        engine.emit("workflow_failed", execution_id=execution_id, workflow=ex.get("workflow"))
        for child in _running_children(docs, run_of(ex)):
            try:
                terminate(engine, child, by, _cascade_reason(execution_id))
            except DurableError as exc:  # the child ends on its own, or its parent's cancel scan sees it
                log.warning("child %s of terminated %s not terminated: %s", child, execution_id, exc)
        if ex.get("parent"):
            engine.children.notify_parent(execution_id)
        return True
    raise DurableError(f"could not terminate {execution_id!r}: too much contention")


def _running_children(docs: dict[str, Doc], run: int) -> list[str]:
    """The child executions the current run started (terminate asks each: an ended one says so).
    Not only those without an outcome: a delivered cancel records the step's outcome while the
    child still runs its compensations."""
    return [
        str(d["child_id"])
        for d in docs.values()
        if d.get("type") == "step" and d.get("kind") == StepKind.CHILD and d.get("run", 0) == run and d.get("child_id")
    ]


def _cascade_reason(execution_id: str) -> str:
    return f"its parent {execution_id} was terminated"


def keep_cancel(ex: Mapping[str, Any], rewrite: Any) -> None:
    """A reopened execution keeps a cancel it was asked (never downgraded): ``retry`` and a
    ``resume`` of a failed execution (a cancel pending when it was terminated, say)."""
    if ex.get("cancel_requested"):
        rewrite.fields.update(cancel_requested=True, **{CANCELLED_BY_PARENT: ex.get(CANCELLED_BY_PARENT)})


def reopen_terminated(admin: Any, ex: Mapping[str, Any], docs: dict[str, Doc], rewrite: Any) -> None:
    """``resume``, ``retry`` or ``reset`` of a terminated execution: the outcomes its terminate
    cascade gave the child steps it keeps (children terminated because it was) are forgotten and
    those steps re-armed, which reopens each child (``Admin._rearm``), as a resume of a cancelled
    parent resumes the children its cancel ended. Otherwise the reopened run would fail again at
    once. Outcomes ``rewrite`` deletes already (a reset's forgotten steps) are left to it."""
    error = ex.get("error")
    if not isinstance(error, dict) or error.get("type") != TERMINATED:
        return
    run, why = run_of(ex), _cascade_reason(str(ex["pk"]))

    def by_cascade(error: Any) -> bool:  # a child's error: terminated because this one was
        return isinstance(error, dict) and error.get("type") == TERMINATED and why in str(error.get("message"))

    gone = {d["id"] for d in rewrite.deletes}
    for d in list(docs.values()):
        if not (
            d.get("type") == DocType.RESULT
            and d.get("run", 0) == run
            and d.get("child_id")
            and by_cascade(d.get("error"))
        ):
            continue
        marker = docs.get(marker_id(int(d["seq"]), run))
        if marker is not None and d["id"] not in gone:
            rewrite.deletes.append(d)
            admin._rearm(ex, marker, rewrite)
    # children the cascade ended that have not told it yet (their report lost, left to the scan):
    # no outcome to forget, but reopened all the same — their late report of the life before is
    # then refused (the step counts one rerun more), not recorded as the reopened run's
    touched = gone | {d["id"] for d in rewrite.replaces}  # a reset's, or re-armed above
    for m in list(docs.values()):
        if not (
            m.get("type") == DocType.STEP
            and m.get("kind") == StepKind.CHILD
            and m.get("run", 0) == run
            and m.get("child_id")
            and result_id(int(m.get("seq") or 0), run) not in docs
            and m["id"] not in touched
        ):
            continue
        child = maybe_exec(admin.engine.store.read(str(m["child_id"]), EXEC_ID))
        if child is not None and child.get("status") == FAILED and by_cascade(child.get("error")):
            admin._rearm(ex, m, rewrite)
