"""Small shared helpers of the engine: clock, lease checks, error info, worker identity.

Ids, statuses and due kinds are defined in :mod:`.schema` (re-exported here).
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from celery_durable.engine.documents.records import lease_of, run_of
from celery_durable.engine.documents.schema import (
    EXEC_ID,
    TERMINAL,
    DocType,
    DueKind,
    Status,
    input_id,
    marker_id,
    parse_step_id,
    result_id,
    signal_id,
)
from celery_durable.errors import ConflictError, CorruptDocument
from celery_durable.settings import Settings
from celery_durable.stores.base import Doc, Op, Store, strip_reserved

__all__ = [
    "run_of",
    "Attempt",
    "new_exec_doc",
    "split_payload",
    "create_with_input",
    "create_exec",
    "payload_of",
    "INLINE_PAYLOAD",
    "EXEC_ID",
    "RUNNING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TERMINAL",
    "Clock",
    "Settings",
    "SystemClock",
    "marker_id",
    "result_id",
    "error_info",
    "worker_identity",
    "lease_live",
    "settled",
    "signal_id",
    "parse_step_id",
    "DUE_EXEC",
    "DUE_ACTIVITY",
    "DUE_CLOCK",
    "DUE_CHILD",
]

# Statuses, due kinds and id formats live in .schema; these names stay for the engine's modules.
RUNNING = Status.RUNNING
COMPLETED = Status.COMPLETED
FAILED = Status.FAILED
CANCELLED = Status.CANCELLED
DUE_EXEC = DueKind.EXEC
DUE_ACTIVITY = DueKind.ACTIVITY
DUE_CLOCK = DueKind.CLOCK
DUE_CHILD = DueKind.CHILD


@dataclass
class Attempt:
    """A running attempt that holds the step's lease (renewed by the heartbeat)."""

    execution_id: str
    seq: int
    name: str
    etag: str
    holder: str
    number: int
    run: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    lost: bool = False
    #: the token of the marker it began on (engine/activities/delivery.py): its outcome completes only that marker
    token: str | None = None
    #: the details an earlier attempt sent with ``activity.heartbeat`` (engine/activities/context.py)
    heartbeat_details: Any = None
    #: the limit whose slot it holds (the marker's ``limit``), until it gives it back (engine/limits/)
    limit: dict[str, Any] | None = None


class Clock(Protocol):
    """Wall-clock time in epoch seconds; the testing environment swaps in a fake one."""

    def now(self) -> float: ...


class SystemClock:
    def now(self) -> float:
        return time.time()


def error_info(exc: BaseException, attempts: int | None = None) -> dict[str, Any]:
    """What we store about an exception: type name, message, a short traceback."""
    info: dict[str, Any] = {
        "type": type(exc).__name__,
        "message": str(exc),
        # the innermost frames: the line that raised, not the worker's machinery above it
        "traceback": "".join(traceback.format_exception(exc, limit=-12))[-4000:],
    }
    if attempts is not None:
        info["attempts"] = attempts
    return info


_identity_lock = threading.Lock()
_identity: tuple[int, str] | None = None


def worker_identity() -> str:
    """A lease-holder id unique to this process (recomputed after fork)."""
    global _identity
    with _identity_lock:
        pid = os.getpid()
        if _identity is None or _identity[0] != pid:
            _identity = (pid, f"{socket.gethostname()}:{pid}:{uuid.uuid4().hex[:8]}")
        return _identity[1]


def settled(doc: Mapping[str, Any]) -> Doc:
    """A copy to write back with no lease and out of every scan (the step or exec is done): the
    fields go rather than hold ``null`` (a settled marker is written with every step; a missing
    field reads as ``None`` everywhere: ``doc.get``, the stores' due columns and queries)."""
    doc = strip_reserved(doc)
    for key in ("lease", "due_kind", "due_at"):
        doc.pop(key, None)
    return doc


def lease_live(doc: Mapping[str, Any], now: float) -> bool:
    """Whether the document's lease is held and not expired."""
    lease = lease_of(doc)
    return lease is not None and "expires" in lease and float(lease["expires"]) > now


def new_exec_doc(
    eid: str,
    workflow: str,
    payload: dict[str, Any],
    parent: dict[str, Any] | None,
    signals: list[str] | None,
    now: float,
    **fields: Any,
) -> Doc:
    """A new execution document (``fields`` override the running defaults; docs/architecture.md §5)."""
    doc: Doc = {
        "pk": eid,
        "id": EXEC_ID,
        "type": "exec",
        "workflow": workflow,
        "run": 0,
        # a re-created id is another life: caches holding the old one re-read (engine/drive/partition_cache.py)
        "incarnation": uuid.uuid4().hex,
        "generation": 0,
        "payload": payload,
        "parent": parent,
        # the declared signal names, so a sender that does not know the workflow refuses others
        "signals": signals,
        "status": RUNNING,
        "cancel_requested": False,
        "result": None,
        "error": None,
        "lease": None,
        "wakeups": 0,
        "drives": 0,
        "steps": 0,
        "created_at": now,
        "updated_at": now,
        "due_kind": None,
        "due_at": None,
    }
    doc.update(fields)
    return doc


#: An input up to this many characters of compact JSON rides in the exec document; a larger one
#: is a document of its own (``in:payload``), written once per run. Why: every step rewrites the
#: exec, and a copy of the input in each rewrite costs what its size costs (on Cosmos ~5.5 RU per
#: KB written, bench/cosmos_ru.py; on PostgreSQL a row version that size). Below this a Cosmos
#: write of the exec costs its minimum anyway, and a start writes one document, not two.
INLINE_PAYLOAD = 512


def split_payload(ex: Mapping[str, Any]) -> tuple[Doc, Doc | None]:
    """``ex`` with its ``payload`` moved into its run's input document when larger than
    :data:`INLINE_PAYLOAD` (``payload_at`` names it), and that document; ``None``: inline."""
    doc = dict(ex)
    payload = doc.get("payload")
    if not isinstance(payload, dict):
        return doc, None
    if len(json.dumps(payload, separators=(",", ":"), ensure_ascii=False)) <= INLINE_PAYLOAD:
        doc.pop("payload_at", None)  # a continued run's small input: back inline
        return doc, None
    run = run_of(doc)
    ref = input_id(run)
    del doc["payload"]
    doc["payload_at"] = ref
    return doc, {"pk": doc["pk"], "id": ref, "type": DocType.INPUT.value, "run": run, "payload": payload}


def payload_of(ex: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The run's input ``{"args", "kwargs"}``: the exec's own, or the document it names among
    ``docs`` (its partition). :class:`CorruptDocument` when that document is missing."""
    ref = ex.get("payload_at")
    if not isinstance(ref, str):
        payload = ex.get("payload")
        return payload if isinstance(payload, dict) else {}
    doc = docs.get(ref)
    payload = None if doc is None else doc.get("payload")
    if not isinstance(payload, dict):
        raise CorruptDocument(f"execution {ex.get('pk')!r}: its input document {ref!r} is missing")
    return payload


def create_exec(store: Store, doc: Doc, others: Sequence[Doc] = ()) -> dict[str, Doc] | None:
    """Create the new exec document ``doc`` (create-only), a large input apart and ``others`` (its
    deadline and start clocks: engine/starts/deadlines.py) in the same batch (:func:`split_payload`):
    the documents as written, with their etags (what a drive that follows at once knows of the
    partition); ``None`` when the id exists."""
    doc, input_doc = split_payload(doc)
    rest = [*([] if input_doc is None else [input_doc]), *others]
    if not rest:
        etag = store.create(doc)
        return None if etag is None else {EXEC_ID: doc | {"_etag": etag}}
    etags = create_with_input(store, str(doc["pk"]), doc, *rest)
    if etags is None:
        return None
    return {d["id"]: d | {"_etag": etag} for d, etag in zip([doc, *rest], etags, strict=True) if etag is not None}


def create_with_input(store: Store, eid: str, doc: Doc, *input_docs: Doc) -> list[str | None] | None:
    """Create the exec ``doc`` and its input document (and clocks) in one batch (the exec never
    names an input that is not there); their etags, or ``None`` when the exec exists. All
    create-only: an unconditional write costs the offloading store a read. An input document with
    no exec (left by nothing the engine writes, but a hand-deleted exec) is overwritten, never joined."""
    try:
        return store.batch(eid, [Op.create(doc), *map(Op.create, input_docs)])
    except ConflictError:
        if store.read(eid, EXEC_ID) is not None:
            return None
    try:
        return store.batch(eid, [Op.create(doc), *map(Op.upsert, input_docs)])
    except ConflictError:
        return None  # created meanwhile
