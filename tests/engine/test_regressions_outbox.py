"""Regression tests for the outbox bugs of issue 11 (reproducers in ../shared/repro/outbox), each
failing on the code before its fix: B1, B3-B6 and the strict order promise D1-D5."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_durable.engine.outbox import CANCELLED, FAILED, PENDING, RUNNING, SUCCEEDED, lane_pk, row_id
from celery_durable.engine.outbox.model import HEAD_ID, index_pk
from celery_durable.engine.outbox.runtime import EffectDef, EffectLeaseLost, effect_context, execute, jittered
from celery_durable.errors import IdempotencyConflict, LaneFull, StoreUnavailable
from celery_durable.retry import RetryPolicy
from celery_durable.stores import Store
from celery_durable.stores.base import Op
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.sqlite.store import SqliteStore
from tests.engine.outbox_env import Env


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "outbox.db"))
    yield s
    s.close()


def make_env(store: Store, **settings: Any) -> Env:
    env = Env(store, **settings)

    @env.handler("note")
    def note(payload: Any) -> None:
        pass

    return env


def intent_in(env: Env, pk: str, effect_id: str, key: str, payload: Any = 1) -> dict[str, Any]:
    body = env.outbox.effect_body(
        "note", payload, key=key, effect_id=effect_id, available_at=None, replay_safe=True, max_attempts=3
    )
    intent = env.outbox.intent(pk, body)
    env.store.batch(pk, [Op.create({"pk": pk, "id": f"order-{effect_id}"}), Op.create(intent)])
    return intent


# --- B1: LaneFull never aborts a scan; a repeat into a full lane is created=False -----------------


def test_b1_an_intent_for_a_full_lane_does_not_stop_the_scan(store: Store) -> None:
    env = make_env(store, max_lane_backlog=2, admit_grace=5.0)
    env.enqueue("note", 1, key="full", effect_id="f1")
    env.enqueue("note", 2, key="full", effect_id="f2")
    env.enqueue("note", 3, key="other", effect_id="x1")
    intent_in(env, "orders", "f3", "full")
    env.sender.take()  # the first rows' messages are lost
    env.clock.advance(120)
    report = env.outbox.scan()
    assert report.deferred == 1 and report.errors == 0
    assert {r.effect_id for r in env.sender.take()} == {"f1", "x1"}  # the other lanes were served
    # the intent waits, due later, and gets in once the lane has room
    env.outbox.cancel("f1")
    env.clock.advance(60)
    env.outbox.scan()
    assert env.row("full", "f3")["status"] == PENDING


def test_b1_a_repeat_into_a_full_lane_is_not_created(store: Store) -> None:
    env = make_env(store, max_lane_backlog=2)
    env.enqueue("note", 1, key="k", effect_id="a")
    env.enqueue("note", 2, key="k", effect_id="b")
    assert env.enqueue("note", 1, key="k", effect_id="a").created is False
    with pytest.raises(LaneFull):
        env.enqueue("note", 3, key="k", effect_id="c")


# --- B3 / D4: one id is one request ------------------------------------------------------------


def test_b3_one_id_racing_into_two_keys_is_admitted_once(store: Store) -> None:
    env = make_env(store)
    ran: list[Any] = []
    env.effects.defs.pop("note")

    @env.handler("note", replay_safe=False)
    def note(payload: Any) -> None:
        ran.append(payload)

    barrier = threading.Barrier(2)
    original = store.create

    def slow_create(doc: dict[str, Any]) -> str | None:
        if doc.get("type") == "effect_index":
            barrier.wait(timeout=5)  # both enqueuers write the index at the same moment
        return original(doc)

    store.create = slow_create  # type: ignore[method-assign]
    results: dict[str, Any] = {}

    def enqueue(key: str) -> None:
        try:
            results[key] = env.enqueue("note", key, key=key, effect_id="dup")
        except IdempotencyConflict as exc:
            results[key] = exc

    threads = [threading.Thread(target=enqueue, args=(k,)) for k in ("K1", "K2")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store.create = original  # type: ignore[method-assign]
    created = [r for r in results.values() if not isinstance(r, Exception) and r.created]
    assert len(created) == 1
    assert sum(isinstance(r, IdempotencyConflict) for r in results.values()) == 1
    env.drain()
    assert len(ran) == 1
    lanes = [k for k in ("K1", "K2") if store.read(lane_pk(k), row_id("dup")) is not None]
    assert len(lanes) == 1


def test_d4_same_id_other_payload_or_type_conflicts(store: Store) -> None:
    env = make_env(store)

    @env.handler("other")
    def other(payload: Any) -> None:
        pass

    assert env.enqueue("note", {"to": "ann", "amount": 10}, key="k", effect_id="x").created
    assert env.enqueue("note", {"amount": 10, "to": "ann"}, key="k", effect_id="x").created is False
    with pytest.raises(IdempotencyConflict):
        env.enqueue("note", {"to": "ann", "amount": 11}, key="k", effect_id="x")
    with pytest.raises(IdempotencyConflict):
        env.enqueue("other", {"to": "ann", "amount": 10}, key="k", effect_id="x")
    with pytest.raises(IdempotencyConflict):
        env.enqueue("note", {"to": "ann", "amount": 10}, key="k2", effect_id="x")
    assert env.row("k", "x")["payload"] == {"to": "ann", "amount": 10}


# --- B4: lane heads go with their last row ------------------------------------------------------


def test_b4_heads_of_settled_lanes_are_deleted(store: Store) -> None:
    env = make_env(store, retention=60.0)
    for i in range(20):
        env.enqueue("note", i, effect_id=f"u{i}")  # unkeyed: one lane each
    env.enqueue("note", 1, key="c", effect_id="c1")
    env.outbox.cancel("c1")
    env.drain()
    env.clock.advance(120)
    env.outbox.scan()
    for i in range(20):
        assert store.read(lane_pk(f"u{i}"), HEAD_ID) is None
        assert store.read(lane_pk(f"u{i}"), row_id(f"u{i}")) is None
        assert store.read(index_pk(f"u{i}"), "fx") is None
    assert store.read(lane_pk("c"), HEAD_ID) is None


# --- B5: the head never outgrows the store -------------------------------------------------------


def test_b5_head_stays_within_the_store_limit(tmp_path: Path) -> None:
    store = MemoryStore()
    store.max_doc_bytes = 4000
    env = make_env(store)
    admitted = 0
    with pytest.raises(LaneFull):
        for i in range(1000):
            env.enqueue("note", i, key="k", effect_id=f"effect-with-a-long-id-{i:04d}-" + "x" * 40)
            admitted += 1
    head = store.read(lane_pk("k"), HEAD_ID)
    assert head is not None and 10 < admitted < 100
    assert len(json.dumps(head)) <= store.max_doc_bytes // 2 + 200
    # a claim (the head gains the running id) still fits, and the lane drains
    env.drain()
    assert all(r["status"] == SUCCEEDED for r in env.outbox.rows("k"))


# --- B6: a prune racing a re-enqueue of the same id -----------------------------------------------


def test_b6_prune_racing_a_reenqueue_keeps_the_live_rows_index(store: Store) -> None:
    env = make_env(store, retention=60.0)
    env.enqueue("note", 1, key="k", effect_id="e")
    env.drain()
    env.clock.advance(120)
    original = store.delete
    fired: list[Any] = []

    def delete(pk: str, doc_id: str, if_match: str | None = None) -> bool:
        done = original(pk, doc_id, if_match=if_match)
        if not fired and doc_id in ("fx", "fx:e"):  # between the prune's two deletes
            fired.append(env.enqueue("note", 1, key="k", effect_id="e"))
        return done

    store.delete = delete  # type: ignore[method-assign]
    env.outbox.scan()
    store.delete = original  # type: ignore[method-assign]
    assert fired and fired[0].created
    assert env.outbox.get("e") is not None and env.outbox.get("e")["status"] == PENDING  # type: ignore[index]
    assert env.outbox.cancel("e") == 1
    assert env.row("k", "e")["status"] == CANCELLED


def test_b6_a_repeat_within_retention_is_not_run_again(store: Store) -> None:
    env = make_env(store, retention=60.0)
    env.enqueue("note", 1, key="k", effect_id="e")
    env.drain()
    env.clock.advance(30)
    assert env.enqueue("note", 1, key="k", effect_id="e").created is False
    env.clock.advance(60)  # retention over: a repeat is a new request
    assert env.enqueue("note", 1, key="k", effect_id="e").created is True


# --- D1: a cancelled running handler holds its key until it stopped -------------------------------


def test_d1_cancel_of_a_running_row_keeps_the_key_until_the_handler_stops(store: Store) -> None:
    env = make_env(store)
    env.enqueue("note", 1, key="k", effect_id="A")
    env.enqueue("note", 2, key="k", effect_id="B")
    env.sender.take()
    claim = env.outbox.claim("k", "A").claim
    assert claim is not None
    assert env.outbox.cancel("A") == 1  # returns at once
    assert env.row("k", "A")["status"] == CANCELLED
    assert env.sender.take() == []  # B is not woken while A's handler may still run
    assert env.outbox.claim("k", "B").reason == "blocked"
    env.outbox.scan()  # the lease is live: the scan waits too
    assert env.outbox.claim("k", "B").reason == "blocked"
    assert env.outbox.renew(claim) == "cancelled"
    assert env.outbox.settle(claim, SUCCEEDED) == CANCELLED  # the handler stopped: key freed
    assert [r.effect_id for r in env.sender.take()] == ["B"]
    assert env.row("k", "A")["status"] == CANCELLED  # never downgraded
    assert env.outbox.claim("k", "B").claim is not None


def test_d1_a_dead_cancelled_handler_frees_its_key_when_its_lease_expires(store: Store) -> None:
    env = make_env(store)
    env.enqueue("note", 1, key="k", effect_id="A")
    env.enqueue("note", 2, key="k", effect_id="B")
    env.sender.take()
    assert env.outbox.claim("k", "A").claim is not None
    env.outbox.cancel("A")
    env.clock.advance(env.settings.lease_ttl + 1)  # its worker died: no renew, no settle
    report = env.outbox.scan()
    assert report.repaired == 1
    assert [r.effect_id for r in env.sender.take()] == ["B"]


# --- D2: order by admission sequence; a retrying row is never overtaken --------------------------


def test_d2_a_late_admitted_intent_never_overtakes_a_retrying_row(store: Store) -> None:
    env = make_env(store, admit_grace=5.0)
    calls: list[str] = []
    env.effects.defs.pop("note")

    @env.handler("note", policy=RetryPolicy(maximum_attempts=3))
    def note(payload: Any) -> None:
        calls.append(payload)
        if payload == "B" and calls.count("B") == 1:
            raise RuntimeError("transient")

    # A's intent is committed first (earlier created_at) but its enqueuer dies before admission
    intent_in(env, "orders", "A", "k", payload="A")
    env.clock.advance(0.5)
    env.enqueue("note", "B", key="k", effect_id="B")
    for ref in env.sender.take():
        env.deliver(ref)  # B fails once and waits for its retry
    env.clock.advance(10)
    env.outbox.scan()  # admits A: after B, by its lane sequence
    assert [r["effect_id"] for r in env.outbox.rows("k")] == ["B", "A"]
    env.drain()
    assert calls == ["B", "B", "A"]


# --- D3: a lost lease stops the handler ----------------------------------------------------------


def test_d3_a_renew_that_finds_the_lease_lost_stops_the_handler(store: Store) -> None:
    env = make_env(store)
    started, stopped = threading.Event(), threading.Event()

    def slow(payload: Any) -> None:
        started.set()
        try:
            while True:
                pass
        finally:
            stopped.set()

    env.effects.add(EffectDef("slow", slow, env.effects.require("note").codec))
    body = env.outbox.effect_body(
        "slow", 1, key="k", effect_id="s", available_at=None, replay_safe=True, max_attempts=3
    )
    env.outbox.admit(body)
    claim = env.outbox.claim("k", "s").claim
    assert claim is not None
    outcome: list[Any] = []
    t = threading.Thread(
        target=lambda: outcome.append(execute(env.outbox, claim, env.effects.require("slow"), env.keeper))
    )
    t.start()
    assert started.wait(5)
    # another worker presumed this one dead and took the row over
    row = env.row("k", "s")
    store.replace(
        {k: v for k, v in row.items() if k != "_etag"} | {"lease": {"owner": "other", "expires": 1e12}}, row["_etag"]
    )
    assert stopped.wait(5), "the handler was not stopped"
    t.join(5)
    assert outcome and outcome[0].kind == "lease-lost"
    assert env.row("k", "s")["lease"]["owner"] == "other"  # nothing was written over the new owner
    assert EffectLeaseLost is not None


# --- D5: cancel reaches intents not yet admitted ----------------------------------------------------


def test_d5_cancel_by_id_and_by_key_reach_unadmitted_intents(store: Store) -> None:
    env = make_env(store)
    intent_in(env, "orders", "third", "k")
    intent_in(env, "orders", "k8-1", "k8")
    assert env.outbox.cancel("third") == 1
    assert env.outbox.cancel(key="k8") == 1
    env.clock.advance(60)
    env.outbox.scan()
    env.drain()
    assert env.row("k", "third")["status"] == CANCELLED
    assert env.row("k8", "k8-1")["status"] == CANCELLED
    assert env.ran == []


# --- from the seed: will_retry, the pre-run check, jitter -----------------------------------------


def test_context_says_whether_a_failure_will_be_retried(store: Store) -> None:
    env = make_env(store)
    seen: list[tuple[int, int, bool]] = []

    @env.handler("flaky", policy=RetryPolicy(maximum_attempts=3))
    def flaky(payload: Any) -> None:
        ctx = effect_context()
        seen.append((ctx.attempt, ctx.max_attempts, ctx.will_retry))
        raise RuntimeError("down")

    body = env.outbox.effect_body(
        "flaky", 1, key="k", effect_id="f", available_at=None, replay_safe=True, max_attempts=3
    )
    env.outbox.admit(body)
    env.drain()
    assert seen == [(1, 3, True), (2, 3, True), (3, 3, False)]
    assert env.row("k", "f")["status"] == FAILED


def test_a_store_error_in_the_prerun_check_requeues_without_running(store: Store) -> None:
    env = make_env(store)
    ran: list[Any] = []
    env.effects.defs.pop("note")

    @env.handler("note")
    def note(payload: Any) -> None:
        ran.append(payload)

    env.enqueue("note", 1, key="k", effect_id="e")
    claim = env.outbox.claim("k", "e").claim
    assert claim is not None
    env.clock.advance(1.0)  # the worker stalled between its claim and the run: it re-checks
    original = store.read
    calls = {"n": 0}

    def failing_read(pk: str, doc_id: str) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreUnavailable("the store is down")
        return original(pk, doc_id)

    store.read = failing_read  # type: ignore[method-assign]
    outcome = execute(env.outbox, claim, env.effects.require("note"), env.keeper)
    store.read = original  # type: ignore[method-assign]
    assert ran == []
    assert outcome.requeued and env.row("k", "e")["status"] == PENDING


def test_retry_delays_are_jittered_within_half_to_full() -> None:
    values = {round(jittered(4.0), 6) for _ in range(200)}
    assert len(values) > 50
    assert all(2.0 <= v <= 4.0 for v in values)
    assert jittered(0.0) == 0.0


def test_running_row_status_is_running_after_claim(store: Store) -> None:
    env = make_env(store)
    env.enqueue("note", 1, key="k", effect_id="e")
    assert env.outbox.claim("k", "e").claim is not None
    assert env.row("k", "e")["status"] == RUNNING and env.row("k", "e")["seq"] == 1


# --- B1/r10: the transactional enqueue refuses before the caller's documents commit -------------


def test_enqueue_with_docs_refuses_a_full_lane_or_taken_id_before_committing() -> None:
    from celery import Celery

    from celery_durable import Durable

    app = Celery("reg-outbox-tx", set_as_current=False)
    app.conf.durable_outbox_max_lane_backlog = 1
    durable = Durable(app, store="memory://")

    @durable.effect("reg.tx.note")
    def note(payload: dict[str, Any]) -> None:
        pass

    outbox, store = durable.outbox, durable.engine.store
    assert outbox.enqueue("reg.tx.note", {"n": 1}, key="k", effect_id="first").created
    with pytest.raises(LaneFull):
        outbox.enqueue("reg.tx.note", {"n": 2}, key="k", effect_id="second", with_docs=[{"pk": "orders", "id": "o2"}])
    assert store.read("orders", "o2") is None  # nothing of the caller's was committed
    with pytest.raises(IdempotencyConflict):
        outbox.enqueue("reg.tx.note", {"n": 3}, key="k", effect_id="first", with_docs=[{"pk": "orders", "id": "o3"}])
    assert store.read("orders", "o3") is None
    # a repeat of the same request is fine even though the lane is full
    again = outbox.enqueue(
        "reg.tx.note", {"n": 1}, key="k", effect_id="first", with_docs=[{"pk": "orders", "id": "o1"}]
    )
    assert again.created is False and store.read("orders", "o1") is not None
    durable.shutdown()
