"""Large documents offloaded into chunk documents of their partition (issue 12).

Every store holds items of at most 2 MB (Cosmos' limit, enforced everywhere). :class:`Offloading`,
mixed into a backend's class by :func:`offloaded` (the store factory and the engine apply it; the
store stays an instance of its backend class, whose own methods run underneath), stores documents
up to ``max_payload`` bytes (``durable_max_payload``, 64 MiB by default) anyway, transparently: a
document whose compact JSON passes :func:`inline_limit` keeps its small fields (``pk``, ``id``, the
due fields and whatever the backends' scans and listings filter on) and moves its largest fields,
as one JSON text, into chunk documents ``~chunk~{nonce}~{i}`` of the same partition, named by a
manifest (``~offload``: nonce, count, size, SHA-256). Reads reassemble and check the digest; chunk
documents never show. A document over ``max_payload`` is refused with :class:`PayloadTooLarge`
before anything is written.

Why not one all-or-nothing batch with the chunks: a Cosmos transactional batch carries at most
2 MB in all, so chunks cannot ride in the batch that writes the document. Instead chunks are
*immutable and named per write* (a fresh nonce): they are created first, then the main document
is written as before (the commit point, with the caller's etag condition, alone or in the
caller's batch), then the replaced version's chunks are deleted. A reader that finds a chunk
missing re-reads the main document: a newer version means a writer replaced it meanwhile (read
again); the same version means the chunk is really gone (:class:`CorruptDocument`). A write that
certainly failed (conflict, refused) deletes its fresh chunks; one that may have applied (the store
unreachable) leaves them, so a crash leaves chunks behind but never loses or corrupts a value: the
collector (:mod:`.chunk_gc`, run by the recovery scan) deletes those a grace after their write.

Which chunks a replaced version had is carried in our etag (``<backend etag>~c:<nonce>.<count>``,
as the Cosmos store carries its due reference), so a conditional replace or delete needs no read;
an unconditional one (``if_match=None``, ``upsert``) reads the current version first.
Documents within the limit are passed through untouched, at no extra round trip.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from abc import ABC
from collections.abc import Callable, Sequence
from typing import Any, cast

from celery_durable.errors import (
    ConfigurationError,
    ConflictError,
    CorruptDocument,
    DocumentTooLarge,
    PayloadTooLarge,
    StoreError,
    StoreUnavailable,
)
from celery_durable.stores.base import (
    CORRUPT_KEY,
    RESERVED,
    Doc,
    EncodedDoc,
    ExecFilter,
    ExecPage,
    Op,
    PartitionRead,
    Rewrite,
    Store,
    batch_bytes,
    check_ids,
    doc_size,
    find_inner,
    sent_size,
    utf8_json,
)
from celery_durable.stores.offload.chunks import (
    CHUNK_GRACE,
    CHUNK_PREFIX,
    DUE_CHUNK,
    MANIFEST_KEY,
    chunk_ids,
    inline_limit,
    is_chunk,
    manifest_of,
)
from celery_durable.stores.offload.chunks import pieces as cut_pieces
from celery_durable.stores.offload.chunks import unwrap_etag as _unwrap
from celery_durable.stores.offload.chunks import wrap_etag as _wrap

__all__ = [
    "Offloading",
    "offloaded",
    "DEFAULT_MAX_PAYLOAD",
    "CHUNK_PREFIX",
    "MANIFEST_KEY",
    "DUE_CHUNK",
    "CHUNK_GRACE",
    "inline_limit",
]

log = logging.getLogger("celery_durable.store")

#: ``durable_max_payload``'s default: the largest document stored, offloaded or not
DEFAULT_MAX_PAYLOAD = 64 * 1024 * 1024
#: fields that always stay on the main document: the backends' scans and listings filter on them
_PINNED = frozenset(
    {"pk", "id", "type", "status", "workflow", "created_at", "due_kind", "due_at", "search", MANIFEST_KEY}
)
#: what the main document of an offloaded one keeps at most (its small fields)
_SLIM_BYTES = 64 * 1024
#: the marker chunk's piece is at most this many characters (a few KB: each look of the collector
#: rewrites it, at Cosmos' price per KB written)
_MARKER_CHARS = 512
#: chunk reads retried after a concurrent replace deleted the chunks of the version read
_READ_ROUNDS = 5
#: exceptions after which a write certainly did not apply (its fresh chunks can go)
_NOT_APPLIED = (ConflictError, DocumentTooLarge, ConfigurationError)


#: tries of an unconditional write racing other writers of the same document
_UNCONDITIONAL_ROUNDS = 50


class _Missing(Exception):
    """A chunk of the version read is gone (replaced meanwhile, or lost)."""


class _Raw:
    """The backend's own operations under an :class:`Offloading` store (chunks visible)."""

    def __init__(self, store: Offloading) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(super(self._store._ofl_class, self._store), name)


class Offloading(ABC):  # noqa: B024 - a mixin, registered (not inherited) by the mixed classes
    """Mixin over a backend class: documents up to ``max_payload`` bytes, big ones in chunks.

    :func:`offloaded` copies these methods into a subclass of the backend's class (its only base,
    so that a store's class can be swapped in place: ``__class__`` assignment needs the same
    instance layout) and registers it here, so ``isinstance(store, Offloading)`` holds."""

    #: the mixed class (``super()`` of it reaches the backend's own methods)
    _ofl_class: type
    max_payload: int = DEFAULT_MAX_PAYLOAD
    max_doc_bytes: int
    max_batch_ops: int
    max_batch_bytes: int  # the backend's (no default here: the mixed class must not shadow it)
    cross_partition: bool  # the backend's, likewise
    #: the clock of the marker chunks' due times (``None``: ``time.time``; the engine sets its own)
    chunk_clock: Callable[[], float] | None = None
    chunk_grace: float = CHUNK_GRACE

    @property
    def backend(self) -> Store:
        """The backend underneath (its reads show chunk documents; its writes do not offload)."""
        return cast(Store, _Raw(self))

    @property
    def inline_bytes(self) -> int:
        return inline_limit(self.max_doc_bytes)

    # --- splitting --------------------------------------------------------------------------------

    def _ofl_split(self, doc: Doc, inline: int | None = None) -> tuple[Doc, list[Doc], tuple[str, int] | None]:
        """``(document to write, chunk documents to create first, (nonce, count))``; documents
        over ``inline`` bytes (default :attr:`inline_bytes`) are offloaded."""
        return self._ofl_split_sized(doc, inline)[0]

    def _ofl_split_sized(
        self, doc: Doc, inline: int | None = None
    ) -> tuple[tuple[Doc, list[Doc], tuple[str, int] | None], int]:
        """:meth:`_ofl_split` and the :func:`doc_size` of the document to write (a batch weighs
        its documents: measured once, not again)."""
        body = {k: v for k, v in doc.items() if k not in RESERVED}
        # encoded once: measured here, and the backend writes this text (EncodedDoc)
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
        size = sent_size(text)
        if size > self.max_payload:
            raise PayloadTooLarge(str(doc.get("id")), size, self.max_payload)
        limit = self.inline_bytes if inline is None else inline
        if size <= limit or not isinstance(doc.get("pk"), str) or not isinstance(doc.get("id"), str):
            # within the item limit (or malformed: the backend says why)
            return (EncodedDoc(doc, text), [], None), (size if len(body) == len(doc) else doc_size(doc))
        sizes = {k: doc_size({k: v}) for k, v in body.items()}
        kept, moved, left = dict(body), {}, size
        for key in sorted(sizes, key=lambda k: -sizes[k]):
            if left <= _SLIM_BYTES:
                break
            if key in _PINNED:
                continue
            moved[key] = kept.pop(key)
            left -= sizes[key]
        # lone surrogates escaped, as encode_doc writes them: the digest is of UTF-8 bytes
        text = utf8_json(json.dumps(moved, separators=(",", ":"), ensure_ascii=False), str(doc["id"]))
        nonce = uuid.uuid4().hex[:16]
        pk = str(doc["pk"])
        mark = {"of": str(doc["id"]), "n": 10**6, "due_kind": DUE_CHUNK, "due_at": -1.7976931348623157e308}
        overhead = doc_size({"pk": pk, "id": chunk_ids(nonce, 10**6)[0], "type": "chunk", "data": "", **mark})
        pieces = cut_pieces(text, self.inline_bytes - overhead)
        if len(pieces[-1]) > _MARKER_CHARS:
            last = pieces.pop()
            pieces += [last[:-_MARKER_CHARS], last[-_MARKER_CHARS:]]
        ids = chunk_ids(nonce, len(pieces))
        chunks: list[Doc] = [
            {"pk": pk, "id": cid, "type": "chunk", "data": p} for cid, p in zip(ids, pieces, strict=True)
        ]
        # The last piece (small) marks the version for the collector, and is written first: a
        # write that dies after any chunk leaves a marked one behind. Each look of the collector
        # that finds it named rewrites it (its next due time): a few KB.
        due_at = self._ofl_now() + self.chunk_grace
        chunks[-1].update(of=str(doc["id"]), n=len(pieces), due_kind=DUE_CHUNK, due_at=due_at)
        chunks.insert(0, chunks.pop())
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        kept[MANIFEST_KEY] = {"nonce": nonce, "n": len(pieces), "bytes": len(text.encode("utf-8")), "sha256": digest}
        return (kept, chunks, (nonce, len(pieces))), doc_size(kept)

    def _ofl_now(self) -> float:
        """The time of the marker chunks' due fields (the engine's clock, else ``time.time``)."""
        return (self.chunk_clock or time.time)()

    def _ofl_put_chunks(self, pk: str, chunks: list[Doc]) -> None:
        written: list[str] = []
        marks: list[tuple[Doc, str]] = []
        try:
            for chunk in chunks:
                written.append(chunk["id"])  # before the call: a create whose answer was lost may have applied
                etag = self.backend.create(chunk)
                if etag is None:  # a fresh nonce: never taken (not ours: not dropped)
                    raise ConflictError(f"chunk {written.pop()!r} in partition {pk!r} exists")
                if chunk.get("due_kind") == DUE_CHUNK:
                    marks.append((chunk, etag))
            # Chunks that took half the grace (a throttled store) re-arm their markers before the
            # commit: the collector must not find them due, named by nothing yet. It claims a
            # marker before deleting anything, so one of the two etag-guarded writes conflicts.
            now = self._ofl_now()
            for mark, etag in marks:
                if now > float(mark["due_at"]) - self.chunk_grace / 2:
                    try:
                        self.backend.replace(mark | {"due_at": now + self.chunk_grace}, if_match=etag)
                    except ConflictError as exc:
                        raise StoreUnavailable(f"chunks in {pk!r} took too long to write: collected") from exc
        except BaseException:
            self._ofl_drop(pk, written)
            raise

    def _ofl_drop(self, pk: str, ids: Sequence[str]) -> bool:
        """Delete chunks nobody references any more; a version's marker last (a failure stops: it
        stays due). False when a store error stopped it (logged)."""
        ids = sorted(ids, key=lambda c: (c.rpartition("~")[0], len(c), c))
        for start in range(0, len(ids), self.max_batch_ops):
            part = ids[start : start + self.max_batch_ops]
            try:
                self.backend.batch(pk, [Op.delete(i) for i in part])
                continue
            except ConflictError:
                pass  # some were gone already: one by one
            except StoreError as exc:
                log.warning("could not delete %d chunk(s) in %s: %s", len(part), pk, exc)
                return False
            for chunk_id in part:
                try:
                    self.backend.delete(pk, chunk_id)
                except StoreError as exc:
                    log.warning("could not delete chunk %s in %s: %s", chunk_id, pk, exc)
                    return False
        return True

    def _ofl_current_chunks(self, pk: str, ids: Sequence[str]) -> list[str]:
        """The chunks of the stored versions of ``ids`` (what an unconditional write replaces)."""
        found: list[str] = []
        try:
            raws = self.backend.read_many(pk, list(ids)) if ids else []
        except CorruptDocument:
            # the write replaces a document nobody can read (the engine overwrites a corrupt
            # exec with its failure): its chunks, if it had any, cannot be known and stay behind
            return found
        for raw in raws:
            if raw is not None and (m := manifest_of(pk, raw)) is not None:
                found += chunk_ids(m["nonce"], m["n"])
        return found

    # --- reassembly -------------------------------------------------------------------------------

    def _ofl_assemble(self, pk: str, raw: Doc, chunks: dict[str, Doc | None]) -> Doc:
        """The caller's document from a stored main document (chunks read into ``chunks``)."""
        m = manifest_of(pk, raw)
        if m is None:
            return raw
        ids = chunk_ids(m["nonce"], m["n"])
        missing = [i for i in ids if i not in chunks]
        if missing:
            chunks.update(zip(missing, self.backend.read_many(pk, missing), strict=True))
        parts: list[str] = []
        for cid in ids:
            chunk = chunks.get(cid)
            if chunk is None:
                raise _Missing(cid)
            if not isinstance(chunk.get("data"), str):
                raise CorruptDocument(f"chunk {cid!r} of {raw['id']!r} in partition {pk!r} is malformed")
            parts.append(chunk["data"])
        text = "".join(parts)
        if hashlib.sha256(text.encode("utf-8")).hexdigest() != m["sha256"]:
            raise CorruptDocument(f"document {raw['id']!r} in partition {pk!r}: its chunks do not match their digest")
        try:
            moved = json.loads(text)
        except ValueError as exc:
            raise CorruptDocument(f"document {raw['id']!r} in partition {pk!r}: chunks are not JSON: {exc}") from exc
        if not isinstance(moved, dict):
            raise CorruptDocument(f"document {raw['id']!r} in partition {pk!r}: chunks are not a JSON object")
        doc = {k: v for k, v in raw.items() if k != MANIFEST_KEY}
        doc.update(moved)
        doc["_etag"] = _wrap(raw["_etag"], (m["nonce"], m["n"]))
        return doc

    def _ofl_reread(self, pk: str, raw: Doc) -> Doc | None:
        """Assemble ``raw``, re-reading it while a concurrent replace deletes the chunks read."""
        for _ in range(_READ_ROUNDS):
            try:
                return self._ofl_assemble(pk, raw, {})
            except _Missing as missing:
                again = self.backend.read(pk, str(raw["id"]))
                if again is None:
                    return None
                if again.get("_etag") == raw.get("_etag"):
                    raise CorruptDocument(
                        f"document {raw['id']!r} in partition {pk!r}: its chunk {missing.args[0]!r} is missing"
                    ) from None
                raw = again
        raise CorruptDocument(f"document {raw['id']!r} in partition {pk!r} kept changing while read")

    def _ofl_assemble_all(self, pk: str, raws: list[Doc | None], chunks: dict[str, Doc | None]) -> list[Doc | None]:
        wanted = [
            cid
            for raw in raws
            if raw is not None and (m := manifest_of(pk, raw)) is not None
            for cid in chunk_ids(m["nonce"], m["n"])
            if cid not in chunks
        ]
        if wanted:  # every missing chunk in one round trip
            unique = list(dict.fromkeys(wanted))
            chunks.update(zip(unique, self.backend.read_many(pk, unique), strict=True))
        out: list[Doc | None] = []
        for raw in raws:
            if raw is None:
                out.append(None)
                continue
            try:
                out.append(self._ofl_assemble(pk, raw, chunks))
            except _Missing:
                out.append(self._ofl_reread(pk, raw))
        return out

    # --- reads ------------------------------------------------------------------------------------

    def read(self, pk: str, doc_id: str) -> Doc | None:
        raw = self.backend.read(pk, doc_id)
        return None if raw is None else self._ofl_reread(pk, raw)

    def read_many(self, pk: str, ids: Sequence[str]) -> list[Doc | None]:
        wanted = check_ids(ids)
        return self._ofl_assemble_all(pk, self.backend.read_many(pk, wanted), {}) if wanted else []

    def query_partition(self, pk: str, since: Any = None) -> PartitionRead:
        got = self.backend.query_partition(pk, since)
        chunks: dict[str, Doc | None] = {d["id"]: d for d in got.docs if is_chunk(str(d["id"]))}
        mains: list[Doc | None] = [d for d in got.docs if not is_chunk(str(d["id"]))]
        docs = [d for d in self._ofl_assemble_all(pk, mains, chunks) if d is not None]
        return PartitionRead(docs=docs, cursor=got.cursor)

    def list_execs(self, flt: ExecFilter | None = None, limit: int = 100, cursor: str | None = None) -> ExecPage:
        page = self.backend.list_execs(flt, limit, cursor)
        docs: list[Doc] = []
        for raw in page.docs:
            try:
                doc = raw if CORRUPT_KEY in raw else self._ofl_reread(str(raw["pk"]), raw)
            except CorruptDocument as exc:
                doc = {"pk": raw["pk"], "id": raw["id"], "_etag": raw.get("_etag"), CORRUPT_KEY: str(exc)}
            if doc is not None:
                docs.append(doc)
        return ExecPage(docs=docs, cursor=page.cursor)

    # --- writes -----------------------------------------------------------------------------------

    def _ofl_write(self, doc: Doc, old: list[str], call: Any) -> Any:
        """Chunks first, then ``call(slim_doc)`` (the commit), then the replaced version's chunks go."""
        slim, chunks, ref = self._ofl_split(doc)
        pk = str(doc["pk"]) if chunks else ""
        if chunks:
            self._ofl_put_chunks(pk, chunks)
        try:
            etag = call(slim)
        except _NOT_APPLIED:
            if chunks:
                self._ofl_drop(pk, [c["id"] for c in chunks])
            raise
        if etag is None:  # create found the id taken
            if chunks:
                self._ofl_drop(pk, [c["id"] for c in chunks])
            return None
        if old:
            self._ofl_drop(str(doc["pk"]), old)
        return _wrap(etag, ref)

    def create(self, doc: Doc) -> str | None:
        result: str | None = self._ofl_write(doc, [], self.backend.create)
        return result

    def _ofl_stored(self, pk: str, doc_id: str) -> tuple[str | None, list[str]] | None:
        """The stored version of a document as ``(backend etag, its chunks)``, ``(None, [])`` if
        there is none, ``None`` if it cannot be read (corrupt: its chunks cannot be known)."""
        try:
            raw = self.backend.read(pk, doc_id)
        except CorruptDocument:
            return None
        if raw is None:
            return None, []
        m = manifest_of(pk, raw)
        return str(raw["_etag"]), (chunk_ids(m["nonce"], m["n"]) if m is not None else [])

    # An unconditional write (replace or delete without an etag, upsert) reads the stored version
    # and writes conditionally on it, again if another writer came between: the chunks it drops
    # are then exactly those of the version it replaced (a blind write racing another would
    # drop the chunks of the version it read while another's stayed behind, orphaned).

    def replace(self, doc: Doc, if_match: str | None) -> str:
        inner_etag, old = _unwrap(if_match)
        if if_match is not None or not (isinstance(doc.get("pk"), str) and isinstance(doc.get("id"), str)):
            result: str = self._ofl_write(doc, old, lambda slim: self.backend.replace(slim, inner_etag))
            return result
        for _ in range(_UNCONDITIONAL_ROUNDS):
            stored = self._ofl_stored(doc["pk"], doc["id"])
            etag, old = stored if stored is not None else (None, [])
            try:
                result = self._ofl_write(doc, old, lambda slim, e=etag: self.backend.replace(slim, e))
            except ConflictError:
                if etag is None:
                    raise  # there is no such document
                continue
            return result
        raise ConflictError(f"{doc['id']!r} changed under every replace ({_UNCONDITIONAL_ROUNDS} tries)")

    def upsert(self, doc: Doc) -> str:
        if not (isinstance(doc.get("pk"), str) and isinstance(doc.get("id"), str)):  # the backend says why
            result: str = self._ofl_write(doc, [], self.backend.upsert)
            return result
        for _ in range(_UNCONDITIONAL_ROUNDS):
            stored = self._ofl_stored(doc["pk"], doc["id"])
            if stored is None:  # unreadable: overwrite it (the engine fails a corrupt exec so)
                result = self._ofl_write(doc, [], self.backend.upsert)
                return result
            etag, old = stored
            try:
                if etag is None:
                    created: str | None = self._ofl_write(doc, [], self.backend.create)
                    if created is None:
                        continue  # created meanwhile: replace that version
                    return created
                result = self._ofl_write(doc, old, lambda slim, e=etag: self.backend.replace(slim, e))
            except ConflictError:
                continue
            return result
        raise ConflictError(f"{doc['id']!r} changed under every upsert ({_UNCONDITIONAL_ROUNDS} tries)")

    def delete(self, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        inner_etag, old = _unwrap(if_match)
        if if_match is not None:
            deleted = self.backend.delete(pk, doc_id, inner_etag)
            if deleted and old:
                self._ofl_drop(pk, old)
            return deleted
        for _ in range(_UNCONDITIONAL_ROUNDS):
            stored = self._ofl_stored(pk, doc_id)
            etag, old = stored if stored is not None else (None, [])
            try:
                deleted = self.backend.delete(pk, doc_id, etag)
            except ConflictError:
                continue
            if deleted and old:
                self._ofl_drop(pk, old)
            return deleted
        raise ConflictError(f"{doc_id!r} changed under every delete ({_UNCONDITIONAL_ROUNDS} tries)")

    def batch(self, pk: str, ops: Sequence[Op]) -> list[str | None]:
        return self._ofl_batch(pk, ops, lambda inner_ops: self.backend.batch(pk, inner_ops))

    def batch_with(self, pk: str, ops: Sequence[Op], also: Sequence[Rewrite]) -> list[str | None]:
        """``ops`` offloaded as :meth:`batch` does, the rewrites' documents written as returned (none in chunks)."""
        for rewrite in also:
            rewrite.etag = None
        if not self.cross_partition:  # before any chunk is written
            raise NotImplementedError(f"{type(self).__name__} has no cross-partition batch (cross_partition is False)")
        raised: list[BaseException] = []  # by an update: certainly nothing applied, the fresh chunks can go
        inner = [Rewrite(rewrite.pk, rewrite.id, _inline_only(rewrite, raised)) for rewrite in also]
        out = self._ofl_batch(pk, ops, lambda inner_ops: self.backend.batch_with(pk, inner_ops, inner), raised)
        for rewrite, done in zip(also, inner, strict=True):
            rewrite.etag = done.etag
        return out

    def _ofl_batch(
        self, pk: str, ops: Sequence[Op], commit: Callable[[list[Op]], list[str | None]], raised: Sequence[object] = ()
    ) -> list[str | None]:
        if len(ops) > self.max_batch_ops:
            raise ConfigurationError(f"a batch holds at most {self.max_batch_ops} operations, got {len(ops)}")
        for op in ops:
            if op.doc is not None and op.doc.get("pk") != pk:
                raise ConfigurationError(f"batch op for {op.doc_id!r} is not in partition {pk!r}")
        inner_etags: list[str | None] = []
        old: list[str] = []
        blind: list[str] = []
        for op in ops:
            inner_etag, replaced = _unwrap(op.if_match)
            inner_etags.append(inner_etag)
            old += replaced
            if op.kind != "create" and (op.if_match is None or op.kind == "upsert"):
                blind.append(op.doc_id)
        # Each document within the item limit may stay inline, but a Cosmos batch carries at
        # most 2 MB in all: offload the biggest inline documents until the batch fits (split
        # with ``inline=0`` a document keeps only its small fields).
        sized = [None if op.doc is None else self._ofl_split_sized(op.doc) for op in ops]
        splits = [None if one is None else one[0] for one in sized]
        sizes = [0 if one is None else one[1] for one in sized]
        while batch_bytes(ops, sizes) > self.max_batch_bytes:
            movable = [i for i, sp in enumerate(splits) if sp is not None and sp[2] is None and sizes[i] > _SLIM_BYTES]
            if not movable:
                break  # nothing left to move: the backend refuses the batch and says why
            i = max(movable, key=lambda j: sizes[j])
            doc = ops[i].doc
            assert doc is not None
            splits[i], sizes[i] = self._ofl_split_sized(doc, inline=0)
        inner_ops: list[Op] = []
        refs: list[tuple[str, int] | None] = []
        fresh: list[Doc] = []
        for op, split, inner_etag in zip(ops, splits, inner_etags, strict=True):
            if split is None:
                inner_ops.append(Op(op.kind, id=op.id, if_match=inner_etag))
                refs.append(None)
                continue
            slim, chunks, ref = split
            fresh += chunks
            inner_ops.append(Op(op.kind, doc=slim, if_match=inner_etag))
            refs.append(ref)
        old += self._ofl_current_chunks(pk, blind)
        self._ofl_put_chunks(pk, fresh)
        try:
            etags = commit(inner_ops)
        except BaseException as exc:
            if isinstance(exc, _NOT_APPLIED) or any(exc is one for one in raised):
                self._ofl_drop(pk, [c["id"] for c in fresh])
            raise
        if old:
            self._ofl_drop(pk, old)
        return [_wrap(etag, ref) for etag, ref in zip(etags, refs, strict=True)]


def _inline_only(rewrite: Rewrite, raised: list[BaseException]) -> Callable[[Doc | None], Doc | None]:
    """``rewrite.update``, refusing a document stored in chunks (its update would see the manifest);
    what it raises is kept in ``raised``."""

    def update(doc: Doc | None) -> Doc | None:
        try:
            if doc is not None and MANIFEST_KEY in doc:
                raise ConfigurationError(f"batch_with cannot rewrite {rewrite.pk!r}/{rewrite.id!r}: stored in chunks")
            return rewrite.update(doc)
        except BaseException as exc:
            raised.append(exc)
            raise

    return update


_CLASSES: dict[type[Store], type[Store]] = {}


def offloaded(store: Store, max_payload: int = DEFAULT_MAX_PAYLOAD, clock: Callable[[], float] | None = None) -> Store:
    """Make ``store`` offload documents up to ``max_payload`` bytes; return it. ``clock``: what the
    due times of marker chunks are counted from (``time.time`` if not given).

    Its class becomes a subclass of its own with :class:`Offloading` mixed in (so it stays an
    instance of its backend class, and attributes set on it reach the backend's methods). A
    wrapper (``.inner``) around a store that offloads already is left as it is.
    """
    if isinstance(max_payload, bool) or not isinstance(max_payload, int) or max_payload <= 0:
        raise ConfigurationError(f"max_payload must be a positive number of bytes, got {max_payload!r}")
    found = find_inner(store, lambda s: isinstance(s, Offloading))
    if found is not None:
        found.max_payload = max_payload
        if clock is not None:
            found.chunk_clock = clock
        return store
    cls = type(store)
    if cls not in _CLASSES:
        skip = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__abstractmethods__", "_abc_impl"}
        methods = {k: v for k, v in Offloading.__dict__.items() if k not in skip}
        # the same name: spans and logs name the backend (TracedStore uses the class name)
        mixed = type(cls.__name__, (cls,), {**methods, "__module__": cls.__module__})
        mixed._ofl_class = mixed  # type: ignore[attr-defined]
        Offloading.register(mixed)
        _CLASSES[cls] = mixed
    store.__class__ = _CLASSES[cls]
    assert isinstance(store, Offloading)
    store.max_payload = max_payload
    if clock is not None:
        store.chunk_clock = clock
    return store
