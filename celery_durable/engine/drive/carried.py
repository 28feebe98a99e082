"""What a drive carries and decides, as pure functions of the driver (engine/drive/driver.py):
a carried wait timeout counted as of the exec read, an oversized outcome turned into its step's
failure, whether an eager first drive may commit, the JSON a custom status is compared by, the
markers its commit settles."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from celery_durable.engine.dispatcher import ActivityRequest, ClockRequest
from celery_durable.engine.documents.model import error_info, marker_id, settled
from celery_durable.engine.documents.records import ExecDoc, count_of
from celery_durable.engine.outcomes import ReplayKind
from celery_durable.engine.replay.history import Replay
from celery_durable.errors import DocumentTooLarge
from celery_durable.stores.base import Doc, Op

__all__ = ["as_of", "carry_json", "eager_commit", "oversized", "waiting_of", "release_ops", "MAX_WAITING"]

#: at most this many of the steps a suspended execution waits for are named in its exec
MAX_WAITING = 5


def carry_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def as_of(doc: Doc, ex: ExecDoc | None) -> Doc:
    """A carried signal-wait timeout, counting the values sent as of the exec this round read.

    The replay lets values numbered up to ``signals_seen`` win over the timeout. Counted when
    the clock was read, a value accepted after that read but before the timeout's commit lost to
    it (and was never seen). Every write of a carry is conditional on this exec's etag, which
    each accepted signal bumps: the count is exact at the commit, and the first writer wins.
    """
    if ex is None or not doc.get("timeout") or "signals_seen" not in doc:
        return doc
    return doc | {"signals_seen": count_of(ex, "signal_seq")}


def oversized(exc: DocumentTooLarge, carry: list[Doc]) -> list[Doc]:
    """``carry`` with the outcome ``exc`` names recorded as its step's failure instead: a value
    too large to store fails the activity (non-retryable; its body is not run again). Re-raises
    ``exc`` when it names no carried outcome with a value."""
    for i, d in enumerate(carry):
        if d["id"] == exc.doc_id and d.get("ok"):
            failed = {k: v for k, v in d.items() if k != "value"}
            failed.update(ok=False, error=error_info(exc, attempts=d.get("attempts")))
            return [*carry[:i], failed, *carry[i + 1 :]]
    raise exc


def eager_commit(decided: Replay, carry: list[Doc]) -> bool:
    """Whether an eager first drive (in the caller of ``start()``) may commit what it decided:
    a suspension that schedules activities or timers, and nothing to run or tell here."""
    if decided.kind != ReplayKind.SUSPENDED or decided.local or carry:
        return False
    return all(isinstance(req, ActivityRequest | ClockRequest) for req in decided.sends)


def waiting_of(seqs: list[int], run: int, docs: dict[str, Doc], new_docs: list[Doc]) -> list[dict[str, Any]]:
    """What a suspended execution waits on, for listings (its exec's ``waiting``): per awaited
    step its kind and name, a timer's or a signal wait's deadline (``until``), a child's id; at
    most :data:`MAX_WAITING` (then ``{"more": n}``). Read from the step markers, no store call."""
    mine = {d["id"]: d for d in new_docs}
    out: list[dict[str, Any]] = []
    for seq in seqs[:MAX_WAITING]:
        marker = mine.get(marker_id(seq, run)) or docs.get(marker_id(seq, run))
        if marker is None:
            continue
        kind = str(marker.get("kind"))
        item: dict[str, Any] = {"seq": seq, "kind": "timer" if kind == "sleep" else kind}
        if kind != "sleep":
            item["name"] = marker.get("name")
        if isinstance(marker.get("fire_at"), int | float):
            item["until"] = marker["fire_at"]
        if marker.get("child_id"):
            item["child"] = marker["child_id"]
        out.append(item)
    if len(seqs) > MAX_WAITING:
        out.append({"more": len(seqs) - MAX_WAITING})
    return out


def release_ops(docs: Mapping[str, Doc], release: list[int], run: int) -> list[Op]:
    """Settle the markers of steps whose outcome a drive records (etag-guarded)."""
    ops: list[Op] = []
    for seq in release:
        marker = docs.get(marker_id(seq, run))
        if marker is not None and (marker.get("lease") or marker.get("due_kind")):
            ops.append(Op.replace(settled(marker), marker["_etag"]))
    return ops
