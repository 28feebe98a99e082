"""Pure helpers of the Cosmos store: id encoding, etags, and the due-index rules.

Nothing here talks to Cosmos; :mod:`celery_durable.stores.cosmos.store` does the I/O. The design of
the due index is described in that module's docstring; the rules are implemented here so they
can be read (and unit-tested) in one place.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from celery_durable.stores.base import Doc, due_fields

#: Keys the store adds to a user document in Cosmos (never returned to callers).
ORIGINAL_ID = "_oid"  # the caller's id when the Cosmos id had to be encoded
DUE_REF = "_dx"  # [kind, at, bucket, entry id] of the index entry that covers this document
#: the entry the version before this one relied on and this one let go of (DueIndex.handoffs)
LET_GO = "_gx"
#: Cosmos system properties (and ours) stripped from documents handed back to callers.
SYSTEM_KEYS = frozenset({"_rid", "_self", "_etag", "_ts", "_attachments", "_lsn", ORIGINAL_ID, DUE_REF, LET_GO})

#: Index entry fields. An entry's partition is ``_due:{kind}:{bucket}:{shard}`` (``_due:{kind}:{bucket}``
#: with one shard).
ENTRY_KIND = "_ix"
LATE = "late"

# Cosmos forbids / \ ? # in ids; "%" and non-ASCII are legal but troublesome in REST paths, so
# anything outside this conservative set is encoded. "~" never appears in a verbatim id, which
# keeps the encoding injective.
_VERBATIM_ID = re.compile(r"[A-Za-z0-9_.:@=+,;!$()*\-]{1,1023}")
_ID_PREFIX = "~"
MAX_ID_LENGTH = 1023  # Cosmos' limit on the id property


def encode_id(doc_id: str) -> str:
    """The Cosmos id for ``doc_id``: itself if safe, else ``~`` + unpadded base64url of UTF-8."""
    if _VERBATIM_ID.fullmatch(doc_id):
        return doc_id
    return _ID_PREFIX + base64.urlsafe_b64encode(doc_id.encode("utf-8")).decode("ascii").rstrip("=")


def make_etag(server_etag: str, due_ref: Any) -> str:
    """Our opaque etag: the server's etag, plus the due reference of that version if any.

    Carrying the reference in the etag lets a conditional replace know (without a read) which
    index entry covers the version it replaces; see :meth:`DueIndex.trusted`.
    """
    if due_ref is None:
        return server_etag
    tail = json.dumps(due_ref, separators=(",", ":")).encode("utf-8")
    return f"{server_etag}|{base64.urlsafe_b64encode(tail).decode('ascii')}"


def split_etag(etag: str) -> tuple[str, list[Any] | None]:
    """``(server_etag, due_ref)`` from :func:`make_etag`'s output (tolerates plain etags)."""
    server, sep, tail = etag.rpartition("|")
    if not sep:
        return etag, None
    try:
        ref = json.loads(base64.urlsafe_b64decode(tail.encode("ascii")))
    except (ValueError, binascii.Error, UnicodeError):
        return etag, None
    return (server, ref) if isinstance(ref, list) and len(ref) in (3, 4) else (etag, None)


def _same(ref: Any, entry: Doc) -> bool:
    """Whether due reference ``ref`` names ``entry``: by its id (in any bucket: it may have been
    moved to ``late``); a reference written before ids were in it, by kind and due time."""
    if not isinstance(ref, list) or len(ref) not in (3, 4) or ref[0] != entry[ENTRY_KIND] or ref[1] != entry["at"]:
        return False
    return len(ref) == 3 or ref[3] == entry["id"]


def entry_id(target_pk: str, target_id: str, at: float, nonce: str = "") -> str:
    """The id of an index entry for one (document, due time), unique per write (``nonce``): a
    document due again at the same instant gets a new entry, never the one it handed over."""
    raw = json.dumps([target_pk, target_id, at, nonce], separators=(",", ":"), ensure_ascii=False)
    return hashlib.blake2b(raw.encode("utf-8"), digest_size=16).hexdigest()


def bucket_pk(kind: str, bucket: int | str, shard: int | None = None) -> str:
    return f"_due:{kind}:{bucket}" if shard is None else f"_due:{kind}:{bucket}:{shard}"


def shard_of(target_pk: str, shards: int) -> int | None:
    """The shard of a document's index entries: a stable hash of its partition key (``None``
    with one shard: the unsharded layout)."""
    if shards <= 1:
        return None
    digest = hashlib.blake2b(target_pk.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def lwm_pk(kind: str) -> str:
    return f"_due:{kind}"


Verdict = Literal["due", "keep", "delete"]


@dataclass(frozen=True)
class DueIndex:
    """Parameters of the due index (seconds). Every process sharing a container must agree on
    ``bucket``; the others only tune cost."""

    #: width of a time bucket (``shards`` Cosmos partitions per kind and bucket)
    bucket: float = 60.0
    #: logical partitions per kind and bucket: Azure serves one logical partition at most
    #: 10,000 RU/s, so the entries of a busy minute are spread by the hash of their document's
    #: partition key (a scan reads every shard)
    shards: int = 4
    #: entries due more than this long ago at write time go to the always-scanned ``late`` partition
    late_after: float = 60.0
    #: the low-water mark stays this far behind the clock (covers clock skew and write latency)
    lwm_lag: float = 120.0
    #: a write may rely on its predecessor's entry only if that entry is still this far ahead...
    trust_margin: float = 5.0
    #: ...and the new due time is at most this much later than the entry (bounds re-checks)
    trust_slack: float = 300.0
    #: an entry whose document is missing or does not rely on it is dropped after this age
    orphan_age: float = 120.0
    #: a due entry stuck this many buckets behind is moved to the ``late`` partition
    stuck_buckets: int = 10
    #: more empty buckets than this ahead: find the next non-empty one with one query
    gap_skip: int = 16

    def bucket_of(self, t: float) -> int:
        return math.floor(t / self.bucket)

    def partition(self, kind: str, bucket: int | str, target_pk: str) -> str:
        """The partition of the entry of a document of partition ``target_pk``."""
        return bucket_pk(kind, bucket, shard_of(target_pk, self.shards))

    def partitions(self, kind: str, bucket: int | str) -> list[str]:
        """Every partition of one bucket (what a scan reads)."""
        if self.shards <= 1:
            return [bucket_pk(kind, bucket)]
        return [bucket_pk(kind, bucket, s) for s in range(self.shards)]

    def trusted(self, prev: list[Any] | None, kind: str, at: float, now: float) -> bool:
        """May a conditional write setting due ``(kind, at)`` keep the entry ``prev`` of the
        version it replaces instead of writing a new one?

        Safe whenever ``prev`` is an entry of the same kind no later than ``at``: the scanner
        never deletes an entry the current version relies on, and a write based on an older
        version fails its etag check. The time conditions only bound how long a stale entry is
        re-checked.
        """
        if prev is None or prev[0] != kind:
            return False
        prev_at = float(prev[1])
        return prev_at <= at <= prev_at + self.trust_slack and prev_at >= now + self.trust_margin

    def handoffs(self, ops: Sequence[tuple[str, Doc | None, list[Any] | None]], now: float) -> dict[int, list[Any]]:
        """In one batch ``ops`` = ``(op kind, document, due ref of the replaced version)``: the
        created documents that may rely on an entry another op of the batch lets go of, by index.

        A replace whose new version has no due time lets go of its entry; a create whose due time
        that entry may cover (:meth:`trusted`) takes it, so a workflow's step commit (settle one
        step, create the next) writes no new entry. One taker per entry: an entry is relied on by
        at most one document at a time, its target or the one document it was handed to last,
        and the batch hands it over atomically (the scanner looks the holder up when the target
        does not rely on it: :meth:`needs_holder`).
        """
        free = [
            prev
            for kind, doc, prev in ops
            if kind == "replace" and prev is not None and doc is not None and due_fields(doc)[0] is None
        ]
        taken: dict[int, list[Any]] = {}
        for i, (kind, doc, _prev) in enumerate(ops):
            if kind != "create" or doc is None or not free:
                continue
            d_kind, at = due_fields(doc)
            if d_kind is None or at is None or at != at:
                continue
            for j, ref in enumerate(free):
                if self.trusted(ref, d_kind, at, now):
                    taken[i] = free.pop(j)
                    break
        return taken

    def cover(
        self, doc: Doc, prev: list[Any] | None, handed: list[Any] | None, now: float
    ) -> tuple[list[Any] | None, Doc | None]:
        """The due reference a write of ``doc`` relies on, and the entry to write first if it is
        a new one: its predecessor's (``prev``, when :meth:`trusted`), the one another op of its
        batch ``handed`` it (:meth:`handoffs`), else a new entry. ``(None, None)``: not due."""
        kind, at = due_fields(doc)
        if kind is None or at is None or at != at:  # no due fields (or NaN)
            return None, None
        if self.trusted(prev, kind, at, now):
            return prev, None
        if handed is not None:
            return handed, None
        return self.new_entry(kind, at, doc["pk"], doc["id"], now)

    @staticmethod
    def needs_holder(entry: Doc, target: Doc | None) -> bool:
        """Whether to look for the documents an entry was handed to (:meth:`handoffs`): when its
        target does not rely on it (any more, or did so in an earlier version)."""
        return target is None or not DueIndex.relies(target, entry)

    @staticmethod
    def let_go(entry: Doc, target: Doc | None) -> bool:
        """Whether the target's current version let go of ``entry`` (``_gx``): written after it,
        so the entry is no writer's in flight."""
        return target is not None and _same(target.get(LET_GO), entry)

    @staticmethod
    def relies(doc: Doc, entry: Doc) -> bool:
        """Whether the raw document ``doc`` relies on ``entry`` (in any bucket: it may have
        been moved to ``late``)."""
        return _same(doc.get(DUE_REF), entry)

    def new_entry(self, kind: str, at: float, target_pk: str, target_id: str, now: float) -> tuple[list[Any], Doc]:
        """``(due_ref, entry document)`` for a document becoming due ``(kind, at)``."""
        bucket: int | str = LATE if at < now - self.late_after else self.bucket_of(at)
        entry: Doc = {
            "pk": self.partition(kind, bucket, target_pk),
            "id": entry_id(target_pk, target_id, at, uuid.uuid4().hex),
            ENTRY_KIND: kind,
            "at": at,
            "tpk": target_pk,
            "tid": target_id,
        }
        if bucket == LATE:
            entry["late"] = True
        else:
            entry["b"] = bucket
        return [kind, at, bucket, entry["id"]], entry

    def verdict(self, entry: Doc, target: Doc | None, now: float, real_now: float) -> tuple[Verdict, float]:
        """What the scanner does with an entry whose time has come, given the raw target document.

        ``due``: the target is due (report it). ``keep``: the target relies on this entry but is
        not due yet, or the entry may belong to a write still in flight. ``delete``: garbage.
        """
        kind = entry[ENTRY_KIND]
        age = real_now - float(entry.get("_ts", 0))
        if target is None:
            return ("delete" if age >= self.orphan_age else "keep"), 0.0
        t_kind, t_at = target.get("due_kind"), target.get("due_at")
        if t_kind == kind and t_at is not None and float(t_at) <= now:
            return "due", float(t_at)
        if self.relies(target, entry):
            return "keep", 0.0
        # The target no longer relies on this entry. If the target was written after the entry,
        # the entry's writer has finished (or lost its race); otherwise wait for orphan_age.
        if float(target.get("_ts", 0)) > float(entry.get("_ts", 0)) or age >= self.orphan_age:
            return "delete", 0.0
        return "keep", 0.0
