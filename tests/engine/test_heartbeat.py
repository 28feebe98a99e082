"""One heartbeat thread per process for activity leases and effect handlers; stopped on shutdown."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from celery import Celery

from celery_durable import Durable
from celery_durable.engine.heartbeat import Heartbeat
from celery_durable.engine.model import Attempt
from celery_durable.engine.outbox.runtime import EffectKeeper


def _threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("celery-durable"))


def _wait(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def test_activities_and_effects_share_one_heartbeat_that_shutdown_stops() -> None:
    durable = Durable(Celery("hb-test", set_as_current=False), store="memory://", heartbeat_interval=0.05, lease_ttl=1)
    engine = durable.engine
    assert engine.effect_keeper.heartbeat is engine.heartbeat  # one heartbeat for both kinds of lease
    before = set(threading.enumerate())
    engine.leases.track(Attempt("e", 1, "a", "0", "holder", 1))
    _wait(lambda: engine.heartbeat.running)
    started = [t for t in set(threading.enumerate()) - before if t.name.startswith("celery-durable")]
    assert [t.name for t in started] == ["celery-durable-heartbeat"]
    beats: list[float] = []
    engine.leases.renew_all = lambda: beats.append(time.monotonic())  # type: ignore[method-assign]
    _wait(lambda: len(beats) >= 2)  # it renews at its interval
    durable.shutdown()  # outbox B8: the heartbeat thread must not outlive the shutdown
    _wait(lambda: not started[0].is_alive())
    assert not engine.heartbeat.running


def test_a_timed_out_handler_does_not_make_the_heartbeat_spin() -> None:
    """Outbox B2: after a handler's deadline passed, the keeper asked to beat again at once, forever."""
    keeper = EffectKeeper(poll=0.5, heartbeat=Heartbeat("celery-durable-test"))
    ctx = SimpleNamespace(deadline=time.monotonic() - 1.0, timed_out=True)
    keeper.track(ctx)  # type: ignore[arg-type]
    keeper.heartbeat.stop()
    keeper.beat = lambda: None  # type: ignore[method-assign]
    now = time.monotonic()
    at = keeper.next_beat(now)
    assert at is not None and at > now + 0.4  # the next poll, not the past deadline
    ctx.timed_out = False  # not yet timed out: its deadline is what the heartbeat waits for
    assert keeper.next_beat(now) == ctx.deadline
