"""Driving an execution: replay, then commit what replay decided (docs/architecture.md §6).

The common path is optimistic and costs one partition read and one all-or-nothing batch:
read the partition, replay the function, then commit ``[create new steps…, replace exec
if-match]``. Messages are sent only *after* the commit, so a concurrent drive that loses the
race never schedules anything.

Under contention the drive takes the exec lease instead (an etag replace): others then only
record their documents and bump the wake-up counter, which changes the exec etag, so the
lease holder's releasing commit fails, it re-reads and drives again. That is the "no lost
wake-ups" rule: a completion is either seen by a drive that commits after it, or it bumps
the exec so the next commit must re-read.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.attempts import claim_kept
from celery_durable.engine.activities.delivery import STALE_EVENT, stale_outcomes
from celery_durable.engine.activities.local_activities import LocalRun, LocalRunner
from celery_durable.engine.admin.pending_ops import settle
from celery_durable.engine.admin.reruns import reborn
from celery_durable.engine.children.holders import cancelled_child_steps, stale_child_outcomes, withdrawn_cancels
from celery_durable.engine.dispatcher import CancelRequest, Send
from celery_durable.engine.documents.checks import check_partition
from celery_durable.engine.documents.model import (
    DUE_EXEC,
    EXEC_ID,
    RUNNING,
    error_info,
    lease_live,
    run_of,
    split_payload,
)
from celery_durable.engine.documents.records import ExecDoc, as_exec, count_of, holder_of, is_terminal
from celery_durable.engine.documents.schema import NOT_STARTED, Status
from celery_durable.engine.documents.search import apply_updates as apply_search_updates
from celery_durable.engine.drive.alongside import Alongside
from celery_durable.engine.drive.carried import as_of, carry_json, eager_commit, oversized, release_ops, waiting_of
from celery_durable.engine.drive.corrupt import fail_corrupt
from celery_durable.engine.drive.partition_cache import Partition
from celery_durable.engine.drive.upkeep import prune_run
from celery_durable.engine.outcomes import DriveOutcome, ReplayKind
from celery_durable.engine.replay.history import Replay, replay
from celery_durable.engine.replay.sticky import StickyCache
from celery_durable.engine.starts.deadlines import unmarked_op
from celery_durable.errors import ConflictError, CorruptDocument, DocumentTooLarge
from celery_durable.observability import span
from celery_durable.stores.base import Doc, Op, Rewrite, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = ["Driver", "Replay"]

log = logging.getLogger("celery_durable.drive")

MAX_ROUNDS = 500
#: the replay kinds that end an execution, each committed as the status of the same name
ENDS = frozenset({ReplayKind.COMPLETED, ReplayKind.FAILED, ReplayKind.CANCELLED, ReplayKind.TIMED_OUT})


class _Again(Enum):
    """A round's answer when the drive must read again and start a new round."""

    AGAIN = "again"


AGAIN = _Again.AGAIN


@dataclass
class _Drive:
    """One drive's state across its rounds."""

    execution_id: str
    carry: list[Doc]
    release: list[int]
    trust_cache: float
    eager: bool
    known: Mapping[str, Doc] | None
    tokens: Mapping[int, str | None] | None
    me: str
    #: record what is carried with an exec bump, no replay (``Driver.drive``'s ``defer``)
    defer: bool = False
    #: its deadline passed: this drive's commit records it (engine/starts/deadlines.py)
    timing_out: bool = False
    holding: bool = False
    conflicts: int = 0
    orphan_sends: dict[str, Send] = field(default_factory=dict)
    #: children ended by a cancel of ours that an operator withdrew since
    reopen: set[str] = field(default_factory=set)
    #: local activity steps run by this drive (kept across its rounds)
    local: LocalRun = field(default_factory=LocalRun)
    committed: tuple[ExecDoc, Replay] | None = None
    #: why this drive fails the execution: a document it must write is too large to store
    oversize: dict[str, Any] | None = None
    along: Alongside = field(default_factory=lambda: Alongside((), ()))


class Driver:
    def __init__(self, engine: EngineParts) -> None:
        self.engine = engine
        self.locals = LocalRunner(engine)
        #: live suspended instances of the executions this driver drove (engine/replay/sticky.py)
        self.sticky = StickyCache(engine.settings.sticky_cache_size)

    # --- replay -------------------------------------------------------------------------

    def replay(self, ex: ExecDoc, history: dict[str, Doc], now: float) -> Replay:
        """Replay the execution over ``history`` (pure: see :func:`.replay.replay`)."""
        eng = self.engine
        workflow = eng.registry.workflow(str(ex.get("workflow")))
        return replay(ex, history, workflow, eng.registry, now, eng.settings, sticky=self.sticky)

    # --- drive --------------------------------------------------------------------------

    def drive(
        self,
        execution_id: str,
        carry: Sequence[Doc] = (),
        release: Sequence[int] = (),
        trust_cache: float = 0.0,
        eager: bool = False,
        known: Mapping[str, Doc] | None = None,
        tokens: Mapping[int, str | None] | None = None,
        defer: bool = False,
        timing_out: bool = False,
        also: Sequence[Rewrite] = (),
    ) -> DriveOutcome:
        """Drive once to a suspension or an end; ``carry`` are documents to record with it, and
        ``release`` the steps whose markers they settle (both of the run the documents name: a
        run that has continued as new drops them).

        Returns what happened: completed, failed, cancelled, suspended, deferred (another
        worker holds the lease and will see our documents), noop, terminal, missing,
        unknown (workflow not registered here), lease-lost.

        ``eager``: the first drive, in the caller of ``start()`` (``durable_eager_start``). It
        commits only a suspension that schedules activities or timers; anything else (a local
        activity to run, a child, an effect, an end; contention: another's exec lease, more
        conflicts than ``optimistic_attempts``; a step too large to store or wider than one batch)
        is left to a worker: "declined", nothing written. Why so narrow: the caller may be a web
        process, and it may run other code than the workers (a deploy in progress); what it
        commits is what a worker would replay.
        The live instance is not kept: the next drive lands on a worker. ``known``: the
        documents ``start()`` just created (the exec and its input), the whole partition as far as it knows: the first
        round reads nothing (its commit is conditional on that exec's etag and creates the new
        steps' documents, so anything else there only costs a conflict and a second round).
        ``tokens``: step -> the token of the marker the carried outcome's attempt began on; an
        outcome whose step's marker is now another is dropped (:func:`.delivery.stale_outcomes`).
        ``defer``: record what is carried (screened as always) with an exec bump that leaves it
        due, and replay nothing: "deferred". The caller drives it next (an activity that failed
        for good: after Celery reported the failure, so no waiter sees the workflow end first);
        if it never does, the recovery scan drives it after ``drive_timeout``.
        ``timing_out``: its deadline's clock fired: the exec is marked ``timed_out`` with a cancel
        request in this drive's commit, with the timeout delivered at its suspension point, all or
        nothing (a result landing after that commit is late; engine/starts/deadlines.py).
        ``also``: rewrites of other partitions committed with the batch that records ``carry``
        (engine/drive/alongside.py); the caller checks their ``etag``.
        """
        me = self.engine.identity()
        d = _Drive(execution_id, list(carry), list(release), trust_cache, eager, known, tokens, me, defer, timing_out)
        d.along = Alongside(also, carry)
        try:
            for round_ in range(MAX_ROUNDS):
                outcome = self._round(d, round_)
                if outcome is not AGAIN:
                    return outcome
            log.error("drive %s: gave up after %d rounds of contention", execution_id, MAX_ROUNDS)
            return DriveOutcome.CONTENDED
        finally:
            self._finish(d)

    def _round(self, d: _Drive, round_: int) -> DriveOutcome | _Again:
        """One round: read the partition, screen what is carried, then record it on an ended
        execution, defer to a lease holder, or replay and commit."""
        eng = self.engine
        docs = self._read(d, round_)
        if isinstance(docs, DriveOutcome):
            return docs
        stored = docs.get(EXEC_ID)
        if stored is None:
            log.error("drive %s: no such execution", d.execution_id)
            return DriveOutcome.MISSING
        ex = reborn(stored, docs)  # a new life of a purged id takes no id an earlier one took
        carry_new = self._screen(d, ex, docs)
        if settle(eng, ex, dict(docs.items())):
            return AGAIN  # an operator's op was left half done: finish it before driving
        if is_terminal(ex):
            return self._record_late(d, ex, carry_new)
        if ex.get("status") in NOT_STARTED:  # started by its clock or its limit's grant
            if ex.get("status") == Status.QUEUED and not carry_new and not ex.get("paused"):
                eng.limits.take_turn(ex)  # engine/limits/workflows.py
            return self._record_bumped(d, ex, docs, carry_new, {}) if carry_new else DriveOutcome.NOOP
        if ex.get("paused"):  # an operator's pause (engine/admin/pause.py): recorded, not replayed, not due
            idle = {"due_kind": None, "due_at": None} if ex.get("due_kind") else {}
            return self._record_bumped(d, ex, docs, carry_new, idle) if carry_new or idle else DriveOutcome.NOOP
        at = ex.get("deadline_at")  # not lifted meanwhile (an operator's re-run): marked by this round's commit
        unmarked = ex
        # any drive of a top-level execution past its deadline delivers it (the clock's may be in a
        # process without the workflow); a child's waits for its clock (its parent's goes first)
        timing_out = d.timing_out or not ex.get("parent")
        if timing_out and not ex.get("timed_out") and isinstance(at, int | float) and at <= eng.clock.now():
            ex = as_exec(ex | {"cancel_requested": True, "timed_out": True})
        now = eng.clock.now()
        # the mark goes only with a replay that delivers it: written by a bump (another worker
        # drives) or a claim, a signal accepted before that replay ran the workflow past its deadline
        contended = self._contend(d, unmarked, docs, carry_new, now)
        if contended is not None:
            return contended
        if d.defer:
            return self._record_deferred(d, ex, docs, carry_new, now)
        decided = self._decide(d, ex, docs, carry_new, now)
        if isinstance(decided, DriveOutcome):
            return decided
        if ex is not unmarked and decided[0].kind == ReplayKind.UNKNOWN:  # nothing delivered it: unmarked
            decided = decided[0], [unmarked_op(op, unmarked) for op in decided[1]]
        return self._commit(d, ex, docs, *decided)

    def _read(self, d: _Drive, round_: int) -> dict[str, Doc] | DriveOutcome:
        """The partition to drive from: what ``start()`` knows, a young cached copy, or a read."""
        eng = self.engine
        try:
            if round_ == 0 and d.known is not None:
                cached: Partition | None = Partition(dict(d.known))
            else:
                cached = eng.cache.peek(d.execution_id, d.trust_cache) if round_ == 0 and d.trust_cache else None
            docs = cached if cached is not None else eng.cache.load(d.execution_id)
            check_partition(d.execution_id, docs)  # a malformed document fails only this execution
        except CorruptDocument as exc:
            self.fail_corrupt(d.execution_id, exc)
            return DriveOutcome.FAILED
        return docs

    def _screen(self, d: _Drive, ex: ExecDoc, docs: dict[str, Doc]) -> list[Doc]:
        """Drop carried outcomes nothing waits for any more; the rest not recorded yet, as of ``ex``."""
        run = run_of(ex)
        if any(run_of(x) != run for x in d.carry):
            # A late outcome of a run that has continued as new (an attempt whose lease
            # lapsed): nothing waits for it, its run's documents are pruned, and the seqs to
            # release number the *old* run's steps, not the current run's with the same
            # number (releasing those settled a live step: stranded).
            d.carry = [x for x in d.carry if run_of(x) == run]
            d.release = []
        if d.tokens and (stale := stale_outcomes(docs, run, d.carry, d.tokens)):
            d.carry, d.release = self._drop_stale(d.execution_id, d.carry, d.release, stale)
        if stale := stale_child_outcomes(docs, run, d.carry):
            d.carry, d.release = self._drop_stale(d.execution_id, d.carry, d.release, stale)
        if withdrawn := withdrawn_cancels(ex, docs, d.carry):
            d.carry = [x for x in d.carry if x.get("type") != "result" or x.get("seq") not in withdrawn]
            d.release = [s for s in d.release if s not in withdrawn]
            d.reopen.update(withdrawn.values())
        return [as_of(x, ex) for x in d.carry if x["id"] not in docs]

    def _record_late(self, d: _Drive, ex: ExecDoc, carry_new: list[Doc]) -> DriveOutcome | _Again:
        """An ended execution: record a late outcome (an attempt's, a child's) and drive nothing."""
        eng = self.engine
        if not carry_new:
            return DriveOutcome.TERMINAL
        # fenced by the exec etag an operation changes, or it could land on the execution that
        # operation reopened meanwhile
        try:
            d.along.batch(
                eng.store, d.execution_id, [*map(Op.create, carry_new), Op.replace(strip_reserved(ex), ex["_etag"])]
            )
        except ConflictError:
            eng.cache.suspect(d.execution_id)  # a retry or reset meanwhile: check again
            return AGAIN
        except DocumentTooLarge as exc:
            d.carry = oversized(exc, d.carry)
            return AGAIN
        eng.cache.suspect(d.execution_id)
        return DriveOutcome.TERMINAL

    def _record_deferred(
        self, d: _Drive, ex: ExecDoc, docs: dict[str, Doc], carry_new: list[Doc], now: float
    ) -> DriveOutcome | _Again:
        """``defer``: ours recorded with an exec bump, the exec due (if it was not) for a drive."""
        if not carry_new:
            return DriveOutcome.NOOP
        due = {} if ex.get("due_kind") else {"due_kind": DUE_EXEC, "due_at": now + self.engine.settings.drive_timeout}
        outcome = self._record_bumped(d, ex, docs, carry_new, due)
        if outcome is DriveOutcome.DEFERRED:
            self.engine.cache.suspect(d.execution_id)  # not fed by this batch: the next drive reads
        return outcome

    def _record_bumped(
        self, d: _Drive, ex: ExecDoc, docs: dict[str, Doc], carry_new: list[Doc], fields: dict[str, Any]
    ) -> DriveOutcome | _Again:
        """Ours recorded with an exec bump (and ``fields``), no replay: "deferred" (a lease holder's
        or a later drive replays it). A conflict (changed, or deleted: purged) reads again; a
        document too large fails its step instead."""
        eng = self.engine
        bumped = strip_reserved(ex) | {"wakeups": count_of(ex, "wakeups") + 1} | fields
        try:
            d.along.batch(eng.store, d.execution_id, self._record_ops(docs, carry_new, d.release, bumped, ex["_etag"]))
        except ConflictError:
            eng.cache.suspect(d.execution_id)
            return AGAIN
        except DocumentTooLarge as exc:
            d.carry = oversized(exc, d.carry)
            return AGAIN
        return DriveOutcome.DEFERRED

    def _contend(
        self, d: _Drive, ex: ExecDoc, docs: dict[str, Doc], carry_new: list[Doc], now: float
    ) -> DriveOutcome | _Again | None:
        """The exec lease: defer to a live holder (ours recorded with a bump), or take it after
        ``optimistic_attempts`` lost commits; ``None``: go on and replay."""
        eng = self.engine
        holder = holder_of(ex)
        mine = holder == d.me
        if d.holding and not mine:
            log.warning("drive %s: lease lost to %s", d.execution_id, holder)
            return DriveOutcome.LEASE_LOST
        # Below, our documents (and the markers they settle) are written in ONE batch with
        # the exec bump or claim: recorded apart, a failure in between left an outcome no
        # exec write announced (a drive holding an older copy then committed past it) and
        # its marker settled with nothing due: the step was stranded.
        if not mine and lease_live(ex, now):
            if d.eager:  # nothing of ours to record: the lease holder (and the drive message) drive it
                return DriveOutcome.DECLINED
            # someone else is driving: record ours with a bump, so their release re-reads
            return self._record_bumped(d, ex, docs, carry_new, {})
        if d.eager and d.conflicts >= eng.settings.optimistic_attempts:
            return DriveOutcome.DECLINED  # contention: a worker takes the lease (a caller's would only stall it)
        if not d.holding and d.conflicts >= eng.settings.optimistic_attempts:
            # contention: take the lease (with ours recorded) so others defer to us
            claimed = strip_reserved(ex) | {
                "lease": {"holder": d.me, "expires": now + eng.settings.lease_ttl},
                "due_kind": DUE_EXEC,
                "due_at": now + eng.settings.lease_ttl,
            }
            try:
                ops = self._record_ops(docs, carry_new, d.release, claimed, ex["_etag"])
                d.along.batch(eng.store, d.execution_id, ops)
                d.holding = True
                d.carry, d.release = [], []
            except ConflictError:
                eng.cache.suspect(d.execution_id)
            except DocumentTooLarge as exc:
                d.carry = oversized(exc, d.carry)
            return AGAIN
        return None

    def _decide(
        self, d: _Drive, ex: ExecDoc, docs: dict[str, Doc], carry_new: list[Doc], now: float
    ) -> tuple[Replay, list[Op]] | DriveOutcome:
        """Replay over the partition and what is carried (running local activities here), and
        the one batch that records what it decided."""
        history = dict(docs)
        for x in carry_new:
            history[x["id"]] = x
        history.update(d.local.history_for(docs))  # local steps an earlier round ran
        try:
            replay = self.replay(ex, history, now)
            if d.eager and not eager_commit(replay, carry_new):
                return DriveOutcome.DECLINED
            if replay.local and d.oversize is None:  # run them here, then replay again
                again = functools.partial(self.replay, ex, history, now)
                replay = self.locals.drive_locals(ex, docs, history, replay, d.local, again)
            if d.oversize is not None:  # what it decided does not fit the store: it fails
                replay = Replay(ReplayKind.FAILED, error=d.oversize, steps=replay.steps)
            ran = [x for x in d.local.created.values() if x["id"] not in docs]
            ops = self._commit_ops(ex, docs, carry_new + ran, d.release + d.local.release, replay, now)
            if ops is not None and d.local.replaced:
                ops[-1:-1] = [Op.replace(strip_reserved(x), x["_etag"]) for x in d.local.replaced.values()]
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            # user code's errors are caught inside replay: what escapes is a document
            # the engine cannot make sense of
            self.fail_corrupt(d.execution_id, CorruptDocument(f"malformed document in {d.execution_id!r}: {exc!r}"))
            return DriveOutcome.FAILED
        if ops is None and d.timing_out:  # nothing else new (a cancel delivered before): the mark alone
            ops = [Op.replace(strip_reserved(ex) | {"updated_at": now}, ex["_etag"])]
        if ops is None:
            return DriveOutcome.NOOP
        if d.eager and len(ops) > self.engine.store.max_batch_ops:  # not one batch: all or nothing is a worker's
            return DriveOutcome.DECLINED
        if not d.eager and len(ops) <= self.engine.store.max_batch_ops:
            claim_kept(self.engine, replay.sends, ops, now)  # an eager activity's lease, in this commit
        return replay, ops

    def _commit(
        self, d: _Drive, ex: ExecDoc, docs: dict[str, Doc], replay: Replay, ops: list[Op]
    ) -> DriveOutcome | _Again:
        """Commit the batch (conditional on the exec's etag); its sends go out after the drive."""
        eng = self.engine
        self._fence_cancelled_children(ex, docs, replay)
        try:
            with span("commit", execution_id=d.execution_id, ops=len(ops), outcome=replay.kind):
                self._apply(d, ops, replay)
            self.sticky.committed(d.execution_id, replay)
        except ConflictError:
            self.sticky.drop(d.execution_id)  # it assumed a commit that did not happen
            eng.cache.suspect(d.execution_id)
            d.conflicts += 1
            eng.counters.incr("drive_conflict")
            return AGAIN
        except DocumentTooLarge as exc:
            # a carried outcome too large: its activity fails; else (the workflow's result,
            # a new step's arguments) the execution fails, recorded by the next round
            # (a worker's: an eager drive records no failure)
            if d.eager:
                return DriveOutcome.DECLINED
            if any(x["id"] == exc.doc_id for x in d.carry):
                d.carry = oversized(exc, d.carry)
            elif d.oversize is None:
                d.oversize = error_info(exc)
            else:
                raise
            return AGAIN
        log.debug(
            "drive %s: %s after %d steps (%d new documents, %d sends)",
            d.execution_id,
            replay.kind,
            replay.steps,
            len(ops) - 1,
            len(replay.sends),
            extra={"workflow_id": d.execution_id, "workflow": ex.get("workflow"), "step": replay.steps},
        )
        for req in replay.sends:
            d.orphan_sends[req.key] = req
        d.committed = (ex, replay)
        return DriveOutcome(replay.kind)

    def _finish(self, d: _Drive) -> None:
        """Whatever ended the drive (a store error too): send what it committed, then what follows."""
        eng = self.engine
        if d.eager:  # the caller keeps no live instance, whatever ended its drive
            self.sticky.drop(d.execution_id)
        # the replay's commands first, then what follows from its outcome: a continued run is
        # pruned only after the effects it emitted were admitted (they live in its documents)
        for req in eng.limits.admit(list(d.orphan_sends.values())):  # new limited steps wait on their limit
            eng.dispatch(req)
        if d.committed is not None:
            self._after_commit(*d.committed)
        for child in sorted(d.reopen):
            eng.reopen_child(child, d.execution_id)

    def fail_corrupt(self, execution_id: str, error: Exception) -> None:
        """Fail the execution owning a document the engine cannot read (see :func:`.corrupt.fail_corrupt`)."""
        fail_corrupt(self.engine, execution_id, error)

    def _commit_ops(
        self, ex: ExecDoc, docs: dict[str, Doc], carry_new: list[Doc], release: list[int], replay: Replay, now: float
    ) -> list[Op] | None:
        eng = self.engine
        run = run_of(ex)
        ops: list[Op] = [Op.create(d) for d in carry_new]
        ops += [Op.create(d) for d in replay.new_docs if d["id"] not in docs]
        ops += release_ops(docs, release, run)
        new_ex = strip_reserved(ex)
        # what it waits on now, for listings (none once it ends or runs on)
        new_ex.pop("waiting", None)
        if replay.kind == ReplayKind.SUSPENDED and replay.waiting:
            new_ex["waiting"] = waiting_of(replay.waiting, run, docs, replay.new_docs)
        steps = max(replay.steps, count_of(ex, "steps"))
        new_ex.update(lease=None, due_kind=None, due_at=None, last_error=None, steps=steps)
        if replay.cancel_delivered:
            # delivered: what the workflow waits on from now are its compensations' awaits, which
            # a running attempt's renewal must not take for the cancel's (engine/activities/leases.py)
            new_ex.pop("cancel_before", None)
        # wf.set_status: recorded with this commit, only when the value changed (type-exact: 1 != True)
        status_changed = replay.status_set and carry_json(replay.custom_status) != carry_json(ex.get("custom_status"))
        if status_changed:
            new_ex["custom_status"] = replay.custom_status
        status_changed = apply_search_updates(new_ex, ex, replay.search_updates) or status_changed
        if replay.kind == ReplayKind.UNKNOWN:
            known = ", ".join(eng.registry.workflow_names()) or "none"
            new_ex.update(
                last_error=f"workflow {ex['workflow']!r} is not registered in this worker (registered: {known}); "
                "it will be retried",
                due_kind=DUE_EXEC,
                due_at=now + eng.settings.unknown_retry_delay,
            )
            log.error("execution %s: %s", ex["pk"], new_ex["last_error"])
        elif replay.kind == ReplayKind.CONTINUED:
            # a fresh run with a fresh history; the old run's documents are deleted after commit
            new_ex.update(
                status=RUNNING,
                run=run + 1,
                payload=replay.payload,
                steps=0,
                continued=count_of(ex, "continued") + 1,
                due_kind=DUE_EXEC,
                due_at=now + eng.settings.drive_timeout,
            )
            new_ex, input_doc = split_payload(new_ex)  # the new run's input: inline or its own
            if input_doc is not None:
                ops.append(Op.upsert(input_doc))
        elif replay.kind in ENDS:
            new_ex.update(status=Status(replay.kind.value), completed_at=now)  # the same words
            if replay.kind == ReplayKind.COMPLETED:
                new_ex["result"] = replay.value
            else:
                new_ex["error"] = replay.error
            if ex.get("parent"):
                # stays due until the parent has been told (recovery retries a lost notice)
                new_ex.update(parent_notified=False, due_kind=DUE_EXEC, due_at=now + eng.settings.drive_timeout)
        idle = replay.kind == ReplayKind.SUSPENDED and not ops and not replay.sends and not status_changed
        if idle and not ex.get("lease") and not ex.get("due_kind") and not ex.get("last_error"):
            return None  # nothing new: a duplicate drive message
        new_ex["updated_at"] = now
        new_ex["drives"] = count_of(ex, "drives") + 1
        ops.append(Op.replace(new_ex, ex["_etag"]))
        return ops

    def _apply(self, d: _Drive, ops: list[Op], replay: Replay) -> None:
        store, pk = self.engine.store, d.execution_id
        limit = store.max_batch_ops
        if len(ops) > limit:
            # Too many for one transactional batch (a wide fan-out): create the overflow first.
            # They are create-only, so a retry after a conflict finds them recorded; their
            # messages must then still be sent, whatever happens to this drive.
            overflow, ops = ops[: len(ops) - limit], ops[len(ops) - limit :]
            for op in overflow:
                assert op.doc is not None and op.kind == "create"
                store.create(op.doc)
            for req in replay.sends:
                d.orphan_sends[req.key] = req
            self.engine.cache.suspect(pk)  # the overflow is not in the batch: read it back
        etags = d.along.batch(store, pk, ops)
        self.engine.cache.committed(pk, ops, etags)  # the next read of ours needs no store call

    def _fence_cancelled_children(self, ex: ExecDoc, docs: dict[str, Doc], replay: Replay) -> None:
        """Claim the ids of the children this replay cancels, before its commit (``Children.fence_children``)."""
        cancels = {s.execution_id for s in replay.sends if isinstance(s, CancelRequest)}
        if cancels:
            self.engine.children.fence_children(ex, cancelled_child_steps(docs, run_of(ex), cancels))

    def _drop_stale(
        self, execution_id: str, carry: list[Doc], release: list[int], stale: set[int]
    ) -> tuple[list[Doc], list[int]]:
        """``carry`` and ``release`` without the outcomes of the ``stale`` steps (logged, counted)."""
        kept: list[Doc] = []
        for d in carry:
            if d.get("type") != "result" or d.get("seq") not in stale:
                kept.append(d)
                continue
            log.warning("outcome of %s step %s dropped: its step was forgotten, taken anew", execution_id, d["seq"])
            self.engine.emit(STALE_EVENT, execution_id=execution_id, seq=d["seq"], activity=d.get("name"))
        return kept, [s for s in release if s not in stale]

    def _record_ops(
        self, docs: dict[str, Doc], carry_new: list[Doc], release: list[int], new_ex: Doc, etag: str
    ) -> list[Op]:
        """Our documents, their markers settled, and the exec write (if-match ``etag``), for one batch."""
        run = run_of(new_ex)
        ops = [Op.create(d) for d in carry_new] + release_ops(docs, release, run)
        return ops + [Op.replace(new_ex, etag)]

    def _after_commit(self, ex: ExecDoc, replay: Replay) -> None:
        eng = self.engine
        eng.signals.after_commit(ex["pk"], replay.new_docs)  # signal values rejected/ignored by the replay
        eng.emit("drive_committed", execution_id=ex["pk"], outcome=replay.kind)
        if replay.kind in ENDS or replay.kind == ReplayKind.CONTINUED:  # its steps' unused slots (engine/limits/)
            eng.limits.release_idle(ex["pk"], run_of(ex))
        if replay.kind in ENDS:
            eng.limits.release_execution(ex)  # its own slot, if it waited on a limit
            eng.emit(f"workflow_{replay.kind}", execution_id=ex["pk"], workflow=ex["workflow"])
            if replay.kind != ReplayKind.COMPLETED:  # once: only the commit that ended it gets here
                # WARNING, not ERROR: the activity that failed is Celery's ERROR line already, and
                # a workflow may fail by design (a declined payment, compensated)
                error = replay.error or {}
                log.warning(
                    "workflow %s (%s) %s: %s: %s",
                    ex["workflow"],
                    ex["pk"],
                    replay.kind,
                    error.get("type"),
                    error.get("message"),
                    extra={"workflow_id": ex["pk"]},
                )
            if ex.get("parent"):
                eng.children.notify_parent(ex["pk"])
        elif replay.kind == ReplayKind.SUSPENDED:
            eng.emit("workflow_suspended", execution_id=ex["pk"], workflow=ex["workflow"])
        elif replay.kind == ReplayKind.CONTINUED:
            eng.emit("workflow_continued", execution_id=ex["pk"], workflow=ex["workflow"])
            prune_run(eng, ex["pk"], run_of(ex))
            eng.dispatcher.send_drive(ex["pk"])
