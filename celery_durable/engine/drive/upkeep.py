"""Small writes around a drive: wake an execution, clear a step's due time, prune a finished run.

Used by timers, children, the driver and the operator's actions alike.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from celery_durable.engine.documents.checks import (
    SIGNAL_MARK_PREFIX,
    check_exec,
)
from celery_durable.engine.documents.model import (
    DUE_EXEC,
    EXEC_ID,
    settled,
)
from celery_durable.engine.documents.records import count_of, is_terminal
from celery_durable.engine.documents.schema import run_prefixes
from celery_durable.engine.documents.update_docs import PUBLICATION_MARK_PREFIX, publication_id
from celery_durable.engine.drive.partition_cache import bump_generation
from celery_durable.engine.outbox.model import DUE_ADMIT
from celery_durable.errors import (
    ConflictError,
)
from celery_durable.stores.base import Doc, Op, strip_reserved

if TYPE_CHECKING:
    from celery_durable.engine.ports import EngineParts


__all__ = ["bumped", "clear_due_of_ended", "clear_due", "prune_run", "wake"]

log = logging.getLogger("celery_durable.links")


def bumped(ex: Mapping[str, Any], now: float, drive_timeout: float, **fields: Any) -> Doc:
    """The exec rewritten so that a drive follows: ``wakeups`` bumped (a drive running on an older
    copy re-reads), ``fields`` set (what was recorded with it), and due if it was not (a lost drive
    message is recovered)."""
    doc = strip_reserved(ex) | {"wakeups": count_of(ex, "wakeups") + 1} | fields
    if not ex.get("due_kind"):
        doc.update(due_kind=DUE_EXEC, due_at=now + drive_timeout)
    return doc


def wake(engine: EngineParts, execution_id: str) -> None:
    """Make sure a drive happens after now: bump the exec (so a running drive re-reads),
    keep it due (so a lost message is recovered), and send a drive."""
    eng = engine
    for _ in range(100):
        ex = check_exec(execution_id, eng.store.read(execution_id, EXEC_ID))
        if ex is None or is_terminal(ex):
            return
        try:
            eng.store.replace(bumped(ex, eng.clock.now(), eng.settings.drive_timeout), if_match=ex["_etag"])
            break
        except ConflictError:
            continue
    eng.dispatcher.send_drive(execution_id)


def clear_due(engine: EngineParts, marker: Doc) -> None:
    """Take a step marker off the due index (its clock fired or is no longer wanted); a lost race is fine."""
    if marker.get("due_kind"):
        try:
            engine.store.replace(settled(marker), marker["_etag"])
        except ConflictError:
            pass


def clear_due_of_ended(engine: EngineParts, marker: Doc, ex: Mapping[str, Any]) -> bool:
    """Take the marker of an ended execution's step off the due index in one batch with the exec
    as read (its etag, the exec written back unchanged): a reopening since (retry, resume, reset)
    fails it, and the step stays due for the reopened run (engine/admin/reopen.py). False: not
    cleared (not due, or the partition moved on)."""
    if not marker.get("due_kind"):
        return False
    try:
        engine.store.batch(
            str(marker["pk"]),
            [Op.replace(settled(marker), marker["_etag"]), Op.replace(strip_reserved(ex), ex["_etag"])],
        )
    except ConflictError:
        return False
    return True


def prune_run(engine: EngineParts, execution_id: str, old_run: int) -> None:
    """After continue-as-new, delete the previous run's step documents and the signal
    values it settled (best effort). Unsettled values stay: the new run consumes them.

    Each batch of deletes bumps the exec's ``generation``: a partition cache cannot see a
    deletion, and one holding a value without its (deleted) mark would consume it again.
    """
    eng = engine
    prefixes = run_prefixes(old_run)
    try:
        doomed: list[str] = []
        for doc in eng.store.query_partition(execution_id).docs:
            if doc.get("due_kind") == DUE_ADMIT:
                continue  # an emitted effect not admitted yet: beat's outbox scan still needs it
            if doc["id"].startswith(prefixes):
                doomed.append(doc["id"])
            elif doc["id"].startswith(SIGNAL_MARK_PREFIX) and doc.get("run") == old_run:
                doomed += [str(doc["value_id"]), doc["id"]]  # the value first
            elif doc["id"].startswith(PUBLICATION_MARK_PREFIX) and doc.get("run") == old_run:
                doomed += [publication_id(int(doc["n"])), doc["id"]]  # an activity's value, taken or dropped
        while doomed:
            chunk, rest = doomed[: eng.store.max_batch_ops - 1], doomed[eng.store.max_batch_ops - 1 :]
            ex = eng.store.read(execution_id, EXEC_ID)
            if ex is None:
                return
            ops = [Op.replace(bump_generation(ex), if_match=ex["_etag"])] + [Op.delete(i) for i in chunk]
            try:
                eng.store.batch(execution_id, ops)
            except ConflictError:
                # the exec moved on (or a document is already gone): look again
                present = {d["id"] for d in eng.store.query_partition(execution_id).docs}
                doomed = [i for i in doomed if i in present]
                continue
            doomed = rest
    except Exception:  # leftovers are harmless: ids of an old run are never read again
        log.warning("pruning run %d of %s failed", old_run, execution_id, exc_info=True)
