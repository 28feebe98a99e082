"""Cancel (docs/architecture.md §9): by id or by key, pending intents included.

A pending row leaves its lane at once; a running row is marked cancelled but keeps holding its
key (``running``) until its handler stopped (``machine.OutboxEngine.release``) or its lease
expired (the scan), so the next row of the key never overlaps it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery_durable.engine.outbox.admission import MAX_ROUNDS
from celery_durable.engine.outbox.model import (
    CANCELLED,
    DUE_ADMIT,
    DUE_PRUNE,
    HEAD_ID,
    INDEX_ID,
    LIVE,
    RUNNING,
    LaneOps,
    index_pk,
    intent_id,
    lane_pk,
    row_id,
)
from celery_durable.engine.outbox.model import strip as _strip
from celery_durable.errors import ConflictError, LaneFull, StoreError
from celery_durable.stores.base import Doc, Op

__all__ = ["Canceller"]

log = logging.getLogger("celery_durable.outbox")


class Canceller:
    def __init__(self, outbox: LaneOps) -> None:
        self.outbox = outbox
        self.store = outbox.store
        self.settings = outbox.settings

    def cancel(
        self,
        effect_id: str | None = None,
        *,
        key: str | None = None,
        types: Sequence[str] | None = None,
        reason: str = "cancelled",
    ) -> int:
        """Cancel pending or running rows by id, or every live row of ``key`` (of ``types``).

        Intents not yet admitted (a transactional enqueue or a workflow's ``emit`` whose
        admission has not run, or that waits for room in a full lane) are cancelled too."""
        if effect_id is None and key is None:
            raise ValueError("cancel() needs an effect id or a key")
        wanted = None if types is None else set(types)
        in_place = self._cancel_pending(effect_id, key, wanted, reason)
        if effect_id is not None:
            index = self.store.read(index_pk(effect_id), INDEX_ID)
            if index is None:
                return min(1, in_place)
            return int(self._cancel_one(str(index["key"]), effect_id, reason))  # it has a row: that counts
        assert key is not None
        head = self.store.read(lane_pk(key), HEAD_ID)
        ids = [str(e[1]) for e in (head or {}).get("live") or [] if wanted is None or e[2] in wanted]
        return in_place + sum(1 for eid in ids if self._cancel_one(key, eid, reason))

    def _pending_intents(self) -> list[Any]:
        """Every intent not yet admitted, due or not (their number is what is pending: usually 0)."""
        limit, horizon = 1000, self.outbox.clock.now() + 1e9  # finite: +inf is not JSON for a Cosmos query
        while True:
            refs = self.store.scan_due(DUE_ADMIT, horizon, limit)
            if len(refs) < limit or limit >= 1_000_000:
                return refs
            limit *= 4

    def _cancel_pending(self, effect_id: str | None, key: str | None, types: set[str] | None, reason: str) -> int:
        """Admit the intents a cancel is about, so the cancel reaches their rows; an intent that
        cannot be admitted now (its lane is full, its id held) is cancelled where it is. Returns
        how many were cancelled in place."""
        in_place = 0
        for ref in self._pending_intents():
            if effect_id is not None and ref.id.startswith("fxi:") and ref.id != intent_id(effect_id):
                continue  # another effect's transactional intent: no need to read it
            doc = self.store.read(ref.pk, ref.id)
            effect = (doc or {}).get("effect")
            if doc is None or doc.get("due_kind") != DUE_ADMIT or not isinstance(effect, dict):
                continue
            if effect_id is not None and effect.get("id") != effect_id:
                continue
            if key is not None and effect.get("key") != key:
                continue
            if key is not None and types is not None and effect.get("type") not in types:
                continue
            try:
                if self.outbox.admit_intent(doc) is not None:
                    continue  # admitted: the cancel reaches its row
            except (LaneFull, StoreError) as exc:
                log.info("cancel: intent %s/%s not admitted (%s): cancelled where it is", ref.pk, ref.id, exc)
            fresh = self.store.read(ref.pk, ref.id)
            if fresh is None or fresh.get("due_kind") != DUE_ADMIT:
                continue
            cancelled = _strip(fresh) | {"due_kind": None, "due_at": None, "admitted": False, "cancelled": reason}
            try:
                self.store.replace(cancelled, if_match=fresh["_etag"])
            except ConflictError:
                continue  # admitted or cancelled by someone else meanwhile
            if self.store.read(index_pk(str(effect["id"])), INDEX_ID) is None:
                in_place += 1  # no row anywhere: this cancel is what stopped it
        return in_place

    def _cancel_one(self, key: str, effect_id: str, reason: str) -> bool:
        store, lane = self.store, lane_pk(key)
        for rounds in range(MAX_ROUNDS):
            head, row = store.read_many(lane, [HEAD_ID, row_id(effect_id)])
            if row is None or row.get("status") not in LIVE:
                return False
            now = self.outbox.clock.now()
            was_running = row.get("status") == RUNNING
            new_row = _strip(row) | {
                "status": CANCELLED,
                "completed_at": now,
                "reason": reason,
                "due_kind": DUE_PRUNE,
                "due_at": now + self.settings.retention,
            }
            if not was_running:
                new_row["lease"] = None  # a running row keeps its lease: it holds the key (D1)
            ops = [Op.replace(new_row, row["_etag"])]
            new_head: Doc | None = None
            if head is not None:
                new_head = _strip(head)
                new_head["live"] = [e for e in head.get("live") or [] if e[1] != effect_id]
                if head.get("running") == effect_id and "cancel_frees_key" in self.outbox.bugs:
                    new_head.update(running=None, freed_at=now)
                self.outbox._head_due(new_head, now)
                ops.append(Op.replace(new_head, head["_etag"]))
            try:
                store.batch(lane, ops)
            except ConflictError:
                self.outbox.pause(rounds)
                continue
            self.outbox._emit("effect_cancelled", effect_id=effect_id, key=key, was=row.get("status"))
            if new_head is not None and new_head.get("running") is None:
                self.outbox._wake_first(new_head)  # a cancel of a pending first row unblocks the next
            return True
        raise StoreError(f"could not cancel effect {effect_id!r}: key {key!r} too contended")
