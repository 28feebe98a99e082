"""Admission: an effect enters its lane (idempotent by effect id), alone or many at once.

The index ``fxid:{id}`` is written first and never moved: whoever comes second with the same id
reads it and goes to *that* lane, where the row's create-only write lets one of them win; a
different type, key or payload is an :class:`~celery_durable.errors.IdempotencyConflict`. A row
settled long enough ago to be pruned is *revived* by a repeat (the idempotency window is the
retention), and the revival touches the index first so a prune racing it cannot delete the new
row's index (``scan._prune`` deletes the index before the row, both etag-guarded).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from celery_durable.engine.documents.records import count_of
from celery_durable.engine.outbox.model import (
    DUE_LANE,
    DUE_PRUNE,
    HEAD_ID,
    INDEX_ID,
    LIVE,
    PENDING,
    TERMINAL,
    Admitted,
    EffectRef,
    LaneOps,
    digest,
    head_bytes,
    index_pk,
    lane_pk,
    row_id,
)
from celery_durable.engine.outbox.model import strip as _strip
from celery_durable.engine.outbox.reads import READ_AHEAD
from celery_durable.engine.outbox.repeats import source_of
from celery_durable.errors import (
    ConflictError,
    DocumentTooLarge,
    DurableError,
    IdempotencyConflict,
    LaneFull,
    PayloadTooLarge,
    StoreError,
)
from celery_durable.stores.base import Doc, Op, encode_doc, payload_limit

__all__ = ["Admission", "MAX_ROUNDS"]

log = logging.getLogger("celery_durable.outbox")

MAX_ROUNDS = 100
#: a full lane keeps a slot for a waiting intent this many admit graces at most
RESERVATION_TTL_GRACES = 5
HEAD_CACHE_SIZE = 256
#: after a remembered head had moved, this many admissions of that lane read the head first
#: (a worker draining the key moves it between two calls: a stale try costs a round trip more)
STALE_SKIPS = 3


def new_row(effect: Doc, source: Doc | None, fingerprint: str | None = None) -> Doc:
    eid, key = str(effect["id"]), str(effect["key"])
    return {
        "pk": lane_pk(key),
        "id": row_id(eid),
        "type": "effect",
        "effect_id": eid,
        "effect_type": effect["type"],
        "key": key,
        "payload": effect.get("payload"),
        "digest": fingerprint or digest(effect),
        "seq": None,
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
        "source": None if source is None else source_of(source),
    }


class Admission:
    def __init__(self, outbox: LaneOps) -> None:
        self.outbox = outbox
        self.store = outbox.store
        self.settings = outbox.settings
        # the heads this process last wrote, by lane: an enqueuer filling one key tries its batch
        # on the head it wrote last instead of reading it again (a stale one costs the same as
        # the read it saves: the batch fails on its etag and the head is read)
        self._heads: OrderedDict[str, Doc] = OrderedDict()
        #: lanes whose remembered head was stale last time: admissions left to read first
        self._skips: OrderedDict[str, int] = OrderedDict()
        self._heads_lock = threading.Lock()

    def _cached_head(self, lane: str) -> Doc | None:
        with self._heads_lock:
            head = self._heads.pop(lane, None)
            skip = self._skips.pop(lane, 0)
            if skip > 1:
                self._skips[lane] = skip - 1
            return None if skip else head

    def _stale(self, lane: str) -> None:
        """The head remembered for ``lane`` had moved: read it first the next few times."""
        with self._heads_lock:
            self._skips[lane] = STALE_SKIPS
            while len(self._skips) > HEAD_CACHE_SIZE:
                self._skips.popitem(last=False)

    def _remember(self, lane: str, head: Doc, etag: str | None) -> None:
        if etag is None:
            return
        with self._heads_lock:
            self._heads[lane] = head | {"_etag": etag}
            while len(self._heads) > HEAD_CACHE_SIZE:
                self._heads.popitem(last=False)

    # --- the index --------------------------------------------------------------------------

    def claim_id(self, effect: Doc) -> tuple[str, bool, Doc | None]:
        """Make ``effect``'s id ours or find who has it: (key to use, index fresh, index doc)."""
        eid, key, fp = str(effect["id"]), str(effect["key"]), digest(effect)
        index = {
            "pk": index_pk(eid),
            "id": INDEX_ID,
            "type": "effect_index",
            "key": key,
            "effect_type": effect["type"],
            "digest": fp,
            # links the index to the row admitted under it: a prune deletes only its own row's index
            "token": uuid.uuid4().hex,
            "created_at": effect["created_at"],
            # when this request wrote it: an intent admitted long after its effect was created
            # (it waited for room) must not look abandoned the moment it takes its id
            "touched_at": self.outbox.clock.now(),
        }
        for rounds in range(MAX_ROUNDS):
            etag = self.store.create(index)
            if etag is not None:
                return key, True, index | {"_etag": etag}
            existing = self.store.read(index_pk(eid), INDEX_ID)
            if existing is None:
                self.outbox.pause(rounds)
                continue  # pruned in between (or a lagging read): try again
            if existing.get("digest") == fp or (existing.get("digest") is None and existing.get("key") == key):
                return key, False, existing
            # another request holds the id: a conflict, unless that request is over (its row
            # expired) or never got its row (abandoned), and then only for the same key: both
            # requests then meet in one lane, where the row's own write decides who has the id
            other = str(existing.get("key"))
            row = self.store.read(lane_pk(other), row_id(eid))
            held = f"(type {existing.get('effect_type')!r}, key {other!r})"
            if row is not None and not self._expired(row):
                raise IdempotencyConflict(
                    f"effect id {eid!r} was already enqueued with another type, key or payload {held}; "
                    "the first enqueue stands"
                )
            # another key only once the idempotency window is over: a request that paused that
            # long between its index and its row cannot come back to write its row elsewhere
            patience = self.settings.admit_grace + self.settings.lease_ttl
            if other != key:
                patience = max(self.settings.retention, patience)
            if (row is not None and other != key) or not self._index_abandoned(existing, patience):
                raise IdempotencyConflict(
                    f"effect id {eid!r} is held by another request {held} that may still complete; "
                    "try again after the retention or use another id",
                    pending=True,
                )
            try:  # the old request is over: the id is free for this one
                etag = self.store.replace(_strip(index), if_match=existing["_etag"])
            except ConflictError:
                continue
            return key, True, index | {"_etag": etag}
        raise StoreError(f"could not enqueue effect {eid!r}: its id is too contended")

    def _expired(self, row: Doc) -> bool:
        """A settled row whose retention ended: the prune will delete it; a repeat may revive it."""
        return (
            row.get("status") in TERMINAL
            and row.get("due_kind") == DUE_PRUNE
            and float(row.get("due_at") or 0.0) <= self.outbox.clock.now()
        )

    def _index_abandoned(self, index: Doc, patience: float) -> bool:
        # an index without a row this long after it was written or touched: its enqueuer died
        # before its lane (an admitter that touched it a moment ago is about to write the row)
        written = max(float(index.get("created_at") or 0.0), float(index.get("touched_at") or 0.0))
        return self.outbox.clock.now() - written > patience

    def _touch_index(self, index: Doc) -> Doc | None:
        """A new token (and etag) for the index: a prune holding the old one then gives up and a
        revived row gets the new token. None if the index changed or went meanwhile."""
        touched = _strip(index) | {"token": uuid.uuid4().hex, "touched_at": self.outbox.clock.now()}
        try:
            return touched | {"_etag": self.store.replace(touched, if_match=index["_etag"])}
        except ConflictError:
            return None

    def _align_index(self, index: Doc | None, row: Doc) -> None:
        """The index this admission holds describes another request than the lane's row (it took
        the id over and lost the row to the first request): make it describe the row again."""
        if index is None or index.get("digest") == row.get("digest"):
            return
        fixed = _strip(index) | {
            "effect_type": row.get("effect_type"),
            "digest": row.get("digest"),
            "token": row.get("token"),
        }
        try:
            self.store.replace(fixed, if_match=index["_etag"])
        except (ConflictError, StoreError):
            pass  # changed again meanwhile: whoever changed it holds the row

    def _release_id(self, index: Doc | None) -> None:
        """An admission that wrote a fresh index and then failed frees the id again."""
        if index is None:
            return
        try:
            self.store.delete(str(index["pk"]), INDEX_ID, if_match=index["_etag"])
        except (ConflictError, StoreError):
            pass  # taken over or unreachable: the index is abandoned and times out

    # --- admission --------------------------------------------------------------------------

    def check_size(self, effect: Doc, source: Doc | None = None) -> None:
        """Raise :class:`PayloadTooLarge` before anything is written (a refused enqueue must not
        keep the id: the corrected retry would be a conflict). An offloading store takes rows up
        to its ``max_payload`` (stores/offload/store.py)."""
        probe = new_row(effect, source, "0" * 32) | {"seq": 2**53, "token": "0" * 32}
        limit = payload_limit(self.store)
        try:
            encode_doc(probe | {"lease": {"owner": "x" * 64, "expires": 0.0}}, limit)
        except DocumentTooLarge as exc:
            raise PayloadTooLarge(exc.doc_id, exc.size, exc.limit) from None

    def admit(self, effect: Doc, source: Doc | None = None) -> Admitted:
        self.check_size(effect, source)
        for _ in range(MAX_ROUNDS):
            key, fresh, index = self.claim_id(effect)
            try:
                result = self._into_lane(effect, key, fresh, index, source)
            except (LaneFull, DocumentTooLarge):
                # a caller told "not enqueued" frees the id; an intent (committed with its
                # caller's documents, admitted once its lane has room) keeps it: that request
                # stands, and its retries touch the index so it never looks abandoned
                if fresh and source is None:
                    self._release_id(index)
                raise
            if result is not None:
                return result
        raise StoreError(f"could not enqueue effect {effect['id']!r}: key {effect['key']!r} too contended")

    def _into_lane(self, effect: Doc, key: str, fresh: bool, index: Doc | None, source: Doc | None) -> Admitted | None:
        """Write the row and the head; None to start over from the index (it changed)."""
        store, eid, lane = self.store, str(effect["id"]), lane_pk(key)
        row = new_row(effect, source, None if index is None else index.get("digest"))
        row["token"] = None if index is None else index.get("token")
        # the row as stored: None = assume there is none (a fresh id: create it blind, one round
        # trip less); {} = look first (a repeat, or a create that found one)
        known: Doc | None = None if fresh else {}
        # no cached head here: between two single enqueues a worker's claim or settle has
        # usually moved it, and a stale one costs a failed batch (measured: 7 round trips an
        # effect on idle lanes with it, 6 without); admit_many uses it between its chunks
        head: Doc | None
        for rounds in range(MAX_ROUNDS):
            if known is None:
                head = store.read(lane, HEAD_ID)
            else:
                head, known = store.read_many(lane, [HEAD_ID, row_id(eid)])
                if known is not None:
                    # only a row settled longer ago than the retention is a finished request
                    # (the prune is about to delete it); anything else is this one (a repeat),
                    # or another request that won the row: then the index must say so
                    if known.get("status") in LIVE or not self._expired(known):
                        if known.get("digest") not in (None, row["digest"]):
                            self._align_index(index, known)
                            raise IdempotencyConflict(
                                f"effect id {eid!r} was already enqueued with another type or payload "
                                f"(type {known.get('effect_type')!r}, key {key!r}); the first enqueue stands"
                            )
                        return Admitted(eid, key, False)
            if not fresh and index is not None:
                # the index was there before this admission: a prune may be deleting it right now.
                # Touch it first, so that either the prune's delete fails or this write does
                index = self._touch_index(index)
                if index is None:
                    return None  # the index changed or went: start over from it
                row["token"], fresh = index.get("token"), True
            live = [list(e) for e in (head or {}).get("live") or []]
            waiting = self._check_room(key, live, row, head, source)
            seq = int((head or {}).get("next_seq") or 1)
            live.append([seq, eid, row["effect_type"]])
            new_head: Doc = _strip(head) if head is not None else {"pk": lane, "id": HEAD_ID, "type": "effect_lane"}
            stored = count_of(new_head, "stored") + (1 if known is None else 0)
            new_head.update(key=key, live=live, next_seq=seq + 1, stored=stored)
            if waiting or new_head.get("waiting"):
                new_head["waiting"] = waiting
            running = new_head.get("running")
            send_in = self._head_for_new_row(new_head, row, first=len(live) == 1 and running is None)
            row_op = Op.create(row | {"seq": seq}) if known is None else Op.replace(row | {"seq": seq}, known["_etag"])
            head_op = Op.create(new_head) if head is None else Op.replace(new_head, head["_etag"])
            try:
                store.batch(lane, [row_op, head_op])
            except ConflictError:
                if known is None:
                    known = {}  # look at the row next round (someone may have created it)
                self.outbox.pause(rounds)
                continue
            self.outbox._emit("effect_enqueued", effect_id=eid, key=key, effect_type=row["effect_type"])
            if send_in is not None:
                self.outbox.send(EffectRef(key, eid, str(row["effect_type"])), countdown=send_in or None)
            return Admitted(eid, key, True)
        raise StoreError(f"could not enqueue effect {eid!r}: key {key!r} too contended")

    def _waiting(self, head: Doc | None) -> list[list[Any]]:
        """The intents a full lane keeps a slot for, ``[pk, id, since]``, those not gone stale."""
        stale = self.outbox.clock.now() - RESERVATION_TTL_GRACES * self.settings.admit_grace
        return [list(w) for w in (head or {}).get("waiting") or [] if float(w[2]) > stale]

    def reserve(self, doc: Doc) -> None:
        """An intent found its lane full: keep the next free slot for it, so producers retrying
        their enqueues cannot take every slot before beat's scan retries the intent (best effort:
        a reservation lapses after a few admit graces)."""
        effect = doc.get("effect") or {}
        lane, ref = lane_pk(str(effect.get("key"))), [doc["pk"], doc["id"]]
        try:
            head = self.store.read(lane, HEAD_ID)
            waiting = self._waiting(head)
            if head is None or any(w[:2] == ref for w in waiting) or len(waiting) >= self.settings.max_lane_backlog:
                return
            waiting.append([*ref, self.outbox.clock.now()])
            self.store.replace(_strip(head) | {"waiting": waiting}, if_match=head["_etag"])
        except (ConflictError, StoreError):
            pass  # the lane moved: the next deferral tries again

    def _check_room(
        self, key: str, live: list[list[Any]], row: Doc, head: Doc | None = None, source: Doc | None = None
    ) -> list[list[Any]]:
        """Raise LaneFull if the row does not fit; else the head's reservations after it."""
        limit = self.settings.max_lane_backlog
        waiting = self._waiting(head)
        ref = None if source is None else [source.get("pk"), source.get("id")]
        others = [w for w in waiting if w[:2] != ref]
        if len(live) + len(others) >= limit:
            held = f" ({len(others)} kept for waiting intents)" if others else ""
            raise LaneFull(f"key {key!r} has {len(live)} live effects{held} (limit {limit})")
        # the head must fit the store with room to spare (a claim adds the running id)
        room = self.store.max_doc_bytes // 2
        if head_bytes([*live, [0, row["effect_id"], row["effect_type"]]]) > room:
            raise LaneFull(f"key {key!r}: its {len(live)} live effects fill the lane's head ({room} bytes)")
        return others  # without this one's reservation (and the lapsed ones)

    def _head_for_new_row(self, head: Doc, row: Doc, first: bool) -> float | None:
        """Set the head's due time for a new row; the countdown to send it with (None: not now)."""
        now = self.outbox.clock.now()
        if first:
            wait = max(0.0, float(row["available_at"]) - now)
            if wait <= self.settings.fast_send_max:
                head.update(due_kind=DUE_LANE, due_at=now + wait + self.settings.queue_timeout)
                return wait
            head.update(due_kind=DUE_LANE, due_at=float(row["available_at"]))
        elif not head.get("due_kind"):
            head.update(due_kind=DUE_LANE, due_at=now + self.settings.queue_timeout)
        return None

    def admit_many(self, effects: Sequence[Doc]) -> list[Admitted]:
        """Admit several effects: one index write each, then one head read and one batch per lane
        chunk (rows of a key keep the order of ``effects``). Falls back to one by one on conflicts;
        the first error (``IdempotencyConflict``, ``LaneFull``) is raised after all the others."""
        out: dict[str, Admitted | DurableError] = {}
        #: per key, in the order given: (effect, the index this call created; None if it existed)
        by_lane: dict[str, list[tuple[Doc, Doc | None]]] = {}

        def one(effect: Doc, fresh_index: Doc | None) -> None:
            try:
                out[str(effect["id"])] = self.admit(effect)
            except LaneFull as exc:
                self._release_id(fresh_index)  # the id we took is free again
                out[str(effect["id"])] = exc
            except IdempotencyConflict as exc:
                out[str(effect["id"])] = exc

        for effect in effects:
            self.check_size(effect)  # every effect fits before any is written
        for effect in effects:
            try:
                key, fresh, index = self.claim_id(effect)
            except IdempotencyConflict as exc:
                out[str(effect["id"])] = exc
                continue
            by_lane.setdefault(key, []).append((effect, index if fresh else None))
        chunk = max(1, self.store.max_batch_ops - 1)
        for key, items in by_lane.items():
            # in the order given: runs of fresh ids in batches, an id seen before on its own
            i = 0
            while i < len(items):
                if items[i][1] is None:
                    one(items[i][0], None)
                    i += 1
                    continue
                run = [items[i]]
                while i + len(run) < len(items) and len(run) < chunk and items[i + len(run)][1] is not None:
                    run.append(items[i + len(run)])
                i += len(run)
                try:
                    done = self._many_into_lane(key, run)
                except LaneFull:
                    done = False
                for effect, index in run:
                    if done:
                        out[str(effect["id"])] = Admitted(str(effect["id"]), key, True)
                    else:  # a row existed, the head moved or the lane filled up: one by one
                        one(effect, index)
        results = [out[str(e["id"])] for e in effects]
        errors = [r for r in results if isinstance(r, DurableError)]
        if errors:
            raise errors[0]  # every other effect was admitted
        return [r for r in results if isinstance(r, Admitted)]

    def _many_into_lane(self, key: str, part: Sequence[tuple[Doc, Doc | None]]) -> bool:
        """One batch: the rows and the head; False if a row existed or the head kept moving."""
        lane = lane_pk(key)
        head = self._cached_head(lane)
        # known: the head to try is at hand (the one this process wrote last, or the one read
        # with the rows after a failed batch); from_cache: it may be stale
        known = from_cache = head is not None
        for _ in range(3):
            if not known:
                head = self.store.read(lane, HEAD_ID)
            try:
                done = self._try_many(lane, key, head, part)
            except LaneFull:
                if from_cache:
                    known = from_cache = False
                    continue  # the head this process wrote last may be stale: look
                raise
            if isinstance(done, bool):
                return done
            if from_cache:
                self._stale(lane)
            (head,), known, from_cache = done, True, False
        return False

    def _try_many(
        self, lane: str, key: str, head: Doc | None, part: Sequence[tuple[Doc, Doc | None]]
    ) -> bool | tuple[Doc | None]:
        """True: written; False: a row exists (the careful path); else the head as it is now."""
        live = [list(e) for e in (head or {}).get("live") or []]
        seq = int((head or {}).get("next_seq") or 1)
        rows: list[Doc] = []
        was_empty = not live and (head or {}).get("running") is None
        for effect, index in part:
            row = new_row(effect, None, None if index is None else index.get("digest"))
            row["token"] = None if index is None else index.get("token")
            self._check_room(key, live, row, head)
            rows.append(row | {"seq": seq})
            live.append([seq, row["effect_id"], row["effect_type"]])
            seq += 1
        new_head: Doc = _strip(head) if head is not None else {"pk": lane, "id": HEAD_ID, "type": "effect_lane"}
        new_head.update(key=key, live=live, next_seq=seq, stored=count_of(new_head, "stored") + len(rows))
        send_in = self._head_for_new_row(new_head, rows[0], first=was_empty)
        head_op = Op.create(new_head) if head is None else Op.replace(new_head, head["_etag"])
        try:
            etags = self.store.batch(lane, [*(Op.create(r) for r in rows), head_op])
        except ConflictError:
            # the head moved (try again with the one read now) or a row exists (the careful path)
            now, *found = self.store.read_many(lane, [HEAD_ID, *(row_id(str(r["effect_id"])) for r in rows)])
            if found != [None] * len(rows):
                return False
            return (now,)
        self._remember(lane, new_head, etags[-1])
        for r in rows:
            self.outbox._emit("effect_enqueued", effect_id=r["effect_id"], key=key, effect_type=r["effect_type"])
        if send_in is not None:
            # the message names the rows after the first (of its type) too: the claim reads them
            # with the head, and the first settles of its drain need no read of their own
            first, after = rows[0], []
            for r in rows[1:READ_AHEAD]:
                if r["effect_type"] != first["effect_type"]:
                    break
                after.append(str(r["effect_id"]))
            self.outbox.send(EffectRef(key, first["effect_id"], first["effect_type"], tuple(after)), send_in or None)
        return True
