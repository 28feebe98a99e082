"""A purge that cannot be cut: recorded in its first batch, finished by whoever comes next (issue 23).

A purge deletes a partition in batches of the store's size, the exec document last. Its record
(who, when, why: engine/admin/oplog.py ``purge_record``) is created in the *first* batch, with the exec
marked ``purging`` (its ``generation`` bumped, due at ``drive_timeout``): a kill or a store error
after it leaves the record and a mark that everyone who touches the execution honours by
finishing the purge (:func:`finish_purge`: the admin's operations through
``pending_ops.settle``, the driver before it drives, the recovery scan), never by operating on the
cut history. Purge records are never deleted by a purge: an id used again and purged again keeps
the record of every purge. An execution that fits in one batch is deleted in that one batch, its
record with it (atomic as it stands).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.records import ExecDoc
from celery_durable.engine.documents.schema import EXEC_ID, DueKind
from celery_durable.engine.drive.partition_cache import bump_generation
from celery_durable.errors import ConflictError
from celery_durable.stores.base import Doc, Op

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts as Engine

__all__ = ["PURGING", "RECORD_TYPE", "finish_purge", "purge_partition", "record_id"]

log = logging.getLogger("celery_durable.operations")

#: the exec field marking a purge whose first batch committed
PURGING = "purging"
#: the type (and the first id) of a purge's record document; later purges of the id: ``purged:<n>``
RECORD_TYPE = "purged"


def record_id(docs: Iterable[Doc]) -> str:
    """The id of a new purge record in a partition holding ``docs``: ``purged`` for the first,
    ``purged:<n>`` after it (a purge of an id used again, a forgotten child's pointer): none
    is ever written over another (``reruns.reborn`` reads them all)."""
    docs = list(docs)
    ids = {d["id"] for d in docs}
    n = 1 + sum(1 for d in docs if d.get("type") == RECORD_TYPE)
    while (rid := RECORD_TYPE if n == 1 else f"{RECORD_TYPE}:{n}") in ids:
        n += 1
    return rid


def _doomed(docs: list[Doc]) -> list[Doc]:
    """What a purge deletes of a partition: everything but the exec document and purge records."""
    return [d for d in docs if d["id"] != EXEC_ID and d.get("type") != RECORD_TYPE]


def purge_partition(eng: Engine, ex: ExecDoc, docs: list[Doc], record: Doc | None) -> int:
    """Delete the partition ``docs`` of the terminal execution ``ex`` (as read with it), creating
    ``record`` (None: no record, a forgotten child) in the first batch; how many documents went.
    Raises ConflictError when the first batch found the execution changed (nothing written)."""
    store, pk = eng.store, str(ex["pk"])
    others = _doomed(docs)
    creates = [] if record is None else [Op.create(record | {"documents": len(others) + 1})]
    room = store.max_batch_ops - 1 - len(creates)
    try:
        if len(others) <= room:
            store.batch(
                pk, [*(Op.delete(d["id"], d["_etag"]) for d in others), *creates, Op.delete(EXEC_ID, ex["_etag"])]
            )
            _log(record, len(others) + 1)
            return len(others) + 1
        first, rest = others[:room], others[room:]
        mark = bump_generation(ex) | {
            PURGING: True,
            "due_kind": DueKind.EXEC,  # the recovery scan finishes it if nobody else does
            "due_at": eng.clock.now() + eng.settings.drive_timeout,
        }
        etag = store.batch(
            pk, [*(Op.delete(d["id"], d["_etag"]) for d in first), *creates, Op.replace(mark, ex["_etag"])]
        )
    finally:
        eng.cache.invalidate(pk)
    try:
        _rest(eng, mark | {"_etag": etag[-1]}, rest)
    except ConflictError:
        finish_purge(eng, pk)  # something wrote meanwhile: read again and finish (or whoever comes next)
    _log(record, len(others) + 1)
    return len(others) + 1


def _log(record: Doc | None, documents: int) -> None:
    if record is not None:
        what = f"{record.get('workflow')}, {record.get('status')}, {documents} documents"
        log.info("purged %s (%s) by %s", record["pk"], what, record.get("by"))


def _rest(eng: Engine, ex: Mapping[str, Any], others: list[Doc]) -> None:
    """The batches after the first: deletes (the exec etag-chained, still marked), the exec last."""
    store, pk = eng.store, str(ex["pk"])
    room = store.max_batch_ops - 1
    try:
        while len(others) > room:
            chunk, others = others[:room], others[room:]
            new = bump_generation(ex)
            etag = store.batch(pk, [*(Op.delete(d["id"], d["_etag"]) for d in chunk), Op.replace(new, ex["_etag"])])
            ex = new | {"_etag": etag[-1]}
        store.batch(pk, [*(Op.delete(d["id"], d["_etag"]) for d in others), Op.delete(EXEC_ID, ex["_etag"])])
    finally:
        eng.cache.invalidate(pk)


def finish_purge(eng: Engine, pk: str) -> bool:
    """Finish the purge marked on ``pk``, if there is one; whether there was. Idempotent: it
    deletes what is still there. Conflicts (a late write, another finisher) read again; a purge
    still unfinished after that stays marked for whoever comes next."""
    for _ in range(5):
        docs = eng.store.query_partition(pk).docs
        ex = next((d for d in docs if d["id"] == EXEC_ID), None)
        if ex is None or not ex.get(PURGING):
            return False
        try:
            _rest(eng, ex, _doomed(docs))
            return True
        except ConflictError:
            continue
    return True
