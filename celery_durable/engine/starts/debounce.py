"""Debounced starts (``options(dedup_key=..., debounce=...)``): the latest input wins after a
quiet period.

A debounced start is a keyed start (engine/starts/dedup.py) delayed by the quiet period
(engine/starts/deadlines.py: created ``scheduled``, started by its clock). Another debounced start
with the key while that execution is still ``scheduled`` does not start a second one: it gives the
scheduled one its input and moves its start to a full quiet period from now (its deadline, if it
has a timeout, moves as far), in one batch guarded by the exec's and the clocks' etags — a start
clock firing at the same moment either wins (the execution runs with the input it had; this start
then meets a running holder and its ``on_conflict``) or loses and finds the new start time. Once
the execution runs, a debounced start is an ordinary conflict with its key (``on_conflict``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.model import EXEC_ID, split_payload
from celery_durable.engine.documents.records import maybe_exec
from celery_durable.engine.documents.schema import Status
from celery_durable.engine.starts.deadlines import DEADLINE_CLOCK, START_CLOCK
from celery_durable.errors import ConflictError
from celery_durable.stores.base import Op, strip_reserved

if TYPE_CHECKING:
    from celery_durable.stores.base import Store

__all__ = ["push_back"]

_ATTEMPTS = 20


def push_back(
    store: Store,
    now: float,
    execution_id: str,
    workflow: str,
    payload: dict[str, Any],
    quiet: float,
    limit: dict[str, Any] | None = None,
) -> bool:
    """Give the ``scheduled`` execution ``execution_id`` of ``workflow`` the input ``payload`` (and
    the ``limit`` record its arguments give: it waits on the key of the input it runs with) and
    start it ``quiet`` seconds from ``now``. False when it is not (or no longer) a scheduled
    execution of that workflow: the caller settles the conflict as any."""
    for _ in range(_ATTEMPTS):
        found, start, deadline = store.read_many(execution_id, [EXEC_ID, START_CLOCK, DEADLINE_CLOCK])
        ex = maybe_exec(found)
        if ex is None or ex.get("status") != Status.SCHEDULED or ex.get("workflow") != workflow:
            return False
        if not ex.get("debounce"):  # a start_delay's: its time is its caller's, not a quiet period
            return False
        if start is None or not start.get("due_kind"):
            return False  # its start is being fired: it runs with the input it has
        begins = now + quiet
        moved = begins - float(ex.get("start_at") or begins)
        updated: dict[str, Any] = strip_reserved(ex) | {"payload": payload, "start_at": begins, "updated_at": now}
        updated.pop("payload_at", None)
        updated.pop("limit", None)
        if limit is not None:
            updated["limit"] = limit
        updated, input_doc = split_payload(updated)
        ops = [Op.replace(strip_reserved(start) | {"at": begins, "due_at": begins}, start["_etag"])]
        if input_doc is not None:
            ops.append(Op.upsert(input_doc))
        elif isinstance(ex.get("payload_at"), str):  # the input it had apart goes: inline now
            ops.append(Op.delete(str(ex["payload_at"])))
        at = ex.get("deadline_at")
        if isinstance(at, int | float) and deadline is not None and deadline.get("due_kind"):
            # its timeout counts from its first drive, which moved
            updated["deadline_at"] = later = float(at) + moved
            ops.append(Op.replace(strip_reserved(deadline) | {"at": later, "due_at": later}, deadline["_etag"]))
        ops.insert(0, Op.replace(updated, ex["_etag"]))
        try:
            store.batch(execution_id, ops)
            return True
        except ConflictError:
            continue  # changed meanwhile (another debounced start, its clock): look again
    return False
