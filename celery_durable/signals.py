"""The library's Celery-style signals (hooks), public path; defined in :mod:`celery_durable.glue.hooks`.

Not to be confused with *workflow signals* (``wf.wait_signal``, ``handle.signal``): these are
hooks like ``celery.signals``. Connect as with Celery's::

    from celery_durable.signals import workflow_completed

    @workflow_completed.connect
    def on_done(sender, execution_id, **kw): ...

The table of signals and their arguments is in :mod:`celery_durable.glue.hooks`.
"""

from celery_durable.glue.hooks import (
    EVENT_SIGNALS,
    activity_cancelled,
    activity_completed,
    activity_failed,
    activity_stalled,
    effect_cancelled,
    effect_claimed,
    effect_enqueued,
    effect_failed,
    effect_lease_lost,
    effect_requeued,
    effect_settled,
    lease_lost,
    recovery_redrive,
    recovery_resend,
    signal_ignored,
    signal_received,
    signal_rejected,
    timer_fired,
    workflow_cancelled,
    workflow_completed,
    workflow_continued,
    workflow_failed,
    workflow_started,
    workflow_suspended,
    workflow_timed_out,
)

#: a package path, empty: the hooks were a package before issue 24 (``signals/receivers.py``), so
#: ``celery_durable.signals.receivers`` still imports (celery_durable/_moved.py answers it)
__path__: list[str] = []

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
