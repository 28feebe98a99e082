"""Reset: re-run a failed or cancelled execution from a chosen step (``Admin.reset``).

The plan reuses the admin's rewrite machinery (``Admin._operate``): what the current run recorded
from the step on is deleted, a cancellation recorded before it is withdrawn (its interrupted
steps are armed again, as ``resume`` does), and an ``op:<n>`` document records the action. The
whole rewrite is written with the exec document, ``generation`` bumped, in batches of the
partition; the exec stays terminal until the last batch reopens it, so a racing drive (of a
terminal execution: it records nothing) never sees half of it, and caches read the partition
afresh.
"""

from __future__ import annotations

from typing import Any, Protocol

from celery_durable.engine.admin.cancel_withdrawal import cascaded, rearm_waiting_children
from celery_durable.engine.admin.oplog import actor, archived, next_op
from celery_durable.engine.admin.reopen import stranded
from celery_durable.engine.admin.terminate import reopen_terminated
from celery_durable.engine.admin.timeline import _int
from celery_durable.engine.documents.records import ExecDoc
from celery_durable.engine.documents.schema import EXEC_ID, DocType, Status, marker_id, operation_id, result_id
from celery_durable.engine.documents.search import run_start as search_run_start
from celery_durable.stores.base import Doc

__all__ = ["cancel_point", "delivered_cancel", "plan_reset", "reset_by"]


def reset_by() -> str:
    """Who resets, when the caller does not say: ``user@host`` of this process."""
    return actor()


def delivered_cancel(docs: dict[str, Doc], run: int) -> list[Doc]:
    """The outcomes a cancel delivered in ``run`` recorded (``cancelled``): empty when none was
    (the run may still have ended failed in a compensation, after one)."""
    return [d for d in docs.values() if d["id"] != EXEC_ID and d.get("cancelled") and _int(d.get("run")) == run]


def cancel_point(cancelled: list[Doc]) -> int:
    """The last step taken before the cancel that recorded these (cancelled) outcomes.

    Recorded as ``cancel_at``. Outcomes written before that was recorded fall back on the
    highest of their own steps: they are those pending at the suspension point, all taken
    before it (a step after them but before the point is forgotten: the best order can tell)."""
    points = [d["cancel_at"] for d in cancelled if isinstance(d.get("cancel_at"), int)]
    return min(points) if points else max(_int(d.get("seq")) for d in cancelled)


def _refuse_inside_compensations(refuse: type[Exception], ex: ExecDoc, docs: dict[str, Doc], step: int) -> None:
    """An execution whose run was cancelled (ended cancelled, or failed in a compensation) is not
    reset to a step after its cancel point: the steps between are
    what the cancel ran (compensations), which the re-run, its cancel withdrawn, would not take
    (it would meet them as steps its code does not call: non-deterministic)."""
    cancelled = delivered_cancel(docs, _int(ex.get("run")))
    if not cancelled:
        return
    at = cancel_point(cancelled)
    if step > at + 1:
        raise refuse(
            f"{ex['pk']} was cancelled after step {at}: its steps from {at + 1} on are what the cancel ran "
            f"(compensations), which a run without the cancel does not take; reset it to step {at + 1} or "
            f"earlier, or resume it"
        )


class Rewrite(Protocol):
    deletes: list[Doc]
    replaces: list[Doc]
    creates: list[Doc]
    fields: dict[str, Any]


class Planner(Protocol):
    """What a reset plan uses of ``Admin`` (typed here so this module does not import it)."""

    @property
    def engine(self) -> Any: ...

    def _forget_after(self, ex: ExecDoc, docs: dict[str, Doc], seq: int, rewrite: Any, keep: set[int]) -> None: ...

    def _rearm(self, ex: ExecDoc, marker: Doc, rewrite: Any, fresh: bool = False) -> None: ...


def _refuse_told_child(admin: Planner, refuse: type[Exception], ex: ExecDoc) -> None:
    """A child whose parent recorded its outcome is not reset alone: its re-run's outcome would
    reach nobody (the parent's step is decided, create-only), leaving the two disagreeing."""
    parent = ex.get("parent")
    if not isinstance(parent, dict) or not parent.get("pk"):
        return
    ppk, seq, run = str(parent["pk"]), _int(parent.get("seq")), _int(parent.get("run"))
    if ex.get("parent_notified") or admin.engine.store.read(ppk, result_id(seq, run)) is not None:
        raise refuse(
            f"{ex['pk']} is a child of {ppk} (step {seq}), which has recorded its outcome: reset "
            f"(or retry) the parent from step {seq} instead (it runs the child afresh)"
        )


def plan_reset(
    admin: Planner,
    rewrite: Rewrite,
    refuse: type[Exception],
    ex: ExecDoc,
    docs: dict[str, Doc],
    step: int,
    by: str,
    reason: str | None,
) -> None:
    """Fill ``rewrite`` to reset ``ex`` to ``step``; raises ``refuse`` when it does not apply."""
    OperationRefused = refuse  # noqa: N806 - the admin's exception class
    pk, status = str(ex["pk"]), ex.get("status")
    if status not in (Status.FAILED, Status.CANCELLED, Status.TIMED_OUT):
        raise OperationRefused(f"{pk} is {status}: reset applies to failed, cancelled or timed out executions")
    if isinstance(step, bool) or not isinstance(step, int):
        raise OperationRefused(f"step must be an integer, not {step!r}")
    run, steps = _int(ex.get("run")), _int(ex.get("steps"))
    if not 1 <= step <= steps + 1:
        raise OperationRefused(f"{pk} has steps 1 to {steps} in its current run: cannot reset to step {step}")
    _refuse_told_child(admin, refuse, ex)
    _refuse_inside_compensations(refuse, ex, docs, step)
    admin._forget_after(ex, docs, step - 1, rewrite, keep=set())
    gone = {d["id"] for d in rewrite.deletes}
    # a cancel delivered in this run (it ended cancelled, or failed in a compensation): its
    # cancelled outcomes go, and those of the children it cancelled; their steps run again
    delivered = delivered_cancel(docs, run)
    caused = cascaded(admin.engine, ex, docs) if delivered else []
    for d in delivered + caused:
        if d["id"] not in gone:
            rewrite.deletes.append(d)
            marker = docs.get(marker_id(_int(d.get("seq")), run))
            if marker is not None and marker["id"] not in gone:
                admin._rearm(ex, marker, rewrite, fresh=True)
    if delivered:
        rearm_waiting_children(admin, ex, docs, rewrite)
    reopen_terminated(admin, ex, docs, rewrite)  # kept child steps a terminate's cascade ended
    now = admin.engine.clock.now()
    for marker in stranded(now, ex, docs, rewrite):  # kept steps the scans settled while it had ended
        admin._rearm(ex, marker, rewrite)
    n = next_op(ex, docs)
    op = {
        "pk": pk,
        "id": operation_id(n),
        "type": DocType.OPERATION,
        "action": "reset",
        "by": by,
        "at": now,
        "step": step,
        "run": run,
        "status": status,
        "error": ex.get("error"),
        "reason": reason,
    }
    # the steps it forgets, archived as they were (engine/admin/oplog.py): nothing that ran is lost
    rewrite.creates += archived(admin.engine, op, docs, rewrite.deletes, run, list(getattr(rewrite, "forget", ())))
    # ``resets`` makes the ids of what the re-run sends again new (wf.signal_external's signal id)
    rewrite.fields.update(steps=step - 1, operations=n, resets=_int(ex.get("resets")) + 1, parent_notified=None)
    started_with = search_run_start(ex)  # the re-run's replay upserts again from what the run started with
    if started_with is not None:
        rewrite.fields["search"] = started_with
