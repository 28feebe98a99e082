"""Whether the activities a listed execution waits on are queued, running or backing off.

The exec's ``waiting`` (engine/drive/carried.py) is written when the execution suspends; an
activity starts after that, and rewriting the exec when it does would cost every step a write.
So a listing asks the step markers instead: one batched read per execution that waits on an
activity (its markers and results: a page of the UI list, at most its page size), none for the
others.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from celery_durable.engine.admin.timeline import ExecutionSummary
from celery_durable.engine.documents.model import lease_live
from celery_durable.engine.documents.records import count_of
from celery_durable.engine.documents.schema import marker_id, result_id
from celery_durable.errors import CorruptDocument, StoreUnavailable
from celery_durable.stores.base import Store

__all__ = ["activity_states", "QUEUED", "RUNNING", "BACKOFF", "FINISHED"]

QUEUED, RUNNING, BACKOFF, FINISHED = "queued", "running", "backoff", "finished"


def _state(marker: dict[str, Any] | None, result: dict[str, Any] | None, now: float) -> dict[str, Any]:
    if result is not None:  # recorded; the drive that moves the workflow on has not run yet
        return {"state": FINISHED}
    if marker is None:
        return {}
    attempts = count_of(marker, "attempts")
    if lease_live(marker, now):
        return {"state": RUNNING, "attempt": max(1, attempts), "since": marker.get("started_at")}
    retry_at = marker.get("retry_at")
    if isinstance(retry_at, int | float) and retry_at > now and marker.get("last_error"):
        return {"state": BACKOFF, "attempt": attempts, "retry_at": retry_at}
    return {"state": QUEUED, "attempt": attempts} if attempts else {"state": QUEUED}


def activity_states(
    store: Store, rows: Iterable[ExecutionSummary], now: float
) -> dict[str, tuple[dict[str, Any], ...]]:
    """Per execution of ``rows`` that waits on an activity: its ``waiting`` items, each activity
    with ``state`` (queued, running with its ``attempt``, backoff until ``retry_at``). A marker
    that cannot be read leaves its item as it was."""
    out: dict[str, tuple[dict[str, Any], ...]] = {}
    for row in rows:
        acts = [w for w in row.waiting if w.get("kind") == "activity" and isinstance(w.get("seq"), int)]
        if not acts:
            continue
        ids = [marker_id(w["seq"], row.run) for w in acts] + [result_id(w["seq"], row.run) for w in acts]
        try:
            docs = store.read_many(row.id, ids)
            markers, results = docs[: len(acts)], docs[len(acts) :]
            found = {id(w): _state(m, r, now) for w, m, r in zip(acts, markers, results, strict=True)}
        except StoreUnavailable:
            raise
        except (CorruptDocument, KeyError, TypeError, ValueError):
            continue  # a malformed document: said on the execution's page, not a broken list
        out[row.id] = tuple(w | found.get(id(w), {}) for w in row.waiting)
    return out
