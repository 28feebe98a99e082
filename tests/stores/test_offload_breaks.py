"""Adversarial tests of large-payload offloading (celery_durable/stores/offload/store.py).

Promise (README "Configuration" durable_max_payload, docs/architecture.md §4): documents past
the 2 MB item limit are offloaded transparently; "etags/conditional writes/batches/
query_partition/scan_due/list_execs unchanged for callers, on memory, SQLite and the Cosmos test
server"; orphan chunks only after a crash between the chunks and the commit.
"""

from __future__ import annotations

from typing import Any

from celery_durable.stores import Store
from celery_durable.stores.base import Op
from celery_durable.stores.offload.store import CHUNK_PREFIX


def _chunk_nonces(store: Any, pk: str) -> set[str]:
    raw = store.backend.query_partition(pk).docs
    return {d["id"].split("~")[2] for d in raw if str(d["id"]).startswith(CHUNK_PREFIX)}


def test_batch_with_one_unicode_heavy_doc_commits(adv_store: Store) -> None:
    """Breaks transparent offload for non-ASCII payloads on Cosmos: a document of 1.5 MB (UTF-8;
    500,000 CJK characters) is under the inline limit by its UTF-8 size, yet a one-op batch of
    it is refused with DocumentTooLarge (the request escapes it as \\uXXXX: 3 MB on the wire).
    The engine commits every drive in a batch, so such a result fails the workflow."""
    store = adv_store
    text = "漢" * 500_000
    etags = store.batch("p", [Op.create({"pk": "p", "id": "c", "v": text})])
    assert etags[0]
    assert store.read("p", "c")["v"] == text  # type: ignore[index]


def test_racing_upserts_of_a_big_document_leave_no_orphan_chunks(adv_store: Store, adv_other_handle: Any) -> None:
    """Breaks "orphan chunks only after a crash": two writers upserting the same big document
    (no crash, both succeed) leave the chunks of one of their versions behind for ever — each
    read the chunks to delete before the other committed. (A purge goes through
    query_partition, which hides chunks, so nothing ever collects them.)"""
    store = adv_store
    a: Any = store
    b: Any = adv_other_handle()
    big = "0" * 2_500_000
    a.upsert({"pk": "p", "id": "d", "v": big})
    real_put = a._ofl_put_chunks
    raced: list[int] = []

    def put_after_the_other_writer(pk: str, chunks: list[dict[str, Any]]) -> None:
        if not raced:  # the other writer commits between our read of the old chunks and our write
            raced.append(1)
            b.upsert({"pk": "p", "id": "d", "v": "1" * 2_500_000})
        real_put(pk, chunks)

    a._ofl_put_chunks = put_after_the_other_writer
    try:
        a.upsert({"pk": "p", "id": "d", "v": "2" * 2_500_000})
    finally:
        del a._ofl_put_chunks
    assert store.read("p", "d")["v"] == "2" * 2_500_000  # type: ignore[index]
    assert len(_chunk_nonces(store, "p")) == 1, "chunks of a replaced version were left behind"
