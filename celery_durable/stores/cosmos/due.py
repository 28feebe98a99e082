"""The Cosmos store's due scan (:meth:`Store.scan_due`), a mixin of :class:`CosmosStore`.

The design of the due index is in :mod:`celery_durable.stores.cosmos.store`'s docstring; its rules are in
:mod:`.index`. A bucket is read shard by shard (``DueIndex.partitions``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from azure.core import MatchConditions
from azure.cosmos import exceptions as cx

from celery_durable.stores.base import Doc, DueRef, due_fields
from celery_durable.stores.cosmos.index import ENTRY_KIND, LATE, ORIGINAL_ID, DueIndex, lwm_pk

if TYPE_CHECKING:
    from azure.cosmos import ContainerProxy

__all__ = ["CosmosDueScan"]

T = TypeVar("T")


class CosmosDueScan:
    if TYPE_CHECKING:  # provided by CosmosStore
        index: DueIndex
        _lwm: dict[str, int]

        def _container(self) -> ContainerProxy: ...
        def _call(self, what: str, fn: Callable[[], T], *, idempotent: bool, doc: Doc | None = None) -> T: ...
        def _read_raw(self, pk: str, doc_id: str) -> Doc | None: ...
        def _upsert_internal(self, doc: Doc) -> None: ...
        def _query(self, what: str, sql: str, params: dict[str, Any], pk: str | None) -> Iterator[Doc]: ...
        def _pages(
            self, what: str, sql: str, params: dict[str, Any], pk: str | None, size: int = ...
        ) -> Iterator[list[Any]]: ...
        def _read_many(self, refs: list[tuple[str, str]], into: dict[tuple[str, str], Doc | None]) -> None: ...

    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        if now != now:  # NaN: nothing is due
            return []
        # an unbounded now (inf) is every finite due time: bucket numbers and JSON need a number
        now = max(min(now, sys.float_info.max), -sys.float_info.max)
        real = time.time()
        found: dict[tuple[str, str], DueRef] = {}
        targets: dict[tuple[str, str], Doc | None] = {}
        self._scan_bucket(kind, LATE, now, real, limit, found, targets)
        hi = self.index.bucket_of(now)
        start = self._lwm.get(kind)
        if start is None:
            raw = self._read_raw(lwm_pk(kind), "lwm")
            start = int(raw["b"]) if raw is not None else None
        if start is None:  # fresh scanner and no mark: find the oldest bucket in one query
            start = self._next_bucket(kind, None, hi)
            start = hi + 1 if start is None else start
        b, first_dirty = start, None
        while b <= hi and len(found) < limit:
            if hi - b > self.index.gap_skip:
                nxt = self._next_bucket(kind, b, hi)
                if nxt is None:
                    b = hi + 1
                    break
                b = nxt
            clean = self._scan_bucket(kind, b, now, real, limit, found, targets)
            if not clean and first_dirty is None:
                first_dirty = b
            b += 1
        mark = min(
            first_dirty if first_dirty is not None else b, self.index.bucket_of(min(now, real) - self.index.lwm_lag)
        )
        known = self._lwm.get(kind)
        if known is None or mark > known:
            # several scanners may race here; any of their marks is a valid lower bound
            self._lwm[kind] = mark
            self._upsert_internal({"pk": lwm_pk(kind), "id": "lwm", "b": mark})
        return sorted(found.values(), key=lambda r: (r.due_at, r.pk, r.id))[:limit]

    def _scan_bucket(
        self,
        kind: str,
        bucket: int | str,
        now: float,
        real: float,
        limit: int,
        found: dict[tuple[str, str], DueRef],
        targets: dict[tuple[str, str], Doc | None],
    ) -> bool:
        """Process one bucket's entries with ``at <= now``; True if none is left behind.

        With several shards, one query names them all (``c.pk IN (...)``): Cosmos routes it to the
        physical partitions holding those keys only (usually one), so an idle scan costs about what
        it cost unsharded, not one query per shard.
        """
        pks = self.index.partitions(kind, bucket)
        names = [f"@p{i}" for i in range(len(pks))]
        params: dict[str, Any] = {"@now": now, **dict(zip(names, pks, strict=True))}
        if len(pks) == 1:
            sql, scope = "SELECT * FROM c WHERE c.pk = @p0 AND c.at <= @now ORDER BY c.at", pks[0]
        else:
            sql, scope = f"SELECT * FROM c WHERE c.pk IN ({', '.join(names)}) AND c.at <= @now ORDER BY c.at", None
        clean = True
        for page in self._pages(f"scan_due {pks[0]!r}", sql, params, scope, size=max(20, limit)):
            self._read_many([(str(e["tpk"]), str(e["tid"])) for e in page], targets)
            for entry in page:
                if len(found) >= limit:
                    return False
                clean = self._settle(kind, bucket, entry, targets, now, real, found) and clean
        return clean

    def _settle(
        self,
        kind: str,
        bucket: int | str,
        entry: Doc,
        targets: dict[tuple[str, str], Doc | None],
        now: float,
        real: float,
        found: dict[tuple[str, str], DueRef],
    ) -> bool:
        """Apply the verdict on one entry; True if the entry is gone from its bucket."""
        ref = (str(entry["tpk"]), str(entry["tid"]))
        verdict, due_at = self.index.verdict(entry, targets[ref], now, real)
        if verdict == "due":
            found[ref] = DueRef(ref[0], ref[1], due_at)
        if self.index.needs_holder(entry, targets[ref]):
            # the target does not rely on it: it may have handed it to other documents of its partition
            waiting = False
            for holder in self._holders(entry):
                h_kind, h_at = due_fields(holder)
                if h_kind != kind or h_at is None or h_at > now:
                    waiting = True  # relied on, not due yet
                    continue
                h_ref = (ref[0], str(holder.get(ORIGINAL_ID) or holder["id"]))
                found[h_ref], verdict = DueRef(h_ref[0], h_ref[1], h_at), "due"
            if waiting:
                return False
            if verdict == "keep" and self.index.let_go(entry, targets[ref]):
                verdict = "delete"  # nobody relies on it, and no writer can be in flight
        if verdict == "delete":
            return self._delete_entry(entry)
        if verdict == "keep":
            return False
        if bucket == LATE or int(bucket) >= self.index.bucket_of(real) - self.index.stuck_buckets:
            return False
        # due but not handled for a while: move it to the always-scanned late partition so the
        # low-water mark can pass its old bucket
        moved = {k: v for k, v in entry.items() if not k.startswith("_") or k == ENTRY_KIND}
        moved.update(pk=self.index.partition(kind, LATE, ref[0]), late=True)
        moved.pop("b", None)
        self._upsert_internal(moved)
        return self._delete_entry(entry)

    def _holders(self, entry: Doc) -> list[Doc]:
        """The documents of the entry's target partition relying on it (one, as
        ``DueIndex.handoffs`` hands an entry over; all of them if ever more). One
        single-partition query over that execution's documents, made only for an entry its target
        does not rely on."""
        sql = "SELECT c.id, c._oid, c.due_kind, c.due_at, c._dx FROM c WHERE c.pk = @pk"
        docs = self._query(f"scan_due holder in {entry['tpk']!r}", sql, {"@pk": entry["tpk"]}, entry["tpk"])
        return [doc for doc in docs if self.index.relies(doc, entry)]

    def _delete_entry(self, entry: Doc) -> bool:
        """Delete unless a writer touched it since we read it; True if it is gone."""
        c = self._container()

        def op() -> bool:
            try:
                c.delete_item(
                    entry["id"],
                    partition_key=entry["pk"],
                    etag=entry["_etag"],
                    match_condition=MatchConditions.IfNotModified,
                )
            except cx.CosmosResourceNotFoundError:
                return True
            except cx.CosmosAccessConditionFailedError:
                return False
            return True

        return self._call("index delete", op, idempotent=True)

    def _next_bucket(self, kind: str, lo: int | None, hi: int) -> int | None:
        """The oldest bucket in ``[lo, hi]`` holding an entry of ``kind`` (cross-partition, entries only)."""
        sql = "SELECT TOP 1 VALUE c.b FROM c WHERE c._ix = @kind AND c.b <= @hi"
        params: dict[str, Any] = {"@kind": kind, "@hi": hi}
        if lo is not None:
            sql += " AND c.b >= @lo"
            params["@lo"] = lo
        for value in self._query(f"scan_due {kind!r} buckets", sql + " ORDER BY c.b", params, None):
            return int(cast(Any, value))
        return None
