"""One running execution per dedup key (``wf.options(dedup_key=..., on_conflict=...)``).

A key's owner is one document, ``owner`` in partition ``dk:<digest of the key>``, naming the
execution that holds the key. A start with the key claims it *before* it creates its execution:

* no owner document: create it (create-only: of callers racing, one wins; the others read again);
* the owner is running (or not created yet, within :data:`CLAIM_GRACE` of its claim): a conflict,
  settled by ``on_conflict``: ``reject`` raises :class:`DuplicateStart`, ``return-existing``
  answers the owner's id, ``latest-wins`` requests the owner's cancel and takes the key;
* the owner ended (completed, failed, cancelled), was purged, or was never created (its starter
  died between the claim and the create, longer than the grace ago): take the key (etag replace).

Why claim first: the other order (create, then claim) leaves, if the starter dies in between, a
running execution that holds no claim, and a second start would run beside it. This order's
failure is milder: a start that dies between its two writes holds the key for the grace, and
nothing runs twice. The key is let go of by nothing: an owner that ended frees it, read lazily by
the next start (no write when an execution ends, no cross-partition step in its last commit).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Protocol

from celery_durable.engine.documents.model import EXEC_ID, TERMINAL, Clock, new_exec_doc
from celery_durable.engine.documents.schema import Status
from celery_durable.errors import ConfigurationError, ConflictError, DuplicateStart, StoreError
from celery_durable.stores.base import Doc, Store


class Engine(Protocol):
    """What a keyed start needs of the engine (``engine.core.Engine``)."""

    store: Store
    clock: Clock

    def cancel(self, execution_id: str, by: str | None = None, reason: str | None = None) -> bool: ...


__all__ = [
    "OnConflict",
    "DEDUP_PK_PREFIX",
    "OWNER_ID",
    "CANCELLED_BY",
    "CLAIM_GRACE",
    "dedup_pk",
    "check_dedup",
    "check_on_conflict",
    "claim",
]

DEDUP_PK_PREFIX = "dk:"
OWNER_ID = "owner"
#: seconds a claim may name an execution not created yet (its starter between its two writes)
CLAIM_GRACE = 60.0
#: the type of a purge's record (engine/admin/purge.py ``RECORD_TYPE``)
PURGED = "purged"
#: seconds ``return-existing`` waits for a holder claimed and not created yet
PENDING_WAIT = 2.0
MAX_KEY_LENGTH = 1000
#: who cancels an owner superseded by ``latest-wins`` (its operator-action record says so)
CANCELLED_BY = "dedup latest-wins"


class OnConflict(StrEnum):
    REJECT = "reject"
    RETURN_EXISTING = "return-existing"
    LATEST_WINS = "latest-wins"


def dedup_pk(key: str) -> str:
    """The partition of a key's owner document (a digest: any string is a key, and no key can
    name an execution's partition)."""
    return DEDUP_PK_PREFIX + hashlib.sha256(key.encode()).hexdigest()[:40]


def check_on_conflict(on_conflict: object) -> OnConflict:
    try:
        return OnConflict(str(on_conflict))
    except ValueError:
        choices = ", ".join(repr(p.value) for p in OnConflict)
        raise ConfigurationError(f"on_conflict must be one of {choices}, got {on_conflict!r:.60}") from None


def check_dedup(key: object, on_conflict: object) -> tuple[str, OnConflict]:
    """``(key, policy)`` if a caller may start with them, else :class:`ConfigurationError`
    (in the caller, before anything is stored)."""
    policy = check_on_conflict(on_conflict)
    if not isinstance(key, str) or not key:
        raise ConfigurationError(f"a dedup key must be a non-empty string, got {key!r:.60}")
    if len(key) > MAX_KEY_LENGTH:
        raise ConfigurationError(f"a dedup key may have at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    try:
        key.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate: no store can hold it
        raise ConfigurationError(f"a dedup key must be encodable as UTF-8: {exc}") from None
    return key, policy


class Owner(StrEnum):
    """What became of the execution an owner document names."""

    RUNNING = "running"
    ENDED = "ended"
    #: not created yet: its starter is between its claim and its create (within the grace)
    PENDING = "pending"
    #: never created, the grace is over (its starter died between its writes, or is very slow)
    ABANDONED = "abandoned"
    #: created, ended and purged since the claim
    PURGED = "purged"


def _owner(engine: Engine, owner: Doc, now: float) -> Owner:
    eid, claimed_at = str(owner.get("execution")), float(owner.get("claimed_at") or 0.0)
    ex = engine.store.read(eid, EXEC_ID)
    if ex is not None:
        if ex.get("dedup_key") != owner.get("key"):  # the id was purged and used again without the key
            return Owner.ENDED
        return Owner.ENDED if ex.get("status") in TERMINAL else Owner.RUNNING
    # the partition keeps a purge's record (engine/admin/purge.py), and little else
    docs = engine.store.query_partition(eid).docs
    if any(d.get("type") == PURGED and float(d.get("at") or 0.0) >= claimed_at for d in docs):
        return Owner.PURGED
    # pending within the grace either way: a claim from a clock far ahead of ours is not
    # trusted for longer (its starter is given up on; a takeover creates its execution cancelled)
    return Owner.PENDING if abs(now - claimed_at) < CLAIM_GRACE else Owner.ABANDONED


def _created_soon(engine: Engine, eid: str) -> bool:
    """Whether ``eid``, claimed and not created yet, is created within a moment (its starter is
    between its two writes): a handle to it is then a handle to something."""
    deadline = time.monotonic() + PENDING_WAIT
    while time.monotonic() < deadline:
        if engine.store.read(eid, EXEC_ID) is not None:
            return True
        time.sleep(0.02)
    return False


def _tombstone(engine: Engine, owner: Doc, eid: str, key: str, now: float) -> bool:
    """Create the owner's execution ended (cancelled) before its starter does: it will never run,
    and its starter's create finds it (``created`` False: a handle to a cancelled execution).
    False if its starter created it first (then it is running or ended: look again)."""
    ghost, workflow = str(owner.get("execution")), str(owner.get("workflow") or "")
    why = f"superseded by {eid} before it started (dedup key {key[:80]!r})"
    doc = new_exec_doc(ghost, workflow, {"args": [], "kwargs": {}}, None, None, now, dedup_key=key)
    doc.update(
        status=Status.CANCELLED,
        cancel_requested=True,
        completed_at=now,
        error={"type": "WorkflowCancelledError", "message": why},
        # its input is not known: resume, retry and reset refuse it (engine/admin/oplog.py)
        never_started=True,
    )
    return engine.store.create(doc) is not None


def claim(
    engine: Engine,
    key: str,
    on_conflict: OnConflict,
    eid: str,
    workflow: str,
    create: Callable[[], bool],
    reschedule: Callable[[str], bool] | None = None,
) -> tuple[str, bool]:
    """Start ``eid`` of ``workflow`` (``create()``: create-only, False when ``eid`` existed)
    holding ``key``, or settle the conflict with its running owner. Returns ``(execution id,
    created)`` as ``Engine.start`` does.

    Never two running holders: a key is taken from an owner that ended (or was purged); from a
    running one (``latest-wins``) only after its cancel is recorded; from one not created yet
    only after its execution is created ended in its place (create-only: if its starter created
    it first, the loop looks again). ``reschedule(owner)``: a debounced start's, True when it gave
    a still scheduled owner its input and a later start (engine/starts/debounce.py)."""
    store, pk = engine.store, dedup_pk(key)
    for _ in range(20):
        now = engine.clock.now()
        doc = store.read(pk, OWNER_ID)
        mine: Doc = {
            "pk": pk,
            "id": OWNER_ID,
            "type": "dedup_key",
            "key": key,
            "execution": eid,
            "workflow": workflow,
            "claimed_at": now,
        }
        if doc is None:
            if store.create(mine) is None:  # create-only: None when another start claimed it first
                continue  # read who
            return eid, create()
        owner = str(doc.get("execution"))
        if owner == eid:  # our own claim (a retried start with the same id)
            return eid, create()
        state = _owner(engine, doc, now)
        if reschedule is not None and state in (Owner.RUNNING, Owner.PENDING):
            # debounced: a scheduled holder takes this input and starts later (one being
            # created by a racing start is waited for, as return-existing does)
            if (state == Owner.RUNNING or _created_soon(engine, owner)) and reschedule(owner):
                return owner, False
            state = _owner(engine, doc, engine.clock.now())  # settled on what it is now (it may have ended)
        if state in (Owner.RUNNING, Owner.PENDING):
            if on_conflict == OnConflict.REJECT:
                raise DuplicateStart(
                    f"dedup key {key!r} is held by running execution {owner!r} (on_conflict='reject')", key, owner
                )
            if on_conflict == OnConflict.RETURN_EXISTING:
                if doc.get("workflow") not in (None, workflow):  # its handle would decode another's result
                    raise DuplicateStart(
                        f"dedup key {key!r} is held by {owner!r}, an execution of workflow "
                        f"{doc.get('workflow')!r}, not {workflow!r}",
                        key,
                        owner,
                    )
                if state == Owner.PENDING and not _created_soon(engine, owner):
                    raise DuplicateStart(f"dedup key {key!r} is held by {owner!r}, still being started", key, owner)
                return owner, False
            # latest wins: the owner is asked to stop (its compensations run; recorded on it as
            # an action, with why), or, not started yet, never starts
            if state == Owner.RUNNING:
                engine.cancel(owner, by=CANCELLED_BY, reason=f"superseded by {eid} (dedup key {key[:80]!r})")
            elif not _tombstone(engine, doc, eid, key, now):
                continue
            mine["superseded"] = owner
        elif state == Owner.ABANDONED and not _tombstone(engine, doc, eid, key, now):
            continue  # its starter created it after all: look again
        try:
            store.replace(mine, if_match=doc["_etag"])
        except ConflictError:
            continue
        return eid, create()
    raise StoreError(f"dedup key {key!r}: its owner kept changing; try again")


def owner_of(store: Store, key: str) -> str | None:
    """The id of the execution that last took ``key`` (running or not), if any."""
    doc = store.read(dedup_pk(key), OWNER_ID)
    return None if doc is None else str(doc.get("execution"))
