"""What reopening a failed execution on its history does besides the rewrite of ``retry`` or
``resume`` (engine/admin/operator.py): a cancel it was asked still stands, a terminate's cascade
is undone, and a step it keeps with no outcome is made to happen again when nothing else would
(``reset`` re-arms those too: engine/admin/reset.py).

An execution that ended with steps in flight (a terminate, a failure while a gather's other
activities run) leaves them to the scans, which settle them as the ended execution's: an activity's
retry or re-send is refused and its marker settled (no lease, nothing due; engine/drive/recovery.py),
a timer firing on it is cleared (engine/timers/clocks.py). Reopened, the run waits for those steps
again, and nothing would ever run or fire them: each is re-armed (sent again, due), as a resume
re-arms the steps a cancel interrupted.
"""

from __future__ import annotations

from typing import Any, TypeVar

from celery_durable.engine.admin.terminate import keep_cancel, reopen_terminated
from celery_durable.engine.documents.model import lease_live, run_of
from celery_durable.engine.documents.records import ExecDoc
from celery_durable.engine.documents.schema import DocType, StepKind, result_id, signal_outcome_id
from celery_durable.stores.base import Doc

__all__ = ["reopened", "stranded"]

R = TypeVar("R")


def reopened(admin: Any, ex: ExecDoc, docs: dict[str, Doc], rewrite: R) -> R:
    """``rewrite`` (a retry's or a failed execution's resume) with what reopening a failed execution
    adds: the cancel kept, a terminate's cascade undone (its children reopen with their steps:
    a retry, re-driving a terminated execution as it is, would fail again at once on their
    outcomes), the stranded steps re-armed (``admin._rearm``)."""
    keep_cancel(ex, rewrite)
    reopen_terminated(admin, ex, docs, rewrite)
    for marker in stranded(admin.engine.clock.now(), ex, docs, rewrite):
        admin._rearm(ex, marker, rewrite)
    return rewrite


def stranded(now: float, ex: ExecDoc, docs: dict[str, Doc], rewrite: Any) -> list[Doc]:
    """The markers of the current run the reopened execution keeps (neither deleted nor re-armed
    by ``rewrite``) with no outcome, no live lease and nothing due: activities, timers."""
    run = run_of(ex)
    touched = {d["id"] for d in [*rewrite.deletes, *rewrite.replaces]}
    out = []
    for d in docs.values():
        if d.get("type") != DocType.STEP or run_of(d) != run or d["id"] in touched:
            continue
        kind, seq = d.get("kind"), int(d.get("seq") or 0)
        if result_id(seq, run) in docs or (kind == StepKind.SIGNAL and signal_outcome_id(d, run) in docs):
            continue
        if d.get("due_kind") or lease_live(d, now):
            continue  # a scan or a running attempt takes it on
        if kind == StepKind.ACTIVITY or (kind in (StepKind.SLEEP, StepKind.SIGNAL) and d.get("fire_at") is not None):
            out.append(d)
    return sorted(out, key=lambda d: int(d.get("seq") or 0))
