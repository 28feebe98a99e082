"""Adversarial review of pushed results (stores/push/base.py, _redis_push.py, _postgres_push.py, Engine.wait).

Each test is a break found in review (it failed on the code before its fix), kept as a regression:

* a push transport that is slow (accepts the connection, never answers) made ``result(timeout=0.3)``
  block ~3 s in ``subscribe`` waiting for the listener to come up;
* a ``subscribe`` racing ``close()`` started a listener with the already-set stop event: the
  notifier stayed "down"/"starting" for ever with no listener, every later waiter polled;
* two threads of a forked child subscribing first both reset the hub: two listeners (one
  orphaned with its connection), a waiter registered in a discarded table, a 3 s stall;
* ``durable_result_push = "redis://:pw@…"`` was shown in full by ``celery report`` /
  ``app.conf.humanize(censored=True)``;
* a PostgreSQL LISTEN connect error was logged without the store's password scrub;
* after a listener reconnect the waiters it had woken polled (every 50 ms) for the rest of
  their wait although push was back.

The rest are probes that held: fork, 50 waiters in threads (one listener, long and non-ASCII
ids, timed-out waiters unsubscribed), outages of PostgreSQL and Redis, close() while waiting.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.engine import Engine, InlineDispatcher
from celery_durable.engine.documents.model import TERMINAL
from celery_durable.errors import DurableTimeoutError
from celery_durable.settings import Settings
from celery_durable.stores import store_from_url
from celery_durable.stores.push.redis import RedisNotifier
from tests.plugins.postgres import (  # noqa: F401 - fixtures
    _postgres_server,
    postgres_proxied_url,
    postgres_proxy,
    postgres_schema,
    postgres_url,
)

REDIS = "redis://127.0.0.1:6379/15"


def _exec(pk: str, status: str = "running") -> dict[str, Any]:
    return {"pk": pk, "id": "exec", "type": "exec", "workflow": "w", "status": status}


class Silent:
    """A TCP server that accepts connections and never answers (a hung Redis / PostgreSQL)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


@pytest.fixture
def silent() -> Iterator[Silent]:
    s = Silent()
    yield s
    s.close()


def _sqlite_engine(tmp_path: Path, notifier: Any) -> Engine:
    store = store_from_url(f"sqlite:///{tmp_path / 's.db'}")
    return Engine(store, InlineDispatcher(), settings=Settings(), notifier=notifier)


def test_result_timeout_is_honoured_when_the_redis_server_hangs(tmp_path: Path, silent: Silent) -> None:
    notifier = RedisNotifier(f"redis://127.0.0.1:{silent.port}/0")
    engine = _sqlite_engine(tmp_path, notifier)
    try:
        eid = f"e-{uuid.uuid4().hex[:8]}"
        engine.store.create(_exec(eid))
        for _ in range(2):  # the first waiter starts the listener, the second finds it starting
            t0 = time.monotonic()
            with pytest.raises(DurableTimeoutError):
                engine.wait(eid, timeout=0.3)
            assert time.monotonic() - t0 < 1.5  # was ~3 s (READY_TIMEOUT), whatever the timeout
    finally:
        engine.shutdown()
        engine.store.close()


def test_a_subscribe_racing_close_does_not_leave_the_listener_stuck() -> None:
    racer: list[threading.Thread] = []

    class Racy(RedisNotifier):
        def _down(self, stop: threading.Event, state: str = "down") -> None:
            super()._down(stop, state)
            if state == "idle" and not racer:  # close(): a subscribe lands before the new stop event
                t = threading.Thread(target=self.subscribe, args=("other",))
                racer.append(t)
                t.start()
                t.join(10)

    notifier = Racy(REDIS)
    try:
        assert notifier.subscribe("a").live
        notifier.close()
        for t in racer:
            t.join(10)
        t0 = time.monotonic()
        # was "down" (or "starting") for ever with no listener thread: every waiter polled
        assert notifier.subscribe("b").live
        assert notifier.state == "up" and time.monotonic() - t0 < 2.5
    finally:
        notifier.close()


def test_two_threads_first_subscribing_after_a_fork_start_one_listener() -> None:
    class Slow(RedisNotifier):
        def _init_process(self) -> None:
            if hasattr(self, "_pid"):
                time.sleep(0.2)  # widens the window between the pid check and the new state
            super()._init_process()

    notifier = Slow(REDIS)
    try:
        before = set(threading.enumerate())
        notifier._pid = -1  # what a forked child sees: the parent's pid
        got: list[Any] = []
        threads = [threading.Thread(target=lambda: got.append(notifier.subscribe("a"))) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(10)
        time.sleep(0.5)
        listeners = [t for t in set(threading.enumerate()) - before if t.name == "celery_durable-redis-listen"]
        # was 2: the first thread's listener (and its connection) orphaned for good, its waiter
        # registered in a discarded table (never woken by a push) after a 3 s stall
        assert len(listeners) == 1
        assert all(w.live for w in got)
        assert sum(len(w) for w in notifier._waiters.values()) == 2
    finally:
        notifier.close()


@pytest.mark.parametrize("key", ["durable_result_push", "CELERY_DURABLE_RESULT_PUSH"])
def test_celery_report_hides_the_password_of_a_result_push_url(key: str) -> None:
    from celery import Celery

    import celery_durable  # noqa: F401 - importing it installs the censoring

    app = Celery("adv-push-secrets", set_as_current=False)
    app.conf[key] = "redis://:S3CRET-pw@redis.internal:6379/0"
    shown = app.conf.humanize(with_defaults=False, censored=True)
    assert "redis.internal" in shown and "S3CRET" not in shown  # was shown in full


def test_a_listen_connection_failure_is_logged_without_the_password(caplog: pytest.LogCaptureFixture) -> None:
    from celery_durable.stores.postgres.connection import parse_url
    from celery_durable.stores.push.postgres import PgNotifier

    # the server echoes the database name; the store scrubs the password from any such message
    notifier = PgNotifier(parse_url("postgresql://postgres:S3CRETdb@127.0.0.1:5432/S3CRETdb", {}))
    try:
        with caplog.at_level("WARNING", logger="celery_durable.push"):
            assert not notifier.subscribe("a").live
        assert "does not exist" in caplog.text and "S3CRET" not in caplog.text  # was logged as is
    finally:
        notifier.close()


# --- probes that held (kept as regressions) ------------------------------------------------


def _pg_notifier(url: str) -> Any:
    from celery_durable.stores.postgres.store import PostgresStore

    store = store_from_url(url)
    assert isinstance(store, PostgresStore)
    return store, store.enable_push(frozenset(TERMINAL))


@pytest.mark.parametrize("transport", ["postgres", "redis"])
def test_a_forked_child_gets_its_own_listener_and_the_parents_keeps_working(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    import os

    if transport == "postgres":
        store, notifier = _pg_notifier(request.getfixturevalue("postgres_url"))
    else:
        store, notifier = store_from_url(f"sqlite:///{tmp_path / 's.db'}"), RedisNotifier(REDIS)
    engine = Engine(store, InlineDispatcher(), settings=Settings(result_push_recheck=60.0), notifier=notifier)
    try:
        parent = engine.notifier.subscribe("p")
        assert parent.live
        eid = f"c-{uuid.uuid4().hex[:8]}"
        engine.store.create(_exec(eid))
        pid = os.fork()
        if pid == 0:  # the child: its own listener, woken by the push (not the 60 s recheck)
            code = 1
            try:
                store.reopen()
                t0 = time.monotonic()
                doc = engine.wait(eid, timeout=30)
                code = 0 if doc["status"] == "completed" and time.monotonic() - t0 < 20 else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 20
        while not _listeners_of(transport, engine) >= 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        ex = engine.store.read(eid, "exec")
        assert ex is not None
        engine.store.replace(_exec(eid, "completed"), ex["_etag"])
        engine.emit("workflow_completed", execution_id=eid, workflow="w")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert parent.live  # the child's exit did not cut the parent's connection
        engine.store.create(_exec("p", "completed"))
        engine.emit("workflow_completed", execution_id="p", workflow="w")
        assert parent.wait(10)
    finally:
        engine.shutdown()
        store.close()


def _listeners_of(transport: str, engine: Engine) -> int:
    if transport == "redis":
        import redis

        client = redis.Redis.from_url(REDIS)
        try:
            return int(client.pubsub_numsub("celery_durable:done")[0][1])
        finally:
            client.close()
    import psycopg

    from tests.plugins.postgres import BASE_URL

    with psycopg.connect(BASE_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'celery_durable listen'"
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("transport", ["postgres", "redis"])
def test_fifty_waiters_in_threads_share_one_listener_and_leave_nothing_behind(
    transport: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if transport == "postgres":
        store, notifier = _pg_notifier(request.getfixturevalue("postgres_url"))
    else:
        store, notifier = store_from_url(f"sqlite:///{tmp_path / 's.db'}"), RedisNotifier(REDIS)
    engine = Engine(store, InlineDispatcher(), settings=Settings(result_push_recheck=60.0), notifier=notifier)
    ids = [f"w-{i}-é-{'x' * (1100 if i % 2 else 10)}" for i in range(50)]  # long and non-ASCII ids
    for eid in ids:
        engine.store.create(_exec(eid))
    results: dict[str, Any] = {}

    def wait(eid: str, timeout: float) -> None:
        try:
            results[eid] = engine.wait(eid, timeout=timeout)["status"]
        except DurableTimeoutError:
            results[eid] = "timeout"

    before = set(threading.enumerate())
    try:
        threads = [threading.Thread(target=wait, args=(eid, 1.0 if i >= 40 else 30.0)) for i, eid in enumerate(ids)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 20
        while sum(len(w) for w in notifier._waiters.values()) < 40 and time.monotonic() < deadline:
            time.sleep(0.02)
        t0 = time.monotonic()
        for eid in ids[:40]:
            ex = engine.store.read(eid, "exec")
            assert ex is not None
            engine.store.replace(_exec(eid, "completed"), ex["_etag"])
            engine.emit("workflow_completed", execution_id=eid, workflow="w")
        for t in threads:
            t.join(40)
        assert time.monotonic() - t0 < 20  # pushed, not the 60 s recheck
        assert [results[e] for e in ids[:40]] == ["completed"] * 40
        assert [results[e] for e in ids[40:]] == ["timeout"] * 10
        new = set(threading.enumerate()) - before
        listeners = [t for t in new if t.name == f"celery_durable-{notifier.name}-listen"]
        assert len(listeners) == 1 and notifier._waiters == {}
    finally:
        engine.shutdown()
        store.close()


def test_a_postgres_outage_wakes_waiters_and_push_comes_back(request: pytest.FixtureRequest) -> None:
    from celery_durable.stores.postgres.connection import parse_url
    from celery_durable.stores.push.postgres import PgNotifier

    proxy = request.getfixturevalue("postgres_proxy")
    notifier = PgNotifier(parse_url(request.getfixturevalue("postgres_proxied_url"), {}))
    store, _ = _pg_notifier(request.getfixturevalue("postgres_url"))  # the writer, reached directly
    try:
        before = notifier.subscribe("a")
        assert before.live
        proxy.pause()  # the server "goes away": the LISTEN connection is cut, reconnects refused
        assert before.wait(10) and not before.live
        store.create(_exec("a", "completed"))  # sent while nobody listens through the proxy
        proxy.resume()
        deadline = time.monotonic() + 15
        while notifier.state != "up" and time.monotonic() < deadline:
            time.sleep(0.05)
        after = notifier.subscribe("b")
        assert after.live
        store.create(_exec("b", "failed"))
        assert after.wait(10)
    finally:
        notifier.close()
        store.close()


def test_a_redis_outage_wakes_waiters_and_push_comes_back() -> None:
    from tests.plugins.postgres import Proxy

    proxy = Proxy("127.0.0.1", 6379)
    notifier = RedisNotifier(f"redis://127.0.0.1:{proxy.port}/15")
    direct = RedisNotifier(REDIS)
    try:
        before = notifier.subscribe("a")
        assert before.live
        proxy.pause()
        t0 = time.monotonic()
        assert before.wait(10) and time.monotonic() - t0 < 8
        deadline = time.monotonic() + 10
        while before.live and time.monotonic() < deadline:  # woken at once, told to poll soon after
            before.wait(0.1)
        assert not before.live
        proxy.resume()
        deadline = time.monotonic() + 15
        while notifier.state != "up" and time.monotonic() < deadline:
            time.sleep(0.05)
        after = notifier.subscribe("b")
        assert after.live
        direct.publish("b")
        assert after.wait(10)
    finally:
        notifier.close()
        direct.close()
        proxy.close()


def test_close_while_waiting_falls_back_to_polling(tmp_path: Path) -> None:
    engine = _sqlite_engine(tmp_path, RedisNotifier(REDIS))
    engine = Engine(
        engine.store, InlineDispatcher(), settings=Settings(result_push_recheck=60.0), notifier=engine.notifier
    )
    eid = "closing"
    engine.store.create(_exec(eid))
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(engine.wait(eid, timeout=30)["status"]))
    try:
        t.start()
        deadline = time.monotonic() + 10
        while not engine.notifier._waiters and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)
        engine.notifier.close()  # e.g. engine.shutdown() in another thread
        ex = engine.store.read(eid, "exec")
        assert ex is not None
        engine.store.replace(_exec(eid, "completed"), ex["_etag"])  # no publish: only a read finds it
        t0 = time.monotonic()
        t.join(15)
        assert got == ["completed"] and time.monotonic() - t0 < 5  # not the 60 s recheck
    finally:
        engine.shutdown()
        engine.store.close()


def test_a_waiter_goes_back_to_push_once_the_listener_is_back(request: pytest.FixtureRequest) -> None:
    import psycopg

    from tests.plugins.postgres import BASE_URL

    store, notifier = _pg_notifier(request.getfixturevalue("postgres_url"))
    engine = Engine(store, InlineDispatcher(), settings=Settings(result_push_recheck=60.0), notifier=notifier)
    eid = "blip"
    engine.store.create(_exec(eid))
    reads = 0
    real = engine.read_exec

    def read(execution_id: str) -> Any:
        nonlocal reads
        reads += 1
        return real(execution_id)

    engine.read_exec = read  # type: ignore[method-assign]
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(engine.wait(eid, timeout=60)["status"]))
    try:
        t.start()
        deadline = time.monotonic() + 10
        while (notifier.conn is None or not notifier._waiters) and time.monotonic() < deadline:
            time.sleep(0.01)
        pid = notifier.conn.info.backend_pid
        with psycopg.connect(BASE_URL, autocommit=True) as admin:  # a blip of the LISTEN connection
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        deadline = time.monotonic() + 15
        while not (notifier.state == "up" and notifier.conn is not None) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert notifier.state == "up"
        time.sleep(0.5)  # let the waiter settle on its schedule
        start = reads
        time.sleep(2.0)
        # was ~40 (a poll every 50 ms for the rest of the wait, push back up or not)
        assert reads - start <= 3
        ex = engine.store.read(eid, "exec")
        assert ex is not None
        engine.store.replace(_exec(eid, "completed"), ex["_etag"])  # NOTIFY in its transaction
        t0 = time.monotonic()
        t.join(30)
        assert got == ["completed"] and time.monotonic() - t0 < 10  # pushed, not the 60 s recheck
    finally:
        engine.shutdown()
        store.close()
