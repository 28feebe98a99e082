"""The storage contract every backend implements (docs/architecture.md §4).

A *document* is a JSON-able ``dict`` with two mandatory keys: ``"pk"`` (the partition; the
execution id for workflow documents) and ``"id"`` (unique within the partition). Reads add an
opaque ``"_etag"`` key; writes ignore any ``"_etag"`` in the body. Keys starting with ``_`` are
reserved for stores.

Two optional keys make a document *due*: ``"due_kind"`` (str) and ``"due_at"`` (epoch seconds,
float). :meth:`Store.scan_due` returns documents of one kind whose ``due_at`` has passed; its cost
grows with what is due, never with everything stored (SQLite: a partial index; Cosmos: small
index documents in time-bucketed partitions). Clocks, expired leases, lost activity messages
and claimable outbox rows are all found this way. Remove the keys (or set them to ``None``) and
the document leaves the scan.

**Consistency.** The engine needs *read-your-writes across processes*: a process handling a
message must see every write that happened before the message was sent (the write of the step
it names, of the signal that woke it...). Every backend's writes are etag-guarded, so a stale
read never corrupts anything, but a decision made on it (no such step, a lease that looks live)
would drop the delivery until the recovery scan, 30-300 s later. SQLite, PostgreSQL and memory are strongly
consistent. Cosmos DB accounts at *Strong* or *Bounded staleness* are too; at *Session* (Azure's
default) a read sees a write only with a session token at least as new: :meth:`Store.session_token`
gives the token covering this process's writes to a partition, the glue sends it with the
message that follows, and the receiver hands it to :meth:`Store.use_session_token` before
reading. *Consistent prefix* and *Eventual* are not supported: no token makes their reads
catch up, so every drive or claim could act on an old version and wait for recovery (the engine
retries deliveries a stale read may explain a few times, over ~4 s, not more).
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from celery_durable.errors import ConfigurationError, DocumentTooLarge
from celery_durable.stores.search import search_matches

__all__ = [
    "Doc",
    "Op",
    "Rewrite",
    "MAX_REWRITES",
    "rewritten",
    "DueRef",
    "PartitionRead",
    "ExecFilter",
    "ExecPage",
    "MAX_PAGE_SIZE",
    "Store",
    "MAX_DOC_BYTES",
    "MAX_BATCH_OPS",
    "MAX_BATCH_BYTES",
    "MAX_PK_BYTES",
    "batch_bytes",
    "encode_doc",
    "EncodedDoc",
    "utf8_json",
    "check_pk",
    "check_ids",
    "doc_size",
    "sent_size",
    "find_inner",
    "payload_limit",
]

Doc = dict[str, Any]

#: Cosmos DB's item size limit; every backend enforces the same so behaviour never differs.
MAX_DOC_BYTES = 2 * 1024 * 1024
#: Cosmos TransactionalBatch's operation limit; every backend enforces the same.
MAX_BATCH_OPS = 100
#: Cosmos TransactionalBatch's request size limit (all operations together, as counted by
#: :func:`batch_bytes`); every backend enforces the same.
MAX_BATCH_BYTES = 2 * 1024 * 1024
#: What :func:`batch_bytes` adds per operation for the request framing and the store's own fields
#: (Cosmos: operation type, etag condition, the due reference ``_dx``), on top of twice the id (an
#: encoded id is sent beside the caller's).
BATCH_OP_OVERHEAD = 256
#: Cosmos' limit on a partition key value (UTF-8 bytes, large partition keys / version 2);
#: every backend refuses longer keys the same way.
MAX_PK_BYTES = 2048
#: Rewrites of one :meth:`Store.batch_with` at most (PostgreSQL numbers a transaction's writes
#: below 128: a full batch's 100 plus these).
MAX_REWRITES = 16
#: The largest page :meth:`Store.list_execs` returns (a bigger ``limit`` is refused, not capped).
MAX_PAGE_SIZE = 1000
#: Key a store adds to a listed exec document it could not decode (the value says why).
CORRUPT_KEY = "_corrupt"

RESERVED = ("_etag",)


@dataclass(frozen=True)
class Op:
    """One operation of a :meth:`Store.batch`.

    ``kind`` is ``create`` (fails the batch if the id exists), ``replace`` (needs ``if_match``
    unless ``None`` means "any version"), ``upsert`` or ``delete``.
    """

    kind: Literal["create", "replace", "upsert", "delete"]
    doc: Doc | None = None
    id: str | None = None
    if_match: str | None = None

    @staticmethod
    def create(doc: Doc) -> Op:
        return Op("create", doc=doc)

    @staticmethod
    def replace(doc: Doc, if_match: str | None) -> Op:
        return Op("replace", doc=doc, if_match=if_match)

    @staticmethod
    def upsert(doc: Doc) -> Op:
        return Op("upsert", doc=doc)

    @staticmethod
    def delete(doc_id: str, if_match: str | None = None) -> Op:
        return Op("delete", id=doc_id, if_match=if_match)

    @property
    def doc_id(self) -> str:
        if self.doc is not None:
            return str(self.doc["id"])
        assert self.id is not None
        return self.id


@dataclass
class Rewrite:
    """A read-modify-write of one document of any partition, committed with a batch (:meth:`Store.batch_with`)."""

    pk: str
    id: str
    #: given the document as it is inside the transaction (with its ``_etag``) or ``None``; returns
    #: the new body to write (reserved keys such as ``_etag`` ignored) or ``None`` to leave it as it
    #: is. Must be quick and pure-ish: it runs while the store holds its write lock / row lock, and
    #: PostgreSQL calls it again when a concurrent transaction created the missing document meanwhile.
    update: Callable[[Doc | None], Doc | None]
    #: set by the store once committed: the new etag (``None`` when ``update`` returned ``None`` or
    #: nothing was committed)
    etag: str | None = None


def rewritten(rewrite: Rewrite, new: object) -> Doc:
    """The body a rewrite's ``update`` returned, checked: a dict with the rewrite's pk and id."""
    if not isinstance(new, dict):
        raise ConfigurationError(f"rewrite of {rewrite.id!r}: update returned {type(new).__name__}, not a document")
    if new.get("pk") != rewrite.pk or new.get("id") != rewrite.id:
        raise ConfigurationError(
            f"rewrite of {rewrite.pk!r}/{rewrite.id!r}: update returned {new.get('pk')!r}/{new.get('id')!r}"
        )
    return {k: v for k, v in new.items() if k not in RESERVED}


@dataclass(frozen=True)
class DueRef:
    """A document found by :meth:`Store.scan_due`."""

    pk: str
    id: str
    due_at: float


@dataclass
class PartitionRead:
    """The answer of :meth:`Store.query_partition`.

    ``cursor`` is opaque: pass it back as ``since`` to get only what changed after this read
    (a backend may return a few unchanged documents again; merge by id).
    """

    docs: list[Doc] = field(default_factory=list)
    cursor: Any = None


@dataclass(frozen=True)
class ExecFilter:
    """What :meth:`Store.list_execs` selects; every field ``None`` means "any".

    ``created_after`` is inclusive, ``created_before`` exclusive (epoch seconds). ``search``:
    ``{attr: value}`` on the exec document's ``search`` attributes, AND-ed (rules and matching:
    :mod:`.search`).
    """

    workflow: str | None = None
    status: str | None = None
    created_after: float | None = None
    created_before: float | None = None
    search: dict[str, Any] | None = None


@dataclass
class ExecPage:
    """One page of :meth:`Store.list_execs`, newest first.

    ``cursor`` is opaque (a string): pass it back for the next page; ``None`` when this is the last.
    A document the store cannot decode is returned as ``{"pk", "id": "exec", "_corrupt": reason}``
    so one bad document never hides the others.
    """

    docs: list[Doc] = field(default_factory=list)
    cursor: str | None = None


def check_page_size(limit: int) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE_SIZE:
        raise ConfigurationError(f"page size must be an integer from 1 to {MAX_PAGE_SIZE}, got {limit!r}")
    return limit


def exec_matches(doc: Doc, flt: ExecFilter) -> bool:
    """Whether an exec document passes ``flt`` (the reference semantics every backend follows)."""
    when = created_key(doc)
    return (
        (flt.workflow is None or doc.get("workflow") == flt.workflow)
        and (flt.status is None or doc.get("status") == flt.status)
        and (flt.created_after is None or when >= flt.created_after)
        and (flt.created_before is None or when < flt.created_before)
        and search_matches(doc.get("search"), flt.search)
    )


def created_key(doc: Doc) -> float:
    """The listing order key of an exec document: its numeric ``created_at``, else 0."""
    created = doc.get("created_at")
    return float(created) if isinstance(created, int | float) and not isinstance(created, bool) else 0.0


def encode_keyset(created: float, pk: str) -> str:
    """An opaque cursor for stores that page by ``(created_at, pk)``, newest first."""
    raw = json.dumps([created, pk], separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.urlsafe_b64encode(raw).decode("ascii")


def decode_keyset(cursor: str) -> tuple[float, str]:
    try:
        created, pk = json.loads(base64.urlsafe_b64decode(cursor.encode("ascii")))
        return float(created), str(pk)
    except (ValueError, TypeError, UnicodeError, binascii.Error) as exc:
        raise ConfigurationError(f"not a listing cursor of this store: {cursor[:40]!r}") from exc


def check_ids(ids: Sequence[str]) -> list[str]:
    """The ids of a :meth:`Store.read_many` as a list; a bare string is refused (it is a sequence
    of one-character ids, never what the caller meant)."""
    if isinstance(ids, str):
        raise ConfigurationError(f"read_many takes a sequence of ids, not one string: {ids[:40]!r}")
    return list(ids)


def doc_size(doc: Doc) -> int:
    """Size of the document as sent: compact JSON with non-ASCII characters escaped (``\\uXXXX``,
    as the Cosmos SDK writes a request body: a CJK character costs 6 bytes, not its 3 in UTF-8).
    Every backend counts this way, so a document that fits one fits all."""
    return len(json.dumps(doc, separators=(",", ":")))


def sent_size(text: str) -> int:
    """:func:`doc_size` of a document whose compact UTF-8 JSON is ``text``: its length, plus what
    escaping its non-ASCII characters adds (``json.dumps`` of the text escapes those exactly as a
    document dump would, and adds one backslash per quote and backslash, taken off again)."""
    if text.isascii():
        return len(text)
    return len(json.dumps(text)) - 2 - text.count('"') - text.count("\\")


def check_pk(pk: str) -> str:
    """Refuse a partition key value longer than :data:`MAX_PK_BYTES` (Cosmos would answer 400)."""
    size = len(pk.encode("utf-8", "surrogatepass"))
    if size > MAX_PK_BYTES:
        raise ConfigurationError(f"partition key {pk[:40]!r}... is {size} bytes; the limit is {MAX_PK_BYTES} bytes")
    return pk


def batch_bytes(ops: Sequence[Op], sizes: Sequence[int]) -> int:
    """The size of a batch as every backend counts it against :data:`MAX_BATCH_BYTES`: each
    document's compact JSON (``sizes``, 0 for deletes) plus a fixed allowance per operation."""
    return sum(
        size + BATCH_OP_OVERHEAD + 2 * len(op.doc_id.encode("utf-8", "surrogatepass"))
        for op, size in zip(ops, sizes, strict=True)
    )


_SURROGATE = re.compile("[\ud800-\udfff]")
#: a high surrogate then a low one: two characters of a str, one once escaped and read back
_JOINED = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def utf8_json(text: str, doc_id: str) -> str:
    """JSON ``text`` as UTF-8 can carry it: a lone surrogate (only ever inside a JSON string,
    ``"\\ud800"``) is written as its ``\\uXXXX`` escape, which ``json.loads`` reads back as the
    same string (``json.dumps`` does the same with ``ensure_ascii``). A high surrogate followed by
    a low one is refused: read back, that escape is one character, not the two written."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        pass
    joined = _JOINED.search(text)
    if joined:
        raise ConfigurationError(
            f"document {doc_id!r}: a string holds a high surrogate followed by a low one"
            f" ({joined.group()!r}), which JSON would read back as one character"
        )
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


class EncodedDoc(dict[str, Any]):
    """A document with its compact JSON already made (``text``: its body without reserved keys,
    ``ensure_ascii=False``), by a wrapper that had to measure it (the offload store measures
    every document it passes on): :func:`encode_doc` then checks it without encoding it again.
    Made just before the backend call and never changed after."""

    __slots__ = ("text",)

    def __init__(self, doc: Doc, text: str) -> None:
        super().__init__(doc)
        self.text = text


def encode_doc(doc: Doc, limit: int = MAX_DOC_BYTES) -> str:
    """Validate shape and size; return the compact JSON body (without reserved keys), lone
    surrogates escaped (:func:`utf8_json`): UTF-8 text every backend can store."""
    if not isinstance(doc.get("pk"), str) or not doc["pk"]:
        raise ConfigurationError("a document needs a non-empty string 'pk'")
    if not isinstance(doc.get("id"), str) or not doc["id"]:
        raise ConfigurationError("a document needs a non-empty string 'id'")
    for key in ("pk", "id"):
        bad = None if doc[key].isascii() else _SURROGATE.search(doc[key])
        if bad:
            raise ConfigurationError(
                f"document {doc['id']!r}: its {key} holds a lone surrogate ({bad.group()!r}),"
                " which no store keeps in an id"
            )
    check_pk(doc["pk"])
    # Backends keep system fields under '_' (Cosmos stores them as they are, but its own
    # '_rid', '_ts', '_etag'... and ours '_dx', '_oid' would clash): refuse rather than lose
    private = [k for k in doc if k.startswith("_") and k not in RESERVED]
    if private:
        raise ConfigurationError(f"document {doc['id']!r}: keys starting with '_' are reserved for stores: {private}")
    kind, at = doc.get("due_kind"), doc.get("due_at")
    if kind is not None and not isinstance(kind, str):
        raise ConfigurationError(f"document {doc['id']!r}: due_kind must be a string")
    if at is not None and (isinstance(at, bool) or not isinstance(at, int | float)):
        raise ConfigurationError(f"document {doc['id']!r}: due_at must be a number (epoch seconds)")
    if type(doc) is EncodedDoc:  # measured by a wrapper already: one encoding per document
        text = doc.text
    else:
        body = {k: v for k, v in doc.items() if k not in RESERVED}
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    size = sent_size(text)
    if size > limit:
        raise DocumentTooLarge(doc["id"], size, limit)
    return utf8_json(text, doc["id"])


class Store(ABC):
    """A partitioned document store with optimistic concurrency (docs/architecture.md §4).

    Implementations translate their backend's exceptions into :mod:`celery_durable.errors`
    at this boundary. They must be safe to share between threads; after ``fork()`` call
    :meth:`reopen` (Celery's ``worker_process_init`` does).
    """

    max_doc_bytes: int = MAX_DOC_BYTES
    max_batch_ops: int = MAX_BATCH_OPS
    max_batch_bytes: int = MAX_BATCH_BYTES
    #: whether :meth:`batch_with` is supported (SQLite, PostgreSQL, memory; not Cosmos)
    cross_partition: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # A subclass that changes batch() (a test's fault injection) but not batch_with() would
        # still claim the capability, and its batch_with would bypass its batch: it claims none
        # unless it says so itself.
        if "batch" in cls.__dict__ and "batch_with" not in cls.__dict__ and "cross_partition" not in cls.__dict__:
            cls.cross_partition = False

    @abstractmethod
    def read(self, pk: str, doc_id: str) -> Doc | None:
        """The document with its ``_etag``, or ``None``."""

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        """The documents ``ids`` of partition ``pk``, in the order of ``ids`` (``None`` where missing).

        Backends answer in one round trip; this default reads one by one. An id given twice gets
        a copy at each position; no ids cost nothing. A document the store cannot decode raises
        :class:`~celery_durable.errors.CorruptDocument`, as :meth:`read` does.
        """
        return [self.read(pk, doc_id) for doc_id in check_ids(ids)]

    @abstractmethod
    def create(self, doc: Doc) -> str | None:
        """Create-only: the new etag, or ``None`` (not an exception) if the id exists.

        First writer wins: of any number of concurrent creators of one id exactly one gets an
        etag.
        """

    @abstractmethod
    def replace(self, doc: Doc, if_match: str | None) -> str:
        """Replace and return the new etag.

        Raises :class:`ConflictError` when ``if_match`` is stale or the document is gone.
        ``if_match=None`` replaces whatever version exists (still failing if it is gone).
        """

    @abstractmethod
    def upsert(self, doc: Doc) -> str:
        """Create or replace unconditionally; return the new etag."""

    @abstractmethod
    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        """Delete; ``False`` if it did not exist. Stale ``if_match`` raises :class:`ConflictError`."""

    @abstractmethod
    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        """Every document of one partition in one round trip (only changes after ``since``)."""

    @abstractmethod
    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        """All-or-nothing within one partition; return the etags (``None`` for deletes).

        Any failing op (create on an existing id, stale ``if_match``, missing document) raises
        :class:`ConflictError` and leaves nothing applied. At most :attr:`max_batch_ops` ops of
        at most :attr:`max_batch_bytes` in all (:func:`batch_bytes`; more raises
        :class:`DocumentTooLarge` before anything is sent).
        """

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        """``batch(pk, ops)`` and the ``also`` rewrites (documents of any partition) in one transaction.

        ``ops`` are checked and applied exactly as :meth:`batch` does (they may be empty); then each
        rewrite, in order, reads its document inside the transaction (PostgreSQL: ``FOR UPDATE``, so
        concurrent callers serialise), calls ``update`` and writes what it returns unconditionally
        (due fields and search attributes indexed as for any write, a new etag and change version).
        Returns the etags of ``ops`` and sets each rewrite's ``etag``. All or nothing: a failing op
        (:class:`ConflictError`), a document too large (:class:`DocumentTooLarge`) or an ``update``
        that raises (its exception propagates) leaves nothing applied and every ``etag`` ``None``.
        At most :data:`MAX_REWRITES` rewrites, each ``(pk, id)`` once and none an op's document
        (:class:`ConfigurationError`); they do not count against the batch's limits.

        Only when :attr:`cross_partition` is true; this default raises :class:`NotImplementedError`
        (Cosmos: a transaction never spans partitions).
        """
        raise NotImplementedError(f"{type(self).__name__} has no cross-partition batch (cross_partition is False)")

    @abstractmethod
    def scan_due(self, kind: str, now: float, limit: int = 100) -> list[DueRef]:
        """Documents with ``due_kind == kind`` and ``due_at <= now``, oldest first."""

    def scan_partitions(self, pk_prefix: str, limit: int = 1000) -> list[str]:
        """Partition keys starting with ``pk_prefix`` holding an ``exec`` document (for CLI listing)."""
        raise NotImplementedError

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        """One page of ``exec`` documents (id ``"exec"``) matching ``flt``, newest ``created_at`` first.

        Costs one query per page whatever the number of executions (SQLite: a partial index on
        ``created_at``; Cosmos: a cross-partition query with a continuation token), never one read
        per execution. ``limit`` is 1..:data:`MAX_PAGE_SIZE`; a page may hold fewer documents than
        ``limit`` and still have a ``cursor``. Documents written while paging may or may not show.

        With ``flt.search`` the cost grows with the executions holding the first filter attribute's
        value, never with the others: every backend indexes the exec documents' ``search`` (SQLite:
        an index table written in the exec's transaction; PostgreSQL: a GIN-indexed column; Cosmos:
        an index partition per attribute value, verified against the exec on read).
        """
        raise NotImplementedError

    def session_token(self, pk: str) -> str | None:
        """An opaque token covering this process's writes to partition ``pk`` (and the tokens it
        was handed), for a message that another process will handle after those writes; ``None``
        when the backend needs none (strongly consistent: the default)."""
        return None

    def use_session_token(self, pk: str, token: str | None) -> None:  # noqa: B027 - a no-op by default
        """Make later reads of partition ``pk`` see at least what ``token`` (from
        :meth:`session_token`, maybe of another process) covers. ``None`` or a token the backend
        does not understand changes nothing: old messages carry none."""

    def reopen(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Drop connections inherited across ``fork()``; the next call opens fresh ones."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release connections."""

    # helpers shared by backends -------------------------------------------------------

    def _check_batch(self, pk: str, ops: Sequence[Op], check_docs: bool = True) -> None:
        """Limits, one partition, each id once; ``check_docs=False`` when the backend checks
        (and encodes) every document itself anyway, so it is not encoded twice (it then calls
        :meth:`_check_batch_bytes` with the sizes it got)."""
        if len(ops) > self.max_batch_ops:
            raise ConfigurationError(f"a batch holds at most {self.max_batch_ops} operations, got {len(ops)}")
        check_pk(pk)
        ids: set[str] = set()
        sizes: list[int] = []
        for op in ops:
            size = 0
            if op.doc is not None:
                if op.doc.get("pk") != pk:
                    raise ConfigurationError(f"batch op for {op.doc_id!r} is not in partition {pk!r}")
                if check_docs:
                    size = sent_size(encode_doc(op.doc, self.max_doc_bytes))
            sizes.append(size)
            if op.doc_id in ids:
                raise ConfigurationError(f"batch touches {op.doc_id!r} twice")
            ids.add(op.doc_id)
        if check_docs:
            self._check_batch_bytes(pk, ops, sizes)

    def _check_rewrites(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> None:
        """Reset every rewrite's etag; refuse too many, one ``(pk, id)`` twice or an op's document."""
        for rewrite in also:
            rewrite.etag = None
        if len(also) > MAX_REWRITES:
            raise ConfigurationError(f"batch_with takes at most {MAX_REWRITES} rewrites, got {len(also)}")
        seen = {(pk, op.doc_id) for op in ops}
        for rewrite in also:
            check_pk(rewrite.pk)
            if not isinstance(rewrite.id, str) or not rewrite.id:
                raise ConfigurationError(f"a rewrite needs a non-empty string id, got {rewrite.id!r}")
            if (rewrite.pk, rewrite.id) in seen:
                raise ConfigurationError(f"batch_with touches {rewrite.pk!r}/{rewrite.id!r} twice")
            seen.add((rewrite.pk, rewrite.id))

    def _check_batch_bytes(self, pk: str, ops: Sequence[Op], sizes: Sequence[int]) -> None:
        total = batch_bytes(ops, sizes)
        if total > self.max_batch_bytes:
            # the same error as one document over the limit: the caller made the request too big
            raise DocumentTooLarge(f"<batch of {len(ops)} operations in {pk[:80]!r}>", total, self.max_batch_bytes)


def due_fields(doc: Doc) -> tuple[str | None, float | None]:
    """The ``(due_kind, due_at)`` of a document, or ``(None, None)``."""
    kind = doc.get("due_kind")
    at = doc.get("due_at")
    if kind is None or at is None:
        return None, None
    return str(kind), float(at)


def strip_reserved(doc: Mapping[str, Any]) -> Doc:
    return {k: v for k, v in doc.items() if k not in RESERVED}


#: how deep :func:`find_inner` looks (wrappers hold one store each; a guard against a loop)
_MAX_WRAPPERS = 8


def find_inner(store: object, predicate: Callable[[Any], bool]) -> Any | None:
    """The first of ``store`` and the stores its wrappers hold (``.inner``: traced, counting,
    fault-injecting wrappers), outermost first, that satisfies ``predicate``; ``None`` if none does."""
    found: Any = store
    for _ in range(_MAX_WRAPPERS):
        if found is None or predicate(found):
            return found
        found = getattr(found, "inner", None)
    return None


def payload_limit(store: Store) -> int:
    """The largest document ``store`` takes: the ``max_payload`` of the offloading store under its
    wrappers (a traced or counting wrapper has none of its own), else the item limit."""
    offloading = find_inner(store, lambda s: isinstance(getattr(s, "max_payload", None), int))
    return int(offloading.max_payload) if offloading is not None else int(store.max_doc_bytes)


def _unwrapped(store: object) -> bool:
    return getattr(store, "inner", None) is None


def reads_may_lag(store: Store) -> bool:
    """Whether ``store`` (under its wrappers) may serve a read that misses another process's
    write: a backend with session tokens (Cosmos at Session consistency, docs/architecture.md §4)."""
    backend = find_inner(store, _unwrapped) or store
    return type(backend).session_token is not Store.session_token


def __getattr__(name: str) -> Any:
    if name == "check_doc":  # its name before issue 24, when the engine had a check_doc of its own
        warnings.warn("celery_durable.stores.base.check_doc is encode_doc now", DeprecationWarning, stacklevel=2)
        return encode_doc
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
