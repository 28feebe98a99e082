"""The Cosmos store's search-attribute index, a mixin of :class:`CosmosStore`.

A cross-partition query over exec documents would cost in proportion to every execution, so each
(attribute, value) an exec document's ``search`` holds (:mod:`celery_durable.stores.search`) gets an *entry* document
in a partition of its own, ``_sx:{attr}={kind}:{value as JSON}``: id a hash of the execution's
partition key, ``tpk`` that key, ``created_at`` the execution's. A TransactionalBatch cannot span
partitions, so, as for the due index, a write of an exec document first upserts its entries (they
are idempotent), then writes the document. :meth:`list_execs` with a search filter reads the
entries of the first attribute's value, newest first (one single-partition query per page, the
SDK's continuation token as cursor), point-reads their executions and keeps those the exec
document itself passes (every filter, :func:`.base.exec_matches`). An entry whose execution is
gone or no longer holds the value is *stale*: deleted (etag-guarded) once older than
:data:`STALE_AFTER` seconds, so a writer's entry is never taken before its exec write lands.
Cost of a page: one query plus one point read per entry read, whatever the store holds.

Writes: a conditional replace of the version this process last wrote of an execution, holding the
same attributes, upserts no entries (:meth:`CosmosSearch._search_entries`): that version's entries
were written before it, and none is deleted while it is current (a reader deletes an entry only
when the exec it reads lacks the value), as the due index trusts a predecessor's entry. A drive's
commit after its lease write thus costs no entry writes; other writes rewrite them (idempotent).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

from celery_durable.stores.base import Doc, ExecFilter, ExecPage, created_key, exec_matches
from celery_durable.stores.cosmos.index import split_etag
from celery_durable.stores.search import search_terms, term_of

if TYPE_CHECKING:
    from azure.cosmos import ContainerProxy

__all__ = ["CosmosSearch", "search_pk", "STALE_AFTER"]

T = TypeVar("T")
E = TypeVar("E", str, str | None)

#: seconds before an entry its execution does not back is deleted (a writer's exec write lands well before)
STALE_AFTER = 120.0


def search_pk(attr: str, kind: str, value: Any) -> str:
    """The partition of the entries of one attribute value."""
    return f"_sx:{attr}={kind}:{json.dumps(value, separators=(',', ':'), ensure_ascii=False)}"


def search_entries(doc: Doc) -> list[Doc]:
    """The index entries an exec document needs (none for other documents)."""
    if doc.get("id") != "exec":
        return []
    terms = search_terms(doc.get("search"))
    if not terms:  # most executions: no hash, no key
        return []
    pk = str(doc["pk"])
    eid = hashlib.blake2b(pk.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    created = created_key(doc)
    return [
        {"pk": search_pk(attr, kind, value), "id": eid, "tpk": pk, "created_at": created} for attr, kind, value in terms
    ]


#: executions whose last written attributes a store remembers (then forgets them all: only a cost)
_KNOWN_MAX = 10_000


def _digest(entries: list[Doc]) -> str:
    return hashlib.blake2b(json.dumps(entries, sort_keys=True).encode("utf-8"), digest_size=16).hexdigest()


class CosmosSearch:
    if TYPE_CHECKING:  # provided by CosmosStore

        def _container(self) -> ContainerProxy: ...
        def _call(self, what: str, fn: Callable[[], T], *, idempotent: bool, doc: Doc | None = None) -> T: ...
        def _read_many(self, refs: list[tuple[str, str]], into: dict[tuple[str, str], Doc | None]) -> None: ...
        def _delete_entry(self, entry: Doc) -> bool: ...
        @staticmethod
        def _out(raw: Doc) -> Doc: ...

    def _known(self) -> dict[str, tuple[str, str]]:
        """pk -> (digest of the entries, server etag of the version this process wrote with them)."""
        known: dict[str, tuple[str, str]] | None = self.__dict__.get("_sx_known")
        if known is None or len(known) > _KNOWN_MAX:
            known = self.__dict__["_sx_known"] = {}
        return known

    def _search_entries(self, doc: Doc, base_etag: str | None) -> list[Doc]:
        """The entries to upsert before writing ``doc`` (none when the version replaced has them)."""
        entries = search_entries(doc)
        if entries and base_etag is not None:
            if self._known().get(str(doc["pk"])) == (_digest(entries), split_etag(base_etag)[0]):
                return []
        return entries

    def _search_written(self, doc: Doc, etag: E) -> E:
        """Remember what ``doc``'s write (etag ``etag``, None: not written) left indexed; return ``etag``."""
        if doc.get("id") == "exec" and etag is not None:
            entries = search_entries(doc) if "search" in doc else []
            if entries:
                self._known()[str(doc["pk"])] = (_digest(entries), split_etag(etag)[0])
            else:
                self._known().pop(str(doc["pk"]), None)
        return etag

    def _list_by_search(self, flt: ExecFilter, limit: int, cursor: str | None) -> ExecPage:
        assert flt.search
        attr, value = next(iter(flt.search.items()))
        pk = search_pk(attr, *term_of(value))
        sql = "SELECT * FROM c WHERE c.pk = @pk"
        params: list[dict[str, object]] = [{"name": "@pk", "value": pk}]
        if flt.created_after is not None:
            sql += " AND c.created_at >= @after"
            params.append({"name": "@after", "value": flt.created_after})
        if flt.created_before is not None:
            sql += " AND c.created_at < @before"
            params.append({"name": "@before", "value": flt.created_before})
        sql += " ORDER BY c.created_at DESC"
        c = self._container()

        def fetch() -> tuple[list[Doc], str | None]:
            query = c.query_items(sql, parameters=params, partition_key=pk, max_item_count=limit)
            pages = query.by_page(cursor)
            page = [dict(i) for i in next(pages, [])]
            return page, cast(Any, pages).continuation_token

        entries, token = self._call("list_execs search", fetch, idempotent=True)
        targets: dict[tuple[str, str], Doc | None] = {}
        self._read_many([(str(e["tpk"]), "exec") for e in entries], targets)
        docs: list[Doc] = []
        now = time.time()
        for entry in entries:
            raw = targets[(str(entry["tpk"]), "exec")]
            doc = None if raw is None else self._out(raw)
            if doc is not None and exec_matches(doc, flt):
                docs.append(doc)
            elif (doc is None or not exec_matches(doc, ExecFilter(search={attr: value}))) and (
                now - float(entry.get("_ts", now)) >= STALE_AFTER
            ):
                self._delete_entry(entry)
        return ExecPage(docs=docs, cursor=token or None)
