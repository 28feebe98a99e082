"""Adversarial tests of the effect outbox's promises (README "Effect outbox" / "Limitations",
docs/architecture.md §9), written against the settle-with-a-guessed-successor change.

Each test asserts a promised behaviour and fails on the code it was written against; its
docstring names the promise and how it breaks. Deterministic: a fake clock, the in-process
harness of ``tests/engine/outbox_env.py`` and store calls driven (or wrapped) by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from celery_durable.engine.outbox import EffectRef
from celery_durable.errors import IdempotencyConflict, LaneFull
from celery_durable.stores import Store
from celery_durable.stores.base import Op
from celery_durable.stores.memory import MemoryStore
from celery_durable.stores.sqlite.store import SqliteStore
from tests.engine.outbox_env import Env, Glue


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(str(tmp_path / "outbox.db"))
    yield s
    s.close()


@pytest.fixture
def glue() -> Iterator[Glue]:
    g = Glue(outbox_max_lane_backlog=1)
    if not hasattr(g.task, "request"):  # the glue reads message headers off the task's request
        g.task.request = SimpleNamespace(headers={}, timelimit=None)  # type: ignore[attr-defined]
    yield g
    g.close()


def make_env(store: Store, **settings: Any) -> tuple[Env, list[Any]]:
    env = Env(store, **settings)
    ran: list[Any] = []

    @env.handler("note", interruptible=False)
    def note(payload: Any) -> None:
        ran.append(payload)

    return env, ran


# === the key of a cancelled, still running handler ================================================


def test_prune_of_a_cancelled_running_row_frees_its_key_while_the_handler_runs(store: Store) -> None:
    """Promise (Cancel; architecture §9 "Ordering"): "cancel() returns at once, but the later
    effects of the key start only when the handler has stopped (or its lease expired, if its
    worker died): a key never runs two handlers at once."

    Break: a cancel gives the *running* row ``due_kind=outbox_prune`` at ``now + retention`` while
    its handler still runs (an ``interruptible=False`` handler stops at its next check). The
    heartbeat keeps its lease alive, yet once the retention passes the scan's prune deletes the
    row (and its index); the next lane scan finds ``running`` pointing at a missing row, "repairs"
    the head and wakes B, which is claimed while A's handler still runs under a live lease."""
    env, _ = make_env(store, retention=5.0, cancel_poll=1.0)
    env.enqueue("note", "A", key="k", effect_id="A")
    env.enqueue("note", "B", key="k", effect_id="B")
    env.sender.take()
    a = env.outbox.claim("k", "A").claim
    assert a is not None
    assert env.outbox.cancel("A") == 1
    # A's handler keeps running (not interruptible); its heartbeat renews the lease every second
    b_claimed_at: float | None = None
    lease_expires = 0.0
    for _ in range(12):
        env.clock.advance(1.0)
        env.outbox.renew(a)
        lease_expires = max(lease_expires, float((a.row.get("lease") or {}).get("expires") or 0.0))
        env.outbox.scan()
        for ref in env.sender.take():
            if env.outbox.claim(ref.key, ref.effect_id).claim is not None and ref.effect_id == "B":
                b_claimed_at = env.clock.now()
        if b_claimed_at is not None:
            break
    assert b_claimed_at is None or b_claimed_at >= lease_expires, (
        f"B was claimed at t+{b_claimed_at - 1_000_000.0:.0f}s while cancelled A's handler still runs "
        f"under a lease valid until t+{lease_expires - 1_000_000.0:.0f}s (A's row: "
        f"{store.read('fxq:k', 'fx:A')})"
    )


# === first writer wins on effect ids ==============================================================


def test_a_transactional_enqueue_waiting_for_room_loses_its_id_to_a_later_request(glue: Glue) -> None:
    """Promise (Enqueue): idempotent by ``effect_id``; "the same id with another type, key or
    payload raises IdempotencyConflict (the first enqueue stands)"; a transactional enqueue
    "whose lane filled up in between waits, and the lane keeps the next free slot for it".

    Break: the transactional enqueue of X commits with its documents and returns
    ``Admitted(created=True)``, but its lane filled up between the check and the commit, so it
    waits -- and its admission released the id's index. A later enqueue of the same id with
    another key is then *not* a conflict: it gets ``created=True`` and runs, and when the lane
    has room the first (committed) request is dropped as the conflict."""
    ran: list[Any] = []

    @glue.durable.effect("adv.mail")
    def mail(payload: dict[str, Any]) -> None:
        ran.append(payload)

    check = glue.core.check_admissible

    def check_then_fill(effect: Any) -> None:
        check(effect)
        # another producer fills the lane between the check and the commit
        glue.outbox.enqueue("adv.mail", {"n": 0}, key="k1", effect_id="filler")

    glue.core.check_admissible = check_then_fill  # type: ignore[method-assign]
    first = glue.outbox.enqueue(
        "adv.mail", {"n": 1}, key="k1", effect_id="X", with_docs=[{"pk": "order-1", "id": "order"}]
    )
    glue.core.check_admissible = check  # type: ignore[method-assign]
    assert (first.effect_id, first.created) == ("X", True)
    assert glue.store.read("order-1", "order") is not None  # the documents committed
    second: Any
    try:
        second = glue.outbox.enqueue("adv.mail", {"n": 2}, key="k2", effect_id="X")
    except IdempotencyConflict as exc:
        second = exc
    for _ in range(4):
        glue.pass_time(15.0)
    info = glue.outbox.get("X")
    assert isinstance(second, IdempotencyConflict) and {"n": 1} in ran and {"n": 2} not in ran, (
        f"the later request got {second!r}; ran {ran}; X is now key {info and info.key!r}, "
        f"status {info and info.status!r}; the first (committed) request's intent: "
        f"{glue.store.read('order-1', 'fxi:X')}"
    )


# === an intent admitted late: its fresh index looks abandoned at once =============================


def test_an_old_intent_admitted_while_another_request_fails_leaves_a_row_no_get_or_cancel_finds(
    store: Store,
) -> None:
    """Promise (Enqueue/Cancel; sim invariant 5 "nothing admitted is lost: get/cancel find live
    rows"): "Cancel pending or running effects by id"; an effect id taken by an enqueue stays
    reserved for that request ("another request with the same key may take it after
    outbox_admit_grace + lease_ttl" -- of an *abandoned* index).

    Break (found by ``bench/outbox_sim.py --seed 701495 --faults before,after,preempt``): an
    intent that waited for room in a full lane is admitted later; its admission writes the id's
    index with ``created_at`` = the *effect's* creation time, so the index looks abandoned the
    moment it is written. Another request for the same id (another payload) takes the index over,
    fails with LaneFull (the slot is kept for the intent) and deletes the index it took. The
    intent's admission goes on and writes its row: a live row without an index. ``get`` returns
    None, ``cancel(id)`` returns 0 and the effect runs anyway."""
    env, ran = make_env(store, max_lane_backlog=2, admit_grace=10.0, lease_ttl=10.0)
    env.enqueue("note", "F1", key="k", effect_id="F1")
    env.enqueue("note", "F2", key="k", effect_id="F2")
    env.sender.take()
    # a transactional enqueue of X committed with its order; its lane is full: it waits
    body = env.outbox.effect_body(
        "note", "X-first", key="k", effect_id="X", available_at=None, replay_safe=True, max_attempts=3
    )
    intent = env.outbox.intent("order-1", body)
    store.batch("order-1", [Op.create({"pk": "order-1", "id": "order"}), Op.create(intent)])
    with pytest.raises(LaneFull):
        env.outbox.admit_intent(store.read("order-1", intent["id"]) or {})
    # time passes; F1 runs, so the lane has one slot -- kept for the waiting intent
    env.clock.advance(30.0)
    env.deliver(EffectRef("k", "F1", "note"))
    env.sender.take()
    create = store.create
    interfered: list[Any] = []

    def create_then_race(doc: Any) -> Any:
        etag = create(doc)
        if not interfered and doc.get("pk") == "fxid:X":
            interfered.append("racing")
            # a second request for X (another payload) arrives between the index and the row
            try:
                interfered.append(env.enqueue("note", "X-second", key="k", effect_id="X"))
            except Exception as exc:  # noqa: BLE001 - what it raises is part of the report
                interfered.append(exc)
        return etag

    store.create = create_then_race  # type: ignore[method-assign]
    env.outbox.scan()  # beat admits the waiting intent
    store.create = create  # type: ignore[method-assign]
    row = store.read("fxq:k", "fx:X")
    assert row is not None and row.get("status") == "pending", (row, interfered)  # the intent's row is live
    found = env.outbox.get("X")
    cancelled = env.outbox.cancel("X")
    for _ in range(3):  # beat's scans and the workers go on
        env.clock.advance(env.settings.queue_timeout + 1)
        env.outbox.scan()
        env.drain()
    assert found is not None and cancelled == 1 and "X-first" not in ran, (
        f"the second request got {interfered!r}; get('X') -> {found}; cancel('X') -> {cancelled}; "
        f"ran {ran}; index {store.read('fxid:X', 'fx')}"
    )
