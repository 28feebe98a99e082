"""Replay: history in, commands out (docs/architecture.md §6).

:func:`replay` re-runs a workflow function over an execution's recorded documents and returns
what it decided: its status (suspended, completed, failed, cancelled, continued), the new step
documents to record and the commands to carry out once they are committed (start activities,
set timers, start or cancel children, admit effects). It does no I/O: it reads nothing but its
arguments, writes nothing and sends nothing; the driver commits its documents in one batch and
only then carries out its commands. Values handed to workflow code are fresh decoded copies, so
the history it was given is unchanged by the call (``tests/engine/test_replay_pure.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_durable.engine.activities.delivery import stamped
from celery_durable.engine.admin.reruns import rerun_count
from celery_durable.engine.dispatcher import AdmitRequest, CancelRequest, Send
from celery_durable.engine.documents.model import DUE_ACTIVITY, DUE_CHILD, DUE_CLOCK, error_info, payload_of, run_of
from celery_durable.engine.documents.records import ExecDoc, count_of
from celery_durable.engine.outcomes import ReplayKind
from celery_durable.engine.registry import Registry, WorkflowDef
from celery_durable.engine.replay.context import ContinueAsNew, Fatal, LocalStep, Suspend, WorkflowContext, failed_step
from celery_durable.engine.replay.sticky import Outcome, StickyCache, call
from celery_durable.engine.replay.updates import at_wait
from celery_durable.errors import CorruptDocument, PayloadValidationError, WorkflowCancelledError, WorkflowTimedOutError
from celery_durable.settings import Settings
from celery_durable.stores.base import Doc

__all__ = ["Replay", "replay"]


@dataclass
class Replay:
    """What one replay decided."""

    kind: ReplayKind
    value: Any = None
    error: dict[str, Any] | None = None
    #: step documents to record (markers, outcomes decided by the replay itself)
    new_docs: list[Doc] = field(default_factory=list)
    #: commands to carry out after the commit
    sends: list[Send] = field(default_factory=list)
    steps: int = 0
    #: the new payload, for ``continued``
    payload: dict[str, Any] | None = None
    #: ``wf.set_status`` was called (``custom_status``: the JSON value it last set)
    status_set: bool = False
    custom_status: Any = None
    #: ``wf.upsert_search`` updates of this replay (engine/documents/search.py)
    search_updates: dict[str, Any] = field(default_factory=dict)
    #: the query handlers the workflow registered, and (``read_only``) the context they answer in
    queries: dict[str, Callable[..., Any]] = field(default_factory=dict)
    #: local activity steps a suspended replay waits for (the driver runs them: engine/activities/local_activities.py)
    local: list[LocalStep] = field(default_factory=list)
    #: the steps a suspended replay waits for (their seqs): the exec's ``waiting`` (engine/drive/carried.py)
    waiting: list[int] = field(default_factory=list)
    #: the history holds the cancel's delivery (its cancelled outcomes): waits from now on are
    #: the compensations' (the driver drops the exec's ``cancel_before``)
    cancel_delivered: bool = False
    context: WorkflowContext | None = field(default=None, repr=False, compare=False)


#: due kinds of steps that only exist to produce an outcome for the running run
_WORK_DUE = (DUE_ACTIVITY, DUE_CHILD, DUE_CLOCK)


def _without_pending_work(new_docs: list[Doc], sends: list[Send]) -> tuple[list[Doc], list[Send]]:
    """What a replay that ends ``failed`` or ``continued`` keeps of the steps it just took.

    Nothing will ever wait for the activities, timers or children it started, so they are
    neither sent nor recorded (a recorded child marker would be started later by recovery;
    a retried execution records them afresh). Side effects, emits, outcomes and cancels of
    children stay.
    """
    kept = [d for d in new_docs if d.get("due_kind") not in _WORK_DUE]
    return kept, [s for s in sends if isinstance(s, CancelRequest | AdmitRequest)]


def replay(
    ex: ExecDoc,
    history: Mapping[str, Doc],
    wf: WorkflowDef | None,
    registry: Registry,
    now: float,
    settings: Settings,
    read_only: bool = False,
    sticky: StickyCache | None = None,
) -> Replay:
    """Replay execution ``ex`` of workflow ``wf`` over ``history`` at time ``now``; pure.

    ``read_only``: a query's replay (engine/replay/queries.py). It runs exactly as a drive's, but what it
    decides is discarded by its caller, so it also returns its context for the query handlers.
    ``sticky``: resume the live instance of this execution the cache holds if what it saw is
    unchanged, else replay in a new one it keeps if it suspends (engine/replay/sticky.py); what is
    decided is the same. Never for a read-only replay.
    """
    if wf is None:
        return Replay(ReplayKind.UNKNOWN)
    if sticky is not None and (read_only or not sticky.enabled):
        sticky = None
    if sticky is not None:
        resumed = sticky.resume(ex, history, wf, now)
        if resumed is not None:
            return _settled(sticky, ex, _decide(ex, wf, *resumed, read_only))
    ctx = WorkflowContext(
        execution_id=ex["pk"],
        workflow=wf.name,
        history=dict(history),
        now=now,
        registry=registry,
        cancel_requested=bool(ex.get("cancel_requested")),
        timed_out=bool(ex.get("timed_out")),
        deadline_at=ex.get("deadline_at"),
        activity_queue_timeout=settings.activity_queue_timeout,
        admit_grace=settings.outbox_admit_grace,
        run=run_of(ex),
        signal_types=wf.signals,
        read_only=read_only,
        resets=rerun_count(ex),
        # updates are applied and decided at wait points (engine/replay/updates.py); their outcomes fit the store
        on_wait=functools.partial(at_wait, max_payload=settings.max_payload),
    )
    try:
        args, kwargs = wf.codec.decode_args(payload_of(ex, history))
    except CorruptDocument as exc:  # its input document is missing
        return Replay(ReplayKind.FAILED, error=error_info(exc))
    except (PayloadValidationError, TypeError, AttributeError) as exc:
        err = CorruptDocument(f"stored payload of {ex['pk']!r} cannot be decoded: {exc}")
        return Replay(ReplayKind.FAILED, error=error_info(err))
    if sticky is not None:
        return _settled(sticky, ex, _decide(ex, wf, ctx, sticky.run(ctx, wf.fn, args, kwargs), read_only))
    return _decide(ex, wf, ctx, call(ctx, wf.fn, args, kwargs), read_only)


def _settled(sticky: StickyCache, ex: ExecDoc, decided: Replay) -> Replay:
    sticky.settle(ex, decided)
    return decided


def _decide(ex: ExecDoc, wf: WorkflowDef, ctx: WorkflowContext, outcome: Outcome, read_only: bool) -> Replay:
    """What a replay decided, from how the workflow function ended (or suspended) in ``ctx``."""
    kind, value, error, payload = ReplayKind.COMPLETED, None, None, None
    raised, result = outcome
    if ctx.unwinding:  # user code swallowed its Suspend and went on: it suspended (as a parked instance)
        raised = Suspend()
    if raised is not None:
        if isinstance(raised, Suspend):
            kind = ReplayKind.SUSPENDED
        elif isinstance(raised, ContinueAsNew):
            kind, payload = ReplayKind.CONTINUED, raised.payload
        elif isinstance(raised, Fatal):
            kind, error = ReplayKind.FAILED, error_info(raised.error)
        elif isinstance(raised, WorkflowTimedOutError) and ctx.cancel_requested and ctx.timed_out:
            kind, error = ReplayKind.TIMED_OUT, error_info(raised)  # its deadline (engine/starts/deadlines.py)
        elif isinstance(raised, WorkflowCancelledError):
            kind, error = (ReplayKind.CANCELLED if ctx.cancel_requested else ReplayKind.FAILED), error_info(raised)
        else:  # the workflow's own failure is its outcome
            assert isinstance(raised, Exception)
            kind, error = ReplayKind.FAILED, error_info(raised)
            cause = failed_step(raised)  # a step's failure ended it: retry re-runs that step
            if cause is not None:
                error["step"], error["taken"] = cause
    else:
        recorded = count_of(ex, "steps")
        if recorded > ctx.seq:
            kind = ReplayKind.FAILED
            error = {
                "type": "NonDeterminismError",
                "message": f"workflow {wf.name!r} returned after {ctx.seq} steps but the history "
                f"has {recorded}: the code changed under a running execution",
            }
        else:
            try:
                value = wf.codec.encode_result(result)
            except PayloadValidationError as exc:
                kind, error = ReplayKind.FAILED, error_info(exc)
    if kind == ReplayKind.FAILED and error is not None:
        # "step" present (None: the workflow code, not a step, failed) tells retry not to guess
        error.setdefault("step", None)
        error["run"] = ctx.run
    life = str(ex.get("incarnation") or "")
    new_docs, sends = stamped(ctx.new_docs.values(), ctx.sends, ctx.resets, life)  # engine/activities/delivery.py
    if kind in (ReplayKind.FAILED, ReplayKind.CONTINUED):
        new_docs, sends = _without_pending_work(new_docs, sends)
    return Replay(
        kind,
        value=value,
        error=error,
        new_docs=new_docs,
        sends=sends,
        steps=ctx.seq,
        payload=payload,
        status_set=ctx.status_set,
        custom_status=ctx.custom_status,
        search_updates=dict(ctx.search_updates),
        queries=dict(ctx.query_handlers),
        local=list(ctx.local_steps) if kind == ReplayKind.SUSPENDED else [],
        waiting=list(ctx.waiting) if kind == ReplayKind.SUSPENDED else [],
        cancel_delivered=ctx.cancel_delivered,
        context=ctx if read_only else None,
    )
