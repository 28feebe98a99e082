"""The activity side of the protocol: begin an attempt, then record its outcome.

``begin`` reads the partition (one query), skips duplicates (a result is recorded, or another
live attempt holds the step's lease) and takes the step's lease (one etag replace). The outcome
is then committed together with the next drive (one batch): that is the inline continuation —
the worker that finishes an activity drives the workflow itself, no extra broker hop, on the
partition it read in ``begin`` (the commit is conditional on the exec etag). Three store round
trips per delivered activity: query, lease, commit.

An activity the dispatcher keeps to run next in the committing process (eager activities,
``Dispatcher.keeps``) has its first attempt's lease taken by the commit that schedules it
(:func:`claim_kept`): its ``begin`` finds the lease its own, in the copy of the partition that
commit left in the cache, and reads and writes nothing. One round trip per such activity (the
commit), and a process killed between that commit and the attempt
leaves a lease that lapses (recovery re-sends the step after the lease TTL), as a process
killed in the attempt does.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import replace as dc_replace
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.context import (
    _NOTHING,
    ON_HEARTBEAT,
    ActivityCancelled,
    ActivityContext,
    ActivityInfo,
    ActivityInterrupt,
    heartbeat_record,
)
from celery_durable.engine.activities.context import current as current_activity
from celery_durable.engine.activities.delivery import STALE_EVENT, Delivery, marker_token, not_runnable, refusal
from celery_durable.engine.activities.holds import hold_failure
from celery_durable.engine.dispatcher import ActivityRequest, Send
from celery_durable.engine.documents.model import (
    DUE_ACTIVITY,
    Attempt,
    error_info,
    lease_live,
    marker_id,
    result_id,
)
from celery_durable.engine.documents.records import count_of, holder_of
from celery_durable.engine.limits.slots import NOT_QUEUED
from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    DocumentTooLarge,
    HeartbeatTimeoutError,
    StoreError,
)
from celery_durable.stores.base import Doc, Op, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = ["Attempt", "ActivityRunner", "claim_kept", "run_awaitable", "sync_callable", "may_be_stale"]

log = logging.getLogger("celery_durable.activity")


def run_awaitable(value: Any) -> Any:
    """``value`` itself, or, for an awaitable (an ``async def`` activity's call), its result.

    Run by ``asyncio.run`` in a fresh loop. When a loop already runs in this thread (an async
    test driving the environment, an async caller) it cannot be blocked on, so the coroutine
    gets its own loop on a helper thread (with this thread's context variables).
    """
    if not inspect.isawaitable(value):
        return value
    attempt = current_activity()

    async def main() -> Any:
        if attempt is not None:  # a cancel or a stall cancels this task (at its next await)
            attempt.bind_task(asyncio.current_task(), asyncio.get_running_loop())
        try:
            return await value
        except asyncio.CancelledError:
            raised = None if attempt is None else attempt.interruption()
            if raised is not None:
                raise raised from None
            raise

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(main())
    box: dict[str, Any] = {}
    ctx = contextvars.copy_context()

    def target() -> None:
        try:
            box["value"] = ctx.run(asyncio.run, main())
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    helper = threading.Thread(target=target, name="celery-durable-async-activity")
    helper.start()
    helper.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def sync_callable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, or for an ``async def`` function a synchronous wrapper running it to completion.

    The wrapper keeps ``fn``'s name, signature and hints (``__wrapped__``), so codecs and
    Celery's argument checks see the original function.
    """
    if not inspect.iscoroutinefunction(fn):
        return fn

    @functools.wraps(fn)
    def run_sync(*args: Any, **kwargs: Any) -> Any:
        return run_awaitable(fn(*args, **kwargs))

    return run_sync


#: reasons of :meth:`ActivityRunner.begin` a read of a replica behind the sender could explain
#: (the glue retries those deliveries shortly instead of dropping them)
STALE_REASONS = ("no such execution", "no such activity step", "another attempt is running", "the run is not yet")


def may_be_stale(why: str) -> bool:
    """Whether a delivery refused for ``why`` might run if the store were read again."""
    return why.startswith(STALE_REASONS)


def _details(marker: Doc) -> Any:
    """The heartbeat details an earlier attempt left on the step's marker (None: none)."""
    beat = marker.get("heartbeat")
    return beat.get("details") if isinstance(beat, dict) else None


def _lease_back(marker: Doc, due_at: float) -> Doc:
    """``marker`` (to write back) with its lease given back, due again at ``due_at``."""
    return strip_reserved(marker) | {"lease": None, "due_kind": DUE_ACTIVITY, "due_at": due_at}


def claim_kept(eng: EngineParts, sends: list[Send], ops: list[Op], now: float) -> None:
    """Before a drive commits ``ops``: the first activity its ``sends`` schedule that the
    dispatcher keeps (``Dispatcher.keeps``) gets its first attempt's lease in its marker (the
    create in ``ops``) and the holder in its request (``ActivityRequest.holder``)."""
    keeps = getattr(eng.dispatcher, "keeps", None)
    if keeps is None:
        return
    for i, req in enumerate(sends):
        # a limited activity takes its slot as it begins (another partition): it is always sent
        if not isinstance(req, ActivityRequest) or (req.options or {}).get("limit") is not None or not keeps(req):
            continue
        mid = marker_id(req.seq, req.run)
        for j, op in enumerate(ops):
            if op.kind == "create" and op.doc is not None and op.doc.get("id") == mid and op.doc.get("type") == "step":
                holder = f"{eng.identity()}:{uuid.uuid4().hex[:12]}"
                expires = now + eng.settings.lease_ttl
                ops[j] = Op.create(
                    op.doc
                    | {
                        "attempts": 1,
                        "lease": {"holder": holder, "expires": expires},
                        "due_kind": DUE_ACTIVITY,
                        "due_at": expires,
                        "started_at": now,
                    }
                )
                sends[i] = dc_replace(req, holder=holder)
                break
        return  # one per commit: the dispatcher keeps only the first it is offered


class ActivityRunner:
    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine

    def begin(
        self,
        execution_id: str,
        seq: int,
        run: int = 0,
        supersedes: str | None = None,
        delivery: Delivery | None = None,
        claimed: str | None = None,
        handoff: tuple[str, int, str | None] | None = None,
    ) -> tuple[Attempt | None, str]:
        """Take the step's lease; ``(None, reason)`` when this delivery must not run.

        The lease names this *attempt*, not the process: a duplicate delivery to another thread
        (or greenlet) of the same process must be refused too. ``supersedes`` is the holder of
        the attempt whose retry this delivery is (it ended, maybe unable to give its lease back).
        ``delivery`` must belong to the marker (engine/activities/delivery.py): a stale one is dropped. None
        only for callers that hold no message (in-process runs of the marker's own request).
        ``claimed``: the holder the scheduling commit took the lease for (:func:`claim_kept`), known
        only in the process that committed it (never from a message); the attempt is that one,
        without a write, if the lease is still that holder's. ``handoff``: this process runs it
        because a slot of its limit freed here was granted to it (limit partition, attempt number,
        token: ``ActivityRequest.grant``), with no read to check it may still run: refused, it
        gives that slot back (a hand-off has no message to try again).
        """
        eng = self.engine
        if claimed is not None and (found := self._claimed(execution_id, seq, run, claimed)) is not None:
            return found
        me = f"{eng.identity()}:{uuid.uuid4().hex[:12]}"
        slot: dict[str, Any] | None = None  # the limit whose slot this delivery took (engine/limits/)
        slot_number, slot_token = 0, None  # for the attempt numbered this, of the marker with this token
        for _ in range(5):
            docs = eng.cache.load(execution_id)
            refused = not_runnable(docs, seq, run)
            if refused is not None:
                self._give_back(execution_id, seq, run, slot, slot_number, slot_token, docs, handoff)
                return None, refused
            marker = docs[marker_id(seq, run)]
            if delivery is not None and (stale := refusal(marker, delivery)) is not None:
                log.warning("activity %s (%s step %d) dropped: %s", delivery.name, execution_id, seq, stale)
                eng.emit(STALE_EVENT, execution_id=execution_id, seq=seq, activity=delivery.name)
                self._give_back(execution_id, seq, run, slot, slot_number, slot_token, docs, handoff)
                return None, stale
            now = eng.clock.now()
            lease: dict[str, Any] = marker.get("lease") or {}
            if lease_live(marker, now) and (supersedes is None or lease.get("holder") != supersedes):
                return None, f"another attempt is running ({lease.get('holder')})"
            number = count_of(marker, "attempts") + 1
            record = marker.get("limit")
            if slot is not None and (slot_number, slot_token) != (number, marker_token(marker)):
                # the slot taken on an earlier pass was for another attempt: a duplicate delivery
                # began that one meanwhile (its own end frees it, maybe already has: sim seed 523)
                # or a reset replaced the marker; this attempt takes a slot of its own
                self._give_back(execution_id, seq, run, slot, slot_number, slot_token, docs)
                slot, slot_number, slot_token = None, 0, None
            if isinstance(record, dict) and slot is None:
                # a slot before the lease: a step that waits is queued on the limit and this
                # delivery dropped; it is sent again when a slot is granted to it
                waiting = eng.limits.enter(execution_id, run, seq, number, record, marker_token(marker))
                if waiting is not None:
                    if NOT_QUEUED in waiting:  # recorded nowhere: due again within a scan interval
                        self._due_soon(marker)
                    return None, waiting
                slot, slot_number, slot_token = record, number, marker_token(marker)
            leased = strip_reserved(marker)
            leased.update(
                attempts=number,
                lease={"holder": me, "expires": now + eng.settings.lease_ttl},
                due_kind=DUE_ACTIVITY,
                due_at=now + eng.settings.lease_ttl,
                started_at=now,
            )
            try:
                etag = eng.store.replace(leased, if_match=marker["_etag"])
            except ConflictError:
                eng.cache.suspect(execution_id)  # changed, or deleted (purged)
                continue
            eng.cache.put(execution_id, leased | {"_etag": etag})
            attempt = Attempt(
                execution_id,
                seq,
                str(marker["name"]),
                etag,
                me,
                number,
                run,
                token=marker_token(marker),
                heartbeat_details=_details(marker),
                limit=slot,
            )
            eng.leases.track(attempt)
            return attempt, "started"
        self._give_back(execution_id, seq, run, slot, slot_number, slot_token, eng.cache.load(execution_id), handoff)
        return None, "the step kept changing under us"

    def _due_soon(self, marker: Doc) -> None:
        eng = self.engine
        try:
            eng.store.replace(
                strip_reserved(marker) | {"due_at": eng.clock.now() + eng.settings.recovery_interval}, marker["_etag"]
            )
        except StoreError:
            pass  # it stays due as it was (its queue timeout)

    def _give_back(
        self,
        execution_id: str,
        seq: int,
        run: int,
        slot: dict[str, Any] | None,
        number: int,
        token: str | None,
        docs: Mapping[str, Doc],
        handoff: tuple[str, int, str | None] | None = None,
    ) -> None:
        """A delivery that took a slot but will not run: the slot goes to the next waiter — unless
        attempt ``number`` began in another delivery of the step (a duplicate message that won the
        lease): the slot is that attempt's too, and its own end frees it (sim seed 907). A refused
        hand-off that took none gives back the slot granted to it, as the limit document names
        it (``handoff``: partition, attempt number, token), whatever the partition shows now."""
        if slot is None:
            if handoff is not None:
                self.engine.limits.release_grant(handoff[0], execution_id, run, seq, (handoff[1], handoff[2]))
            return
        marker = docs.get(marker_id(seq, run))
        if marker is not None and count_of(marker, "attempts") >= number:
            return
        self.engine.limits.release(execution_id, run, seq, (number, token), slot)

    def _claimed(self, execution_id: str, seq: int, run: int, holder: str) -> tuple[Attempt | None, str] | None:
        """The attempt whose lease the scheduling commit took (``holder``), or None: not (or no
        longer) that holder's lease, begin as any delivery."""
        eng = self.engine
        # the copy its own commit left in the cache, if young: that commit wrote the lease, and
        # whatever changed since (a cancel, a reset) is found by the outcome's commit, which is
        # conditional on the exec as an attempt begun a moment earlier would be
        docs = eng.cache.peek(execution_id, eng.settings.trust_cache_for) or eng.cache.load(execution_id)
        marker = docs.get(marker_id(seq, run))
        if marker is None or holder_of(marker) != holder:
            return None
        refused = not_runnable(docs, seq, run)
        if refused is not None:
            return None, refused
        if not lease_live(marker, eng.clock.now()):
            return None  # lapsed: recovery may have re-sent it; take it as a delivery would
        number = count_of(marker, "attempts")
        attempt = Attempt(
            execution_id,
            seq,
            str(marker["name"]),
            marker["_etag"],
            holder,
            number,
            run,
            token=marker_token(marker),
            heartbeat_details=_details(marker),
        )
        eng.leases.track(attempt)
        return attempt, "started"

    def unclaim(self, request: ActivityRequest) -> None:
        """A kept activity that will not run here after all (the delivery failed, the worker
        stops): give its claimed lease back, so the message sent instead is not refused until
        the lease lapses. Raises :class:`StoreError` (the caller sends it all the same)."""
        eng = self.engine
        if request.holder is None:
            return
        docs = eng.cache.load(request.execution_id)
        marker = docs.get(marker_id(request.seq, request.run))
        if marker is None or holder_of(marker) != request.holder:
            return
        released = _lease_back(marker, eng.clock.now() + eng.settings.activity_queue_timeout)
        released.pop("started_at", None)
        released["attempts"] = max(0, count_of(marker, "attempts") - 1)  # the claimed attempt never began
        etag = eng.store.replace(released, if_match=marker["_etag"])
        eng.cache.put(request.execution_id, released | {"_etag": etag})

    def context(self, attempt: Attempt, options: Mapping[str, Any] | None = None) -> ActivityContext:
        """The heartbeat context ``attempt`` runs in (``with``), served by the lease renewals.
        ``options``: the activity's (``heartbeat_timeout``, ``cancellation``)."""
        opts = options or {}
        info = ActivityInfo(
            execution_id=attempt.execution_id,
            step=attempt.seq,
            run=attempt.run,
            name=attempt.name,
            attempt=attempt.number,
            heartbeat_timeout=opts.get("heartbeat_timeout"),
            cancellation=str(opts.get("cancellation") or ON_HEARTBEAT),
            heartbeat_details=attempt.heartbeat_details,
        )
        ctx = ActivityContext(attempt, info, stalls=self.engine.leases.stalls)
        ctx.engine = self.engine
        self.engine.leases.watch(ctx)
        return ctx

    def interrupted(
        self, attempt: Attempt, ctx: ActivityContext, exc: ActivityInterrupt
    ) -> HeartbeatTimeoutError | None:
        """What an attempt stopped by ``exc`` failed with: for a stall the
        :class:`HeartbeatTimeoutError` (the caller retries it or records it); for a cancel None,
        nothing to record (the cancel recorded the step's outcome, or the workflow ended, or the
        step is another attempt's now)."""
        if ctx.stalled and not isinstance(exc, ActivityCancelled):
            return HeartbeatTimeoutError(
                f"activity {attempt.name!r} (attempt {attempt.number}) sent no heartbeat for "
                f"{ctx.info.heartbeat_timeout:g} s (its heartbeat_timeout)"
            )
        self.engine.leases.untrack(attempt)
        # A cancel not yet delivered stopped it: the drive that delivers it may be a lost message,
        # and this step (its lease lapsing, re-sent, stopped again) would be all that is due.
        self.engine.dispatcher.send_drive(attempt.execution_id)
        reason = ctx.cancel_reason or getattr(exc, "reason", "cancelled")
        log.info("activity %s (%s step %d) cancelled: %s", attempt.name, attempt.execution_id, attempt.seq, reason)
        self.engine.emit(
            "activity_cancelled",
            execution_id=attempt.execution_id,
            seq=attempt.seq,
            activity=attempt.name,
            reason=reason,
        )
        return None

    def hold(self, attempt: Attempt, exc: BaseException) -> bool:
        """``attempt`` failed for good and its activity pauses on failure: its execution paused,
        its step held for the unpause (engine/activities/holds.py); False: record the failure."""
        return hold_failure(self.engine, attempt, exc)  # type: ignore[arg-type]

    def result_doc(self, attempt: Attempt, value: Any = None, error: BaseException | None = None) -> Doc:
        doc: Doc = {
            "pk": attempt.execution_id,
            "id": result_id(attempt.seq, attempt.run),
            "type": "result",
            "run": attempt.run,
            "seq": attempt.seq,
            "name": attempt.name,
            "attempts": attempt.number,
            "completed_at": self.engine.clock.now(),
        }
        if error is None:
            doc.update(ok=True, value=value)
        else:
            doc.update(ok=False, error=error_info(error, attempts=attempt.number))
        return doc

    def complete(self, attempt: Attempt, result: Doc, defer: bool = False) -> str:
        """Record the outcome (first writer wins) and drive the workflow inline; ``defer``:
        record it only, the caller drives next (``Driver.drive``)."""
        eng = self.engine
        # its slot goes back in the commit recording its outcome, where the store can (SQLite,
        # PostgreSQL: engine/limits/leaving.py); else as it stops being tracked, before that commit
        leaving = eng.limits.leaving(attempt)
        eng.leases.untrack(attempt)
        ok = result.get("ok")
        eng.emit(
            "activity_completed" if ok else "activity_failed",
            execution_id=attempt.execution_id,
            seq=attempt.seq,
            activity=attempt.name,
            attempts=attempt.number,
        )
        # Inline continuation on the partition read by ``begin`` (if recent): no second read.
        # ``tokens``: recorded only on the marker it began on (a reset or retry may have
        # forgotten that one and the re-run taken the step number anew: engine/activities/delivery.py).
        try:
            return eng.driver.drive(
                attempt.execution_id,
                carry=[result],
                release=[attempt.seq],
                trust_cache=eng.settings.trust_cache_for,
                tokens={attempt.seq: attempt.token},
                defer=defer,
                also=() if leaving is None else (leaving.rewrite,),
            )
        finally:
            if leaving is not None:
                eng.limits.left(leaving)  # whom it granted sent; not committed: given back apart

    def retrying(self, attempt: Attempt, countdown: float, exc: BaseException | None) -> None:
        """The attempt failed and Celery will retry in ``countdown`` s: give the lease back.

        The step stays due a little after the retry is expected, so a lost retry message is
        re-sent by the recovery scan rather than waiting forever. Never raises for the store:
        the retry must be sent whatever happens here (a lease not given back lapses, and the
        retry may take over the lease of the attempt it ``supersedes``).
        """
        eng = self.engine
        details = eng.leases.latest_details(attempt)
        eng.leases.untrack(attempt)
        now = eng.clock.now()
        try:
            for _ in range(3):
                marker = eng.store.read(attempt.execution_id, marker_id(attempt.seq, attempt.run))
                if marker is None or holder_of(marker) != attempt.holder:
                    return
                updated = _lease_back(marker, now + countdown + eng.settings.activity_queue_timeout)
                updated["last_error"] = error_info(exc, attempts=attempt.number) if exc is not None else None
                # the backoff, for the timeline (a retry's wait is not the activity running)
                updated.update(failed_at=now, retry_at=now + countdown)
                if details is not _NOTHING:  # kept for the next attempt (activity.last_heartbeat_details)
                    updated["heartbeat"] = heartbeat_record(details, now, attempt.number)
                try:
                    eng.store.replace(updated, if_match=marker["_etag"])
                    return
                except ConflictError:
                    continue
                except (DocumentTooLarge, ConfigurationError) as refused:
                    if details is _NOTHING:
                        raise
                    log.warning(
                        "heartbeat details of %s step %d dropped: %s", attempt.execution_id, attempt.seq, refused
                    )
                    details = _NOTHING  # refused by this store: the release goes through without them
        except (StoreError, ConfigurationError) as err:
            log.warning(
                "could not give back the lease of %s step %d before its retry: %s",
                attempt.execution_id,
                attempt.seq,
                err,
            )
