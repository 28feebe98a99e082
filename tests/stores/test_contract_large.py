"""The storage contract for documents over the item limit (issue 12), on every backend.

Stores built by ``store_from_url`` offload a document past the 2 MB item limit into chunk
documents of its partition (``celery_durable/stores/offload/store.py``) and reassemble it on read, up
to ``max_payload`` (``durable_max_payload``); past that, :class:`PayloadTooLarge` and nothing is
written. ``store.backend`` is the backend itself: the tests look there for leftover chunks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.errors import ConflictError, CorruptDocument, DocumentTooLarge, PayloadTooLarge
from celery_durable.stores import MAX_DOC_BYTES, Doc, Op, Store, store_from_url
from celery_durable.stores.base import ExecFilter, doc_size
from celery_durable.stores.offload.store import CHUNK_PREFIX, MANIFEST_KEY, Offloading, inline_limit
from tests.stores.test_contract import T0, D, body, sized

MB = 1024 * 1024
INLINE = inline_limit(MAX_DOC_BYTES)


def raw_ids(store: Store, pk: str) -> list[str]:
    """Every document id the backend holds in ``pk``, chunks included."""
    assert isinstance(store, Offloading)
    return sorted(d["id"] for d in store.backend.query_partition(pk).docs)


def chunks(store: Store, pk: str) -> list[str]:
    return [i for i in raw_ids(store, pk) if i.startswith(CHUNK_PREFIX)]


@pytest.fixture
def small_max(store_url: str, store: Store) -> Iterator[Store]:
    """The store with a max payload of 3 MiB (for memory://, the same object: a new URL is a new store)."""
    if store_url.startswith("memory"):
        assert isinstance(store, Offloading)
        store.max_payload = 3 * MB
        yield store
        return
    s = store_from_url(store_url, max_payload=3 * MB)
    yield s
    s.close()


# "\udc80": a lone surrogate, kept escaped (tests/stores/test_contract.py), in the chunks too
@pytest.mark.parametrize(
    ("size", "char"), [(3 * MB, "x"), (3 * MB, "é"), (3 * MB, "🙂"), (3 * MB, "\udc80"), (10 * MB, "x")]
)
def test_a_big_document_round_trips(store: Store, size: int, char: str) -> None:
    doc = sized("p", "big", size, char=char) | {"status": "running", "n": 7}
    doc["blob"] = doc["blob"][: len(doc["blob"]) - 30]  # room for the extra fields
    etag = store.create(doc)
    assert etag is not None
    got = store.read("p", "big")
    assert body(got) == doc and got is not None and got["_etag"] == etag
    assert [body(d) for d in store.read_many("p", ["big", "nope", "big"])] == [doc, None, doc]
    listed = store.query_partition("p").docs
    assert [d["id"] for d in listed] == ["big"]  # chunk documents never show
    assert body(listed[0]) == doc and listed[0]["_etag"] == etag
    assert MANIFEST_KEY not in got
    assert chunks(store, "p")  # it really was offloaded


def test_the_inline_limit_is_exact(store: Store) -> None:
    store.create(sized("p", "at", INLINE))
    assert raw_ids(store, "p") == ["at"]  # at the limit: stored as it is
    store.create(sized("p2", "over", INLINE + 1))
    assert chunks(store, "p2")  # one byte over: offloaded
    assert body(store.read("p2", "over")) == sized("p2", "over", INLINE + 1)


def test_exactly_the_max_payload_is_accepted_and_one_byte_more_refused(store: Store, small_max: Store) -> None:
    assert isinstance(small_max, Offloading) and small_max.max_payload == 3 * MB
    assert small_max.create(sized("p", "max", 3 * MB)) is not None
    assert body(small_max.read("p", "max")) == sized("p", "max", 3 * MB)
    etag = small_max.create(D("p", "small", v=1))
    before = raw_ids(small_max, "p")
    for how in ("create", "replace", "upsert", "batch"):
        doc = sized("p", "small" if how != "create" else "new", 3 * MB + 1, char="é")
        with pytest.raises(PayloadTooLarge) as info:
            if how == "create":
                small_max.create(doc)
            elif how == "replace":
                small_max.replace(doc, if_match=etag)
            elif how == "upsert":
                small_max.upsert(doc)
            else:
                small_max.batch("p", [Op.create(D("p", "fine")), Op.replace(doc, if_match=etag)])
        assert isinstance(info.value, DocumentTooLarge)  # what callers caught before
        assert info.value.limit == 3 * MB and info.value.size == 3 * MB + 1
        assert "durable_max_payload" in str(info.value)
        assert raw_ids(small_max, "p") == before  # nothing written, no chunk left


def test_replace_big_small_big_keeps_only_the_current_chunks(store: Store) -> None:
    big1 = sized("p", "d", 3 * MB)
    etag = stale = store.create(big1)
    first = chunks(store, "p")
    small = D("p", "d", v="small")
    etag = store.replace(small, if_match=etag)
    assert body(store.read("p", "d")) == small and chunks(store, "p") == []
    big2 = sized("p", "d", 5 * MB, char="é")
    etag = store.replace(big2, if_match=etag)
    assert body(store.read("p", "d")) == big2
    second = chunks(store, "p")
    assert second and not set(first) & set(second)
    big3 = sized("p", "d", 4 * MB, char="🙂")
    etag = store.replace(big3, if_match=etag)
    assert body(store.read("p", "d")) == big3 and not set(second) & set(chunks(store, "p"))
    # a stale etag is a conflict and leaves neither the value nor chunks behind
    kept = chunks(store, "p")
    with pytest.raises(ConflictError):
        store.replace(sized("p", "d", 3 * MB), if_match=stale)
    assert chunks(store, "p") == kept and body(store.read("p", "d")) == big3
    # unconditional writes find the chunks they replace themselves
    store.replace(sized("p", "d", 3 * MB), if_match=None)
    store.upsert(big2)
    assert body(store.read("p", "d")) == big2 and len(chunks(store, "p")) == len(second)


@pytest.mark.parametrize("conditional", [True, False])
def test_delete_removes_the_chunks(store: Store, conditional: bool) -> None:
    etag = store.create(sized("p", "d", 3 * MB))
    store.create(D("p", "other"))
    with pytest.raises(ConflictError):
        store.delete("p", "d", if_match=store.create(D("p", "x")))
    assert store.delete("p", "d", if_match=etag if conditional else None)
    assert raw_ids(store, "p") == ["other", "x"]
    assert store.read("p", "d") is None and not store.delete("p", "d")


def test_a_batch_with_big_documents(store: Store) -> None:
    e_small = store.create(D("p", "s", v=0))
    e_big = store.create(sized("p", "b", 3 * MB))
    old = chunks(store, "p")
    new_big = sized("p", "n", 4 * MB, char="é")
    replaced = sized("p", "s", 3 * MB) | {"due_kind": "tick", "due_at": T0 - 5}
    replaced["blob"] = replaced["blob"][:-60]
    etags = store.batch(
        "p", [Op.create(new_big), Op.replace(replaced, if_match=e_small), Op.delete("b", if_match=e_big)]
    )
    assert etags[2] is None
    assert body(store.read("p", "n")) == new_big and store.read("p", "n")["_etag"] == etags[0]  # type: ignore[index]
    assert body(store.read("p", "s")) == replaced
    assert not set(old) & set(chunks(store, "p"))  # the deleted document's chunks went with it
    assert [r.id for r in store.scan_due("tick", T0)] == ["s"]  # due fields stay on the main document
    # the etags a batch returns are good for the next conditional write
    store.replace(D("p", "s", v=1), if_match=etags[1])
    # a failing batch writes nothing, chunks included
    before = raw_ids(store, "p")
    with pytest.raises(ConflictError):
        store.batch("p", [Op.create(sized("p", "m", 3 * MB)), Op.create(D("p", "n"))])
    assert raw_ids(store, "p") == before


def test_query_partition_since_a_cursor_reassembles(store: Store) -> None:
    store.create(D("p", "a"))
    cursor = store.query_partition("p").cursor
    big = sized("p", "b", 3 * MB)
    store.create(big)
    docs = {d["id"]: d for d in store.query_partition("p", since=cursor).docs}
    assert "b" in docs and body(docs["b"]) == big
    assert not any(i.startswith(CHUNK_PREFIX) for i in docs)


def test_list_execs_returns_big_exec_documents_whole(store: Store) -> None:
    try:
        store.list_execs(ExecFilter())
    except NotImplementedError:
        pytest.skip("this backend has no listing")  # pragma: no cover - every backend lists today
    big = sized("e1", "exec", 3 * MB) | {"workflow": "wf", "status": "running", "created_at": T0}
    big["blob"] = big["blob"][:-80]
    store.create(big)
    page = store.list_execs(ExecFilter(workflow="wf", status="running"))
    assert [body(d) for d in page.docs] == [big]


def _break(store: Store, pk: str, how: str) -> None:
    assert isinstance(store, Offloading)
    victim = chunks(store, pk)[-1]
    if how == "missing":
        store.backend.delete(pk, victim)
    else:
        raw = store.backend.read(pk, victim)
        assert raw is not None
        data = raw["data"]
        store.backend.replace(raw | {"data": data[:-1] + ("y" if data[-1] != "y" else "z")}, if_match=raw["_etag"])


@pytest.mark.parametrize("how", ["missing", "tampered"])
def test_a_missing_or_corrupt_chunk_is_a_clear_error_not_a_wrong_value(store: Store, how: str) -> None:
    store.create(sized("p", "d", 3 * MB))
    store.create(D("p", "fine"))
    _break(store, "p", how)
    for read in (
        lambda: store.read("p", "d"),
        lambda: store.read_many("p", ["fine", "d"]),
        lambda: store.query_partition("p"),
    ):
        with pytest.raises(CorruptDocument, match="'d'"):
            read()
    assert body(store.read("p", "fine")) == D("p", "fine")


def test_a_reader_racing_a_replace_gets_the_new_version(store: Store) -> None:
    """The reader read the main document, then a replace deleted the chunks it names."""
    assert isinstance(store, Offloading)
    etag = store.create(sized("p", "d", 3 * MB))
    stale = store.backend.read("p", "d")
    newer = sized("p", "d", 3 * MB, char="é")
    store.replace(newer, if_match=etag)
    assert stale is not None and body(store._ofl_reread("p", stale)) == newer


def test_small_documents_cost_no_extra_round_trip() -> None:
    store = store_from_url("memory://")
    assert isinstance(store, Offloading)
    inner: Any = store  # the same object: the backend's own methods run underneath
    etag = store.create(D("p", "a", v=1))
    store.replace(D("p", "a", v=2), if_match=etag)
    store.read("p", "a")
    store.query_partition("p")
    store.batch("p", [Op.create(D("p", "b"))])
    assert inner.calls == {"create": 1, "replace": 1, "read": 1, "query_partition": 1, "batch": 1}
    assert doc_size(D("p", "a")) < INLINE


def test_the_factory_keeps_the_backend_class(tmp_path: Path) -> None:
    from celery_durable.stores.sqlite.store import SqliteStore

    store = store_from_url(f"sqlite:///{tmp_path}/s.db", max_payload=5 * MB)
    assert isinstance(store, SqliteStore) and isinstance(store, Offloading) and store.max_payload == 5 * MB
    assert store.max_doc_bytes == MAX_DOC_BYTES  # the item limit, as before


def test_a_document_of_a_malformed_manifest_is_corrupt(store: Store) -> None:
    assert isinstance(store, Offloading)
    bad: Doc = D("p", "d", **{MANIFEST_KEY: {"n": "two"}})
    store.backend.create(bad)
    with pytest.raises(CorruptDocument, match="manifest"):
        store.read("p", "d")


def test_an_unconditional_write_over_a_corrupt_document_replaces_it(tmp_path: Path) -> None:
    # the engine fails an execution whose exec is not even JSON by upserting over it: looking
    # for the old version's chunks must not stop that write (found by the worker test
    # tests/integration/test_faults.py::test_corrupt_document_fails_that_execution_only)
    import sqlite3

    store = store_from_url(f"sqlite:///{tmp_path / 'c.db'}")
    store.create({"pk": "p", "id": "exec", "status": "running"})
    with sqlite3.connect(tmp_path / "c.db") as conn:
        assert conn.execute("UPDATE docs SET body = '{not json' WHERE pk = 'p' AND id = 'exec'").rowcount == 1
    with pytest.raises(CorruptDocument):
        store.read("p", "exec")
    store.upsert({"pk": "p", "id": "exec", "status": "failed"})
    assert body(store.read("p", "exec")) == {"pk": "p", "id": "exec", "status": "failed"}
    store.close()
