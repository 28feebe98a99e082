"""Pushed results, the seam (stores/push/base.py, Engine.wait): no Celery, no server.

A recording notifier checks the order of subscribe and reads and the delays the waiter uses;
a :class:`Hub` with an in-process "transport" checks delivery, failure and restart.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from celery_durable.engine import Engine, InlineDispatcher
from celery_durable.engine.documents.model import TERMINAL
from celery_durable.errors import ConfigurationError, DurableTimeoutError
from celery_durable.settings import Settings
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.push.base import Hub, NoPush, payload_of
from celery_durable.stores.push.selection import build_notifier
from tests.engine.inprocess import InProcess

RUNNING = {"pk": "e1", "id": "exec", "type": "exec", "workflow": "w", "status": "running"}


class RecordingWaiter:
    def __init__(self, log: list[Any], live: bool, on_wait: Callable[[], None] | None = None) -> None:
        self.log, self.live, self.on_wait = log, live, on_wait

    def wait(self, timeout: float) -> bool:
        self.log.append(("wait", round(timeout, 3)))
        if self.on_wait is not None:
            self.on_wait()
        return False

    def close(self) -> None:
        self.log.append("close")


class RecordingNotifier:
    name = "recording"

    def __init__(self, live: bool = True) -> None:
        self.log: list[Any] = []
        self.live = live
        self.on_wait: Callable[[], None] | None = None

    def publish(self, execution_id: str) -> None:
        self.log.append(("publish", execution_id))

    def subscribe(self, execution_id: str, ready_timeout: float = 3.0) -> RecordingWaiter:
        self.log.append(("subscribe", execution_id))
        return RecordingWaiter(self.log, self.live, self.on_wait)

    def close(self) -> None:
        self.log.append("closed")


def _engine(notifier: Any, **settings: Any) -> tuple[Engine, MemoryStore]:
    store = MemoryStore()
    engine = Engine(store, InlineDispatcher(), settings=Settings(**settings), notifier=notifier)
    real_read = engine.read_exec

    def read_exec(eid: str) -> Any:
        notifier.log.append(("read", eid))
        return real_read(eid)

    engine.read_exec = read_exec  # type: ignore[method-assign]
    return engine, store


def test_wait_subscribes_before_the_first_read_and_waits_on_the_push() -> None:
    notifier = RecordingNotifier(live=True)
    engine, store = _engine(notifier, result_push_recheck=30.0)
    store.create(dict(RUNNING))
    waits = 0

    def finish_on_second_wait() -> None:
        nonlocal waits
        waits += 1
        if waits == 2:
            ex = store.read("e1", "exec")
            assert ex is not None
            store.replace({k: v for k, v in ex.items() if k != "_etag"} | {"status": "completed"}, ex["_etag"])

    notifier.on_wait = finish_on_second_wait
    doc = engine.wait("e1", timeout=None)
    assert doc["status"] == "completed"
    # subscribed first; one read per wake-up; a live push waits the recheck interval, not a poll
    assert notifier.log == [
        ("subscribe", "e1"),
        ("read", "e1"),
        ("wait", 30.0),
        ("read", "e1"),
        ("wait", 30.0),
        ("read", "e1"),
        "close",
    ]


def test_wait_polls_on_its_schedule_when_the_push_is_not_live() -> None:
    notifier = RecordingNotifier(live=False)
    engine, store = _engine(notifier, result_poll_max=0.01, result_push_recheck=30.0)
    store.create(dict(RUNNING))
    with pytest.raises(DurableTimeoutError):
        engine.wait("e1", timeout=0.2)
    waits = [t for entry in notifier.log if isinstance(entry, tuple) and entry[0] == "wait" for t in entry[1:]]
    assert len(waits) >= 5 and max(waits) <= 0.01  # polled, never the recheck interval
    assert notifier.log[-1] == "close"


def test_the_engine_publishes_when_an_execution_ends_and_only_then() -> None:
    env = InProcess()
    notifier = RecordingNotifier()
    env.engine.notifier = notifier

    def fails() -> None:
        raise ValueError("no")

    def ok(x: int) -> int:
        return x + 1

    add = env.activity(ok)

    def flow(x: int) -> int:
        return add(x)  # type: ignore[no-any-return]

    done = env.start(env.workflow(flow), 1)
    failed = env.start(env.workflow(fails))
    assert env.engine.read_exec(done)["status"] == "completed"
    assert [e for e in notifier.log if e[0] == "publish"] == [("publish", done), ("publish", failed)]


def test_shutdown_closes_the_notifier() -> None:
    notifier = RecordingNotifier()
    engine, _ = _engine(notifier)
    engine.shutdown()
    assert notifier.log[-1] == "closed"


# --- the hub: one listener, many waiters --------------------------------------------------


class FakeTransport(Hub):
    """A listener that delivers what the test puts in ``inbox``; ``fail()`` breaks it once."""

    name = "fake"

    def __init__(self, refuse: bool = False) -> None:
        super().__init__()
        self.inbox: list[str] = []
        self.cond = threading.Condition()
        self.refuse = refuse
        self.broken = False
        self.connects = 0

    def send(self, payload: str) -> None:
        with self.cond:
            self.inbox.append(payload)
            self.cond.notify_all()

    def fail(self) -> None:
        with self.cond:
            self.broken = True
            self.cond.notify_all()

    def listen(self, ready: Callable[[], None], deliver: Callable[[str], None], stopped: Callable[[], bool]) -> None:
        self.connects += 1
        if self.refuse:
            raise ConnectionError("refused")
        ready()
        while not stopped():
            with self.cond:
                self.cond.wait_for(lambda: self.inbox or self.broken, timeout=0.05)
                if self.broken:
                    self.broken = False
                    raise ConnectionError("connection killed")
                got, self.inbox = self.inbox, []
            for payload in got:
                deliver(payload)


@pytest.fixture
def hub() -> Iterator[FakeTransport]:
    h = FakeTransport()
    yield h
    h.close()


def test_a_notification_wakes_only_the_waiters_of_its_id(hub: FakeTransport) -> None:
    a, b = hub.subscribe("a"), hub.subscribe("b")
    assert a.live and b.live
    hub.send("a")
    t0 = time.monotonic()
    assert a.wait(10)
    assert time.monotonic() - t0 < 5
    assert not b.wait(0.05)
    a.close()
    b.close()
    assert hub._waiters == {}


def test_a_notification_between_the_read_and_the_wait_is_not_lost(hub: FakeTransport) -> None:
    waiter = hub.subscribe("x")
    # ... the caller reads the store here (running) ... then the execution ends and is announced:
    hub.send("x")
    deadline = time.monotonic() + 10
    while hub.deliveries == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    t0 = time.monotonic()
    assert waiter.wait(30)  # returns at once: the event was set before the wait began
    assert time.monotonic() - t0 < 1


def test_a_broken_transport_wakes_its_waiters_and_they_poll_until_it_is_back(hub: FakeTransport) -> None:
    waiter = hub.subscribe("x")
    assert waiter.live
    hub.fail()
    assert waiter.wait(10)  # woken by the failure, to re-read
    assert not waiter.live  # and from now on it polls (it may have missed a notification)
    deadline = time.monotonic() + 10
    while hub.state != "up" and time.monotonic() < deadline:  # the listener reconnects by itself
        time.sleep(0.01)
    assert hub.connects == 2 and hub.subscribe("y").live
    # back on push once the listener is: woken to re-read what it may have missed meanwhile
    assert waiter.live and waiter.wait(0)


def test_a_transport_that_cannot_connect_gives_polling_waiters_at_once() -> None:
    hub = FakeTransport(refuse=True)
    try:
        t0 = time.monotonic()
        first = hub.subscribe("x")
        assert not first.live
        second = hub.subscribe("y")  # down: no second wait for the listener
        assert not second.live and time.monotonic() - t0 < 2
    finally:
        hub.close()


def test_close_stops_the_listener_and_a_later_subscribe_starts_another(hub: FakeTransport) -> None:
    waiter = hub.subscribe("x")
    hub.close()
    assert waiter.wait(1) and not waiter.live
    assert hub.state == "idle"
    again = hub.subscribe("x")
    assert again.live and hub.connects == 2


def test_no_push_sleeps_the_whole_timeout() -> None:
    waiter = NoPush().subscribe("x")
    t0 = time.monotonic()
    assert not waiter.wait(0.05) and not waiter.live
    assert time.monotonic() - t0 >= 0.04


def test_payload_is_the_id_or_a_digest_under_the_postgres_limit() -> None:
    assert payload_of("order-1") == "order-1"
    long = payload_of("é" * 5000)
    assert long.startswith("#") and len(long) == 65


# --- choosing a transport -----------------------------------------------------------------


def test_build_notifier_choices(tmp_path: Any) -> None:
    from celery_durable.stores import store_from_url
    from celery_durable.stores.push.redis import RedisNotifier

    sqlite = store_from_url(f"sqlite:///{tmp_path / 's.db'}")
    assert isinstance(build_notifier("off", sqlite, "redis://h/0", TERMINAL), NoPush)
    assert isinstance(build_notifier("auto", sqlite, None, TERMINAL), NoPush)
    redis = build_notifier("auto", sqlite, "redis://h:1/0", TERMINAL)
    assert isinstance(redis, RedisNotifier) and redis.url == "redis://h:1/0"
    explicit = build_notifier("redis://other:2/3", sqlite, "redis://h:1/0", TERMINAL)
    assert isinstance(explicit, RedisNotifier) and explicit.url == "redis://other:2/3"


def test_result_push_setting_is_validated_and_its_url_never_shown() -> None:
    assert Settings().result_push == "auto"
    with pytest.raises(ConfigurationError, match="result_push"):
        Settings(result_push="sometimes")
    with pytest.raises(ConfigurationError) as err:
        Settings(result_push="amqp://u:hunter2@h//")
    assert "hunter2" not in str(err.value)
    assert "hunter2" not in repr(Settings(result_push="redis://:hunter2@h:6379/0"))
    with pytest.raises(ConfigurationError, match="result_poll_max"):
        Settings(result_poll_max=0)


def test_the_glue_finds_redis_in_the_result_backend_or_the_broker() -> None:
    from celery import Celery

    from celery_durable.app import _redis_url

    assert _redis_url(Celery("a", broker="redis://b:1/2", backend="redis://r:3/4")) == "redis://r:3/4"
    assert _redis_url(Celery("a", broker="redis://b:1/2;redis://c:1/2")) == "redis://b:1/2"
    assert _redis_url(Celery("a", broker="amqp://guest@h//", backend="rediss://r:3/4")) == "rediss://r:3/4"
    assert _redis_url(Celery("a", broker="amqp://guest@h//")) is None
