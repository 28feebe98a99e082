"""Firing a schedule: what its due ticks do, decided on its document and written etag-guarded.

A schedule is one document (``sch:all``/``s:<digest>``), due (``due_kind="schedule"``) at its next
tick plus that tick's jitter; beat's clock scan (glue/beat_scans.py ``clock_pass``: the timers,
then :func:`fire_due`) calls :func:`fire`.
A firing reads the document, looks at the executions it started (``running``), decides each due
tick by the overlap policy and the catch-up window, and writes the decision in one replace guarded
by the etag it read, *before* starting anything: the starts it decided (``starting``: ids
``<name>@<tick UTC>``) are then created create-only and moved to ``running`` by a second replace.
So two beats (or two scanners) firing the same tick converge: one of the two decision writes
wins, the other re-reads and finds the tick decided; a firer that dies between the two writes
leaves ``starting`` on the document, which the next firing creates (create-only: an execution
created already is not created twice). No message is sent by a schedule that has nothing due.

The end of an execution does not notify its schedule: a tick kept for later (``buffer_one``,
``cancel_other``) and a failure to pause on are seen by the next firing, which for a kept tick is
after a tenth of the time it has waited (a clock interval at first, a recovery interval at most:
:func:`next_due`) and for a failure is the next tick.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.records import is_terminal
from celery_durable.engine.documents.schema import DocType, DueKind, Status
from celery_durable.engine.limits.spec import limit_of_stored
from celery_durable.engine.schedules.spec import ALLOW_ALL, CANCEL_OTHER, SKIP, Spec, tick_delay, tick_stamp
from celery_durable.errors import ConflictError, DurableError
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = [
    "SCHEDULES_PK",
    "schedule_id",
    "tick_execution_id",
    "manual_execution_id",
    "fire",
    "fire_due",
    "next_due",
    "due_of",
    "note",
]

log = logging.getLogger("celery_durable.schedules")

#: the one partition holding every schedule (a listing is one partition query)
SCHEDULES_PK = "sch:all"
#: the most ticks one firing starts or keeps (the rest stay due: the next scan goes on)
MAX_TICKS = 100
#: the most ticks one firing looks at, missed ones included
MAX_MISSED = 10_000
#: the most started executions a schedule keeps looking at (older ones: no longer tracked)
MAX_RUNNING = 100
#: the operator actions a schedule keeps
MAX_ACTIONS = 20
_ATTEMPTS = 50
_FAILED = (Status.FAILED, Status.TIMED_OUT)


def schedule_id(name: str) -> str:
    """The document id of schedule ``name`` (a digest: any name is a valid id on every store)."""
    return "s:" + hashlib.sha256(name.encode()).hexdigest()[:40]


def tick_execution_id(name: str, tick: float) -> str:
    """The execution id of a tick: ``<name>@<UTC, to the second>``, as ``Durable.schedule``'s."""
    return f"{name}@{tick_stamp(tick)}"


def manual_execution_id(name: str, now: float) -> str:
    """The execution id of a trigger (to the microsecond: never a tick's)."""
    return f"{name}@{datetime.fromtimestamp(now, tz=UTC).strftime('%Y%m%dT%H%M%S.%f')}"


def note(doc: dict[str, Any], action: str, by: str, now: float, reason: str | None = None) -> None:
    """Record an action on the schedule's document (the latest :data:`MAX_ACTIONS` are kept)."""
    actions = list(doc.get("actions") or [])
    actions.append({"action": action, "by": by, "at": now, "reason": reason})
    doc["actions"] = actions[-MAX_ACTIONS:]


def due_of(doc: Doc) -> float | None:
    """When the schedule's next tick fires (the tick plus its jitter), paused or not; None: no tick left."""
    tick = doc.get("next_tick")
    if not isinstance(tick, int | float):
        return None
    return float(tick) + tick_delay(Spec.of(doc), str(doc["name"]), float(tick), float(doc.get("jitter") or 0.0))


def next_due(eng: EngineParts, doc: dict[str, Any]) -> dict[str, Any]:
    """The due fields of ``doc``: its next tick plus jitter; sooner while it keeps a tick or has
    starts to create; nothing with nothing left (paused: only starts to create)."""
    times = []
    due = due_of(doc)
    if due is not None and not doc.get("paused"):
        times.append(due)
    # starts decided before a pause are still created (a trigger's too); a kept tick waits for the resume
    now, every = eng.clock.now(), float(eng.settings.clock_interval)
    if doc.get("starting"):
        times.append(now + every)
    elif doc.get("buffered") is not None and not doc.get("paused"):
        # a kept tick waits for the running execution's end, which does not notify the schedule:
        # looked at again after a tenth of the time it has waited (a clock interval at first, a
        # recovery interval at most), so a long run costs a write per recovery interval, not per second
        waited = max(0.0, now - float(doc["buffered"]))
        times.append(now + min(max(every, waited / 10), max(every, float(eng.settings.recovery_interval))))
    if not times:
        return {"due_kind": None, "due_at": None}
    return {"due_kind": DueKind.SCHEDULE.value, "due_at": min(times)}


def fire_due(eng: EngineParts, limit: int = 500) -> int:
    """Beat's scan of due schedules (with the clock scan); returns the executions started."""
    started = 0
    for ref in eng.store.scan_due(DueKind.SCHEDULE.value, eng.clock.now(), limit):
        if ref.pk != SCHEDULES_PK:
            continue
        try:
            doc = eng.store.read(ref.pk, ref.id)
            if doc is not None:
                started += len(fire(eng, str(doc["name"])))
        except Exception:  # one broken schedule never stops the others
            log.exception("firing schedule %s failed", ref.id)
    return started


def fire(
    eng: EngineParts, name: str, manual: list[tuple[float, str]] | None = None, overlap: str | None = None
) -> list[str]:
    """Decide the schedule's due ticks (and ``manual`` ones: ``(tick, execution id)`` of a trigger
    or a backfill, by ``overlap`` or the schedule's policy), write the decision, start what it
    decided. Returns the ids of the executions it decided to start (created now, or by a firer
    that raced it). Idempotent; two firers converge on one execution per tick."""
    # a backfilled tick whose execution exists ran already: not decided again (nor counted, nor
    # taken as running), returned all the same
    ran = {eid for _, eid in manual or () if eng.store.read(eid, EXEC_ID) is not None}
    fresh = [(at, eid) for at, eid in manual or () if eid not in ran]
    for _ in range(_ATTEMPTS):
        doc = eng.store.read(SCHEDULES_PK, schedule_id(name))
        if doc is None:
            if manual:
                raise DurableError(f"no schedule named {name!r}")
            return []
        if doc.get("starting"):
            _create_starting(eng, doc)
            continue
        decided = _decide(eng, doc, fresh, overlap)
        if decided is None:
            return [eid for _, eid in manual or () if eid in ran]
        new, cancels = decided
        try:
            etag = eng.store.replace(new, if_match=doc["_etag"])
        except ConflictError:
            continue  # another firer or an operator wrote it: decide again on what it wrote
        for eid in cancels:
            try:
                eng.cancel(eid, by=f"schedule {name}", reason="overlap policy cancel_other: a new tick is due")
            except DurableError as exc:
                log.warning("schedule %s could not cancel %s: %s", name, eid, exc)
        ids = [str(s["id"]) for s in new.get("starting") or []]
        if ids:
            _create_starting(eng, new | {"_etag": etag})
        return [eid for _, eid in manual or () if eid in ran or eid in ids] if manual else ids
    raise DurableError(f"could not fire schedule {name!r}: too much contention")


def _create_starting(eng: EngineParts, doc: Doc) -> None:
    """Create the decided starts (create-only), then move them to ``running``."""
    definition, now = eng.registry.workflow(str(doc["workflow"])), eng.clock.now()
    refused: list[str] = []
    for start in doc.get("starting") or []:
        payload = dict(doc["payload"])
        try:  # its workflow's limit, as start() takes it: a tick waits for a slot like any start
            fields = limit_of_stored(definition, payload, now)
        except Exception as exc:  # the key function fails on this input (changed since create)
            log.exception("schedule %s cannot start %s: its workflow's limit key failed", doc["name"], start["id"])
            refused.append(f"{start['id']} not started: its workflow's limit key failed: {type(exc).__name__}: {exc}")
            continue
        created = eng.create_execution(str(doc["workflow"]), payload, str(start["id"]), None, **fields)
        eng.emit("schedule_started", schedule=doc["name"], execution_id=start["id"], created=created)
    done = strip_reserved(doc) | {"starting": [], "updated_at": now}
    if refused:  # not retried every scan: paused, with the error for the operator (update, resume)
        done.update(paused=True, paused_reason=refused[-1][:500], paused_by="schedule", paused_at=now)
        note(done, "pause", "schedule", now, refused[-1][:500])
    done.update(next_due(eng, done))
    try:
        eng.store.replace(done, if_match=doc["_etag"])
    except ConflictError:
        pass  # re-read by the caller (or the next firing), which finds them created


def _alive(eng: EngineParts, running: list[str]) -> tuple[list[str], list[tuple[str, Any]], set[str]]:
    """The executions of ``running`` not ended, the ended ones that failed (id, error), and the
    ones not ended that no cancel was asked of."""
    alive, failed, uncancelled = [], [], set()
    for eid in running:
        ex = eng.store.read(eid, EXEC_ID)
        if ex is None:
            continue
        if not is_terminal(ex):
            alive.append(eid)
            if not ex.get("cancel_requested"):
                uncancelled.add(eid)
        elif ex.get("status") in _FAILED:
            failed.append((eid, ex.get("error")))
    return alive, failed, uncancelled


def _decide(
    eng: EngineParts, doc: Doc, manual: list[tuple[float, str]], overlap: str | None
) -> tuple[Doc, list[str]] | None:
    """The document after this firing and the executions to cancel; ``None``: nothing to write."""
    now = eng.clock.now()
    name = str(doc["name"])
    new: dict[str, Any] = strip_reserved(doc)
    running, failed, uncancelled = _alive(eng, list(doc.get("running") or []))
    changed = running != list(doc.get("running") or [])
    new["running"] = running
    counts = dict(doc.get("counts") or {})
    if failed and doc.get("pause_on_failure") and not doc.get("paused"):
        eid, error = failed[-1]
        message = error.get("message") if isinstance(error, dict) else None
        reason = f"{eid} failed" + (f": {message}" if message else "")
        new.update(paused=True, paused_reason=reason[:500], paused_by="pause_on_failure", paused_at=now)
        note(new, "pause", "pause_on_failure", now, reason[:500])
        eng.emit("schedule_paused", schedule=name, execution_id=eid)
        changed = True
    starting: list[dict[str, Any]] = []
    cancels: list[str] = []
    policy = str(doc.get("overlap") or SKIP)

    def tick(at: float, eid: str, how: str) -> None:
        if how == ALLOW_ALL or not running:
            starting.append({"id": eid, "tick": at})
            running.append(eid)
            new["last"] = {"tick": at, "execution": eid, "at": now}
            counts["started"] = counts.get("started", 0) + 1
        elif how == SKIP:
            counts["skipped"] = counts.get("skipped", 0) + 1
        else:  # buffer_one, cancel_other: kept until the running ones end
            if new.get("buffered") is not None:
                counts["dropped"] = counts.get("dropped", 0) + 1
            new["buffered"], new["buffered_id"] = at, eid
            if how == CANCEL_OTHER:
                cancels.extend(e for e in running if e not in cancels)

    buffered = new.get("buffered")
    if buffered is not None and not running and not new.get("paused"):  # the running one ended: it starts now
        # its own id: a kept trigger's is not the id of the tick of its second (the one it waited for)
        kept = new.get("buffered_id") or tick_execution_id(name, float(buffered))
        new["buffered"], new["buffered_id"] = None, None
        tick(float(buffered), str(kept), policy)
        changed = True
    if not new.get("paused"):
        spec, jitter = Spec.of(new), float(new.get("jitter") or 0.0)
        window = float(new.get("catchup_window") or 0.0)
        at, decided, looked = new.get("next_tick"), 0, 0
        # a missed tick costs no start and no write: many are counted a firing, so a long outage
        # is crossed in a few scans, before the ticks after it are late too
        while isinstance(at, int | float) and decided < MAX_TICKS and looked < MAX_MISSED:
            due = float(at) + tick_delay(spec, name, float(at), jitter)
            if due > now:
                break
            if now - due > window:  # beat was down longer than the catch-up window: not run
                counts["missed"] = counts.get("missed", 0) + 1
            else:
                tick(float(at), tick_execution_id(name, float(at)), policy)
                decided += 1
            at, looked = spec.next_tick(float(at)), looked + 1
        if looked:
            new["next_tick"], changed = at, True
    for at, eid in manual:  # a trigger or a backfill: by its policy, paused or not
        tick(at, eid, overlap or policy)
        changed = True
    if policy == CANCEL_OTHER and new.get("buffered") is not None:
        # a cancel decided earlier may be lost (its firer died after the decision, or it was asked
        # before the execution was created): asked again of a running one no cancel reached
        cancels.extend(e for e in running if e in uncancelled and e not in cancels)
    if not changed and new.get("due_at") == next_due(eng, new)["due_at"]:
        return None
    new["running"] = running[-MAX_RUNNING:]
    new.update(counts=counts, starting=starting, updated_at=now)
    new.update(next_due(eng, new))
    return new, cancels


def new_schedule(name: str, fields: dict[str, Any], now: float) -> dict[str, Any]:
    """A new schedule's document (without its due fields: :func:`next_due`)."""
    spec = Spec.of(fields)
    return {
        "pk": SCHEDULES_PK,
        "id": schedule_id(name),
        "type": DocType.SCHEDULE.value,
        "name": name,
        **fields,
        "next_tick": spec.next_tick(now),
        "running": [],
        "buffered": None,
        "buffered_id": None,
        "starting": [],
        "last": None,
        "counts": {},
        "paused": False,
        "created_at": now,
        "updated_at": now,
    }
