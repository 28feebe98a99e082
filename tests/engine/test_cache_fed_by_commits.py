"""The partition cache holds what this process committed (issue 28): the read that follows its
own commit costs no store call, and only a commit decided on the cached copy is fed into it."""

from __future__ import annotations

from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.documents.model import EXEC_ID
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.replay.context import require_context
from celery_durable.stores.base import Op, strip_reserved
from celery_durable.stores.memory import MemoryStore
from celery_durable.testing.counting import CountingStore


def _engine(eager: bool) -> tuple[Engine, CountingStore, LocalWorker, object]:
    store = CountingStore(MemoryStore())
    dispatcher = InlineDispatcher(eager=eager)
    registry = Registry()
    engine = Engine(store, dispatcher, registry)
    worker = LocalWorker(engine, dispatcher)
    act = registry.add_activity("inc", lambda x: x + 1)

    def steps(n: int) -> int:
        x = 0
        for _ in range(n):
            x = require_context("inc").call_activity(act.name, act.codec, (x,), {}).result()
        return x

    return engine, store, worker, registry.add_workflow("steps", steps)


def test_a_kept_activity_costs_one_store_call_its_commit() -> None:
    engine, store, worker, wf = _engine(eager=True)
    eid, _ = engine.start(wf, (20,), {})  # type: ignore[arg-type]
    worker.run()
    assert engine.read_exec(eid)["result"] == 20
    eid, _ = engine.start(wf, (40,), {})  # type: ignore[arg-type]
    store.reset()
    worker.run()
    counts = store.reset()
    assert engine.read_exec(eid)["result"] == 40
    # the first drive reads the partition once; then each of the 40 steps is one batch: its
    # outcome, the next step (its lease claimed) and the exec; the last one ends the workflow
    assert counts == {"query_partition": 1, "batch": 41}, counts


def test_delivered_activities_read_before_they_lease() -> None:
    engine, store, worker, wf = _engine(eager=False)
    eid, _ = engine.start(wf, (10,), {})  # type: ignore[arg-type]
    store.reset()
    worker.run()
    counts = store.reset()
    assert engine.read_exec(eid)["result"] == 10
    assert counts["replace"] == 10 and counts["batch"] == 11  # a lease per step, then its commit


def test_the_cache_after_a_commit_is_what_the_store_holds() -> None:
    engine, store, worker, wf = _engine(eager=True)
    eid, _ = engine.start(wf, (3,), {})  # type: ignore[arg-type]
    worker.run()
    cached = engine.cache.peek(eid, 60.0)
    assert cached is not None
    stored = {d["id"]: d for d in store.inner.query_partition(eid).docs}
    assert {k: strip_reserved(v) | {"_etag": v["_etag"]} for k, v in cached.items()} == {
        k: strip_reserved(v) | {"_etag": v["_etag"]} for k, v in stored.items()
    }


def test_a_commit_decided_on_another_copy_is_not_fed() -> None:
    engine, store, worker, wf = _engine(eager=True)
    eid, _ = engine.start(wf, (1,), {})  # type: ignore[arg-type]
    worker.run()
    docs = engine.cache.load(eid)
    ex = docs[EXEC_ID]
    # someone else's write changes the exec: the cached copy is now stale
    etag = store.replace(strip_reserved(ex) | {"wakeups": 5}, if_match=ex["_etag"])
    newer = strip_reserved(ex) | {"wakeups": 6}
    ops = [Op.replace(newer, etag)]
    etags = store.batch(eid, ops)  # decided on the newer copy, not on the cached one
    engine.cache.committed(eid, ops, etags)
    cached = engine.cache.peek(eid, 60.0)
    assert cached is not None and cached[EXEC_ID]["_etag"] == ex["_etag"]  # left as it was
    assert engine.cache.load(eid)[EXEC_ID]["wakeups"] == 6  # the next load reads the truth
