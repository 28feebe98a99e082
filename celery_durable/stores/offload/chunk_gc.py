"""The collector of orphan chunk documents (:mod:`.store`), run by the engine's recovery scan.

A large document's chunks are written before its main document (the commit point) and the
replaced version's are dropped after it: a process (or store) that fails in between leaves chunks
no main document names. Each version's *marker* chunk (its last piece, kept small, the first written, carrying
``of``: the main document's id, and ``n``: the count) is due ``CHUNK_GRACE`` (1 h) after the write,
far beyond any write's duration. :func:`collect_chunks` takes the due markers and point-reads
each one's main document:

* its manifest names the marker's nonce: the chunks are live; the marker is pushed to its next
  look (:func:`.chunks.recheck_delay`: 2, 4, 8 … hours, then weekly; one etag-guarded write).
  Never cleared for good: if that version is replaced, deleted or purged later and the writer
  could not drop its chunks (an outage, a crash after the commit), a later look finds it named
  by nothing;
* otherwise (another version, no manifest, no document): the marker is claimed first (an
  etag-guarded rewrite), then the version's other chunks are deleted, the marker last. A slow
  writer re-arms its markers before its commit (:meth:`.Offloading._ofl_put_chunks`): of the
  claim and the re-arm, the first wins and the other conflicts (the writer then commits
  nothing); a collector failing midway finds the claimed marker again;
* the main document cannot be decoded, or the marker is malformed: nobody can tell, the chunks
  are kept and the marker is asked again a grace later (an error in the report).

Races: a write still on its way has chunks younger than the grace (not due); a main document
replaced while the collector decides is either read before (the marker is pushed, or the
replace deleted it first: the guarded write conflicts and is skipped) or after (its chunks are
the replaced version's, the replace drops them too). A chunk is deleted only when the main
document named in it does not name it, read after the grace, and its marker was claimed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from celery_durable.errors import ConflictError, CorruptDocument, StoreError
from celery_durable.stores.base import Store
from celery_durable.stores.offload.chunks import DUE_CHUNK, chunk_ids, chunk_nonce, manifest_of, recheck_delay
from celery_durable.stores.offload.store import Offloading

__all__ = ["ChunkReport", "collect_chunks"]

log = logging.getLogger("celery_durable.store")


@dataclass
class ChunkReport:
    #: versions whose chunks were deleted (no main document names them)
    collected: int = 0
    #: versions found referenced (their marker pushed to its next look)
    kept: int = 0
    #: markers left for later (undecidable, or a store error)
    errors: int = 0


def collect_chunks(store: Offloading, now: float, limit: int = 100) -> ChunkReport:
    """One pass over the marker chunks due at ``now`` (at most ``limit``); a store error on one
    is counted and logged, the others go on (the scan itself failing raises)."""
    report = ChunkReport()
    raw = store.backend
    for ref in raw.scan_due(DUE_CHUNK, now, limit):
        try:
            _collect(store, raw, ref.pk, ref.id, now, report)
        except StoreError as exc:
            report.errors += 1
            log.warning("could not collect chunk %s in %s: %s", ref.id, ref.pk, exc)
    return report


def _collect(store: Offloading, raw: Store, pk: str, chunk_id: str, now: float, report: ChunkReport) -> None:
    marker = raw.read(pk, chunk_id)
    if marker is None or marker.get("due_kind") != DUE_CHUNK:
        return  # deleted meanwhile
    body = {k: v for k, v in marker.items() if k != "_etag"}
    nonce, count, owner_id = chunk_nonce(chunk_id), marker.get("n"), marker.get("of")
    if (
        nonce is None
        or not isinstance(owner_id, str)
        or isinstance(count, bool)
        or not isinstance(count, int)
        or not 1 <= count <= store.max_payload // 1024 + 1
        or chunk_id not in chunk_ids(nonce, count)
    ):
        _postpone(store, raw, body, marker["_etag"], now, report, "a malformed marker")
        return
    try:
        owner = raw.read(pk, owner_id)
        manifest = None if owner is None else manifest_of(pk, owner)
    except CorruptDocument as exc:
        _postpone(store, raw, body, marker["_etag"], now, report, str(exc))
        return
    if manifest is not None and manifest["nonce"] == nonce:
        checks = body.get("checks")
        checks = checks if isinstance(checks, int) and not isinstance(checks, bool) else 0
        later = body | {"checks": checks + 1, "due_at": now + recheck_delay(checks, store.chunk_grace)}
        try:
            raw.replace(later, if_match=marker["_etag"])
        except ConflictError:
            pass  # deleted by a replace of its document meanwhile
        report.kept += 1
        return
    try:  # claimed: a slow writer's re-arm of this marker now conflicts (it commits nothing)
        claimed = raw.replace(body | {"due_at": now + store.chunk_grace}, if_match=marker["_etag"])
    except ConflictError:
        return  # re-armed, pushed or deleted meanwhile: a later pass looks again if it is still due
    if not store._ofl_drop(pk, [c for c in chunk_ids(nonce, count) if c != chunk_id]):
        report.errors += 1  # the claimed marker stays: due again a grace later
        return
    try:
        raw.delete(pk, chunk_id, if_match=claimed)
    except ConflictError:
        pass  # changed or deleted meanwhile: a later pass sees it again if it is still due
    report.collected += 1


def _postpone(
    store: Offloading, raw: Store, body: dict[str, object], etag: str, now: float, report: ChunkReport, why: str
) -> None:
    report.errors += 1
    log.warning("chunk %s in %s kept for now: %s", body.get("id"), body.get("pk"), why)
    try:
        raw.replace(body | {"due_at": now + store.chunk_grace}, if_match=etag)
    except ConflictError:
        pass
