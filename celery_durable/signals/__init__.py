"""Signals: the library's own (built like Celery's) and the Celery receivers it installs.

Library signals are sent with ``sender`` = the workflow name (or activity name) and keyword
arguments as documented on each.
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "workflow_started",
    "workflow_suspended",
    "workflow_completed",
    "workflow_failed",
    "workflow_cancelled",
    "activity_completed",
    "activity_failed",
    "lease_lost",
    "recovery_redrive",
    "recovery_resend",
    "EVENT_SIGNALS",
]

workflow_started = Signal(name="workflow_started", providing_args={"execution_id", "workflow"})
workflow_suspended = Signal(name="workflow_suspended", providing_args={"execution_id", "workflow"})
workflow_completed = Signal(name="workflow_completed", providing_args={"execution_id", "workflow"})
workflow_failed = Signal(name="workflow_failed", providing_args={"execution_id", "workflow"})
workflow_cancelled = Signal(name="workflow_cancelled", providing_args={"execution_id", "workflow"})
activity_completed = Signal(name="activity_completed", providing_args={"execution_id", "seq", "activity", "attempts"})
activity_failed = Signal(name="activity_failed", providing_args={"execution_id", "seq", "activity", "attempts"})
lease_lost = Signal(name="lease_lost", providing_args={"execution_id", "seq"})
recovery_redrive = Signal(name="recovery_redrive", providing_args={"execution_id"})
recovery_resend = Signal(name="recovery_resend", providing_args={"execution_id", "seq", "activity"})

#: engine event name -> signal
EVENT_SIGNALS: dict[str, Signal] = {
    "workflow_started": workflow_started,
    "workflow_suspended": workflow_suspended,
    "workflow_completed": workflow_completed,
    "workflow_failed": workflow_failed,
    "workflow_cancelled": workflow_cancelled,
    "activity_completed": activity_completed,
    "activity_failed": activity_failed,
    "lease_lost": lease_lost,
    "recovery_redrive": recovery_redrive,
    "recovery_resend": recovery_resend,
}
