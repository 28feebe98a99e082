"""Failing an execution on a document the engine cannot read: a clear error, nothing else lost.

The documents stay as they are for inspection; the offending one leaves every scan, so recovery
keeps running for everyone else (docs/architecture.md §4, "Values").
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.model import DUE_EXEC, EXEC_ID, FAILED, error_info, settled
from celery_durable.engine.documents.records import is_terminal
from celery_durable.errors import ConflictError, CorruptDocument
from celery_durable.stores.base import Doc, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts

__all__ = ["fail_corrupt", "parent_link"]

log = logging.getLogger("celery_durable.drive")


def parent_link(ex: Mapping[str, Any]) -> dict[str, Any] | None:
    parent = ex.get("parent")
    if isinstance(parent, dict) and isinstance(parent.get("pk"), str) and isinstance(parent.get("seq"), int):
        return parent
    return None


def _salvaged(ex: Mapping[str, Any]) -> Doc:
    """A malformed exec reduced to the fields we can trust, its old body kept for inspection."""
    kept: Doc = {k: ex[k] for k in ("pk", "id", "type", "created_at", "payload") if k in ex}
    if isinstance(ex.get("payload_at"), str):  # its input document stays: still named
        kept["payload_at"] = ex["payload_at"]
    kept.update(workflow=ex["workflow"] if isinstance(ex.get("workflow"), str) else "?", parent=parent_link(ex))
    kept.update(run=ex["run"] if isinstance(ex.get("run"), int) and not isinstance(ex["run"], bool) else 0)
    return kept | {"malformed": ex}


def fail_corrupt(engine: EngineParts, execution_id: str, error: Exception) -> None:
    """Fail the execution owning a document the engine cannot read, with a clear error.

    ``error`` is a :class:`CorruptDocument` (a :class:`MalformedDocument` names its partition
    and document). The documents stay as they are for inspection (a malformed exec keeps its
    old body under ``malformed``); the offending one leaves every scan, so recovery keeps
    running for everyone else, and a parent is told as for any failure. A finished execution
    is never changed: only the offending document is taken out of the scans.
    """
    eng = engine
    store = eng.store
    pk = str(getattr(error, "pk", None) or execution_id)
    doc_id = getattr(error, "doc_id", None)
    now = eng.clock.now()
    info = error_info(error)
    if isinstance(error, CorruptDocument):
        info["type"] = CorruptDocument.__name__  # the public name, whatever the subclass
    fields: Doc = {
        "status": FAILED,
        "error": info,
        "lease": None,
        "completed_at": now,
        "due_kind": None,
        "due_at": None,
    }
    workflow = "?"
    for _ in range(10):
        try:
            ex = store.read(pk, EXEC_ID)
        except CorruptDocument:  # not even JSON: replace it
            ex = None
            store.upsert({"pk": pk, "id": EXEC_ID, "type": "exec", "workflow": "?"} | fields)
            break
        if ex is None:
            log.error("corrupt document in %s, which has no execution: %s", pk, error)
            return
        if is_terminal(ex):
            _settle_doc(engine, pk, doc_id)
            log.error("finished execution %s has a corrupt document: %s", pk, error)
            return
        body = _salvaged(strip_reserved(ex)) if doc_id == EXEC_ID else strip_reserved(ex)
        workflow = str(body.get("workflow", "?"))
        if parent_link(body) is not None:
            # stays due until the parent has been told (recovery retries a lost notice)
            fields.update(parent_notified=False, due_kind=DUE_EXEC, due_at=now + eng.settings.drive_timeout)
        try:
            store.replace(body | fields, if_match=ex["_etag"])
            break
        except ConflictError:
            continue
    else:
        log.error("could not mark %s failed (contention): %s", pk, error)
        return
    log.error("execution %s failed: %s", pk, error)
    if doc_id not in (None, EXEC_ID):
        _settle_doc(engine, pk, doc_id)
    eng.cache.invalidate(pk)
    eng.emit("workflow_failed", execution_id=pk, workflow=workflow)
    eng.limits.release_execution(body)  # its limit's slot, if it held one (never raises)
    if fields.get("parent_notified") is False:
        try:
            eng.children.notify_parent(pk)
        except Exception:  # recovery tells the parent later: the child stays due
            log.warning("telling the parent of %s failed", pk, exc_info=True)


def _settle_doc(engine: EngineParts, pk: str, doc_id: str | None) -> None:
    """Best effort: take a (malformed) document out of every scan, leaving it otherwise as is."""
    if doc_id is None:
        return
    try:
        doc = engine.store.read(pk, doc_id)
        if doc is not None and doc.get("due_kind") is not None:
            engine.store.replace(settled(doc), if_match=doc["_etag"])
    except Exception:  # the scan finds it again, and fails nothing more: the execution has ended
        log.warning("could not settle %s/%s", pk, doc_id, exc_info=True)
