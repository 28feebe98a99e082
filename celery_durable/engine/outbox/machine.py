"""Claim, renew, settle and cancel: the outbox's transitions (see ``model``; admission is in
``admission``, the liveness scan in ``scan``).

Every transition that touches a lane writes the row and the head in one all-or-nothing batch of
the lane partition, guarded by both etags: a settle therefore applies only while the settler
still owns the lease (the row's etag), and two claimers of one key cannot both win (the head's).
A settle may claim the key's next row in the same batch (``claim_next``): the worker runs it
without a message, which is what makes a busy key cost two round trips an effect.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Collection, Sequence
from typing import Any

from celery_durable.engine.documents.model import Clock, SystemClock, worker_identity
from celery_durable.engine.documents.records import count_of, seq_of
from celery_durable.engine.outbox.admission import MAX_ROUNDS, Admission
from celery_durable.engine.outbox.cancel import Canceller
from celery_durable.engine.outbox.model import (
    CANCELLED,
    DUE_ADMIT,
    DUE_LANE,
    FAILED,
    HEAD_ID,
    INDEX_ID,
    PENDING,
    RETRY,
    RUNNING,
    SUCCEEDED,
    Admitted,
    Claim,
    ClaimResult,
    ClaimUnknown,
    ConflictPause,
    EffectRef,
    EffectSender,
    OutboxSettings,
    ScanReport,
    digest,
    held_by,
    index_pk,
    intent_id,
    lane_pk,
    row_id,
    settled_due,
)
from celery_durable.engine.outbox.model import strip as _strip
from celery_durable.engine.outbox.problems import ProblemReads
from celery_durable.engine.outbox.reads import LEASE_LOST, READ_AFTER_STALE, READ_AHEAD, SettleReads, rows_found
from celery_durable.engine.outbox.repeats import admit_once
from celery_durable.engine.outbox.scan import Scanner
from celery_durable.engine.outcomes import ClaimOutcome
from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    IdempotencyConflict,
    LaneFull,
    StoreError,
    StoreUnavailable,
)
from celery_durable.stores.base import Doc, Op, Store

__all__ = ["OutboxEngine", "MAX_ROUNDS", "LEASE_LOST"]

log = logging.getLogger("celery_durable.outbox")

#: effect ids and keys become document ids and partition keys (``fxid:<id>``, ``fxq:<key>``)
MAX_ID_LENGTH = 200


class OutboxEngine(SettleReads, ProblemReads):
    """Enqueue, admit, claim, renew, settle, cancel, scan, list problems — all against :class:`Store`."""

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
        #: reintroduced bugs ("cancel_frees_key"), for the simulation's can-fail tests only
        self.bugs: frozenset[str] = frozenset()
        #: after a lost conditional write: wait out a lagging replica before reading again
        self.pause = ConflictPause(store)
        self._admission = Admission(self)

    def _emit(self, event: str, **kwargs: Any) -> None:
        if self._events is not None:
            self._events(event, **kwargs)

    def send(self, ref: EffectRef, countdown: float | None = None) -> None:
        """Send a row's message after its write committed. A broker error is logged, not raised:
        the write stands (a caller retrying would enqueue twice) and the lane's due time makes
        beat's scan send it again."""
        try:
            self.sender.send_effect(ref, countdown=countdown)
        except Exception as exc:  # the broker's errors are not ours to type
            log.warning(
                "message for effect %s (key %s) not sent, the scan will resend it: %s", ref.effect_id, ref.key, exc
            )

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
        for name, value in (("effect_id", effect_id), ("key", key)):
            # an empty id would silently become a random one (a repeat would run twice) and an
            # empty key would silently drop the ordering: refuse them in the caller
            if value is not None and (not isinstance(value, str) or not value or len(value) > MAX_ID_LENGTH):
                raise ConfigurationError(
                    f"{name} must be a non-empty string of at most {MAX_ID_LENGTH} characters, got {value!r}"
                )
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
        # strictly increasing within a process (timestamps only: the order is the lane's seq)
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
        """Put an effect in its lane (idempotent by id); wake the lane if it became claimable.

        Raises :class:`IdempotencyConflict` (the id holds another request) and :class:`LaneFull`
        (nothing written)."""
        return self._admission.admit(effect, source)

    def admit_many(self, effects: Sequence[Doc]) -> list[Admitted]:
        """Admit many effects with one head read and one batch per key (``Admission.admit_many``)."""
        return self._admission.admit_many(effects)

    def check_admissible(self, effect: Doc) -> None:
        """Raise now what admitting ``effect`` would raise (:class:`LaneFull`, an
        :class:`IdempotencyConflict`, ``DocumentTooLarge``): a caller about to commit its intent
        with its own documents learns it before they commit (a race after this check leaves the
        intent waiting, due for the scan)."""
        self._admission.check_size(effect)
        index = self.store.read(index_pk(str(effect["id"])), INDEX_ID)
        row = None if index is None else self.store.read(lane_pk(str(index["key"])), row_id(str(effect["id"])))
        finished = row is not None and self._admission._expired(row)
        if index is not None and index.get("digest") != digest(effect) and row is not None and not finished:
            raise IdempotencyConflict(f"effect id {effect['id']!r} was already enqueued with another request")
        if row is not None and not finished:
            return  # a repeat: never refused for a full lane
        key = str(effect["key"])
        head = self.store.read(lane_pk(key), HEAD_ID)
        live = [list(e) for e in (head or {}).get("live") or []]
        self._admission._check_room(key, live, {"effect_id": effect["id"], "effect_type": effect["type"]}, head)

    def admit_intent(self, doc: Doc) -> Admitted | None:
        """Admit an intent document (``fxi:`` or an ``emit`` step marker), then clear it.

        A lane that is full leaves the intent due later (:class:`LaneFull` propagates); an id that
        holds another request clears it with the conflict noted (the first enqueue stands)."""
        effect = doc.get("effect")
        if not isinstance(effect, dict):
            return None
        try:
            admitted, note = admit_once(self, effect, doc)
        except LaneFull:
            self._defer_intent(doc, full=True)
            raise
        except IdempotencyConflict as exc:
            if exc.pending:  # the other request may still fail and free the id: try again later
                log.warning("intent %s/%s waits: %s", doc["pk"], doc["id"], exc)
                self._defer_intent(doc)
                return None
            log.error("intent %s/%s not admitted: %s", doc["pk"], doc["id"], exc)
            admitted, note = None, {"admitted": False, "reason": "conflict", "conflict": str(exc)}
        try:
            if doc.get("type") == "effect_intent" and admitted is not None:
                self.store.delete(doc["pk"], doc["id"], if_match=doc.get("_etag"))
            elif doc.get("due_kind") == DUE_ADMIT:
                cleared = _strip(doc) | {"due_kind": None, "due_at": None} | note
                self.store.replace(cleared, if_match=doc.get("_etag"))
        except ConflictError:
            pass  # cleared by someone else (a second admitter); admission is idempotent anyway
        return admitted

    def _defer_intent(self, doc: Doc, full: bool = False) -> None:
        if full:
            self._admission.reserve(doc)
        later = _strip(doc) | {"due_at": self.clock.now() + self.settings.admit_grace}
        try:
            self.store.replace(later, if_match=doc.get("_etag"))
        except (ConflictError, StoreError):
            pass  # the scan finds it due again and retries sooner: harmless

    # --- claim ------------------------------------------------------------------------------

    def claim(
        self,
        key: str,
        effect_id: str,
        owner: str | None = None,
        after: Sequence[str] = (),
        adopt: tuple[str | Sequence[str], int] | None = None,
    ) -> ClaimResult:
        """Claim the row if it is the first live row of its key, nothing runs and it is available.

        ``after`` (the message's hint: rows enqueued right after this one) are read in the same
        call and kept in ``claim.ahead`` for the settles of the drain. ``adopt`` (owner, attempt)
        of an earlier claim whose outcome is unknown (:class:`ClaimUnknown`): if it applied, the
        row is taken over and returned as claimed (its handler never started). Its owner may be
        several (``ClaimUnknown.owners``: a take-over whose outcome was unknown too)."""
        store, lane = self.store, lane_pk(key)
        owner = owner or self.new_owner()
        adopted = () if adopt is None else (adopt[0],) if isinstance(adopt[0], str) else tuple(adopt[0])
        ahead = [str(i) for i in after if i != effect_id][: READ_AHEAD - 1]
        for rounds in range(MAX_ROUNDS):
            head, row, *rows = store.read_many(lane, [HEAD_ID, row_id(effect_id), *map(row_id, ahead)])
            if row is None:
                return ClaimResult(None, ClaimOutcome.MISSING)
            status = row.get("status")
            if status == RUNNING:
                if adopt is None or not held_by(row, head, effect_id, adopted, adopt[1]):
                    return ClaimResult(None, ClaimOutcome.DUPLICATE)
                assert head is not None  # _held_by checked it
                now = self.clock.now()
                taken = _strip(row) | {"lease": {"owner": owner, "expires": now + self.settings.lease_ttl}}
                try:
                    etag = store.replace(taken, if_match=row["_etag"])
                except ConflictError:
                    self.pause(rounds)
                    continue  # changed meanwhile (a duplicate of this delivery took it): look again
                except StoreError as exc:
                    # unknown again: the lease names the claim's owner(s) or ours; the next retry takes either
                    raise ClaimUnknown(str(exc), owner, count_of(row, "attempt"), adopted) from exc
                log.info("effect %s: an earlier claim applied though its answer was lost: taken over", effect_id)
                claim = self._claim_of(taken, etag, head, owner, now)
                claim.ahead = rows_found(ahead, rows)
                return ClaimResult(claim, ClaimOutcome.CLAIMED)
            if status != PENDING:
                return ClaimResult(None, ClaimOutcome.SETTLED)
            if head is None:
                return ClaimResult(None, ClaimOutcome.MISSING)
            live = head.get("live") or []
            if head.get("running") is not None or not live or live[0][1] != effect_id:
                return ClaimResult(None, ClaimOutcome.BLOCKED)
            now = self.clock.now()
            available = float(row.get("available_at") or 0.0)
            if available > now + 0.005:
                return ClaimResult(None, ClaimOutcome.EARLY, wait=available - now)
            new_row, new_head = self._claimed(row, head, owner, now)
            try:
                etags = store.batch(lane, [Op.replace(new_row, row["_etag"]), Op.replace(new_head, head["_etag"])])
            except ConflictError:
                # the head moved (an enqueue behind this row, a duplicate's claim), or was read
                # stale: a lagging replica serves that version again until it catches up
                self.pause(rounds)
                continue
            except StoreError as exc:
                # the answer was lost: if the claim applied, the row is ours and must run now
                # (otherwise nobody runs it and a process-bound effect is failed "after it started")
                try:
                    applied = self._claimed_anyway(lane, effect_id, owner, int(new_row["attempt"]))
                except StoreError:
                    # unknown: never run blind; the next delivery adopts the claim if it applied
                    raise ClaimUnknown(str(exc), owner, int(new_row["attempt"])) from exc
                if applied is None:
                    if isinstance(exc, StoreUnavailable):
                        # not seen is not "never": the batch may still land (a request in flight
                        # when its answer timed out; a read-back served by a replica that has not
                        # seen it yet). The retry takes the claim over if it did: without the owner
                        # it would find the row running, drop itself as a duplicate, and the key
                        # would stay held, its row run by nobody, until the lease expired and
                        # beat's scan requeued it
                        raise ClaimUnknown(str(exc), owner, int(new_row["attempt"])) from exc
                    raise
                new_row, new_head, etags = applied
            claim = self._claim_of(new_row, str(etags[0]), new_head | {"_etag": etags[1]}, owner, now)
            claim.ahead = rows_found(ahead, rows)
            return ClaimResult(claim, ClaimOutcome.CLAIMED)
        return ClaimResult(None, ClaimOutcome.CONTENDED, wait=1.0)

    def _claimed_anyway(
        self, lane: str, effect_id: str, owner: str, attempt: int
    ) -> tuple[Doc, Doc, list[str | None]] | None:
        """After a claim batch raised a store error: the row and head as stored, if it applied."""
        head, row = self.store.read_many(lane, [HEAD_ID, row_id(effect_id)])
        if not held_by(row, head, effect_id, (owner,), attempt):
            return None
        assert row is not None and head is not None  # _held_by checked them
        log.info("effect %s: the claim applied though its answer was lost", effect_id)
        return _strip(row), _strip(head), [row["_etag"], head["_etag"]]

    def new_owner(self) -> str:
        return f"{worker_identity()}:{uuid.uuid4().hex[:6]}"

    def _claimed(self, row: Doc, head: Doc, owner: str, now: float) -> tuple[Doc, Doc]:
        """The row and head after claiming ``row`` (no write)."""
        expires = now + self.settings.lease_ttl
        available = float(row.get("available_at") or 0.0)
        new_row = _strip(row)
        new_row.update(
            status=RUNNING,
            attempt=count_of(row, "attempt") + 1,
            lease={"owner": owner, "expires": expires},
            started_at=now,
            eligible_at=max(available, float(row.get("created_at") or 0.0), float(head.get("freed_at") or 0.0)),
        )
        new_head = _strip(head) | {"running": row["effect_id"], "due_kind": DUE_LANE, "due_at": expires}
        return new_row, new_head

    def _claim_of(self, row: Doc, etag: str, head: Doc | None, owner: str, now: float) -> Claim:
        claim = Claim(
            key=str(row["key"]),
            effect_id=str(row["effect_id"]),
            type=str(row["effect_type"]),
            payload=row.get("payload"),
            attempt=int(row["attempt"]),
            max_attempts=int(row.get("max_attempts") or 1),
            replay_safe=bool(row.get("replay_safe")),
            owner=owner,
            row=row,
            etag=etag,
            head=head,
            claimed_at=now,
        )
        # backlog, waited (metrics): the lane's live rows; how long the row waited once claimable
        backlog, waited = len((head or {}).get("live") or []), now - float(row.get("eligible_at") or now)
        self._emit("effect_claimed", effect_id=claim.effect_id, key=claim.key, attempt=claim.attempt,
                   effect_type=claim.type, backlog=backlog, waited=waited)  # fmt: skip
        return claim

    def renew(self, claim: Claim) -> str:
        """Heartbeat: ``ok``, ``cancelled`` or ``lost``; extends the lease when it runs low.

        A cancelled row's lease is still extended while its handler runs: the key stays held
        until the handler stopped (its settle frees it) or the lease expired (the worker died)."""
        with claim.lock:
            if claim.lost:
                return "cancelled" if claim.cancelled else "lost"
            row = self.store.read(lane_pk(claim.key), row_id(claim.effect_id))
            lease = (row or {}).get("lease") or {}
            if row is None or row.get("status") not in (RUNNING, CANCELLED) or lease.get("owner") != claim.owner:
                claim.lost = True
                self._emit("effect_lease_lost", effect_id=claim.effect_id, key=claim.key)
                return "cancelled" if claim.cancelled else "lost"
            if row.get("status") == CANCELLED:
                claim.cancelled = True
            claim.row, claim.etag = _strip(row), str(row["_etag"])
            now = self.clock.now()
            # renewed one poll early: beats come every cancel_poll, so the lease never has less
            # than lease_ttl - heartbeat_interval left by the holder's clock (the skew margin)
            low = self.settings.lease_ttl - self.settings.heartbeat_interval + self.settings.cancel_poll
            if float(lease.get("expires") or 0.0) - now <= low:
                renewed = _strip(row) | {"lease": {"owner": claim.owner, "expires": now + self.settings.lease_ttl}}
                try:
                    claim.etag = self.store.replace(renewed, if_match=row["_etag"])
                    claim.row = renewed
                except ConflictError:
                    pass  # changed under us: the next beat (or the settle) finds out why
            return "cancelled" if claim.cancelled else "ok"

    # --- settle -----------------------------------------------------------------------------

    def settle(
        self,
        claim: Claim,
        outcome: str,
        *,
        error: str | None = None,
        delay: float = 0.0,
        reason: str | None = None,
        claim_next: Collection[str] = (),
    ) -> str:
        """Settle a claimed row: ``succeeded``, ``failed`` or ``retry`` (pending after ``delay``).

        Applies only while ``claim`` still owns the lease (its etag); otherwise nothing is
        written and the answer is ``cancelled`` (the row was cancelled meanwhile: the key is
        freed now that the handler stopped) or ``lease-lost``. With ``claim_next`` (effect types
        this worker runs) the key's next row, if it is of one of them and available now, is
        claimed for the same owner in the same batch (``claim.successor``). Store errors
        propagate (the caller decides requeue vs terminalize).
        """
        assert outcome in (SUCCEEDED, FAILED, RETRY), outcome
        store, lane = self.store, lane_pk(claim.key)
        with claim.lock:
            if claim.cancelled:
                return self._release_cancelled(claim)
            if claim.lost:
                return LEASE_LOST
            # the head as the claim left it, tried without a read, unless a successor is likely
            # and was not read ahead: then the head, that row and the few after it are read in
            # one call (the next settles of the drain use those rows and the head they wrote; a
            # stale one fails the batch on its etag and is read again)
            head: Doc | None = claim.head
            guess = self._successor_guess(claim, head, outcome, claim_next)
            prefetched: Doc | None = None
            blind = guess is None or (guess in claim.ahead and claim.read_first == 0)
            if head is None or not blind:
                blind = False
                head, prefetched = self._settle_read(lane, claim, guess, claim_next)
            elif guess is not None:
                prefetched = claim.ahead[guess]
            for rounds in range(MAX_ROUNDS):
                now = self.clock.now()
                new_row = dict(claim.row) | {"lease": None}
                if error is not None:
                    new_row["last_error"] = error[-4000:]
                live = [list(e) for e in (head or {}).get("live") or []]
                new_head = _strip(head) if head is not None else None
                successor: tuple[Doc, Doc] | None = None
                if outcome == RETRY:
                    available = now + max(0.0, delay)
                    new_row.update(status=PENDING, available_at=available)
                    if new_head is not None:
                        due = available + self.settings.queue_timeout
                        new_head.update(running=None, due_kind=DUE_LANE, due_at=due, freed_at=now)
                else:
                    new_row.update(
                        status=outcome, completed_at=now, reason=reason or (error if outcome == FAILED else None)
                    )
                    new_row.update(settled_due(outcome, now, self.settings.retention))
                    live = [e for e in live if e[1] != claim.effect_id]
                    if new_head is not None:
                        new_head.update(live=live, running=None, freed_at=now)
                        self._head_due(new_head, now)
                        if live and live[0][2] in claim_next:
                            successor = self._next_claimable(lane, new_head, claim.owner, now, prefetched)
                ops = [Op.replace(new_row, claim.etag)]
                if new_head is not None and head is not None:
                    if successor is not None:
                        new_head = successor[1]
                        ops.append(Op.replace(successor[0], successor[0].pop("_etag")))
                    ops.append(Op.replace(new_head, head["_etag"]))
                try:
                    etags = store.batch(lane, ops)
                except ConflictError:
                    if blind and guess is not None:
                        claim.read_first, blind = READ_AFTER_STALE, False
                    guess = self._successor_guess(claim, head, outcome, claim_next)
                    verdict, head, prefetched = self._still_mine(claim, guess, claim_next, head)
                    if verdict is not None:
                        return self._release_cancelled(claim) if verdict == CANCELLED else verdict
                    self.pause(rounds)
                    continue
                except StoreError:
                    # the answer was lost: if the settle applied, say so (and run the successor it
                    # claimed: nobody else will until its lease expires)
                    found = self._settled_anyway(lane, claim, new_row, successor)
                    if found is None:
                        raise
                    etags = found
                claim.lost = True  # settled: the lease is gone
                self._emit("effect_settled", effect_id=claim.effect_id, key=claim.key, outcome=outcome,
                           attempt=claim.attempt, effect_type=claim.type, backlog=len(live))  # fmt: skip
                if successor is not None:
                    next_row, next_head = successor
                    nxt = claim.successor = self._claim_of(
                        next_row, str(etags[1]), next_head | {"_etag": etags[2]}, claim.owner, now
                    )
                    nxt.ahead = {k: v for k, v in claim.ahead.items() if k != nxt.effect_id}
                    nxt.read_first = max(0, claim.read_first - 1)
                elif outcome != RETRY and new_head is not None:
                    self._wake_first(new_head)
                return outcome
        raise StoreError(f"could not settle effect {claim.effect_id!r}: key {claim.key!r} too contended")

    def _next_claimable(
        self, lane: str, head: Doc, owner: str, now: float, prefetched: Doc | None = None
    ) -> tuple[Doc, Doc] | None:
        """The key's next row claimed for ``owner`` (row with its read etag, head), if it is due now
        (``prefetched``: that row if it was read with the head)."""
        live = head.get("live") or []
        nxt = str(live[0][1])
        row = prefetched if prefetched is not None and prefetched.get("effect_id") == nxt else None
        row = row or self.store.read(lane, row_id(nxt))
        if row is None or row.get("status") != PENDING or float(row.get("available_at") or 0.0) > now + 0.005:
            return None
        new_row, new_head = self._claimed(row, head, owner, now)
        return new_row | {"_etag": row["_etag"]}, new_head

    def release(self, claim: Claim) -> str:
        """The handler of a cancelled row stopped: free its key now (``settle`` does it as well)."""
        with claim.lock:
            return self._release_cancelled(claim)

    def _release_cancelled(self, claim: Claim) -> str:
        """The handler of a cancelled row stopped: free its key (the cancel left it held) and wake
        the next row. Idempotent; the scan does the same once the lease expired."""
        store, lane = self.store, lane_pk(claim.key)
        for rounds in range(MAX_ROUNDS):
            head, row = store.read_many(lane, [HEAD_ID, row_id(claim.effect_id)])
            if head is None or head.get("running") != claim.effect_id:
                break  # freed already (by the scan, once the lease expired)
            if row is not None and row.get("status") != CANCELLED:
                break  # not cancelled: requeued by the scan and perhaps running elsewhere
            now = self.clock.now()
            new_head = _strip(head) | {"running": None, "freed_at": now}
            self._head_due(new_head, now)
            ops = [Op.replace(new_head, head["_etag"])]
            if row is not None and row.get("status") == CANCELLED and row.get("lease"):
                ops.append(Op.replace(_strip(row) | {"lease": None}, row["_etag"]))
            try:
                store.batch(lane, ops)
            except ConflictError:
                self.pause(rounds)
                continue
            self._wake_first(new_head)
            break
        claim.lost = True
        return CANCELLED

    def _head_due(self, head: Doc, now: float) -> None:
        if head.get("running") is not None:
            return  # the running row's lease sets it
        if head.get("live"):
            head.update(due_kind=DUE_LANE, due_at=now + self.settings.queue_timeout)
        else:
            head.update(due_kind=None, due_at=None)

    def _wake_first(self, head: Doc) -> None:
        live = head.get("live") or []
        if live and head.get("running") is None:
            _, eid, etype = live[0][:3]
            self.send(EffectRef(str(head["key"]), str(eid), str(etype)))

    # --- cancel -----------------------------------------------------------------------------

    def cancel(
        self,
        effect_id: str | None = None,
        *,
        key: str | None = None,
        types: Sequence[str] | None = None,
        reason: str = "cancelled",
    ) -> int:
        """Cancel pending or running rows by id, or every live row of ``key`` (of ``types``);
        intents not yet admitted too (``cancel.Canceller``)."""
        return Canceller(self).cancel(effect_id, key=key, types=types, reason=reason)

    # --- reading ----------------------------------------------------------------------------

    def get(self, effect_id: str) -> Doc | None:
        """The row of an effect, found through its index."""
        index = self.store.read(index_pk(effect_id), INDEX_ID)
        return None if index is None else self.store.read(lane_pk(str(index["key"])), row_id(effect_id))

    def rows(self, key: str) -> list[Doc]:
        """Every row of a key (live, settled not yet pruned, failed), in lane order."""
        docs = self.store.query_partition(lane_pk(key)).docs
        rows = [d for d in docs if d.get("type") == "effect"]
        return sorted(rows, key=lambda d: (seq_of(d), float(d.get("created_at") or 0.0)))

    def head(self, key: str) -> Doc | None:
        return self.store.read(lane_pk(key), HEAD_ID)

    # --- liveness scan (beat) ---------------------------------------------------------------

    def scan(self, limit: int = 500) -> ScanReport:
        """Admit stray intents, resend lost messages and due retries, settle expired leases, prune."""
        return Scanner(self).scan(limit)
