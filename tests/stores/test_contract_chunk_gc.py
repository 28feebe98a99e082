"""Orphan chunk documents are collected, referenced ones never (offload.py, chunk_gc.py), on every backend.

A large document's chunks are written before its main document (the commit point) and the replaced
version's are dropped after it: a process that dies in between leaves chunks nobody references.
The first chunk written of each version is due ``CHUNK_GRACE`` after the write; the collector
(run by the recovery scan) then deletes the version's chunks unless the main document's manifest
names them, in which case it pushes that chunk's next look back (2, 4, 8 … hours, then weekly:
``_chunks.recheck_delay``; a version replaced or deleted later whose drop failed is then collected).
"""

from __future__ import annotations

import threading
import time

import pytest

from celery_durable.errors import CorruptDocument
from celery_durable.stores import Doc, Op, Store
from celery_durable.stores.base import doc_size
from celery_durable.stores.offload.chunk_gc import ChunkReport, collect_chunks
from celery_durable.stores.offload.chunks import chunk_ids as _chunk_ids
from celery_durable.stores.offload.store import CHUNK_GRACE, DUE_CHUNK, MANIFEST_KEY, Offloading
from tests.stores.test_contract import D, body, sized
from tests.stores.test_contract_large import MB, chunks

#: later than every due time these tests write
FAR = 1e12


def referenced(store: Store, pk: str) -> list[str]:
    """The chunk ids the main documents of ``pk`` name in their manifests (as stored)."""
    assert isinstance(store, Offloading)
    ids: list[str] = []
    for d in store.backend.query_partition(pk).docs:
        m = d.get(MANIFEST_KEY)
        if m is not None:
            ids += _chunk_ids(m["nonce"], m["n"])
    return sorted(ids)


def crash_before_commit(store: Store, doc: Doc, written: int | None = None) -> list[str]:
    """Write ``doc``'s chunks (the first ``written`` of them) and die before its main document."""
    assert isinstance(store, Offloading)
    _, pending, ref = store._ofl_split(doc)
    assert ref is not None and len(pending) >= 3
    store._ofl_put_chunks(str(doc["pk"]), pending[:written])
    return sorted(c["id"] for c in pending[:written])


@pytest.mark.parametrize("written", [None, 2], ids=["all-chunks", "some-chunks"])
def test_chunks_of_a_write_that_never_committed_are_collected_after_the_grace(
    store: Store, written: int | None
) -> None:
    live = sized("p", "live", 3 * MB)
    store.create(live)
    kept = chunks(store, "p")
    orphans = crash_before_commit(store, sized("p", "d", 5 * MB, char="é"), written)
    assert orphans and chunks(store, "p") == sorted(kept + orphans)
    # within the grace the write may still be on its way: nothing is touched
    assert collect_chunks(store, time.time()) == ChunkReport()
    assert chunks(store, "p") == sorted(kept + orphans)
    report = collect_chunks(store, time.time() + CHUNK_GRACE + 60)
    assert (report.collected, report.kept, report.errors) == (1, 1, 0)
    assert chunks(store, "p") == kept == referenced(store, "p")
    assert body(store.read("p", "live")) == live and store.read("p", "d") is None
    # the orphans are gone; the live version is looked at again only after its recheck delay
    soon = time.time() + CHUNK_GRACE + 120
    assert collect_chunks(store, soon) == ChunkReport()
    assert collect_chunks(store, FAR) == ChunkReport(kept=1)  # and stays as long as it is named
    assert chunks(store, "p") == kept and body(store.read("p", "live")) == live


@pytest.mark.parametrize("how", ["replace", "delete"])
def test_chunks_a_committed_write_did_not_drop_are_collected(
    store: Store, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    etag = store.create(sized("p", "d", 3 * MB))
    first = chunks(store, "p")
    newer = sized("p", "d", 4 * MB, char="🙂")
    monkeypatch.setattr(store, "_ofl_drop", lambda pk, ids: None)  # dies right after the commit
    if how == "replace":
        store.replace(newer, if_match=etag)
    else:
        assert store.delete("p", "d", if_match=etag)
    monkeypatch.undo()
    assert set(first) <= set(chunks(store, "p"))
    report = collect_chunks(store, FAR)
    assert report.collected == 1 and report.errors == 0
    assert not set(first) & set(chunks(store, "p"))
    assert chunks(store, "p") == referenced(store, "p")
    if how == "replace":
        assert report.kept == 1 and chunks(store, "p")
        assert body(store.read("p", "d")) == newer
    else:
        assert chunks(store, "p") == [] and store.read("p", "d") is None


def test_referenced_chunks_survive_and_are_looked_at_once(store: Store) -> None:
    assert isinstance(store, Offloading)
    big = sized("p", "big", 3 * MB, char="é")
    store.create(big)
    pair = [sized("q", "a", 3 * MB), sized("q", "b", 4 * MB, char="🙂")]
    etags = store.batch("q", [Op.create(pair[0]), Op.create(pair[1]), Op.create(D("q", "small"))])
    before = {pk: chunks(store, pk) for pk in ("p", "q")}
    # one chunk per offloaded version is due (3 here), none for the small document; a small one:
    # clearing its due fields rewrites a few KB, not a piece of the body
    due = store.backend.scan_due(DUE_CHUNK, FAR)
    assert len(due) == 3
    assert all(doc_size(body(store.backend.read(r.pk, r.id)) or {}) < 8 * 1024 for r in due)
    report = collect_chunks(store, FAR)
    assert (report.collected, report.kept, report.errors) == (0, 3, 0)
    assert {pk: chunks(store, pk) for pk in ("p", "q")} == before
    # pushed back: not due again before 2 graces (then 4, 8 … up to a week)
    assert store.backend.scan_due(DUE_CHUNK, FAR + 1.5 * CHUNK_GRACE) == []
    assert collect_chunks(store, FAR + 1.5 * CHUNK_GRACE) == ChunkReport()
    assert len(store.backend.scan_due(DUE_CHUNK, FAR + 2.5 * CHUNK_GRACE)) == 3
    assert body(store.read("p", "big")) == big
    assert [body(d) for d in store.read_many("q", ["a", "b", "small"])] == [*pair, D("q", "small")]
    # the etags from before the collection still guard the next write: it did not touch the documents
    store.replace(D("q", "a", v=1), if_match=etags[0])
    # the replace dropped that version's chunks: nothing to collect, the others are still named
    assert collect_chunks(store, 2 * FAR).collected == 0
    assert chunks(store, "q") == referenced(store, "q") != []


def test_a_chunk_of_a_corrupt_document_is_kept(store: Store) -> None:
    """Whether a corrupt main document names a chunk cannot be known: it is kept, asked again later."""
    assert isinstance(store, Offloading)
    store.create(sized("p", "d", 3 * MB))
    raw = store.backend.read("p", "d")
    assert raw is not None
    store.backend.replace(raw | {MANIFEST_KEY: {"n": "two"}}, if_match=raw["_etag"])
    kept = chunks(store, "p")
    with pytest.raises(CorruptDocument):
        store.read("p", "d")
    report = collect_chunks(store, FAR)
    assert (report.collected, report.kept, report.errors) == (0, 0, 1)
    assert chunks(store, "p") == kept


def test_a_collector_racing_writers_never_deletes_a_referenced_chunk(store: Store) -> None:
    """Versions written an hour ago are due while writers replace them and readers read them."""
    assert isinstance(store, Offloading)
    t_old = time.time() - CHUNK_GRACE
    store.chunk_clock = lambda: t_old  # the first versions were written a grace ago
    docs = {i: sized("p", i, 3 * MB, char=c) for i, c in (("a", "x"), ("b", "é"))}
    etags = {i: store.create(d) for i, d in docs.items()}
    store.chunk_clock = time.time
    now = time.time() + CHUNK_GRACE / 2  # the old versions are due, every new one is not
    assert t_old + CHUNK_GRACE < now
    written: dict[str, list[Doc]] = {i: [d] for i, d in docs.items()}
    done, collecting = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    reports: list[ChunkReport] = []

    def write() -> None:
        try:
            assert collecting.wait(timeout=60)
            for round_ in range(4):
                for i in docs:
                    doc = sized("p", i, (3 + round_ % 2) * MB, char="🙂" if round_ % 2 else "x")
                    doc["round"] = round_
                    written[i].append(doc)
                    etags[i] = store.replace(doc, if_match=etags[i])
        except BaseException as exc:  # noqa: B036 - reported to the test
            errors.append(exc)
        finally:
            done.set()

    def collect() -> None:
        try:
            while not done.is_set():
                collecting.set()
                reports.append(collect_chunks(store, now))
        except BaseException as exc:  # noqa: B036 - reported to the test
            errors.append(exc)

    def read() -> None:
        try:
            while not done.is_set():
                for i in docs:
                    got = body(store.read("p", i))
                    assert any(got == w for w in reversed(written[i])), f"{i} read back wrong"
        except BaseException as exc:  # noqa: B036 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=f) for f in (write, collect, read)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == [] and reports
    assert sum(r.errors for r in reports) == 0
    assert all(body(store.read("p", i)) == written[i][-1] for i in docs)
    # what the race left, the next collections after the grace settle: only referenced chunks stay
    collect_chunks(store, FAR)
    assert chunks(store, "p") == referenced(store, "p") != []
    assert all(body(store.read("p", i)) == written[i][-1] for i in docs)
    assert collect_chunks(store, FAR).collected == 0  # what is left is named
