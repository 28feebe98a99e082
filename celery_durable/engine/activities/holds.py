"""Pause on failure (``@durable_activity(pause_on_failure=True)``): an activity that fails for good
(its Celery retries exhausted, or not retryable) pauses its execution instead of failing the step.

The execution is paused first (engine/admin/pause.py), with the failure as the reason; then the
step's marker gives its lease back, keeps the error (``last_error``) and is *held*: parked with
no outcome, due again at once when unpaused — so an operator fixes the cause (a deploy, a
config, the remote service) and ``durable unpause`` runs the step again, with its retries, as if
it had never failed. Celery still reports the attempt failed (FAILURE in Flower, the worker's
ERROR line). A crash between the pause and the marker's write leaves the marker leased: once the
lease lapses the recovery scan parks it (the execution is paused), so the unpause re-sends it all
the same. If the execution cannot be paused (it ended meanwhile) or a cancel was requested (the
failure is the cancel's to handle, compensations run), the failure is recorded as any.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from celery_durable.engine.activities.context import _NOTHING, heartbeat_record
from celery_durable.engine.admin.pause import pause
from celery_durable.engine.documents.model import DUE_ACTIVITY, EXEC_ID, error_info, marker_id
from celery_durable.engine.documents.records import holder_of, maybe_exec
from celery_durable.errors import ConflictError, DurableError, StoreError
from celery_durable.stores.base import strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.documents.model import Attempt
    from celery_durable.engine.ports import EngineParts as Engine

__all__ = ["HOLDER", "hold_failure"]

log = logging.getLogger("celery_durable.activities")

#: who the operation record says paused it
HOLDER = "pause_on_failure"


def hold_failure(eng: Engine, attempt: Attempt, exc: BaseException) -> bool:
    """Pause ``attempt``'s execution and hold its step (see the module); False when it could not
    be paused (ended, or the store failed): the caller records the failure as usual."""
    eid, seq, run = attempt.execution_id, attempt.seq, attempt.run
    reason = f"activity {attempt.name!r} (step {seq}) failed for good: {type(exc).__name__}"
    ex = maybe_exec(eng.store.read(eid, EXEC_ID))
    if ex is None or ex.get("cancel_requested"):  # a cancel asked for: the failure goes to it, not a pause
        return False
    try:
        pause(eng, eid, HOLDER, reason[:500])
    except (DurableError, StoreError) as err:  # ended meanwhile, or no store: recorded as a failure
        log.info("%s step %d not held (%s): its failure is recorded", eid, seq, err)
        return False
    details = eng.leases.latest_details(attempt)
    eng.leases.untrack(attempt)  # its limit's slot too
    now = eng.clock.now()
    error = error_info(exc, attempts=attempt.number)
    try:
        for _ in range(5):
            marker = eng.store.read(eid, marker_id(seq, run))
            if marker is None or holder_of(marker) != attempt.holder:
                break  # not this attempt's any more: whoever holds it settles it
            held = strip_reserved(marker) | {
                "lease": None,
                "last_error": error,
                "failed_at": now,
                "retry_at": None,
                "due_kind": None,
                "due_at": None,
                "parked": [DUE_ACTIVITY.value, now],  # re-armed (and re-sent) by the unpause
                "held": True,
            }
            if details is not _NOTHING:  # kept for the next attempt (activity.last_heartbeat_details)
                held["heartbeat"] = heartbeat_record(details, now, attempt.number)
            try:
                eng.store.replace(held, if_match=str(marker["_etag"]))
                break
            except ConflictError:
                continue
    except StoreError as err:  # its lease lapses; the recovery scan parks it (paused)
        log.warning("%s step %d held without its marker's write: %s", eid, seq, err)
    eng.emit("activity_held", execution_id=eid, seq=seq, activity=attempt.name)
    return True
