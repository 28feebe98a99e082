"""Per-process cache of execution partitions, so a drive reads only what is new.

Replay re-runs a workflow from the top, but the history it needs is fetched incrementally:
``query_partition(pk, since=cursor)`` returns only documents changed after the last read
(backends may repeat a few; we merge by id). A 1,000-step workflow therefore costs O(n)
documents transferred, not O(n²). Deletions are invisible to a delta read: the exec document's
``incarnation`` (new per created id) and ``generation`` (bumped by whoever deletes or rewrites
recorded documents) tell a cache its copy is of another life, and a conflicting write marks
the copy suspect (the execution may be gone).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.documents.records import count_of
from celery_durable.stores.base import Doc, Op, Store, strip_reserved

__all__ = ["Partition", "PartitionCache", "bump_generation", "lineage"]


def lineage(exec_doc: Doc | None) -> tuple[Any, Any] | None:
    """Which life of an execution a cached copy belongs to: ``(incarnation, generation)``."""
    if exec_doc is None:
        return None
    return exec_doc.get("incarnation"), exec_doc.get("generation") or 0


def bump_generation(exec_doc: Mapping[str, Any]) -> Doc:
    """A copy of the exec document (to write back) telling every cache to read the partition afresh.

    Whoever deletes or rewrites recorded documents of an execution writes this in the same
    batch as the deletes (or before them).
    """
    return strip_reserved(exec_doc) | {"generation": count_of(exec_doc, "generation") + 1}


#: serials of partition snapshots: process-wide, never reused (unlike ``id()``)
_serials = itertools.count(1)
#: how many ancestors a snapshot remembers its changes since (a chain of loads and puts no
#: check saw in between longer than this means a full check; it never means a missed one)
ANCESTRY = 8


class Partition(dict[str, Doc]):
    """A snapshot of a partition handed out by :class:`PartitionCache`: a plain dict of its
    documents (never changed once handed out: a newer snapshot is a new object) that also knows
    which ids changed since each of its last few ancestors (``changed_since``), so a check
    (``checks.check_partition``) looks at what changed since the snapshot it last checked, not at
    the whole history."""

    __slots__ = ("serial", "ancestry")

    def __init__(self, docs: dict[str, Doc], base: Partition | None = None, changed: Iterable[str] = ()) -> None:
        super().__init__(docs)
        self.serial = next(_serials)
        #: ancestor serial -> the ids changed (added or replaced) since it, newest ancestor first
        self.ancestry: dict[int, frozenset[str]] = {}
        if base is not None:
            ids = frozenset(changed)
            self.ancestry[base.serial] = ids
            for serial, since in itertools.islice(base.ancestry.items(), ANCESTRY - 1):
                self.ancestry[serial] = since | ids

    def changed_since(self, serial: int) -> frozenset[str] | None:
        """The ids added or replaced since snapshot ``serial``; ``None`` if it is not a known ancestor."""
        if serial == self.serial:
            return frozenset()
        return self.ancestry.get(serial)


class PartitionCache:
    def __init__(self, store: Store, max_entries: int = 512) -> None:
        self._store = store
        self._max = max_entries
        self._lock = threading.Lock()
        # pk -> (cursor, docs, monotonic time of the read)
        self._entries: OrderedDict[str, tuple[Any, Partition, float]] = OrderedDict()
        self._suspect: set[str] = set()

    def load(self, pk: str) -> Partition:
        """Every document of the partition, current as of this call (copy-on-write dict).

        A delta read cannot show deletions, so whoever deletes recorded documents bumps the
        exec document's ``generation`` (a re-created id has a new ``incarnation``): when the
        exec we end up with is not the one we cached, or there is none, we read everything.
        """
        with self._lock:
            entry = self._entries.get(pk)
            suspect = pk in self._suspect
            self._suspect.discard(pk)
        docs: Partition | None = None
        if entry is not None:
            cursor, cached, _ = entry
            read = self._store.query_partition(pk, since=cursor)
            fresh = {d["id"]: d for d in read.docs}
            ex = fresh.get(EXEC_ID, cached.get(EXEC_ID))
            same_life = ex is not None and lineage(ex) == lineage(cached.get(EXEC_ID))
            # after a conflict, an exec document the delta does not show may be gone
            if same_life and not (suspect and EXEC_ID not in fresh):
                docs = Partition(cached, cached, fresh)  # what a delta repeats counts as changed
                docs.update(fresh)
        if docs is None:
            read = self._store.query_partition(pk)
            docs = Partition({d["id"]: d for d in read.docs})
        with self._lock:
            self._entries[pk] = (read.cursor, docs, time.monotonic())
            self._entries.move_to_end(pk)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return docs

    def suspect(self, pk: str) -> None:
        """A write against the cached copy conflicted: unless the next delta read shows a new
        exec document, it re-reads everything (the execution may have been deleted)."""
        with self._lock:
            if pk in self._entries:
                self._suspect.add(pk)

    def peek(self, pk: str, max_age: float) -> Partition | None:
        """The cached partition if it was read less than ``max_age`` seconds ago, without a read.

        Safe for a drive: its commit is conditional on the exec etag, and every write a drive
        must see changes the exec document, so a stale copy only costs a retried batch.
        """
        with self._lock:
            entry = self._entries.get(pk)
            if pk in self._suspect:
                return None
        if entry is None or time.monotonic() - entry[2] > max_age:
            return None
        return entry[1]

    def put(self, pk: str, doc: Doc) -> None:
        """Record our own write (with its new ``_etag``) in the cached partition."""
        with self._lock:
            entry = self._entries.get(pk)
            if entry is not None:
                docs = Partition(entry[1], entry[1], (doc["id"],))
                docs[doc["id"]] = doc
                self._entries[pk] = (entry[0], docs, entry[2])

    def committed(self, pk: str, ops: Sequence[Op], etags: Sequence[str | None]) -> None:
        """Record a batch this process committed (``etags``: what the store returned): the
        documents as written, with their new etags, so the read that follows its own commit
        (an eager activity's begin, the inline drive) finds them without a store call. Only
        into a copy that was current before the batch: the batch was conditional on the exec
        etag that copy holds, so nothing else changed in between that a drive must see (every
        such write changes the exec document)."""
        based_on = next((op.if_match for op in ops if op.doc_id == EXEC_ID and op.kind == "replace"), None)
        with self._lock:
            entry = self._entries.get(pk)
            if entry is None or pk in self._suspect:
                return
            cached_ex = entry[1].get(EXEC_ID)
            if based_on is None or cached_ex is None or cached_ex.get("_etag") != based_on:
                return  # the batch was not decided on this copy: the next load reads
            docs = Partition(entry[1], entry[1], (op.doc_id for op in ops))
            for op, etag in zip(ops, etags, strict=True):
                if op.kind == "delete" or op.doc is None:
                    docs.pop(op.doc_id, None)
                elif etag is not None:
                    docs[op.doc_id] = strip_reserved(op.doc) | {"_etag": etag}
            self._entries[pk] = (entry[0], docs, time.monotonic())
            self._entries.move_to_end(pk)

    def invalidate(self, pk: str | None = None) -> None:
        with self._lock:
            if pk is None:
                self._entries.clear()
                self._suspect.clear()
            else:
                self._entries.pop(pk, None)
                self._suspect.discard(pk)
