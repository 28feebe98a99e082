"""Attacks on keyed concurrency and rate limits (issue 26 §1, celery_durable/engine/limits/).

Each test asserts one promise of the feature: never more than ``max_running`` attempts of one key
running at once, a rate never exceeded over any window of its period, slots as leases, a waiting
step woken when a slot frees and never waiting on a free slot longer than a recovery scan
interval, operator actions never leaving a slot held or a step waiting forever, clear errors for
bad input. A test under a "Found by the breaker (fixed)" comment proved a break (the comment says
what was observed and where the cause was) and failed before its fix; the others are attacks that
held. They run on ``tests/engine/inprocess.py``'s
``InProcess``: a fake clock and an inline dispatcher whose queue the test delivers by hand (so a
message can be delayed, duplicated or lost).
"""

from __future__ import annotations

from typing import Any

import pytest

from celery_durable import Limit
from celery_durable.engine.activities.delivery import request_of
from celery_durable.engine.admin.operator import Admin
from celery_durable.engine.dispatcher import ActivityRequest
from celery_durable.engine.documents.model import EXEC_ID, Attempt, marker_id
from celery_durable.engine.limits import table
from celery_durable.engine.limits.slots import LIMIT_DOC_ID, WAITING
from celery_durable.engine.limits.spec import limit_pk, parse_rate
from celery_durable.engine.replay.context import require_context
from celery_durable.errors import ConfigurationError, ConflictError
from celery_durable.stores.base import Store
from celery_durable.stores.memory import MemoryStore
from tests.engine.inprocess import InProcess

pytestmark = pytest.mark.adversarial

T0 = 1_700_000_000.0
TTL = 30.0  # Settings.lease_ttl's default
SCAN = 15.0  # Settings.recovery_interval's default: beat's recovery scan


def _world(limit: Limit, store: Store | None = None) -> InProcess:
    """A world whose workflow ``fan_out(count)`` runs ``count`` limited steps ``charge("k", i)``."""
    w = InProcess(store=store)
    act = w.registry.add_activity("charge", lambda key, n: f"{key}:{n}", {"limit": limit})

    def fan_out(count: int) -> list[str]:
        ctx = require_context("test")
        futures = [ctx.call_activity(act.name, act.codec, ("k", i), {}, act.options) for i in range(count)]
        return [f.result() for f in futures]

    w.fan_out = w.workflow(fan_out)  # type: ignore[attr-defined]
    return w


def _drives(w: InProcess) -> None:
    """Run every drive queued (activity messages stay queued, in order)."""
    while any(kind == "drive" for kind, _ in w.dispatcher.queue):
        kind, item = w.dispatcher.queue.popleft()
        if kind == "drive":
            w.engine.drive(item)
        else:
            w.dispatcher.queue.append((kind, item))


def _sent(w: InProcess) -> list[ActivityRequest]:
    """The activity messages sent so far (taken off the queue: the test delivers them)."""
    out = [item for kind, item in w.dispatcher.queue if kind == "activity"]
    w.dispatcher.queue.clear()
    return out


def _start(w: InProcess, eid: str, count: int) -> list[ActivityRequest]:
    w.engine.start(w.fan_out, (count,), {}, eid)  # type: ignore[attr-defined]
    _drives(w)
    return _sent(w)


def _begin(w: InProcess, req: ActivityRequest) -> tuple[Attempt | None, str]:
    return w.engine.activities.begin(req.execution_id, req.seq, req.run)


def _run_start(w: InProcess, eid: str, count: int) -> list[Attempt]:
    """Start ``fan_out(count)`` as ``eid`` and deliver what its drive sends: the attempts that
    began (the others wait on the limit, queued at dispatch or as their delivery found no room)."""
    began = []
    for req in _start(w, eid, count):
        a, why = _begin(w, req)
        if a is None:
            assert why.startswith(WAITING), why
        else:
            began.append(a)
    return began


def _req(w: InProcess, eid: str, seq: int) -> ActivityRequest:
    """Step ``seq``'s message as a recovery re-send (or a duplicate) would carry it."""
    docs = w.engine.cache.load(eid)
    return request_of(eid, docs[marker_id(seq, 0)], docs[EXEC_ID])


def _complete(w: InProcess, a: Attempt) -> None:
    w.engine.activities.complete(a, w.engine.activities.result_doc(a, value="ok"))


def _doc(w: InProcess, key: str = "") -> dict[str, Any]:
    doc = w.store.read(limit_pk({"name": "stripe", "key": key}), LIMIT_DOC_ID)
    assert doc is not None
    return doc


def _beat_until(w: InProcess, eid: str, seconds: float) -> float | None:
    """Beat's recovery scan every SCAN s for ``seconds``: after how long a message of ``eid``'s
    was first sent (None: never)."""
    start = w.clock.now()  # type: ignore[attr-defined]
    while w.clock.now() - start < seconds:  # type: ignore[attr-defined]
        w.clock.advance(SCAN)  # type: ignore[attr-defined]
        w.engine.recovery.scan()
        if any(r.execution_id == eid for r in _sent(w)):
            return float(w.clock.now() - start)  # type: ignore[attr-defined]
    return None


# --- breaks ------------------------------------------------------------------------------


# Found by the breaker (fixed): Slots._send_one gives a dead waiter's grant straight back with
# Slots._leave, which grants the next waiter and calls _send again: one Python frame chain per dead
# waiter, so a few hundred waiters of a cancelled fan-out make the holder's complete() raise
# RecursionError (leave 'never raises' catches only StoreError; LeaseKeeper.untrack runs before the
# outcome's drive) and the live workflow's outcome is never recorded
def test_a_cancelled_fan_out_of_waiters_does_not_break_the_next_completion() -> None:
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "live", 1)
    assert _run_start(w, "fan", 400) == []
    w.engine.cancel("fan")
    _drives(w)
    assert w.status("fan") == "cancelled"
    _complete(w, holder)  # RecursionError here: the 400 dead waiters are granted one inside the other
    _drives(w)
    assert w.status("live") == "completed"
    assert _doc(w)["holders"] == {} and _doc(w)["waiters"] == []


# Found by the breaker (fixed): a waiter whose workflow was purged is granted a slot and
# Slots._send_one, finding no marker, neither sends it nor gives the slot back (it gives back only
# when the marker is still there with its limit record): each purged waiter granted holds a slot for a
# full lease TTL (until _check_expired), so the live step behind them waits 30 s (> the 15 s scan
# interval) on a free slot instead of being sent at once as behind a cancelled (not purged) waiter
def test_a_purged_waiter_does_not_hold_a_slot() -> None:
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "h", 1)
    assert _run_start(w, "gone", 3) == []
    assert _run_start(w, "late", 1) == []
    w.engine.cancel("gone")
    _drives(w)
    w.clock.advance(10)  # type: ignore[attr-defined]
    assert Admin(w.engine).purge(older_than=1).purged == 1
    _complete(w, holder)  # the only running step ends: the slot is free, "late" is the one live waiter
    _drives(w)
    sent = [r.execution_id for r in _sent(w)]
    waited = 0.0 if "late" in sent else _beat_until(w, "late", 10 * TTL)
    assert waited is not None and waited <= SCAN, f"'late' waited {waited} s on a free slot"


# Found by the breaker (fixed): a granted step whose message is lost (or whose releaser died between
# its write and its sends) is dropped from the holders once its slot lapses (Slots._check_expired: no
# live lease -> del) but is neither sent again nor queued again: it waits for its marker's own re-send
# (activity_queue_timeout, 300 s, spaced up to 8x) while the slot is free, though slots.py says the
# scan 'grants what nobody handed off'
def test_a_lost_grant_is_sent_again_by_the_scan() -> None:
    w = _world(Limit("stripe", max_running=1))
    (a,) = _run_start(w, "e", 2)
    _complete(w, a)
    _drives(w)
    assert [r.seq for r in _sent(w)] == [2]  # the grant's message: lost
    waited = _beat_until(w, "e", 300)
    assert waited is not None and waited <= TTL + 2 * SCAN, f"the granted step was sent again after {waited} s"


# Found by the breaker (fixed): a step that finds the queue full (MAX_WAITERS) is recorded nowhere on
# the limit: when the queue drains and every slot is free it waits for its marker's re-send
# (activity_queue_timeout, 300 s) instead of at most a recovery scan interval
def test_a_step_past_the_queue_cap_does_not_wait_on_free_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table, "MAX_WAITERS", 2)
    w = _world(Limit("stripe", max_running=1))
    w.engine.start(w.fan_out, (4,), {}, "e")  # type: ignore[attr-defined]
    _drives(w)
    overflow: list[str] = []
    running: list[Attempt] = []
    pending = _sent(w)
    while pending or running:  # deliver every message, end every attempt (each grant sent on)
        for req in pending:
            a, why = _begin(w, req)
            if a is not None:
                running.append(a)
            elif "queue is full" in why:
                overflow.append(f"{req.execution_id}:{req.seq}")
        if running:
            _complete(w, running.pop(0))
            _drives(w)
        pending = _sent(w)
    assert overflow, "no step found the queue full"
    assert _doc(w)["holders"] == {} and _doc(w)["waiters"] == []  # every slot free
    assert w.status("e") == "running"  # the overflowed step still waits
    waited = _beat_until(w, "e", 300)
    assert waited is not None and waited <= SCAN, f"{overflow} waited {waited} s on a free slot"


# Found by the breaker (fixed): a slot is keyed by (execution, run, seq) and guarded by the attempt
# number only: a reset re-runs the step in the same run with its attempts counted from 1 again, so the
# re-run's attempt 1 shares the slot of the old (lease-lapsed, still running) attempt 1, and that
# attempt's late end (leave, n=1 matches) frees the re-run's slot while it runs: another step is
# admitted past max_running=1
def test_a_late_end_from_before_a_reset_does_not_free_the_reruns_slot() -> None:
    w = _world(Limit("stripe", max_running=1))
    (old,) = _run_start(w, "e", 1)
    w.engine.cancel("e")
    _drives(w)
    assert w.status("e") == "cancelled"
    w.clock.advance(TTL + 1)  # type: ignore[attr-defined]  # the old worker is stuck: its lease lapsed
    Admin(w.engine).reset("e", 1)
    _drives(w)
    (again,) = _sent(w)
    rerun, _ = _begin(w, again)
    assert rerun is not None and rerun.number == old.number == 1
    w.engine.leases.untrack(old)  # the stuck attempt ends at last (its outcome is refused, its slot given back)
    assert _run_start(w, "other", 1) == [], "a second step of the key began while the reset's re-run runs"


# Found by the breaker (fixed): table.declare says 'the latest scheduled step's wins' but any step
# that enters rewrites the document's max from its own marker: the retry of a step scheduled before a
# deploy lowered max_running 3 -> 1 raises it back to 3 as it begins, and 3 steps hold slots under the
# current max_running=1
def test_a_step_scheduled_before_a_deploy_does_not_restore_the_old_limit() -> None:
    before = _world(Limit("stripe", max_running=3))
    after = _world(Limit("stripe", max_running=1), store=before.store)
    (old,) = _run_start(before, "old", 1)  # the old deploy's step runs
    after.clock.advance(60)  # type: ignore[attr-defined]  # the deploy comes later
    _run_start(after, "new", 3)  # the new deploy's fan-out: max_running=1 from now on
    assert _doc(after)["max"] == 1
    after.engine.activities.retrying(old, 0.0, RuntimeError("flaky"))  # its slot goes to a new step
    _drives(after)
    for req in _sent(after):
        _begin(after, req)
    _begin(after, _req(after, "old", 1))  # the old step's retry, on the new deploy's worker
    doc = _doc(after)
    assert doc["max"] == 1 and len(doc["holders"]) <= 1, (doc["max"], sorted(doc["holders"]))


# Found by the breaker (fixed): a rate counts a granted step's start when it is granted (table._take),
# not when its attempt begins: rate='1/m', a step granted at 60 s whose message sits in a backlog
# begins at 100 s, and a new step is admitted at 121 s: two starts 21 s apart
def test_a_rate_holds_over_the_starts_of_granted_steps() -> None:
    w = _world(Limit("stripe", rate="1/m"))
    starts = [w.clock.now()]  # type: ignore[attr-defined]
    (a,) = _run_start(w, "e", 2)
    _complete(w, a)
    _drives(w)
    _sent(w)
    w.clock.advance(60)  # type: ignore[attr-defined]
    w.engine.recovery.scan()
    (granted,) = _sent(w)
    w.clock.advance(40)  # type: ignore[attr-defined]  # delivered late (a backlog)
    b, _ = _begin(w, granted)
    assert b is not None
    starts.append(w.clock.now())  # type: ignore[attr-defined]
    _complete(w, b)
    _drives(w)
    _sent(w)
    began = _run_start(w, "f", 1)
    w.clock.advance(21)  # type: ignore[attr-defined]
    w.engine.recovery.scan()
    began += [x for x in (_begin(w, r)[0] for r in _sent(w)) if x is not None]
    if began:
        starts.append(w.clock.now())  # type: ignore[attr-defined]
    assert all(later - earlier >= 60 for earlier, later in zip(starts, starts[1:], strict=False)), starts


# Found by the breaker (fixed): parse_rate's period multiplier regex (\d*\.?\d*) accepts a bare '.',
# then float('.') raises ValueError('could not convert string to float') instead of the
# ConfigurationError every other bad rate gives (Limit(rate='5/.m') fails the same way at declaration)
def test_a_rate_of_a_bare_dot_period_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        parse_rate("5/.m")


# Found by the breaker (fixed): spec._key_text calls str() on an int key before checking its length:
# an int past Python's 4300-digit limit raises ValueError('Exceeds the limit ... integer string
# conversion') that fails the workflow, not the ConfigurationError naming the limit a too-long str key
# gives
def test_a_huge_int_key_is_a_configuration_error() -> None:
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: 10**5000))
    _start(w, "e", 1)
    assert w.status("e") == "failed"
    assert w.ex("e")["error"]["type"] == "ConfigurationError"


# --- attacks that held ---------------------------------------------------------------------


def test_a_bad_key_value_fails_the_workflow_with_a_configuration_error() -> None:
    w = _world(Limit("stripe", max_running=1, key=lambda key, n: None))
    _start(w, "e", 1)
    assert w.status("e") == "failed"
    err = w.ex("e")["error"]
    assert err["type"] == "ConfigurationError" and "stripe" in err["message"]


def test_a_duplicate_of_a_granted_step_runs_once() -> None:
    w = _world(Limit("stripe", max_running=1))
    (a,) = _run_start(w, "e", 2)
    _complete(w, a)
    _drives(w)
    (granted,) = _sent(w)
    b, _ = _begin(w, granted)
    assert b is not None
    dup, why = _begin(w, granted)  # the grant's message delivered twice (or the recovery re-send too)
    assert dup is None and why.startswith("another attempt is running")
    assert len(_doc(w)["holders"]) == 1
    _complete(w, b)
    _drives(w)
    assert w.status("e") == "completed"
    assert _doc(w)["holders"] == {}


def test_a_redelivered_waiting_step_is_queued_once() -> None:
    w = _world(Limit("stripe", max_running=1))
    (a,) = _run_start(w, "e", 3)
    for _ in range(3):
        assert _begin(w, _req(w, "e", 3))[0] is None
    assert [x["q"] for x in _doc(w)["waiters"]] == [2, 3]
    assert list(_doc(w)["holders"]) == ["e|0|1"]


def test_a_lost_lease_attempt_ending_late_keeps_its_successors_slot() -> None:
    w = _world(Limit("stripe", max_running=1))
    (old,) = _run_start(w, "e", 1)
    w.clock.advance(TTL + 1)  # type: ignore[attr-defined]
    new, _ = _begin(w, _req(w, "e", 1))  # the recovery re-send: attempt 2 takes the step and its slot
    assert new is not None and new.number == 2
    w.engine.leases.untrack(old)  # attempt 1 ends late
    assert [h["n"] for h in _doc(w)["holders"].values()] == [2]
    assert _run_start(w, "other", 1) == []


def test_a_retry_gives_the_slot_to_the_next_waiter_and_queues_again() -> None:
    w = _world(Limit("stripe", max_running=1))
    (a,) = _run_start(w, "e", 2)
    w.engine.activities.retrying(a, 5.0, RuntimeError("flaky"))
    assert [r.seq for r in _sent(w)] == [2]
    w.clock.advance(5)  # type: ignore[attr-defined]
    retry, why = _begin(w, _req(w, "e", 1))
    assert retry is None and why.startswith(WAITING)  # the retry waits its turn
    assert len(_doc(w)["holders"]) == 1 and len(_doc(w)["waiters"]) == 1


def test_a_killed_workers_slot_frees_after_its_ttl() -> None:
    w = _world(Limit("stripe", max_running=1))
    assert len(_run_start(w, "e", 2)) == 1  # its worker is killed: it never ends
    waited = _beat_until(w, "e", 3 * TTL)
    assert waited is not None and waited <= TTL + SCAN


def test_a_cancelled_waiters_grant_goes_straight_to_the_next() -> None:
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "h", 1)
    assert _run_start(w, "gone", 3) == []
    assert _run_start(w, "late", 1) == []
    w.engine.cancel("gone")
    _drives(w)
    _complete(w, holder)
    _drives(w)
    assert [r.execution_id for r in _sent(w)] == ["late"]


def test_groups_take_turns() -> None:
    w = _world(Limit("stripe", max_running=1))
    (holder,) = _run_start(w, "a", 1)
    assert _run_start(w, "big", 3) == []  # one fan-out queued first
    assert _run_start(w, "small", 1) == []
    order = []
    while holder is not None:
        _complete(w, holder)
        _drives(w)
        sent = _sent(w)
        holder = _begin(w, sent[0])[0] if sent else None
        order += [r.execution_id for r in sent]
    assert order[:2] == ["big", "small"]


class _Contended(MemoryStore):
    """A store on which the next ``storm`` writes of limit documents lose their etag race (as
    under many workers entering one key at once)."""

    storm = 0

    def _race(self, doc: dict[str, Any]) -> None:
        if str(doc.get("pk", "")).startswith("lim:") and self.storm > 0:
            self.storm -= 1
            raise ConflictError("another worker wrote the limit first")

    def create(self, doc: dict[str, Any]) -> str | None:
        self._race(doc)
        return super().create(doc)

    def replace(self, doc: dict[str, Any], if_match: str | None) -> str:
        self._race(doc)
        return super().replace(doc, if_match)


# Found by the breaker (fixed): Slots.enter gives up after ROUNDS (8) lost etag races with 'its
# document kept changing (sent again by the recovery scan)' but queues the step nowhere: the slot is
# free once the storm passes, yet the step waits for its marker's re-send (activity_queue_timeout, 300
# s), not a scan interval
def test_a_step_that_lost_the_etag_races_does_not_wait_on_a_free_slot() -> None:
    store = _Contended()
    w = _world(Limit("stripe", max_running=2), store=store)
    store.storm = 1000  # the dispatch's admission and the delivery's entry both lose every race
    w.engine.start(w.fan_out, (1,), {}, "e")  # type: ignore[attr-defined]
    _drives(w)
    (req,) = _sent(w)
    a, why = _begin(w, req)
    assert a is None and "kept changing" in why
    store.storm = 0  # the storm passes: both slots are free
    waited = _beat_until(w, "e", 300)
    assert waited is not None and waited <= SCAN, f"the step waited {waited} s on a free slot"


# Found by the breaker (fixed): the same grant-inside-give-back recursion from beat's side:
# Slots._settle -> _send -> _send_one -> _leave -> _send ... one frame chain per dead waiter;
# Slots.scan catches only StoreError and Recovery.scan does not guard limits.scan, so the recovery
# scan itself raises RecursionError
def test_the_recovery_scan_survives_a_cancelled_fan_out_of_waiters() -> None:
    w = _world(Limit("stripe", max_running=1))
    assert len(_run_start(w, "live", 1)) == 1  # its worker is killed: the slot lapses
    assert _run_start(w, "fan", 400) == []
    w.engine.cancel("fan")
    _drives(w)
    w.clock.advance(TTL + 1)  # type: ignore[attr-defined]
    w.engine.recovery.scan()
    assert _doc(w)["waiters"] == []
