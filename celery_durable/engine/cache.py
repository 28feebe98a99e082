"""Per-process cache of execution partitions, so a drive reads only what is new.

Replay re-runs a workflow from the top, but the history it needs is fetched incrementally:
``query_partition(pk, since=cursor)`` returns only documents changed after the last read
(backends may repeat a few; we merge by id). A 1,000-step workflow therefore costs O(n)
documents transferred, not O(n²).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Any

from ..stores.base import Doc, Store

__all__ = ["PartitionCache"]


class PartitionCache:
    def __init__(self, store: Store, max_entries: int = 512) -> None:
        self._store = store
        self._max = max_entries
        self._lock = threading.Lock()
        # pk -> (cursor, docs, monotonic time of the read)
        self._entries: OrderedDict[str, tuple[Any, dict[str, Doc], float]] = OrderedDict()

    def load(self, pk: str) -> dict[str, Doc]:
        """Every document of the partition, current as of this call (copy-on-write dict)."""
        with self._lock:
            entry = self._entries.get(pk)
        if entry is None:
            read = self._store.query_partition(pk)
            docs = {d["id"]: d for d in read.docs}
        else:
            cursor, cached, _ = entry
            read = self._store.query_partition(pk, since=cursor)
            docs = dict(cached)
            for d in read.docs:
                docs[d["id"]] = d
        with self._lock:
            self._entries[pk] = (read.cursor, docs, time.monotonic())
            self._entries.move_to_end(pk)
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return docs

    def peek(self, pk: str, max_age: float) -> dict[str, Doc] | None:
        """The cached partition if it was read less than ``max_age`` seconds ago, without a read.

        Safe for a drive: its commit is conditional on the exec etag, and every write a drive
        must see changes the exec document, so a stale copy only costs a retried batch.
        """
        with self._lock:
            entry = self._entries.get(pk)
        if entry is None or time.monotonic() - entry[2] > max_age:
            return None
        return entry[1]

    def put(self, pk: str, doc: Doc) -> None:
        """Record our own write (with its new ``_etag``) in the cached partition."""
        with self._lock:
            entry = self._entries.get(pk)
            if entry is not None:
                docs = dict(entry[1])
                docs[doc["id"]] = doc
                self._entries[pk] = (entry[0], docs, entry[2])

    def invalidate(self, pk: str | None = None) -> None:
        with self._lock:
            if pk is None:
                self._entries.clear()
            else:
                self._entries.pop(pk, None)
