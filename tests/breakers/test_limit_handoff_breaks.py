"""Breaker round 26: hand-offs of freed limit slots, carried waiter messages, and slots given back
inside the outcome's commit (engine/limits/grants.py, leaving.py; glue/eager_activities.py).

Each test proved a broken promise (it failed on the code before its fix; the fix is named in
it)."""

from __future__ import annotations

from typing import Any

from celery_durable import Limit
from celery_durable.engine.activities.delivery import Delivery
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.schema import marker_id
from tests.engine.inprocess import InProcess
from tests.engine.test_limit_handoffs import _Handing
from tests.engine.test_limits import _begin, _drives_then_sent, _finish, _limit_doc, _queued, _start, _world


def _run_handoff(w: InProcess, req: ActivityRequest) -> tuple[Any, str]:
    """What the worker does with a kept hand-off (glue/durable_activity.py ``_run_attempt``): its
    delivery is the carried message (token, name, arguments), begun with ``handoff=req.grant()``."""
    return w.engine.activities.begin(
        req.execution_id, req.seq, req.run, None, Delivery.of_request(req), None, handoff=req.grant()
    )


def test_a_stale_carried_message_after_a_reset_strands_the_grant() -> None:
    """Mechanism: e1's step 1 waits with its message carried (token T1). e1 is cancelled (its waiter
    stays queued: nothing withdraws an activity step's waiter) and reset from step 1: the re-run
    marks step 1 anew (token T2) and its dispatch's ``enqueue`` (engine/limits/table.py) keeps the
    old waiter (one per step key), carried T1 message included, and holds the T2 message back. When
    e0's attempt ends, the slot is granted to that waiter and handed off here with the carried T1
    message (grants.py ``send_granted`` uses ``m`` without reading the marker). Its begin finds the
    step runnable, then ``refusal`` says "stale delivery" (attempts.py, the ``delivery`` check):
    ``_give_back`` is called with ``slot=None`` and ``_give_back_grant`` is only on the
    ``not_runnable`` branch, so the holder entry {t: T1} stays. No T2 message exists: e1's step 1 does
    not start until the holder expires (lease TTL, 30 s) and the scan drops it, although the slot's
    only holder will never run. Before hand-offs the grant was rebuilt from the marker (T2) and ran.
    Fixed: the re-run's dispatch replaces a waiter queued for another marker of the step (its
    carried message too), and a refused hand-off gives back the grant the limit document names
    (``ActivityRequest.grant``: partition, attempt number, token), not the marker's.
    """
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: "k"), fan=1)
    (first,) = _start(w, "e0", 1)
    attempt, _ = _begin(w, first)
    assert attempt is not None  # e0 step 1 holds the only slot
    assert _start(w, "e1", 1) == []  # e1 step 1 waits, its message carried
    old = _limit_doc(w, "stripe", "k")["waiters"][0]
    assert "m" in old
    w.engine.cancel("e1")
    _drives_then_sent(w)
    assert w.status("e1") == "cancelled"
    Admin(w.engine).reset("e1", 1)
    assert _drives_then_sent(w) == []  # the re-run's step 1 held back: its step still queued
    new_token = w.engine.cache.load("e1")[marker_id(1, 0)]["token"]
    assert new_token != old["t"]
    handing = _Handing(w)
    _finish(w, attempt)  # e0 ends: the slot goes to e1 step 1, handed off here
    (kept,) = handing.kept
    ran, why = _run_handoff(w, kept)
    queued = _queued(w)
    # the promise: a waiting step is started once a slot frees (not a lease TTL later). Either
    # the hand-off runs e1's step 1 as it is now, or the slot/its message reaches it at once.
    w.clock.advance(w.engine.settings.recovery_interval)
    w.engine.limits.scan()
    queued += _queued(w)
    started = ran is not None or any(r.execution_id == "e1" and r.seq == 1 and r.token == new_token for r in queued)
    assert started, (why, _limit_doc(w, "stripe", "k")["holders"], [(r.execution_id, r.token) for r in queued])


def test_a_hand_off_to_a_purged_executions_waiter_strands_the_slot() -> None:
    """Mechanism: a cancel does not withdraw an activity step's waiter, so e1's waiting step stays
    queued (with its carried message) after e1 is cancelled and purged. When e0's attempt ends the
    slot is granted to that waiter and handed off here (grants.py ``send_granted``: the carried
    message is kept without reading e1's partition). Its begin (attempts.py ``begin``) is refused
    with "no such execution", which ``may_be_stale`` counts as possibly stale, so
    ``_give_back_grant`` is skipped (and would need the marker anyway). Nothing sends anything
    else: e2's step, queued behind it, waits until the stale holder expires (lease TTL, 30 s) and
    the scan drops it. Before hand-offs, ``_send_one`` read e1's partition, found no marker and
    freed the slot at once (``_leave(lpk, step, None)``), granting e2 in the same call.
    Fixed: a refused hand-off, whatever the reason (but another attempt running), gives back the
    grant the limit document names, with no need of the marker."""
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: "k"), fan=1)
    (first,) = _start(w, "e0", 1)
    attempt, _ = _begin(w, first)
    assert attempt is not None  # e0 step 1 holds the only slot
    assert _start(w, "e1", 1) == []  # e1 step 1 waits, its message carried
    assert _start(w, "e2", 1) == []  # e2 step 1 waits behind it
    w.engine.cancel("e1")
    _drives_then_sent(w)
    assert w.status("e1") == "cancelled"
    w.clock.advance(10)
    report = Admin(w.engine).purge(older_than=1)
    assert w.store.read("e1", "exec") is None, report
    handing = _Handing(w)
    _finish(w, attempt)  # e0 ends: its slot is granted to a waiter and handed off here
    kept = list(handing.kept)
    queued = _queued(w)
    ran = []
    for req in kept:
        a, why = _run_handoff(w, req)
        ran.append((req.execution_id, a is not None, why))
    queued += _queued(w) + [r for r in handing.kept[len(kept) :]]
    # within a scan interval (not a lease TTL) e2's step gets the freed slot and is sent/handed off
    w.clock.advance(w.engine.settings.recovery_interval)
    w.engine.limits.scan()
    queued += _queued(w) + [r for r in handing.kept[len(kept) :]]
    started = any(e == "e2" and ok for e, ok, _ in ran) or any(r.execution_id == "e2" for r in queued)
    assert started, (ran, _limit_doc(w, "stripe", "k")["holders"], [r.execution_id for r in queued])
