"""A store wrapper that counts round trips, for benchmarks and cost assertions in tests.

    store = CountingStore(store_from_url("sqlite:///bench.db"))
    ...  # run something
    assert store.counts["read"] == 0 and store.counts["read_many"] == 1
    print(store.total, store.reset())

The cost model is the contract's: one call of a :class:`~celery_durable.stores.base.Store`
method is one round trip, except ``read_many`` with no ids and ``batch`` with no ops, which the
backends answer without a request and which are not counted (a ``batch_with`` counts once, as
``"batch_with"``, though PostgreSQL makes a round trip or two per rewrite). Requests a backend
makes on its own (Cosmos due-index entries, extra pages of a large answer) are not seen here. A call that
raises is counted: the request was made. ``reopen``/``close`` are not round trips.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

from celery_durable.stores.base import Doc, DueRef, ExecFilter, ExecPage, Op, PartitionRead, Rewrite, Store, check_ids

__all__ = ["CountingStore"]


class CountingStore(Store):
    """Delegates every call to ``inner`` and counts it by method name (thread-safe)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.max_doc_bytes = inner.max_doc_bytes
        self.max_batch_ops = inner.max_batch_ops
        #: round trips by method name since the last :meth:`reset`
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    @property
    def cross_partition(self) -> bool:  # type: ignore[override]
        """The inner store's: a wrapper must never hide (or claim) :meth:`batch_with`."""
        return self.inner.cross_partition

    def __repr__(self) -> str:
        return f"CountingStore({self.inner!r})"

    @property
    def last_request_charge(self) -> float | None:
        """The inner store's, when it has one (Cosmos), so a TracedStore around this still sees RU."""
        charge = getattr(self.inner, "last_request_charge", None)
        return None if charge is None else float(charge)

    @property
    def total(self) -> int:
        """All round trips since the last :meth:`reset`."""
        with self._lock:
            return sum(self.counts.values())

    def reset(self) -> Counter[str]:
        """Start counting from zero; return what was counted until now."""
        with self._lock:
            old, self.counts = self.counts, Counter()
        return old

    def _count(self, op: str) -> None:
        with self._lock:
            self.counts[op] += 1

    def read(self, pk: str, doc_id: str) -> Doc | None:
        self._count("read")
        return self.inner.read(pk, doc_id)

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        wanted = check_ids(ids)
        if wanted:
            self._count("read_many")
        return self.inner.read_many(pk, wanted)

    def create(self, doc: Doc) -> str | None:
        self._count("create")
        return self.inner.create(doc)

    def replace(self, doc: Doc, if_match: str | None) -> str:
        self._count("replace")
        return self.inner.replace(doc, if_match)

    def upsert(self, doc: Doc) -> str:
        self._count("upsert")
        return self.inner.upsert(doc)

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        self._count("delete")
        return self.inner.delete(pk, doc_id, if_match)

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        self._count("query_partition")
        return self.inner.query_partition(pk, since)

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        if len(ops):
            self._count("batch")
        return self.inner.batch(pk, ops)

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        self._count("batch_with")  # one transaction, whatever it holds
        return self.inner.batch_with(pk, ops, also)

    def session_token(self, pk: str) -> str | None:
        return self.inner.session_token(pk)  # not a round trip: the token of the last write seen

    def use_session_token(self, pk: str, token: str | None) -> None:
        self.inner.use_session_token(pk, token)

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        self._count("scan_due")
        return self.inner.scan_due(kind, now, limit)

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        self._count("scan_partitions")
        return self.inner.scan_partitions(pk_prefix, limit)

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        self._count("list_execs")
        return self.inner.list_execs(flt, limit, cursor)

    def reopen(self) -> None:
        self.inner.reopen()

    def close(self) -> None:
        self.inner.close()
