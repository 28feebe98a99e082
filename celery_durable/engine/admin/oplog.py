"""Every operator action on an execution is recorded, with what it forgot (issue 23, item 4).

An action (retry, resume, reset, cancel, a signal sent by an operator) writes an operation
document ``op:<n>`` into the execution's partition: who (``by``), when (``at``), ``reason``, the
status it found, and, for the actions that delete recorded steps so they run again, an archive of
those steps (``forgotten``: seq, kind, name, state, value or error), copied from the documents
*before* they are deleted and written with the first batch of deletes (``Admin._commit`` puts
creates first: a crash between batches leaves the record, never deletes without it; the last
batch reopens the execution). So a compensation that really ran (a refund) stays visible after
a retry: ``describe().superseded``, ``durable show``, the UI. Each document of the archive stays
far under the store's document and batch limits (entries and bytes): an archive larger than one
spills over part documents ``op:<n>.<k>`` written with it (``archive_parts``; ``describe`` merges
them). A value too large is kept as the start of its JSON text with ``value_truncated`` (never
changed silently); past ``MAX_PARTS`` documents values are shortened further, and only what
still does not fit is counted in ``forgotten_more``.

A purge deletes the whole partition but its purge records, so its record is a log line and a
small ``purged`` (``purged:<n>`` for a later purge of the same id) document created with the
purge's first batch (engine/admin/purge.py; ``describe`` of a purged id says who purged it, when).
"""

from __future__ import annotations

import functools
import getpass
import json
import logging
import socket
from collections.abc import Callable, Iterable
from types import SimpleNamespace
from typing import Any, Protocol

from celery_durable.engine.admin.pending_ops import check_field
from celery_durable.engine.admin.purge import RECORD_TYPE, record_id
from celery_durable.engine.admin.reruns import RERUNS, rerun_count
from celery_durable.engine.admin.superseded import version_of
from celery_durable.engine.admin.timeline import _int, _num, _step
from celery_durable.engine.documents.records import ExecDoc
from celery_durable.engine.documents.schema import EXEC_ID, OPERATION_PREFIX, DocType, StepKind, marker_id, operation_id
from celery_durable.errors import ConflictError, DurableError, OperationRefused
from celery_durable.stores.base import Doc, Op, strip_reserved

__all__ = [
    "TOMBSTONE_ID",
    "actor",
    "archive",
    "archived",
    "cascade",
    "children_archive",
    "cancel_ops",
    "signal_op",
    "forgotten_lines",
    "next_op",
    "note",
    "op_doc",
    "preview",
    "purge_record",
    "recorded",
    "unknown",
]

log = logging.getLogger("celery_durable.operations")

#: archived steps per operation document; the rest are counted in ``forgotten_more``
MAX_ENTRIES = 200
#: bytes of JSON the archive may take in one operation document (well under every store's limit,
#: next to the exec document and the deletes in one batch)
MAX_ARCHIVE_BYTES = 64 * 1024
#: a value whose JSON is longer is archived as its first this many characters (flagged)
MAX_VALUE_CHARS = 2000
#: documents one operation's archive may take (the op and its parts: all in its last batch)
MAX_PARTS = 8
#: the characters of a value kept when the whole archive would not fit in ``MAX_PARTS``
SHORT_VALUE_CHARS = 120
#: the id of the document a purge leaves in the emptied partition
TOMBSTONE_ID = RECORD_TYPE
#: what a forgotten child's own operation records keep in its parent's archive
_OP_KEYS = ("id", "action", "by", "at", "reason", "status")
#: a forgotten child's latest operation records its parent's archive keeps (the rest are counted)
_MAX_CHILD_OPS = 10
#: outcome documents of a step (a marker's own are found through it)
_STEP_DOCS = (DocType.STEP, DocType.RESULT, DocType.SIGNAL)


def actor() -> str:
    """Who acts when the caller does not say: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (a container): still recorded
        user = "?"
    return f"{user}@{socket.gethostname()}"


def _check_text(value: str | None, what: str) -> str | None:
    """``value`` if an operation may record it as ``what`` (the same rules as reset's: pending_ops.py)."""
    if value is not None or what == "reason":
        check_field(OperationRefused, what, value)
    return value


def _short(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with its value cut to ``SHORT_VALUE_CHARS`` of JSON text (flagged)."""
    if "value" not in entry:
        return entry
    text = entry["value"] if entry.get("value_truncated") else json.dumps(entry["value"], default=str)
    if len(text) <= SHORT_VALUE_CHARS:
        return entry
    return entry | {"value": text[:SHORT_VALUE_CHARS], "value_truncated": True}


def _entry(marker: Doc, by_id: dict[str, Doc], run: int) -> dict[str, Any]:
    step = _step(marker, by_id, run)
    entry: dict[str, Any] = {"seq": step.seq, "kind": step.kind, "name": step.name, "state": step.state, "run": run}
    entry["version"] = version_of(marker, by_id, run)  # which documents: superseded.py
    if step.error:
        entry["error"] = step.error
    if step.finished_at is not None:
        entry["finished_at"] = step.finished_at
    if step.child_id:
        entry["child_id"] = step.child_id
    if step.value is not None:
        text = json.dumps(step.value, default=str)
        if len(text) > MAX_VALUE_CHARS:
            entry.update(value=text[:MAX_VALUE_CHARS], value_truncated=True)
        else:
            entry["value"] = step.value
    return entry


def archive(
    docs: dict[str, Doc], deletes: Iterable[Doc], run: int, room: int = MAX_ARCHIVE_BYTES, parts: int = 1
) -> dict[str, Any]:
    """The ``forgotten`` fields of an operation document: the steps of run ``run`` whose marker or
    outcome is among ``deletes``, as they are in ``docs`` (read before the deletes), by step,
    taking at most ``room`` bytes of JSON a document, over at most ``parts`` documents (the
    entries past the first document's: ``spilled``, a list of lists)."""
    seqs = sorted(
        {
            _int(d.get("seq"))
            for d in deletes
            if d.get("type") in _STEP_DOCS and _int(d.get("run")) == run and isinstance(d.get("seq"), int)
        }
    )
    entries: list[dict[str, Any]] = []
    for seq in seqs:
        marker = docs.get(marker_id(seq, run))
        if marker is None:
            continue  # an outcome without its marker: nothing to name it by (never written so)
        try:
            entries.append(_entry(marker, docs, run))
        except (KeyError, TypeError, ValueError):
            entries.append({"seq": seq, "kind": "?", "name": str(marker.get("name")), "state": "corrupt", "run": run})
    if sum(len(json.dumps(e, default=str)) for e in entries) > room * parts:
        entries = [_short(e) for e in entries]  # every step kept, its value shorter
    chunks: list[list[dict[str, Any]]] = [[]]
    size, more = 0, 0
    for entry in entries:
        cost = len(json.dumps(entry, default=str))
        if len(chunks[-1]) >= MAX_ENTRIES or size + cost > room:
            if len(chunks) >= parts or cost > room:
                more += 1
                continue
            chunks.append([])
            size = 0
        chunks[-1].append(entry)
        size += cost
    out: dict[str, Any] = {"forgotten": chunks[0], "forgotten_more": more}
    return out | ({"spilled": chunks[1:]} if parts > 1 else {})


def next_op(ex: ExecDoc, docs: dict[str, Doc] | None = None) -> int:
    """The number of the next operation document: past the exec's ``operations`` counter and past
    any record in ``docs`` (one written with the first batch of an action whose later batches,
    which count it, did not happen: a crash between them)."""
    ids = [d for d in docs or () if d.startswith(OPERATION_PREFIX) and d[len(OPERATION_PREFIX) :].isdigit()]
    return max([_int(ex.get("operations")), *(int(d[len(OPERATION_PREFIX) :]) for d in ids)]) + 1


def op_doc(
    ex: ExecDoc, action: str, by: str, reason: str | None, at: float, n: int | None = None, **fields: Any
) -> Doc:
    """The operation document ``op:<n>`` for ``ex`` (``n``: by default its ``operations``
    counter + 1; the caller writes ``operations=n`` on the exec document in the same batch, or
    in the last batch of the action)."""
    return {
        "pk": ex["pk"],
        "id": operation_id(_int(ex.get("operations")) + 1 if n is None else n),
        "type": DocType.OPERATION,
        "action": action,
        "by": by,
        "at": at,
        "reason": reason,
        "run": _int(ex.get("run")),
        "status": ex.get("status"),
    } | fields


class Engine(Protocol):
    """What this module uses of the engine (a protocol: the engine imports this module)."""

    @property
    def store(self) -> Any: ...
    @property
    def clock(self) -> Any: ...
    @property
    def cache(self) -> Any: ...
    def read_exec(self, execution_id: str) -> ExecDoc: ...


class _Rewrite(Protocol):
    deletes: list[Doc]
    creates: list[Doc]
    fields: dict[str, Any]
    forget: list[str]


def recorded(
    engine: Engine,
    plan: Callable[[ExecDoc, dict[str, Doc]], Any],
    action: str,
    by: str | None,
    reason: str | None,
    **fields: Any,
) -> Callable[[ExecDoc, dict[str, Doc]], Any]:
    """``plan`` (an ``Admin`` rewrite plan) that also records the action (and ``fields``) and
    archives the steps it deletes, in the op's first batch. Inputs are checked before any write."""
    who = actor() if by is None else _check_text(by, "by")
    _check_text(reason, "reason")

    @functools.wraps(plan)  # its name is the operation's kind (pending_ops.commit)
    def plan_and_record(ex: ExecDoc, docs: dict[str, Doc]) -> Any:
        if ex.get("never_started"):  # engine/starts/dedup.py: created ended, its input unknown
            raise OperationRefused(f"{ex['pk']} was superseded before it started: it has no input to run with")
        rewrite: _Rewrite = plan(ex, docs)
        failure = ex.get("error")
        error: Any = failure
        if isinstance(failure, dict):  # the exec keeps the traceback; the record, what it was
            error = {k: v for k, v in failure.items() if k != "traceback"}
        n = next_op(ex, docs)
        op = op_doc(ex, action, str(who), reason, engine.clock.now(), n, error=error, **fields)
        rewrite.creates += archived(engine, op, docs, rewrite.deletes, _int(ex.get("run")), rewrite.forget)
        rewrite.fields["operations"] = n
        return rewrite

    return plan_and_record


def archived(
    engine: Engine, op: Doc, docs: dict[str, Doc], deletes: list[Doc], run: int, forget: list[str]
) -> list[Doc]:
    """``op`` with the archive of the steps ``deletes`` forgets (and of the finished children
    ``forget`` deletes), then the part documents its archive spilled over: the documents to
    create (all in one batch)."""
    extra = archive(docs, deletes, run, parts=MAX_PARTS)
    spilled = extra.pop("spilled", [])
    extra.update(children_archive(engine, forget, extra))
    op.update(extra, archive_parts=len(spilled))
    return [op, *(_part(op, k, chunk) for k, chunk in enumerate(spilled, 1))]


def _part(op: Doc, k: int, entries: list[dict[str, Any]]) -> Doc:
    """Part ``k`` of ``op``'s archive: forgotten steps that did not fit in the op document."""
    doc_type = DocType.OPERATION_PART
    return {"pk": op["pk"], "id": f"{op['id']}.{k}", "type": doc_type, "op": op["id"], "part": k, "forgotten": entries}


def children_archive(engine: Engine, forget: list[str], archived: dict[str, Any]) -> dict[str, Any]:
    """The ``forgotten_children`` field for the finished children an action deletes (none: no
    field), in the room the parent's own ``archived`` steps left."""
    if not forget:
        return {}
    room = max(0, MAX_ARCHIVE_BYTES - len(json.dumps(archived, default=str))) // len(forget)
    return {"forgotten_children": [_child(engine, child, room) for child in forget]}


def _child(engine: Engine, execution_id: str, room: int) -> dict[str, Any]:
    """A finished child execution the action deletes (it belonged to the forgotten steps): its
    outcome and its steps, archived in the parent's record."""
    docs = {d["id"]: d for d in engine.store.query_partition(execution_id).docs}
    ex = docs.get(EXEC_ID) or {}
    run = _int(ex.get("run"))
    steps = [d for d in docs.values() if d.get("type") == DocType.STEP and _int(d.get("run")) == run]
    out: dict[str, Any] = {"id": execution_id, "workflow": ex.get("workflow"), "status": ex.get("status")}
    error = ex.get("error")
    out["error"] = f"{error.get('type')}: {error.get('message')}" if isinstance(error, dict) else error
    # who acted on it (an operator's cancel, say): deleted with it, so recorded here
    ops = [d for d in docs.values() if d.get("type") == DocType.OPERATION]
    ops.sort(key=lambda d: _num(d.get("at")) or 0.0)
    out["operations"] = [{k: d.get(k) for k in _OP_KEYS} for d in ops[-_MAX_CHILD_OPS:]]
    if len(ops) > _MAX_CHILD_OPS:
        out["operations_more"] = len(ops) - _MAX_CHILD_OPS  # the earliest: counted, never dropped silently
    room -= len(json.dumps(out["operations"], default=str))
    return out | archive(docs, steps, run, max(0, room))


def cascade(admin: Any, child: str, parent: str, token: str | None = None) -> Callable[[ExecDoc, dict[str, Doc]], Any]:
    """The plan reopening a failed or cancelled child of a step an action re-runs, recorded
    (``by``: the parent; ``parent_op``: the parent's op ``token``) with what it forgets in the child."""
    how = "resume" if admin._status(child) == "cancelled" else "retry"
    return recorded(admin.engine, getattr(admin, f"_plan_{how}"), how, f"via parent {parent}", None, parent_op=token)


def note(
    engine: Engine, execution_id: str, action: str, by: str | None, reason: str | None = None, **fields: Any
) -> None:
    """Record an action that deletes nothing (a signal sent by an operator, a resume of a running
    execution) in its own batch: the exec's counter and the operation document together. Raises
    :class:`DurableError` when it cannot (the caller says so: a signal is delivered already)."""
    who = actor() if by is None else _check_text(by, "by")
    _check_text(reason, "reason")
    for _ in range(20):
        ex = engine.read_exec(execution_id)
        doc = op_doc(ex, action, str(who), reason, engine.clock.now(), **fields)
        body = strip_reserved(ex) | {"operations": _int(ex.get("operations")) + 1}
        try:
            engine.store.batch(execution_id, [Op.replace(body, ex["_etag"]), Op.create(doc)])
        except ConflictError:
            continue  # a drive committed meanwhile: record on the fresh exec document
        finally:
            engine.cache.invalidate(execution_id)
        log.info("%s of %s by %s", action, execution_id, who)
        return
    raise DurableError(f"could not record the {action} of {execution_id!r}: too much contention")


def cancel_ops(ex: ExecDoc, body: Doc, by: str, reason: str | None, at: float) -> list[Op]:
    """The batch that requests the cancel of ``ex`` (``body``: its updated exec document) and
    records it: who (``by``) asked and why."""
    _check_text(by, "by")
    _check_text(reason, "reason")
    body = body | {"operations": _int(ex.get("operations")) + 1}
    return [Op.replace(body, ex["_etag"]), Op.create(op_doc(ex, "cancel", by, reason, at))]


def signal_op(ex: ExecDoc, docs: dict[str, Doc], body: Doc, by: str, name: str, at: float) -> Op:
    """The operation document recording that operator ``by`` sent signal ``name`` to ``ex``,
    created in the batch that records the value (``body``: the exec's update, its counter set
    here), so a delivered signal is never left unrecorded (a separate write could fail)."""
    n = next_op(ex, docs)
    body["operations"] = n
    return Op.create(op_doc(ex, "signal", by, None, at, n, name=name))


def purge_record(ex: ExecDoc, docs: Iterable[Doc], by: str, reason: str | None, at: float) -> Doc:
    """The record of a purge of ``ex`` (``docs``: its partition), created with the purge's first
    batch (engine/admin/purge.py, which fills in ``documents``): ``purged`` for the first purge of
    the id, ``purged:<n>`` for a later one (an id used again): no purge erases another's record."""
    return {
        "pk": ex["pk"],
        "id": record_id(docs),
        "type": TOMBSTONE_ID,
        "action": "purge",
        "by": by,
        "at": at,
        "reason": reason,
        "workflow": ex.get("workflow"),
        "status": ex.get("status"),
        # the ids it took: a new life of the id counts on past them (reruns.reborn)
        RERUNS: rerun_count(ex),
    }


def unknown(engine: Engine, execution_id: str) -> str:
    """The message for an execution that does not exist: who purged it last and when, if recorded."""
    try:
        gone = [d for d in engine.store.query_partition(execution_id).docs if d.get("type") == TOMBSTONE_ID]
    except DurableError:
        gone = []
    last = max(gone, key=lambda d: (float(d.get("at") or 0.0), len(str(d["id"])), str(d["id"])), default=None)
    how = "purged" if last is None or not last.get("parent") else str(last.get("action"))
    why = "" if last is None else f" ({how} by {last.get('by')} at {last.get('at')})"
    return f"no execution with id {execution_id!r}{why}"


def forgotten_lines(docs: dict[str, Doc], deletes: list[Doc], run: int) -> list[str]:
    """What a prompt says an action will forget: one line a step; a step that completed is
    flagged as having run (a compensation, say): forgetting it does not undo what it did."""
    got = archive(docs, deletes, run)
    lines = []
    for e in got["forgotten"]:
        ran = e["state"] == "ok" and e["kind"] in (StepKind.ACTIVITY, StepKind.CHILD)
        flag = "  <- it RAN: forgetting it does not undo it" if ran else ""
        lines.append(f"  step {e['seq']} {e['name']} ({e['kind']}, {e['state']}){flag}")
    if got["forgotten_more"]:
        lines.append(f"  ... and {got['forgotten_more']} more")
    return lines


def preview(admin: Any, execution_id: str, action: str, reset: Callable[..., Any] | None = None) -> list[str]:
    """The lines :func:`forgotten_lines` gives for ``action`` ("retry", "resume", or "reset":
    ``reset(ex, docs, rewrite)`` plans it) of the execution now: the admin's plan on a fresh
    read, nothing written."""
    docs = {d["id"]: d for d in admin.engine.store.query_partition(execution_id).docs}
    ex = docs.get(EXEC_ID)
    if ex is None:
        return []
    if reset is not None:
        rewrite = SimpleNamespace(deletes=[], replaces=[], sends=[], children=[], notes=[], forget=[])
        rewrite.__dict__.update(fields={}, creates=[])
        reset(ex, docs, rewrite)
        deletes = rewrite.deletes
    else:
        deletes = (admin._plan_retry if action == "retry" else admin._plan_resume)(ex, docs).deletes
    return forgotten_lines(docs, deletes, _int(ex.get("run")))
