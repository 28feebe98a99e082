"""What an effect costs in store round trips (issue 11: <= 4 an effect on a busy key). Counted on
the memory store's call counter, so the figures are exact and independent of timing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_durable.engine.outbox import SUCCEEDED, lane_pk, row_id
from celery_durable.engine.outbox.reads import READ_AHEAD
from celery_durable.engine.outbox.runtime import execute
from celery_durable.glue.outbox import AFTER_HEADER, CeleryEffectSender
from celery_durable.stores.memory import MemoryStore
from tests.engine.outbox_env import Env, Glue

N = 200


def busy_key(bulk: bool, n: int = N, on_run: Callable[[Env, int], None] | None = None) -> tuple[float, list[int], Env]:
    """Enqueue ``n`` effects on one key, then run them as a worker draining the key does: one
    message, the rest claimed by the settles. ``on_run(env, i)`` runs inside the i-th handler."""
    store = MemoryStore()
    env = Env(store)
    ran: list[int] = []

    @env.handler("note")
    def note(payload: Any) -> None:
        ran.append(payload)
        if on_run is not None:
            on_run(env, payload)

    definition = env.effects.require("note")
    bodies = [
        env.outbox.effect_body(
            "note", i, key="busy", effect_id=f"e{i}", available_at=None, replay_safe=True, max_attempts=3
        )
        for i in range(n)
    ]
    store.calls.clear()
    if bulk:
        env.outbox.admit_many(bodies)
    else:
        for body in bodies:
            env.outbox.admit(body)
    for ref in env.sender.take():  # one message: the first row; the rest follow the settles
        claim = env.outbox.claim(ref.key, ref.effect_id).claim
        while claim is not None:
            assert execute(env.outbox, claim, definition, env.keeper, claim_next=("note",)).kind == SUCCEEDED
            claim = claim.successor
    return sum(store.calls.values()) / n, ran, env


def test_a_busy_key_costs_about_four_round_trips_an_effect_enqueued_one_by_one() -> None:
    # enqueue: index create + head read + row/head batch; settle + claim of the next row: one
    # batch, and one read (the head and the next READ_AHEAD rows) every READ_AHEAD settles; plus
    # the first claim (2). Before the settles read ahead: 5 (a read every settle)
    per_effect, ran, env = busy_key(bulk=False)
    assert ran == list(range(N))
    assert env.sender.take() == []
    assert per_effect <= 4.0 + 1 / READ_AHEAD + 2 / N, per_effect


def test_a_busy_key_costs_about_two_round_trips_an_effect_enqueued_in_bulk() -> None:
    # enqueue_many: the index creates, then one head read and one batch per 99 rows; the settles
    # as above. Before the settles read ahead: 3.03
    per_effect, ran, env = busy_key(bulk=True)
    assert ran == list(range(N))
    assert env.sender.take() == []
    assert per_effect <= 2.0 + 1 / READ_AHEAD + 0.04, per_effect


def test_a_drain_whose_head_moved_or_whose_read_ahead_row_was_cancelled_keeps_every_promise() -> None:
    # while e3 runs, the drain holds e4.. read ahead; an enqueue moves the head (the next blind
    # settle fails on its etag and reads again) and e6, already read ahead, is cancelled: it
    # must never run, and everything else runs once, in order, without a message
    def meddle(env: Env, i: int) -> None:
        if i == 3:
            env.enqueue("note", 100, key="busy", effect_id="late")
            assert env.outbox.cancel("e6") == 1

    _, ran, env = busy_key(bulk=True, n=30, on_run=meddle)
    assert ran == [i for i in range(30) if i != 6] + [100]
    assert env.sender.take() == []
    assert env.row("busy", "e6")["status"] == "cancelled"
    head = env.outbox.head("busy")
    assert head is not None and head["live"] == [] and head["running"] is None


def test_a_settle_claims_the_rows_read_ahead_without_reading() -> None:
    per_effect, _, env = busy_key(bulk=True, n=2 * READ_AHEAD + 1)
    reads = env.store.calls.get("read_many", 0) + env.store.calls.get("read", 0)
    # the first claim's read, then one read of the head and READ_AHEAD rows every READ_AHEAD settles
    assert reads == 1 + 2 + 1, env.store.calls  # + 1: the last settle reads the head (no successor)


def test_enqueue_many_on_a_head_that_moved_reads_it_once_with_the_rows() -> None:
    store = MemoryStore()
    env = Env(store)
    env.handler("note")(lambda payload: None)

    def bodies(start: int) -> list[dict[str, Any]]:
        return [
            env.outbox.effect_body(
                "note", i, key="k", effect_id=f"e{i}", available_at=None, replay_safe=True, max_attempts=3
            )
            for i in range(start, start + 5)
        ]

    env.outbox.admit_many(bodies(0))  # this process remembers the head it wrote
    assert env.outbox.claim("k", "e0").claim is not None  # a worker moves it
    store.calls.clear()
    env.outbox.admit_many(bodies(5))
    # 5 index creates, the batch on the remembered head (fails), one read of the head with the
    # rows (none exists), the batch again; before: a read of the rows, then one of the head
    assert store.calls == {"create": 5, "batch": 2, "read_many": 1}, store.calls
    head = store.read(lane_pk("k"), "head")
    assert head is not None and [e[1] for e in head["live"]] == [f"e{i}" for i in range(10)]
    assert store.read(lane_pk("k"), row_id("e9")) is not None


def idle_keys(chunk: int, chunks: int = 20, keys: int = 25) -> float:
    """``bench/outbox.py``'s bulk phase on a quiet machine: each ``enqueue_many`` call brings
    ``chunk`` rows to each of ``keys`` keys, and a worker drains every key before the next call
    (one message a key and call: the claim, then the settles)."""
    store = MemoryStore()
    env = Env(store)
    env.handler("note")(lambda payload: None)
    definition = env.effects.require("note")
    store.calls.clear()
    for c in range(chunks):
        env.outbox.admit_many(
            [
                env.outbox.effect_body(
                    "note",
                    i,
                    key=f"k{k}",
                    effect_id=f"e{c}-{k}-{i}",
                    available_at=None,
                    replay_safe=True,
                    max_attempts=3,
                )  # fmt: skip
                for k in range(keys)
                for i in range(chunk)
            ]
        )
        for ref in env.sender.take():
            assert list(ref.after) == [f"e{c}-{ref.key[1:]}-{i}" for i in range(1, chunk)]
            claim = env.outbox.claim(ref.key, ref.effect_id, after=ref.after).claim
            while claim is not None:
                assert execute(env.outbox, claim, definition, env.keeper, claim_next=("note",)).kind == SUCCEEDED
                claim = claim.successor
    return sum(store.calls.values()) / (chunks * keys * chunk)


def test_keys_drained_between_two_bulk_enqueues_cost_about_three_round_trips_an_effect() -> None:
    # per key and call of 4 rows: 4 index creates; the head (read: the one this process wrote
    # last was moved by the worker, and a stale try costs a round trip more) and one batch; the
    # claim, reading the 3 rows its message names with the head, and its batch; 4 settle batches
    # (13 for 4). Before: 4.23 (the remembered head tried every time, a read every settle)
    per_effect = idle_keys(chunk=4)
    assert per_effect <= 3.1, per_effect


def test_a_bulk_enqueue_message_names_the_next_rows_and_its_delivery_reads_them_with_the_claim() -> None:
    glue = Glue()
    try:
        ran: list[int] = []
        glue.durable.effect("rt.note")(lambda payload: ran.append(payload))
        sent: list[tuple[str, list[Any], dict[str, Any]]] = []
        glue.app.send_task = lambda name, args, **options: sent.append((name, args, options))  # type: ignore[method-assign]
        glue.core.sender = CeleryEffectSender(glue.app, glue.outbox.effects)
        specs = [{"type": "rt.note", "payload": i, "key": "k", "effect_id": f"n{i}"} for i in range(4)]
        glue.outbox.enqueue_many(specs)
        assert len(sent) == 1
        _, args, options = sent[0]
        assert args == ["k", "n0"] and options["headers"][AFTER_HEADER] == ["n1", "n2", "n3"]
        glue.task.request.headers = dict(options["headers"])
        glue.store.calls.clear()
        assert glue.outbox.deliver(glue.task, "k", "n0") == "succeeded"
        assert ran == [0, 1, 2, 3]
        # the claim's read brought the next 3 rows: no settle of the drain read (before: the first did)
        assert glue.store.calls == {"read_many": 1, "batch": 5}, glue.store.calls
    finally:
        glue.close()
