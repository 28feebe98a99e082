"""CountingStore (celery_durable.testing.counting): counts round trips and delegates everything."""

from __future__ import annotations

import inspect
import threading
from pathlib import Path
from typing import Any

import pytest

from celery_durable.errors import ConflictError
from celery_durable.stores import Op, Store, store_from_url
from celery_durable.stores.base import ExecFilter
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.traced import TracedStore
from celery_durable.testing.counting import CountingStore


@pytest.fixture(params=["memory", "sqlite"])
def inner(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    return store_from_url("memory://" if request.param == "memory" else f"sqlite:///{tmp_path / 's.db'}")


def test_counts_each_call_by_method(inner: Store) -> None:
    store = CountingStore(inner)
    assert store.total == 0 and not store.counts
    etag = store.create({"pk": "p", "id": "a", "v": 1})
    assert store.read("p", "a") == inner.read("p", "a")
    assert [d and d["v"] for d in store.read_many("p", ["a", "x", "a"])] == [1, None, 1]
    etag = store.replace({"pk": "p", "id": "a", "v": 2}, if_match=etag)
    store.upsert({"pk": "p", "id": "b"})
    store.batch("p", [Op.create({"pk": "p", "id": "c"}), Op.delete("b")])
    assert [d["id"] for d in store.query_partition("p").docs] == ["a", "c"]
    store.delete("p", "c")
    store.scan_due("clock", 0.0)
    store.create({"pk": "e", "id": "exec", "created_at": 1.0})
    assert store.scan_partitions("e") == ["e"]
    assert [d["pk"] for d in store.list_execs(ExecFilter(), limit=10).docs] == ["e"]
    assert store.counts == {
        "create": 2,
        "read": 1,
        "read_many": 1,
        "replace": 1,
        "upsert": 1,
        "batch": 1,
        "query_partition": 1,
        "delete": 1,
        "scan_due": 1,
        "scan_partitions": 1,
        "list_execs": 1,
    }
    assert store.total == 12


def test_calls_that_send_nothing_are_not_counted_and_failures_are(inner: Store) -> None:
    store = CountingStore(inner)
    etag = store.create({"pk": "p", "id": "a"})
    store.replace({"pk": "p", "id": "a", "v": 2}, if_match=etag)
    store.reset()
    assert store.read_many("p", []) == [] and store.batch("p", []) == []
    store.reopen()
    assert store.total == 0  # no request made (and reopen/close are not round trips)
    with pytest.raises(ConflictError):
        store.replace({"pk": "p", "id": "a", "v": 3}, if_match=etag)  # stale: a request that failed
    assert store.counts == {"replace": 1}


def test_reset_returns_the_counts_and_starts_over() -> None:
    store = CountingStore(MemoryStore())
    store.read("p", "a")
    store.read("p", "b")
    old = store.reset()
    assert old == {"read": 2} and store.counts == {} and store.total == 0
    store.read("p", "a")
    assert store.counts == {"read": 1} and old == {"read": 2}  # the returned counts are not reused


def test_counting_is_thread_safe() -> None:
    store = CountingStore(MemoryStore())
    threads, per_thread = 8, 400
    barrier = threading.Barrier(threads)

    def work() -> None:
        barrier.wait(timeout=30)
        for _ in range(per_thread):
            store.read("p", "a")
            store.read_many("p", ["a", "b"])

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in pool)
    assert store.counts == {"read": threads * per_thread, "read_many": threads * per_thread}
    assert store.total == 2 * threads * per_thread


def test_limits_and_backend_attributes_are_the_inner_stores() -> None:
    inner = MemoryStore()
    inner.max_doc_bytes, inner.max_batch_ops = 1000, 5
    store = CountingStore(inner)
    assert (store.max_doc_bytes, store.max_batch_ops) == (1000, 5)
    assert store.last_request_charge is None  # not a Cosmos store

    class Charged(MemoryStore):
        last_request_charge = 2.5

    assert CountingStore(Charged()).last_request_charge == 2.5
    closed: list[str] = []
    inner.close = lambda: closed.append("close")  # type: ignore[method-assign]
    inner.reopen = lambda: closed.append("reopen")  # type: ignore[method-assign]
    store.reopen()
    store.close()
    assert closed == ["reopen", "close"]


@pytest.mark.parametrize("wrapper", [CountingStore, TracedStore])
def test_wrappers_delegate_every_store_method(wrapper: type[Store]) -> None:
    """A Store method added later must be delegated too, or the wrapper would silently hide it."""
    methods = {
        name
        for name, member in inspect.getmembers(Store, inspect.isfunction)
        if not name.startswith("_") and name in vars(Store)
    }
    assert {"read", "read_many", "list_execs", "reopen", "close"} <= methods
    missing = sorted(name for name in methods if name not in vars(wrapper))
    assert not missing, f"{wrapper.__name__} does not delegate {missing}"

    class Spy(MemoryStore):
        pass

    called: list[str] = []
    spy = Spy()
    for name in methods:
        real = getattr(spy, name)

        def record(*args: Any, _name: str = name, _real: Any = real, **kwargs: Any) -> Any:
            called.append(_name)
            return _real(*args, **kwargs)

        setattr(spy, name, record)
    store = wrapper(spy)  # type: ignore[call-arg]
    store.read("p", "a")
    store.read_many("p", ["a"])
    store.create({"pk": "p", "id": "a"})
    store.replace({"pk": "p", "id": "a"}, None)
    store.upsert({"pk": "p", "id": "a"})
    store.delete("p", "a")
    store.query_partition("p")
    store.batch("p", [Op.create({"pk": "p", "id": "b"})])
    store.batch_with("p", [Op.create({"pk": "p", "id": "c"})], [])
    assert store.cross_partition  # the inner store's capability, neither hidden nor claimed
    store.scan_due("clock", 0.0)
    store.scan_partitions("p")
    store.list_execs()
    store.session_token("p")
    store.use_session_token("p", None)
    store.reopen()
    store.close()
    assert sorted(called) == sorted(methods)
