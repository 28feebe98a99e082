"""``Store.batch_with``: a batch of one partition and read-modify-writes of documents of any
partition in one transaction (SQLite, PostgreSQL, memory; Cosmos has none), and the wrappers
that must pass it on (a wrapper that hid it would switch the capability off silently)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.errors import ConfigurationError, ConflictError, DocumentTooLarge
from celery_durable.stores import Op, Rewrite, Store, store_from_url
from celery_durable.stores.base import MAX_DOC_BYTES, MAX_REWRITES, Doc
from celery_durable.stores.cosmos.store import CosmosStore
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.offload.store import MANIFEST_KEY, Offloading, offloaded
from celery_durable.stores.sqlite.store import SqliteStore
from celery_durable.stores.traced import TracedStore
from celery_durable.testing.counting import CountingStore
from tests.stores.conftest import _url_for

BACKENDS = ["memory", "sqlite", "postgres"]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s = store_from_url(_url_for(request, request.param, tmp_path))
    yield s
    s.close()


def bump(pk: str, doc_id: str, **extra: Any) -> Callable[[Doc | None], Doc | None]:
    """An update adding one to ``n`` (creating the document at 1)."""

    def update(doc: Doc | None) -> Doc | None:
        return {"pk": pk, "id": doc_id, "n": (doc or {}).get("n", 0) + 1, **extra}

    return update


def test_ops_and_a_rewrite_of_another_partition_commit_together(store: Store) -> None:
    assert store.cross_partition
    store.create({"pk": "p2", "id": "c", "n": 1})
    store.create({"pk": "p2", "id": "other", "v": 0})
    cursor = store.query_partition("p2").cursor
    seen: list[Doc | None] = []

    def update(doc: Doc | None) -> Doc:
        seen.append(doc)
        assert doc is not None
        return {**doc, "n": doc["n"] + 1}  # its _etag comes along and is ignored

    rewrite = Rewrite("p2", "c", update)
    etags = store.batch_with("p1", [Op.create({"pk": "p1", "id": "a", "v": 1})], [rewrite])
    assert etags == [store.read("p1", "a")["_etag"]]  # type: ignore[index]
    after = store.read("p2", "c")
    assert after is not None and after["n"] == 2 and "_etag" in seen[0]  # type: ignore[operator]
    assert rewrite.etag == after["_etag"]
    delta = store.query_partition("p2", since=cursor)
    assert [d["n"] for d in delta.docs if d["id"] == "c"] == [2]


def test_a_missing_document_is_given_as_none_and_can_be_created(store: Store) -> None:
    got: list[Doc | None] = []

    def update(doc: Doc | None) -> Doc:
        got.append(doc)
        return {"pk": "p2", "id": "new", "made": True}

    rewrite = Rewrite("p2", "new", update)
    assert store.batch_with("p1", [], [rewrite]) == []
    assert got == [None]
    doc = store.read("p2", "new")
    assert doc is not None and doc["made"] and rewrite.etag == doc["_etag"]


@pytest.mark.parametrize("failing", ["stale_if_match", "create_existing"])
def test_a_failing_op_applies_nothing(store: Store, failing: str) -> None:
    etag = store.create({"pk": "p1", "id": "a", "v": 1})
    assert etag is not None
    store.replace({"pk": "p1", "id": "a", "v": 2}, etag)  # the etag is stale now
    store.create({"pk": "p2", "id": "c", "n": 1})
    op = (
        Op.replace({"pk": "p1", "id": "a", "v": 3}, etag)
        if failing == "stale_if_match"
        else Op.create({"pk": "p1", "id": "a"})
    )
    rewrite = Rewrite("p2", "c", bump("p2", "c"))
    rewrite.etag = "left over"
    with pytest.raises(ConflictError):
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "b"}), op], [rewrite])
    assert store.read("p1", "b") is None and store.read("p1", "a")["v"] == 2  # type: ignore[index]
    assert store.read("p2", "c")["n"] == 1 and rewrite.etag is None  # type: ignore[index]


def test_an_update_that_raises_rolls_everything_back(store: Store) -> None:
    store.create({"pk": "p2", "id": "c", "n": 1})

    def boom(doc: Doc | None) -> Doc:
        raise RuntimeError("no")

    first = Rewrite("p2", "d", bump("p2", "d"))  # an earlier rewrite of the same call
    with pytest.raises(RuntimeError, match="no"):
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [first, Rewrite("p2", "c", boom)])
    assert store.read("p1", "a") is None and store.read("p2", "d") is None
    assert store.read("p2", "c")["n"] == 1  # type: ignore[index]
    assert first.etag is None
    # the store is usable afterwards (the transaction ended, the connection is clean)
    assert store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [first]) != [None]
    assert first.etag == store.read("p2", "d")["_etag"]  # type: ignore[index]


def test_an_update_returning_none_leaves_the_document(store: Store) -> None:
    before = store.create({"pk": "p2", "id": "c", "n": 1})
    rewrite = Rewrite("p2", "c", lambda doc: None)
    etags = store.batch_with("p1", [Op.upsert({"pk": "p1", "id": "a"})], [rewrite])
    assert etags[0] is not None and store.read("p1", "a") is not None
    assert rewrite.etag is None and store.read("p2", "c")["_etag"] == before  # type: ignore[index]


def test_a_rewritten_due_document_is_found_by_scan_due(store: Store) -> None:
    update = bump("p2", "timer", due_kind="bw_test", due_at=100.0)
    store.batch_with("p1", [], [Rewrite("p2", "timer", update)])
    assert [(r.pk, r.id, r.due_at) for r in store.scan_due("bw_test", 150.0)] == [("p2", "timer", 100.0)]
    # and leaves the scan when the next rewrite drops the keys
    store.batch_with("p1", [], [Rewrite("p2", "timer", lambda doc: {"pk": "p2", "id": "timer"})])
    assert store.scan_due("bw_test", 150.0) == []


def test_a_too_large_rewritten_document_applies_nothing(store: Store) -> None:
    store.create({"pk": "p2", "id": "c", "n": 1})
    big = Rewrite("p2", "c", lambda doc: {"pk": "p2", "id": "c", "blob": "x" * (MAX_DOC_BYTES + 10)})
    with pytest.raises(DocumentTooLarge):
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [big])
    assert store.read("p1", "a") is None and store.read("p2", "c")["n"] == 1 and big.etag is None  # type: ignore[index]


def test_what_update_returns_must_be_its_document(store: Store) -> None:
    wrong = Rewrite("p2", "c", lambda doc: {"pk": "p3", "id": "c"})
    with pytest.raises(ConfigurationError):
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [wrong])
    assert store.read("p1", "a") is None and store.read("p3", "c") is None


def test_a_document_once_and_not_too_many_rewrites(store: Store) -> None:
    with pytest.raises(ConfigurationError, match="twice"):
        store.batch_with("p1", [], [Rewrite("p2", "c", bump("p2", "c")), Rewrite("p2", "c", bump("p2", "c"))])
    with pytest.raises(ConfigurationError, match="twice"):  # an op's document
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [Rewrite("p1", "a", bump("p1", "a"))])
    many = [Rewrite("p2", f"c{i}", bump("p2", f"c{i}")) for i in range(MAX_REWRITES + 1)]
    with pytest.raises(ConfigurationError, match="at most"):
        store.batch_with("p1", [], many)
    assert store.query_partition("p2").docs == [] and store.query_partition("p1").docs == []
    # a rewrite in the batch's own partition (another document) is fine
    store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [Rewrite("p1", "b", bump("p1", "b"))])
    assert {d["id"] for d in store.query_partition("p1").docs} == {"a", "b"}


def test_rewritten_exec_keeps_its_search_attributes_indexed(store: Store) -> None:
    from celery_durable.stores.base import ExecFilter

    def exec_doc(doc: Doc | None) -> Doc:
        return {"pk": "e1", "id": "exec", "workflow": "w", "status": "running", "created_at": 5.0, "search": {"k": "v"}}

    store.batch_with("p1", [], [Rewrite("e1", "exec", exec_doc)])
    assert [d["pk"] for d in store.list_execs(ExecFilter(search={"k": "v"})).docs] == ["e1"]


# -- no lost update under concurrency ------------------------------------------------------------

CALLS = 15


def _increment(store: Store, worker: int, calls: int) -> None:
    for i in range(calls):
        own = Op.create({"pk": f"w{worker}", "id": f"d{i}"})
        store.batch_with(f"w{worker}", [own], [Rewrite("shared", "counter", bump("shared", "counter"))])


def _increment_in_process(path: str, worker: int, calls: int) -> None:
    store = SqliteStore(path, busy_timeout=30.0)
    try:
        _increment(store, worker, calls)
    finally:
        store.close()


def test_no_lost_update_across_sqlite_processes(tmp_path: Path) -> None:
    path = str(tmp_path / "store.db")
    SqliteStore(path).create({"pk": "shared", "id": "counter", "n": 0})
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_increment_in_process, args=(path, w, CALLS)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * 4
    store = SqliteStore(path)
    assert store.read("shared", "counter")["n"] == 4 * CALLS  # type: ignore[index]
    assert all(len(store.query_partition(f"w{w}").docs) == CALLS for w in range(4))


def test_no_lost_update_across_postgres_connections(postgres_url: str) -> None:
    # one store per thread: a connection each (and one pool shared would serialise nothing)
    stores = [store_from_url(postgres_url) for _ in range(4)]
    stores[0].create({"pk": "shared", "id": "counter", "n": 0})
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def run(w: int) -> None:
        try:
            barrier.wait()
            _increment(stores[w], w, CALLS)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert stores[0].read("shared", "counter")["n"] == len(stores) * CALLS  # type: ignore[index]
    for s in stores:
        s.close()


def test_racing_creators_of_a_missing_document_lose_no_update(postgres_url: str) -> None:
    """No row to lock: the second insert waits for the first and reads the row it made."""
    stores = [store_from_url(postgres_url) for _ in range(4)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(len(stores))

    def run(w: int) -> None:
        try:
            barrier.wait()
            stores[w].batch_with(f"w{w}", [], [Rewrite("shared", "fresh", bump("shared", "fresh"))])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(w,)) for w in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    assert stores[0].read("shared", "fresh")["n"] == len(stores)  # type: ignore[index]
    for s in stores:
        s.close()


# -- wrappers and stores without it -----------------------------------------------------------------


@pytest.mark.parametrize("wrap", ["traced", "counting", "offloaded", "counting_over_offloaded"])
def test_wrappers_forward_batch_with(tmp_path: Path, wrap: str) -> None:
    backend: Store = SqliteStore(str(tmp_path / "store.db"))
    if wrap == "traced":
        store: Store = TracedStore(backend)
    elif wrap == "counting":
        store = CountingStore(backend)
    elif wrap == "offloaded":
        store = offloaded(backend)
    else:
        store = CountingStore(offloaded(backend))
    assert store.cross_partition
    rewrite = Rewrite("p2", "c", bump("p2", "c"))
    big = {"pk": "p1", "id": "big", "blob": "y" * (MAX_DOC_BYTES + 1000)}  # offloaded by the offloading store
    ops = [Op.create({"pk": "p1", "id": "a"})] + ([Op.create(big)] if "offloaded" in wrap else [])
    etags = store.batch_with("p1", ops, [rewrite])
    assert rewrite.etag is not None and rewrite.etag == store.read("p2", "c")["_etag"]  # type: ignore[index]
    assert etags[0] == store.read("p1", "a")["_etag"]  # type: ignore[index]
    if "offloaded" in wrap:
        got = store.read("p1", "big")
        assert got is not None and got["blob"] == big["blob"] and got["_etag"] == etags[1]
    if isinstance(store, CountingStore):
        assert store.counts["batch_with"] == 1 and store.counts["batch"] == 0


def test_the_offloading_store_refuses_to_rewrite_a_document_stored_in_chunks(tmp_path: Path) -> None:
    store = offloaded(SqliteStore(str(tmp_path / "store.db")))
    assert isinstance(store, Offloading)
    store.create({"pk": "p2", "id": "big", "blob": "z" * (MAX_DOC_BYTES + 1000)})
    assert MANIFEST_KEY in store.backend.read("p2", "big")  # type: ignore[operator]
    rewrite = Rewrite("p2", "big", lambda doc: doc)
    with pytest.raises(ConfigurationError, match="chunks"):
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "big", "blob": "s" * (MAX_DOC_BYTES + 1000)})], [rewrite])
    assert store.read("p1", "big") is None and rewrite.etag is None
    assert store.backend.query_partition("p1").docs == []  # the refused op's fresh chunks were dropped

    def boom(doc: Doc | None) -> Doc:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):  # an update's own error: certainly not applied, chunks dropped too
        store.batch_with(
            "p1",
            [Op.create({"pk": "p1", "id": "big", "blob": "t" * (MAX_DOC_BYTES + 1000)})],
            [Rewrite("p2", "x", boom)],
        )
    assert store.backend.query_partition("p1").docs == []


def test_a_store_without_it_says_so() -> None:
    assert CosmosStore.cross_partition is False

    class Minimal(MemoryStore):
        cross_partition = False
        batch_with = Store.batch_with  # the base class's

    store = Minimal()
    rewrite = Rewrite("p2", "c", bump("p2", "c"))
    with pytest.raises(NotImplementedError):
        store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [rewrite])
    assert store.read("p1", "a") is None and rewrite.etag is None
    # wrappers say what the store under them says, and the offloading one refuses before writing
    assert not TracedStore(store).cross_partition and not CountingStore(store).cross_partition
    with pytest.raises(NotImplementedError):
        offloaded(Minimal()).batch_with("p1", [], [rewrite])


def test_a_subclass_changing_batch_alone_claims_no_batch_with() -> None:
    class Spy(MemoryStore):
        def batch(self, pk: str, ops: Any) -> list[str | None]:
            return super().batch(pk, ops)

    class SpyBoth(Spy):
        def batch_with(self, pk: str, ops: Any, also: Any) -> list[str | None]:
            return super().batch_with(pk, ops, also)

    class SpySays(MemoryStore):
        cross_partition = True

        def batch(self, pk: str, ops: Any) -> list[str | None]:
            return super().batch(pk, ops)

    assert MemoryStore.cross_partition and not Spy.cross_partition
    assert SpyBoth.cross_partition is False  # nothing said it: its parent's
    assert SpySays.cross_partition


def test_the_simulation_store_forwards_and_watches_rewrites() -> None:
    from celery_durable.errors import StoreUnavailable
    from harness.sim_store import Faults, FaultyStore
    from tests.sim.test_faulty_store import FakeSim

    inner = MemoryStore()
    sim = FakeSim(Faults(before=0.0, after=0.0, crash=0.0))
    store = FaultyStore(inner, sim)  # type: ignore[arg-type]
    assert store.cross_partition
    written: list[tuple[str, bool]] = []
    store.pauses.written = lambda doc, created: written.append((doc["id"], created))  # type: ignore[method-assign]
    rewrite = Rewrite("p2", "c", bump("p2", "c"))
    etags = store.batch_with("p1", [Op.create({"pk": "p1", "id": "a"})], [rewrite])
    assert inner.calls.get("batch_with") == 1 and sim.preempted == ["p1"]
    assert etags == [inner.read("p1", "a")["_etag"]] and rewrite.etag == inner.read("p2", "c")["_etag"]  # type: ignore[index]
    assert written == [("a", True), ("c", True)]  # the batch's document, then the rewritten one
    # a rewrite that changed nothing is not a write
    written.clear()
    store.batch_with("p1", [Op.create({"pk": "p1", "id": "b"})], [Rewrite("p2", "c", lambda doc: None)])
    assert written == [("b", True)]

    # faults before: nothing reaches the store; after: applied, raised, and no etag handed out
    written.clear()
    store.sim.faults = Faults(before=1.0, after=0.0, crash=0.0, evict=0.0, thread=0.0)  # type: ignore[misc]
    again = Rewrite("p2", "c", bump("p2", "c"))
    with pytest.raises(StoreUnavailable, match="before"):
        store.batch_with("p1", [], [again])
    assert inner.read("p2", "c")["n"] == 1 and written == [] and again.etag is None  # type: ignore[index]
    store.sim.faults = Faults(before=0.0, after=1.0, crash=0.0, evict=0.0, thread=0.0)  # type: ignore[misc]
    with pytest.raises(StoreUnavailable, match="after"):
        store.batch_with("p1", [], [again])
    assert inner.read("p2", "c")["n"] == 2 and written == [("c", False)] and again.etag is None  # type: ignore[index]
