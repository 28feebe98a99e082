"""What the SQL backends (SQLite, PostgreSQL) share: a row's body decoded into a document, etags
as integer versions, the upper bound of an id-prefix range, the due columns of a document."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from celery_durable.errors import ConfigurationError, CorruptDocument
from celery_durable.stores.base import CORRUPT_KEY, Doc, ExecPage, due_fields, encode_keyset


def decode_row(body: str, pk: str, doc_id: str, version: int) -> Doc:
    """The document stored as ``body`` (JSON text), with its ids and etag; a clear
    :class:`CorruptDocument` if the text is not a JSON object."""
    try:
        doc = json.loads(body)
    except (ValueError, TypeError) as exc:
        raise CorruptDocument(f"document {doc_id!r} in partition {pk!r} is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CorruptDocument(f"document {doc_id!r} in partition {pk!r} is not a JSON object")
    doc["pk"], doc["id"], doc["_etag"] = pk, doc_id, str(version)
    return doc


def parse_etag(if_match: str | None) -> int | None:
    """An etag as the integer version it stands for; one not of this store matches nothing (-1)."""
    if if_match is None:
        return None
    try:
        return int(if_match)
    except (TypeError, ValueError):
        return -1


def prefix_upper(prefix: str) -> str | None:
    """The smallest string greater than every string starting with ``prefix`` (None: no bound)."""
    chars = list(prefix)
    while chars:
        code = ord(chars[-1]) + 1
        if 0xD800 <= code <= 0xDFFF:
            code = 0xE000
        if code <= 0x10FFFF:
            chars[-1] = chr(code)
            return "".join(chars)
        chars.pop()
    return None


def due_columns(doc: Doc) -> tuple[str | None, float | None]:
    """``(due_kind, due_at)`` of a document, for the due index columns."""
    try:
        return due_fields(doc)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"document {doc['id']!r}: 'due_at' must be epoch seconds: {exc}") from exc


def exec_page(rows: Sequence[tuple[Any, ...]], limit: int) -> ExecPage:
    """A page of executions from ``(pk, body, version, created)`` rows, ``limit + 1`` asked for
    (the extra one says there is a next page); a row that is not a document is flagged
    (``CORRUPT_KEY``), not raised, so one bad execution does not hide the others."""
    docs: list[Doc] = []
    for pk, body, version, _ in rows[:limit]:
        try:
            docs.append(decode_row(body, pk, "exec", version))
        except CorruptDocument as exc:
            docs.append({"pk": pk, "id": "exec", "_etag": str(version), CORRUPT_KEY: str(exc)})
    last = rows[limit - 1] if len(rows) > limit else None
    return ExecPage(docs=docs, cursor=encode_keyset(float(last[3]), str(last[0])) if last else None)
