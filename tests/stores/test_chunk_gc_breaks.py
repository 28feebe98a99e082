"""Adversarial tests of the orphan chunk collector (celery_durable/stores/offload/chunk_gc.py, offload.py).

Promise (offload.py, chunk_gc.py docstrings): orphan chunks — of a write that died before its main
document, or of a replaced/deleted version whose drop failed — are eventually deleted; a chunk a
stored main document names never is.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_durable.errors import StoreUnavailable
from celery_durable.stores import Store
from celery_durable.stores.offload.chunk_gc import collect_chunks
from celery_durable.stores.offload.store import CHUNK_GRACE, CHUNK_PREFIX, Offloading
from tests.stores.test_contract_chunk_gc import referenced

MB = 1024 * 1024
#: later than every due time these tests write
FAR = 1e12


def _chunks(store: Offloading, pk: str) -> list[str]:
    return sorted(str(d["id"]) for d in store.backend.query_partition(pk).docs if str(d["id"]).startswith(CHUNK_PREFIX))


def _old_version_looked_at(store: Offloading, pk: str, doc: dict[str, Any]) -> str:
    """Write ``doc`` as if a grace and more ago, and let a collection find it referenced (its marker
    is cleared, as happens to every document that lives longer than the grace); its etag."""
    store.chunk_clock = lambda: time.time() - 2 * CHUNK_GRACE
    try:
        etag = store.create(doc)
    finally:
        store.chunk_clock = None
    assert etag is not None
    report = collect_chunks(store, time.time())
    assert (report.kept, report.collected, report.errors) == (1, 0, 0)
    return etag


@pytest.mark.parametrize("how", ["replace", "delete"])
def test_a_failed_drop_of_a_version_older_than_the_grace_is_collected(
    adv_store: Store, how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Breaks "orphans of a replaced/deleted version whose drop failed are eventually deleted": a
    version that lived longer than the grace had its marker cleared (never looked at again); when
    it is then replaced or deleted and the drop of its chunks fails (the store unreachable for a
    moment: ``_ofl_drop`` logs and goes on; or the process dies right after the commit), its
    chunks stay for ever — no collection, at any time, ever finds them. (Every execution document
    lives past the hour before ``purge`` deletes it.)"""
    store = adv_store
    assert isinstance(store, Offloading)
    etag = _old_version_looked_at(store, "p", {"pk": "p", "id": "d", "v": "a" * 3 * MB})
    first = _chunks(store, "p")
    monkeypatch.setattr(store, "_ofl_drop", lambda pk, ids: None)  # the drop fails / the process dies
    if how == "replace":
        store.replace({"pk": "p", "id": "d", "v": "b" * 3 * MB}, if_match=etag)
    else:
        assert store.delete("p", "d", if_match=etag)
    monkeypatch.undo()
    for _ in range(3):
        collect_chunks(store, FAR)
    assert not set(first) & set(_chunks(store, "p")), "the replaced version's chunks are never collected"
    assert _chunks(store, "p") == referenced(store, "p")


def test_a_replace_whose_commit_answer_was_lost_leaves_no_chunks_for_ever(adv_store: Store) -> None:
    """The same break through the outage path: the commit applies but its answer is lost
    (StoreUnavailable): ``_ofl_write`` keeps every chunk (rightly: it cannot tell), the new
    version's are referenced, and the old version's — its marker cleared a while ago — are never
    collected."""
    store = adv_store
    assert isinstance(store, Offloading)
    etag = _old_version_looked_at(store, "p", {"pk": "p", "id": "d", "v": "a" * 3 * MB})
    first = _chunks(store, "p")
    backend_cls = store._ofl_class.__mro__[1]  # the backend's own class, under Offloading
    real_replace = backend_cls.replace

    def applied_but_lost(self: Any, doc: dict[str, Any], if_match: str | None) -> str:
        real_replace(self, doc, if_match)
        raise StoreUnavailable("the answer was lost")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend_cls, "replace", applied_but_lost)
        with pytest.raises(StoreUnavailable):
            store.replace({"pk": "p", "id": "d", "v": "b" * 3 * MB}, if_match=etag)
    got = store.read("p", "d")
    assert got is not None and got["v"] == "b" * 3 * MB  # the replace applied
    for _ in range(3):
        collect_chunks(store, FAR)
    assert not set(first) & set(_chunks(store, "p")), "the replaced version's chunks are never collected"
    assert _chunks(store, "p") == referenced(store, "p")


_WRITES = ["replace", "upsert", "batch-upsert", "shrink", "delete", "delete-recreate", "another-collector"]


def _race_write(store: Offloading, how: str, etag: str, value: str) -> dict[str, Any] | None:
    """One write of ``p/d`` by another process; what ``p/d`` then holds."""
    doc = {"pk": "p", "id": "d", "v": value}
    if how == "another-collector":  # a second worker's recovery scan, all of it
        got = store.read("p", "d")
        collect_chunks(store, time.time())
        return None if got is None else {k: v for k, v in got.items() if not k.startswith("_")}
    if how == "replace":
        store.replace(doc, if_match=etag)
    elif how == "upsert":
        store.upsert(doc)
    elif how == "batch-upsert":
        from celery_durable.stores.base import Op

        store.batch("p", [Op.upsert(doc)])
    elif how == "shrink":
        doc = {"pk": "p", "id": "d", "v": "small"}
        store.replace(doc, if_match=None)
    elif how == "delete":
        assert store.delete("p", "d", if_match=etag)
        return None
    else:
        assert store.delete("p", "d")
        assert store.create(doc) is not None
    return doc


@pytest.mark.parametrize("how", _WRITES)
@pytest.mark.parametrize("at", range(5))
@pytest.mark.parametrize("state", ["referenced", "orphan"])
def test_a_write_between_any_two_calls_of_the_collector(adv_store: Store, how: str, at: int, state: str) -> None:
    """A writer of the document commits between the collector's ``at``-th and next store call; the
    document always reads back as written, every chunk it names stays, and a later collection
    leaves only referenced chunks."""
    store = adv_store
    assert isinstance(store, Offloading)
    store.chunk_clock = lambda: time.time() - 2 * CHUNK_GRACE
    try:
        etag = store.create({"pk": "p", "id": "d", "v": "a" * 3 * MB})
        assert etag is not None
        if state == "orphan":  # a replace whose drop failed: the first version's marker is due, unnamed
            cls_drop = store._ofl_drop
            store._ofl_drop = lambda pk, ids: None  # type: ignore[method-assign]
            etag = store.replace({"pk": "p", "id": "d", "v": "o" * 3 * MB}, if_match=etag)
            del store._ofl_drop
            assert store._ofl_drop == cls_drop
    finally:
        store.chunk_clock = None
    backend_cls = store._ofl_class.__mro__[1]
    calls = {"n": 0, "busy": False}
    expected: list[dict[str, Any] | None] = []
    patched: dict[str, Any] = {}

    def hooked(name: str) -> Any:
        real = getattr(backend_cls, name)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not calls["busy"]:
                if calls["n"] == at and not expected:
                    calls["busy"] = True
                    try:
                        expected.append(_race_write(store, how, etag, "b" * 3 * MB))
                    finally:
                        calls["busy"] = False
                calls["n"] += 1
            return real(self, *args, **kwargs)

        return call

    with pytest.MonkeyPatch.context() as mp:
        for name in ("scan_due", "read", "read_many", "replace", "delete", "batch"):
            patched[name] = hooked(name)
            mp.setattr(backend_cls, name, patched[name])
        report = collect_chunks(store, time.time())
    assert report.errors == 0
    if not expected:  # the collector made fewer calls: nothing raced
        expected.append(_race_write(store, how, etag, "b" * 3 * MB))
    got = store.read("p", "d")
    want = expected[0]
    assert (None if got is None else {k: v for k, v in got.items() if not k.startswith("_")}) == want
    assert set(referenced(store, "p")) <= set(_chunks(store, "p"))
    collect_chunks(store, FAR)
    got = store.read("p", "d")
    assert (None if got is None else {k: v for k, v in got.items() if not k.startswith("_")}) == want
    assert _chunks(store, "p") == referenced(store, "p")


def test_a_chunk_write_whose_answer_was_lost_is_collected(adv_store: Store) -> None:
    """Breaks "orphans of a write that died before its main document are eventually deleted": a
    chunk's create applies but its answer is lost (a timeout on a 2 MB write); ``_ofl_put_chunks``
    drops the chunks it knows it wrote — the marker, written first, among them — and leaves the
    one in flight, which no marker names any more: no collection ever finds it."""
    store = adv_store
    assert isinstance(store, Offloading)
    backend_cls = store._ofl_class.__mro__[1]
    real_create = backend_cls.create
    seen: list[str] = []

    def second_answer_lost(self: Any, doc: dict[str, Any]) -> str | None:
        etag = real_create(self, doc)
        seen.append(str(doc["id"]))
        if len(seen) == 2:  # the marker went through; the next chunk applies, its answer is lost
            raise StoreUnavailable("timed out")
        return etag

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend_cls, "create", second_answer_lost)
        with pytest.raises(StoreUnavailable):
            store.create({"pk": "p", "id": "d", "v": "a" * 5 * MB})
    assert store.read("p", "d") is None
    for _ in range(3):
        collect_chunks(store, FAR)
    assert _chunks(store, "p") == [], "a chunk of a write that never committed is never collected"


def test_a_purge_whose_chunk_drop_failed_leaves_nothing_for_ever(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first break as it happens in the engine: an execution with a large result lives past the
    grace (the recovery scan clears its markers), is purged days later, and the drop of its chunks
    fails (a moment's outage, or the purging process dies after the commit). The partition holds
    nothing but chunks, and no later recovery scan ever deletes them."""
    from celery_durable.engine.admin.operator import Admin
    from tests.engine.inprocess import InProcess

    env = InProcess()

    @env.activity
    def blob(n: int) -> str:
        return "x" * n

    def flow(n: int) -> int:
        return len(str(blob(n)))

    eid = env.start(env.workflow(flow), 3 * MB)
    assert env.status(eid) == "completed"
    store = env.store  # the engine's may be traced (stores/traced.py: a process with a tracer provider)
    assert isinstance(store, Offloading)
    assert _chunks(store, eid)
    env.clock.advance(2 * CHUNK_GRACE)
    assert env.engine.recovery.scan().errors == 0  # the result is referenced: its marker is cleared
    env.clock.advance(10 * 24 * 3600)
    with monkeypatch.context() as mp:
        mp.setattr(store, "_ofl_drop", lambda pk, ids: None)  # the drop fails
        assert Admin(env.engine).purge(0).purged == 1
    assert [d["id"] for d in store.query_partition(eid).docs] == ["purged"]  # the purge's record only
    for _ in range(3):
        env.clock.advance(2 * CHUNK_GRACE)
        env.engine.recovery.scan()
    assert _chunks(store, eid) == [], "the purged execution's chunks stay for ever"


def test_a_drop_that_fails_midway_leaves_the_marker(adv_store: Store) -> None:
    """Breaks "a store outage leaves nothing inconsistent": a write fails while its chunks go out
    (the third chunk's create never applied); dropping those written meets a missing one (the
    batch conflicts) and goes one by one, and the store flaps (one delete fails). ``_ofl_drop``
    went on after the failure and deleted the marker too: the chunk it could not delete is named
    by nothing, and no collection ever finds it."""
    store = adv_store
    assert isinstance(store, Offloading)
    backend_cls = store._ofl_class.__mro__[1]
    real_create, real_delete = backend_cls.create, backend_cls.delete
    created: list[str] = []
    failed: list[str] = []

    def third_never_applies(self: Any, doc: dict[str, Any]) -> str | None:
        if len(created) == 2:
            created.append(str(doc["id"]))
            raise StoreUnavailable("the connection dropped before the write")
        created.append(str(doc["id"]))
        return real_create(self, doc)

    def first_delete_fails(self: Any, pk: str, doc_id: str, if_match: str | None = None) -> bool:
        if not failed:
            failed.append(doc_id)
            raise StoreUnavailable("flapping")
        return real_delete(self, pk, doc_id, if_match)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend_cls, "create", third_never_applies)
        mp.setattr(backend_cls, "delete", first_delete_fails)
        with pytest.raises(StoreUnavailable):
            store.create({"pk": "p", "id": "d", "v": "a" * 5 * MB})
    assert failed and store.read("p", "d") is None
    for _ in range(3):
        collect_chunks(store, FAR)
    assert _chunks(store, "p") == [], "a chunk left by a failed drop is never collected"


def test_a_write_slower_than_the_grace_never_commits_names_of_deleted_chunks(adv_store: Store) -> None:
    """Breaks "a chunk that a stored main document names is never deleted": the grace (1 h) is the
    only thing between the collector and a write on its way, and nothing bounds a write's duration.
    A batch of large documents on a throttled store (Cosmos at 400 RU/s writes a 2 MB chunk in
    ~25 s, retrying 429s; a drive's batch of several 64 MiB results is hundreds of chunks) takes
    longer than the grace: the first document's marker is due before the commit, a recovery scan
    deletes its chunks (no main document names them yet), and the commit then stores a document
    whose chunks are gone — the value is lost."""
    store = adv_store
    assert isinstance(store, Offloading)
    t = [time.time()]
    store.chunk_clock = lambda: t[0]
    backend_cls = store._ofl_class.__mro__[1]
    real_create = backend_cls.create
    docs = [{"pk": "p", "id": i, "v": c * 3 * MB} for i, c in (("a", "a"), ("b", "b"))]
    total = sum(len(store._ofl_split(d)[1]) for d in docs)
    created: list[str] = []
    reports: list[Any] = []

    def slow_create(self: Any, doc: dict[str, Any]) -> str | None:
        etag = real_create(self, doc)
        if str(doc["id"]).startswith(CHUNK_PREFIX):
            t[0] += 2 * CHUNK_GRACE / total  # throttled: the chunks take twice the grace in all
            created.append(str(doc["id"]))
            if len(created) == total:  # a beat's recovery scan runs while the batch is on its way
                reports.append(collect_chunks(store, t[0]))
        return etag

    from celery_durable.stores.base import Op

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(backend_cls, "create", slow_create)
        try:
            store.batch("p", [Op.create(d) for d in docs])
        except StoreUnavailable:
            pass  # refusing a write that took longer than is safe is fine; storing it corrupt is not
    store.chunk_clock = None
    assert reports, "the collector did not run during the write"
    got = store.read_many("p", ["a", "b"])  # CorruptDocument: a's chunks were collected
    for want, doc in zip(docs, got, strict=True):
        assert doc is None or {k: v for k, v in doc.items() if not k.startswith("_")} == want
