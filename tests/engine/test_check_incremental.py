"""check_partition checks only what changed since the snapshot it last checked (issue 15).

A drive of a long workflow used to walk every document of its partition (an identity test per
document); the work per drive is now bounded by the documents changed since the last check,
while a malformed document anywhere in what changed still fails its execution.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.documents import checks
from celery_durable.engine.drive import driver
from celery_durable.engine.drive import partition_cache as cache
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.drive.partition_cache import Partition, PartitionCache
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import CorruptDocument
from celery_durable.settings import Settings
from celery_durable.stores.memory import MemoryStore

_inside = contextvars.ContextVar("inside_check_partition", default=False)


class _Counting(Partition):
    """A snapshot that counts the documents visited (iterated or checked) inside check_partition."""

    visited = 0

    def _count(self, n: int = 1) -> None:
        if _inside.get():
            type(self).visited += n

    def __iter__(self) -> Iterator[str]:
        for k in super().__iter__():
            self._count()
            yield k

    def items(self) -> Any:
        return [(k, v) for k, v in super().items() if self._count() is None]

    def values(self) -> Any:
        return [v for v in super().values() if self._count() is None]

    def keys(self) -> Any:
        return [k for k in super().keys() if self._count() is None]


def _exec(pk: str, status: str = "running") -> dict[str, Any]:
    return {"pk": pk, "id": "exec", "workflow": "w", "status": status, "run": 0}


def _marker(pk: str, n: int, **over: Any) -> dict[str, Any]:
    return {"pk": pk, "id": f"s:{n:06d}", "kind": "sleep", "name": "sleep", "seq": n, "fire_at": 1.0} | over


def test_work_per_drive_is_bounded_by_the_changes_not_the_history(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache, "Partition", _Counting)
    checked = 0
    real_check_doc = checks.check_shape

    def counting_check_doc(pk: str, doc: Any) -> Any:
        nonlocal checked
        checked += 1
        return real_check_doc(pk, doc)

    monkeypatch.setattr(checks, "check_shape", counting_check_doc)
    real = checks.check_partition
    per_drive: list[int] = []

    def wrapped(pk: str, docs: Any) -> None:
        nonlocal checked
        _Counting.visited, checked = 0, 0
        token = _inside.set(True)
        try:
            real(pk, docs)
        finally:
            _inside.reset(token)
        per_drive.append(_Counting.visited + checked)

    monkeypatch.setattr(driver, "check_partition", wrapped)
    dispatcher, registry = InlineDispatcher(), Registry()
    engine = Engine(MemoryStore(), dispatcher, registry, Settings(sticky_cache_size=0))
    worker = LocalWorker(engine, dispatcher)
    act = registry.add_activity("inc.step", lambda x: x + 1)

    def sequential(n: int) -> int:
        x = 0
        for _ in range(n):
            x = require_context("inc").call_activity(act.name, act.codec, (x,), {}).result()
        return x

    wf = registry.add_workflow("inc.sequential", sequential)
    eid, _ = engine.start(wf, (150,), {})
    worker.run()
    try:
        ex = engine.read_exec(eid)
        assert (ex["status"], ex["result"]) == ("completed", 150)
        assert len(per_drive) > 150
        # ~300 documents by the end; each drive sees a handful of new ones (a marker, a result, the exec)
        assert max(per_drive[10:]) <= 12, per_drive
    finally:
        engine.leases.stop(release=False)


def test_only_changes_are_checked_and_a_malformed_change_still_fails() -> None:
    store = MemoryStore()
    pc = PartitionCache(store)
    store.create(_exec("p1"))
    for seq in range(1, 51):
        store.create(_marker("p1", seq))
    first = pc.load("p1")
    checks.check_partition("p1", first)
    # a malformed marker lands after the check: the next snapshot names it among its changes
    store.create(_marker("p1", 51, seq="fifty-one"))
    second = pc.load("p1")
    assert second.changed_since(first.serial) == {"s:000051"}
    with pytest.raises(CorruptDocument, match="s:000051"):
        checks.check_partition("p1", second)
    # and it is not forgotten: the next snapshot is checked against the last one found good
    store.create(_marker("p1", 52))
    third = pc.load("p1")
    with pytest.raises(CorruptDocument, match="s:000051"):
        checks.check_partition("p1", third)


def test_changes_seen_by_unchecked_loads_and_puts_are_checked_later() -> None:
    store = MemoryStore()
    pc = PartitionCache(store)
    store.create(_exec("p2"))
    checks.check_partition("p2", pc.load("p2"))
    store.create(_marker("p2", 1, fire_at="soon"))
    pc.load("p2")  # an activity's claim, a send: loads nobody checks
    etag = store.create(_marker("p2", 2))
    pc.put("p2", _marker("p2", 2) | {"_etag": etag})
    store.create(_marker("p2", 3))
    with pytest.raises(CorruptDocument, match="s:000001"):
        checks.check_partition("p2", pc.load("p2"))


def test_a_snapshot_of_another_line_or_a_plain_mapping_is_checked_whole() -> None:
    store = MemoryStore()
    store.create(_exec("p3"))
    store.create(_marker("p3", 1, seq=None))  # 'seq' missing
    plain = {d["id"]: d for d in store.query_partition("p3").docs}
    with pytest.raises(CorruptDocument, match="s:000001"):
        checks.check_partition("p3", plain)
    # a second cache (another engine in this process) hands out an unrelated snapshot
    a, b = PartitionCache(store), PartitionCache(store)
    with pytest.raises(CorruptDocument):
        checks.check_partition("p3", a.load("p3"))
    with pytest.raises(CorruptDocument):
        checks.check_partition("p3", b.load("p3"))


def test_ancestry_is_bounded() -> None:
    store = MemoryStore()
    pc = PartitionCache(store)
    store.create(_exec("p4"))
    first = pc.load("p4")
    for seq in range(1, 3 * cache.ANCESTRY):
        store.create(_marker("p4", seq))
        latest = pc.load("p4")
        assert len(latest.ancestry) <= cache.ANCESTRY
    assert latest.changed_since(first.serial) is None  # too far back: a full check, never a missed one
