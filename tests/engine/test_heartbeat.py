"""One heartbeat thread per process for activity leases and effect handlers; stopped on shutdown."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

from celery import Celery

from celery_durable import Durable
from celery_durable.engine.activities.lease_heartbeat import Heartbeat
from celery_durable.engine.documents.model import Attempt
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


def test_an_attempt_tracked_while_the_heartbeat_idles_does_not_wake_it() -> None:
    """A wake-up per activity was a thread switch in the middle of the activity's store calls;
    the idle thread already looks again within a renewal interval, so it is left asleep."""
    durable = Durable(Celery("hb-idle", set_as_current=False), store="memory://", heartbeat_interval=5, lease_ttl=20)
    engine = durable.engine
    rounds: list[float] = []
    next_beat = engine.leases.next_beat

    def counted(now: float) -> float | None:
        rounds.append(now)
        return next_beat(now)

    engine.leases.next_beat = counted  # type: ignore[method-assign]
    try:
        first = Attempt("e", 1, "a", "0", "holder-0", 1)
        engine.leases.track(first)  # starts the thread
        _wait(lambda: len(rounds) >= 1)
        engine.leases.untrack(first)
        for i in range(1, 51):  # one activity after another, as a pool child runs them
            attempt = Attempt("e", i + 1, "a", "0", f"holder-{i}", 1)
            engine.leases.track(attempt)
            engine.leases.untrack(attempt)
        tracked = Attempt("e", 99, "a", "0", "holder-99", 1)
        engine.leases.track(tracked)
        time.sleep(0.2)  # room for wake-ups to show (none should happen)
        assert len(rounds) <= 2, f"the heartbeat woke {len(rounds)} times for 52 tracked attempts"
    finally:
        durable.shutdown()


def test_a_beat_planned_later_than_a_new_attempt_wants_is_brought_forward() -> None:
    """The thread idles 60 s on its own; an attempt wanting a renewal sooner must wake it."""
    heartbeat = Heartbeat("celery-durable-test", idle_check=60.0)
    beats: list[float] = []
    wanted: list[float] = []

    class Beater:
        def next_beat(self, now: float) -> float | None:
            return wanted[0] if wanted else None

        def beat(self) -> None:
            beats.append(time.monotonic())
            wanted.clear()

    heartbeat.add(Beater())
    try:
        heartbeat.wake()
        _wait(lambda: heartbeat._planned is not None)  # idling, planned a minute ahead
        wanted.append(time.monotonic() + 0.05)
        heartbeat.wake(wanted[0])
        _wait(lambda: len(beats) == 1, timeout=2.0)
    finally:
        heartbeat.stop()
