"""Pushed results on the real transports (stores/push/base.py): PostgreSQL LISTEN/NOTIFY and Redis pub/sub.

* PostgreSQL: the store sends NOTIFY in the transaction that writes a terminal exec, so a
  notification never precedes its data and a write that did not apply sends none.
* No lost wake-up: an execution that ends right after the waiter subscribed (before its first
  read) or right after its read (before it waits) still wakes it at once, although the waiter
  would otherwise re-read only every 30 s.
* A killed listening connection wakes its waiters (they re-read, then poll or are pushed again).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import redis

from celery_durable.engine import Engine, InlineDispatcher
from celery_durable.engine.documents.model import TERMINAL
from celery_durable.errors import ConflictError
from celery_durable.settings import Settings
from celery_durable.stores import Op, store_from_url
from celery_durable.stores.postgres.store import PostgresStore
from celery_durable.stores.push.postgres import channel_of
from celery_durable.stores.push.redis import RedisNotifier
from celery_durable.stores.push.selection import build_notifier
from tests.plugins.postgres import BASE_URL

REDIS = "redis://127.0.0.1:6379/15"


def _exec(pk: str, status: str = "running") -> dict[str, Any]:
    return {"pk": pk, "id": "exec", "type": "exec", "workflow": "w", "status": status}


@pytest.fixture
def pg(postgres_url: str) -> Iterator[PostgresStore]:
    store = store_from_url(postgres_url)
    assert isinstance(store, PostgresStore)
    yield store
    store.close()


class Listener:
    """A plain LISTEN connection on the store's channel."""

    def __init__(self, store: PostgresStore) -> None:
        self.conn = psycopg.connect(BASE_URL, autocommit=True)
        self.conn.execute(f'LISTEN "{channel_of(store.cfg)}"')

    def got(self, timeout: float = 0.5, expect: int | None = None) -> list[str]:
        return [n.payload for n in self.conn.notifies(timeout=timeout, stop_after=expect)]


@pytest.mark.foreign_documents  # a store test's own documents, not the engine's
def test_postgres_notifies_in_the_transaction_of_a_terminal_exec_write(pg: PostgresStore) -> None:
    pg.enable_push(frozenset(TERMINAL))
    listener = Listener(pg)
    try:
        etag = pg.create(_exec("a"))
        pg.create({"pk": "a", "id": "r:000001", "type": "result", "status": "completed"})
        assert listener.got() == []  # running, and not an exec: nothing
        with pytest.raises(ConflictError):  # a stale etag: nothing applied, nothing sent
            pg.replace(_exec("a", "completed"), "128")
        with pytest.raises(ConflictError):  # a batch that fails: rolled back with its NOTIFY
            pg.batch("a", [Op.create({"pk": "a", "id": "r:000001"}), Op.replace(_exec("a", "completed"), etag)])
        assert pg.create(_exec("a", "completed")) is None  # the id exists: no row written
        assert listener.got() == []
        pg.batch("a", [Op.create({"pk": "a", "id": "r:000002"}), Op.replace(_exec("a", "completed"), etag)])
        [payload] = listener.got(5, 1)
        assert payload == "a"
        doc = pg.read("a", "exec")  # the data was committed before the notification was delivered
        assert doc is not None and doc["status"] == "completed"
        pg.create(_exec("b", "cancelled"))
        pg.upsert(_exec("c", "failed"))
        b = pg.read("b", "exec")
        assert b is not None
        pg.replace(_exec("b", "failed"), b["_etag"])
        assert listener.got(5, 3) == ["b", "c", "b"]
    finally:
        listener.conn.close()


def test_postgres_sends_nothing_unless_push_is_enabled(pg: PostgresStore) -> None:
    listener = Listener(pg)
    try:
        pg.create(_exec("a", "completed"))
        assert listener.got() == []
    finally:
        listener.conn.close()


# --- no lost wake-up, on both transports ---------------------------------------------------


@pytest.fixture(params=["postgres", "redis"])
def engine(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Engine]:
    if request.param == "postgres":
        store = store_from_url(request.getfixturevalue("postgres_url"))
    else:
        store = store_from_url(f"sqlite:///{tmp_path / 's.db'}")
    notifier = build_notifier("auto", store, REDIS, TERMINAL)
    assert notifier.name == request.param
    settings = Settings(result_poll_max=30.0, result_push_recheck=30.0)
    eng = Engine(store, InlineDispatcher(), settings=settings, notifier=notifier)
    yield eng
    eng.shutdown()
    store.close()


def _end(engine: Engine, eid: str) -> None:
    """What a worker does when the execution ends: commit it, then the engine's event."""
    ex = engine.store.read(eid, "exec")
    assert ex is not None
    engine.store.replace(_exec(eid, "completed") | {"result": 42}, ex["_etag"])
    engine.emit("workflow_completed", execution_id=eid, workflow="w")  # Redis: publish


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call


@pytest.mark.parametrize("when", ["after-subscribe", "after-read"])
def test_an_end_racing_the_first_read_is_not_missed(engine: Engine, when: str) -> None:
    eid = f"e-{uuid.uuid4().hex[:8]}"
    engine.store.create(_exec(eid))
    end = _once(lambda: _end(engine, eid))
    reads = 0
    if when == "after-subscribe":
        subscribe = engine.notifier.subscribe

        def subscribed(execution_id: str, ready_timeout: float = 3.0) -> Any:
            waiter = subscribe(execution_id, ready_timeout)
            assert waiter.live
            end()  # before the waiter's first read
            return waiter

        engine.notifier.subscribe = subscribed  # type: ignore[method-assign]
    real = engine.read_exec

    def read(execution_id: str) -> Any:
        nonlocal reads
        reads += 1
        doc = real(execution_id)
        if when == "after-read":
            end()  # after the read saw it running, before the wait
        return doc

    engine.read_exec = read  # type: ignore[method-assign]
    t0 = time.monotonic()
    doc = engine.wait(eid, timeout=20)
    assert doc["status"] == "completed" and doc["result"] == 42
    assert time.monotonic() - t0 < 5  # not the 30 s recheck
    assert reads <= 2


def test_a_killed_redis_subscription_wakes_its_waiters() -> None:
    notifier = RedisNotifier(REDIS)
    try:
        waiter = notifier.subscribe(f"e-{uuid.uuid4().hex}")
        assert waiter.live
        client = redis.Redis.from_url(REDIS)
        try:
            assert client.client_kill_filter(_type="pubsub", skipme=True) >= 1
        finally:
            client.close()
        t0 = time.monotonic()
        assert waiter.wait(10)  # woken to re-read: what was published meanwhile was lost
        assert time.monotonic() - t0 < 8
    finally:
        notifier.close()


def test_a_killed_listen_connection_wakes_its_waiters_and_the_listener_comes_back(pg: PostgresStore) -> None:
    notifier = pg.enable_push(frozenset(TERMINAL))
    try:
        waiter = notifier.subscribe("a")
        assert waiter.live and notifier.conn is not None
        pid = notifier.conn.info.backend_pid
        with psycopg.connect(BASE_URL, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        assert waiter.wait(10) and not waiter.live
        deadline = time.monotonic() + 10
        while notifier.state != "up" and time.monotonic() < deadline:
            time.sleep(0.02)
        again = notifier.subscribe("a")
        assert again.live and notifier.conn is not None and notifier.conn.info.backend_pid != pid
        pg.create(_exec("a", "completed"))
        assert again.wait(10)
    finally:
        notifier.close()
