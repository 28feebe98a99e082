"""Crash-safe operator rewrites (retry, resume, reset): all of it, or a recorded op that is rolled forward.

An operation that rewrites more than one batch of a partition used to write its delete batches
first and reopen the execution last: a store error or a kill in between left the history cut
and nothing saying so (a later retry re-ran every forgotten activity). Now:

- every input and every document the operation will write is checked before the first write
  (:func:`check_storable`, the admin's own argument checks): a bad input writes nothing;
- the first batch writes, with the exec document (etag-guarded, ``generation`` bumped) a
  ``pending_op`` field: what is left to do (the ids to delete, the field changes of the markers
  to re-arm, the documents to create, the exec fields that reopen it), so finishing needs no
  re-planning on a half-rewritten history;
- every later batch is idempotent (deletes what is still there, re-arms what is not yet) and
  etag-chained on the exec; the last one reopens the execution and clears ``pending_op``;
- whoever finds a pending op finishes it first (:func:`finish`): the next admin call on the
  execution, the driver before it drives, and the recovery scan (the exec is due at
  ``drive_timeout`` after the op started). The exec stays terminal until the last batch, so no
  drive runs on a half-done history.

An operation that fits in one batch is written in that one batch, as before (atomic already),
unless it forgets or reopens child executions: those happen between its first batch (the record,
the children's archive with it) and its last, by whoever finishes it (engine/admin/child_ops.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from celery_durable.engine.admin.child_ops import run_children
from celery_durable.engine.admin.purge import PURGING, finish_purge
from celery_durable.engine.documents.records import ExecDoc, as_exec, maybe_exec
from celery_durable.engine.documents.schema import EXEC_ID, PENDING_OP, DueKind
from celery_durable.engine.drive.partition_cache import bump_generation
from celery_durable.errors import ConfigurationError, ConflictError, DocumentTooLarge, PayloadValidationError
from celery_durable.stores.base import RESERVED, Doc, Op, encode_doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts as Engine

__all__ = [
    "PENDING",
    "check_field",
    "check_inputs",
    "check_purge",
    "check_signal_name",
    "check_storable",
    "commit",
    "finish",
    "finish_loaded",
    "settle",
]

PENDING: Final = PENDING_OP  # the exec field holding an operation's unfinished rest
#: the longest ``by`` and ``reason`` an operation records (refused beyond: never truncated)
MAX_BY, MAX_REASON = 256, 4096


def check_inputs(refuse: type[Exception], execution_id: object, **fields: object) -> None:
    """Refuse (``refuse``) what an operation could not record as given, before it reads anything."""
    if not isinstance(execution_id, str) or not execution_id:
        raise refuse(f"execution_id must be a non-empty string, not {execution_id!r}")
    for name, value in fields.items():
        check_field(refuse, name, value)


def check_field(refuse: type[Exception], name: str, value: object) -> None:
    """``by`` (a non-empty string) or ``reason`` (None or a string), within its length: refused
    (``refuse``), never truncated."""
    limit = MAX_BY if name == "by" else MAX_REASON
    if value is None and name == "reason":
        return
    if not isinstance(value, str) or (name == "by" and not value.strip()):
        raise refuse(f"{name} must be a {'non-empty ' if name == 'by' else ''}string, not {type(value).__name__}")
    if len(value) > limit:
        raise refuse(f"{name} is {len(value)} characters long: at most {limit}")


def check_signal_name(name: object) -> None:
    """A signal's name is a non-empty string of at most ``MAX_BY`` characters (it keys documents):
    anything else is refused before anything is written (a bytes name raised a raw TypeError)."""
    if not isinstance(name, str) or not name:
        raise PayloadValidationError(f"a signal name is a non-empty string, not {name!r}")
    if len(name) > MAX_BY:
        raise PayloadValidationError(f"a signal name has at most {MAX_BY} characters, not {len(name)}")


def check_purge(refuse: type[Exception], older_than: object, dry_run: object, page_size: object) -> None:
    """Refuse purge arguments that are not what they say (a string age, a negative page size)."""
    if isinstance(older_than, bool) or not isinstance(older_than, int | float) or not older_than >= 0:
        raise refuse(f"older_than must be a number of seconds >= 0, not {older_than!r}")
    if not isinstance(dry_run, bool):
        raise refuse(f"dry_run must be True or False, not {dry_run!r}")
    if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
        raise refuse(f"page_size must be an integer >= 1, not {page_size!r}")


def check_storable(refuse: type[Exception], docs: Sequence[Doc], limit: int) -> None:
    """Refuse a rewrite any of whose documents the store would refuse (not JSON, too large):
    checked before the first batch, so the refusal writes nothing."""
    for doc in docs:
        try:
            encode_doc(doc, limit)
        except (TypeError, ValueError, ConfigurationError, DocumentTooLarge) as exc:
            raise refuse(f"document {doc.get('id')!r} of this operation cannot be stored: {exc}") from None


#: a re-armed marker's fields that make its step due: recorded even when the marker read
#: already had them, since the recovery scan may settle it (due None) from a view read before
#: the op's first batch, and a diff without them left the step with nothing due (sim seed 401).
#: Not the lease: an attempt begun since keeps its lease (a re-arm never clears a live one).
ARMED = ("due_kind", "due_at")


def _diff(old: Doc, new: Doc) -> dict[str, Any]:
    """The fields ``new`` (a re-armed marker) changes of ``old``, and its ``ARMED`` fields: all
    that finishing must redo."""
    return {k: v for k, v in new.items() if k not in RESERVED and (k in ARMED or k not in old or old[k] != v)}


def commit(
    eng: Engine,
    ex: ExecDoc,
    docs: dict[str, Doc],
    rewrite: Any,
    final: dict[str, Any],
    kind: str,
    refuse: type[Exception],
) -> str:
    """Write an operation's ``rewrite`` of ``ex``'s partition; ``final``: the exec fields that
    reopen it. Returns the operation's token (recorded as the exec's ``last_op``). Raises
    ``refuse`` (nothing written) when a document could not be stored, ConflictError when the
    execution changed first (nothing written, or the op is pending for whoever comes next)."""
    store = eng.store
    token = uuid.uuid4().hex
    final = final | {"last_op": token, PENDING: None}
    rearm = {d["id"]: _diff(docs.get(d["id"], {}), d) for d in rewrite.replaces}
    rest: dict[str, Any] = {
        "kind": kind,
        "token": token,
        "started": eng.clock.now(),
        "deletes": [d["id"] for d in rewrite.deletes],
        "rearm": rearm,
        "creates": [strip_reserved(d) for d in rewrite.creates],
        "final": final,
        # children to forget / reopen once the record is written, before it reopens (child_ops.py)
        "forget": list(getattr(rewrite, "forget", ())),
        "children": list(getattr(rewrite, "children", ())),
    }
    room = store.max_batch_ops - 1
    if len(rest["creates"]) > room:  # markers to re-arm span batches (_finish); the records do not
        raise refuse(
            f"{ex['pk']}: {len(rest['creates'])} documents to create do not fit in one batch; nothing was changed"
        )
    pending = bump_generation(ex) | {
        PENDING: rest,
        "due_kind": DueKind.EXEC,  # the recovery scan finishes it if nobody else does
        "due_at": rest["started"] + eng.settings.drive_timeout,
    }
    reopened = bump_generation(ex) | final
    planned = [*(d for d in rewrite.replaces), *rest["creates"], reopened, pending]
    check_storable(refuse, [strip_reserved(d) for d in planned], store.max_doc_bytes)
    try:
        if len(rewrite.deletes) + len(rearm) + len(rest["creates"]) <= room and not rest["forget"] + rest["children"]:
            # one batch: atomic as it stands, no pending record needed
            _last(eng, ex, docs, rest)
        else:
            first = rewrite.deletes[:room]
            ops = [Op.delete(d["id"], d["_etag"]) for d in first]
            etag = store.batch(ex["pk"], [*ops, Op.replace(pending, ex["_etag"])])[-1]
            gone = {d["id"] for d in first}
            _roll(eng, as_exec(pending | {"_etag": str(etag)}), {k: v for k, v in docs.items() if k not in gone}, token)
    finally:
        eng.cache.invalidate(ex["pk"])
    eng.limits.hold_execution(ex)  # a limited execution re-run at once holds a slot (engine/limits/workflows.py)
    return token


def _roll(eng: Engine, ex: ExecDoc, docs: dict[str, Doc], token: str) -> None:
    """Finish our own recorded op; a conflict is another finisher (the driver, the scan): read
    again and go on, or stop once it is done. Still pending after that: whoever comes next."""
    for _ in range(5):
        try:
            _finish(eng, ex, docs)
            return
        except ConflictError:
            docs = {d["id"]: d for d in eng.store.query_partition(ex["pk"]).docs}
            ex = as_exec(docs.get(EXEC_ID) or {})
            pending_op = ex.get(PENDING)
            if not isinstance(pending_op, dict) or pending_op.get("token") != token:
                return  # finished by someone else (or, never, replaced by another op)


def finish(eng: Engine, pk: str, known: Mapping[str, Any] | None = None) -> bool:
    """Finish the operation pending on ``pk``, if any; whether there was one. ``known``: its exec
    document as just read (the partition is read only when that has a pending op). A purge cut
    between its batches is finished too (engine/admin/purge.py)."""
    if known is not None and not isinstance(known.get(PENDING), dict) and not known.get(PURGING):
        return False
    docs = {d["id"]: d for d in eng.store.query_partition(pk).docs}
    ex = maybe_exec(docs.get(EXEC_ID))
    if ex is not None and ex.get(PURGING):
        finish_purge(eng, pk)
        return True
    if ex is None or not isinstance(ex.get(PENDING), dict):
        return False
    finish_loaded(eng, ex, docs)
    return True


def settle(eng: Engine, ex: ExecDoc, docs: dict[str, Doc]) -> bool:
    """Finish the op pending on ``ex`` (partition ``docs``) if there is one; whether there was
    (then read again: it changed, or a conflict says someone else is moving it on). A purge
    cut between its batches is finished, never operated on (engine/admin/purge.py)."""
    if ex.get(PURGING):
        finish_purge(eng, str(ex["pk"]))
        return True
    if not isinstance(ex.get(PENDING), dict):
        return False
    try:
        finish_loaded(eng, ex, docs)
    except ConflictError:
        pass
    return True


def finish_loaded(eng: Engine, ex: ExecDoc, docs: dict[str, Doc]) -> None:
    """Finish the operation pending on ``ex`` given its partition ``docs`` (as read with it).
    A ConflictError means someone else moved it on: read again."""
    try:
        _finish(eng, ex, docs)
    finally:
        eng.cache.invalidate(ex["pk"])
    eng.limits.hold_execution(ex)  # as the op's own process would have (idempotent)
    # the op's own process would have sent it: reopened, the execution is driven now (not only
    # when the recovery scan finds it due, drive_timeout later)
    eng.dispatcher.send_drive(ex["pk"])


def _finish(eng: Engine, ex: ExecDoc, docs: dict[str, Doc]) -> None:
    """The idempotent rest: delete what is still there (batch by batch, the exec etag-chained,
    still pending), then re-arm, create and reopen in the last batch."""
    store = eng.store
    rest: dict[str, Any] = ex[PENDING] or {}
    room = store.max_batch_ops - 1
    deletes = [docs[i] for i in rest.get("deletes", []) if i in docs and i != EXEC_ID]
    creates = [d for d in rest.get("creates", []) if d.get("id") not in docs]
    rearm = {i: f for i, f in dict(rest.get("rearm") or {}).items() if i in docs}
    body: Mapping[str, Any] = ex
    etag = str(ex["_etag"])
    while len(deletes) + len(rearm) + len(creates) > room:
        # deletes first, then re-arms (idempotent: the same fields again); the exec stays
        # terminal and pending until the last batch, so no drive sees a half re-armed history
        chunk, deletes = deletes[:room], deletes[room:]
        ops = [Op.delete(d["id"], d["_etag"]) for d in chunk]
        if not chunk and not rearm:
            break  # more records than a batch holds: commit refuses such an op (never written)
        if not chunk:
            ops = [Op.replace(strip_reserved(docs[i]) | rearm.pop(i), docs[i]["_etag"]) for i in list(rearm)[:room]]
        new = bump_generation(body)
        etag = str(store.batch(ex["pk"], [*ops, Op.replace(new, etag)])[-1])
        body = new
    run_children(eng, str(ex["pk"]), rest)
    _last(eng, as_exec({**body, "_etag": etag}), docs, rest, deletes, rearm, creates)


def _last(
    eng: Engine,
    ex: ExecDoc,
    docs: dict[str, Doc],
    rest: dict[str, Any],
    deletes: list[Doc] | None = None,
    rearm: dict[str, Any] | None = None,
    creates: list[Doc] | None = None,
) -> None:
    """The batch that reopens the execution (and clears the pending op)."""
    if deletes is None:
        deletes = [docs[i] for i in rest["deletes"] if i in docs]
    rearm = rest["rearm"] if rearm is None else rearm
    creates = rest["creates"] if creates is None else creates
    ops = [Op.delete(d["id"], d["_etag"]) for d in deletes]
    ops += [Op.replace(strip_reserved(docs[i]) | fields, docs[i]["_etag"]) for i, fields in rearm.items()]
    ops += [Op.create(d) for d in creates]
    final = bump_generation(ex) | rest["final"]
    eng.store.batch(ex["pk"], [*ops, Op.replace(final, ex["_etag"])])
