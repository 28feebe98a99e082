"""The outbox state machine (docs/architecture.md §9) without Celery: memory and SQLite stores, fake clock."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable import workflow as wf
from celery_durable.codecs import ValueCodec
from celery_durable.engine import Engine, InlineDispatcher, Registry
from celery_durable.engine.drive.in_process import LocalWorker
from celery_durable.engine.outbox import (
    CANCELLED,
    FAILED,
    PENDING,
    RETRY,
    RUNNING,
    SUCCEEDED,
    EffectRef,
    LaneFull,
    OutboxSettings,
)
from celery_durable.engine.outbox.runtime import (
    EffectCancelled,
    EffectDef,
    Outcome,
    effect_context,
    effects_of,
    shielded,
)
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import IdempotencyConflict, PayloadValidationError, StoreUnavailable
from celery_durable.retry import RetryPolicy
from celery_durable.settings import Settings
from celery_durable.stores import Store
from celery_durable.stores.base import Op
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.sqlite.store import SqliteStore
from tests.engine.outbox_env import Email, Env, FakeClock


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "outbox.db"))
    yield s
    s.close()


@pytest.fixture
def env(store: Store) -> Env:
    e = Env(store)

    @e.handler("note")
    def note(payload: Any) -> None:
        pass

    return e


def ids(refs: list[EffectRef]) -> list[str]:
    return [r.effect_id for r in refs]


# --- enqueue ----------------------------------------------------------------------------------


def test_enqueue_is_idempotent_and_wakes_once(env: Env) -> None:
    first = env.enqueue("note", {"x": 1}, key="k", effect_id="e1")
    again = env.enqueue("note", {"x": 1}, key="k", effect_id="e1")
    with pytest.raises(IdempotencyConflict):  # the id is global: another key is another request
        env.enqueue("note", {"x": 1}, key="other", effect_id="e1")
    assert (first.created, again.created) == (True, False)
    assert [ref.effect_id for ref, _ in env.sender.sent] == ["e1"]
    assert [r["effect_id"] for r in env.outbox.rows("k")] == ["e1"]
    assert env.outbox.rows("other") == []
    env.drain()
    assert env.ran == [("e1", 1)]
    assert env.enqueue("note", {"x": 1}, key="k", effect_id="e1").created is False
    assert env.sender.take() == []


def test_an_orphan_index_does_not_swallow_an_enqueue(env: Env) -> None:
    # an enqueuer died after writing the index, before its lane batch
    created = env.clock.now()
    env.store.create(
        {
            "pk": "fxid:o1",
            "id": "fx",
            "type": "effect_index",
            "key": "gone",
            "effect_type": "note",
            "created_at": created,
        }
    )
    with pytest.raises(IdempotencyConflict) as held:  # it may still be on its way to its lane
        env.enqueue("note", key="k", effect_id="o1")
    assert held.value.pending
    env.clock.advance(env.settings.retention + 1)  # the idempotency window is over: the id is free
    admitted = env.enqueue("note", key="k", effect_id="o1")
    assert admitted.created and admitted.key == "k"
    assert env.outbox.get("o1")["key"] == "k"  # type: ignore[index]


def test_payload_validated_against_the_handler_type(store: Store) -> None:
    e = Env(store)

    @e.handler("email")
    def send(payload: Email) -> None:
        pass

    with pytest.raises(PayloadValidationError, match="n"):
        e.enqueue("email", {"to": "a@b", "n": "many"}, key="k", effect_id="bad")
    assert e.outbox.get("bad") is None
    e.enqueue("email", Email(to="a@b", n=2), key="k", effect_id="ok")
    assert e.outbox.get("ok")["payload"] == {"to": "a@b", "n": 2}  # type: ignore[index]


def test_lane_backlog_is_bounded(store: Store) -> None:
    e = Env(store, max_lane_backlog=3)
    e.handler("note")(lambda payload: None)
    for i in range(3):
        e.enqueue("note", key="k", effect_id=f"e{i}")
    with pytest.raises(LaneFull):
        e.enqueue("note", key="k", effect_id="e3")


# --- claim and ordering ---------------------------------------------------------------------------


def test_one_key_runs_strictly_in_order(env: Env) -> None:
    for name in ("a", "b", "c"):
        env.enqueue("note", key="k", effect_id=name)
    assert ids(env.sender.take()) == ["a"]  # later rows are not even sent: they would be blocked
    assert env.outbox.claim("k", "b").reason == "blocked"
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None and claim.attempt == 1
    assert env.outbox.claim("k", "a").reason == "duplicate"
    assert env.outbox.claim("k", "b").reason == "blocked"  # a runs
    assert env.outbox.settle(claim, SUCCEEDED) == SUCCEEDED
    assert ids(env.sender.take()) == ["b"]  # the settle wakes the next row
    env.sender.sent.append((EffectRef("k", "b", "note"), None))
    env.drain()
    assert [name for name, _ in env.ran] == ["b", "c"]
    assert [r["status"] for r in env.outbox.rows("k")] == [SUCCEEDED] * 3
    assert env.outbox.claim("k", "a").reason == "settled"


def test_different_keys_are_claimed_independently(env: Env) -> None:
    env.enqueue("note", key="k1", effect_id="a")
    env.enqueue("note", key="k2", effect_id="b")
    a = env.outbox.claim("k1", "a").claim
    b = env.outbox.claim("k2", "b").claim
    assert a is not None and b is not None  # both run at once


def test_of_concurrent_claimers_only_one_wins(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    barrier = threading.Barrier(8)
    won: list[str] = []

    def claimer(i: int) -> None:
        barrier.wait()
        result = env.outbox.claim("k", "a", owner=f"w{i}")
        if result.claim is not None:
            won.append(result.claim.owner)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1
    assert env.row("k", "a")["lease"]["owner"] == won[0]


def test_a_row_in_backoff_blocks_the_later_rows(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    env.enqueue("note", key="k", effect_id="b")
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    assert env.outbox.settle(claim, RETRY, error="boom", delay=0.4) == RETRY
    row = env.row("k", "a")
    assert row["status"] == PENDING and row["last_error"] == "boom" and row["lease"] is None
    assert env.outbox.claim("k", "b").reason == "blocked"
    early = env.outbox.claim("k", "a")
    assert early.reason == "early" and early.wait == pytest.approx(0.4)
    env.clock.advance(0.4)
    again = env.outbox.claim("k", "a").claim
    assert again is not None and again.attempt == 2


def test_delayed_enqueue_waits_for_available_at(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="later", available_at=env.clock.now() + 5)
    [(ref, countdown)] = env.sender.sent
    assert countdown == pytest.approx(5)
    assert env.outbox.claim("k", "later").reason == "early"


# --- settle under lease ownership --------------------------------------------------------------------


def test_settle_without_the_lease_writes_nothing(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    row = env.row("k", "a")
    stolen = {k: v for k, v in row.items() if k != "_etag"} | {"lease": {"owner": "thief", "expires": 9e12}}
    env.store.replace(stolen, if_match=row["_etag"])
    for verb in (SUCCEEDED, FAILED, RETRY):
        assert env.outbox.settle(claim, verb, error="x") == "lease-lost"
    after = env.row("k", "a")
    assert after["status"] == RUNNING and after["lease"]["owner"] == "thief"
    assert env.outbox.renew(claim) == "lost"
    assert any(e == "effect_lease_lost" for e, _ in env.events)


def test_heartbeat_extends_the_lease(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    first = env.row("k", "a")["lease"]["expires"]
    env.clock.advance(0.5)  # renewed once less than ttl - interval + one cancel poll (9 s) is left
    assert env.outbox.renew(claim) == "ok"
    assert env.row("k", "a")["lease"]["expires"] == first  # plenty left: no write
    env.clock.advance(8.5)
    assert env.outbox.renew(claim) == "ok"
    assert env.row("k", "a")["lease"]["expires"] == pytest.approx(env.clock.now() + 10)
    assert env.outbox.settle(claim, SUCCEEDED) == SUCCEEDED  # the renewed etag is the claim's


def test_backoff_schedule_and_attempts_exhausted(store: Store) -> None:
    e = Env(store)
    calls: list[int] = []

    @e.handler("flaky")
    def flaky(payload: Any) -> None:
        calls.append(effect_context().attempt)
        raise ConnectionError("down")

    e.enqueue("flaky", key="k", effect_id="f")
    delays: list[float] = []
    for _ in range(10):
        for ref in e.sender.take():
            out = e.deliver(ref)
            assert isinstance(out, Outcome)
            if out.kind == RETRY:
                delays.append(out.delay)
        if not e.delayed:
            break
        due, ref = e.delayed.pop()
        e.clock.t = due
        e.sender.sent.append((ref, None))
    # exponential, with jitter: each delay in [d/2, d] of 0.1, 0.2, 0.4, 0.8
    assert all(d / 2 <= got <= d for got, d in zip(delays, [0.1, 0.2, 0.4, 0.8], strict=True))
    assert calls == [1, 2, 3, 4, 5]
    row = e.row("k", "f")
    assert row["status"] == FAILED and row["attempt"] == 5
    assert "attempts exhausted" in row["reason"] and "ConnectionError: down" in row["last_error"]
    assert RetryPolicy().delay(20).total_seconds() == 30.0


@pytest.mark.parametrize("declared", [FAILED, SUCCEEDED])
def test_non_retryable_is_settled_as_declared(store: Store, declared: str) -> None:
    e = Env(store)

    class NotActive(Exception):
        pass

    @e.handler("stop", policy=RetryPolicy(non_retryable=(NotActive,)), non_retryable_status=declared)
    def stop(payload: Any) -> None:
        raise NotActive("is not active")

    e.enqueue("stop", key="k", effect_id="s")
    e.drain()
    row = e.row("k", "s")
    assert row["status"] == declared and row["attempt"] == 1


def test_settle_failure_requeues_replay_safe_and_terminalizes_process_bound(store: Store) -> None:
    class Flaky(Store):
        """Fails the next batch that would settle a row as succeeded."""

        def __init__(self, inner: Store) -> None:
            self.inner, self.armed = inner, True

        def batch(self, pk: str, ops: Any) -> Any:
            if self.armed and any(op.doc and op.doc.get("status") == SUCCEEDED for op in ops):
                self.armed = False
                raise StoreUnavailable("store went away")
            return self.inner.batch(pk, ops)

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        read = property(lambda self: self.inner.read)  # type: ignore[assignment]
        create = property(lambda self: self.inner.create)  # type: ignore[assignment]
        replace = property(lambda self: self.inner.replace)  # type: ignore[assignment]
        upsert = property(lambda self: self.inner.upsert)  # type: ignore[assignment]
        delete = property(lambda self: self.inner.delete)  # type: ignore[assignment]
        query_partition = property(lambda self: self.inner.query_partition)  # type: ignore[assignment]
        scan_due = property(lambda self: self.inner.scan_due)  # type: ignore[assignment]

    for replay_safe in (True, False):
        flaky = Flaky(store)
        e = Env(flaky)
        e.handler("fx", replay_safe=replay_safe)(lambda payload: None)
        eid = f"e-{replay_safe}"
        e.enqueue("fx", key=eid, effect_id=eid)
        [ref] = e.sender.take()
        out = e.deliver(ref)
        assert isinstance(out, Outcome)
        row = e.row(eid, eid)
        if replay_safe:
            assert out.kind == RETRY and out.requeued and out.delay == 0
            assert row["status"] == PENDING and "Worker failed before settling" in row["last_error"]
            e.drain()
            assert e.row(eid, eid)["status"] == SUCCEEDED and e.ran == [(eid, 1), (eid, 2)]
        else:
            assert out.kind == FAILED
            assert row["status"] == FAILED and "process-bound effect after execution started" in row["reason"]


# --- cancellation ------------------------------------------------------------------------------------


def test_cancel_pending_unblocks_the_key(env: Env) -> None:
    for name in ("a", "b"):
        env.enqueue("note", key="k", effect_id=name)
    env.sender.take()
    assert env.outbox.cancel("a") == 1
    assert ids(env.sender.take()) == ["b"]
    assert env.row("k", "a")["status"] == CANCELLED
    assert env.outbox.claim("k", "a").reason == "settled"
    assert env.outbox.cancel("a") == 0  # already settled


def test_cancel_by_key_and_types(store: Store) -> None:
    e = Env(store)
    e.handler("t1")(lambda payload: None)
    e.handler("t2")(lambda payload: None)
    e.enqueue("t1", key="k", effect_id="x")
    e.enqueue("t2", key="k", effect_id="y")
    e.enqueue("t2", key="k", effect_id="z")
    assert e.outbox.cancel(key="k", types=["t2"]) == 2
    assert [r["status"] for r in e.outbox.rows("k")] == [PENDING, CANCELLED, CANCELLED]
    assert e.outbox.cancel(key="k") == 1


def test_cancel_running_then_settle_reports_cancelled(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    env.enqueue("note", key="k", effect_id="b")
    env.sender.take()
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    assert env.outbox.cancel("a", reason="user asked") == 1
    assert ids(env.sender.take()) == []  # a's handler may still run: b waits (D1)
    assert env.outbox.renew(claim) == "cancelled"
    assert env.outbox.settle(claim, SUCCEEDED) == CANCELLED  # executed, cancelled before settling
    assert ids(env.sender.take()) == ["b"]  # the handler stopped: the key is free
    row = env.row("k", "a")
    assert row["status"] == CANCELLED and row["reason"] == "user asked"


def test_cancel_between_execution_and_settle_is_normal(env: Env) -> None:
    @env.handler("self-cancel")
    def self_cancel(payload: Any) -> None:
        env.outbox.cancel(effect_context().effect_id)

    env.enqueue("self-cancel", key="k", effect_id="a")
    env.enqueue("note", key="k", effect_id="b")
    [ref] = env.sender.take()
    out = env.deliver(ref)
    assert isinstance(out, Outcome) and out.kind == CANCELLED
    env.drain()
    assert [r["status"] for r in env.outbox.rows("k")] == [CANCELLED, SUCCEEDED]


def test_running_handler_is_stopped_on_cancel(store: Store) -> None:
    e = Env(store, clock=_Real(), cancel_poll=0.02)
    seen: list[str] = []

    @e.handler("busy")
    def busy(payload: Any) -> None:
        try:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # a CPU-bound loop that never checks
                sum(range(100))
        finally:
            seen.append("stopped")

    @e.handler("polite", interruptible=False)
    def polite(payload: Any) -> None:
        effect_context().sleep(10)  # wakes on cancel

    for name in ("busy", "polite"):
        e.enqueue(name, key=name, effect_id=name)
        [ref] = e.sender.take()
        outcomes: list[Any] = []
        t = threading.Thread(target=lambda r=ref, out=outcomes: out.append(e.deliver(r)))
        started = time.monotonic()
        t.start()
        _wait(lambda n=name: e.row(n, n)["status"] == RUNNING)
        time.sleep(0.1)
        assert e.outbox.cancel(name) == 1
        t.join(5)
        assert not t.is_alive() and time.monotonic() - started < 3
        assert outcomes[0].kind == CANCELLED
    assert seen == ["stopped"]


def test_library_calls_in_a_handler_are_shielded_from_the_interrupt(store: Store) -> None:
    e = Env(store, clock=_Real(), cancel_poll=0.02)
    trace: list[str] = []

    @e.handler("shielded")
    def handler(payload: Any) -> None:
        with shielded():  # what durable.outbox.* calls made from a handler do
            trace.append("in")
            _wait(lambda: e.row("k", "s")["status"] == CANCELLED)
            time.sleep(0.3)  # the interrupt is due now, but must not land in here
            trace.append("out")
        trace.append("not reached")

    e.enqueue("shielded", key="k", effect_id="s")
    [ref] = e.sender.take()
    outcomes: list[Any] = []
    t = threading.Thread(target=lambda: outcomes.append(e.deliver(ref)))
    t.start()
    _wait(lambda: trace == ["in"])
    e.outbox.cancel("s")
    t.join(5)
    assert trace == ["in", "out"] and outcomes[0].kind == CANCELLED


def test_timeout_interrupts_and_retries(store: Store) -> None:
    e = Env(store, clock=_Real(), cancel_poll=0.05)

    @e.handler("slow", timeout=0.2, policy=RetryPolicy(maximum_attempts=1))
    def slow(payload: Any) -> None:
        while True:
            time.sleep(0.01)

    e.enqueue("slow", key="k", effect_id="s")
    [ref] = e.sender.take()
    out = e.deliver(ref)
    assert isinstance(out, Outcome) and out.kind == FAILED
    assert "timed out after 0.2s" in (e.row("k", "s")["last_error"] or "")


def test_effect_cancelled_is_not_caught_by_except_exception() -> None:
    assert not issubclass(EffectCancelled, Exception)


# --- the liveness scan ---------------------------------------------------------------------------------


def test_scan_resends_a_lost_message_once(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    env.sender.take()  # the message is lost
    assert env.outbox.scan().resent == 0
    env.clock.advance(env.settings.queue_timeout + 1)
    assert env.outbox.scan().resent == 1
    assert env.outbox.scan().resent == 0  # pushed forward: a second beat sends nothing
    assert ids(env.sender.take()) == ["a"]
    env.sender.sent.append((EffectRef("k", "a", "note"), None))
    env.drain()
    assert env.row("k", "a")["status"] == SUCCEEDED


def test_scan_resends_a_retry_whose_message_was_lost(env: Env) -> None:
    env.enqueue("note", key="k", effect_id="a")
    env.sender.take()
    claim = env.outbox.claim("k", "a").claim
    assert claim is not None
    env.outbox.settle(claim, RETRY, error="x", delay=5)
    env.clock.advance(5 + env.settings.queue_timeout + 0.1)
    assert env.outbox.scan().resent == 1


def test_process_loss_requeues_replay_safe_and_fails_process_bound(store: Store) -> None:
    e = Env(store)
    e.handler("safe", replay_safe=True)(lambda payload: None)
    e.handler("bound", replay_safe=False)(lambda payload: None)
    for t in ("safe", "bound"):
        e.enqueue(t, key=t, effect_id=t)
        e.enqueue(t, key=t, effect_id=f"{t}-next")
        assert e.outbox.claim(t, t).claim is not None  # ... and the worker dies
    e.sender.take()
    e.clock.advance(5)
    assert e.outbox.scan().requeued == 0  # lease still live
    e.clock.advance(6)
    report = e.outbox.scan()
    assert (report.requeued, report.failed) == (1, 1)
    safe, bound = e.row("safe", "safe"), e.row("bound", "bound")
    assert safe["status"] == PENDING and safe["lost"] == 1 and "requeued" in safe["last_error"]
    assert bound["status"] == FAILED and "process-bound" in bound["reason"]
    assert sorted(ids(e.sender.take())) == ["bound-next", "safe"]
    e.sender.sent += [(EffectRef("safe", "safe", "safe"), None), (EffectRef("bound", "bound-next", "bound"), None)]
    e.drain()
    assert e.row("safe", "safe")["attempt"] == 2 and e.row("safe", "safe-next")["status"] == SUCCEEDED
    assert e.row("bound", "bound-next")["status"] == SUCCEEDED


def test_prune_after_retention_keeps_failed_rows(store: Store) -> None:
    e = Env(store, retention=100.0)
    e.handler("ok")(lambda payload: None)

    @e.handler("bad", policy=RetryPolicy(maximum_attempts=1))
    def bad(payload: Any) -> None:
        raise ValueError("no")

    e.enqueue("ok", key="k", effect_id="good")
    e.enqueue("bad", key="k", effect_id="broken")
    e.drain()
    assert e.outbox.scan().pruned == 0
    e.clock.advance(101)
    assert e.outbox.scan().pruned == 1
    assert e.outbox.get("good") is None
    assert e.outbox.get("broken")["status"] == FAILED  # type: ignore[index]
    assert e.enqueue("ok", key="k", effect_id="good").created  # dedupe lasts for the retention


# --- transactional enqueue and emit ---------------------------------------------------------------------


def test_transactional_enqueue_with_the_callers_documents(env: Env) -> None:
    body = env.outbox.effect_body(
        "note", {"x": 1}, key="k", effect_id="t1", available_at=None, replay_safe=True, max_attempts=5
    )
    intent = env.outbox.intent("order-1", body)
    env.store.batch("order-1", [Op.create({"pk": "order-1", "id": "order", "total": 3}), Op.create(intent)])
    assert env.outbox.get("t1") is None  # recorded, not yet admitted
    admitted = env.outbox.admit_intent(env.store.read("order-1", intent["id"]) or {})
    assert admitted is not None and admitted.created
    assert env.store.read("order-1", intent["id"]) is None
    assert env.outbox.get("t1")["source"] == {"pk": "order-1", "id": "fxi:t1"}  # type: ignore[index]

    # the caller's batch fails: nothing is enqueued
    body2 = env.outbox.effect_body(
        "note", None, key="k", effect_id="t2", available_at=None, replay_safe=True, max_attempts=5
    )
    with pytest.raises(Exception, match="exists"):
        env.store.batch(
            "order-1", [Op.create({"pk": "order-1", "id": "order"}), Op.create(env.outbox.intent("order-1", body2))]
        )
    env.clock.advance(3600)
    assert env.outbox.scan().admitted == 0 and env.outbox.get("t2") is None


def test_an_unadmitted_intent_is_admitted_by_the_scan(env: Env) -> None:
    body = env.outbox.effect_body(
        "note", None, key="k", effect_id="late", available_at=None, replay_safe=True, max_attempts=5
    )
    env.store.create(env.outbox.intent("caller", body))  # ... and the caller crashes
    assert env.outbox.scan().admitted == 0
    env.clock.advance(env.settings.admit_grace + 0.1)
    assert env.outbox.scan().admitted == 1
    assert env.outbox.scan().admitted == 0
    assert ids(env.sender.take()) == ["late"]


class WorkflowEnv:
    """An engine (which owns its outbox) with an in-process worker that runs drives, activities and effects."""

    def __init__(self, store: Store) -> None:
        self.clock = FakeClock()
        self.dispatcher = InlineDispatcher()
        self.registry = Registry()
        self.engine = Engine(store, self.dispatcher, self.registry, clock=self.clock)
        self.worker = LocalWorker(self.engine, self.dispatcher)
        self.outbox = self.engine.outbox
        self.sent_notes: list[Any] = []
        effects_of(self.registry).add(
            EffectDef("note", lambda payload: self.sent_notes.append(payload), ValueCodec(Email))
        )

    def effect_messages(self) -> list[str]:
        """Ids of every effect message the engine sent so far."""
        return [item.effect_id for kind, item in self.dispatcher.sent if kind == "effect"]

    def activity(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        act = self.registry.add_activity(fn.__name__, fn)

        def call(*args: Any) -> Any:
            return require_context("a").call_activity(act.name, act.codec, args, {}).result()

        return call


def _notify_flow(wenv: WorkflowEnv) -> Callable[[str], str]:
    @wenv.activity
    def step(x: str) -> str:
        return x + "!"

    def flow(name: str) -> str:
        first = wf.emit("note", Email(to=name, n=1))
        out = step(name)
        second = wf.emit("note", {"to": name, "n": 2}, key="shared")
        return f"{first} {second} {out}"

    return flow


def test_emit_from_a_workflow_is_enqueued_exactly_once(store: Store) -> None:
    wenv = WorkflowEnv(store)
    flow = wenv.registry.add_workflow("notify", _notify_flow(wenv))
    eid, _ = wenv.engine.start(flow, ("ann",), {}, workflow_id="wf-1")
    wenv.worker.run()
    ex = wenv.engine.read_exec(eid)
    assert ex["status"] == "completed", ex
    assert ex["result"] == "wf-1:000001 wf-1:000003 ann!"
    first, second = wenv.outbox.get("wf-1:000001"), wenv.outbox.get("wf-1:000003")
    assert first is not None and first["key"] == "wf-1" and first["payload"] == {"to": "ann", "n": 1}
    assert second is not None and second["key"] == "shared"
    # admitted by the drive that recorded them (no bounce through events), and run by the worker
    assert sorted(wenv.effect_messages()) == ["wf-1:000001", "wf-1:000003"]
    assert [n.n for n in wenv.sent_notes] == [1, 2]
    for _ in range(3):  # duplicate drives replay the emits without enqueueing them again
        wenv.engine.drive(eid)
    wenv.worker.run()
    assert len(wenv.effect_messages()) == 2 and len(wenv.sent_notes) == 2
    wenv.clock.advance(3600)
    report = wenv.outbox.scan()
    assert report.admitted == 0 and report.resent == 0
    assert len(wenv.outbox.rows("wf-1")) == 1 and len(wenv.outbox.rows("shared")) == 1
    markers = [d for d in store.query_partition(eid).docs if d.get("kind") == "emit"]
    assert len(markers) == 2 and all(m["due_kind"] is None for m in markers)


def test_emit_survives_a_crash_between_commit_and_admission(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    wenv = WorkflowEnv(store)
    flow = wenv.registry.add_workflow("notify", _notify_flow(wenv))

    def store_down(doc: Any) -> None:
        raise StoreUnavailable("down right after the commit")

    with monkeypatch.context() as m:  # the admission after each commit fails (or its worker died)
        m.setattr(wenv.outbox, "admit_intent", store_down)
        eid, _ = wenv.engine.start(flow, ("bob",), {}, workflow_id="wf-2")
        wenv.worker.run()
    assert wenv.engine.read_exec(eid)["status"] == "completed"
    assert wenv.outbox.get("wf-2:000001") is None
    wenv.clock.advance(OutboxSettings().admit_grace + 1)
    assert wenv.outbox.scan().admitted == 2
    assert wenv.outbox.scan().admitted == 0
    assert sorted(wenv.effect_messages()) == ["wf-2:000001", "wf-2:000003"]


def test_emit_uses_the_configured_admit_grace(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outbox B7: ``wf.emit`` ignored ``durable_outbox_admit_grace`` (it used the class default)."""
    clock = FakeClock()
    dispatcher = InlineDispatcher()
    registry = Registry()
    effects_of(registry).add(EffectDef("note", lambda payload: None, ValueCodec(Email)))
    engine = Engine(store, dispatcher, registry, Settings(outbox_admit_grace=2.5), clock=clock)
    flow = registry.add_workflow("one", lambda name: wf.emit("note", {"to": name, "n": 1}))
    monkeypatch.setattr(engine.outbox, "admit_intent", lambda doc: None)  # admission after commit lost
    eid, _ = engine.start(flow, ("x",), {}, workflow_id="wf-grace")
    LocalWorker(engine, dispatcher).run()
    marker = next(d for d in store.query_partition(eid).docs if d.get("kind") == "emit")
    assert marker["due_at"] == pytest.approx(clock.now() + 2.5, abs=0.01)


def test_emit_validates_the_payload_in_the_workflow(store: Store) -> None:
    wenv = WorkflowEnv(store)

    def bad(name: str) -> str:
        return wf.emit("note", {"to": name, "n": "lots"})

    flow = wenv.registry.add_workflow("bad", bad)
    eid, _ = wenv.engine.start(flow, ("x",), {}, workflow_id="wf-3")
    wenv.worker.run()
    ex = wenv.engine.read_exec(eid)
    assert ex["status"] == "failed" and ex["error"]["type"] == "PayloadValidationError"


# --- helpers ----------------------------------------------------------------------------------------------


class _Real:
    def now(self) -> float:
        return time.time()


def _wait(predicate: Callable[[], object], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.01)
