"""Chunk documents of offloaded large documents (:mod:`.store`): their ids, the manifest that
names them, the marker chunk the collector (:mod:`.chunk_gc`) looks at, and how a body is cut."""

from __future__ import annotations

import json
from typing import Any

from celery_durable.errors import CorruptDocument
from celery_durable.stores.base import Doc

__all__ = [
    "CHUNK_PREFIX",
    "MANIFEST_KEY",
    "DUE_CHUNK",
    "CHUNK_GRACE",
    "CHUNK_RECHECK_MAX",
    "inline_limit",
    "chunk_ids",
    "is_chunk",
    "chunk_nonce",
    "manifest_of",
    "pieces",
    "recheck_delay",
    "wrap_etag",
    "unwrap_etag",
]

#: what separates the backend's etag from the chunks it names in an etag of the offloading store
ETAG_MARK = "~c:"
#: ids of chunk documents start with this (reserved: the engine's ids never do)
CHUNK_PREFIX = "~chunk~"
#: the manifest's key in an offloaded main document (not ``_``-prefixed: backends refuse those)
MANIFEST_KEY = "~offload"
#: ``due_kind`` of a version's *marker* chunk (its last, small piece, written first, carrying ``of``:
#: the main document's id, ``n``: the count, ``checks``: how often it was found named)
DUE_CHUNK = "chunk"
#: seconds after its write a version's marker chunk is first due: far beyond any write's duration
#: (a write whose chunks took half of it re-arms its markers before its commit)
CHUNK_GRACE = 3600.0
#: the longest a named version's marker waits before it is looked at again (a week)
CHUNK_RECHECK_MAX = 7 * 24 * 3600.0


def inline_limit(max_doc_bytes: int) -> int:
    """Documents up to this many bytes are stored as they are (15/16 of the item limit: Cosmos
    counts its system properties into the limit too)."""
    return max_doc_bytes * 15 // 16


def recheck_delay(checks: int, grace: float = CHUNK_GRACE) -> float:
    """When a marker found named ``checks`` times is looked at again: 2, 4, 8 … graces, at most
    :data:`CHUNK_RECHECK_MAX`. Never cleared for good: a version replaced or deleted later whose
    chunks the writer could not drop (an outage, a crash after the commit, a purge) is then found
    named by nothing and collected."""
    return float(min(grace * 2.0 ** min(max(checks, 0) + 1, 20), CHUNK_RECHECK_MAX))


def chunk_ids(nonce: str, count: int) -> list[str]:
    return [f"{CHUNK_PREFIX}{nonce}~{i}" for i in range(count)]


def is_chunk(doc_id: str) -> bool:
    return doc_id.startswith(CHUNK_PREFIX)


def chunk_nonce(doc_id: str) -> str | None:
    """The nonce in a chunk id (``None`` if it is not one)."""
    if not is_chunk(doc_id):
        return None
    nonce, sep, index = doc_id[len(CHUNK_PREFIX) :].rpartition("~")
    return nonce if sep and nonce and index.isdigit() else None


def manifest_of(pk: str, doc: Doc) -> dict[str, Any] | None:
    m = doc.get(MANIFEST_KEY)
    if m is None:
        return None
    ok = (
        isinstance(m, dict)
        and isinstance(m.get("nonce"), str)
        and isinstance(m.get("n"), int)
        and isinstance(m.get("sha256"), str)
    )
    if not ok:
        raise CorruptDocument(f"document {doc.get('id')!r} in partition {pk!r} has a malformed chunk manifest")
    return dict(m)


def pieces(text: str, budget: int) -> list[str]:
    """``text`` cut into pieces whose JSON string encoding (ASCII-escaped, as sent: ``doc_size``)
    is at most ``budget`` bytes."""
    out: list[str] = []
    start = 0
    while start < len(text):
        take = min(len(text) - start, budget)
        while True:
            piece = text[start : start + take]
            size = len(json.dumps(piece))
            if size <= budget:
                break
            take = max(1, min(take - 1, int(take * budget / size * 0.98)))
        out.append(piece)
        start += take
    return out


def wrap_etag(etag: str | None, ref: tuple[str, int] | None) -> str | None:
    """The offloading store's etag: the backend's, naming the chunks ``ref`` (nonce, count) of its version."""
    return etag if etag is None or ref is None else f"{etag}{ETAG_MARK}{ref[0]}.{ref[1]}"


def unwrap_etag(etag: str | None) -> tuple[str | None, list[str]]:
    """``(backend etag, chunk ids of that version)`` from an etag of the offloading store."""
    if etag is None:
        return None, []
    inner, sep, tail = etag.rpartition(ETAG_MARK)
    nonce, dot, count = tail.rpartition(".")
    if not sep or not dot or not count.isdigit():
        return etag, []
    return inner, chunk_ids(nonce, int(count))
