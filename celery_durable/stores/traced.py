"""A store wrapper that puts every call in an OpenTelemetry span (``celery_durable.store.<op>``).

Spans carry the backend, the partition, the number of documents and — for Cosmos — the
request charge (RU) of the call. The engine wraps its store in it when the application has
configured a tracer provider (``pip install celery-durable[otel]``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from celery_durable.observability import span
from celery_durable.stores.base import Doc, DueRef, ExecFilter, ExecPage, Op, PartitionRead, Rewrite, Store

__all__ = ["TracedStore"]

T = TypeVar("T")


class TracedStore(Store):
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self._backend = type(inner).__name__

    # the inner store's limits, read through (not copied: what it holds now is what it enforces)
    @property  # type: ignore[override]
    def max_doc_bytes(self) -> int:
        return self.inner.max_doc_bytes

    @max_doc_bytes.setter
    def max_doc_bytes(self, value: int) -> None:
        self.inner.max_doc_bytes = value

    @property  # type: ignore[override]
    def max_batch_ops(self) -> int:
        return self.inner.max_batch_ops

    @max_batch_ops.setter
    def max_batch_ops(self, value: int) -> None:
        self.inner.max_batch_ops = value

    @property
    def cross_partition(self) -> bool:  # type: ignore[override]
        """The inner store's: a wrapper must never hide (or claim) :meth:`batch_with`."""
        return self.inner.cross_partition

    def __repr__(self) -> str:
        return f"TracedStore({self.inner!r})"

    def _traced(self, op: str, pk: str | None, call: Callable[[], T], **attrs: Any) -> T:
        with span(f"store.{op}", backend=self._backend, pk=pk, **attrs) as current:
            result = call()
            charge = getattr(self.inner, "last_request_charge", None)
            if current is not None and charge is not None:
                current.set_attribute("durable.request_charge", float(charge))
            return result

    def read(self, pk: str, doc_id: str) -> Doc | None:
        return self._traced("read", pk, lambda: self.inner.read(pk, doc_id))

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        return self._traced("read_many", pk, lambda: self.inner.read_many(pk, ids), ids=len(ids))

    def create(self, doc: Doc) -> str | None:
        return self._traced("create", doc.get("pk"), lambda: self.inner.create(doc))

    def replace(self, doc: Doc, if_match: str | None) -> str:
        return self._traced("replace", doc.get("pk"), lambda: self.inner.replace(doc, if_match))

    def upsert(self, doc: Doc) -> str:
        return self._traced("upsert", doc.get("pk"), lambda: self.inner.upsert(doc))

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        return self._traced("delete", pk, lambda: self.inner.delete(pk, doc_id, if_match))

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        return self._traced("query_partition", pk, lambda: self.inner.query_partition(pk, since))

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        return self._traced("batch", pk, lambda: self.inner.batch(pk, ops), ops=len(ops))

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        return self._traced(
            "batch_with", pk, lambda: self.inner.batch_with(pk, ops, also), ops=len(ops), rewrites=len(also)
        )

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        return self._traced("scan_due", None, lambda: self.inner.scan_due(kind, now, limit), kind=kind)

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        return self._traced("scan_partitions", None, lambda: self.inner.scan_partitions(pk_prefix, limit))

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        return self._traced("list_execs", None, lambda: self.inner.list_execs(flt, limit, cursor))

    def session_token(self, pk: str) -> str | None:
        return self.inner.session_token(pk)

    def use_session_token(self, pk: str, token: str | None) -> None:
        self.inner.use_session_token(pk, token)

    def reopen(self) -> None:
        self.inner.reopen()

    def close(self) -> None:
        self.inner.close()
