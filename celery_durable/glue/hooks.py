"""Signals: the library's own (built like Celery's) and the Celery receivers it installs.

Connect as with Celery's: ``@workflow_completed.connect def on_done(sender, execution_id, **kw)``.
``sender`` is the workflow name (activity name for activity signals). Keyword arguments:

=======================  =======================================================
signal                   arguments
=======================  =======================================================
workflow_started         execution_id, workflow
workflow_suspended       execution_id, workflow (a drive ended waiting on steps)
workflow_completed       execution_id, workflow
workflow_failed          execution_id, workflow
workflow_cancelled       execution_id, workflow
workflow_timed_out       execution_id, workflow (its deadline passed: ``options(timeout=)``)
workflow_continued       execution_id, workflow (continue-as-new)
activity_completed       execution_id, seq, activity, attempts
activity_failed          execution_id, seq, activity, attempts (after the last retry)
activity_cancelled       execution_id, seq, activity, reason (an attempt stopped: ActivityCancelled)
activity_stalled         execution_id, seq (no heartbeat within its heartbeat_timeout)
timer_fired              execution_id, seq, lateness (seconds)
signal_received          execution_id, name
signal_ignored           execution_id, name, reason
signal_rejected          execution_id, name, reason (the value did not match the wait's type)
lease_lost               execution_id, seq
recovery_redrive         execution_id
recovery_resend          execution_id, seq, activity
effect_enqueued          effect_id, key, effect_type
effect_claimed           effect_id, key, attempt, effect_type
effect_settled           effect_id, key, outcome, attempt
effect_cancelled         effect_id, key, was
effect_lease_lost        effect_id, key
effect_requeued          effect_id, key (worker lost, replay-safe)
effect_failed            effect_id, key, reason (worker lost, process-bound)
=======================  =======================================================

They fire in the process where the event happens (usually a worker).
"""

from __future__ import annotations

from celery.utils.dispatch import Signal

__all__ = [
    "workflow_started",
    "workflow_suspended",
    "workflow_completed",
    "workflow_failed",
    "workflow_cancelled",
    "workflow_timed_out",
    "activity_completed",
    "activity_failed",
    "activity_cancelled",
    "activity_stalled",
    "workflow_continued",
    "timer_fired",
    "signal_received",
    "signal_ignored",
    "signal_rejected",
    "lease_lost",
    "recovery_redrive",
    "recovery_resend",
    "effect_enqueued",
    "effect_claimed",
    "effect_settled",
    "effect_cancelled",
    "effect_lease_lost",
    "effect_requeued",
    "effect_failed",
    "EVENT_SIGNALS",
]

workflow_started = Signal(name="workflow_started", providing_args={"execution_id", "workflow"})
workflow_suspended = Signal(name="workflow_suspended", providing_args={"execution_id", "workflow"})
workflow_completed = Signal(name="workflow_completed", providing_args={"execution_id", "workflow"})
workflow_failed = Signal(name="workflow_failed", providing_args={"execution_id", "workflow"})
workflow_cancelled = Signal(name="workflow_cancelled", providing_args={"execution_id", "workflow"})
workflow_timed_out = Signal(name="workflow_timed_out", providing_args={"execution_id", "workflow"})
activity_completed = Signal(name="activity_completed", providing_args={"execution_id", "seq", "activity", "attempts"})
activity_failed = Signal(name="activity_failed", providing_args={"execution_id", "seq", "activity", "attempts"})
activity_cancelled = Signal(name="activity_cancelled", providing_args={"execution_id", "seq", "activity", "reason"})
activity_stalled = Signal(name="activity_stalled", providing_args={"execution_id", "seq"})
workflow_continued = Signal(name="workflow_continued", providing_args={"execution_id", "workflow"})
timer_fired = Signal(name="timer_fired", providing_args={"execution_id", "seq", "lateness"})
signal_received = Signal(name="signal_received", providing_args={"execution_id", "name"})
signal_ignored = Signal(name="signal_ignored", providing_args={"execution_id", "name", "reason"})
signal_rejected = Signal(name="signal_rejected", providing_args={"execution_id", "name", "reason"})
lease_lost = Signal(name="lease_lost", providing_args={"execution_id", "seq"})
recovery_redrive = Signal(name="recovery_redrive", providing_args={"execution_id"})
recovery_resend = Signal(name="recovery_resend", providing_args={"execution_id", "seq", "activity"})

effect_enqueued = Signal(name="effect_enqueued", providing_args={"effect_id", "key", "effect_type"})
effect_claimed = Signal(name="effect_claimed", providing_args={"effect_id", "key", "attempt", "effect_type"})
effect_settled = Signal(name="effect_settled", providing_args={"effect_id", "key", "outcome", "attempt"})
effect_cancelled = Signal(name="effect_cancelled", providing_args={"effect_id", "key", "was"})
effect_lease_lost = Signal(name="effect_lease_lost", providing_args={"effect_id", "key"})
effect_requeued = Signal(name="effect_requeued", providing_args={"effect_id", "key"})
effect_failed = Signal(name="effect_failed", providing_args={"effect_id", "key", "reason"})

#: engine event name -> signal
EVENT_SIGNALS: dict[str, Signal] = {
    "workflow_started": workflow_started,
    "workflow_suspended": workflow_suspended,
    "workflow_completed": workflow_completed,
    "workflow_failed": workflow_failed,
    "workflow_cancelled": workflow_cancelled,
    "workflow_timed_out": workflow_timed_out,
    "activity_completed": activity_completed,
    "activity_failed": activity_failed,
    "activity_cancelled": activity_cancelled,
    "activity_stalled": activity_stalled,
    "workflow_continued": workflow_continued,
    "timer_fired": timer_fired,
    "signal_received": signal_received,
    "signal_ignored": signal_ignored,
    "signal_rejected": signal_rejected,
    "lease_lost": lease_lost,
    "recovery_redrive": recovery_redrive,
    "recovery_resend": recovery_resend,
    "effect_enqueued": effect_enqueued,
    "effect_claimed": effect_claimed,
    "effect_settled": effect_settled,
    "effect_cancelled": effect_cancelled,
    "effect_lease_lost": effect_lease_lost,
    "effect_requeued": effect_requeued,
    "effect_failed": effect_failed,
}
