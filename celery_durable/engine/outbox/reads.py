"""What a settle reads (``machine.OutboxEngine`` inherits it): the head with the successor row and
the rows after it (read ahead: the next settles of a drain write without reading), the state
after a failed batch, and what a batch whose answer was lost did."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection

from celery_durable.engine.outbox.model import CANCELLED, HEAD_ID, RETRY, RUNNING, Claim, lane_pk, row_id
from celery_durable.engine.outbox.model import strip as _strip
from celery_durable.errors import StoreError
from celery_durable.stores.base import Doc, Store

__all__ = ["SettleReads", "READ_AHEAD", "READ_AFTER_STALE", "LEASE_LOST", "rows_found"]

log = logging.getLogger("celery_durable.outbox")

LEASE_LOST = "lease-lost"
#: rows a settle reads with the head (the successor and the ones after it): the next settles of
#: the drain claim them without a read of their own
READ_AHEAD = 8
#: a settle whose blind try found the head moved sets this; the drain's next (this - 1) settles read first
READ_AFTER_STALE = 4


def rows_found(ids: Collection[str], rows: Collection[Doc | None]) -> dict[str, Doc]:
    """The rows read ahead (``ids``, as ``read_many`` answered them) that exist, by effect id."""
    return {i: r for i, r in zip(ids, rows, strict=True) if r is not None}


class SettleReads:
    store: Store
    _emit: Callable[..., None]

    @staticmethod
    def _successor_guess(claim: Claim, head: Doc | None, outcome: str, claim_next: Collection[str]) -> str | None:
        """The row a settle of ``claim`` would claim next, by the head known (None: none likely)."""
        if outcome == RETRY or not claim_next or head is None:
            return None
        after = [e for e in head.get("live") or [] if e[1] != claim.effect_id]
        return str(after[0][1]) if after and after[0][2] in claim_next else None

    @staticmethod
    def _ahead_ids(known: Doc | None, guess: str, claim_next: Collection[str]) -> list[str]:
        """``guess`` and the live rows right after it in the head ``known``, of the types claimed next."""
        ids, seen = [guess], False
        for entry in (known or {}).get("live") or []:
            if len(ids) >= READ_AHEAD:
                break
            if seen:
                if entry[2] not in claim_next:
                    break
                ids.append(str(entry[1]))
            seen = seen or entry[1] == guess
        return ids

    def _settle_read(
        self, lane: str, claim: Claim, guess: str | None, claim_next: Collection[str]
    ) -> tuple[Doc | None, Doc | None]:
        """The head, and the guessed successor row, in one read (with the rows after it, kept in
        ``claim.ahead``)."""
        if guess is None:
            return self.store.read(lane, HEAD_ID), None
        ids = self._ahead_ids(claim.head, guess, claim_next)
        head, *rows = self.store.read_many(lane, [HEAD_ID, *(row_id(i) for i in ids)])
        claim.ahead = rows_found(ids, rows)
        return head, claim.ahead.get(guess)

    def _settled_anyway(
        self, lane: str, claim: Claim, new_row: Doc, successor: tuple[Doc, Doc] | None
    ) -> list[str | None] | None:
        """After a settle batch raised a store error: the etags as stored, if it applied."""
        ids = [HEAD_ID, row_id(claim.effect_id)] + ([row_id(str(successor[0]["effect_id"]))] if successor else [])
        try:
            docs = self.store.read_many(lane, ids)
        except StoreError:
            return None
        head, row = docs[0], docs[1]
        if head is None or row is None or row.get("_etag") == claim.etag:
            return None
        same = ("status", "attempt", "available_at", "completed_at", "lease")
        if any(row.get(f) != new_row.get(f) for f in same):
            return None
        if successor is None:
            return [row["_etag"], head["_etag"]]
        nxt = docs[2]
        lease = (nxt or {}).get("lease") or {}
        if nxt is None or nxt.get("status") != RUNNING or lease.get("owner") != claim.owner:
            return None
        successor[0].update(_strip(nxt))
        successor[1].clear()
        successor[1].update(_strip(head))
        return [row["_etag"], nxt["_etag"], head["_etag"]]

    def _still_mine(
        self, claim: Claim, guess: str | None, claim_next: Collection[str] = (), known: Doc | None = None
    ) -> tuple[str | None, Doc | None, Doc | None]:
        """After a failed settle: (None to try again, or why the row is not ours any more) with
        the head and the ``guess``ed successor row (and the rows after it) read in the same call."""
        ahead = [] if guess is None else self._ahead_ids(known, guess, claim_next)
        docs = self.store.read_many(lane_pk(claim.key), [HEAD_ID, row_id(claim.effect_id), *map(row_id, ahead)])
        head, row = docs[0], docs[1]
        if guess is not None:
            claim.ahead = rows_found(ahead, docs[2:])
        prefetched = claim.ahead.get(guess) if guess is not None else None
        lease = (row or {}).get("lease") or {}
        if row is not None and row.get("status") == CANCELLED and lease.get("owner") == claim.owner:
            claim.cancelled = True
            return CANCELLED, head, prefetched
        if row is None or row.get("status") != RUNNING or lease.get("owner") != claim.owner:
            claim.lost = True
            log.warning("effect %s: lease lost before settle (now %s)", claim.effect_id, (row or {}).get("status"))
            self._emit("effect_lease_lost", effect_id=claim.effect_id, key=claim.key)
            return LEASE_LOST, head, prefetched
        claim.row, claim.etag = _strip(row), str(row["_etag"])
        return None, head, prefetched
