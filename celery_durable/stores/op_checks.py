"""The check a batch makes before it writes anything (the memory and SQLite stores; PostgreSQL
makes it in SQL, each write checking itself)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from celery_durable.errors import ConflictError
from celery_durable.stores.base import Op

__all__ = ["check_ops"]

V = TypeVar("V")


def check_ops(ops: Sequence[Op], current: Mapping[str, V], matches: Callable[[V, str], bool]) -> None:
    """Raise :class:`ConflictError` if any of ``ops`` would fail, given the ``current`` versions
    of their documents (absent: no such document) and whether a version ``matches`` an etag:
    every op is checked first, so a failing one leaves nothing applied."""
    for op in ops:
        version = current.get(op.doc_id)
        if op.kind == "create" and version is not None:
            raise ConflictError(f"batch create: {op.doc_id!r} exists")
        if op.kind in ("replace", "delete"):
            if version is None:
                raise ConflictError(f"batch {op.kind}: {op.doc_id!r} does not exist")
            if op.if_match is not None and not matches(version, op.if_match):
                raise ConflictError(f"batch {op.kind}: {op.doc_id!r} changed since it was read")
