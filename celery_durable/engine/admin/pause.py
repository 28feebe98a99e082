"""Pausing an execution (``durable pause|unpause ID``; Temporal's workflow pause).

A paused execution keeps its status (``running``, ``queued``…) and the flag ``paused``. No drive
replays it: what arrives meanwhile — an activity's outcome, a fired timer, a signal, a child's
end, a cancel request — is recorded as usual (``Driver._round``: recorded with a wake-up, not
replayed), so no new step is taken and no new activity is sent; an attempt already running goes
on and its outcome waits. Its recovery due is cleared while paused, so beat's scans send it no
drive. Unpausing clears the flag and drives it at once: the replay takes in everything recorded
meanwhile (a deadline that passed is delivered then). ``terminate`` works on a paused execution;
a cancel is recorded and delivered once it is unpaused.

Things that fall due while paused are *parked* (:func:`park`: their due moved into ``parked``,
so no scan spins on them): its deadline and start clocks, a local activity's retry timer, an
activity step the recovery scan would re-send; unpausing re-arms them in its batch, so a deadline
that passed is delivered and a delayed start fires at once. A queued execution gives up its slot
while paused (``begin_queued``) and queues again when unpaused. An execution that ends is no
longer paused (terminate, a cancel before it started); an operator's re-run is not paused.

Both are operator actions, recorded as ``op:<n>`` documents (who, when, why), like a cancel.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.delivery import request_of
from celery_durable.engine.admin.oplog import op_doc
from celery_durable.engine.admin.pending_ops import check_field
from celery_durable.engine.documents.model import DUE_EXEC, EXEC_ID
from celery_durable.engine.documents.records import count_of, is_terminal
from celery_durable.errors import ConflictError, DurableError, OperationRefused
from celery_durable.stores.base import Doc, Op, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts as Engine

__all__ = ["pause", "unpause", "park", "PAUSED_FIELDS"]

#: the exec fields of a pause, cleared when it ends or an operator re-runs it
PAUSED_FIELDS: dict[str, None] = {"paused": None, "paused_at": None}

_ATTEMPTS = 50


def pause(engine: Engine, execution_id: str, by: str, reason: str | None = None) -> bool:
    """Pause ``execution_id``; False when it was paused already. Raises OperationRefused when it
    has ended, UnknownWorkflowError when there is no such execution."""
    return _set(engine, execution_id, True, by, reason) is not None


def unpause(engine: Engine, execution_id: str, by: str, reason: str | None = None) -> bool:
    """Unpause ``execution_id`` and drive it now; False when it was not paused."""
    ex = _set(engine, execution_id, False, by, reason)
    if ex is None:
        return False
    at = ex.get("deadline_at")
    if isinstance(at, int | float) and at <= engine.clock.now() and not ex.get("timed_out"):
        # its deadline passed while paused: delivered first (a child's drive would not deliver it,
        # and take a new step); what this process cannot replay its clock's scan does
        engine.timers.fire_deadline(execution_id)
        if ex.get("parent"):
            return True
    engine.dispatcher.send_drive(execution_id)
    return True


def park(engine: Any, doc: Doc, ex: Mapping[str, Any]) -> None:
    """A document of the paused execution ``ex`` (as read) fell due (a clock, a retry timer, a lost
    activity): its due is kept in ``parked`` until the unpause re-arms it. Written in one batch with
    the exec as read (its etag), so a park never lands after the unpause (sim seed 246); one already
    parked or no longer due is left as it is (a second scan must not park its nothing: seed 82)."""
    if doc.get("parked") or not doc.get("due_kind"):
        return
    body = strip_reserved(doc) | {"parked": [doc.get("due_kind"), doc.get("due_at")], "due_kind": None, "due_at": None}
    try:
        engine.store.batch(
            str(doc["pk"]),
            [Op.replace(body, str(doc["_etag"])), Op.replace(strip_reserved(ex), str(ex["_etag"]))],
        )
    except ConflictError:
        pass  # either changed (unpaused, driven, fired): the next scan looks again


def _rearm(engine: Engine, execution_id: str) -> tuple[list[Op], list[Doc]]:
    """The unpause's re-arms: every parked document of the partition due again as it was; and the
    held steps (a failure that paused it: engine/activities/holds.py), sent again at once."""
    ops: list[Op] = []
    held: list[Doc] = []
    now = engine.clock.now()
    for doc in engine.store.query_partition(execution_id).docs:
        parked = doc.get("parked")
        if doc.get("id") != EXEC_ID and isinstance(parked, list) and len(parked) == 2:
            body = strip_reserved(doc) | {"due_kind": parked[0], "due_at": parked[1], "parked": None}
            if doc.get("held"):  # sent below; due again should that message be lost
                body.update(held=None, due_at=now + engine.settings.activity_queue_timeout)
                held.append(body)
            ops.append(Op.replace(body, str(doc["_etag"])))
    return ops, held


def _set(engine: Engine, execution_id: str, paused: bool, by: str, reason: str | None) -> Doc | None:
    """Set or clear the flag (recorded); the exec as written, None when it was so already."""
    check_field(OperationRefused, "by", by)
    check_field(OperationRefused, "reason", reason)
    action = "pause" if paused else "unpause"
    for _ in range(_ATTEMPTS):
        ex = engine.read_exec(execution_id)
        if is_terminal(ex):
            raise OperationRefused(f"{execution_id} is {ex.get('status')}: an ended execution cannot {action}")
        if bool(ex.get("paused")) == paused:
            return None
        now = engine.clock.now()
        body = strip_reserved(ex) | {"operations": count_of(ex, "operations") + 1, "updated_at": now}
        if paused:  # no recovery drive while paused: nothing would come of it
            body.update(paused=True, paused_at=now, due_kind=None, due_at=None)
        else:  # driven now; due again in case that message is lost
            due = now + engine.settings.drive_timeout
            body.update(paused=None, paused_at=None, due_kind=DUE_EXEC.value, due_at=due)
        doc = op_doc(ex, action, by, reason, now)
        rearm, held = ([], []) if paused else _rearm(engine, execution_id)
        try:
            engine.store.batch(execution_id, [*rearm, Op.replace(body, ex["_etag"]), Op.create(doc)])
        except ConflictError:
            continue  # a drive or a signal wrote meanwhile: look again
        finally:
            engine.cache.invalidate(execution_id)
        for step in held:
            engine.dispatcher.send_activity(request_of(execution_id, step, ex))
        engine.emit(f"workflow_{action}d", execution_id=execution_id, workflow=ex.get("workflow"))
        return body
    raise DurableError(f"could not {action} {execution_id!r}: too much contention")
