"""The SQLite store's writes inside a write transaction (``BEGIN IMMEDIATE``, held by the caller):
version allocation, a batch's ops and the rewrites of :meth:`~celery_durable.stores.base.Store.batch_with`."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from celery_durable.stores.base import Doc, Op, Rewrite, encode_doc, rewritten
from celery_durable.stores.op_checks import check_ops
from celery_durable.stores.sql_rows import decode_row, due_columns, parse_etag
from celery_durable.stores.sqlite.search import index_search

__all__ = ["UPSERT", "Prepared", "prepare", "allocate", "apply_ops", "apply_rewrites"]

#: ``UPDATE … RETURNING`` (SQLite 3.35+) saves a statement per write transaction
_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

#: write a document whatever is there (every column of its row)
UPSERT = (
    "INSERT INTO docs (pk, id, body, version, due_kind, due_at) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (pk, id) DO UPDATE SET body = excluded.body, version = excluded.version,"
    " due_kind = excluded.due_kind, due_at = excluded.due_at"
)

#: a document's JSON body and due columns
Prepared = tuple[str, str | None, float | None]


def prepare(doc: Doc, limit: int) -> Prepared:
    """Validate a document; return its JSON body and due columns."""
    body = encode_doc(doc, limit)
    kind, at = due_columns(doc)
    return body, kind, at


def allocate(conn: sqlite3.Connection, count: int = 1) -> int:
    """Reserve ``count`` versions in the current write transaction; return the first."""
    if _RETURNING:
        (seq,) = conn.execute("UPDATE meta SET seq = seq + ? WHERE k = 0 RETURNING seq", (count,)).fetchone()
    else:
        conn.execute("UPDATE meta SET seq = seq + ? WHERE k = 0", (count,))
        (seq,) = conn.execute("SELECT seq FROM meta WHERE k = 0").fetchone()
    return int(seq) - count + 1


def apply_ops(
    conn: sqlite3.Connection, pk: str, ops: Sequence[Op], prepared: Sequence[Prepared | None]
) -> list[str | None]:
    """A batch's ops (checked by the caller, ``prepared`` their documents); raises
    :class:`ConflictError` before writing anything if one fails."""
    ids = [op.doc_id for op in ops]
    marks = ",".join("?" * len(ids))
    current: dict[str, int] = {
        str(doc_id): int(version)
        for doc_id, version in conn.execute(
            f"SELECT id, version FROM docs WHERE pk = ? AND id IN ({marks})", (pk, *ids)
        )
    }
    check_ops(ops, current, lambda version, etag: version == parse_etag(etag))
    writes = sum(1 for op in ops if op.kind != "delete")
    version = allocate(conn, writes) if writes else 0
    out: list[str | None] = []
    for op, prep in zip(ops, prepared, strict=True):
        if op.kind == "delete":
            conn.execute("DELETE FROM docs WHERE pk = ? AND id = ?", (pk, op.doc_id))
            if op.doc_id == "exec":
                conn.execute("DELETE FROM search_idx WHERE pk = ?", (pk,))
            out.append(None)
            continue
        assert op.doc is not None and prep is not None
        body, kind, at = prep
        conn.execute(UPSERT, (pk, op.doc_id, body, version, kind, at))
        index_search(conn, op.doc)
        out.append(str(version))
        version += 1
    return out


def apply_rewrites(conn: sqlite3.Connection, also: Sequence[Rewrite], limit: int) -> list[str | None]:
    """Each rewrite read, updated and written in the current write transaction (which serialises
    every writer of the file, so nothing changes between the read and the write); its new etag,
    or ``None`` where ``update`` kept the document as it was."""
    etags: list[str | None] = []
    for rewrite in also:
        row = conn.execute(
            "SELECT body, version FROM docs WHERE pk = ? AND id = ?", (rewrite.pk, rewrite.id)
        ).fetchone()
        new = rewrite.update(None if row is None else decode_row(row[0], rewrite.pk, rewrite.id, row[1]))
        if new is None:
            etags.append(None)
            continue
        doc = rewritten(rewrite, new)
        body, kind, at = prepare(doc, limit)
        version = allocate(conn)  # a fresh version: delta reads of its partition see it
        conn.execute(UPSERT, (rewrite.pk, rewrite.id, body, version, kind, at))
        index_search(conn, doc)
        etags.append(str(version))
    return etags
