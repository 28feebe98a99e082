"""The operator's reads and operations: list, describe, retry, resume, reset, purge.

Everything an operator (the ``durable`` CLI, a script, a future UI) does to executions goes
through here, so the CLI is a thin layer; the engine's document shapes are decoded in one place,
:mod:`.timeline` (:func:`summary_of`, :func:`describe_docs`, re-exported here).

Operations that delete or rewrite recorded documents (retry, resume, purge) write the exec
document with a bumped ``generation`` in the same batch as the deletes, so every process's
partition cache notices and reads the partition afresh (see :func:`.cache.bump_generation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery_durable.engine.activities.delivery import marker_token, rotated_token
from celery_durable.engine.admin.cancel_withdrawal import cascaded, ended_by_parent, rearm_waiting_children
from celery_durable.engine.admin.child_ops import check_reopen, register
from celery_durable.engine.admin.oplog import actor, cascade, note, purge_record, recorded, unknown
from celery_durable.engine.admin.pending_ops import check_field, check_inputs, check_purge, commit, settle
from celery_durable.engine.admin.purge import PURGING, finish_purge, purge_partition
from celery_durable.engine.admin.reopen import reopened
from celery_durable.engine.admin.reruns import bump_reruns, children_of, rerun_count
from celery_durable.engine.admin.reset import cancel_point, delivered_cancel, plan_reset, reset_by
from celery_durable.engine.admin.timeline import (
    STATUSES,
    ExecutionDetail,
    ExecutionPage,
    ExecutionSummary,
    PurgeReport,
    SignalRecord,
    StepRecord,
    _epoch,
    _int,
    _num,
    _str,
    describe_docs,
    summary_of,
)
from celery_durable.engine.admin.undecodable import salvage
from celery_durable.engine.children.holders import CHILD_RERUNS
from celery_durable.engine.dispatcher import ActivityRequest, ClockRequest
from celery_durable.engine.documents.model import lease_live
from celery_durable.engine.documents.records import ExecDoc, as_exec, is_terminal, maybe_exec
from celery_durable.engine.documents.schema import (
    CANCELLED_BY_PARENT,
    EXEC_ID,
    TERMINAL,
    DocType,
    DueKind,
    Status,
    StepKind,
    marker_id,
    task_id_of,
)
from celery_durable.engine.outbox import DUE_ADMIT
from celery_durable.engine.starts.deadlines import LIFTED
from celery_durable.errors import ConflictError, CorruptDocument, DurableError, OperationRefused, UnknownWorkflowError
from celery_durable.stores.base import Doc, ExecFilter, strip_reserved
from celery_durable.stores.search import check_filter

if TYPE_CHECKING:
    from celery_durable.engine.core import Engine

__all__ = [
    "Admin",
    "ExecutionSummary",
    "ExecutionPage",
    "ExecutionDetail",
    "StepRecord",
    "SignalRecord",
    "PurgeReport",
    "OperationRefused",
    "summary_of",
    "describe_docs",
]


#: how many reasons for kept executions a purge report carries (the latest)
_KEPT_REASONS = 50


# --- the operations ----------------------------------------------------------------------------


@dataclass
class _Rewrite:
    """What an operation changes in one partition: deletes, replaced step documents, exec fields."""

    deletes: list[Doc] = field(default_factory=list)
    replaces: list[Doc] = field(default_factory=list)
    sends: list[ActivityRequest | ClockRequest] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    #: finished child executions of forgotten steps, deleted by the commit (engine/admin/child_ops.py)
    forget: list[str] = field(default_factory=list)
    #: exec fields besides reopening it
    fields: dict[str, Any] = field(default_factory=dict)
    #: documents created with the first batch (the record of the action: engine/admin/oplog.py)
    creates: list[Doc] = field(default_factory=list)


def _settled_between(docs: dict[str, Doc], run: int, seq: int, taken: int) -> set[int]:
    """Steps after the failed step ``seq`` that the code took *before* its failure was raised
    (``taken``: the other activities of a gather, say) and that are settled: an outcome, or a
    step that is its own record (``now``, ``emit``…). The re-run takes them again at the same
    numbers, so they keep what they recorded (a finished sibling does not run twice); pending
    ones are forgotten and taken afresh."""
    done = {
        _int(d.get("seq"))
        for d in docs.values()
        if d.get("type") in (DocType.RESULT, DocType.SIGNAL) and _int(d.get("run")) == run
    }
    work = (StepKind.ACTIVITY, StepKind.CHILD, StepKind.SLEEP, StepKind.SIGNAL)
    return {
        s
        for d in docs.values()
        if d.get("type") == DocType.STEP
        and _int(d.get("run")) == run
        and seq < (s := _int(d.get("seq"))) <= taken
        and (s in done or d.get("kind") not in work)
    }


class Admin:
    """Operator reads and operations on one engine (``durable.admin`` / ``Engine.admin``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # --- reads ---------------------------------------------------------------------------

    def executions(
        self,
        workflow: str | None = None,
        status: str | None = None,
        created_after: datetime | float | None = None,
        created_before: datetime | float | None = None,
        limit: int = 100,
        cursor: str | None = None,
        search: Mapping[str, Any] | None = None,
    ) -> ExecutionPage:
        """One page of executions, newest first (one store query per page). ``search``:
        ``{attr: value}`` AND-ed, a keyword list matching when it holds the value; its cost grows
        with the executions holding the first attribute's value (stores/search.py)."""
        if status is not None and status not in STATUSES:
            raise OperationRefused(f"unknown status {status!r} (one of {', '.join(STATUSES)})")
        flt = ExecFilter(workflow, status, _epoch(created_after), _epoch(created_before), check_filter(search) or None)
        page = self.engine.store.list_execs(flt, limit, cursor)
        return ExecutionPage(tuple(summary_of(d) for d in page.docs), page.cursor)

    def iter_executions(self, page_size: int = 500, **filters: Any) -> Iterator[ExecutionSummary]:
        """Every matching execution, page by page."""
        cursor: str | None = None
        while True:
            page = self.executions(limit=page_size, cursor=cursor, **filters)
            yield from page.executions
            cursor = page.cursor
            if cursor is None:
                return

    def describe(self, execution_id: str) -> ExecutionDetail:
        """The execution and its step timeline; raises :class:`UnknownWorkflowError` if absent.

        A document the store cannot decode does not hide the others: they are read by id (the
        ids the exec document implies) and each undecodable one is flagged, its step ``corrupt``.
        """
        store = self.engine.store
        try:
            docs = store.query_partition(execution_id).docs
        except CorruptDocument as exc:
            try:
                ex = store.read(execution_id, EXEC_ID)
            except CorruptDocument as exc2:
                return ExecutionDetail(ExecutionSummary(id=execution_id, corrupt=str(exc2)), corrupt=(str(exc2),))
            if ex is None:
                raise UnknownWorkflowError(f"no execution with id {execution_id!r}") from exc
            return self._salvage(ex, str(exc))
        ex = next((d for d in docs if d.get("id") == EXEC_ID), None)
        if ex is not None and ex.get(PURGING):  # a recorded purge cut between its batches: it is gone
            finish_purge(self.engine, execution_id)
            ex = None
        if ex is None:
            raise UnknownWorkflowError(unknown(self.engine, execution_id))  # says who purged it
        return describe_docs(ex, docs)

    def _salvage(self, ex: Doc, failure: str) -> ExecutionDetail:
        return salvage(self.engine.store, ex, failure)

    # --- operations ----------------------------------------------------------------------------

    def retry(self, execution_id: str, by: str | None = None, reason: str | None = None) -> list[StepRecord]:
        """Re-run a failed execution from its failed step; return the step(s) that run again.

        The step whose failure ended the execution (recorded by the replay: the error that escaped
        the workflow, or was raised while handling it; a failure the code caught and went past is
        no cause) loses its result (an activity is sent again, a failed child is retried itself)
        and everything the run recorded after it is forgotten: markers, outcomes, wait decisions
        (the values they consumed are pending again, for the re-run to take), so the re-run
        continues where the code now goes (past compensations of a Saga, say). Steps taken before
        the failure was raised (the other activities of a gather) keep their outcomes. A child
        started after the failed step belongs to the forgotten history: a finished one is deleted
        (with its finished descendants), so the re-run, which derives the same id, starts its
        own; one still running refuses the retry (:class:`OperationRefused` names it: cancel it,
        or wait, and retry again). An effect emitted by a forgotten step and not admitted yet is
        admitted first. The execution is running again. With no failed step (the workflow code
        itself failed, or it was terminated: its terminated children reopen) it is re-driven as it
        is, e.g. after a fix; a kept step left with nothing due is sent again. Recorded (oplog.py).
        """
        check_inputs(OperationRefused, execution_id)
        return self._operate(execution_id, recorded(self.engine, self._plan_retry, "retry", by, reason))

    def resume(self, execution_id: str, by: str | None = None, reason: str | None = None) -> list[StepRecord]:
        """Continue an execution from its recorded history.

        Running: drive it now. Failed: reopen it *keeping* every recorded result (after a
        deploy fixing the workflow code; ``retry`` re-runs the failed step instead). Cancelled:
        withdraw the cancellation: the cancelled outcomes and every step recorded from the cancel
        on (compensations) are forgotten — what compensations did is not undone — cancelled
        children are resumed, and the interrupted steps run again. Recorded, with what it forgot.
        """
        check_inputs(OperationRefused, execution_id)
        ex = self.engine.read_exec(execution_id)
        if ex.get("status") == Status.RUNNING:
            note(self.engine, execution_id, "resume", by, reason)
            self.engine.wake(execution_id)
            return []
        return self._operate(execution_id, recorded(self.engine, self._plan_resume, "resume", by, reason))

    def reset(self, execution_id: str, step: int, by: str | None = None, reason: str | None = None) -> list[StepRecord]:
        """Re-run a failed or cancelled execution from step ``step`` (Temporal's reset, DBOS's resume
        from a step); return the steps recorded from there on, which run again.

        Everything the current run recorded from ``step`` on is forgotten (markers, outcomes, wait
        decisions, the settlements of the signal values they consumed, finished children of those
        steps; a running child or a running activity attempt refuses it), a cancellation recorded
        before ``step`` is withdrawn, and the execution runs again from there. Steps before ``step``
        keep their outcomes. Recorded as an operation document ``op:<n>`` (who, when, from which
        step, the status it had, what it forgot) written with the first batch; the exec's
        ``generation`` is bumped and it is terminal until the last batch, so no drive runs on a
        half-reset history. A running execution is refused: cancel it first. See engine/admin/reset.py.
        """
        who = reset_by() if by is None else by
        check_inputs(OperationRefused, execution_id, by=who, reason=reason)  # before anything is written
        before = self.describe(execution_id)

        def _plan_reset(ex: ExecDoc, docs: dict[str, Doc]) -> _Rewrite:
            rewrite = _Rewrite()
            plan_reset(self, rewrite, OperationRefused, ex, docs, step, who, reason)
            return rewrite

        self._operate(execution_id, _plan_reset)
        return [s for s in before.steps if s.seq >= step]

    def purge(
        self,
        older_than: float,
        *,
        dry_run: bool = False,
        progress: Callable[[PurgeReport], None] | None = None,
        page_size: int = 200,
        by: str | None = None,
        reason: str | None = None,
        matched: Callable[[ExecutionSummary], None] | None = None,
    ) -> PurgeReport:
        """Delete terminal executions that ended more than ``older_than`` seconds ago.

        Found through the paged listing (never one read per execution of the store); each
        execution is deleted in batches of its own partition, the exec document last. A child
        whose parent has not been told its outcome yet is kept. ``progress`` gets the running
        report after each execution; ``matched`` each execution found to purge (``dry_run``: the
        list of what a purge would delete). Each purge is recorded (who, when, ``reason``) in its
        first batch; one cut between its batches is finished by whoever comes next (purge.py).
        """
        check_purge(OperationRefused, older_than, dry_run, page_size)
        who = actor() if by is None else by
        check_field(OperationRefused, "by", who)  # before anything is written
        check_field(OperationRefused, "reason", reason)
        cutoff = self.engine.clock.now() - older_than
        report = PurgeReport(dry_run=dry_run)
        for status in (Status.COMPLETED, Status.FAILED, Status.CANCELLED, Status.TIMED_OUT):
            # ended before the cutoff implies created before it: the store filters on that
            cursor: str | None = None
            while True:
                page = self.engine.store.list_execs(ExecFilter(status=status, created_before=cutoff), page_size, cursor)
                for doc in page.docs:
                    s = summary_of(doc)
                    if s.corrupt:
                        # listed as finished and old, but unreadable: kept for inspection, reported
                        why = f"{s.id}: unreadable exec document, kept: {s.corrupt}"
                        kept = (*report.kept, why)[-_KEPT_REASONS:]
                        report = replace(report, matched=report.matched + 1, skipped=report.skipped + 1, kept=kept)
                        if progress is not None and not dry_run:
                            progress(report)
                        continue
                    ended = s.completed_at or s.updated_at or s.created_at
                    if s.status not in TERMINAL or ended is None or ended >= cutoff:
                        continue
                    report = replace(report, matched=report.matched + 1)
                    if matched is not None:
                        matched(s)
                    if dry_run:
                        continue
                    try:
                        deleted = self._purge_one(s.id, who=who, reason=reason)
                    except CorruptDocument as exc:
                        deleted = f"a document cannot be decoded, kept for inspection: {exc}"
                    if isinstance(deleted, str):
                        kept = (*report.kept, f"{s.id}: {deleted}")[-_KEPT_REASONS:]
                        report = replace(report, skipped=report.skipped + 1, kept=kept)
                    else:
                        report = replace(report, purged=report.purged + 1, documents=report.documents + deleted)
                    if progress is not None:
                        progress(report)
                cursor = page.cursor
                if cursor is None:
                    break
        return report

    # --- internals -------------------------------------------------------------------------------

    def _operate(self, execution_id: str, plan: Callable[[ExecDoc, dict[str, Doc]], _Rewrite]) -> list[StepRecord]:
        eng = self.engine
        for _ in range(5):
            docs = {d["id"]: d for d in eng.store.query_partition(execution_id).docs}
            ex = maybe_exec(docs.get(EXEC_ID))
            if ex is None:
                raise UnknownWorkflowError(f"no execution with id {execution_id!r}")
            if settle(eng, ex, docs):
                continue  # an earlier operation was left half done: finished first, plan afresh
            rewrite = plan(ex, docs)
            if any(d.get("due_kind") == DUE_ADMIT for d in rewrite.deletes):
                # a forgotten step's effect was emitted like any finished work: admit it first
                why = self._admit_intents(rewrite.deletes)
                if why is not None:
                    raise OperationRefused(f"{execution_id}: {why}; try again")
                continue  # admission rewrote the intents: plan again on a fresh read
            now = eng.clock.now()
            reopened = {
                "status": Status.RUNNING,
                "error": None,
                "completed_at": None,
                "lease": None,
                "last_error": None,
                "cancel_requested": False,
                CANCELLED_BY_PARENT: None,
                **LIFTED,  # a re-run has no deadline (engine/starts/deadlines.py)
                "retried": _int(ex.get("retried")) + 1,
                "wakeups": _int(ex.get("wakeups")) + 1,
                **bump_reruns(ex),  # the ids of steps the re-run takes anew are new (engine/admin/reruns.py)
                "updated_at": now,
                "due_kind": DueKind.EXEC,
                "due_at": now + eng.settings.drive_timeout,
            } | rewrite.fields
            try:
                commit(eng, ex, docs, rewrite, reopened, plan.__name__.removeprefix("_plan_"), OperationRefused)
            except ConflictError:
                continue  # the execution changed under us: plan again on a fresh read
            break
        else:
            raise OperationRefused(f"{execution_id} kept changing; try again")
        for send in rewrite.sends:
            eng.dispatch(send)
        eng.dispatcher.send_drive(execution_id)
        rerun = {int(d["seq"]) for d in rewrite.replaces if d.get("type") == DocType.STEP}
        return [s for s in describe_docs(ex, list(docs.values())).steps if s.seq in rerun]

    def _status(self, execution_id: str) -> str | None:
        doc = self.engine.store.read(execution_id, EXEC_ID)
        return None if doc is None else _str(doc.get("status"))

    def _plan_retry(self, ex: ExecDoc, docs: dict[str, Doc]) -> _Rewrite:
        if ex.get("status") != Status.FAILED:
            raise OperationRefused(f"{ex['pk']} is {ex.get('status')}, not failed")
        run = _int(ex.get("run"))
        failed = sorted(
            (
                d
                for d in docs.values()
                if d.get("type") == DocType.RESULT
                and _int(d.get("run")) == run
                and d.get("ok") is False
                and not d.get("cancelled")
            ),
            key=lambda d: _int(d.get("seq")),
        )
        error = ex.get("error")
        if isinstance(error, dict) and "step" in error:
            # the replay recorded which step's failure ended the execution (None: the workflow's own
            # code did): only that one is re-run; a failure the code caught and went past is no cause
            cause = error.get("step")
            ours = _int(error.get("run"), run) == run and isinstance(cause, int)
            failed = [d for d in failed if ours and _int(d.get("seq")) == cause]
            taken = _int(error.get("taken"), _int(cause))
        else:
            # failed before the cause was recorded: the run's last failed step, if any, except an
            # outcome that landed after the execution failed (a child cancelled later)
            ended = _num(ex.get("completed_at"))
            failed = [d for d in failed if ended is None or (_num(d.get("completed_at")) or 0.0) <= ended]
            taken = _int(failed[-1].get("seq")) if failed else 0
        rewrite = _Rewrite()
        if failed:
            seq = _int(failed[-1].get("seq"))
            keep = _settled_between(docs, run, seq, taken)
            self._forget_after(ex, docs, seq, rewrite, keep)
            self._rerun(ex, docs, failed[-1], rewrite)
            # a re-run that returns earlier than the forgotten steps is not non-deterministic
            rewrite.fields["steps"] = max([seq, *keep])
        # a cancel still stands (failed in what it ran: re-run, it ends cancelled), a terminate's
        return reopened(self, ex, docs, rewrite)  # cascade is undone, stranded steps re-armed

    def _forget_after(self, ex: ExecDoc, docs: dict[str, Doc], seq: int, rewrite: _Rewrite, keep: set[int]) -> None:
        """Plan to delete what run ``ex.run`` recorded after step ``seq`` (but the steps ``keep``):
        markers, outcomes, wait decisions, settlements of signal values and update requests (so those
        are pending again: engine/replay/updates.py); values themselves are not bound to steps and stay. Children of
        those steps are deleted when finished; a running one refuses the operation."""
        run = _int(ex.get("run"))
        settles = (DocType.SIGNAL_REJECTED, DocType.SIGNAL_IGNORED, "signal_consumed")
        kinds = (DocType.STEP, DocType.RESULT, DocType.SIGNAL, *settles, "update_outcome", "publication_mark")
        for d in docs.values():
            if d["id"] == EXEC_ID or d.get("type") not in kinds or _int(d.get("run")) != run:
                continue
            if _int(d.get("seq"), -1) <= seq or _int(d.get("seq")) in keep:
                continue
            if d.get("type") == DocType.STEP and lease_live(d, self.engine.clock.now()):
                # its outcome would land on whatever step the re-run records under this number
                raise OperationRefused(f"step {d['seq']} ({d.get('name')}) of {ex['pk']} is still running; retry later")
            rewrite.deletes.append(d)
            if d.get("type") == DocType.STEP and d.get("kind") == StepKind.CHILD and _str(d.get("child_id")):
                self._plan_forget(str(d["child_id"]), rewrite, depth=0)

    def _plan_forget(self, execution_id: str, rewrite: _Rewrite, depth: int) -> None:
        """Add a finished execution and its descendants to ``rewrite.forget`` (children first)."""
        docs = self.engine.store.query_partition(execution_id).docs
        ex = next((d for d in docs if d["id"] == EXEC_ID), None)
        if ex is None:
            return  # never created (the parent failed before the start), or already forgotten
        if not is_terminal(ex) or depth > 20:
            raise OperationRefused(
                f"child {execution_id} was started after the failed step and is {ex.get('status')}: "
                "cancel it (or let it end) and retry again"
            )
        for d in docs:
            if d.get("type") == DocType.STEP and d.get("kind") == StepKind.CHILD and _str(d.get("child_id")):
                self._plan_forget(str(d["child_id"]), rewrite, depth + 1)
        rewrite.forget.append(execution_id)

    def _plan_resume(self, ex: ExecDoc, docs: dict[str, Doc]) -> _Rewrite:
        status = ex.get("status")
        rewrite = _Rewrite()
        if status == Status.FAILED:  # reopened on its history: a cancel still stands, a terminate's
            return reopened(self, ex, docs, rewrite)  # cascade is undone, stranded steps re-armed
        if status not in (Status.CANCELLED, Status.TIMED_OUT):  # a timeout is a cancel: resumed alike
            raise OperationRefused(f"{ex['pk']} is {status}; resume applies to running, failed, cancelled or timed out")
        run = _int(ex.get("run"))
        current = [d for d in docs.values() if d["id"] != EXEC_ID and _int(d.get("run")) == run]
        cancelled = delivered_cancel(docs, run)
        if not cancelled:
            return rewrite
        caused = cascaded(self.engine, ex, docs)
        cancelled += caused
        forgotten = {d["id"] for d in cancelled}
        # The cancel was delivered at one suspension point: the steps taken up to it were
        # recorded before (kept, with their results); the steps after it are the cancellation's
        # own work (compensations). Decided by step order, never by clocks: the cancelling
        # drive's clock may read the same as (or less than) that of the step before it.
        at = cancel_point(cancelled)
        for d in current:
            # outcomes: the cancelled ones; every document of a later step (marker, outcome,
            # wait decision, the settlement of the signal value it consumed)
            if d["id"] in forgotten or _int(d.get("seq"), -1) > at:
                if d.get("type") == DocType.STEP and lease_live(d, self.engine.clock.now()):
                    raise OperationRefused(f"step {d['seq']} ({d.get('name')}) of {ex['pk']} is running; try later")
                rewrite.deletes.append(d)
        for child in children_of(rewrite.deletes):  # of the compensations: their re-run starts its own
            self._plan_forget(child, rewrite, depth=0)
        if any(_int(d.get("seq"), -1) > at for d in rewrite.deletes):
            rewrite.fields["steps"] = at  # the resumed run may take fewer steps than the compensations
        gone = {d["id"] for d in rewrite.deletes}
        for d in cancelled:
            marker = docs.get(marker_id(_int(d.get("seq")), run))
            if marker is not None and marker["id"] not in gone:
                self._rearm(ex, marker, rewrite)
        rearm_waiting_children(self, ex, docs, rewrite)
        return rewrite

    def _rerun(self, ex: ExecDoc, docs: dict[str, Doc], outcome: Doc, rewrite: _Rewrite) -> None:
        """Forget a step's outcome and make the step happen again."""
        rewrite.deletes.append(outcome)
        marker = docs.get(marker_id(_int(outcome.get("seq")), _int(ex.get("run"))))
        if marker is not None:
            self._rearm(ex, marker, rewrite, fresh=True)

    def _rearm(self, ex: ExecDoc, marker: Doc, rewrite: _Rewrite, fresh: bool = False) -> None:
        """Make a step whose outcome is gone pending again, due (recovery's safety net) and sent."""
        eng = self.engine
        now = eng.clock.now()
        kind, seq, run = marker.get("kind"), int(marker["seq"]), _int(ex.get("run"))
        if lease_live(marker, now):  # sent again, it would run twice at once (as reset and retry refuse)
            raise OperationRefused(f"step {seq} ({marker.get('name')}) of {ex['pk']} is still running; try again later")
        kept = {k: v for k, v in strip_reserved(marker).items() if k not in ("failed_at", "retry_at")}  # old backoff
        updated = kept | {"lease": None, "last_error": None, "_etag": marker["_etag"]}
        if kind == StepKind.ACTIVITY and marker.get("local"):
            # run by the drive _operate sends (engine/activities/local_activities.py): no message, no timer
            updated.update(
                attempts=0 if fresh else updated.get("attempts", 0), fire_at=None, due_kind=None, due_at=None
            )
        elif kind == StepKind.ACTIVITY:
            payload = marker.get("input") or {}
            if fresh:  # a retry: no message of the failed attempt may complete it (engine/activities/delivery.py)
                updated.update(attempts=0, lost=0, token=rotated_token())
            updated.update(due_kind=DueKind.ACTIVITY, due_at=now + eng.settings.activity_queue_timeout)
            rewrite.sends.append(
                ActivityRequest(
                    str(ex["pk"]),
                    seq,
                    str(marker["name"]),
                    list(payload.get("args", [])),
                    dict(payload.get("kwargs", {})),
                    task_id_of(marker),
                    str(ex.get("workflow")),
                    run=run,
                    token=marker_token(updated),
                )
            )
        elif kind in (StepKind.SLEEP, StepKind.SIGNAL) and _num(marker.get("fire_at")) is not None:
            fire_at = float(marker["fire_at"])
            updated.update(due_kind=DueKind.CLOCK, due_at=fire_at)
            rewrite.sends.append(ClockRequest(str(ex["pk"]), seq, fire_at, run))
        elif kind == StepKind.CHILD and marker.get("child_id"):
            child = str(marker["child_id"])
            updated.update(due_kind=DueKind.CHILD, due_at=now + eng.settings.activity_queue_timeout)
            cex = as_exec(eng.store.read(child, EXEC_ID) or {})
            # a failed child is retried with its step; a cancelled one is resumed only if the
            # cancel was its parent's: an operator's cancel of it stands (the step takes its end)
            if cex.get("status") == Status.FAILED or ended_by_parent(cex):
                check_reopen(self, child)  # its refusal, before anything is written
                rewrite.children.append(child)
                # reopened, it counts one rerun more: an end of the life before is not the step's
                updated[CHILD_RERUNS] = rerun_count(cex) + 1
            # a child still running on a cancel of ours (pending): when it ends so, the parent's
            # drive resumes it (kin.withdrawn_cancels), the cancel being withdrawn now
        rewrite.replaces.append(updated)

    def _admit_intents(self, docs: list[Doc]) -> str | None:
        """Admit the emitted effects among ``docs`` whose intent is still due (the drive that
        recorded it died before admitting it, beat's scan has not come by): deleting the intent
        first would lose the effect. Idempotent. Why one could not be admitted, or None."""
        for doc in docs:
            if doc.get("due_kind") != DUE_ADMIT:
                continue
            try:
                if self.engine.outbox.admit_intent(doc) is None:
                    return f"its effect intent {doc['id']} records no effect"
            except (DurableError, KeyError, TypeError, ValueError) as exc:
                return f"its effect intent {doc['id']} could not be admitted ({type(exc).__name__}: {exc})"
        return None

    def _purge_one(
        self, execution_id: str, force: bool = False, who: str | None = None, reason: str | None = None
    ) -> int | str:
        """Delete every document of a terminal execution; how many, or why it was kept.
        ``force``: even a child whose parent was not told (the parent forgets the step).
        ``who``: recorded as its purger (None: no record, a forgotten child); engine/admin/purge.py."""
        store = self.engine.store
        for _ in range(3):
            docs = store.query_partition(execution_id).docs
            if not any(d.get("due_kind") == DUE_ADMIT for d in docs):
                break
            why = self._admit_intents(docs)
            if why is not None:
                return why  # the scan keeps trying; the next purge looks again
        else:
            return "its emitted effects were not admitted yet"
        ex = maybe_exec(next((d for d in docs if d["id"] == EXEC_ID), None))
        if ex is None:
            return "it no longer exists"
        if ex.get(PURGING):  # an earlier purge was cut between its batches (and recorded): finished
            finish_purge(self.engine, execution_id)
            return sum(1 for d in docs if d.get("type") != "purged")
        if settle(self.engine, ex, {d["id"]: d for d in docs}):
            return "an operation on it was half done: finished it"
        if not is_terminal(ex):
            return f"it is {ex.get('status')}"
        if ex.get("parent") and ex.get("parent_notified") is False and not force:
            return "its parent was not told its outcome yet"
        record = None if who is None else purge_record(ex, docs, who, reason, self.engine.clock.now())
        try:
            return purge_partition(self.engine, ex, docs, record)
        except ConflictError:
            return "it changed meanwhile"  # the next purge looks again
        finally:
            self.engine.cache.invalidate(execution_id)


register(Admin, cascade)  # an op's children are forgotten/reopened by its finisher (engine/admin/child_ops.py)
