"""The Cosmos store's decoding of items and its multi-document read (:meth:`Store.read_many`),
a mixin of :class:`~celery_durable.stores.cosmos.store.CosmosStore`.

``read_many`` is one single-partition query,
``SELECT * FROM c WHERE c.pk = @pk AND c.id IN (@i0, @i1, ...)`` with ``partition_key=pk`` and a
page size of the number of ids: one request instead of one point read per id. Only an answer
larger than one response page (Cosmos caps a page at about 4 MB) comes in further pages of the
same query. Pages go through the store's retries and error
translation like every other query. (The key is in ``WHERE`` as well as in the header, like the
store's other single-partition queries, so no server can answer from another partition.)
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from celery_durable.stores.base import Doc, check_ids
from celery_durable.stores.cosmos.index import DUE_REF, ORIGINAL_ID, SYSTEM_KEYS, make_etag

__all__ = ["CosmosReads", "read_many_query"]


def read_many_query(pk: str, cosmos_ids: Sequence[str]) -> tuple[str, dict[str, Any]]:
    """The SQL and parameters selecting the items ``cosmos_ids`` (already encoded) of partition ``pk``."""
    names = [f"@i{n}" for n in range(len(cosmos_ids))]
    params: dict[str, Any] = {"@pk": pk, **dict(zip(names, cosmos_ids, strict=True))}
    return f"SELECT * FROM c WHERE c.pk = @pk AND c.id IN ({', '.join(names)})", params


class CosmosReads:
    if TYPE_CHECKING:  # provided by CosmosStore

        def _pages(
            self, what: str, sql: str, params: dict[str, Any], pk: str | None, size: int = ...
        ) -> Iterator[list[Any]]: ...
        @staticmethod
        def _cosmos_id(doc_id: str) -> str: ...

    @staticmethod
    def _out(raw: Doc) -> Doc:
        """The caller's view of a stored item: its own id, our etag, no system keys."""
        doc = {k: v for k, v in raw.items() if k not in SYSTEM_KEYS}
        if ORIGINAL_ID in raw:
            doc["id"] = raw[ORIGINAL_ID]
        doc["_etag"] = make_etag(raw["_etag"], raw.get(DUE_REF))
        return doc

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        wanted = check_ids(ids)
        # caller's id -> Cosmos id, each once, in order (an illegal id fails here as in read())
        cosmos_ids = {doc_id: self._cosmos_id(doc_id) for doc_id in wanted}
        if not cosmos_ids:
            return []
        sql, params = read_many_query(pk, list(cosmos_ids.values()))
        found: dict[str, Doc] = {}
        what = f"read_many {pk!r} ({len(cosmos_ids)} ids)"
        for page in self._pages(what, sql, params, pk, size=len(cosmos_ids)):
            for raw in page:
                doc = self._out(raw)
                found[str(doc["id"])] = doc
        out: list[Doc | None] = []
        given: set[str] = set()
        for doc_id in wanted:
            hit = found.get(doc_id)
            # a repeated id gets its own copy, as from a second read()
            out.append(copy.deepcopy(hit) if hit is not None and doc_id in given else hit)
            given.add(doc_id)
        return out
