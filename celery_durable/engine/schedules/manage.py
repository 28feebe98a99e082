"""The operator's actions on managed schedules (create, update, delete, pause, resume, trigger,
backfill) and what a listing shows of one (:class:`ScheduleInfo`). Every write is guarded by the
etag it read; the checks of what a caller gives are the facade's (celery_durable/schedules.py),
done before any of these runs."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.schedules.firing import (
    SCHEDULES_PK,
    due_of,
    fire,
    manual_execution_id,
    new_schedule,
    next_due,
    note,
    schedule_id,
    tick_execution_id,
)
from celery_durable.engine.schedules.spec import Spec
from celery_durable.errors import ConfigurationError, ConflictError, DurableError
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = ["ScheduleInfo", "create", "update", "delete", "pause", "resume", "trigger", "backfill", "get", "listing"]

#: the most ticks one backfill starts (a longer range: several calls)
MAX_BACKFILL = 1000
#: the fields update() may change (the rest are the schedule's own record)
CHANGEABLE = frozenset(
    {"workflow", "payload", "every", "cron", "tz", "start_at", "end_at", "overlap", "catchup_window", "jitter"}
    | {"pause_on_failure"}
)
_TIMING = frozenset({"every", "cron", "tz", "start_at", "end_at"})
_ATTEMPTS = 50


@dataclass(frozen=True)
class ScheduleInfo:
    """What a listing shows of a schedule. ``kind``: ``"managed"`` (in the store) or ``"code"``
    (``Durable.schedule``: read-only here, its ticks are beat's). Times are epoch seconds."""

    name: str
    workflow: str
    kind: str
    spec: str
    tz: str = "UTC"
    overlap: str = "skip"
    paused: bool = False
    paused_reason: str | None = None
    next_fire: float | None = None
    last_execution: str | None = None
    last_status: str | None = None
    last_at: float | None = None
    running: tuple[str, ...] = ()
    counts: dict[str, int] = field(default_factory=dict)
    catchup_window: float | None = None
    jitter: float = 0.0
    pause_on_failure: bool = False
    actions: tuple[dict[str, Any], ...] = ()

    def as_json(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out.update(running=list(self.running), actions=list(self.actions))
        return out


def info(eng: EngineParts, doc: Doc) -> ScheduleInfo:
    last = doc.get("last") or {}
    status = None
    if last.get("execution"):
        ex = eng.store.read(str(last["execution"]), EXEC_ID)
        status = None if ex is None else str(ex.get("status"))
    return ScheduleInfo(
        name=str(doc["name"]),
        workflow=str(doc["workflow"]),
        kind="managed",
        spec=Spec.of(doc).describe(),
        tz=str(doc.get("tz") or "UTC"),
        overlap=str(doc.get("overlap")),
        paused=bool(doc.get("paused")),
        paused_reason=doc.get("paused_reason"),
        next_fire=None if doc.get("paused") else due_of(doc),
        last_execution=last.get("execution"),
        last_status=status,
        last_at=last.get("at"),
        running=tuple(doc.get("running") or ()),
        counts=dict(doc.get("counts") or {}),
        catchup_window=doc.get("catchup_window"),
        jitter=float(doc.get("jitter") or 0.0),
        pause_on_failure=bool(doc.get("pause_on_failure")),
        actions=tuple(doc.get("actions") or ()),
    )


def _read(eng: EngineParts, name: str) -> Doc:
    doc = eng.store.read(SCHEDULES_PK, schedule_id(name))
    if doc is None:
        raise ConfigurationError(f"no schedule named {name!r}")
    return doc


def _write(eng: EngineParts, name: str, change: Callable[[Doc], Doc | None]) -> Doc:
    """Apply ``change(doc) -> new doc`` (or None: nothing to write) under the etag it read."""
    for _ in range(_ATTEMPTS):
        doc = _read(eng, name)
        new: Doc | None = change(strip_reserved(doc))
        if new is None:
            return doc
        new.update(next_due(eng, new), updated_at=eng.clock.now())
        try:
            etag = eng.store.replace(new, if_match=doc["_etag"])
        except ConflictError:
            continue
        return new | {"_etag": etag}
    raise DurableError(f"could not change schedule {name!r}: too much contention")


def create(eng: EngineParts, name: str, fields: dict[str, Any], by: str) -> ScheduleInfo:
    """Store a new schedule (create-only: an existing name raises ConfigurationError)."""
    now = eng.clock.now()
    doc = new_schedule(name, fields, now)
    note(doc, "create", by, now)
    doc.update(next_due(eng, doc))
    if eng.store.create(doc) is None:
        raise ConfigurationError(f"a schedule named {name!r} exists: change it with update()")
    eng.emit("schedule_created", schedule=name)
    return info(eng, doc)


def update(eng: EngineParts, name: str, changes: dict[str, Any], by: str) -> ScheduleInfo:
    """Change a schedule's fields (checked by the caller); a new timing counts from now."""

    def change(doc: Doc) -> Doc:
        doc.update(changes)
        if _TIMING & set(changes):
            doc["next_tick"] = Spec.of(doc).next_tick(eng.clock.now())
        note(doc, "update", by, eng.clock.now(), ", ".join(sorted(changes)))
        return doc

    return info(eng, _write(eng, name, change))


def delete(eng: EngineParts, name: str) -> bool:
    """Delete the schedule (the executions it started go on); False if there was none."""
    return eng.store.delete(SCHEDULES_PK, schedule_id(name))


def pause(eng: EngineParts, name: str, by: str, reason: str | None) -> bool:
    """Pause: no tick fires until resumed. False if it was paused already."""
    was: list[bool] = []

    def change(doc: Doc) -> Doc | None:
        was[:] = [bool(doc.get("paused"))]
        if doc.get("paused"):
            return None
        now = eng.clock.now()
        doc.update(paused=True, paused_reason=reason, paused_by=by, paused_at=now)
        note(doc, "pause", by, now, reason)
        return doc

    _write(eng, name, change)
    return not was[0]


def resume(eng: EngineParts, name: str, by: str, reason: str | None) -> bool:
    """Resume from the next tick after now (the ticks of the pause are not run: backfill them).
    False if it was not paused."""
    was: list[bool] = []

    def change(doc: Doc) -> Doc | None:
        was[:] = [bool(doc.get("paused"))]
        if not doc.get("paused"):
            return None
        now = eng.clock.now()
        doc.update(paused=False, paused_reason=None, paused_by=None, paused_at=None)
        doc["next_tick"] = Spec.of(doc).next_tick(now)
        note(doc, "resume", by, now, reason)
        return doc

    _write(eng, name, change)
    return was[0]


def _noting(action: str, by: str, now: float, reason: str | None = None) -> Callable[[Doc], Doc]:
    def change(doc: Doc) -> Doc:
        note(doc, action, by, now, reason)
        return doc

    return change


def trigger(eng: EngineParts, name: str, by: str) -> str | None:
    """Fire once now, by the overlap policy; the id started, or None (skipped, or kept)."""
    doc = _read(eng, name)
    now = eng.clock.now()
    eid = _unused_trigger_id(eng, doc, now)
    _write(eng, name, _noting("trigger", by, now))
    started = fire(eng, name, [(now, eid)])
    return eid if eid in started else None


def _unused_trigger_id(eng: EngineParts, doc: Doc, now: float) -> str:
    """A trigger's id, to the microsecond of ``now``, moved on while that id is taken: two
    triggers in one tick of a coarse (or a test's fake) clock are two executions, not one counted twice."""
    taken = set(doc.get("running") or ()) | {str(s["id"]) for s in doc.get("starting") or ()}
    taken.add(str(doc.get("buffered_id")))
    name, at = str(doc["name"]), now
    while (eid := manual_execution_id(name, at)) in taken or eng.store.read(eid, EXEC_ID) is not None:
        at += 1e-6
    return eid


def backfill(eng: EngineParts, name: str, start: float, end: float, by: str, overlap: str | None = None) -> list[str]:
    """Run the ticks in ``[start, end)`` now, in order, by ``overlap`` (default the schedule's;
    ``allow_all`` starts them all). A tick that ran already is not started again (its id exists).
    Returns the ids decided to start."""
    doc = _read(eng, name)
    if not (math.isfinite(start) and math.isfinite(end)) or end <= start:
        raise ConfigurationError("backfill needs start < end")
    spec = Spec.of(doc)
    ticks = spec.ticks(start, end, MAX_BACKFILL)
    manual = [(t, tick_execution_id(name, t)) for t in ticks]  # before the action is recorded
    now = eng.clock.now()
    _write(eng, name, _noting("backfill", by, now, f"{len(ticks)} ticks"))
    if not ticks:
        return []
    return fire(eng, name, manual, overlap)


def get(eng: EngineParts, name: str) -> ScheduleInfo | None:
    doc = eng.store.read(SCHEDULES_PK, schedule_id(name))
    return None if doc is None else info(eng, doc)


def listing(eng: EngineParts) -> list[ScheduleInfo]:
    """Every managed schedule (one partition query), by name."""
    docs = eng.store.query_partition(SCHEDULES_PK).docs
    return sorted((info(eng, d) for d in docs if d.get("type") == "schedule"), key=lambda i: i.name)
