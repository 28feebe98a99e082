"""Sending a step the slot it was granted (engine/limits/slots.py).

A waiter queued at dispatch carries its own message (``m``: the activity's name, its encoded
arguments, its task id and workflow), when small: a slot freed by an attempt that ended in a
worker is handed to it there (``ActivityRequest.handoff``, glue/eager_activities.py) without
reading its partition first — the attempt's own begin reads it, and refuses a step that needs no
slot any more, giving the slot back (``ActivityRunner.begin(handoff=request.grant())``). Any other grant is
sent as the recovery scan re-sends a step: rebuilt from its marker, after checking it may run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.delivery import not_runnable, request_of
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.model import EXEC_ID, marker_id

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = ["CARRY_BYTES", "carry", "send_granted"]

#: the largest message (its arguments, encoded) a waiter carries: 1,000 waiters stay under 1 MB
CARRY_BYTES = 512


def carry(request: ActivityRequest) -> dict[str, Any] | None:
    """What a waiter keeps of ``request`` to be sent without a read (None: too large)."""
    try:
        size = len(json.dumps([request.args, request.kwargs], separators=(",", ":")))
    except (TypeError, ValueError):
        return None
    if size > CARRY_BYTES:
        return None
    return {"n": request.name, "a": request.args, "k": request.kwargs, "i": request.task_id, "w": request.workflow}


def _carried(w: Mapping[str, Any], lpk: str) -> ActivityRequest | None:
    m = w.get("m")
    if not isinstance(m, dict):
        return None
    return ActivityRequest(
        execution_id=str(w["e"]),
        seq=int(w["q"]),
        name=str(m["n"]),
        args=list(m["a"]),
        kwargs=dict(m["k"]),
        task_id=str(m["i"]),
        workflow=str(m["w"]),
        run=int(w["r"]),
        token=w.get("t"),
        handoff=(lpk, int(w.get("n") or 1)),
    )


def send_granted(eng: EngineParts, lpk: str, w: Mapping[str, Any], handoff: bool) -> bool:
    """Send the step ``w`` granted a slot of ``lpk`` (``handoff``: the slot freed in this
    process); False when it needs no slot any more (settled, its run ended or moved on)."""
    eid, run, seq = str(w["e"]), int(w["r"]), int(w["q"])
    request = _carried(w, lpk) if handoff else None
    hand_off = getattr(eng.dispatcher, "hand_off", None)
    kept = None if request is None or hand_off is None else bool(hand_off(request))  # None: not asked
    if kept:
        eng.emit("limit_granted", execution_id=eid, seq=seq, limit=str(w.get("g")))
        return True  # run next in this process: its begin reads the partition (and checks it)
    docs = eng.cache.load(eid)
    marker, ex = docs.get(marker_id(seq, run)), docs.get(EXEC_ID)
    if marker is None or not_runnable(docs, seq, run) is not None:
        return False
    eng.emit("limit_granted", execution_id=eid, seq=seq, limit=str(w.get("g")))
    # offered as a hand-off unless the dispatcher already said no to its carried message
    handed = (lpk, int(w.get("n") or 1)) if handoff and kept is None else None
    eng.dispatcher.send_activity(dc_replace(request_of(eid, marker, ex), handoff=handed))
    return True
