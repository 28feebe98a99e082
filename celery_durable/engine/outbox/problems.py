"""What needs an operator across every lane (issue 25): effects that failed for good, and lanes and
intents the liveness scan has not acted on. ``OutboxEngine`` inherits :class:`ProblemReads`; the
glue's ``durable.outbox.problems()``, the UI's ``/effects`` page and ``durable outbox problems``
read it.

The cost depends on what is wrong, never on what is stored: one due scan of the failed rows
(``outbox_failed``, which no scan processes) and one ``read_many`` per lane holding some of them;
one due scan each of the lane heads and the intents due for longer than the grace, and one read of
each found (two for a lane whose running row's lease is in question). Rows that failed before
failed rows were indexed are not listed (docs/limitations.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery_durable.engine.documents.model import Clock, lease_live
from celery_durable.engine.outbox.model import (
    DUE_ADMIT,
    DUE_FAILED,
    DUE_LANE,
    FAILED,
    HEAD_ID,
    INDEX_ID,
    TERMINAL,
    OutboxSettings,
    index_pk,
    lane_pk,
    row_id,
    strip,
)
from celery_durable.errors import ConflictError
from celery_durable.stores.base import Doc, DueRef, Store

__all__ = ["EffectInfo", "StuckLane", "Problems", "ProblemReads", "UNCLAIMED", "LEASE_EXPIRED", "NOT_ADMITTED"]

#: why a lane or intent is stuck (:attr:`StuckLane.why`)
UNCLAIMED = "unclaimed"
LEASE_EXPIRED = "lease expired"
NOT_ADMITTED = "not admitted"


@dataclass(frozen=True)
class EffectInfo:
    """A snapshot of one outbox row (``durable.outbox.get(effect_id)``)."""

    id: str
    type: str
    key: str
    status: str
    attempt: int
    max_attempts: int
    payload: Any
    last_error: str | None
    reason: str | None
    created_at: float
    available_at: float
    started_at: float | None
    completed_at: float | None
    lease: dict[str, Any] | None
    #: a failed row run again by ``durable outbox retry``: the id of the new row
    retried_as: str | None = None

    @property
    def done(self) -> bool:
        return self.status in TERMINAL

    @classmethod
    def from_row(cls, row: Doc) -> EffectInfo:
        return cls(
            id=str(row["effect_id"]),
            type=str(row["effect_type"]),
            key=str(row["key"]),
            status=str(row["status"]),
            attempt=int(row.get("attempt") or 0),
            max_attempts=int(row.get("max_attempts") or 1),
            payload=row.get("payload"),
            last_error=row.get("last_error"),
            reason=row.get("reason"),
            created_at=float(row["created_at"]),
            available_at=float(row["available_at"]),
            started_at=row.get("started_at"),
            completed_at=row.get("completed_at"),
            lease=row.get("lease"),
            retried_as=row.get("retried_as"),
        )


@dataclass(frozen=True)
class StuckLane:
    """A lane head or an intent due for longer than the grace: no scan has acted on it."""

    key: str
    #: when it fell due
    due_at: float
    #: ``unclaimed``: the lane's first row waits for a claim (its message lost, and not resent);
    #: ``lease expired``: the worker running its row is gone, and the row was neither requeued nor
    #: failed; ``not admitted``: an intent (a transactional enqueue, a workflow's ``emit``) never
    #: moved into its lane
    why: str
    effect_id: str
    effect_type: str | None
    #: ``not admitted`` in a workflow's ``emit`` step: that execution
    execution_id: str | None = None


@dataclass(frozen=True)
class Problems:
    """:meth:`ProblemReads.problems`: failed effects, oldest first; stuck lanes and intents, longest
    due first."""

    failed: tuple[EffectInfo, ...]
    stuck: tuple[StuckLane, ...]
    #: seconds a due lane or intent is given before it is stuck (two outbox scan intervals)
    grace: float
    #: the limit was reached: there may be more (later failures; lanes due less long)
    more_failed: bool = False
    more_stuck: bool = False


class ProblemReads:
    """The overview's reads, a mixin of ``machine.OutboxEngine``."""

    store: Store
    clock: Clock
    settings: OutboxSettings

    def problems(self, limit: int = 100) -> Problems:
        """Failed effects and stuck lanes and intents across every key, at most ``limit`` of each."""
        now = self.clock.now()
        grace = 2 * self.settings.scan_interval
        failed = self.store.scan_due(DUE_FAILED, now, limit)
        lanes = self.store.scan_due(DUE_LANE, now - grace, limit)
        intents = self.store.scan_due(DUE_ADMIT, now - grace, limit)
        stuck = [s for r in lanes if (s := self._stuck_lane(r.pk, now, grace)) is not None]
        stuck += [s for r in intents if (s := self._stuck_intent(r.pk, r.id, now - grace)) is not None]
        stuck.sort(key=lambda s: s.due_at)
        more_stuck = len(lanes) >= limit or len(intents) >= limit or len(stuck) > limit
        return Problems(self._failed(failed), tuple(stuck[:limit]), grace, len(failed) >= limit, more_stuck)

    def _failed(self, refs: list[DueRef]) -> tuple[EffectInfo, ...]:
        by_lane: dict[str, list[str]] = {}
        for ref in refs:
            by_lane.setdefault(ref.pk, []).append(ref.id)
        rows: dict[tuple[str, str], Doc] = {}
        for lane, ids in by_lane.items():  # one read per lane, however many of its rows failed
            for doc_id, row in zip(ids, self.store.read_many(lane, ids), strict=True):
                if row is not None and row.get("status") == FAILED and row.get("due_kind") == DUE_FAILED:
                    rows[lane, doc_id] = row
        return tuple(EffectInfo.from_row(rows[r.pk, r.id]) for r in refs if (r.pk, r.id) in rows)

    def _stuck_lane(self, lane: str, now: float, grace: float) -> StuckLane | None:
        head = self.store.read(lane, HEAD_ID)
        if head is None or head.get("due_kind") != DUE_LANE or float(head.get("due_at") or 0.0) > now - grace:
            return None  # acted on since the scan found it
        key, due = str(head.get("key") or lane.removeprefix(lane_pk(""))), float(head["due_at"])
        live, running = head.get("live") or [], head.get("running")
        if running is not None:
            row = self.store.read(lane, row_id(str(running)))
            if row is not None and lease_live(row, now):
                return None  # its handler still renews the lease: only the head's due time lags
            types = {str(e[1]): str(e[2]) for e in live}
            etype = (row or {}).get("effect_type") or types.get(str(running))
            return StuckLane(key, due, LEASE_EXPIRED, str(running), None if etype is None else str(etype))
        if not live:
            return None  # nothing waits in it: the scan would only clear its due time
        return StuckLane(key, due, UNCLAIMED, str(live[0][1]), str(live[0][2]))

    def _stuck_intent(self, pk: str, doc_id: str, before: float) -> StuckLane | None:
        doc = self.store.read(pk, doc_id)
        effect = (doc or {}).get("effect")
        if doc is None or doc.get("due_kind") != DUE_ADMIT or float(doc.get("due_at") or 0.0) > before:
            return None  # admitted (or deferred) since the scan found it
        if not isinstance(effect, dict):
            return None
        execution = pk if doc.get("type") == "step" else None  # an emit step marker
        key, eid, etype = str(effect.get("key")), str(effect.get("id")), str(effect.get("type"))
        return StuckLane(key, float(doc["due_at"]), NOT_ADMITTED, eid, etype, execution)

    def retried(self, effect_id: str, retry_id: str) -> bool:
        """Record on a failed row that it was run again as ``retry_id`` (``durable outbox retry``).

        The row keeps its status and error, for the record, but lets go of ``outbox_failed``: the
        overview lists what still needs an operator, and the retry is listed in its turn if it fails
        too (a retry shown as well would cost a read of its row for each failed one). False if the
        effect is not a failed row, or it changed meanwhile."""
        index = self.store.read(index_pk(effect_id), INDEX_ID)
        row = None if index is None else self.store.read(lane_pk(str(index["key"])), row_id(effect_id))
        if row is None or row.get("status") != FAILED or row.get("retried_as") not in (None, retry_id):
            return False
        marked = strip(row) | {"due_kind": None, "due_at": None, "retried_as": retry_id}
        try:
            self.store.replace(marked, if_match=row["_etag"])
        except ConflictError:
            return False
        return True
