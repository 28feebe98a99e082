"""Second round of attacks on keyed concurrency and rate limits (issue 26 §1, engine/limits/).

A test under a "Found by the breaker (fixed)" comment proved a break (the comment says what was
observed and where the cause was) and failed before its fix; the others are attacks that held. They run on
``tests/engine/inprocess.py``'s ``InProcess`` (a fake clock, an inline dispatcher whose queue the
test delivers by hand), reusing the helpers of the first round (tests/breakers/test_limit_breaks.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_durable import Limit
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.documents.model import Attempt
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ConfigurationError, StoreError
from celery_durable.stores.memory import MemoryStore
from celery_durable.workflow import continue_as_new
from tests.breakers.test_limit_breaks import (
    SCAN,
    TTL,
    _beat_until,
    _begin,
    _complete,
    _doc,
    _drives,
    _run_start,
    _sent,
    _world,
)
from tests.engine.inprocess import InProcess

pytestmark = pytest.mark.adversarial


def _run_all(w: InProcess, eids: list[str], seconds: float = 600.0) -> tuple[float, int]:
    """Deliver every message and end every attempt (oldest first), beat's scan every SCAN s when
    nothing runs, until every ``eids`` is terminal: (seconds the fake clock moved, the most
    attempts running at once)."""
    start = w.clock.now()  # type: ignore[attr-defined]
    running: list[Attempt] = []
    peak = 0
    while w.clock.now() - start < seconds:  # type: ignore[attr-defined]
        _drives(w)
        for req in _sent(w):
            a, _ = _begin(w, req)
            if a is not None:
                running.append(a)
        peak = max(peak, len(running))
        if all(w.status(e) != "running" for e in eids):
            break
        if running:
            _complete(w, running.pop(0))
        else:
            w.clock.advance(SCAN)  # type: ignore[attr-defined]
            w.engine.recovery.scan()
    return float(w.clock.now() - start), peak  # type: ignore[attr-defined]


# --- breaks ------------------------------------------------------------------------------


# Found by the breaker (fixed): two activities declaring the same Limit name with different
# max_running (1 and 5) share one document lim:<name>:<key> whose max is rewritten by table.declare
# from the latest scheduled step's record: a refund scheduled after three charges lifts max to 5 and
# the waiting charges are granted, 3 charges run at once under charge's max_running=1; nothing refuses
# the conflicting declaration (glue/durable_activity.py keeps no registry of limit names)
def test_two_declarations_of_one_limit_name_do_not_lift_each_others_max() -> None:
    from celery_durable import durable_activity
    from celery_durable.engine.registry import GLOBAL_ACTIVITIES

    @durable_activity(name="lim2.charge", limit=Limit("lim2.stripe", max_running=1))
    def charge(n: int) -> int:
        return n

    try:

        @durable_activity(name="lim2.refund", limit=Limit("lim2.stripe", max_running=5))
        def refund(n: int) -> int:
            return n

    except ConfigurationError:
        return  # refused at declaration: a clear error, as promised for bad input
    w = InProcess()
    acts = {
        name: w.registry.add_activity(name, lambda n: n, GLOBAL_ACTIVITIES[name].options)
        for name in ("lim2.charge", "lim2.refund")
    }

    def many(name: str, count: int) -> Any:
        ctx = require_context("test")
        act = acts[name]
        futures = [ctx.call_activity(act.name, act.codec, (i,), {}, act.options) for i in range(count)]
        return [f.result() for f in futures]

    wf = w.workflow(many)
    w.engine.start(wf, ("lim2.charge", 3), {}, "charges")
    _drives(w)
    running = [a for a in (_begin(w, r)[0] for r in _sent(w)) if a is not None]
    w.clock.advance(1)  # type: ignore[attr-defined]
    w.engine.start(wf, ("lim2.refund", 1), {}, "refunds")
    _drives(w)
    running += [a for a in (_begin(w, r)[0] for r in _sent(w)) if a is not None]
    charges = [a.seq for a in running if a.name == "lim2.charge"]
    assert len(charges) <= 1, f"charge has max_running=1, yet steps {charges} run at once"


# Found by the breaker (fixed): spec.step_limit accepts any int priority (.set(priority=10**5000)) and
# records it on the marker: the drive's commit then raises ValueError ('Exceeds the limit (4300
# digits) for integer string conversion', json.dumps in the store) on every try, so the workflow stays
# 'running' forever instead of failing with the ConfigurationError a too-long key gives
def test_a_huge_call_priority_is_a_configuration_error() -> None:
    w = InProcess()
    w.registry.add_activity("charge", lambda key, n: n, {"limit": Limit("stripe", max_running=1)})

    def prioritised() -> Any:
        ctx = require_context("test")
        return ctx.gather([SimpleNamespace(task="charge", args=("k", 1), kwargs={}, options={"priority": 10**5000})])

    w.engine.start(w.workflow(prioritised), (), {}, "e")
    raised: list[str] = []
    try:
        _drives(w)
    except Exception as exc:  # noqa: BLE001 - what the worker's drive task would see
        raised.append(f"{type(exc).__name__}: {str(exc)[:80]}")
    assert not raised, raised
    assert w.status("e") == "failed"
    assert w.ex("e")["error"]["type"] == "ConfigurationError"


# Found by the breaker (fixed): Limit.__post_init__ checks priority is an int but not its size:
# Limit(priority=10**5000) is accepted at declaration and every step scheduled under it breaks its
# workflow's commit (ValueError from json.dumps) instead of a ConfigurationError at import time
def test_a_huge_declared_priority_is_refused_at_declaration() -> None:
    with pytest.raises(ConfigurationError):
        Limit("stripe", max_running=1, priority=10**5000)


# Found by the breaker (fixed): a step granted a slot (its message sent) whose workflow is cancelled
# before the message arrives: ActivityRunner.begin refuses the delivery ('execution is cancelled',
# not_runnable) before it calls limits.enter, so nobody gives the granted slot back; it lapses only
# at its exp (lease TTL, 30 s) via _check_expired, and the live waiter behind it waits 30 s (> the 15
# s scan interval) on a slot no step will use
def test_a_grant_refused_because_its_workflow_was_cancelled_frees_the_slot() -> None:
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "h", 1)
    assert _run_start(w, "e", 1) == []
    assert _run_start(w, "late", 1) == []
    _complete(w, holder)
    _drives(w)
    (granted,) = _sent(w)
    assert granted.execution_id == "e"
    w.engine.cancel("e")  # before the grant's message arrives
    _drives(w)
    a, why = _begin(w, granted)
    assert a is None and "cancelled" in why
    sent = [r.execution_id for r in _sent(w)]
    waited = 0.0 if "late" in sent else _beat_until(w, "late", 10 * TTL)
    assert waited is not None and waited <= SCAN, f"'late' waited {waited} s behind a cancelled step's grant"


# Found by the breaker (fixed): continue-as-new with a limited step still queued: the run's first step
# ends (LeaseKeeper.untrack -> leave) before the drive continues, so its slot is granted to the old
# run's queued step and its message sent; that delivery is refused (the run moved on) before
# limits.enter, the slot is never given back, and the new run's step waits a full lease TTL (30 s >
# the 15 s scan interval) on it at every continue-as-new
def test_continue_as_new_with_a_queued_step_does_not_stall_the_next_run() -> None:
    w = InProcess()
    act = w.registry.add_activity("charge", lambda key, n: n, {"limit": Limit("stripe", max_running=1)})

    def gens(n: int) -> int:
        ctx = require_context("test")
        futures = [ctx.call_activity(act.name, act.codec, ("k", i), {}, act.options) for i in range(2)]
        futures[0].result()  # the second is left queued on the limit
        if n > 0:
            continue_as_new(n - 1)
        return n

    w.engine.start(w.workflow(gens), (1,), {}, "e")
    took, peak = _run_all(w, ["e"])
    assert w.status("e") == "completed" and peak <= 1
    assert took <= SCAN, f"the workflow waited {took} s on slots (no step ran longer than an instant)"


# Found by the breaker (fixed): a cancelled workflow's queued step is handed on at the next grant
# (Slots._send_one: _done -> _leave), which drops it from the limit's queue; Admin.resume then re-
# sends only the steps whose cancelled outcome it forgot, not a step left with no outcome and no
# message, so the resumed step waits for its marker's activity_queue_timeout (300 s) with every slot
# free (the same gap holds for a plain step whose message was refused during the cancel)
def test_resume_after_cancel_sends_a_step_that_was_queued_on_the_limit() -> None:
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "h", 1)
    assert _run_start(w, "e", 2) == []  # both steps queued on the limit
    w.engine.cancel("e")
    _drives(w)
    _complete(w, holder)  # the slot frees: e's queued steps are handed on (e is cancelled)
    _drives(w)
    assert _sent(w) == []
    Admin(w.engine).resume("e")
    took, peak = _run_all(w, ["e"])
    assert w.status("e") == "completed" and peak <= 1
    assert took <= SCAN, f"the resumed workflow waited {took} s with every slot free"


# --- attacks that held ---------------------------------------------------------------------


def test_reset_with_queued_steps_and_a_lost_grant_is_sent_again() -> None:
    """Reset re-runs a cancelled execution whose steps were queued with their old markers' tokens:
    the grant of the old entry is lost, and the scan sends the re-run's step again in time."""
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "h", 1)
    assert _run_start(w, "e", 2) == []
    w.engine.cancel("e")
    _drives(w)
    Admin(w.engine).reset("e", 1)
    _drives(w)
    _sent(w)
    _complete(w, holder)
    _drives(w)
    _sent(w)  # the grant's message: lost
    waited = _beat_until(w, "e", 300)
    assert waited is not None and waited <= TTL + 2 * SCAN
    took, peak = _run_all(w, ["e"])
    assert w.status("e") == "completed" and peak <= 1
    assert _doc(w)["holders"] == {} and _doc(w)["waiters"] == []


def test_continue_as_new_completes_with_every_slot_free() -> None:
    w = InProcess()
    act = w.registry.add_activity("charge", lambda key, n: n, {"limit": Limit("stripe", max_running=2)})

    def gens(n: int) -> Any:
        ctx = require_context("test")
        futures = [ctx.call_activity(act.name, act.codec, ("k", i), {}, act.options) for i in range(4)]
        out = [f.result() for f in futures]
        if n > 0:
            continue_as_new(n - 1)
        return out

    w.engine.start(w.workflow(gens), (2,), {}, "e")
    _, peak = _run_all(w, ["e"])
    assert w.status("e") == "completed" and peak <= 2
    assert _doc(w)["holders"] == {} and _doc(w)["waiters"] == []


class _FailingLimits(MemoryStore):
    """A store whose writes of limit documents fail (``StoreError``) while ``down`` — applied or not."""

    down = False
    applied = False

    def _maybe(self, doc: dict[str, Any], write: Any) -> Any:
        if str(doc.get("pk", "")).startswith("lim:") and self.down:
            if self.applied:
                write()  # the write landed, its answer was lost (a timeout)
            raise StoreError("the limit partition is unavailable")
        return write()

    def create(self, doc: dict[str, Any]) -> str | None:
        return self._maybe(doc, lambda: super(_FailingLimits, self).create(doc))

    def replace(self, doc: dict[str, Any], if_match: str | None) -> str:
        return self._maybe(doc, lambda: super(_FailingLimits, self).replace(doc, if_match))


@pytest.mark.parametrize("applied", [False, True])
def test_admission_when_the_store_fails_keeps_max_running_and_completes(applied: bool) -> None:
    store = _FailingLimits()
    w = _world(Limit("stripe", max_running=2), store=store)
    store.down, store.applied = True, applied
    w.engine.start(w.fan_out, (5,), {}, "e")  # type: ignore[attr-defined]
    _drives(w)
    sent = _sent(w)
    assert len(sent) == 5  # admission failed: every step is sent, to take its slot as it begins
    store.down = False
    began = [a for a in (_begin(w, r)[0] for r in sent) if a is not None]
    assert len(began) <= 2
    running = list(began)
    while running:
        _complete(w, running.pop(0))
        _drives(w)
        for r in _sent(w):
            a, _ = _begin(w, r)
            if a is not None:
                running.append(a)
        assert len(running) <= 2
    took, _ = _run_all(w, ["e"])
    assert w.status("e") == "completed", took
    assert _doc(w)["holders"] == {} and _doc(w)["waiters"] == []


def test_a_duplicated_admission_grant_runs_once_and_frees_its_slot() -> None:
    w = _world(Limit("stripe", max_running=1))
    w.engine.start(w.fan_out, (2,), {}, "e")  # type: ignore[attr-defined]
    _drives(w)
    (req,) = _sent(w)
    a, _ = _begin(w, req)
    assert a is not None
    dup, why = _begin(w, req)
    assert dup is None and why.startswith("another attempt")
    _complete(w, a)
    dup, why = _begin(w, req)  # the duplicate arrives after the outcome
    assert dup is None
    _drives(w)
    took, peak = _run_all(w, ["e"])
    assert w.status("e") == "completed" and peak <= 1 and took <= SCAN


def test_keys_of_two_limit_names_are_apart() -> None:
    w = InProcess()
    a1 = w.registry.add_activity("a", lambda k: k, {"limit": Limit("x", max_running=1, key=lambda k: k)})
    a2 = w.registry.add_activity("b", lambda k: k, {"limit": Limit("y", max_running=1, key=lambda k: k)})

    def both() -> Any:
        ctx = require_context("test")
        fs = [ctx.call_activity(a.name, a.codec, ("same",), {}, a.options) for a in (a1, a2)]
        return [f.result() for f in fs]

    w.engine.start(w.workflow(both), (), {}, "e")
    _drives(w)
    began = [a for a in (_begin(w, r)[0] for r in _sent(w)) if a is not None]
    assert sorted(a.name for a in began) == ["a", "b"]


def test_negative_and_large_priorities_order_the_queue() -> None:
    w = InProcess()
    w.registry.add_activity("charge", lambda key, n: n, {"limit": Limit("prio", max_running=1)})
    prios = [0, 2**53, -(2**53), -1]  # the bound (spec.MAX_PRIORITY): a double holds every int up to it

    def prioritised() -> Any:
        ctx = require_context("test")
        sigs = [
            SimpleNamespace(task="charge", args=("k", i), kwargs={}, options={"priority": p})
            for i, p in enumerate(prios)
        ]
        return ctx.gather(sigs)

    w.engine.start(w.workflow(prioritised), (), {}, "e")
    _drives(w)
    order = []
    running = [a for a in (_begin(w, r)[0] for r in _sent(w)) if a is not None]
    while running:
        a = running.pop()
        order.append(a.seq)
        _complete(w, a)
        _drives(w)
        running = [x for x in (_begin(w, r)[0] for r in _sent(w)) if x is not None]
    assert order == [3, 4, 1, 2]


def test_an_int_fair_by_takes_turns_and_a_float_is_refused() -> None:
    w = _world(Limit("stripe", max_running=1, fair_by=lambda key, n: n % 2))
    w.engine.start(w.fan_out, (4,), {}, "e")  # type: ignore[attr-defined]
    took, peak = _run_all(w, ["e"])
    assert w.status("e") == "completed" and peak <= 1
    bad = _world(Limit("stripe", max_running=1, fair_by=lambda key, n: 1.5))
    bad.engine.start(bad.fan_out, (1,), {}, "e")  # type: ignore[attr-defined]
    _drives(bad)
    assert bad.status("e") == "failed" and bad.ex("e")["error"]["type"] == "ConfigurationError"


def test_a_clock_that_steps_back_keeps_the_rate() -> None:
    """A worker whose clock is 30 s behind the one that recorded the last start: that start (in its
    future) still counts, the rate lets nothing else in until its own clock is a period past it."""
    limit = Limit("stripe", rate="1/m")
    w = _world(limit)
    w.clock.advance(30)  # type: ignore[attr-defined]
    (a,) = _run_start(w, "e", 2)
    _complete(w, a)
    _drives(w)
    assert _sent(w) == []
    behind = _world(limit, store=w.store)  # its clock: 30 s behind w's
    assert _run_start(behind, "f", 1) == []
    behind.clock.advance(59)  # type: ignore[attr-defined]
    behind.engine.recovery.scan()
    assert _sent(behind) == [] and _sent(w) == []


def test_limit_show_describes_an_int_key_and_a_grant() -> None:
    from celery_durable.cli.limit_commands import describe

    w = _world(Limit("stripe", max_running=1, key=lambda key, n: 7))
    assert len(_run_start(w, "e", 3)) == 1
    view = describe(_doc(w, "7"), w.clock.now())  # type: ignore[attr-defined]
    assert view["key"] == "7" and view["room"] == 0
    assert [h["seq"] for h in view["holders"]] == [1]
    assert [x["seq"] for x in view["waiting"]] == [2, 3]
