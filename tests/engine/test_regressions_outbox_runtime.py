"""Regression tests for the effect outbox runtime (issue 11): interrupts deferred by shielded
library calls, ``durable.outbox.wait`` in a handler, the retry delay at high attempt numbers, a
slow store call and the other handlers' timeouts, a beat after a settle. Each failed on the code
before its fix (the first six were findings of tests/engine/test_adversarial_outbox.py; their
docstrings describe the break as found)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from celery_durable.engine.activities.lease_heartbeat import Heartbeat
from celery_durable.engine.outbox import PENDING, RETRY, SUCCEEDED
from celery_durable.engine.outbox.runtime import EffectContext, EffectKeeper, EffectTimeout, execute
from celery_durable.errors import IdempotencyConflict
from celery_durable.retry import RetryPolicy
from celery_durable.stores import Store
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.sqlite.store import SqliteStore
from tests.engine.outbox_env import Env, Glue, Retry


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "outbox.db"))
    yield s
    s.close()


def make_env(store: Store, **settings: Any) -> tuple[Env, list[Any]]:
    """An Env with one handler ``note`` that records the payloads it ran with."""
    env = Env(store, **settings)
    ran: list[Any] = []

    @env.handler("note")
    def note(payload: Any) -> None:
        ran.append(payload)

    return env, ran


def quiet_keeper() -> EffectKeeper:
    """A keeper whose heartbeat never runs: the test calls ``beat`` itself."""
    heartbeat = Heartbeat("celery-durable-test")
    heartbeat.disable()
    return EffectKeeper(poll=60.0, heartbeat=heartbeat)


@pytest.fixture
def glue() -> Iterator[Glue]:
    g = Glue()
    yield g
    g.close()


# --- an interrupt deferred by a shielded call is raised even when the call raises ---------------


def test_a_timeout_deferred_during_a_raising_outbox_call_is_raised_at_its_end(glue: Glue) -> None:
    """Promise (Retries / Cancel): "timeout= stops a handler that runs too long"; "calls into
    durable.outbox from a handler are never interrupted midway" -- the interrupt is deferred to
    the end of the call. Break: ``EffectContext.shield`` raises the deferred interrupt *after*
    its ``try/finally``, so when the shielded call itself raises (here ``wait`` times out; just
    as well ``enqueue`` raising IdempotencyConflict / LaneFull / StoreUnavailable) the deferred
    interrupt is dropped -- and since the context is marked interrupted, no other is ever sent.
    The handler (timeout 0.2 s) catches the call's error and keeps running, CPU-bound, for its
    full 3 s; nothing stops it (in a worker: until Celery's hard time limit kills the process)."""
    finished: list[float] = []

    @glue.durable.effect("adv.fanout", timeout=0.2)
    def fanout(payload: dict[str, Any]) -> None:
        from celery_durable.errors import DurableTimeoutError

        try:
            glue.outbox.wait("never-enqueued", timeout=0.5)  # the timeout lands in here: deferred
        except DurableTimeoutError:
            pass
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # CPU-bound: only the interrupt can stop it
            sum(range(1000))
        finished.append(time.monotonic())

    glue.outbox.enqueue("adv.fanout", {}, key="k", effect_id="f1")
    started = time.monotonic()
    glue.deliver_all(limit=1)
    took = time.monotonic() - started
    assert not finished and took < 1.5, (
        f"timeout=0.2 s: the handler ran to its end ({took:.1f} s); the deferred EffectTimeout was lost"
    )


def test_a_cancel_deferred_during_a_raising_enqueue_stops_the_handler(glue: Glue) -> None:
    """Promise (Cancel): "A running handler is told and stopped -- an EffectCancelled is raised
    inside it unless it was declared interruptible=False". Break: the cancel lands while the
    handler is inside ``durable.outbox.enqueue`` (shielded: deferred), and that enqueue raises
    ``IdempotencyConflict`` (the handler expects it and goes on). The deferred EffectCancelled
    is dropped with the enqueue's exception; the interruptible, CPU-bound handler of a
    cancelled effect runs to its end, and its key stays held all that time."""
    from celery_durable.engine.outbox.runtime import effect_context
    from celery_durable.errors import IdempotencyConflict

    ran_to_end: list[bool] = []
    cancel_at: list[float] = []

    @glue.durable.effect("adv.fan2")
    def fan2(payload: dict[str, Any]) -> None:
        try:
            glue.outbox.enqueue("adv.fan2", {"other": 1}, key="k2", effect_id="taken")
        except IdempotencyConflict:
            pass  # someone else owns that id: fine, carry on
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            sum(range(1000))
        ran_to_end.append(True)

    glue.outbox.enqueue("adv.fan2", {"other": 0}, key="k2", effect_id="taken")
    glue.sender.take()
    glue.outbox.enqueue("adv.fan2", {}, key="k", effect_id="f2")
    original = glue.store.read

    def read(pk: str, doc_id: str) -> Any:
        if pk == "fxid:taken" and not cancel_at:  # inside the handler's enqueue (shielded)
            cancel_at.append(time.monotonic())
            glue.core.cancel("f2")
            ctx = effect_context()
            limit = time.monotonic() + 5
            while ctx._deferred is None and time.monotonic() < limit:  # the heartbeat saw it
                time.sleep(0.01)
        return original(pk, doc_id)

    glue.store.read = read  # type: ignore[method-assign]
    glue.deliver_all(limit=1)
    glue.store.read = original  # type: ignore[method-assign]
    took = time.monotonic() - cancel_at[0]
    assert not ran_to_end and took < 1.5, (
        f"cancelled during a raising enqueue: the handler ran to its end ({took:.1f} s after the cancel)"
    )


def test_an_interrupt_deferred_by_a_failing_shielded_call_wins_chained_to_the_calls_error(store: Store) -> None:
    """The deferred interrupt replaces the call's error (a handler catching that error must not
    swallow its timeout) and keeps it as its cause."""
    env, _ = make_env(store)
    env.enqueue("note", 1, key="k", effect_id="a")
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    ctx = EffectContext(env.outbox, claim, env.effects.require("note"))
    with pytest.raises(EffectTimeout) as raised:
        with ctx:
            with ctx.shield():
                ctx.time_out()  # due now, but deferred to the end of the call
                assert ctx._deferred is EffectTimeout
                raise IdempotencyConflict("effect id 'x' is held by another request")
    assert isinstance(raised.value.__cause__, IdempotencyConflict)
    with ctx:  # nothing is left over for a later shielded call
        with ctx.shield():
            pass


# --- durable.outbox.wait in a handler is interruptible between its reads ----------------------


def test_a_handler_waiting_in_outbox_wait_is_stopped_at_its_timeout(glue: Glue) -> None:
    """Promise (Retries): "timeout= stops a handler that runs too long". Break: every
    ``durable.outbox`` method is shielded from interrupts (so a call is never interrupted
    midway), and ``wait()`` is one of them: a handler blocked in ``durable.outbox.wait(other)``
    -- e.g. waiting for an effect queued behind itself on its own key, which can never run --
    is not stopped at its 0.3 s timeout but only when ``wait`` gives up (3 s here, 60 s by
    default)."""
    stopped: list[float] = []

    @glue.durable.effect("adv.waiter", timeout=0.3)
    def waiter(payload: dict[str, Any]) -> None:
        try:
            glue.outbox.wait("never-enqueued", timeout=3.0)
        finally:
            stopped.append(time.monotonic())

    glue.outbox.enqueue("adv.waiter", {}, key="k", effect_id="w1")
    started = time.monotonic()
    glue.deliver_all(limit=1)
    took = stopped[0] - started
    assert took < 1.5, f"a handler with timeout=0.3 s ran {took:.1f} s (stopped only when outbox.wait gave up)"


def test_a_cancelled_handler_waiting_in_outbox_wait_is_stopped(glue: Glue) -> None:
    """Promise (Cancel): "A running handler is told ... and stopped". Break: the handler is
    blocked in the shielded ``durable.outbox.wait``; the cancel's interrupt is deferred until
    ``wait`` returns, so the cancelled handler keeps running (and its key stays held) for the
    whole wait timeout (3 s here, 60 s by default) instead of about ``cancel_poll`` (0.05 s)."""
    entered, stopped = threading.Event(), threading.Event()

    @glue.durable.effect("adv.waiter2")
    def waiter(payload: dict[str, Any]) -> None:
        entered.set()
        try:
            glue.outbox.wait("never-enqueued", timeout=3.0)
        finally:
            stopped.set()

    glue.outbox.enqueue("adv.waiter2", {}, key="k", effect_id="w2")
    worker = threading.Thread(target=glue.deliver_all, kwargs={"limit": 1})
    worker.start()
    assert entered.wait(5)
    glue.outbox.cancel("w2")
    cancelled_at = time.monotonic()
    assert stopped.wait(10)
    took = time.monotonic() - cancelled_at
    worker.join(10)
    assert took < 1.0, f"the cancelled handler kept running {took:.1f} s inside durable.outbox.wait"


# --- the retry delay at high attempt numbers ---------------------------------------------------


def test_retry_delay_is_capped_without_overflowing() -> None:
    """``backoff**(attempt-1)`` overflowed a float (coefficient 10: attempt ~310; 2: attempt 1025)."""
    cap = timedelta(seconds=30)
    for coefficient in (1.0, 1.5, 2.0, 10.0, 1e300):
        policy = RetryPolicy(backoff_coefficient=coefficient, maximum_interval=cap, maximum_attempts=10**9)
        for attempt in (310, 1025, 10**6, 10**30):
            expected = policy.initial_interval if coefficient == 1.0 else cap
            assert policy.delay(attempt) == expected, (coefficient, attempt)
    policy = RetryPolicy()
    assert [policy.delay(n).total_seconds() for n in (1, 2, 3, 9, 10, 11)] == [0.1, 0.2, 0.4, 25.6, 30.0, 30.0]
    assert math.isclose(RetryPolicy(maximum_interval=timedelta.max).delay(30).total_seconds(), 0.1 * 2**29)
    assert RetryPolicy(maximum_interval=timedelta.max).delay(5000) == timedelta.max


def test_a_retry_delay_at_a_high_attempt_is_capped_and_the_failure_settled_as_a_retry(store: Store) -> None:
    """Promise (Retries): retries use the handler's RetryPolicy, ``min(maximum_interval,
    initial * backoff^(attempt-1))``, until ``maximum_attempts``. Break: the delay is computed as a
    float power before the ``min``: with ``backoff_coefficient=10`` it overflows at attempt ~310
    (coefficient 2: attempt 1025). ``OverflowError`` escapes ``execute``: the failure is not
    settled, the row stays RUNNING until its lease expires, the scan requeues it at once (no
    backoff), and the next attempt crashes the same way -- a hot loop of runs every lease TTL."""
    from celery_durable.engine.outbox.runtime import EffectDef
    from celery_durable.retry import RetryPolicy

    env, _ = make_env(store)
    policy = RetryPolicy(
        backoff_coefficient=10.0, maximum_interval=__import__("datetime").timedelta(seconds=30), maximum_attempts=1000
    )

    def down(payload: Any) -> None:
        raise ConnectionError("the webhook endpoint is down")

    env.effects.add(EffectDef("hook", down, env.effects.require("note").codec, policy=policy))
    body = env.outbox.effect_body(
        "hook", 1, key="k", effect_id="h", available_at=None, replay_safe=True, max_attempts=1000
    )
    env.outbox.admit(body)
    row = env.row("k", "h")  # the endpoint has been down for a while: 309 attempts so far
    store.replace({k: v for k, v in row.items() if k != "_etag"} | {"attempt": 309}, row["_etag"])
    claim = env.outbox.claim("k", "h").claim
    assert claim is not None
    outcome: Any
    try:
        outcome = execute(env.outbox, claim, env.effects.require("hook"), env.keeper)
    except OverflowError as exc:
        outcome = exc
    row = env.row("k", "h")
    assert not isinstance(outcome, BaseException) and row["status"] == PENDING, (
        f"attempt 310 failed: execute raised {outcome!r}; the row is left {row['status']!r}"
    )
    # a retry after the maximum interval (30 s, jittered into [15 s, 30 s]), not at once
    assert outcome.kind == RETRY and 15.0 <= outcome.delay <= 30.0, outcome
    assert row["available_at"] == pytest.approx(env.clock.now() + outcome.delay)


# --- a slow store call of the heartbeat and the other handlers' timeouts ------------------------


def test_a_slow_renew_of_one_handler_does_not_delay_the_timeout_of_another(glue: Glue) -> None:
    """Promise (Retries): "timeout= stops a handler that runs too long" (a timeout is for handlers
    stuck on something slow). Break: the process's one heartbeat thread checks every running
    handler in turn -- timeout, then a store read/renew -- so one store call that hangs (4 s here,
    for another effect's renew: a throttled or locked store) holds back every other handler's
    timeout, cancel check and lease renewal. A CPU-bound handler with ``timeout=0.3`` runs ~4 s."""
    from celery_durable.engine.outbox.runtime import effect_context

    a_started, b_running, release_b = threading.Event(), threading.Event(), threading.Event()
    a_stopped: list[float] = []
    slowed: list[int] = []

    @glue.durable.effect("adv.long")
    def long(payload: dict[str, Any]) -> None:
        b_running.set()
        while not release_b.is_set():
            effect_context().sleep(0.02)

    @glue.durable.effect("adv.spin", timeout=0.3)
    def spin(payload: dict[str, Any]) -> None:
        a_started.set()
        try:
            deadline = time.monotonic() + 6.0
            while time.monotonic() < deadline:
                sum(range(1000))
        finally:
            a_stopped.append(time.monotonic())

    original = glue.store.read

    def read(pk: str, doc_id: str) -> Any:
        if doc_id == "fx:B" and a_started.is_set() and not slowed and "heartbeat" in threading.current_thread().name:
            slowed.append(1)
            time.sleep(4.0)  # the injected fault: this store call takes 4 s
        return original(pk, doc_id)

    glue.store.read = read  # type: ignore[method-assign]
    glue.outbox.enqueue("adv.long", {}, key="kb", effect_id="B")
    glue.outbox.enqueue("adv.spin", {}, key="ka", effect_id="A")
    glue.sender.take()

    def run(key: str, eid: str) -> None:
        try:
            glue.outbox.deliver(glue.task, key, eid)
        except Retry:
            pass

    tb = threading.Thread(target=run, args=("kb", "B"))
    tb.start()
    assert b_running.wait(5)  # B is tracked first: the heartbeat visits it before A
    ta = threading.Thread(target=run, args=("ka", "A"))
    ta.start()
    assert a_started.wait(5)
    started = time.monotonic()
    ta.join(15)
    release_b.set()
    tb.join(15)
    glue.store.read = original  # type: ignore[method-assign]
    took = a_stopped[0] - started
    assert took < 1.5, (
        f"timeout=0.3 s, but the handler was stopped after {took:.1f} s (a slow renew of B held the heartbeat)"
    )


# --- a beat after the settle: a settled claim is not a lost one --------------------------------


def lease_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "another worker owns it now" in r.getMessage()]


def test_a_beat_between_the_settle_and_the_untrack_does_not_report_a_lost_lease(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The settle marks its claim lost (the lease is gone); a heartbeat beat that came before
    ``execute`` stopped tracking the handler renewed it, found it "lost" and warned that another
    worker owned a row this worker had just settled."""
    env, ran = make_env(store)
    keeper = quiet_keeper()
    env.enqueue("note", 1, key="k", effect_id="a")
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    settle = env.outbox.settle

    def settle_then_beat(*args: Any, **kwargs: Any) -> str:
        kind = settle(*args, **kwargs)
        keeper.beat()  # the heartbeat lands right after the settle, before the untrack
        return kind

    env.outbox.settle = settle_then_beat  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="celery_durable.outbox"):
        outcome = execute(env.outbox, claim, env.effects.require("note"), keeper)
    assert (outcome.kind, ran) == (SUCCEEDED, [1])
    assert lease_warnings(caplog) == []


def test_a_beat_in_flight_across_the_settle_does_not_report_a_lost_lease(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    """The same with a beat that started while the handler ran and renews only after the settle."""
    env, _ = make_env(store)
    keeper = quiet_keeper()
    renewing, settled = threading.Event(), threading.Event()
    beats: list[threading.Thread] = []

    @env.handler("beaten")
    def beaten(payload: Any) -> None:
        beats.append(threading.Thread(target=keeper.beat))
        beats[0].start()
        assert renewing.wait(5)  # the beat is past its checks, about to renew

    renew, settle = env.outbox.renew, env.outbox.settle

    def slow_renew(claim: Any) -> str:
        renewing.set()
        assert settled.wait(5)
        return renew(claim)

    def settle_and_tell(*args: Any, **kwargs: Any) -> str:
        try:
            return settle(*args, **kwargs)
        finally:
            settled.set()

    env.outbox.renew = slow_renew  # type: ignore[method-assign]
    env.outbox.settle = settle_and_tell  # type: ignore[method-assign]
    env.enqueue("beaten", 1, key="k", effect_id="b")
    claim = env.outbox.claim("k", "b").claim
    assert claim is not None
    with caplog.at_level(logging.INFO, logger="celery_durable.outbox"):
        outcome = execute(env.outbox, claim, env.effects.require("beaten"), keeper)
        beats[0].join(5)
    assert not beats[0].is_alive() and outcome.kind == SUCCEEDED
    assert claim.lost  # the renew after the settle did see a "lost" claim
    assert lease_warnings(caplog) == []


# --- a claim that used up its rounds on conflicts is retried, not dropped -----------------------


def test_a_claim_that_loses_every_round_is_retried_not_dropped(glue: Glue, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every claim batch loses its etag race (as on a lagging replica that serves the same
    stale head each time). The claim used to answer "blocked" after its last round, and the
    delivery was dropped: nobody ran the first row of the key until beat's outbox scan."""
    from celery_durable.errors import ConflictError

    @glue.durable.effect("adv.note")
    def note(payload: dict[str, Any]) -> None:
        pass

    glue.outbox.enqueue("adv.note", {"n": 1}, key="k", effect_id="e1")
    real_batch = glue.store.batch

    def losing(pk: str, ops: Any) -> Any:
        raise ConflictError("etag mismatch (test: the head moved)")

    monkeypatch.setattr(glue.store, "batch", losing)
    (ref,) = glue.sender.take()
    with pytest.raises(Retry):
        glue.outbox.deliver(glue.task, ref.key, ref.effect_id)
    monkeypatch.setattr(glue.store, "batch", real_batch)
    glue.sender.send_effect(ref)
    assert glue.deliver_all() == [SUCCEEDED]


def test_a_drain_stays_within_the_workers_own_time_limit(glue: Glue) -> None:
    """``celery worker --soft-time-limit 5`` is not in app.conf: the bootstep notes it. A
    delivery drains the key's next rows only while they fit in the task's time limit; it used to
    see the message's, the task's and app.conf's limits only, and ran rows past the pool's."""
    from celery_durable.engine.outbox.model import lane_pk, row_id
    from celery_durable.glue.pools import note_worker_limits

    @glue.durable.effect("adv.slowish", timeout=2.0)
    def slowish(payload: dict[str, Any]) -> None:
        pass

    for i in range(3):
        glue.outbox.enqueue("adv.slowish", {"n": i}, key="k", effect_id=f"s{i}")
    (first, *_rest) = glue.sender.take()
    note_worker_limits(None, 5.0)  # 2.5 x 2 s + 1 s of room does not fit in 5 s: one row a message
    try:
        glue.outbox.deliver(glue.task, first.key, first.effect_id)
    finally:
        note_worker_limits(None, None)

    def status() -> list[Any]:
        return [(glue.store.read(lane_pk("k"), row_id(f"s{i}")) or {}).get("status") for i in range(3)]

    assert status() == [SUCCEEDED, PENDING, PENDING]
    glue.deliver_all()  # the settle sent the next row's message: it drains the rest (no limit now)
    assert status() == [SUCCEEDED] * 3
