"""The Cosmos due index hands a step's entry to the next step (``DueIndex.handoffs``).

A workflow's step commit settles one marker (no due time any more) and creates the next one
(due when its lease or dispatch lapses) in one batch. The next marker relies on the settled one's
index entry instead of a new one: one request and ~5.5 RU less per step. The scanner, finding an
entry whose target let go of it, looks up the one document of that partition relying on it.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.errors import ConflictError
from celery_durable.stores import DueRef, Op, store_from_url
from celery_durable.stores.cosmos.index import DueIndex
from celery_durable.stores.cosmos.store import CosmosStore
from celery_durable.testing.cosmos_server import CosmosTestServer

pytestmark = [pytest.mark.cosmos, pytest.mark.foreign_documents]  # a store test's own documents


@pytest.fixture
def store(cosmos_url: str) -> Iterator[CosmosStore]:
    s = store_from_url(cosmos_url)
    assert isinstance(s, CosmosStore)
    yield s
    s.close()


def doc_ops(server: CosmosTestServer) -> dict[str, int]:
    return {op: n for op, n in server.stats()["ops"].items() if op != "other"}


def marker(pk: str, n: int, due_at: float | None) -> dict[str, Any]:
    doc: dict[str, Any] = {"pk": pk, "id": f"s:{n}", "input": "x" * 100}
    if due_at is not None:
        doc.update(due_kind="activity", due_at=due_at)
    return doc


def step(store: CosmosStore, pk: str, n: int, etag: str, due_at: float) -> str:
    """Settle marker n and create marker n + 1 due at ``due_at``, as a step commit does."""
    etags = store.batch(pk, [Op.replace(marker(pk, n, None), etag), Op.create(marker(pk, n + 1, due_at))])
    assert etags[1] is not None
    return etags[1]


def test_a_step_commit_writes_no_index_entry_and_the_next_step_is_found(
    store: CosmosStore, cosmos_server: CosmosTestServer
) -> None:
    now = time.time()
    etag = store.create(marker("w", 1, now + 30))
    assert etag is not None
    cosmos_server.reset_stats()
    for n in range(1, 4):
        etag = step(store, "w", n, etag, now + 30 + n)
    assert doc_ops(cosmos_server) == {"batch": 3}  # no entry upserted
    assert store.scan_due("activity", now + 20) == []
    assert store.scan_due("activity", now + 40) == [DueRef("w", "s:4", now + 33)]
    # the last step settles with no successor: the entry is garbage, deleted by the next scan
    store.replace(marker("w", 4, None), if_match=etag)
    assert store.scan_due("activity", now + 40) == []
    cosmos_server.reset_stats()
    assert store.scan_due("activity", now + 40) == []
    assert "query" in doc_ops(cosmos_server) and "delete" not in doc_ops(cosmos_server)  # nothing left


def test_the_scan_can_lose_a_handed_entry(
    store: CosmosStore, cosmos_server: CosmosTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The harness can fail: a scanner that does not look for the holder deletes the entry the
    next step relies on, and that step is never found."""
    now = time.time()
    etag = store.create(marker("b", 1, now + 30))
    assert etag is not None
    step(store, "b", 1, etag, now + 31)
    monkeypatch.setattr(DueIndex, "needs_holder", staticmethod(lambda *_: False))
    store.index = DueIndex(orphan_age=0)  # the settle's second is long past
    assert store.scan_due("activity", now + 40) == []  # lost
    monkeypatch.undo()
    assert store.scan_due("activity", now + 40) == []  # and stays lost: its entry is gone


def test_who_may_take_an_entry() -> None:
    index, now = DueIndex(), 1000.0
    ref = ["activity", now + 30, index.bucket_of(now + 30)]
    settle = ("replace", {"pk": "p", "id": "s:1"}, ref)
    nxt = ("create", {"pk": "p", "id": "s:2", "due_kind": "activity", "due_at": now + 31}, None)
    assert index.handoffs([settle, nxt], now) == {1: ref}
    # an earlier due time, another kind, one too far ahead, or an entry about to fall due: a new entry
    for due in ({"due_at": now + 29}, {"due_kind": "timer", "due_at": now + 31}, {"due_at": now + 30 + 301}):
        assert index.handoffs([settle, (nxt[0], nxt[1] | due, None)], now) == {}
    assert index.handoffs([settle, nxt], now + 26) == {}
    # a replace keeping a due time does not let go; a replace or an upsert never takes
    keep = ("replace", {"pk": "p", "id": "s:1", "due_kind": "activity", "due_at": now + 40}, ref)
    assert index.handoffs([keep, nxt], now) == {}
    assert index.handoffs([settle, ("replace", nxt[1], None)], now) == {}
    assert index.handoffs([settle, ("upsert", nxt[1], None)], now) == {}
    # one taker per entry
    other = ("create", {"pk": "p", "id": "s:3", "due_kind": "activity", "due_at": now + 32}, None)
    assert index.handoffs([settle, nxt, other], now) == {1: ref}


def test_chains_stay_complete_under_concurrent_writers_and_scanners(cosmos_url: str) -> None:
    """Writers run chains of steps (settle one, create the next; sometimes a heartbeat, an
    earlier due time, a settle with no successor, a fresh start) racing each other on the same
    partitions, while scanners look at random times: afterwards a scan finds exactly the
    documents that are due."""
    stores = [store_from_url(cosmos_url) for _ in range(3)]
    chains = [f"c{i}" for i in range(6)]
    for pk in chains:
        stores[0].create({"pk": pk, "id": "exec", "head": 1})
        stores[0].create(marker(pk, 1, time.time() + 30))
    stop = threading.Event()
    errors: list[BaseException] = []

    def writer(seed: int) -> None:
        rng, store = random.Random(seed), stores[seed % 2]
        try:
            for _ in range(40):
                pk = rng.choice(chains)
                ex = store.read(pk, "exec")
                assert ex is not None
                n = int(ex["head"])
                head = store.read(pk, f"s:{n}")
                assert head is not None
                now, choice = time.time(), rng.random()
                with contextlib.suppress(ConflictError):
                    if choice < 0.6:  # a step: settle the head, create the next
                        due = now + (rng.uniform(6, 60) if rng.random() < 0.85 else rng.uniform(-5, 5))
                        store.batch(
                            pk,
                            [
                                Op.replace({"pk": pk, "id": "exec", "head": n + 1}, ex["_etag"]),
                                Op.replace(marker(pk, n, None), head["_etag"]),
                                Op.create(marker(pk, n + 1, due)),
                            ],
                        )
                    elif choice < 0.8:  # a heartbeat or an earlier due time on the head
                        store.replace(marker(pk, n, now + rng.uniform(-5, 60)), if_match=head["_etag"])
                    else:  # settled with no successor
                        store.replace(marker(pk, n, None), if_match=head["_etag"])
        except BaseException as exc:  # noqa: B036 - reported below
            errors.append(exc)

    def scanner() -> None:
        try:
            while not stop.is_set():
                stores[2].scan_due("activity", time.time() + random.uniform(-10, 70))
        except BaseException as exc:  # noqa: B036 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)] + [threading.Thread(target=scanner)]
    for t in threads:
        t.start()
    for t in threads[:-1]:
        t.join(timeout=180)
    stop.set()
    threads[-1].join(timeout=60)
    assert not errors, errors
    expected = []
    for pk in chains:
        ex = stores[0].read(pk, "exec")
        assert ex is not None
        for n in range(1, int(ex["head"]) + 1):
            doc = stores[0].read(pk, f"s:{n}")
            if doc is not None and doc.get("due_kind") == "activity":
                expected.append((doc["due_at"], pk, doc["id"]))
    far = time.time() + 200
    for scan in (store_from_url(cosmos_url), stores[2]):  # a fresh scanner, and the one that cleaned up
        got = scan.scan_due("activity", far, limit=1000)
        assert sorted((r.due_at, r.pk, r.id) for r in got) == sorted(expected)
