"""The liveness scan beat runs (docs/architecture.md §9): what keeps the outbox moving after failures.

* ``outbox_admit`` due — an intent whose enqueuer crashed between its commit and the admission
  (a transactional enqueue, a workflow's ``emit``): admit it now (idempotent by effect id).
* ``outbox`` due on a lane head — its first row is claimable but unclaimed (message lost, or a
  retry whose countdown message was lost): send it again; or its lease expired (the worker died
  or hung): replay-safe types are requeued, process-bound types failed with the reason.
* ``outbox_prune`` due — a succeeded or cancelled row past its retention: delete it (failed rows
  never get this due kind: they are kept, indexed under ``outbox_failed``, which no scan processes:
  ``problems`` lists them).

Every action is an etag-guarded write made before anything is sent, so two beats by mistake
send at most one message per lane and interval.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery_durable.engine.documents.model import lease_live
from celery_durable.engine.documents.records import count_of
from celery_durable.engine.outbox.model import (
    CANCELLED,
    DUE_ADMIT,
    DUE_LANE,
    DUE_PRUNE,
    FAILED,
    HEAD_ID,
    INDEX_ID,
    LIVE,
    PENDING,
    RUNNING,
    SUCCEEDED,
    EffectRef,
    LaneOps,
    ScanReport,
    index_pk,
    row_id,
    settled_due,
)
from celery_durable.engine.outbox.model import strip as _strip
from celery_durable.errors import ConflictError, DurableError, LaneFull
from celery_durable.stores.base import Doc, Op

__all__ = ["Scanner"]

MAX_PRUNE_ROUNDS = 20

log = logging.getLogger("celery_durable.outbox")


class Scanner:
    def __init__(self, outbox: LaneOps) -> None:
        self.outbox = outbox
        self.store = outbox.store
        self.settings = outbox.settings

    def scan(self, limit: int = 500) -> ScanReport:
        report = ScanReport()
        now = self.outbox.clock.now()
        for ref in self.store.scan_due(DUE_ADMIT, now, limit):
            self._guard(report, self._admit_due, ref.pk, ref.id, report)
        for ref in self.store.scan_due(DUE_LANE, now, limit):
            self._guard(report, self._lane_due, ref.pk, now, report)
        for ref in self.store.scan_due(DUE_PRUNE, now, limit):
            self._guard(report, self._prune, ref.pk, ref.id, now, report)
        return report

    def _guard(self, report: ScanReport, fn: Callable[..., None], *args: Any) -> None:
        # one bad document or lane never stops the scan of the others
        try:
            fn(*args)
        except (DurableError, KeyError, TypeError, ValueError, IndexError) as exc:
            report.errors += 1
            log.exception("outbox scan of %s failed: %s", args[0], exc)

    def _admit_due(self, pk: str, doc_id: str, report: ScanReport) -> None:
        doc = self.store.read(pk, doc_id)
        if doc is not None and doc.get("due_kind") == DUE_ADMIT:
            try:
                self.outbox.admit_intent(doc)
            except LaneFull as exc:  # it stays due (later): the lane drains, then it gets in
                report.deferred += 1
                log.warning("outbox scan: intent %s/%s deferred: %s", pk, doc_id, exc)
                return
            report.admitted += 1

    def _lane_due(self, lane: str, now: float, report: ScanReport) -> None:
        store = self.store
        head = store.read(lane, HEAD_ID)
        if head is None or head.get("due_kind") != DUE_LANE:
            return
        new_head = _strip(head)
        live = head.get("live") or []
        running = head.get("running")
        if not live and running is None:
            self.outbox._head_due(new_head, now)
            self._try_replace(new_head, head, report)
            return
        first = str(running or live[0][1])
        row = store.read(lane, row_id(first))
        status = (row or {}).get("status")
        if running is not None and row is not None and status in (RUNNING, CANCELLED) and lease_live(row, now):
            # its handler runs (a cancelled one holds the key until it stopped): wait for its lease
            new_head["due_at"] = float(row["lease"]["expires"])
            self._try_replace(new_head, head, report)
            return
        if row is None or status not in LIVE:
            # repair: a row that is gone, settled, or cancelled with its lease lapsed frees its key
            new_head.update(live=[e for e in live if e[1] != first], running=None, freed_at=now)
            self.outbox._head_due(new_head, now)
            if self._try_replace(new_head, head, report):
                report.repaired += 1
                self.outbox._wake_first(new_head)
            return
        if status == RUNNING:
            self._lease_expired(head, row, now, report)
            return
        # pending and first: its message was lost, or its retry is due, or it is not yet available
        new_head["running"] = None
        available = float(row.get("available_at") or 0.0)
        if available > now:
            new_head["due_at"] = available
            self._try_replace(new_head, head, report)
            return
        new_head["due_at"] = now + self.settings.queue_timeout
        if self._try_replace(new_head, head, report):
            report.resent += 1
            self.outbox._emit("effect_resent", effect_id=row["effect_id"], key=row["key"])
            self.outbox.send(EffectRef(str(row["key"]), str(row["effect_id"]), str(row["effect_type"])))

    def _lease_expired(self, head: Doc, row: Doc, now: float, report: ScanReport) -> None:
        """The worker running this row died (or hung past its lease): requeue or fail it."""
        lane = str(head["pk"])
        owner = (row.get("lease") or {}).get("owner")
        attempt, max_attempts = count_of(row, "attempt"), int(row.get("max_attempts") or 1)
        new_row = _strip(row) | {"lease": None, "lost": count_of(row, "lost") + 1}
        new_head = _strip(head) | {"running": None, "freed_at": now}
        if row.get("replay_safe") and attempt < max_attempts:
            new_row.update(
                status=PENDING,
                available_at=now,
                last_error=f"worker {owner} lost its lease during attempt {attempt}; requeued (replay-safe type)",
            )
            new_head.update(due_kind=DUE_LANE, due_at=now + self.settings.queue_timeout)
            requeued = True
        else:
            why = (
                f"attempts exhausted ({attempt}/{max_attempts}) after worker {owner} lost its lease"
                if row.get("replay_safe")
                else f"process-bound effect: worker {owner} lost its lease after execution started "
                f"(attempt {attempt}); not retried"
            )
            new_row.update(status=FAILED, completed_at=now, reason=why, last_error=why)
            new_row.update(settled_due(FAILED, now, self.settings.retention))  # listed by ``problems``
            new_head["live"] = [e for e in head.get("live") or [] if e[1] != row["effect_id"]]
            self.outbox._head_due(new_head, now)
            requeued = False
        try:
            self.store.batch(lane, [Op.replace(new_row, row["_etag"]), Op.replace(new_head, head["_etag"])])
        except ConflictError:
            return  # renewed, settled or handled by another scanner meanwhile
        eid, key = str(row["effect_id"]), str(row["key"])
        if requeued:
            report.requeued += 1
            log.warning("effect %s (%s): lease of %s expired; requeued", eid, row["effect_type"], owner)
            self.outbox._emit("effect_requeued", effect_id=eid, key=key)
            self.outbox.send(EffectRef(key, eid, str(row["effect_type"])))
        else:
            report.failed += 1
            log.error("effect %s (%s): %s", eid, row["effect_type"], new_row["reason"])
            self.outbox._emit("effect_failed", effect_id=eid, key=key, reason=new_row["reason"])
            self.outbox._wake_first(new_head)

    def _try_replace(self, new: Doc, old: Doc, report: ScanReport) -> bool:
        try:
            self.store.replace(new, if_match=old["_etag"])
            return True
        except ConflictError:
            return False  # someone (a worker, another beat) changed it: they are on it

    def _prune(self, pk: str, doc_id: str, now: float, report: ScanReport) -> None:
        row = self.store.read(pk, doc_id)
        if row is None or row.get("due_kind") != DUE_PRUNE or row.get("status") not in (SUCCEEDED, CANCELLED):
            return
        if float(row.get("due_at") or 0.0) > now:
            return
        lease = row.get("lease") or {}
        if float(lease.get("expires") or 0.0) > now:
            # a cancelled row whose handler still runs (its heartbeat renews the lease): the row
            # holds its key until the handler stops, so it stays until the lease is given back
            # or expires (a retention shorter than a handler's run must not free the key)
            later = _strip(row) | {"due_at": float(lease["expires"])}
            try:
                self.store.replace(later, if_match=row["_etag"])
            except ConflictError:
                pass  # renewed or released meanwhile: the next scan looks again
            return
        # the index goes first, etag-guarded, and only if it is this row's (same token): an
        # enqueue reviving or taking over the id writes a new index before its row, so either
        # this delete fails (and the row stays) or that enqueue starts over
        index = self.store.read(index_pk(str(row["effect_id"])), INDEX_ID)
        if index is not None and index.get("token") == row.get("token") and index.get("key") == row.get("key"):
            try:
                self.store.delete(index["pk"], INDEX_ID, if_match=index["_etag"])
            except ConflictError:
                return
        for _ in range(MAX_PRUNE_ROUNDS):
            head = self.store.read(pk, HEAD_ID)
            ops = [Op.delete(doc_id, if_match=row["_etag"])]
            if head is not None and head.get("stored") is not None:
                left = max(0, int(head["stored"]) - 1)
                if left == 0 and not head.get("live") and head.get("running") is None:
                    ops.append(Op.delete(HEAD_ID, if_match=head["_etag"]))  # the lane is gone
                else:
                    ops.append(Op.replace(_strip(head) | {"stored": left}, head["_etag"]))
            try:
                self.store.batch(pk, ops)
            except ConflictError:
                current = self.store.read(pk, doc_id)
                if current is None or current.get("_etag") != row.get("_etag"):
                    return  # revived by a repeat enqueue (or pruned by another scan) meanwhile
                continue  # the head moved: count again
            report.pruned += 1
            return
