"""Workflow deadlines and delayed starts (``options(timeout=..., start_delay=...)``).

Both are *clocks*: a document in the execution's partition, due for the timer scan
(``due_kind = clock``), written in the very batch that creates the exec, so no crash, lost
message or restarted worker can skip one; beat's clock scan (``Timers.fire_due_clocks``) fires it
like a timer, and firing twice converges (every write is guarded by the exec's etag).

* ``clock:deadline`` (at the exec's ``deadline_at``): firing it marks the exec ``timed_out`` with a
  cancel request and drives it. The replay delivers that cancel as :class:`WorkflowTimedOutError`
  at the suspension point the execution waits at (the outcomes of its pending steps are recorded
  as the timeout, create-only, so a running activity's later result is ignored), compensations run
  (``except``, ``finally``, ``Saga``), and the execution ends ``timed_out`` unless its code caught
  the error and went on (then it ends as its code decides; a deadline is delivered once, as a
  cancel is). A child's deadline is the earlier of its own and its parent's (``start_child``).
* ``clock:start`` (at ``start_at``): the execution was created ``scheduled`` (its id, dedup key and
  handle work at once; signals sent meanwhile wait for its first wait); firing makes it
  ``running`` and sends its first drive. A cancel before then ends it ``cancelled`` at once: no
  code of it ever ran, there is nothing to compensate.

A timeout counts from the start of the first drive: ``start_delay`` plus ``timeout`` is when a
delayed execution times out. An operator's retry, resume or reset of an execution lifts its
deadline (``deadline_at`` cleared: engine/admin/operator.py), so the re-run is not ended at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery_durable.engine.admin.oplog import cancel_ops
from celery_durable.engine.admin.pause import PAUSED_FIELDS, park
from celery_durable.engine.documents.model import DUE_CLOCK, DUE_EXEC, EXEC_ID
from celery_durable.engine.documents.records import is_terminal, maybe_exec
from celery_durable.engine.documents.schema import CANCELLED_BY_PARENT, DocType, Status
from celery_durable.engine.outcomes import ClockOutcome
from celery_durable.errors import ConfigurationError, ConflictError, DurableError
from celery_durable.stores.base import Doc, Op, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = [
    "CLOCK_PREFIX",
    "LIFTED",
    "DEADLINE_CLOCK",
    "START_CLOCK",
    "Timing",
    "check_seconds",
    "timing_of",
    "exec_fields",
    "fire_exec_clock",
    "cancel_scheduled",
    "end_unstarted",
    "unmarked_op",
    "running_ops",
]

CLOCK_PREFIX = "clock:"
#: the exec fields an operator's re-run (retry, resume, reset) clears: it runs with no deadline
LIFTED: dict[str, Any] = {"deadline_at": None, "timed_out": None, "paused": None, "paused_at": None}  # nor paused
DEADLINE_CLOCK = "clock:deadline"
START_CLOCK = "clock:start"
_ATTEMPTS = 50
#: the longest timeout or delay taken (100 years): beyond it a time is no longer a date to show
MAX_SECONDS = 100 * 365 * 86400.0


@dataclass(frozen=True)
class Timing:
    """A start's deadline and delay: ``timeout`` seconds from its first drive (``None``: none),
    first driven ``start_delay`` seconds after the start (0: at once)."""

    timeout: float | None = None
    start_delay: float = 0.0
    #: the delay is a quiet period: a start with the same dedup key while this one is still
    #: scheduled gives it its input and moves its start (engine/starts/debounce.py)
    debounce: bool = False


def check_seconds(name: str, value: object, *, zero_ok: bool) -> float | None:
    """``value`` (seconds, or a ``timedelta``; ``None``: not given) as finite seconds, checked in
    the caller: a bool, another type, NaN, an infinity, a negative (or, unless ``zero_ok``, a zero)
    duration raises :class:`ConfigurationError` naming ``name``."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int beyond any float: past every bound below
            raise ConfigurationError(
                f"{name} must be at most {MAX_SECONDS:.0f} seconds (100 years), not {value!r}"
            ) from None
    else:
        raise ConfigurationError(f"{name} must be seconds (int or float) or a timedelta, not {value!r}")
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name} must be a finite duration, not {value!r}")
    if seconds < 0 or (seconds == 0 and not zero_ok):
        raise ConfigurationError(f"{name} must be {'>= 0' if zero_ok else '> 0'} seconds, not {value!r}")
    if seconds > MAX_SECONDS:
        raise ConfigurationError(f"{name} must be at most {MAX_SECONDS:.0f} seconds (100 years), not {value!r}")
    return seconds


def timing_of(timeout: object, start_delay: object, debounce: object = None) -> Timing | None:
    """The checked :class:`Timing` of ``options(timeout=, start_delay=, debounce=)``; ``None``
    when none is given. ``debounce`` is a start delay that later keyed starts move."""
    seconds = check_seconds("timeout", timeout, zero_ok=False)
    delay = check_seconds("start_delay", start_delay, zero_ok=True) or 0.0
    quiet = check_seconds("debounce", debounce, zero_ok=False)
    if quiet is not None:
        if delay:
            raise ConfigurationError("debounce is a start delay of its own: give debounce or start_delay, not both")
        return Timing(seconds, quiet, debounce=True)
    return None if seconds is None and not delay else Timing(seconds, delay)


def _clock(eid: str, kind: str, at: float) -> Doc:
    return {"pk": eid, "id": CLOCK_PREFIX + kind, "type": DocType.CLOCK.value, "kind": kind, "at": at}


def exec_fields(eid: str, timing: Timing | None, cap: float | None, now: float) -> tuple[dict[str, Any], list[Doc]]:
    """The exec fields and clock documents of a new execution: ``status=scheduled`` and
    ``start_at`` with a delay; ``deadline_at``: the earlier of its timeout's end and ``cap`` (its
    parent's deadline). Nothing for a start with neither."""
    fields: dict[str, Any] = {}
    clocks: list[Doc] = []
    delay = timing.start_delay if timing is not None else 0.0
    begins = now + delay
    if delay > 0:
        fields.update(status=Status.SCHEDULED.value, start_at=begins, due_kind=None, due_at=None)
        if timing is not None and timing.debounce:
            fields["debounce"] = delay
        clocks.append(_clock(eid, "start", begins) | {"due_kind": DUE_CLOCK.value, "due_at": begins})
    ends = [
        t for t in (cap, None if timing is None or timing.timeout is None else begins + timing.timeout) if t is not None
    ]
    if ends:
        fields["deadline_at"] = deadline = min(ends)
        clocks.append(_clock(eid, "deadline", deadline) | {"due_kind": DUE_CLOCK.value, "due_at": deadline})
    return fields, clocks


def _settled(clock: Doc, now: float) -> Doc:
    return strip_reserved(clock) | {"due_kind": None, "due_at": None, "fired_at": now}


def fire_exec_clock(eng: EngineParts, execution_id: str, clock_id: str) -> ClockOutcome:
    """Fire the execution's deadline or start clock (beat's clock scan); idempotent."""
    for _ in range(_ATTEMPTS):
        clock = eng.store.read(execution_id, clock_id)
        if clock is None or not clock.get("due_kind"):
            return ClockOutcome.DONE if clock is not None else ClockOutcome.MISSING
        ex = maybe_exec(eng.store.read(execution_id, EXEC_ID))
        now = eng.clock.now()
        try:
            if ex is None:  # purged, or a hand-deleted exec: nothing to time
                eng.store.delete(execution_id, clock_id)
                return ClockOutcome.DONE
            if ex.get("paused") and not is_terminal(ex):  # fired once unpaused (engine/admin/pause.py)
                park(eng, clock, ex)
                return ClockOutcome.DONE
            if clock_id == DEADLINE_CLOCK and ex.get("status") == Status.QUEUED and not ex.get("parent"):
                return ClockOutcome.EARLY  # counted from its start: moved when it gets its slot
            if clock_id == DEADLINE_CLOCK and ex.get("status") == Status.QUEUED:  # a child's: from its step
                return _time_out_queued(eng, ex, clock, now)
            if clock_id == DEADLINE_CLOCK and ex.get("status") == Status.SCHEDULED:
                # its start is due too (a deadline counts from it): started first, then timed
                if fire_exec_clock(eng, execution_id, START_CLOCK) != ClockOutcome.FIRED:
                    return ClockOutcome.EARLY
                continue
            if clock_id == DEADLINE_CLOCK:
                return _fire_deadline(eng, ex, clock, now)
            return _fire_start(eng, ex, clock, now)
        except ConflictError:
            continue  # the exec (or the clock) changed meanwhile: look again
    raise DurableError(f"could not fire {clock_id} of {execution_id!r}: too much contention")


def _settle_only(eng: EngineParts, clock: Doc, now: float) -> ClockOutcome:
    eng.store.replace(_settled(clock, now), if_match=clock["_etag"])
    return ClockOutcome.DONE


def _fire_deadline(eng: EngineParts, ex: Any, clock: Doc, now: float) -> ClockOutcome:
    """Drive the execution with its deadline: the drive's commit marks it ``timed_out`` and records
    the timeout as the outcome of the steps it waits on, in one batch (``Driver.drive``'s
    ``timing_out``), so an activity result landing after it is late and ignored. The clock is
    settled after: a crash in between fires it again, which finds the mark and only settles."""
    at = ex.get("deadline_at")
    if is_terminal(ex) or not isinstance(at, int | float):
        return _settle_only(eng, clock, now)  # ended, or its deadline was lifted (an operator's re-run)
    if now < at:
        return ClockOutcome.EARLY
    if not _parent_first(eng, ex, float(at)):
        if _parent_paused(eng, ex):  # its deadline (the parent's) comes with the parent's unpause:
            _snooze(eng, clock, now)  # looked at a recovery interval later, not at every clock scan
        return ClockOutcome.EARLY
    pk = str(ex["pk"])
    if not ex.get("timed_out"):
        eng.emit("workflow_deadline", execution_id=pk, workflow=ex.get("workflow"), lateness=now - float(at))
        eng.driver.drive(pk, timing_out=True)
        again = maybe_exec(eng.store.read(pk, EXEC_ID))
        if again is not None and not is_terminal(again) and not again.get("timed_out"):
            return ClockOutcome.EARLY  # not recorded (contention): the next scan fires it again
    eng.store.replace(_settled(clock, now), if_match=clock["_etag"])
    return ClockOutcome.FIRED


def _parent_paused(eng: EngineParts, ex: Any) -> bool:
    link = ex.get("parent")
    pk = link.get("pk") if isinstance(link, dict) else None
    parent = maybe_exec(eng.store.read(pk, EXEC_ID)) if isinstance(pk, str) else None
    return parent is not None and bool(parent.get("paused"))


def _snooze(eng: EngineParts, clock: Doc, now: float) -> None:
    later = now + eng.settings.recovery_interval
    try:
        eng.store.replace(strip_reserved(clock) | {"due_at": later}, if_match=clock["_etag"])
    except ConflictError:
        pass


def _parent_first(eng: EngineParts, ex: Any, at: float) -> bool:
    """A child whose deadline is its parent's (capped by it) times out after its parent: the
    parent's deadline is fired first, so the parent ends ``timed_out`` (its timeout recorded as the
    child step's outcome, the child cancelled) rather than failed by its child's timeout reported
    first. False: the parent's is due but not recorded yet (the next scan tries both again)."""
    link = ex.get("parent")
    pk = link.get("pk") if isinstance(link, dict) else None
    if not isinstance(pk, str):
        return True

    def settled() -> bool:
        parent = maybe_exec(eng.store.read(pk, EXEC_ID))
        limit = None if parent is None else parent.get("deadline_at")
        return (
            parent is None
            or is_terminal(parent)
            or bool(parent.get("timed_out"))
            or not isinstance(limit, int | float)
            or limit > at
        )

    if settled():
        return True
    fire_exec_clock(eng, pk, DEADLINE_CLOCK)
    return settled()


def _fire_start(eng: EngineParts, ex: Any, clock: Doc, now: float) -> ClockOutcome:
    if ex.get("status") != Status.SCHEDULED:  # cancelled meanwhile, or started already
        return _settle_only(eng, clock, now)
    start_at = ex.get("start_at")
    if isinstance(start_at, int | float) and now < start_at:
        return ClockOutcome.EARLY
    pk = str(ex["pk"])
    limited = isinstance(ex.get("limit"), dict)  # it waits for a slot first (engine/limits/workflows.py)
    planned = float(start_at) if isinstance(start_at, int | float) else now
    ops = [Op.replace(_settled(clock, now), clock["_etag"])]
    if limited:
        # queued as of its planned start: its deadline (from start_at) moves by the whole wait, a late clock's too
        queued = strip_reserved(ex) | {"status": Status.QUEUED.value, "queued_at": planned, "updated_at": now}
        eng.store.batch(pk, [Op.replace(queued | _due(eng, now), ex["_etag"]), *ops])
    else:
        eng.store.batch(pk, running_ops(eng, ex, planned, now) + ops)
    eng.emit("workflow_scheduled_start", execution_id=pk, workflow=ex.get("workflow"))
    if limited:
        eng.limits.queue_execution(pk, ex["limit"])
    else:
        eng.dispatcher.send_drive(pk)
    return ClockOutcome.FIRED


def _due(eng: EngineParts, now: float) -> dict[str, Any]:
    # its first drive message may be lost: recovery drives it after drive_timeout
    return {"due_kind": DUE_EXEC.value, "due_at": now + eng.settings.drive_timeout}


def running_ops(eng: EngineParts, ex: Any, planned: float, now: float) -> list[Op]:
    """The batch that makes a ``scheduled`` or ``queued`` execution ``running`` (its first drive to
    be sent after it): its timeout counts from its first drive, so one started later than
    ``planned`` (a scan that fired its start late, a slot it waited for) has its deadline moved as
    late (a delayed or queued start is never a child, so no parent's deadline caps it)."""
    pk = str(ex["pk"])
    updated = strip_reserved(ex) | {"status": Status.RUNNING.value, "updated_at": now} | _due(eng, now)
    ops = [Op.replace(updated, ex["_etag"])]
    deadline_at, late = ex.get("deadline_at"), now - planned
    if isinstance(deadline_at, int | float) and late > 0:
        updated["deadline_at"] = moved = float(deadline_at) + late
        deadline = eng.store.read(pk, DEADLINE_CLOCK)
        if deadline is not None and deadline.get("due_kind"):
            ops.append(Op.replace(strip_reserved(deadline) | {"at": moved, "due_at": moved}, deadline["_etag"]))
    return ops


def _time_out_queued(eng: EngineParts, ex: Any, clock: Doc, now: float) -> ClockOutcome:
    """A queued child's deadline passed before it got a slot: it ends ``timed_out`` at once (none of
    its code ran), leaves its limit's queue, and its parent is told."""
    at = ex.get("deadline_at")
    if not isinstance(at, int | float) or now < at:
        return ClockOutcome.EARLY
    if not _parent_first(eng, ex, float(at)):
        if _parent_paused(eng, ex):  # as _fire_deadline: it comes with the parent's unpause
            _snooze(eng, clock, now)
        return ClockOutcome.EARLY
    if not end_unstarted(eng, ex, Status.TIMED_OUT, "WorkflowTimedOutError", "its deadline passed before it started"):
        return ClockOutcome.EARLY  # it changed meanwhile: the next scan looks again
    eng.store.replace(_settled(clock, now), if_match=clock["_etag"])
    return ClockOutcome.FIRED


def end_unstarted(
    eng: EngineParts,
    ex: Any,
    status: Status,
    error: str,
    message: str,
    by: str | None = None,
    reason: str | None = None,
    extra: dict[str, Any] | None = None,
) -> bool:
    """End an execution none of whose code ran (``scheduled``, ``queued``) with ``status``: its
    start clock settled in the same batch (an operator's cancel recorded in it), its place on its
    limit given up, its parent told. False when the exec changed meanwhile (read it again)."""
    pk, now = str(ex["pk"]), eng.clock.now()
    ended = (
        strip_reserved(ex)
        | {
            "status": status.value,
            "cancel_requested": True,
            "error": {"type": error, "message": message},
            "completed_at": now,
            "updated_at": now,
            "due_kind": None,
            "due_at": None,
        }
        | PAUSED_FIELDS
        | (extra or {})
    )
    if status == Status.TIMED_OUT:
        ended["timed_out"] = True
    if ex.get("parent"):  # stays due until the parent has been told (as any child's end)
        ended.update(parent_notified=False, due_kind=DUE_EXEC.value, due_at=now + eng.settings.drive_timeout)
    ops = [Op.replace(ended, ex["_etag"])] if by is None else cancel_ops(ex, ended, by, reason, now)
    clock = eng.store.read(pk, START_CLOCK)
    if clock is not None and clock.get("due_kind"):
        ops.insert(0, Op.replace(_settled(clock, now), clock["_etag"]))
    try:
        eng.store.batch(pk, ops)
    except ConflictError:
        return False
    eng.emit(f"workflow_{status.value}", execution_id=pk, workflow=ex.get("workflow"))
    eng.limits.release_execution(ex)  # its place in its limit's queue
    if ex.get("parent"):
        eng.children.notify_parent(pk)
    return True


def cancel_scheduled(eng: EngineParts, ex: Any, by: str | None, reason: str | None, from_parent: bool = False) -> bool:
    """Cancel a ``scheduled`` or ``queued`` execution: it ends ``cancelled`` at once (none of its
    code ran: nothing to compensate); ``from_parent``: its parent's cancel, marked on it (so
    resuming the parent resumes it). False when the exec changed meanwhile."""
    marked = {CANCELLED_BY_PARENT: True} if from_parent else None
    message = "cancelled before it started"
    return end_unstarted(eng, ex, Status.CANCELLED, "WorkflowCancelledError", message, by, reason, marked)


def unmarked_op(op: Op, unmarked: Any) -> Op:
    """``op``, writing the exec without the deadline's mark where ``unmarked`` (the exec as read)
    had none: a drive whose replay could not deliver the timeout (its workflow is not registered
    here) must not mark it, or a signal accepted before a later drive would run it past its
    deadline."""
    if op.doc is None or op.doc.get("id") != EXEC_ID:
        return op
    doc = {k: v for k, v in op.doc.items() if k not in ("cancel_requested", "timed_out")}
    doc.update({k: unmarked[k] for k in ("cancel_requested", "timed_out") if k in unmarked})
    return Op(op.kind, doc=doc, id=op.id, if_match=op.if_match)
