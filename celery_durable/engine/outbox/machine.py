"""Enqueue, admit, claim, renew, settle and cancel: the outbox's transitions (see ``model``).

Every transition that touches a lane writes the row and the head in one all-or-nothing batch of
the lane partition, guarded by both etags: a settle therefore applies only while the settler
still owns the lease (the row's etag), and two claimers of one key cannot both win (the head's).
"""

from __future__ import annotations

import bisect
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ...errors import ConflictError, StoreError
from ...stores.base import Doc, Op, Store
from ..model import Clock, SystemClock, worker_identity
from .model import (
    CANCELLED,
    DUE_ADMIT,
    DUE_LANE,
    DUE_PRUNE,
    FAILED,
    HEAD_ID,
    INDEX_ID,
    LIVE,
    PENDING,
    RETRY,
    RUNNING,
    SUCCEEDED,
    Admitted,
    Claim,
    ClaimResult,
    EffectRef,
    EffectSender,
    LaneFull,
    OutboxSettings,
    ScanReport,
    index_pk,
    intent_id,
    lane_pk,
    row_id,
)
from .model import strip as _strip
from .scan import Scanner

__all__ = ["OutboxEngine", "MAX_ROUNDS"]

log = logging.getLogger("celery_durable.outbox")

MAX_ROUNDS = 100


class OutboxEngine:
    """Enqueue, admit, claim, renew, settle, cancel, scan — all against :class:`Store`."""

    def __init__(
        self,
        store: Store,
        sender: EffectSender,
        settings: OutboxSettings | None = None,
        clock: Clock | None = None,
        events: Callable[..., None] | None = None,
    ) -> None:
        self.store = store
        self.sender = sender
        self.settings = settings or OutboxSettings()
        self.clock: Clock = clock or SystemClock()
        self._events = events
        self._created_lock = threading.Lock()
        self._last_created = 0.0

    def _emit(self, event: str, **kwargs: Any) -> None:
        if self._events is not None:
            self._events(event, **kwargs)

    # --- enqueue ----------------------------------------------------------------------------

    def effect_body(
        self,
        effect_type: str,
        payload: Any,
        *,
        key: str | None,
        effect_id: str | None,
        available_at: float | None,
        replay_safe: bool,
        max_attempts: int,
        now: float | None = None,
    ) -> Doc:
        """The portable description of one enqueue (``payload`` already JSON)."""
        eid = effect_id or uuid.uuid4().hex
        created = self._created_at(now)
        return {
            "id": eid,
            "type": effect_type,
            "key": key or eid,
            "payload": payload,
            "created_at": created,
            "available_at": max(created, float(available_at)) if available_at is not None else created,
            "replay_safe": bool(replay_safe),
            "max_attempts": int(max_attempts),
        }

    def _created_at(self, now: float | None) -> float:
        # strictly increasing within a process, so one enqueuer's rows keep their order
        with self._created_lock:
            t = max(self.clock.now() if now is None else now, self._last_created + 1e-6)
            self._last_created = t
            return t

    def intent(self, pk: str, effect: Doc) -> Doc:
        """The intent document to create in partition ``pk`` with the caller's own documents."""
        return {
            "pk": pk,
            "id": intent_id(str(effect["id"])),
            "type": "effect_intent",
            "effect": effect,
            "due_kind": DUE_ADMIT,
            "due_at": float(effect["created_at"]) + self.settings.admit_grace,
        }

    def admit(self, effect: Doc, source: Doc | None = None) -> Admitted:
        """Put an effect in its lane (idempotent by id); wake the lane if it became claimable."""
        eid, key = str(effect["id"]), str(effect["key"])
        store, now = self.store, self.clock.now()
        index = {
            "pk": index_pk(eid),
            "id": INDEX_ID,
            "type": "effect_index",
            "key": key,
            "effect_type": effect["type"],
            "created_at": effect["created_at"],
        }
        if store.create(index) is None:
            existing = store.read(index_pk(eid), INDEX_ID)
            if existing is not None and existing.get("key") != key:
                other = str(existing.get("key"))
                if store.read(lane_pk(other), row_id(eid)) is not None:
                    log.info("effect %s was already enqueued under key %r", eid, other)
                    return Admitted(eid, other, False)
                # an enqueuer died between the index and its lane: the id is free, take it
                try:
                    store.replace(index, if_match=existing["_etag"])
                except ConflictError:
                    return self.admit(effect, source)
        lane = lane_pk(key)
        row: Doc = {
            "pk": lane,
            "id": row_id(eid),
            "type": "effect",
            "effect_id": eid,
            "effect_type": effect["type"],
            "key": key,
            "payload": effect.get("payload"),
            "status": PENDING,
            "attempt": 0,
            "max_attempts": int(effect.get("max_attempts") or 1),
            "replay_safe": bool(effect.get("replay_safe")),
            "available_at": float(effect["available_at"]),
            "created_at": float(effect["created_at"]),
            "lease": None,
            "last_error": None,
            "reason": None,
            "lost": 0,
            "started_at": None,
            "completed_at": None,
            "source": None if source is None else {"pk": source["pk"], "id": source["id"]},
        }
        entry = [row["created_at"], eid, row["effect_type"]]
        for _ in range(MAX_ROUNDS):
            head = store.read(lane, HEAD_ID)
            live: list[list[Any]] = [list(e) for e in (head or {}).get("live") or []]
            if len(live) >= self.settings.max_lane_backlog:
                raise LaneFull(f"key {key!r} has {len(live)} live effects (limit {self.settings.max_lane_backlog})")
            running = (head or {}).get("running")
            pos = bisect.bisect(live, entry)
            if running is not None and pos == 0:
                pos = 1  # never ahead of the running row
            live.insert(pos, entry)
            first = pos == 0 and running is None
            new_head: Doc = _strip(head) if head is not None else {"pk": lane, "id": HEAD_ID, "type": "effect_lane"}
            new_head.update(key=key, live=live, running=running)
            send_in: float | None = None
            if first:
                wait = max(0.0, row["available_at"] - now)
                if wait <= self.settings.fast_send_max:
                    send_in = wait
                    new_head.update(due_kind=DUE_LANE, due_at=now + wait + self.settings.queue_timeout)
                else:
                    new_head.update(due_kind=DUE_LANE, due_at=row["available_at"])
            elif not new_head.get("due_kind"):
                new_head.update(due_kind=DUE_LANE, due_at=now + self.settings.queue_timeout)
            head_op = Op.create(new_head) if head is None else Op.replace(new_head, head["_etag"])
            try:
                store.batch(lane, [Op.create(row), head_op])
            except ConflictError:
                if store.read(lane, row_id(eid)) is not None:
                    return Admitted(eid, key, False)
                continue
            self._emit("effect_enqueued", effect_id=eid, key=key, effect_type=row["effect_type"])
            if send_in is not None:
                self.sender.send_effect(EffectRef(key, eid, row["effect_type"]), countdown=send_in or None)
            return Admitted(eid, key, True)
        raise StoreError(f"could not enqueue effect {eid!r}: key {key!r} too contended")

    def admit_intent(self, doc: Doc) -> Admitted | None:
        """Admit an intent document (``fxi:`` or an ``emit`` step marker), then clear it."""
        effect = doc.get("effect")
        if not isinstance(effect, dict):
            return None
        admitted = self.admit(effect, source=doc)
        try:
            if doc.get("type") == "effect_intent":
                self.store.delete(doc["pk"], doc["id"])
            elif doc.get("due_kind") == DUE_ADMIT:
                cleared = _strip(doc) | {"due_kind": None, "due_at": None, "admitted": True}
                self.store.replace(cleared, if_match=doc.get("_etag"))
        except ConflictError:
            pass  # cleared by someone else (a second admitter); admission is idempotent anyway
        return admitted

    # --- claim ------------------------------------------------------------------------------

    def claim(self, key: str, effect_id: str, owner: str | None = None) -> ClaimResult:
        """Claim the row if it is the first live row of its key, nothing runs and it is available."""
        store, lane = self.store, lane_pk(key)
        owner = owner or f"{worker_identity()}:{uuid.uuid4().hex[:6]}"
        for _ in range(MAX_ROUNDS):
            head = store.read(lane, HEAD_ID)
            row = store.read(lane, row_id(effect_id))
            if row is None or head is None:
                return ClaimResult(None, "missing")
            status = row.get("status")
            if status == RUNNING:
                return ClaimResult(None, "duplicate")
            if status != PENDING:
                return ClaimResult(None, "settled")
            live = head.get("live") or []
            if head.get("running") is not None or not live or live[0][1] != effect_id:
                return ClaimResult(None, "blocked")
            now = self.clock.now()
            available = float(row.get("available_at") or 0.0)
            if available > now + 0.005:
                return ClaimResult(None, "early", wait=available - now)
            expires = now + self.settings.lease_ttl
            new_row = _strip(row)
            new_row.update(
                status=RUNNING,
                attempt=int(row.get("attempt") or 0) + 1,
                lease={"owner": owner, "expires": expires},
                started_at=now,
                eligible_at=max(available, float(row.get("created_at") or 0.0), float(head.get("freed_at") or 0.0)),
            )
            new_head = _strip(head) | {"running": effect_id, "due_kind": DUE_LANE, "due_at": expires}
            try:
                etags = store.batch(lane, [Op.replace(new_row, row["_etag"]), Op.replace(new_head, head["_etag"])])
            except ConflictError:
                continue
            claim = Claim(
                key=key,
                effect_id=effect_id,
                type=str(row["effect_type"]),
                payload=row.get("payload"),
                attempt=int(new_row["attempt"]),
                max_attempts=int(row.get("max_attempts") or 1),
                replay_safe=bool(row.get("replay_safe")),
                owner=owner,
                row=new_row,
                etag=str(etags[0]),
                head=new_head | {"_etag": etags[1]},
            )
            self._emit("effect_claimed", effect_id=effect_id, key=key, attempt=claim.attempt, effect_type=claim.type)
            return ClaimResult(claim, "claimed")
        return ClaimResult(None, "blocked")

    def renew(self, claim: Claim) -> str:
        """Heartbeat: ``ok``, ``cancelled`` or ``lost``; extends the lease when it runs low."""
        with claim.lock:
            if claim.cancelled or claim.lost:
                return "cancelled" if claim.cancelled else "lost"
            row = self.store.read(lane_pk(claim.key), row_id(claim.effect_id))
            if row is not None and row.get("status") == CANCELLED:
                claim.cancelled = True
                return "cancelled"
            lease = (row or {}).get("lease") or {}
            if row is None or row.get("status") != RUNNING or lease.get("owner") != claim.owner:
                claim.lost = True
                self._emit("effect_lease_lost", effect_id=claim.effect_id, key=claim.key)
                return "lost"
            claim.row, claim.etag = _strip(row), str(row["_etag"])
            now = self.clock.now()
            if float(lease.get("expires") or 0.0) - now > self.settings.lease_ttl - self.settings.heartbeat_interval:
                return "ok"
            renewed = _strip(row) | {"lease": {"owner": claim.owner, "expires": now + self.settings.lease_ttl}}
            try:
                claim.etag = self.store.replace(renewed, if_match=row["_etag"])
                claim.row = renewed
            except ConflictError:
                pass  # changed under us: the next beat (or the settle) finds out why
            return "ok"

    # --- settle -----------------------------------------------------------------------------

    def settle(
        self, claim: Claim, outcome: str, *, error: str | None = None, delay: float = 0.0, reason: str | None = None
    ) -> str:
        """Settle a claimed row: ``succeeded``, ``failed`` or ``retry`` (pending after ``delay``).

        Applies only while ``claim`` still owns the lease (its etag); otherwise nothing is
        written and the answer is ``cancelled`` (the row was cancelled meanwhile: a normal
        outcome) or ``lease-lost``. Store errors propagate (the caller decides requeue vs
        terminalize).
        """
        assert outcome in (SUCCEEDED, FAILED, RETRY), outcome
        store, lane = self.store, lane_pk(claim.key)
        with claim.lock:
            if claim.cancelled:
                return CANCELLED
            for attempt in range(MAX_ROUNDS):
                # first try with the head as the claim left it (no read); re-read after a conflict
                head = claim.head if attempt == 0 and claim.head is not None else store.read(lane, HEAD_ID)
                now = self.clock.now()
                new_row = dict(claim.row) | {"lease": None}
                if error is not None:
                    new_row["last_error"] = error[-4000:]
                live = [list(e) for e in (head or {}).get("live") or []]
                new_head = _strip(head) if head is not None else None
                if outcome == RETRY:
                    available = now + max(0.0, delay)
                    new_row.update(status=PENDING, available_at=available)
                    due = available + self.settings.queue_timeout
                    if new_head is not None:
                        new_head.update(running=None, due_kind=DUE_LANE, due_at=due, freed_at=now)
                else:
                    new_row.update(
                        status=outcome, completed_at=now, reason=reason or (error if outcome == FAILED else None)
                    )
                    if outcome == SUCCEEDED:
                        new_row.update(due_kind=DUE_PRUNE, due_at=now + self.settings.retention)
                    live = [e for e in live if e[1] != claim.effect_id]
                    if new_head is not None:
                        new_head.update(live=live, running=None, freed_at=now)
                        self._head_due(new_head, now)
                ops = [Op.replace(new_row, claim.etag)]
                if new_head is not None and head is not None:
                    ops.append(Op.replace(new_head, head["_etag"]))
                try:
                    store.batch(lane, ops)
                except ConflictError:
                    verdict = self._still_mine(claim)
                    if verdict is not None:
                        return verdict
                    continue
                claim.lost = True  # settled: the lease is gone
                self._emit(
                    "effect_settled", effect_id=claim.effect_id, key=claim.key, outcome=outcome, attempt=claim.attempt
                )
                if outcome != RETRY and new_head is not None:
                    self._wake_first(new_head)
                return outcome
        raise StoreError(f"could not settle effect {claim.effect_id!r}: key {claim.key!r} too contended")

    def _still_mine(self, claim: Claim) -> str | None:
        """After a failed settle: None to try again, else why the row is not ours any more."""
        row = self.store.read(lane_pk(claim.key), row_id(claim.effect_id))
        if row is not None and row.get("status") == CANCELLED:
            claim.cancelled = True
            return CANCELLED
        lease = (row or {}).get("lease") or {}
        if row is None or row.get("status") != RUNNING or lease.get("owner") != claim.owner:
            claim.lost = True
            log.warning("effect %s: lease lost before settle (now %s)", claim.effect_id, (row or {}).get("status"))
            self._emit("effect_lease_lost", effect_id=claim.effect_id, key=claim.key)
            return "lease-lost"
        claim.row, claim.etag = _strip(row), str(row["_etag"])
        return None

    def _head_due(self, head: Doc, now: float) -> None:
        if head.get("live"):
            head.update(due_kind=DUE_LANE, due_at=now + self.settings.queue_timeout)
        else:
            head.update(due_kind=None, due_at=None)

    def _wake_first(self, head: Doc) -> None:
        live = head.get("live") or []
        if live and head.get("running") is None:
            _, eid, etype = live[0]
            self.sender.send_effect(EffectRef(str(head["key"]), str(eid), str(etype)))

    # --- cancel -----------------------------------------------------------------------------

    def cancel(
        self,
        effect_id: str | None = None,
        *,
        key: str | None = None,
        types: Sequence[str] | None = None,
        reason: str = "cancelled",
    ) -> int:
        """Cancel pending or running rows by id, or every live row of ``key`` (of ``types``)."""
        if effect_id is not None:
            index = self.store.read(index_pk(effect_id), INDEX_ID)
            if index is None:
                return 0
            return int(self._cancel_one(str(index["key"]), effect_id, reason))
        if key is None:
            raise ValueError("cancel() needs an effect id or a key")
        head = self.store.read(lane_pk(key), HEAD_ID)
        wanted = None if types is None else set(types)
        ids = [str(e[1]) for e in (head or {}).get("live") or [] if wanted is None or e[2] in wanted]
        return sum(1 for eid in ids if self._cancel_one(key, eid, reason))

    def _cancel_one(self, key: str, effect_id: str, reason: str) -> bool:
        store, lane = self.store, lane_pk(key)
        for _ in range(MAX_ROUNDS):
            head = store.read(lane, HEAD_ID)
            row = store.read(lane, row_id(effect_id))
            if row is None or row.get("status") not in LIVE:
                return False
            now = self.clock.now()
            new_row = _strip(row) | {
                "status": CANCELLED,
                "completed_at": now,
                "reason": reason,
                "lease": None,
                "due_kind": DUE_PRUNE,
                "due_at": now + self.settings.retention,
            }
            ops = [Op.replace(new_row, row["_etag"])]
            new_head: Doc | None = None
            if head is not None:
                new_head = _strip(head)
                new_head["live"] = [e for e in head.get("live") or [] if e[1] != effect_id]
                if head.get("running") == effect_id:
                    new_head.update(running=None, freed_at=now)
                if new_head.get("running") is None:
                    self._head_due(new_head, now)
                ops.append(Op.replace(new_head, head["_etag"]))
            try:
                store.batch(lane, ops)
            except ConflictError:
                continue
            self._emit("effect_cancelled", effect_id=effect_id, key=key, was=row.get("status"))
            if new_head is not None and new_head.get("running") is None:
                self._wake_first(new_head)  # a cancel unblocks the later rows of the key
            return True
        raise StoreError(f"could not cancel effect {effect_id!r}: key {key!r} too contended")

    # --- reading ----------------------------------------------------------------------------

    def get(self, effect_id: str) -> Doc | None:
        """The row of an effect, found through its index."""
        index = self.store.read(index_pk(effect_id), INDEX_ID)
        return None if index is None else self.store.read(lane_pk(str(index["key"])), row_id(effect_id))

    def rows(self, key: str) -> list[Doc]:
        """Every row of a key (live, settled not yet pruned, failed), in order."""
        docs = self.store.query_partition(lane_pk(key)).docs
        rows = [d for d in docs if d.get("type") == "effect"]
        return sorted(rows, key=lambda d: (float(d.get("created_at") or 0.0), str(d.get("effect_id"))))

    def head(self, key: str) -> Doc | None:
        return self.store.read(lane_pk(key), HEAD_ID)

    # --- liveness scan (beat) ---------------------------------------------------------------

    def scan(self, limit: int = 500) -> ScanReport:
        """Admit stray intents, resend lost messages and due retries, settle expired leases, prune."""
        return Scanner(self).scan(limit)
