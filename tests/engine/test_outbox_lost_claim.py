"""A claim whose answer was lost and whose read-back failed too (the store down for both), or
did not show it (the claim may still land): the delivery must not run the handler blind, and
the retry of that delivery takes the claim over if it applied -- a process-bound effect runs
once instead of being failed unrun when the lease expires; a duplicate of the retry cannot take
it over as well."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_durable.engine.outbox import RUNNING, SUCCEEDED, ClaimUnknown
from celery_durable.errors import StoreUnavailable
from celery_durable.glue.outbox import ADOPT_HEADER, ADOPT_SEAL_HEADER
from celery_durable.stores.memory import MemoryStore
from tests.engine.outbox_env import Glue, Retry


def lose_claim_and_read_back(store: MemoryStore, apply: bool) -> None:
    """The next claim batch applies (or not), then its answer is lost, and the read that follows
    fails too."""
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


@pytest.fixture
def glue() -> Iterator[Glue]:
    g = Glue()
    yield g
    g.close()


@pytest.mark.parametrize("replay_safe", [False, True])
@pytest.mark.parametrize("applied", [True, False])
def test_the_retry_of_a_claim_with_an_unknown_outcome_runs_the_effect_once(
    glue: Glue, replay_safe: bool, applied: bool
) -> None:
    ran: list[Any] = []
    glue.durable.effect("lost.charge", replay_safe=replay_safe)(ran.append)
    glue.outbox.enqueue("lost.charge", {"n": 1}, key="k", effect_id="c1")
    (ref,) = glue.sender.take()
    lose_claim_and_read_back(glue.store, apply=applied)
    with pytest.raises(Retry):
        glue.outbox.deliver(glue.task, ref.key, ref.effect_id)
    assert ran == []  # never run blind
    headers = dict(glue.task.retried_with.get("headers") or {})
    glue.task.request.headers = headers
    # the retry, and a duplicate of it (the broker may deliver a message twice)
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == SUCCEEDED
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == "settled"
    info = glue.outbox.get("c1")
    assert info is not None and (info.status, info.attempt, ran) == (SUCCEEDED, 1, [{"n": 1}])
    assert headers[ADOPT_HEADER][1] == 1  # [owner, attempt] of the claim that may have applied


def test_a_duplicate_of_the_retry_cannot_take_the_claim_over_while_the_first_runs(glue: Glue) -> None:
    glue.durable.effect("lost.slow", replay_safe=False)(lambda payload: None)
    glue.outbox.enqueue("lost.slow", None, key="k", effect_id="s1")
    glue.sender.take()
    core = glue.core
    lose_claim_and_read_back(glue.store, apply=True)
    with pytest.raises(ClaimUnknown) as caught:
        core.claim("k", "s1")
    adopt = (caught.value.owner, caught.value.attempt)
    first = core.claim("k", "s1", adopt=adopt)
    second = core.claim("k", "s1", adopt=adopt)
    assert first.claim is not None and first.reason == "claimed"
    assert second.claim is None and second.reason == "duplicate"
    row = core.get("s1")
    assert row is not None and row["lease"]["owner"] == first.claim.owner != adopt[0]


def lose_claim_that_lands_late(store: MemoryStore) -> Any:
    """The next claim batch raises with nothing written yet and the read-back finds the row still
    pending; the batch applies afterwards (a request still in flight when its answer timed out,
    or a read-back served by a replica that had not seen the write). Returns that late apply."""
    batch = store.batch
    held: list[tuple[str, Any]] = []

    def lost_batch(pk: str, ops: Any) -> Any:
        if not held and any((op.doc or {}).get("status") == RUNNING for op in ops):
            held.append((pk, ops))
            raise StoreUnavailable("injected: the claim's answer timed out")
        return batch(pk, ops)

    store.batch = lost_batch  # type: ignore[method-assign]
    return lambda: batch(*held[0])


@pytest.mark.parametrize("lands", [True, False])
@pytest.mark.parametrize("replay_safe", [False, True])
def test_a_claim_read_back_as_not_applied_that_lands_later_is_run_by_the_retry(
    glue: Glue, replay_safe: bool, lands: bool
) -> None:
    """A read-back that finds no claim does not prove the claim will not apply: the retry carries
    the claim's owner, takes it over if it landed meanwhile and runs it (once). Without that the
    retry found the row running, dropped itself as a duplicate, and the key stayed held with
    nobody running its row until the lease expired and beat's scan requeued it (a process-bound
    effect: failed unrun); with no beat, never -- the signature of the redis-cosmos timeout of
    test_keys_run_concurrently_each_strictly_in_order (a row "running", its handler never run)."""
    ran: list[Any] = []
    glue.durable.effect("late.charge", replay_safe=replay_safe)(ran.append)
    glue.outbox.enqueue("late.charge", {"n": 1}, key="k", effect_id="c1")
    (ref,) = glue.sender.take()
    land = lose_claim_that_lands_late(glue.store)
    with pytest.raises(Retry):
        glue.outbox.deliver(glue.task, ref.key, ref.effect_id)
    assert ran == [] and glue.outbox.get("c1").status == "pending"  # type: ignore[union-attr]
    if lands:
        land()
        assert glue.outbox.get("c1").status == RUNNING  # type: ignore[union-attr]
    glue.task.request.headers = dict(glue.task.retried_with.get("headers") or {})
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == SUCCEEDED
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == "settled"  # a duplicate of the retry
    info = glue.outbox.get("c1")
    assert info is not None and (info.status, info.attempt, ran) == (SUCCEEDED, 1, [{"n": 1}])


def test_an_adopt_header_without_the_seal_takes_nothing_over(glue: Glue) -> None:
    """Issue 23, item 5: a message naming the current holder of a running claim (the genuine
    retry's adopt header, its seal left off) must not take the claim over and run the effect."""
    ran: list[Any] = []
    glue.durable.effect("lost.forge", replay_safe=False)(ran.append)
    glue.outbox.enqueue("lost.forge", {"n": 1}, key="k", effect_id="f1")
    (ref,) = glue.sender.take()
    lose_claim_and_read_back(glue.store, apply=True)
    with pytest.raises(Retry):
        glue.outbox.deliver(glue.task, ref.key, ref.effect_id)
    genuine = dict(glue.task.retried_with.get("headers") or {})
    assert ADOPT_SEAL_HEADER in genuine
    before = glue.durable.counters.snapshot().get("effect_unsealed_adopt", 0)
    for forged in ({ADOPT_HEADER: genuine[ADOPT_HEADER]}, genuine | {ADOPT_SEAL_HEADER: "0" * 64}):
        glue.task.request.headers = forged
        assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) != SUCCEEDED
        assert ran == []
    assert glue.durable.counters.snapshot()["effect_unsealed_adopt"] == before + 2
    glue.task.request.headers = genuine  # the genuine retry still takes it over
    assert glue.outbox.deliver(glue.task, ref.key, ref.effect_id) == SUCCEEDED and ran == [{"n": 1}]
