"""Issue 25, the operator's overview of the outbox: effects that failed for good and lanes or intents
the liveness scan has not acted on, across every key, on every backend (``OutboxEngine.problems``).

The clock is a fake one started at the real time (Cosmos files its due-index entries by time
buckets); moving it past a due time without running the scan is what a dead beat looks like."""

from __future__ import annotations

import time
from typing import Any

from celery_durable.engine.outbox import FAILED, SUCCEEDED, lane_pk, row_id
from celery_durable.engine.outbox.model import DUE_FAILED
from celery_durable.engine.outbox.problems import LEASE_EXPIRED, NOT_ADMITTED, UNCLAIMED
from celery_durable.retry import RetryPolicy
from celery_durable.stores.base import Store
from celery_durable.testing.counting import CountingStore
from tests.engine.outbox_env import Env, FakeClock

#: the outbox scan interval the tests configure: a due lane is stuck 2 x this after its due time
SCAN = 5.0


def make_env(store: Store) -> Env:
    env = Env(store, clock=FakeClock(time.time()), scan_interval=SCAN, queue_timeout=60.0)

    @env.handler("note")
    def note(payload: Any) -> None:
        pass

    @env.handler("boom", policy=RetryPolicy(maximum_attempts=2))
    def boom(payload: Any) -> None:
        raise RuntimeError(f"the mail server refused {payload['to']}")

    @env.handler("boom1", policy=RetryPolicy(maximum_attempts=1))
    def boom1(payload: Any) -> None:
        raise RuntimeError("refused")

    @env.handler("charge", replay_safe=False)
    def charge(payload: Any) -> None:
        pass

    return env


def test_a_failed_effect_is_listed_with_its_error_and_a_succeeded_one_is_not(store: Store) -> None:
    env = make_env(store)
    env.enqueue("note", {}, key="k1", effect_id="ok")
    env.enqueue("boom", {"to": "a@example.com"}, key="k2", effect_id="bad")
    env.drain()
    assert env.row("k1", "ok")["status"] == SUCCEEDED and env.row("k2", "bad")["status"] == FAILED
    # the row itself is indexed: one due query finds it (none did before issue 25's overview)
    assert [(r.pk, r.id) for r in store.scan_due(DUE_FAILED, env.clock.now(), 10)] == [(lane_pk("k2"), row_id("bad"))]
    problems = env.outbox.problems()
    assert [(f.id, f.key, f.type, f.attempt, f.status) for f in problems.failed] == [("bad", "k2", "boom", 2, FAILED)]
    failed = problems.failed[0]
    assert failed.last_error is not None and "refused a@example.com" in failed.last_error
    assert failed.completed_at == env.row("k2", "bad")["completed_at"]
    assert problems.stuck == () and not problems.more_failed
    # no scan processes the kind: past the retention the succeeded row is pruned, the failed one stays listed
    env.clock.advance(env.settings.retention + 1)
    report = env.outbox.scan()
    assert report.pruned == 1 and report.errors == 0
    assert env.outbox.rows("k1") == []
    assert [f.id for f in env.outbox.problems().failed] == ["bad"]


def test_failed_effects_are_listed_oldest_first_up_to_the_limit(store: Store) -> None:
    env = make_env(store)
    for i in range(3):
        env.enqueue("boom", {"to": f"{i}@example.com"}, key="same" if i < 2 else "other", effect_id=f"bad{i}")
        env.drain()
        env.clock.advance(1)
    assert [f.id for f in env.outbox.problems().failed] == ["bad0", "bad1", "bad2"]
    first = env.outbox.problems(limit=2)
    assert [f.id for f in first.failed] == ["bad0", "bad1"] and first.more_failed


def test_a_failure_costs_the_round_trips_a_success_costs() -> None:
    """The failed row's due fields ride in its settle batch: no request of their own (SQLite,
    PostgreSQL, memory; Cosmos writes one due-index entry with it, which no ``Store`` call shows)."""
    from celery_durable.stores.memory import MemoryStore

    costs = []
    for effect_type in ("note", "boom1"):
        store = CountingStore(MemoryStore())
        env = make_env(store)
        env.enqueue(effect_type, {"to": "x"}, key="k", effect_id="e")
        store.reset()
        env.drain()
        costs.append(dict(store.counts))
        assert env.row("k", "e")["status"] == (SUCCEEDED if effect_type == "note" else FAILED)
    assert costs[0] == costs[1]


def test_a_lane_whose_message_was_lost_is_stuck_until_the_scan_resends_it(store: Store) -> None:
    env = make_env(store)
    env.enqueue("note", {}, key="lost", effect_id="n1")
    env.sender.take()  # the message is lost
    env.clock.advance(60.0 + 1)  # due (the queue timeout passed), within the grace: the scan may be on its way
    assert env.outbox.problems().stuck == ()
    env.clock.advance(2 * SCAN)
    stuck = env.outbox.problems().stuck
    assert [(s.key, s.why, s.effect_id, s.effect_type) for s in stuck] == [("lost", UNCLAIMED, "n1", "note")]
    assert stuck[0].due_at == env.row("lost", "n1")["created_at"] + 60.0
    assert env.outbox.scan().resent == 1
    assert env.outbox.problems().stuck == ()
    env.drain()
    assert env.row("lost", "n1")["status"] == SUCCEEDED


def test_an_expired_lease_is_stuck_then_its_failure_by_the_scan_is_listed(store: Store) -> None:
    env = make_env(store)
    env.enqueue("charge", {}, key="card", effect_id="c1")
    (ref,) = env.sender.take()
    claim = env.outbox.claim(ref.key, ref.effect_id).claim  # the worker dies holding it
    assert claim is not None
    env.clock.advance(env.settings.lease_ttl + 2 * SCAN + 1)
    stuck = env.outbox.problems().stuck
    assert [(s.key, s.why, s.effect_id, s.effect_type) for s in stuck] == [("card", LEASE_EXPIRED, "c1", "charge")]
    assert env.outbox.scan().failed == 1  # a process-bound effect is failed, not run twice
    problems = env.outbox.problems()
    assert problems.stuck == ()
    assert [(f.id, f.key) for f in problems.failed] == [("c1", "card")]
    assert "process-bound" in (problems.failed[0].last_error or "")


def test_a_running_handler_renewing_its_lease_is_not_stuck(store: Store) -> None:
    env = make_env(store)
    env.enqueue("note", {}, key="slow", effect_id="s1")
    (ref,) = env.sender.take()
    claim = env.outbox.claim(ref.key, ref.effect_id).claim
    assert claim is not None
    for _ in range(12):  # the head's due time is the first lease's expiry; the row's lease moves on
        env.clock.advance(env.settings.heartbeat_interval)
        assert env.outbox.renew(claim) == "ok"
    head = env.outbox.head("slow")
    assert head is not None and head["due_at"] < env.clock.now() - 2 * SCAN  # due, and the scan did not act
    assert env.outbox.problems().stuck == ()


def test_an_intent_not_admitted_is_stuck_until_the_scan_admits_it(store: Store) -> None:
    env = make_env(store)
    body = env.outbox.effect_body(
        "note", {}, key="later", effect_id="i1", available_at=None, replay_safe=True, max_attempts=1
    )
    store.create(env.outbox.intent("orders:42", body))  # committed with its caller's documents, then the caller died
    env.clock.advance(env.settings.admit_grace + 2 * SCAN + 1)
    stuck = env.outbox.problems().stuck
    assert [(s.key, s.why, s.effect_id, s.execution_id) for s in stuck] == [("later", NOT_ADMITTED, "i1", None)]
    assert env.outbox.scan().admitted == 1
    assert env.outbox.problems().stuck == ()


def test_a_retried_failed_effect_leaves_the_overview_and_says_so(store: Store) -> None:
    env = make_env(store)
    env.enqueue("boom", {"to": "x"}, key="k", effect_id="bad")
    env.drain()
    assert [f.id for f in env.outbox.problems().failed] == ["bad"]
    assert env.outbox.retried("bad", "bad:retry1")
    assert env.outbox.problems().failed == ()
    row = env.row("k", "bad")
    assert (row["status"], row["retried_as"], row.get("due_kind")) == (FAILED, "bad:retry1", None)
    assert not env.outbox.retried("nope", "nope:retry1")
