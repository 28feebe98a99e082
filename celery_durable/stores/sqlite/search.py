"""The SQLite store's search-attribute index (:mod:`celery_durable.stores.search`): one ``search_idx`` row per
(attribute, value) of an exec document's ``search``, keyed in listing order per value, rewritten in
the transaction that writes the exec document. ``list_execs(ExecFilter(search=...))`` walks the
rows of the first attribute's value (newest first) and joins each to its exec row; the other
attributes are primary-key lookups, so a page costs what the value holds, not what is stored."""

from __future__ import annotations

import sqlite3
from typing import Any

from celery_durable.stores.base import Doc, ExecFilter, created_key, decode_keyset
from celery_durable.stores.search import search_terms, term_of

__all__ = ["SEARCH_SCHEMA", "index_search", "search_query"]

SEARCH_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS search_idx (
        attr TEXT NOT NULL, kind TEXT NOT NULL, value NOT NULL, created REAL NOT NULL, pk TEXT NOT NULL,
        PRIMARY KEY (attr, kind, value, created, pk)
    ) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS search_idx_pk ON search_idx (pk)",
)


def index_search(conn: sqlite3.Connection, doc: Doc) -> None:
    """Keep ``search_idx`` in step with a document just written (in its transaction)."""
    if doc["id"] != "exec":
        return
    conn.execute("DELETE FROM search_idx WHERE pk = ?", (doc["pk"],))
    terms = search_terms(doc.get("search"))
    if terms:
        created = created_key(doc)
        conn.executemany(
            "INSERT OR IGNORE INTO search_idx (attr, kind, value, created, pk) VALUES (?, ?, ?, ?, ?)",
            [(attr, kind, value, created, doc["pk"]) for attr, kind, value in terms],
        )


def search_query(flt: ExecFilter, limit: int, cursor: str | None) -> tuple[str, list[Any]]:
    """The ``(pk, body, version, created)`` query of one page (``limit + 1`` rows). CROSS JOIN keeps
    the index rows the outer loop, in their order."""
    assert flt.search
    (attr, value), *others = flt.search.items()
    sql = (
        "SELECT s.pk, d.body, d.version, s.created FROM search_idx s CROSS JOIN docs d"
        " ON d.pk = s.pk AND d.id = 'exec' WHERE s.attr = ? AND s.kind = ? AND s.value = ?"
    )
    params: list[Any] = [attr, *term_of(value)]
    for other, other_value in others:
        sql += (
            " AND EXISTS (SELECT 1 FROM search_idx t WHERE t.attr = ? AND t.kind = ? AND t.value = ?"
            " AND t.created = s.created AND t.pk = s.pk)"
        )
        params += [other, *term_of(other_value)]
    for field_name, wanted in (("workflow", flt.workflow), ("status", flt.status)):
        if wanted is not None:
            sql += f" AND (CASE WHEN json_valid(d.body) THEN json_extract(d.body, '$.{field_name}') END) = ?"
            params.append(wanted)
    if flt.created_after is not None:
        sql += " AND s.created >= ?"
        params.append(float(flt.created_after))
    if flt.created_before is not None:
        sql += " AND s.created < ?"
        params.append(float(flt.created_before))
    if cursor is not None:
        sql += " AND (s.created, s.pk) < (?, ?)"
        params += list(decode_keyset(cursor))
    sql += " ORDER BY s.created DESC, s.pk DESC LIMIT ?"
    params.append(limit + 1)
    return sql, params
