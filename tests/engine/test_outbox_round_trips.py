"""What an effect costs in store round trips (issue 11: <= 4 an effect on a busy key). Counted on
the memory store's call counter, so the figures are exact and independent of timing."""

from __future__ import annotations

from typing import Any

from celery_durable.engine.outbox import SUCCEEDED
from celery_durable.engine.outbox.runtime import execute
from celery_durable.stores.memory import MemoryStore

from .outbox_env import Env

N = 200


def busy_key(bulk: bool) -> tuple[float, list[int]]:
    store = MemoryStore()
    env = Env(store)
    ran: list[int] = []

    @env.handler("note")
    def note(payload: Any) -> None:
        ran.append(payload)

    definition = env.effects.require("note")
    bodies = [
        env.outbox.effect_body(
            "note", i, key="busy", effect_id=f"e{i}", available_at=None, replay_safe=True, max_attempts=3
        )
        for i in range(N)
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
    assert env.sender.take() == []
    return sum(store.calls.values()) / N, ran


def test_a_busy_key_costs_five_round_trips_an_effect_enqueued_one_by_one() -> None:
    # enqueue: index create + head read + row/head batch; settle + claim of the next row: next
    # row read + one batch; plus the first claim (2)
    per_effect, ran = busy_key(bulk=False)
    assert ran == list(range(N))
    assert per_effect <= 5.0 + 2 / N, per_effect


def test_a_busy_key_costs_about_three_round_trips_an_effect_enqueued_in_bulk() -> None:
    # enqueue_many: the index creates, then one head read and one batch per 99 rows
    per_effect, ran = busy_key(bulk=True)
    assert ran == list(range(N))
    assert per_effect <= 3.1, per_effect
