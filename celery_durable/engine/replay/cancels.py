"""The cancel a replay delivers at a suspension point: an operator's (or a parent's) cancel, or
an execution's deadline (``timed_out``: engine/starts/deadlines.py), which is a cancel raised as
:class:`WorkflowTimedOutError` (a :class:`WorkflowCancelledError`, so compensations run alike)."""

from __future__ import annotations

from celery_durable.errors import WorkflowCancelledError, WorkflowTimedOutError

__all__ = ["cancel_error", "cancelled", "TIMED_OUT_ERROR"]

#: the error type a deadline's delivered cancel records on the outcomes of the steps it ended
TIMED_OUT_ERROR = "WorkflowTimedOutError"


def cancel_error(timed_out: bool) -> dict[str, str]:
    """The error a delivered cancel records as its pending steps' outcome."""
    if timed_out:
        return {"type": TIMED_OUT_ERROR, "message": "deadline reached"}
    return {"type": "WorkflowCancelledError", "message": "cancel requested"}


def cancelled(execution_id: str, timed_out: bool) -> WorkflowCancelledError:
    """The exception a delivered cancel raises in the workflow."""
    if timed_out:
        return WorkflowTimedOutError(f"workflow {execution_id!r} timed out: its deadline passed")
    return WorkflowCancelledError(f"workflow {execution_id!r} was cancelled")
