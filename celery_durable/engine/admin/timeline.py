"""The read model of an execution: the documents of its partition decoded for operators.

What :mod:`.operator` lists and describes (``durable show``, ``durable.describe()``), decoded in one
place (:func:`summary_of`, :func:`describe_docs`). Decoding never raises on a malformed
document: it is flagged (``corrupt``) and the others are still shown.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from celery_durable.engine.admin.reruns import emit_state
from celery_durable.engine.admin.superseded import SupersededStep, live_versions, superseded_of, with_parts
from celery_durable.engine.documents.model import payload_of
from celery_durable.engine.documents.schema import (
    EXEC_ID,
    PENDING_OP,
    SIGNAL_MARK_PREFIX,
    DocType,
    Status,
    StepKind,
    result_id,
    signal_outcome_id,
    task_id_of,
)
from celery_durable.errors import CorruptDocument
from celery_durable.stores.base import CORRUPT_KEY, Doc

__all__ = [
    "STATUSES",
    "ExecutionSummary",
    "ExecutionPage",
    "ExecutionDetail",
    "StepRecord",
    "SignalRecord",
    "SupersededStep",
    "PurgeReport",
    "summary_of",
    "describe_docs",
]

STATUSES = tuple(str(s) for s in Status)
#: steps that produce their value while driving: recorded inline in their marker
_INLINE = (
    StepKind.NOW,
    StepKind.UUID,
    StepKind.SEED,
    StepKind.DONE,
    StepKind.PATCH,
    StepKind.PUBLISH,
    StepKind.EVENT,
    StepKind.UPDATE,  # applied by the drive that accepted it (its answer: updr:<n>)
    "random",
)


@dataclass(frozen=True)
class ExecutionSummary:
    """One execution as listed. ``corrupt`` says why its exec document cannot be read (else None)."""

    id: str
    workflow: str | None = None
    status: str | None = None
    steps: int = 0
    run: int = 0
    created_at: float | None = None
    updated_at: float | None = None
    completed_at: float | None = None
    cancel_requested: bool = False
    last_error: str | None = None
    parent: str | None = None
    corrupt: str | None = None
    #: its search attributes (``start(..., _search=)``, ``wf.upsert_search``) and memo (``_memo=``)
    search: dict[str, Any] | None = None
    memo: Any = None
    #: what the workflow says it is doing (``wf.set_status``)
    custom_status: Any = None
    #: what a running execution waits on (``[{"kind", "name", "until", "child"}]``, its exec's)
    waiting: tuple[dict[str, Any], ...] = ()
    #: when it times out (``options(timeout=)``) and, while ``scheduled``, when it starts
    deadline_at: float | None = None
    start_at: float | None = None
    #: since when an operator paused it (``durable pause``), None when it is not paused
    paused_at: float | None = None


@dataclass(frozen=True)
class ExecutionPage:
    executions: tuple[ExecutionSummary, ...]
    #: pass back to get the next page; None on the last page
    cursor: str | None


@dataclass(frozen=True)
class StepRecord:
    """One durable step of the current run, with its outcome.

    ``state``: ok, failed, cancelled, timed out, waiting (sleep/signal), running, pending,
    recorded (inline value), or corrupt.
    """

    seq: int
    kind: str
    name: str
    state: str
    attempts: int | None = None
    task_id: str | None = None
    child_id: str | None = None
    scheduled_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    value: Any = None
    error: str | None = None
    corrupt: str | None = None
    #: what the step was called with, as recorded (an activity's ``{"args": [...], "kwargs": {...}}``)
    input: Any = None
    #: the stored traceback of its error (the innermost frames: the line that raised)
    traceback: str | None = None
    #: a timer's fire time, a signal wait's timeout
    deadline: float | None = None
    #: an activity's last failed attempt's end and when the next may start (its backoff)
    failed_at: float | None = None
    retry_at: float | None = None
    #: an activity's latest ``activity.heartbeat(details)``: the details, when, from which attempt
    heartbeat: Any = None
    heartbeat_at: float | None = None
    heartbeat_attempt: int | None = None


@dataclass(frozen=True)
class SignalRecord:
    name: str
    state: str  # consumed | rejected | ignored | pending | timed out | received
    value: Any = None
    at: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class ExecutionDetail:
    summary: ExecutionSummary
    payload: Any = None
    result: Any = None
    error: dict[str, Any] | None = None
    steps: tuple[StepRecord, ...] = ()
    signals: tuple[SignalRecord, ...] = ()
    children: tuple[str, ...] = ()
    #: documents of the partition that could not be decoded, with the reason
    corrupt: tuple[str, ...] = ()
    #: what the workflow last set with ``wf.set_status`` (None if never)
    custom_status: Any = None
    #: operators' recorded actions on the execution (``op:`` documents: who, when, reason, what
    #: they forgot), oldest first
    operations: tuple[dict[str, Any], ...] = ()
    #: the steps those actions forgot (retry, resume, reset), as they were: nothing that ran is
    #: forgotten (engine/admin/oplog.py)
    superseded: tuple[SupersededStep, ...] = ()


@dataclass(frozen=True)
class PurgeReport:
    matched: int = 0  # terminal executions older than the cutoff
    purged: int = 0
    documents: int = 0  # documents deleted
    skipped: int = 0  # changed meanwhile, a child whose parent was not told yet, an effect not admitted
    dry_run: bool = False
    #: ``"<id>: <why>"`` for the executions kept (skipped), the latest 50
    kept: tuple[str, ...] = ()


# --- decoding, in one place ------------------------------------------------------------------


def _epoch(when: datetime | float | None) -> float | None:
    """Epoch seconds of a datetime (naive means UTC) or a number."""
    if isinstance(when, datetime):
        return (when if when.tzinfo is not None else when.replace(tzinfo=UTC)).timestamp()
    return None if when is None else float(when)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(value: Any, default: int = 0) -> int:
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else default


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _err_text(err: Any) -> str | None:
    if not err:
        return None
    if isinstance(err, dict):
        return f"{err.get('type')}: {err.get('message')}"
    return str(err)


def summary_of(doc: Mapping[str, Any]) -> ExecutionSummary:
    """Decode an exec document; a malformed one comes back with ``corrupt`` set."""
    pk = str(doc.get("pk"))
    if CORRUPT_KEY in doc:
        return ExecutionSummary(id=pk, corrupt=str(doc[CORRUPT_KEY]))
    problems = [f"{k} is not a string" for k in ("workflow", "status") if not isinstance(doc.get(k), str)]
    if doc.get("status") not in STATUSES and not problems:
        problems.append(f"unknown status {doc.get('status')!r}")
    if _num(doc.get("created_at")) is None:
        problems.append("created_at is not a number")
    parent = doc.get("parent")
    return ExecutionSummary(
        id=pk,
        workflow=_str(doc.get("workflow")),
        status=_str(doc.get("status")),
        steps=_int(doc.get("steps")),
        run=_int(doc.get("run")),
        created_at=_num(doc.get("created_at")),
        updated_at=_num(doc.get("updated_at")),
        completed_at=_num(doc.get("completed_at")),
        cancel_requested=bool(doc.get("cancel_requested")),
        # an ended execution's error (failed, cancelled) is its last; a running one's last_error
        last_error=_err_text(doc.get("last_error") or doc.get("error")),
        parent=_str(parent.get("pk")) if isinstance(parent, dict) else None,
        corrupt="; ".join(problems) or None,
        search=dict(search) if isinstance(search := doc.get("search"), dict) and search else None,
        memo=doc.get("memo"),
        custom_status=doc.get("custom_status"),
        deadline_at=_num(doc.get("deadline_at")),
        start_at=_num(doc.get("start_at")),
        paused_at=(_num(doc.get("paused_at")) or 0.0) if doc.get("paused") else None,
        waiting=tuple(w for w in doc.get("waiting") or () if isinstance(w, dict))
        if doc.get("status") == "running" and isinstance(doc.get("waiting"), list)
        else (),
    )


def _step(marker: Doc, by_id: dict[str, Doc], run: int) -> StepRecord:
    seq, kind, name = int(marker["seq"]), str(marker["kind"]), str(marker["name"])
    oid = signal_outcome_id(marker, run) if kind == StepKind.SIGNAL else result_id(seq, run)
    outcome = by_id.get(oid)
    if outcome is None:
        if kind in _INLINE:
            state = "recorded"
        elif kind in (StepKind.SLEEP, StepKind.SIGNAL):
            state = "waiting"
        else:
            state = "running" if marker.get("lease") else "pending"
    elif outcome.get("cancelled"):
        state = "cancelled"
    elif outcome.get("timeout"):
        state = "timed out"
    else:
        state = "ok" if outcome.get("ok", True) else "failed"
    if kind == StepKind.EMIT:
        state = emit_state(marker)
    out = outcome or {}
    beat: dict[str, Any] = marker["heartbeat"] if isinstance(marker.get("heartbeat"), dict) else {}
    return StepRecord(
        seq=seq,
        kind=kind,
        name=name,
        state=state,
        attempts=_int(out.get("attempts", marker.get("attempts")), 0) or None,
        # a local activity runs in the drive (no task); a signal sent names its target
        task_id="local" if marker.get("local") else task_id_of(marker) if kind == StepKind.ACTIVITY else None,
        child_id=_str(marker.get("child_id")) or _str(out.get("child_id")) or _str(marker.get("target")),
        scheduled_at=_num(marker.get("created_at")),
        started_at=_num(marker.get("started_at")),
        finished_at=_num(out.get("completed_at")) or _num(out.get("fired_at")) or _num(out.get("sent_at")),
        value=marker.get("value") if kind in _INLINE else out.get("value"),
        error=_err_text(out.get("error")) or _err_text(marker.get("last_error") if outcome is None else None),
        input=marker.get("input"),
        traceback=_traceback(out.get("error")) or _traceback(marker.get("last_error") if outcome is None else None),
        deadline=_num(marker.get("fire_at")) if kind in (StepKind.SLEEP, StepKind.SIGNAL) else None,
        failed_at=_num(marker.get("failed_at")),
        retry_at=_num(marker.get("retry_at")),
        heartbeat=beat.get("details"),
        heartbeat_at=_num(beat.get("at")),
        heartbeat_attempt=_int(beat.get("attempt"), 0) or None,
    )


def _traceback(error: Any) -> str | None:
    """The traceback an error record holds (``error_info``), if any."""
    text = error.get("traceback") if isinstance(error, dict) else None
    return text if isinstance(text, str) and text.strip() else None


def _signals(docs: list[Doc], run: int) -> list[SignalRecord]:
    """The signals of run ``run``: values it settled (consumed, rejected, ignored), whichever run
    they were sent in (unconsumed values carry over), values still pending (its next waits take
    them), and its waits that timed out."""
    marks = {d.get("value_id"): d for d in docs if str(d.get("id", "")).startswith(SIGNAL_MARK_PREFIX)}
    decisions = {d.get("value_id"): d for d in docs if d.get("type") == DocType.SIGNAL and d.get("value_id")}
    out: list[tuple[float, SignalRecord]] = []
    for d in docs:
        at = _num(d.get("sent_at")) or _num(d.get("fired_at")) or _num(d.get("completed_at"))
        if d.get("type") == "signal_value":
            settled_by = marks.get(d["id"]) or decisions.get(d["id"])
            if settled_by is not None and _int(settled_by.get("run")) != run:
                continue  # settled by an earlier run
            mark = marks.get(d["id"]) or {}
            kind = str(mark.get("type", ""))
            state = "consumed" if d["id"] in decisions else kind.removeprefix("signal_") or "pending"
            why = _err_text(mark.get("error")) or _str(mark.get("reason"))
            out.append((at or 0.0, SignalRecord(str(d["name"]), state, d.get("value"), at, why)))
        elif d.get("type") == DocType.SIGNAL and not d.get("value_id") and _int(d.get("run")) == run:
            # a wait's timeout, or a value recorded directly (documents written before sgv:)
            state = "timed out" if d.get("timeout") else "received"
            out.append((at or 0.0, SignalRecord(str(d["name"]), state, d.get("value"), at, _err_text(d.get("error")))))
    return [record for _, record in sorted(out, key=lambda pair: pair[0])]


def _op_order(doc: Doc) -> str:
    return str(doc.get("id"))  # op:<n>, zero-padded: the order they were recorded in


def _payload(ex: Mapping[str, Any], by_id: Mapping[str, Doc]) -> Any:
    """The run's input as stored (inline or in its input document); ``None`` when that is missing."""
    try:
        return payload_of(ex, by_id)
    except CorruptDocument:
        return None


def describe_docs(ex: Mapping[str, Any], docs: list[Doc]) -> ExecutionDetail:
    """The timeline of the current run from a partition's documents (malformed ones flagged)."""
    summary = summary_of(ex)
    run = summary.run
    by_id = {str(d.get("id")): d for d in docs}
    steps: list[StepRecord] = []
    signals: list[SignalRecord] = []
    corrupt: list[str] = []
    current = [d for d in docs if _int(d.get("run")) == run and d.get("id") != EXEC_ID]
    for d in current:
        if d.get("type") != DocType.STEP:
            continue
        try:
            steps.append(_step(d, by_id, run))
        except (KeyError, TypeError, ValueError) as exc:
            corrupt.append(f"{d.get('id')}: malformed step document ({exc!r})")
            steps.append(StepRecord(_int(d.get("seq"), -1), "?", "?", "corrupt", corrupt=corrupt[-1]))
    try:
        signals = _signals(docs, run)
    except (KeyError, TypeError, ValueError) as exc:
        corrupt.append(f"malformed signal document ({exc!r})")
    steps.sort(key=lambda s: s.seq)
    return ExecutionDetail(
        summary=summary,
        payload=_payload(ex, by_id),
        result=ex.get("result"),
        error=ex.get("error") if isinstance(ex.get("error"), dict) else None,
        steps=tuple(steps),
        signals=tuple(signals),
        children=tuple(s.child_id for s in steps if s.kind == StepKind.CHILD and s.child_id),
        custom_status=ex.get("custom_status"),
        operations=(ops := tuple(sorted(_operations(ex, docs, by_id), key=_op_order))),
        superseded=superseded_of(ops, live_versions(docs)),
        corrupt=((summary.corrupt,) if summary.corrupt else ()) + tuple(corrupt),
    )


def _operations(ex: Mapping[str, Any], docs: Sequence[Doc], by_id: Mapping[str, Doc]) -> Iterator[Doc]:
    """The operation records, with the one of an operation cut between its batches: it is held
    in the exec's pending op until its last batch creates it, and its archive is already needed
    (the steps it forgot may be deleted)."""
    pending = ex.get(PENDING_OP)
    creates = pending.get("creates") if isinstance(pending, dict) else None
    held = [d for d in creates if isinstance(d, dict) and str(d.get("id")) not in by_id] if creates else []
    found = [*docs, *held]  # an archive's part documents are merged into its op's (oplog.py)
    ops = [d for d in found if d.get("type") == DocType.OPERATION]
    for op in with_parts(ops, [d for d in found if d.get("type") == DocType.OPERATION_PART]):
        # the record as an operator reads it: not the store's fields (partition, etag, type)
        yield {k: v for k, v in op.items() if k not in ("pk", "type") and not k.startswith("_")}
