"""Executions that wait on a limit (``@durable.workflow(limit=)``, ``options(limit=)``).

A limited start creates its execution ``queued`` with its ``limit`` record (key, priority and
group computed in the caller: engine/limits/spec.py ``workflow_limit``), then joins the limit's
document as a waiter ``<execution id>|wf`` in one write. Given a slot (at once, or later when one
frees), the execution is made ``running`` (its deadline counted from then) and its first drive is
sent; it holds the slot until it ends (completed, failed, cancelled, timed out, terminated: the
drive that ends it gives the slot back), across continue-as-new. A ``queued`` execution is never
driven: a drive that finds one (recovery after ``drive_timeout``: a starter killed between its
two writes) takes its turn again.

The holder of an execution's slot carries no attempt lease: at its expiry the scan looks at the
execution itself. Running, it keeps the slot (looked at again ``RECHECK`` × ``lease_ttl`` later);
queued (a grant whose start was lost), it is started again; ended or gone, the slot frees. So a
worker killed between an execution's end and the slot's hand-off costs the slot for up to
``RECHECK`` lease TTLs plus a recovery interval.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.model import DUE_EXEC, EXEC_ID
from celery_durable.engine.documents.records import is_terminal, maybe_exec
from celery_durable.engine.documents.schema import Status
from celery_durable.engine.starts.deadlines import running_ops
from celery_durable.errors import ConflictError
from celery_durable.stores.base import strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = [
    "RECHECK",
    "execution_step",
    "is_execution",
    "queue_execution",
    "begin_queued",
    "take_turn",
    "release_execution",
    "send_execution",
    "check_execution",
]

log = logging.getLogger("celery_durable.limits")

_SUFFIX = "|wf"
#: a running execution's slot is looked at again this many lease TTLs after the last look (one
#: write of its document each time): a lost hand-off costs the slot that long at most
RECHECK = 4
_ATTEMPTS = 20


def execution_step(execution_id: str) -> str:
    return execution_id + _SUFFIX


def is_execution(step: str) -> bool:
    return step.endswith(_SUFFIX)


def _waiter(execution_id: str, record: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "s": execution_step(execution_id),
        "e": execution_id,
        "r": 0,
        "q": 0,
        "n": 1,
        "t": None,
        "p": int(record.get("p") or 0),
        "g": str(record.get("g") or ""),
        "w": 1,
    }


def queue_execution(eng: EngineParts, execution_id: str, record: Mapping[str, Any]) -> None:
    """The ``queued`` execution ``execution_id`` joins its limit: started now if it gets a slot,
    else left to wait (its recovery due cleared: the grant starts it). Any error leaves it due, so
    a recovery drive takes its turn again."""
    try:
        held = eng.limits.join(record, _waiter(execution_id, record))
    except Exception as exc:  # noqa: BLE001 - its recovery drive joins again
        log.warning("execution %s not queued on limit %s yet: %s", execution_id, record.get("name"), exc)
        return
    if held:
        _begin_or_give_back(eng, execution_id, record)
    elif held is False:
        _set_due(eng, execution_id, None)


def _begin_or_give_back(eng: EngineParts, execution_id: str, record: Mapping[str, Any]) -> None:
    """Start the execution given a slot; one that needs it no more (cancelled meanwhile) gives it
    back at once rather than at the holder's expiry."""
    if not begin_queued(eng, execution_id):
        eng.limits.withdraw(record, execution_step(execution_id))


def _set_due(eng: EngineParts, execution_id: str, at: float | None) -> None:
    """A queued execution's recovery due: cleared while its limit's document holds it as a waiter
    (its grant starts it), else ``at``. A lost race leaves it as it was (due: looked at again)."""
    ex = eng.store.read(execution_id, EXEC_ID)
    if ex is None or ex.get("status") != Status.QUEUED or ex.get("due_at") == at:
        return
    body = strip_reserved(ex) | {"due_kind": None if at is None else DUE_EXEC.value, "due_at": at}
    try:
        eng.store.replace(body, if_match=str(ex["_etag"]))
    except ConflictError:
        pass


def begin_queued(eng: EngineParts, execution_id: str) -> bool:
    """Its slot granted: make the ``queued`` execution ``running`` and send its first drive. True
    when it runs (now or already), False when it needs no slot (ended, gone, not started yet)."""
    for _ in range(_ATTEMPTS):
        ex = maybe_exec(eng.store.read(execution_id, EXEC_ID))
        if ex is None or is_terminal(ex):
            return False
        if ex.get("status") != Status.QUEUED:
            return ex.get("status") == Status.RUNNING
        if ex.get("paused"):  # paused: the slot goes on; it queues again once unpaused (its drive)
            return False
        now = eng.clock.now()
        since = ex.get("queued_at")
        planned = float(since) if isinstance(since, int | float) else float(ex.get("created_at") or now)
        if ex.get("parent"):  # a child's deadline counts from its step (its parent's caps it): not moved
            planned = now
        try:
            eng.store.batch(execution_id, running_ops(eng, ex, planned, now))
        except ConflictError:
            continue
        eng.emit("workflow_dequeued", execution_id=execution_id, workflow=ex.get("workflow"), waited=now - planned)
        eng.dispatcher.send_drive(execution_id)
        return True
    return True  # contended: it keeps the slot; the scan starts it at the holder's expiry


def take_turn(eng: EngineParts, ex: Mapping[str, Any]) -> None:
    """A drive found ``ex`` ``queued``: join its limit again (idempotent), start it if it holds a
    slot. Never runs its code: only a grant does."""
    record, eid = ex.get("limit"), str(ex["pk"])
    if not isinstance(record, dict):  # a queued execution with no limit record: nothing to wait on
        log.warning("execution %s is queued with no limit record: started", eid)
        begin_queued(eng, eid)
        return
    held = eng.limits.join(record, _waiter(eid, record))
    if held:
        _begin_or_give_back(eng, eid, record)
    else:  # waiting (the grant starts it), or not recorded (looked at again after drive_timeout)
        _set_due(eng, eid, None if held is False else eng.clock.now() + eng.settings.drive_timeout)


def release_execution(eng: EngineParts, ex: Mapping[str, Any]) -> None:
    """``ex`` ended (or was cancelled while queued): its slot, or its place in the queue, goes."""
    record = ex.get("limit")
    if isinstance(record, dict):
        eng.limits.withdraw(record, execution_step(str(ex["pk"])))


def send_execution(eng: EngineParts, execution_id: str) -> bool:
    """A slot granted to a waiting execution: start it. False: it needs the slot no more."""
    return begin_queued(eng, execution_id)


def check_execution(
    eng: EngineParts, holder: dict[str, Any], step: str, now: float, resend: list[dict[str, Any]]
) -> bool:
    """An execution's expired slot (the scan, or a write that needs room): keep it while the
    execution runs (looked at again later); start a queued one again (its grant's start was lost:
    appended to ``resend``); False (free it) when it ended or is gone."""
    eid = step[: -len(_SUFFIX)]
    ex = maybe_exec(eng.store.read(eid, EXEC_ID))
    if ex is None or is_terminal(ex) or ex.get("status") == Status.SCHEDULED:
        return False
    ttl = eng.settings.lease_ttl
    if ex.get("status") == Status.QUEUED:
        holder["exp"] = now + ttl
        resend.append({"s": step, "e": eid, "r": 0, "q": 0, "g": holder.get("g")})
    else:
        holder["exp"] = now + RECHECK * ttl
    return True
