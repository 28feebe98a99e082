"""Limit documents in the store: an attempt takes a slot as it begins, gives it back as it ends.

``enter`` runs in ``ActivityRunner.begin`` before the step's lease is taken: the step holds a
slot (go on) or is queued in the document and its delivery is dropped (nothing spins: the step
is sent again when a slot is handed to it). ``leave`` runs when the attempt ends (outcome,
retry, cancel, a lost lease): it frees the slot and, in the same etag-guarded write, grants the
free room to the best waiters, which it then sends again (their message, rebuilt from their
marker as the recovery scan does). So a freed slot goes to the next step in one write.

A slot is a lease: a holder past its ``exp`` (a killed worker never gave it back) is checked on
its step's own lease before it is freed (a long attempt renews its step lease, not the slot).
While steps wait, the document is due (``due_kind="limit"``) at the first holder's expiry or the
rate window's next opening, so beat's recovery scan grants what nobody handed off (a releaser
killed between its write and its sends, a slot that lapsed).

Each step records what it waits on (its key, priority and group) on its marker at scheduling
(engine/limits/spec.py); this module trusts that record, never user code.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.delivery import marker_token, not_runnable
from celery_durable.engine.dispatcher import ActivityRequest, Send
from celery_durable.engine.documents.model import lease_live, marker_id, result_id
from celery_durable.engine.documents.records import count_of
from celery_durable.engine.documents.schema import DueKind
from celery_durable.engine.limits.grants import carry, send_granted
from celery_durable.engine.limits.leaving import Leaving, leaving, left
from celery_durable.engine.limits.spec import LIMIT_DOC_ID, LIMIT_RECORD, limit_pk
from celery_durable.engine.limits.table import (
    admit,
    declare,
    drop_waiter,
    enqueue,
    expired,
    grant,
    has_start,
    holds,
    new_doc,
    next_due,
    restart,
    room,
    step_key,
    step_waiter,
    waits,
)
from celery_durable.engine.limits.workflows import (
    check_execution,
    execution_step,
    is_execution,
    queue_execution,
    release_execution,
    send_execution,
    take_turn,
)
from celery_durable.errors import ConflictError, StoreError
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.documents.model import Attempt
    from celery_durable.engine.ports import EngineParts

__all__ = ["Slots", "LIMIT_DOC_ID", "WAITING", "NOT_QUEUED"]

log = logging.getLogger("celery_durable.limits")

#: the start of every reason ``enter`` gives for a step that waits
WAITING = "waiting for a slot of limit"
#: in the reason of a step that waits recorded nowhere (a full queue, an etag storm)
NOT_QUEUED = "not queued: its step is due again within a recovery scan interval"
ROUNDS = 8
CACHE_SIZE = 512
#: for this long after a cached copy proved stale, a document is read before it is written
CONTENDED_FOR = 5.0
#: expired holders checked on their steps per write (each is a point read)
CHECKS_PER_WRITE = 8


def _parse(step: str) -> tuple[str, int, int]:
    eid, run, seq = step.rsplit("|", 2)
    return eid, int(run), int(seq)


class Slots:
    """The limit documents of one engine (a small cache of them, by partition)."""

    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        self._docs: OrderedDict[str, Doc] = OrderedDict()
        #: when a cached copy last proved stale, by document: contended documents are read first
        self._stale_at: dict[str, float] = {}

    # --- cache ---------------------------------------------------------------------------

    def _load(self, lpk: str, fresh: bool = False) -> Doc | None:
        if not fresh:
            with self._lock:
                doc = self._docs.get(lpk)
                if doc is not None:
                    self._docs.move_to_end(lpk)
                    # a deep copy: its caller edits holders and waiters in place, and another
                    # thread of this process may be editing its own copy of the same document
                    return copy.deepcopy(doc)
        doc = self.engine.store.read(lpk, LIMIT_DOC_ID)
        if doc is not None:
            self.remember(lpk, doc)
        return doc

    def remember(self, lpk: str, doc: Doc) -> None:
        doc = copy.deepcopy(doc)  # never the caller's (edited) copy
        with self._lock:
            self._docs[lpk] = doc
            self._docs.move_to_end(lpk)
            while len(self._docs) > CACHE_SIZE:
                self._docs.popitem(last=False)

    def _forget(self, lpk: str) -> None:
        with self._lock:
            self._docs.pop(lpk, None)
            if len(self._stale_at) > CACHE_SIZE:
                self._stale_at.clear()
            self._stale_at[lpk] = self.engine.clock.now()

    def _contended(self, lpk: str) -> bool:
        """Did a cached copy of ``lpk`` prove stale lately? Then read it before writing: other
        processes write it too, and a write on a stale copy costs a failed write and a read."""
        with self._lock:
            at = self._stale_at.get(lpk)
        return at is not None and 0.0 <= self.engine.clock.now() - at < CONTENDED_FOR

    def body(self, doc: Doc, now: float) -> Doc:
        """``doc`` as written: due (``limit``) while steps wait, at the scan's next look."""
        due = next_due(doc, now)
        body = strip_reserved(doc)
        body.pop("due_kind", None)
        body.pop("due_at", None)
        if due is not None:
            body.update(due_kind=str(DueKind.LIMIT), due_at=due)
        return body

    def _write(self, lpk: str, doc: Doc, now: float) -> None:
        """Create or replace (etag-guarded) ``doc``; raises ConflictError if it changed meanwhile."""
        body = self.body(doc, now)
        etag = doc.get("_etag")
        try:
            if etag is None:
                new = self.engine.store.create(body)
                if new is None:
                    raise ConflictError(f"{lpk} was created meanwhile")
            else:
                new = self.engine.store.replace(body, if_match=str(etag))
        except ConflictError:
            self._forget(lpk)
            raise
        self.remember(lpk, body | {"_etag": new})

    # --- the drive's side: new steps queued at dispatch -----------------------------------

    def admit(self, sends: list[Send]) -> list[Send]:
        """What a drive's commit sends, less the new limited steps queued on their limit.

        The steps the commit scheduled take their place on their limit here, one write per
        limit document for all of them (a fan-out of 1,000 steps is one write per key, not 1,000
        deliveries that each find no room): those given a slot are sent (their attempt finds the
        slot its own), the others wait in the document and are sent when granted. Never raises:
        on any error every step is sent, to take its slot as it begins."""
        by_doc: dict[str, list[ActivityRequest]] = {}
        for send in sends:
            if isinstance(send, ActivityRequest) and isinstance(send.options.get(LIMIT_RECORD), dict):
                by_doc.setdefault(limit_pk(send.options[LIMIT_RECORD]), []).append(send)
        held: set[str] = set()
        for lpk, reqs in by_doc.items():
            try:
                held |= self._admit(lpk, reqs)
            except Exception as exc:  # noqa: BLE001 - sent instead: each takes its slot as it begins
                log.warning("limit %s: %d new steps sent to take their slots as they begin: %s", lpk, len(reqs), exc)
        return [s for s in sends if not (isinstance(s, ActivityRequest) and s.task_id in held)]

    def _admit(self, lpk: str, reqs: list[ActivityRequest]) -> set[str]:
        """Queue ``reqs`` on ``lpk`` (admitting what room allows); the task ids held back."""
        eng = self.engine
        fresh = self._contended(lpk)
        record = reqs[-1].options[LIMIT_RECORD]
        for _ in range(ROUNDS):
            now = eng.clock.now()
            doc = self._load(lpk, fresh) or new_doc(lpk, record)
            declare(doc, record)
            holders: dict[str, Any] = doc.setdefault("holders", {})
            lost = self._check_expired(doc, now) if room(doc, now) < len(reqs) and expired(doc, now) else []
            mine = {step_key(r.execution_id, r.run, r.seq): r for r in reqs}
            for step, r in mine.items():
                if step in holders and holders[step].get("t") != r.token:
                    del holders[step]  # a forgotten marker's attempt (a reset re-ran the step): not this one's
                if any(x["s"] == step and x.get("t") != r.token for x in doc.get("waiters") or []):
                    drop_waiter(doc, step)  # queued for a forgotten marker (its carried message too)
                if step not in holders:
                    waiter = step_waiter(r.execution_id, r.run, r.seq, 1, r.token, r.options[LIMIT_RECORD], now)
                    enqueue(doc, waiter | ({"m": m} if (m := carry(r)) is not None else {}))
            granted = grant(doc, now, eng.settings.lease_ttl)
            waiting = {w["s"] for w in doc.get("waiters") or []}
            try:
                self._write(lpk, doc, now)
            except ConflictError:
                fresh = True
                continue
            self._send(lpk, [g for g in granted if g["s"] not in mine] + lost)
            for step, r in mine.items():
                what = "limit_waiting" if step in waiting else "limit_entered"
                eng.emit(what, execution_id=r.execution_id, seq=r.seq, limit=str(record["name"]))
            # sent: those given a slot, and those the queue had no place for (as without admission)
            return {r.task_id for step, r in mine.items() if step in waiting}
        return set()

    # --- the attempt's side --------------------------------------------------------------

    def enter(
        self, execution_id: str, run: int, seq: int, number: int, record: Mapping[str, Any], token: str | None = None
    ) -> str | None:
        """``None``: the step holds a slot of ``record``'s limit, its attempt ``number`` (of the
        marker with ``token``) may run; otherwise why it waits (queued: sent again when granted;
        a reason containing :data:`NOT_QUEUED`: recorded nowhere, the caller makes its step due
        soon). Raises StoreError."""
        eng = self.engine
        lpk, step = limit_pk(record), step_key(execution_id, run, seq)
        ttl = eng.settings.lease_ttl
        # the cached copy first, even of a contended document: one that shows this attempt's
        # slot (a grant written here, a hand-off) needs no write; a write reads it first
        with self._lock:
            fresh = lpk not in self._docs  # not cached: the first load reads it
        for _ in range(ROUNDS):
            now = eng.clock.now()
            doc = self._load(lpk, fresh) or new_doc(lpk, record)
            holders: dict[str, Any] = doc.setdefault("holders", {})
            mine = holders.get(step)
            ours = mine if holds(mine, (number, token)) else None  # the slot is this attempt's
            if not fresh and ours is None:
                fresh = True  # a copy that does not show its slot may be older than its grant
                continue
            granted: list[dict[str, Any]] = []
            changed = declare(doc, record)
            lost: list[dict[str, Any]] = []
            go = True
            late = ours is not None and _has_rate(doc) and float(ours.get("at") or now) < now  # granted earlier
            if ours is not None and not late and float(ours.get("exp") or 0.0) - now > ttl / 2 and not changed:
                return None  # granted to it (or held by its earlier delivery): nothing to write
            if not fresh and self._contended(lpk):
                fresh = True  # other processes write it too: a write on a cached copy would fail
                continue
            if ours is not None and (not late or has_start(doc, step, now)):
                ours.update(exp=now + ttl, at=now)  # its grant's start moves to now
                restart(doc, step, now, moved=True)
            elif mine is not None and room(doc, now, ignoring=step) > 0:
                # another attempt of the step (a retry taking over a lapsed lease, a re-run), or a
                # grant so late its start left the rate's window: a new start, room allowing
                mine.update(n=number, t=token, exp=now + ttl, at=now)
                restart(doc, step, now, moved=False)
            else:
                if mine is not None:  # as above, but the rate allows no start now: it queues
                    del holders[step]
                if room(doc, now) == 0 and expired(doc, now):
                    lost = self._check_expired(doc, now)
                if room(doc, now) > 0 and not doc.get("waiters"):
                    admit(doc, step, number, str(record.get("g")), now, ttl, token)
                else:
                    queued = enqueue(doc, step_waiter(execution_id, run, seq, number, token, record, now))
                    granted = grant(doc, now, ttl)
                    go = any(g["s"] == step for g in granted)
                    granted = [g for g in granted if g["s"] != step]
                    if not go and not queued:
                        return f"{WAITING} {record['name']!r}: its queue is full ({NOT_QUEUED})"
            try:
                self._write(lpk, doc, now)
            except ConflictError:
                fresh = True
                continue
            self._send(lpk, granted + lost)
            eng.emit(
                "limit_entered" if go else "limit_waiting", execution_id=execution_id, seq=seq, limit=record["name"]
            )
            return None if go else f"{WAITING} {record['name']!r} (key {record['key']!r})"
        return f"{WAITING} {record['name']!r}: its document kept changing ({NOT_QUEUED})"

    def take_record(self, attempt: Attempt) -> dict[str, Any] | None:
        """The limit whose slot ``attempt`` holds, taken off it (only one caller gives it back)."""
        with self._lock:
            record, attempt.limit = attempt.limit, None
        return record

    def leaving(self, attempt: Attempt) -> Leaving | None:
        """The rewrite giving ``attempt``'s slot back in its outcome's commit (engine/limits/leaving.py)."""
        return leaving(self, attempt)

    def left(self, out: Leaving) -> None:
        left(self, out)

    def send_granted(self, lpk: str, granted: list[dict[str, Any]]) -> None:
        """Send the steps an ended attempt's slot was granted to (hand-offs). Never raises."""
        try:
            self._send(lpk, granted, handoff=True)
        except Exception as exc:  # noqa: BLE001 - the scan grants them again
            log.warning("limit %s: %d granted steps not sent: %s", lpk, len(granted), exc)

    def leave(self, attempt: Attempt) -> None:
        """``attempt`` ended: free its step's slot and grant the room. Never raises: a slot not
        given back lapses (the recovery scan frees it once its step's lease has)."""
        record = self.take_record(attempt)
        if record is not None:
            self.release(attempt.execution_id, attempt.run, attempt.seq, (attempt.number, attempt.token), record)

    def release(
        self, execution_id: str, run: int, seq: int, attempt: tuple[int, str | None], record: Mapping[str, Any]
    ) -> None:
        """Free the slot of ``record``'s limit that step ``seq`` holds for ``attempt`` (its number,
        its marker's token) and grant the room. Never raises."""
        self.release_grant(limit_pk(record), execution_id, run, seq, attempt)

    def release_grant(self, lpk: str, execution_id: str, run: int, seq: int, attempt: tuple[int, str | None]) -> None:
        """Free the slot of ``lpk`` that step ``seq`` holds for ``attempt`` (an ended attempt's,
        or a refused hand-off's grant: engine/activities/attempts.py) and grant the room, handed
        off here. Never raises: a slot not given back lapses, and the scan frees it."""
        try:
            self._send(lpk, self._leave(lpk, step_key(execution_id, run, seq), attempt), handoff=True)
        except Exception as exc:  # noqa: BLE001 - the attempt's outcome must still be recorded
            log.warning("could not give back the slot of %s step %d (limit %s): %s", execution_id, seq, lpk, exc)

    def _leave(self, lpk: str, step: str, attempt: tuple[int, str | None] | None) -> list[dict[str, Any]]:
        """Free ``step``'s slot (only ``attempt``'s — its number and marker token — unless None:
        then its place in the queue too); the waiters granted the room, for the caller to send."""
        eng = self.engine
        fresh = self._contended(lpk)
        for _ in range(ROUNDS):
            now = eng.clock.now()
            doc = self._load(lpk, fresh)
            if doc is None:
                return []
            holders: dict[str, Any] = doc.get("holders") or {}
            mine = holders.get(step)
            queued = attempt is None and mine is None and waits(doc, step)
            if not queued and (mine is None or (attempt is not None and not holds(mine, attempt))):
                if fresh:
                    return []  # not its slot (any more): another attempt of the step holds it
                fresh = True
                continue
            holders.pop(step, None)
            if queued:
                drop_waiter(doc, step)
            granted = grant(doc, now, eng.settings.lease_ttl)
            try:
                self._write(lpk, doc, now)
            except ConflictError:
                fresh = True
                continue
            return granted
        return []

    def release_idle(self, execution_id: str, run: int) -> None:
        """Run ``run`` of ``execution_id`` ended or continued as new: the slots granted to its steps
        that never began (as this commit's copy of the partition shows: their messages will be
        refused) expire now, so the next scan — due at once — frees them on their steps' own leases
        (not after their lease TTL). Never freed here: an attempt may have begun since that copy,
        and the scan's check races it on the document's etag. Never raises."""
        docs: Mapping[str, Doc] = self.engine.cache.peek(execution_id, float("inf")) or {}  # the commit's copy
        for doc in docs.values():
            record = doc.get("limit")
            if doc.get("type") != "step" or int(doc.get("run") or 0) != run or not isinstance(record, dict):
                continue
            seq = int(doc.get("seq") or 0)
            outcome = docs.get(result_id(seq, run))
            ran = outcome is not None and not outcome.get("cancelled")  # a cancel's outcome: it never ran
            if ran or lease_live(doc, self.engine.clock.now()):
                continue
            granted = (count_of(doc, "attempts") + 1, marker_token(doc))  # a grant is for the next attempt
            lpk = limit_pk(record)
            try:
                self._expire(lpk, step_key(execution_id, run, seq), granted)
            except Exception as exc:  # noqa: BLE001 - its slot lapses instead
                log.warning("limit %s: the slot of %s step %d not given back: %s", lpk, execution_id, seq, exc)

    def _expire(self, lpk: str, step: str, attempt: tuple[int, str | None]) -> None:
        """``step``'s slot, if it is ``attempt``'s, expires now (the document due now)."""
        eng = self.engine
        for _ in range(ROUNDS):
            now = eng.clock.now()
            doc = self._load(lpk, self._contended(lpk))
            mine = ((doc or {}).get("holders") or {}).get(step)
            if doc is None or mine is None or not holds(mine, attempt):
                return
            mine["exp"] = now
            try:
                self._write(lpk, doc, now)
                return
            except ConflictError:
                continue

    # --- executions waiting on a limit (engine/limits/workflows.py) ------------------------

    def join(self, record: Mapping[str, Any], waiter: dict[str, Any]) -> bool | None:
        """Queue ``waiter`` on ``record``'s limit, granting what room allows, in one write: True
        when its step holds a slot now (the caller starts it), False when it waits (it is sent when
        granted), None when it is recorded nowhere (a full queue, an etag storm). Raises StoreError."""
        eng = self.engine
        lpk, step = limit_pk(record), str(waiter["s"])
        fresh = self._contended(lpk)
        for _ in range(ROUNDS):
            now = eng.clock.now()
            doc = self._load(lpk, fresh) or new_doc(lpk, record)
            known = step in (doc.get("holders") or {}) or waits(doc, step)
            if known and not fresh:  # a cached copy may be older than its withdrawal
                fresh = True
                continue
            if known:
                return step in (doc.get("holders") or {})
            declare(doc, record)
            lost = self._check_expired(doc, now) if room(doc, now) == 0 and expired(doc, now) else []
            queued = enqueue(doc, dict(waiter, at=now))
            granted = grant(doc, now, eng.settings.lease_ttl)
            try:
                self._write(lpk, doc, now)
            except ConflictError:
                fresh = True
                continue
            self._send(lpk, [g for g in granted if g["s"] != step] + lost)
            if any(g["s"] == step for g in granted):
                return True
            return False if queued else None
        return None

    def hold(self, record: Mapping[str, Any], step: str) -> None:
        """``step`` takes a slot whether or not there is room (an operator's re-run of an ended
        execution starts at once): counted, so others wait until it is back under the limit.
        Never raises (not counted then)."""
        lpk = str(record.get("name"))
        try:
            lpk = limit_pk(record)
            for _ in range(ROUNDS):
                now = self.engine.clock.now()
                doc = self._load(lpk, fresh=True) or new_doc(lpk, record)
                admit(doc, step, 1, str(record.get("g") or ""), now, self.engine.settings.lease_ttl)
                try:
                    self._write(lpk, doc, now)
                    return
                except ConflictError:
                    continue
        except Exception as exc:  # noqa: BLE001 - the re-run goes on, uncounted
            log.warning("limit %s: the re-run %s not counted: %s", lpk, step, exc)

    def withdraw(self, record: Mapping[str, Any], step: str) -> None:
        """``step`` needs no slot any more (its execution ended or was cancelled while queued):
        free its slot or take it off the queue, grant the room. Never raises (a slot not given
        back is freed by the scan at its holder's expiry)."""
        lpk = str(record.get("name"))
        try:
            lpk = limit_pk(record)
            self._send(lpk, self._leave(lpk, step, None))
        except Exception as exc:  # noqa: BLE001 - its slot lapses instead
            log.warning("limit %s: the slot of %s not given back: %s", lpk, step, exc)

    def queue_execution(self, execution_id: str, record: Mapping[str, Any]) -> None:
        queue_execution(self.engine, execution_id, record)

    def take_turn(self, ex: Mapping[str, Any]) -> None:
        take_turn(self.engine, ex)

    def release_execution(self, ex: Mapping[str, Any]) -> None:
        release_execution(self.engine, ex)

    def hold_execution(self, ex: Mapping[str, Any]) -> None:
        if isinstance(ex.get("limit"), dict):
            self.hold(ex["limit"], execution_step(str(ex["pk"])))

    # --- grants --------------------------------------------------------------------------

    def _send(self, lpk: str, granted: list[dict[str, Any]], handoff: bool = False) -> None:
        """Send each step granted a slot of ``lpk`` again; one that needs no slot any more
        (settled, reset, cancelled, purged) gives it straight back, and whom that grants is sent
        in turn (a work list, not recursion: a cancelled fan-out of thousands is a long chain)."""
        work = list(granted)
        while work:
            w = work.pop(0)
            try:
                if not self._send_one(lpk, w, handoff):
                    work += self._leave(lpk, str(w["s"]), None)
            except StoreError as exc:  # its slot lapses; the scan grants it again
                log.warning("could not send %s step %s its slot: %s", w.get("e"), w.get("q"), exc)

    def _send_one(self, lpk: str, w: Mapping[str, Any], handoff: bool = False) -> bool:
        """Send the granted step ``w`` (``handoff``: its slot freed here, ActivityRequest.handoff);
        False when it needs no slot any more."""
        eng = self.engine
        if is_execution(str(w["s"])):
            return send_execution(eng, str(w["e"]))
        return send_granted(eng, lpk, w, handoff)

    def _check_expired(self, doc: Doc, now: float) -> list[dict[str, Any]]:
        """Settle the expired holders on their steps: a step still running (its lease renewed,
        the slot not) keeps the slot until that lease's expiry; a step granted the slot that never
        began (its message lost, its sender killed) keeps it for another TTL and is sent again
        (returned, to send after the write); any other gives it back."""
        holders: dict[str, Any] = doc.get("holders") or {}
        resend: list[dict[str, Any]] = []
        for step in expired(doc, now)[:CHECKS_PER_WRITE]:
            if is_execution(step):  # an execution's slot, held while it runs
                keep = check_execution(self.engine, holders[step], step, now, resend)
                if not keep:
                    del holders[step]
                continue
            eid, run, seq = _parse(step)
            docs = self.engine.cache.load(eid)
            marker = docs.get(marker_id(seq, run))
            lease = (marker or {}).get("lease") or {}
            holder = holders[step]
            ours = marker is not None and holder.get("t") in (None, marker_token(marker))
            if ours and marker is not None and lease_live(marker, now):
                # still running (its lease renewed), even if its execution ended meanwhile: it
                # holds the slot until it stops (told at its next renewal) or its lease lapses
                holder["exp"] = float(lease.get("expires") or now)
            elif not ours or marker is None or not_runnable(docs, seq, run) is not None:
                del holders[step]  # settled, or held for a marker a reset forgot
            elif count_of(marker, "attempts") < int(holder.get("n") or 1) and not holder.get("resent"):
                holder.update(exp=now + self.engine.settings.lease_ttl, resent=True)
                resend.append({"s": step, "e": eid, "r": run, "q": seq, "g": holder.get("g")})
            else:
                del holders[step]
        return resend

    # --- the scan ------------------------------------------------------------------------

    def scan(self, limit: int = 500) -> int:
        """Grant what waits on every due limit document (beat's recovery scan); the steps sent."""
        eng = self.engine
        sent = 0
        for ref in eng.store.scan_due(str(DueKind.LIMIT), eng.clock.now(), limit):
            try:
                sent += self._settle(ref.pk)
            except Exception as exc:  # noqa: BLE001 - one document never stops the scan
                log.warning("limit %s not settled: %s", ref.pk, exc)
        return sent

    def _settle(self, lpk: str) -> int:
        eng = self.engine
        for _ in range(ROUNDS):
            now = eng.clock.now()
            doc = self._load(lpk, fresh=True)
            if doc is None:
                return 0
            lost = self._check_expired(doc, now)
            granted = grant(doc, now, eng.settings.lease_ttl)
            try:
                self._write(lpk, doc, now)
            except ConflictError:
                continue
            self._send(lpk, granted + lost)
            return len(granted) + len(lost)
        return 0


def _has_rate(doc: Mapping[str, Any]) -> bool:
    return isinstance(doc.get("rate"), list)
