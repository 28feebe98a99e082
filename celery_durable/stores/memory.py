"""An in-process store for engine unit tests only (like dramatiq's StubBroker).

It keeps everything in one dict behind a lock, so it is not shared between processes and
is not durable. Do not use it for anything but tests.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from typing import Any

from celery_durable.errors import ConflictError
from celery_durable.stores.base import (
    Doc,
    DueRef,
    ExecFilter,
    ExecPage,
    Op,
    PartitionRead,
    Rewrite,
    Store,
    check_ids,
    check_page_size,
    created_key,
    decode_keyset,
    due_fields,
    encode_doc,
    encode_keyset,
    exec_matches,
    rewritten,
    strip_reserved,
)
from celery_durable.stores.op_checks import check_ops

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    """Thread-safe in-memory implementation of the storage contract."""

    cross_partition = True

    def __init__(self) -> None:
        self._lock = threading.RLock()
        # pk -> id -> (seq, body); seq doubles as etag and as change cursor
        self._parts: dict[str, dict[str, tuple[int, Doc]]] = {}
        self._seq = 0
        #: every call counted by operation name; tests use it to check round trips
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _next(self) -> int:
        self._seq += 1
        return self._seq

    @staticmethod
    def _out(seq: int, body: Doc) -> Doc:
        doc = copy.deepcopy(body)
        doc["_etag"] = str(seq)
        return doc

    def read(self, pk: str, doc_id: str) -> Doc | None:
        with self._lock:
            self._count("read")
            entry = self._parts.get(pk, {}).get(doc_id)
            return None if entry is None else self._out(*entry)

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        wanted = check_ids(ids)
        if not wanted:
            return []
        with self._lock:
            self._count("read_many")
            part = self._parts.get(pk, {})
            return [None if (entry := part.get(doc_id)) is None else self._out(*entry) for doc_id in wanted]

    def create(self, doc: Doc) -> str | None:
        encode_doc(doc, self.max_doc_bytes)
        with self._lock:
            self._count("create")
            part = self._parts.setdefault(doc["pk"], {})
            if doc["id"] in part:
                return None
            seq = self._next()
            part[doc["id"]] = (seq, copy.deepcopy(strip_reserved(doc)))
            return str(seq)

    def replace(self, doc: Doc, if_match: str | None) -> str:
        encode_doc(doc, self.max_doc_bytes)
        with self._lock:
            self._count("replace")
            return self._replace(doc, if_match)

    def _replace(self, doc: Doc, if_match: str | None) -> str:
        part = self._parts.get(doc["pk"], {})
        entry = part.get(doc["id"])
        if entry is None:
            raise ConflictError(f"{doc['id']!r} does not exist")
        if if_match is not None and str(entry[0]) != if_match:
            raise ConflictError(f"{doc['id']!r} changed since it was read")
        seq = self._next()
        part[doc["id"]] = (seq, copy.deepcopy(strip_reserved(doc)))
        return str(seq)

    def upsert(self, doc: Doc) -> str:
        encode_doc(doc, self.max_doc_bytes)
        with self._lock:
            self._count("upsert")
            seq = self._next()
            self._parts.setdefault(doc["pk"], {})[doc["id"]] = (seq, copy.deepcopy(strip_reserved(doc)))
            return str(seq)

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        with self._lock:
            self._count("delete")
            part = self._parts.get(pk, {})
            entry = part.get(doc_id)
            if entry is None:
                return False
            if if_match is not None and str(entry[0]) != if_match:
                raise ConflictError(f"{doc_id!r} changed since it was read")
            del part[doc_id]
            return True

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        with self._lock:
            self._count("query_partition")
            after = int(since or 0)
            docs = [self._out(s, b) for s, b in self._parts.get(pk, {}).values() if s > after]
            return PartitionRead(docs=docs, cursor=self._seq)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        self._check_batch(pk, ops)
        with self._lock:
            self._count("batch")
            self._validate(pk, ops)
            return self._apply(pk, ops)

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        self._check_rewrites(pk, ops, also)
        self._check_batch(pk, ops)
        with self._lock:
            self._count("batch_with")
            self._validate(pk, ops)
            # Rewrites never touch an op's document, so each reads what it would read after the
            # ops: every update runs (and may raise) before anything is applied.
            new: list[Doc | None] = []
            for rewrite in also:
                entry = self._parts.get(rewrite.pk, {}).get(rewrite.id)
                body = rewrite.update(None if entry is None else self._out(*entry))
                if body is not None:
                    body = rewritten(rewrite, body)
                    encode_doc(body, self.max_doc_bytes)
                new.append(body)
            out = self._apply(pk, ops)
            etags: list[str | None] = []
            for rewrite, body in zip(also, new, strict=True):
                if body is None:
                    etags.append(None)
                    continue
                seq = self._next()
                self._parts.setdefault(rewrite.pk, {})[rewrite.id] = (seq, copy.deepcopy(body))
                etags.append(str(seq))
        for rewrite, etag in zip(also, etags, strict=True):
            rewrite.etag = etag
        return out

    def _validate(self, pk: str, ops: Sequence[Op]) -> None:
        """Every op checked first, so a failing one leaves nothing applied."""
        part = self._parts.get(pk, {})
        current = {op.doc_id: part[op.doc_id][0] for op in ops if op.doc_id in part}
        check_ops(ops, current, lambda seq, etag: str(seq) == etag)

    def _apply(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        out: list[str | None] = []
        part = self._parts.setdefault(pk, {})
        for op in ops:
            if op.kind == "delete":
                del part[op.doc_id]
                out.append(None)
            else:
                assert op.doc is not None
                seq = self._next()
                part[op.doc_id] = (seq, copy.deepcopy(strip_reserved(op.doc)))
                out.append(str(seq))
        return out

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        with self._lock:
            self._count("scan_due")
            found: list[DueRef] = []
            for pk, part in self._parts.items():
                for doc_id, (_, body) in part.items():
                    k, at = due_fields(body)
                    if k == kind and at is not None and at <= now:
                        found.append(DueRef(pk, doc_id, at))
            found.sort(key=lambda r: (r.due_at, r.pk, r.id))
            return found[:limit]

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        with self._lock:
            return sorted(pk for pk, part in self._parts.items() if pk.startswith(pk_prefix) and "exec" in part)[:limit]

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        check_page_size(limit)
        flt = flt or ExecFilter()
        after = decode_keyset(cursor) if cursor is not None else None
        with self._lock:
            self._count("list_execs")
            # a test-only store: sorting every exec here stands in for the backends' index
            found = [
                (created_key(body), pk, self._out(seq, body))
                for pk, part in self._parts.items()
                if (entry := part.get("exec")) is not None
                for seq, body in [entry]
                if exec_matches(body, flt)
            ]
        found.sort(key=lambda f: (f[0], f[1]), reverse=True)
        if after is not None:
            found = [f for f in found if (f[0], f[1]) < after]
        page = found[: limit + 1]
        more = len(page) > limit
        page = page[:limit]
        return ExecPage(
            docs=[doc for _, _, doc in page], cursor=encode_keyset(page[-1][0], page[-1][1]) if more else None
        )


def from_url(url: str, **options: Any) -> MemoryStore:
    """``memory://`` — a fresh, empty store."""
    return MemoryStore()
