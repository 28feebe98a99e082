"""Adversarial tests of the outbox's read-ahead / adopt change (issue 11; README "Effect outbox",
docs/architecture.md §9): settles that read ahead, the ``durable_fx_after`` hint and the
``durable_fx_adopt`` retry of a claim whose outcome is unknown.

Each test asserts a promised behaviour and failed on the code it was written against; its
docstring names the promise and how it broke. Deterministic: the in-process glue of
``tests/engine/outbox_env.py`` and store calls wrapped by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.engine.outbox import RUNNING, SUCCEEDED, ClaimUnknown, EffectRef, lane_pk, row_id
from celery_durable.errors import StoreUnavailable
from celery_durable.glue.outbox import ADOPT_HEADER
from celery_durable.stores.memory import MemoryStore
from tests.engine.outbox_env import Env, Glue, Retry


@pytest.fixture
def glue() -> Iterator[Glue]:
    g = Glue()
    yield g
    g.close()


def lose_next_claim(store: MemoryStore, apply: bool) -> None:
    """The next claim batch applies (or not), its answer is lost and the read-back fails too."""
    batch, read_many = store.batch, store.read_many
    state = {"batch": False, "read": False}

    def lost_batch(pk: str, ops: Any) -> Any:
        if not state["batch"] and any((op.doc or {}).get("status") == RUNNING for op in ops):
            state["batch"] = True
            if apply:
                batch(pk, ops)
            raise StoreUnavailable("injected: the claim's answer was lost")
        return batch(pk, ops)

    def failing_read(pk: str, ids: Any) -> Any:
        if state["batch"] and not state["read"]:
            state["read"] = True
            raise StoreUnavailable("injected: the read-back failed")
        return read_many(pk, ids)

    store.batch = lost_batch  # type: ignore[method-assign]
    store.read_many = failing_read  # type: ignore[method-assign]


def lose_next_takeover(store: MemoryStore, apply: bool) -> None:
    """The next lease write (the adopting retry's take-over) applies (or not), then its answer is lost."""
    replace = store.replace
    state = {"done": False}

    def lost_replace(doc: Any, if_match: Any = None) -> Any:
        if not state["done"] and doc.get("status") == RUNNING:
            state["done"] = True
            if apply:
                replace(doc, if_match)
            raise StoreUnavailable("injected: the take-over's answer was lost")
        return replace(doc, if_match)

    store.replace = lost_replace  # type: ignore[method-assign]


@pytest.mark.parametrize("takeover_applied", [True, False])
def test_a_second_unknown_outcome_in_the_adopting_retry_still_runs_the_effect_once(
    glue: Glue, takeover_applied: bool
) -> None:
    """Promise (``ClaimUnknown``): a claim that applied though its answer was lost is taken over by
    the retry and run once, instead of a process-bound effect being failed unrun at lease expiry.
    Broke: when the retry's own take-over write also lost its answer, the next retry carried only
    the retry's owner; the row's lease names the first claim's owner (take-over not applied) or
    the retry's (applied) -- one of the two never matched, the row answered "duplicate" and sat
    until its lease expired."""
    ran: list[Any] = []
    glue.durable.effect("adv.charge", replay_safe=False)(ran.append)
    glue.outbox.enqueue("adv.charge", {"n": 1}, key="k", effect_id="c1")
    (ref,) = glue.sender.take()
    lose_next_claim(glue.store, apply=True)
    with pytest.raises(Retry):
        glue.outbox.deliver(glue.task, ref.key, ref.effect_id)
    glue.task.request.headers = dict(glue.task.retried_with.get("headers") or {})
    lose_next_takeover(glue.store, apply=takeover_applied)
    with pytest.raises(Retry):  # the retry: its take-over's outcome is unknown as well
        glue.outbox.deliver(glue.task, ref.key, ref.effect_id)
    assert ran == []
    glue.task.request.headers = dict(glue.task.retried_with.get("headers") or {})
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == SUCCEEDED
    info = glue.outbox.get("c1")
    assert info is not None and (info.status, info.attempt, ran) == (SUCCEEDED, 1, [{"n": 1}])
    assert glue.task.request.headers[ADOPT_HEADER]


def test_an_adopt_header_of_an_older_retry_cannot_take_over_a_newer_take_over(glue: Glue) -> None:
    """Process-bound effects never run twice: a duplicate of the first retry (naming the first
    claim's owner) arriving after the second retry took the claim over answers "duplicate"."""
    ran: list[Any] = []
    glue.durable.effect("adv.once", replay_safe=False)(ran.append)
    glue.outbox.enqueue("adv.once", None, key="k", effect_id="o1")
    glue.sender.take()
    core = glue.core
    lose_next_claim(glue.store, apply=True)
    with pytest.raises(ClaimUnknown) as first:
        core.claim("k", "o1")
    lose_next_takeover(glue.store, apply=True)
    with pytest.raises(ClaimUnknown):
        core.claim("k", "o1", adopt=(first.value.owner, first.value.attempt))
    row = core.get("o1")
    assert row is not None and row["lease"]["owner"] != first.value.owner  # the take-over applied
    # the duplicate of the first retry: the lease is the (dead) retry's now, not the first claim's
    dup = core.claim("k", "o1", adopt=(first.value.owner, first.value.attempt))
    assert dup.claim is None and dup.reason == "duplicate"


# --- stale read-ahead rows: the blind settle's etags must refuse each of them ------------------


def engine_with_rows(n: int, key: str = "k") -> tuple[Env, list[EffectRef]]:
    env = Env(MemoryStore(), retention=1.0)
    bodies = [
        env.outbox.effect_body(
            "adv.safe", {"n": i}, key=key, effect_id=f"r{i}", available_at=None, replay_safe=True, max_attempts=3
        )
        for i in range(n)
    ]
    env.outbox.admit_many(bodies)
    return env, env.sender.take()


@pytest.mark.parametrize("change", ["cancelled", "cancelled_and_reenqueued", "claimed_by_scan"])
def test_a_settle_never_claims_a_read_ahead_row_that_changed_after_it_was_read(change: str) -> None:
    """Per-key order, nothing run twice: the first claim reads r1..r3 ahead (``after`` hint); r1
    then changes (cancelled; cancelled, pruned and enqueued again with its id at the lane's end;
    or the claim's lease lapses and the scan + another worker take over). The settle of r0, tried
    blind with the rows read ahead, must claim only what is first live now."""
    env, (ref,) = engine_with_rows(4)
    assert ref.after == ("r1", "r2", "r3")
    eng = env.outbox
    first = eng.claim("k", "r0", after=ref.after).claim
    assert first is not None and set(first.ahead) == {"r1", "r2", "r3"}
    if change == "claimed_by_scan":
        env.clock.advance(env.settings.lease_ttl + 1)
        eng.scan()  # r0's lease lapsed: requeued (replay-safe) and claimed again elsewhere
        other = eng.claim("k", "r0")
        assert other.claim is not None
        assert eng.settle(first, SUCCEEDED, claim_next=["adv.safe"]) == "lease-lost"
        assert first.successor is None
        return
    assert eng.cancel("r1") == 1
    if change == "cancelled_and_reenqueued":
        env.clock.advance(env.settings.retention + 1)
        eng.scan()  # prunes r1 (cancelled, retention over)
        assert env.store.read(lane_pk("k"), row_id("r1")) is None
        body = eng.effect_body(
            "adv.safe", {"n": 1}, key="k", effect_id="r1", available_at=None, replay_safe=True, max_attempts=3
        )
        assert eng.admit(body).created
    assert eng.settle(first, SUCCEEDED, claim_next=["adv.safe"]) == SUCCEEDED
    nxt = first.successor
    assert nxt is not None and nxt.effect_id == "r2"  # not r1 (cancelled, or re-enqueued last)
    head = eng.head("k")
    assert head is not None and head["running"] == "r2"
    assert [e[1] for e in head["live"]][0] == "r2"


def test_a_forged_after_hint_of_another_key_or_out_of_order_is_only_a_hint() -> None:
    """Rows of another key named in ``after``, and this key's rows out of order: the drain still
    runs the key's rows in admit order, each once."""
    env, (ref_a,) = engine_with_rows(4, key="a")
    bodies = [
        env.outbox.effect_body(
            "adv.safe", {"n": i}, key="b", effect_id=f"b{i}", available_at=None, replay_safe=True, max_attempts=3
        )
        for i in range(2)
    ]
    env.outbox.admit_many(bodies)
    env.sender.take()
    eng = env.outbox
    claim = eng.claim("a", "r0", after=["b1", "r3", "b0", "r2", "r0", "r1"]).claim
    order = []
    while claim is not None:
        order.append(claim.effect_id)
        assert eng.settle(claim, SUCCEEDED, claim_next=["adv.safe"]) == SUCCEEDED
        claim = claim.successor
    assert order == ["r0", "r1", "r2", "r3"]
    assert [eng.get(f"b{i}")["status"] for i in range(2)] == ["pending", "pending"]  # type: ignore[index]


@pytest.mark.parametrize("garbled", [["w1", "zz"], ["w1"], [None, 1], [["w1", 7], 1], "w1", {"owner": "w1"}])
def test_a_garbled_adopt_header_is_ignored_and_the_row_runs(glue: Glue, garbled: Any) -> None:
    """A forged or garbled ``durable_fx_adopt`` header is a hint like ``durable_fx_after``: the
    delivery claims and runs the row as usual. Broke: ``["w1", "zz"]`` raised ValueError out of the
    delivery (the task failed; the row waited for the scan's resend)."""
    ran: list[Any] = []
    glue.durable.effect("adv.note")(ran.append)
    glue.outbox.enqueue("adv.note", {"n": 1}, key="k", effect_id="g1")
    (ref,) = glue.sender.take()
    glue.task.request.headers = {ADOPT_HEADER: garbled}
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == SUCCEEDED
    assert ran == [{"n": 1}]
