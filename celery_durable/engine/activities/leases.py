"""Activity leases: the attempts this process runs, renewed by the process's one heartbeat.

A lease that is not renewed lapses after ``lease_ttl``; the recovery scan then re-sends the
step. A renewal that finds another holder marks the attempt ``lost``: its result may still be
offered, but the first writer wins, so it can never overwrite anything.

A renewal also serves the attempt's :class:`~.context.ActivityContext` (``activity.heartbeat``):
it writes the latest details with the lease, and it reads the step's outcome and the exec with
the marker (one ``read_many``, as the marker alone cost before) to tell the attempt to stop when
its workflow was cancelled or ended, or the step was reset. A context's heartbeat deadline
(``heartbeat_timeout``) is watched by a thread that does no I/O (engine/activities/stalls.py); a
stalled attempt is interrupted and no longer renewed.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.context import _NOTHING, ActivityContext, heartbeat_record
from celery_durable.engine.activities.stalls import Stalls
from celery_durable.engine.documents.model import EXEC_ID, marker_id, result_id
from celery_durable.engine.documents.records import holder_of, is_terminal, run_of
from celery_durable.engine.replay.cancels import TIMED_OUT_ERROR
from celery_durable.errors import ConfigurationError, ConflictError, CorruptDocument, DocumentTooLarge, StoreError
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.activities.lease_heartbeat import Heartbeat
    from celery_durable.engine.documents.model import Attempt
    from celery_durable.engine.ports import EngineParts

__all__ = ["LeaseKeeper"]

log = logging.getLogger("celery_durable.leases")


def _key(attempt: Attempt) -> tuple[str, int, int, str]:
    return attempt.execution_id, attempt.run, attempt.seq, attempt.holder


class LeaseKeeper:
    """A beater of the engine's :class:`~.heartbeat.Heartbeat`: renews every tracked attempt's
    lease each ``heartbeat_interval``."""

    def __init__(self, engine: EngineParts, heartbeat: Heartbeat) -> None:
        self.engine = engine
        self._lock = threading.Lock()
        # keyed by attempt: a continued execution's run 1 step 3 is not run 0 step 3, and two
        # attempts of one step may overlap here (the old one lost its lease and is finishing)
        self._attempts: dict[tuple[str, int, int, str], Attempt] = {}
        #: the running attempts' heartbeat contexts (``activity.heartbeat``), by attempt
        self._contexts: dict[tuple[str, int, int, str], ActivityContext] = {}
        self._last_beat = 0.0
        self._heartbeat = heartbeat
        heartbeat.add(self)
        #: the stall deadlines of contexts with a ``heartbeat_timeout`` (a thread that does no I/O)
        self.stalls = Stalls(self._stalled)

    def track(self, attempt: Attempt) -> None:
        with self._lock:
            if not self._attempts:  # the first renewal is one interval after the first track
                self._last_beat = time.monotonic()
            self._attempts[_key(attempt)] = attempt
            first_beat = self._last_beat + self.engine.settings.heartbeat_interval
        self._heartbeat.wake(first_beat)

    def untrack(self, attempt: Attempt) -> ActivityContext | None:
        """Stop renewing ``attempt`` (it ended), give back its limit slot if it holds one; its
        heartbeat context, if it had one (now forgotten)."""
        with self._lock:
            self._attempts.pop(_key(attempt), None)
            ctx = self._contexts.pop(_key(attempt), None)
        if attempt.limit is not None:
            self.engine.limits.leave(attempt)  # never raises: a slot not given back lapses
        return ctx

    def watch(self, ctx: ActivityContext) -> None:
        """Serve ``ctx`` with ``ctx.attempt``'s renewals (details, cancellation, stall deadline)."""
        with self._lock:
            if _key(ctx.attempt) in self._attempts:
                self._contexts[_key(ctx.attempt)] = ctx

    def latest_details(self, attempt: Attempt) -> Any:
        """The latest details ``attempt`` sent (``_NOTHING``: none), for its retry's release."""
        with self._lock:
            ctx = self._contexts.get(_key(attempt))
        return _NOTHING if ctx is None else ctx.latest_details()

    def running(self) -> list[Attempt]:
        with self._lock:
            return list(self._attempts.values())

    def stop(self, release: bool = True) -> None:
        """Stop renewing (the heartbeat thread too); with ``release`` give back every held lease."""
        self._heartbeat.stop()
        if release:
            for attempt in self.running():
                self.release(attempt)

    # --- Beater ------------------------------------------------------------------------------

    def next_beat(self, now: float) -> float | None:
        with self._lock:
            if not self._attempts:
                return None
        return self._last_beat + self.engine.settings.heartbeat_interval

    def beat(self) -> None:
        self._last_beat = time.monotonic()
        self.renew_all()

    def _stalled(self, ctx: ActivityContext) -> None:
        """``ctx``'s attempt was stopped for want of heartbeats (engine/activities/stalls.py): no
        longer renewed. If its interrupt cannot land (a blocking C call), the lease lapses and the
        recovery scan sends the step again; the context stays, for the retry's release."""
        with self._lock:
            self._attempts.pop(_key(ctx.attempt), None)
        self.engine.emit("activity_stalled", execution_id=ctx.attempt.execution_id, seq=ctx.attempt.seq)

    def renew_all(self) -> None:
        for attempt in self.running():
            try:
                self.renew(attempt)
            except StoreError as exc:  # keep beating; the lease may still be ours next time
                log.warning("heartbeat for %s step %d failed: %s", attempt.execution_id, attempt.seq, exc)

    def renew(self, attempt: Attempt) -> bool:
        eng = self.engine
        with self._lock:
            ctx = self._contexts.get(_key(attempt))
        with attempt.lock:
            marker, outcome, ex = self._read(attempt)
            lease = (marker or {}).get("lease") or {}
            # an attempt holding a limit slot whose lease lapsed may have lost the slot to the next
            # waiter (engine/limits/slots.py frees a lapsed holder's): reviving it would run one
            # over max_running, so it stops as if another attempt held the step
            lapsed = attempt.limit is not None and float(lease.get("expires") or 0.0) <= eng.clock.now()
            if marker is None or lease.get("holder") != attempt.holder or lapsed:
                attempt.lost = True
                self.untrack(attempt)
                eng.emit("lease_lost", execution_id=attempt.execution_id, seq=attempt.seq)
                if ctx is not None:
                    ctx.cancel(
                        "the step was reset or purged"
                        if marker is None or not lease
                        else "another attempt holds the step"
                        if lease.get("holder") != attempt.holder
                        else "its lease lapsed: its limit slot may be another step's"
                    )
                return False
            if ctx is not None and (why := _why_stop(attempt, outcome, ex)) is not None:
                ctx.cancel(why)  # still renewed: the attempt may clean up, and nothing needs the step
            now = eng.clock.now()
            expires = now + eng.settings.lease_ttl
            updated = strip_reserved(marker)
            updated.update(lease={"holder": attempt.holder, "expires": expires}, due_at=expires)
            details = _NOTHING if ctx is None else ctx.take_details()
            if details is not _NOTHING:
                updated["heartbeat"] = heartbeat_record(details, now, attempt.number)
            try:
                attempt.etag = eng.store.replace(updated, if_match=marker["_etag"])
            except (DocumentTooLarge, ConfigurationError) as exc:
                if details is _NOTHING:
                    raise
                # details this store refuses (checked in the caller, but a backend may still say
                # no): dropped, so the lease renewal they rode on goes through
                log.warning("heartbeat details of %s step %d dropped: %s", attempt.execution_id, attempt.seq, exc)
                updated.pop("heartbeat", None)
                attempt.etag = eng.store.replace(updated, if_match=marker["_etag"])
            except StoreError as exc:  # a conflict (changed meanwhile) or an outage: the next renewal writes them
                if ctx is not None and details is not _NOTHING:
                    ctx.give_back(details)
                if isinstance(exc, ConflictError):
                    return False
                raise
            return True

    def _read(self, attempt: Attempt) -> tuple[Doc | None, Doc | None, Doc | None]:
        """The step's marker, its outcome and the exec (one round trip)."""
        store, pk = self.engine.store, attempt.execution_id
        mid = marker_id(attempt.seq, attempt.run)
        try:
            marker, outcome, ex = store.read_many(pk, [mid, result_id(attempt.seq, attempt.run), EXEC_ID])
        except CorruptDocument:  # an exec or outcome nobody can decode: renew on the marker alone
            return store.read(pk, mid), None, None
        return marker, outcome, ex

    def release(self, attempt: Attempt) -> None:
        """Give the lease back so recovery re-sends the step at once instead of after the TTL."""
        eng = self.engine
        self.untrack(attempt)
        try:
            marker = eng.store.read(attempt.execution_id, marker_id(attempt.seq, attempt.run))
            if marker is None or holder_of(marker) != attempt.holder:
                return
            updated = strip_reserved(marker)
            updated.update(lease=None, due_at=eng.clock.now())
            eng.store.replace(updated, if_match=marker["_etag"])
        except (ConflictError, StoreError):
            pass


def _why_stop(attempt: Attempt, outcome: Doc | None, ex: Doc | None) -> str | None:
    """Why the running ``attempt`` should stop (None: it should not), from what a renewal read."""
    if outcome is not None:
        if not outcome.get("cancelled"):
            return "the step's outcome is already recorded"
        timed_out = (outcome.get("error") or {}).get("type") == TIMED_OUT_ERROR
        return "the workflow timed out" if timed_out else "the workflow was cancelled"
    if ex is None:
        return None  # read apart (an undecodable exec): the marker is still this attempt's
    if is_terminal(ex):
        return f"the workflow is {ex.get('status')}"
    if run_of(ex) > attempt.run:
        return "the workflow continued as new"
    before = ex.get("cancel_before")
    if ex.get("cancel_requested") and isinstance(before, int) and attempt.seq <= before and _awaited(ex, attempt.seq):
        # Requested, not yet delivered by a drive (which may wait for this very worker). A step
        # taken after the request is a compensation, and runs on. Only a step the workflow
        # waits on: the cancel is delivered where it waits (its outcome recorded cancelled),
        # while a step started and not awaited may still be awaited by the compensations.
        return "the workflow was cancelled"
    return None


def _awaited(ex: Doc, seq: int) -> bool:
    """Whether the suspended exec waits on step ``seq`` (its ``waiting``, as listings show it)."""
    waiting = ex.get("waiting")
    return isinstance(waiting, list) and any(isinstance(w, dict) and w.get("seq") == seq for w in waiting)
