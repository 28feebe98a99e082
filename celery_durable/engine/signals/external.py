"""Carrying out ``wf.signal_external`` steps (docs/architecture.md §7): after the sender's commit,
and again by recovery when the sending process died before the outcome was recorded.

The value reaches the receiver through ``Signals.signal`` with the step's signal id, so a send
repeated after a crash is recorded once (``sgk:`` key, created in the value's own batch). The
step's outcome (delivered, or why not: no such execution, an undeclared name, the execution has
ended) is recorded create-only in the sender and drives it, as a child's outcome does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from celery_durable.engine.dispatcher import SignalRequest
from celery_durable.engine.documents.model import EXEC_ID, error_info, marker_id, result_id, run_of, settled
from celery_durable.engine.documents.records import is_terminal
from celery_durable.engine.documents.schema import external_signal_id
from celery_durable.errors import ConflictError, InvalidWorkflowId, PayloadValidationError, UnknownWorkflowError
from celery_durable.stores.base import Doc, reads_may_lag, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

#: ``Signals.signal``: records a value at the receiver (idempotent by signal id)
Signal = Callable[..., bool]

__all__ = ["send_signal", "send_signal_again"]

log = logging.getLogger("celery_durable.links")


#: a target not found by a store whose reads may lag (Cosmos at Session consistency) is looked
#: for again this much later (by recovery) before the step fails as "no such execution"
UNSEEN_TARGET_GRACE = 5.0


def _look_again(eng: EngineParts, marker: Doc | None) -> bool:
    """The target was not found. On a store whose reads may lag, the first time, it may exist
    and be unseen by this replica (started by another process a moment ago): the step stays due
    (``target_unseen``), recovery sends again after :data:`UNSEEN_TARGET_GRACE`; the next miss
    is final. ``False``: record "no such execution" now."""
    if marker is None or marker.get("target_unseen") or not reads_may_lag(eng.store):
        return False
    now = eng.clock.now()
    pushed = strip_reserved(marker) | {"target_unseen": now, "due_at": now + UNSEEN_TARGET_GRACE}
    try:
        eng.store.replace(pushed, if_match=marker["_etag"])
    except ConflictError:
        pass  # changed meanwhile: still due, recovery sends again
    return True


def send_signal(eng: EngineParts, signal: Signal, req: SignalRequest) -> None:
    """Send the value (idempotent by ``req.signal_id``) and record the step's outcome in the sender.

    A store error propagates: the marker stays due and recovery sends again."""
    docs = eng.cache.load(req.execution_id)
    ex = docs.get(EXEC_ID)
    if ex is None or is_terminal(ex) or run_of(ex) != req.run:
        return  # the sender no longer waits (its marker is settled by the scan that finds it so)
    if result_id(req.seq, req.run) in docs:
        return
    error: dict[str, Any] | None = None
    sender = {"pk": req.execution_id, "run": req.run, "seq": req.seq}
    try:
        if not signal(req.target, req.name, req.value, signal_id=req.signal_id, sender=sender):
            error = {"type": "WorkflowEnded", "message": f"execution {req.target!r} has ended"}
    except UnknownWorkflowError as exc:
        if _look_again(eng, docs.get(marker_id(req.seq, req.run))):
            return
        error = error_info(exc)
    except (PayloadValidationError, InvalidWorkflowId) as exc:
        error = error_info(exc)
    if error is not None:
        log.warning("signal %r from %s to %s failed: %s", req.name, req.execution_id, req.target, error["message"])
    doc: Doc = {
        "pk": req.execution_id,
        "id": result_id(req.seq, req.run),
        "type": "result",
        "run": req.run,
        "seq": req.seq,
        "name": req.name,
        "target": req.target,
        "ok": error is None,
        "value": None,
        "completed_at": eng.clock.now(),
    }
    if error is not None:
        doc["error"] = error
    eng.driver.drive(req.execution_id, carry=[doc], release=[req.seq])


def send_signal_again(eng: EngineParts, signal: Signal, pk: str, marker: Doc) -> None:
    """Recovery of a ``signal_send`` step still due: its send (or its outcome) was lost. Pushed
    forward first (etag), so two scans send once per interval; the signal id dedupes the rest."""
    seq, run = int(marker["seq"]), run_of(marker)
    ex = eng.store.read(pk, EXEC_ID)
    done = ex is None or is_terminal(ex) or run_of(ex) != run
    if done or eng.store.read(pk, result_id(seq, run)) is not None:
        try:
            eng.store.replace(settled(marker), marker["_etag"])
        except ConflictError:
            pass
        return
    pushed = strip_reserved(marker) | {"due_at": eng.clock.now() + eng.settings.activity_queue_timeout}
    try:
        eng.store.replace(pushed, if_match=marker["_etag"])
    except ConflictError:
        return
    sid = str(marker.get("signal_id") or external_signal_id(pk, run, seq))
    req = SignalRequest(pk, seq, run, str(marker["target"]), str(marker["name"]), marker.get("value"), sid)
    send_signal(eng, signal, req)
